// Schedules PAGE checkpoints for per-request state (docs/contract.md, "The pass"): which
// boundaries to store at the next drain, midstep scratch stores, external
// transfer images and the vote of a tier below GPU memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/checkpoint_store.h"
#include "core/errors.h"
#include "core/offload_index.h"
#include "core/sequence.h"
#include "core/slot_source.h"

namespace statecache {

// (scratch slot, position, hash) borrowed for one midstep position.
using MidstepReservation = std::tuple<int64_t, int64_t, int64_t>;

class PagedStateCheckpointCoordinator {
 public:
  PagedStateCheckpointCoordinator(std::shared_ptr<BlockPool> pool, PagedStateCheckpointSpec spec, bool enabled,
                                  bool offload_sink = false, bool readable_midstep = false);
  // Around a store built by the caller (the bindings' store carries Python state).
  PagedStateCheckpointCoordinator(std::shared_ptr<PageUnitCheckpointStore> store, bool enabled,
                                  bool readable_midstep = false);

  PageUnitCheckpointStore& store() const { return *store_; }
  const std::shared_ptr<PageUnitCheckpointStore>& store_ptr() const { return store_; }
  HashForm& hash_form() const { return store_->hash_form(); }
  bool enabled() const { return enabled_; }
  bool readable_midstep() const { return readable_midstep_; }
  int64_t checkpoints_kept() const { return kept_; }
  int64_t checkpoints_dropped() const { return dropped_; }
  int64_t checkpoints_orphaned() const { return orphaned_; }

  bool applies(const Sequence& seq) const { return enabled_ && seq.has_per_req_cache; }

  // ---- midstep ----
  void attach_midstep_scratch(std::shared_ptr<ScratchSlotSource> scratch, int64_t max_ops_per_batch);
  std::vector<MidstepReservation> reserve_midstep(const Sequence& seq,
                                                  const std::vector<std::pair<int64_t, int64_t>>& positions);
  // Both take rows reserve_midstep handed out and not yet published or
  // cancelled, each once; std::invalid_argument for any other row, before
  // anything changes.
  void publish_midstep(const std::vector<MidstepReservation>& reservations);
  void cancel_midstep(const std::vector<MidstepReservation>& reservations);

  // ---- admission ----
  // Longest prefix (<= hit) whose boundary is reachable in HBM or a tier.
  // `hash_at(i)` reads block_hashes[i]; it is called right to left.
  template <class HashAt>
  int64_t resumable_hit(const Sequence& seq, int64_t hit, int64_t num_hashes, HashAt hash_at,
                        bool assume_checkpointed) const {
    // A negative hit is refused whether or not the coordinator applies, as
    // the pools and the batched call refuse it.
    if (hit < 0) bad_argument("hit", hit, "must be >= 0");
    if (!applies(seq)) return hit;
    if (assume_checkpointed) return hit;  // reads no hash
    if (hit > num_hashes) out_of_range("hit", hit, num_hashes + 1);
    for (int64_t i = hit - 1; i >= 0; --i)
      if (reachable(hash_at(i))) return i + 1;
    return 0;
  }
  // Whether resumable_hit reads seq's hash list, so that `hit` must lie
  // within it.
  bool hit_within_hashes(const Sequence& seq, bool assume_checkpointed) const {
    return applies(seq) && !assume_checkpointed;
  }
  bool reachable(int64_t prefix_hash) const;
  bool contains(int64_t prefix_hash) const { return store_->contains(prefix_hash); }

