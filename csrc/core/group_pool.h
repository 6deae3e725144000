// StateGroupPool: per-request state groups plus the checkpoint index over the
// free ones, for both handover mechanisms:
//   fork  the owner's group becomes the checkpoint and the owner moves to a
//         new group; the old one stays pinned until the next pass's batch
//         has read it.
//   copy  the owner keeps its group; `checkpoint` only records the intent and
//         `take_copies` (called as the next batch is built) turns it into a
//         (src, dst) pair, filing dst at that moment.
// Under none() and replay() nothing is ever checkpointed (docs/contract.md, "Divergences").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/checkpoint_pool.h"
#include "core/errors.h"
#include "core/sequence.h"
#include "core/state_transfer.h"

namespace statecache {

// What retire_top did to the group pool (see Retirement).
struct GroupRetirement : Retirement {};

class StateGroupPool : public CheckpointPool<GroupRetirement> {
 public:
  // What take_copies needs from a sequence that joined the pending list, read
  // by the caller as of the take_copies call.
  struct PendingSeq {
    int64_t pending_checkpoint = -1;
    int64_t group = -1;  // per_req_cache_group
    size_t seq = 0;      // which sequence: entries of one sequence share it
  };

  explicit StateGroupPool(int64_t num_groups, StateTransfer transfer = StateTransfer(), int64_t hash_block_size = 1,
                          bool enabled = true);

  // fork: seq moves to a fresh group, the old one is filed and pinned.
  // copy: records an intent for seq's current group; returns true when seq
  // joined the pending list, which the caller (who keeps the sequence alive)
  // mirrors entry for entry. The intent describes that group's bytes, so it
  // dies when the group is released (a reference divergence: there it follows
  // the sequence, and a group handed to another request is filed under the
  // first one's hash).
  bool checkpoint(Sequence& seq, int64_t boundary_blocks, int64_t h);
  // checkpoint(*seqs[i], boundary_blocks[i], hashes[i]) for each i, the whole
  // batch checked first (core/batch.h); keys[i] is seqs[i]'s identity.
  // Returns the entries that joined the pending list, in order.
  std::vector<size_t> checkpoint_many(std::span<Sequence* const> seqs, std::span<const uintptr_t> keys,
                                      std::span<const int64_t> boundary_blocks, std::span<const int64_t> hashes);
  // What checkpoint checks before it changes anything; throws as it would.
  void check_checkpoint(const Sequence& seq, int64_t h) const;
  // The fork case in two steps (as StateSlotPool's); an empty plan for copy
  // and the cases that keep nothing.
  ForkPlan plan_checkpoint(const Sequence& seq, int64_t h);
  // Whether checkpoint would record a copy intent (and so set the sequence's
  // pending_checkpoint to h); validates as checkpoint does, changes nothing.
  bool plan_intent(const Sequence& seq, int64_t h) const;
  // Forgets every pending intent (the caller drops its mirror too).
  void drop_pending() { pending_.clear(); }
  void forget_pending(Sequence& seq) { seq.pending_checkpoint = -1; }
  void forget_pending_many(std::span<Sequence* const> seqs) {
    for (Sequence* s : seqs) forget_pending(*s);
  }
  void record_copy(int64_t src, int64_t dst);
  // Commits the pending intents, then hands over every pending pair.
  // `seqs[i]` are the fields of pending entry i's sequence (pending_count()
  // of them, `seq` < pending_count()); the first live entry of a sequence
  // consumes its pending checkpoint, as the reference's clearing does. The
  // caller sets each pending sequence's pending_checkpoint to -1.
  std::vector<std::pair<int64_t, int64_t>> take_copies(std::span<const PendingSeq> seqs);
  size_t pending_count() const { return pending_.size(); }

  // As the free list's; an intent on a relocated owned top moves with it.
  std::optional<GroupRetirement> retire_top();

  const std::vector<std::pair<int64_t, int64_t>>& pending_copies() const { return copies_; }

 private:
  struct Intent {
    int64_t group;
    uint32_t epoch;        // the group's release_epoch when recorded
    int64_t position = 0;  // boundary blocks, for the eviction cost model
  };
  bool intent_alive(const Intent& i) const {
    return i.group >= 0 && i.group < size() && !is_free(i.group) && release_epoch(i.group) == i.epoch;
  }
  bool group_has_intent(int64_t g) const;

  std::vector<Intent> pending_;
  std::vector<std::pair<int64_t, int64_t>> copies_;
};

}  // namespace statecache