  // ---- boundaries ----
  void checkpoint(const std::shared_ptr<Sequence>& seq, int64_t boundary_blocks, int64_t prefix_hash);
  // What checkpoint checks before it changes anything; throws as it would.
  static void check_checkpoint(int64_t boundary_blocks, int64_t prefix_hash);
  // checkpoint(seqs[i], boundary_blocks[i], hashes[i]) for each i, the whole
  // batch checked first (core/batch.h); keys[i] is seqs[i]'s identity.
  void checkpoint_many(std::span<const std::shared_ptr<Sequence>> seqs, std::span<const uintptr_t> keys,
                       std::span<const int64_t> boundary_blocks, std::span<const int64_t> hashes);
  void forget_pending(const Sequence& seq);
  // A finished pass's requests: forget_pending of each, in order.
  void forget_pending_many(std::span<Sequence* const> seqs) {
    for (const Sequence* s : seqs) forget_pending(*s);
  }
  int64_t num_pending() const { return static_cast<int64_t>(pending_index_.size()); }
  bool restore_queued_for(int64_t dst_slot) const { return store_->restore_queued_for(dst_slot); }
  bool begin_restore(int64_t prefix_hash, int64_t dst_slot) { return store_->queue_restore(prefix_hash, dst_slot); }
  // begin_restore(hashes[i], dst_slots[i]) for each i, in order, once the
  // whole batch passed what the per-item call checks (equal lengths, no
  // negative slot); out[i] says whether restore i was queued.
  std::vector<uint8_t> begin_restores(std::span<const int64_t> hashes, std::span<const int64_t> dst_slots);
  // Neither may run from an eviction handler inside take_checkpoint_ops
  // (std::runtime_error): the stores it is beginning are not handed out yet.
  std::pair<std::vector<CheckpointStoreOp>, std::vector<CheckpointRestoreOp>> take_checkpoint_ops();
  void complete_previous_batch();

  // ---- external transfers ----
  // `owner` is a transfer owner token (owner_token::kTransfer).
  std::optional<UnitIds> reserve_transfer_units(int64_t owner);
  void release_transfer_units(int64_t owner);
  bool adopt_transfer_units(int64_t owner, int64_t prefix_hash);
  bool has_transfer(int64_t owner) const { return transfer_units_.count(owner) != 0; }

  // ---- tier ----
  void attach_offload(std::shared_ptr<const OffloadVote> vote, bool attached, bool sink);

  void unindex(int64_t prefix_hash);
  void clear_index();

  // The store's and pool's checks plus the coordinator's own bookkeeping;
  // InvariantError on the first broken invariant.
  void check_consistency() const;

 private:
  struct Pending {
    std::shared_ptr<Sequence> seq;  // kept alive until drained
    int64_t prefix_hash;
    bool live;
    int64_t boundary_blocks = 0;  // what the store's cost model ranks by
  };
  static int64_t key_of(const Sequence* seq) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(seq)); }
  void supersede(const Sequence* seq);
  void drop_pending_of(const Sequence* seq);
  // Appends each store begun to `stores` and its hash to `begun`.
  void take_scratch_stores(int64_t budget, std::vector<CheckpointStoreOp>& stores, std::vector<int64_t>& begun);
  // A drain that threw hands nothing out: drops the stores it began and
  // files pending[next..] again.
  void abandon_drain(const std::vector<int64_t>& begun, std::vector<Pending>& pending, size_t next);
  void check_reservations(const std::vector<MidstepReservation>& reservations) const;
  void forget_reservations(const std::vector<MidstepReservation>& reservations);
  void release_scratch(int64_t slot) {
    if (scratch_) scratch_->release(slot);
  }

  bool enabled_;
  bool readable_midstep_;
  std::shared_ptr<PageUnitCheckpointStore> store_;
  std::shared_ptr<const OffloadVote> vote_;
  std::shared_ptr<ScratchSlotSource> scratch_;
  int64_t max_ops_per_batch_ = 0;
  std::vector<std::pair<int64_t, int64_t>> scratch_queued_;  // (hash, slot), oldest first
  std::vector<int64_t> scratch_issued_;
  std::vector<MidstepReservation> reserved_;  // handed out by reserve_midstep, not yet published or cancelled
  // One live entry per sequence (a newer boundary supersedes), in the order
  // the boundaries were filed.
  std::vector<Pending> pending_;
  // Flat maps: a boundary is filed per sequence per pass, and a node map
  // allocates for each. pending_index_ is keyed by the Sequence's address.
  FlatInt64Map<int64_t> pending_index_;
  FlatInt64Map<int64_t> pending_hashes_;  // hash -> live entries
  std::unordered_map<int64_t, UnitIds> transfer_units_;
  int64_t kept_ = 0, dropped_ = 0, orphaned_ = 0;
  bool draining_ = false;  // inside take_checkpoint_ops
};

}  // namespace statecache
