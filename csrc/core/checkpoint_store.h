// Content index and unit ownership for PAGE checkpoint images (docs/contract.md, "Objects").
//
// A checkpoint is COPYING from `begin_store` until the batch that scatters it
// has been issued (`complete_inflight`), then READY (findable, on the LRU),
// then EVICTING until whatever still reads or writes its units lets go. Only
// READY images are ever found. Records live in a slab; the READY LRU is an
// intrusive list over slab indices.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/block_pool.h"
#include "core/eviction_policy.h"
#include "core/flat_map.h"
#include "core/hash_form.h"
#include "core/paged_types.h"
#include "core/unit_provider.h"

namespace statecache {

class PageUnitCheckpointStore {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic
  using Source = std::pair<StateStoreOperationId, UnitIds>;

  PageUnitCheckpointStore(std::shared_ptr<BlockPool> pool, PagedStateCheckpointSpec spec, bool offload_sink = false);
  // Units from any other pool (core/unit_provider.h).
  PageUnitCheckpointStore(std::shared_ptr<PageUnitProvider> units, PagedStateCheckpointSpec spec,
                          bool offload_sink = false);

  // The BlockPool the units come from, or null for a foreign provider.
  const std::shared_ptr<BlockPool>& pool_ptr() const { return pool_; }
  const std::shared_ptr<PageUnitProvider>& provider_ptr() const { return provider_; }
  // The pool's unit calls, on a BlockPool directly (the fast path) or through
  // the provider. The coordinator's transfer units go through these too.
  int64_t pool_num_free() const { return pool_ ? pool_->num_free() : provider_->num_free(); }
  bool reserve_pool_units(int64_t count, int64_t owner, std::vector<int64_t>& out) {
    return pool_ ? pool_->reserve_units(count, owner, out) : provider_->reserve_units(count, owner, out);
  }
  void release_pool_units(const std::vector<int64_t>& units, int64_t owner) {
    if (pool_)
      pool_->release_units(units, owner);
    else
      provider_->release_units(units, owner);
  }
  void rekey_pool_units(const std::vector<int64_t>& units, int64_t old_owner, int64_t new_owner) {
    if (pool_)
      pool_->rekey_units(units, old_owner, new_owner);
    else
      provider_->rekey_units(units, old_owner, new_owner);
  }
  const PagedStateCheckpointSpec& spec() const { return spec_; }
  int64_t units_per_checkpoint() const { return spec_.units_per_checkpoint(); }
  int64_t generation() const { return generation_; }
  int64_t evictions() const { return evictions_; }
  int64_t offload_pins_reclaimed() const { return offload_pins_reclaimed_; }
  int64_t offload_nominations_dropped() const { return offload_nominations_dropped_; }
  bool offload_sink() const { return offload_sink_; }
  void set_offload_sink(bool sink) { offload_sink_ = sink; }
  // Where pin ages are read from; an empty clock restores the monotonic one.
  // The clock is read before anything changes, so one that throws leaves
  // the store as it was.
  void set_clock(Clock clock);
  static double monotonic_seconds();

  // ---- lookup ----
  int64_t lookup(int64_t prefix_hash) const;  // READY checkpoint id or -1
  // The index holds READY records only (check_consistency), so membership
  // needs no visit to the record.
  bool contains(int64_t prefix_hash) const { return hash_to_checkpoint_.contains(prefix_hash); }
  // Starts loading what contains(prefix_hash) reads (a scan's next hashes).
  [[gnu::always_inline]] void prefetch(int64_t prefix_hash) const { hash_to_checkpoint_.prefetch(prefix_hash); }
  bool contains_or_pending(int64_t prefix_hash) const;

  // ---- capacity ----
  // Whether `count` units could be had, spending unpinned READY checkpoints
  // other than the one filed under `protected_hash` if it came to that.
  bool has_available_units(int64_t count, std::optional<int64_t> protected_hash = std::nullopt) const;
  // Raises the free count to `count` by evicting; refuses an unreachable
  // count before spending anything.
  bool ensure_free_units(int64_t count);

  // ---- eviction order (core/eviction_policy.h) ----
  // kLru (default) spends the least recently used; kCost ranks recency and
  // value. std::invalid_argument (nothing changed) for a bad model.
  void set_eviction_model(const EvictionCostModel& model);
  const EvictionCostModel& eviction_model() const { return eviction_.model(); }

  // ---- store / restore ----
  // `position` (hash blocks, 0 unknown) is what the cost model ranks by.
  std::optional<CheckpointStoreOp> begin_store(int64_t prefix_hash, int64_t src_slot, int64_t position = 0);
  bool restore_queued_for(int64_t dst_slot) const;
  std::optional<CheckpointRestoreOp> begin_restore(int64_t prefix_hash, int64_t dst_slot);
  // begin_restore without handing out a copy of the op: whether one was queued.
  bool queue_restore(int64_t prefix_hash, int64_t dst_slot);
  std::vector<CheckpointRestoreOp> take_restore_ops();
  int64_t num_queued_restores() const { return static_cast<int64_t>(queued_restores_.size()); }
  void cancel_queued_restore(int64_t dst_slot);
  std::optional<SuspendedCheckpointRestore> suspend_queued_restore(int64_t dst_slot);
  // Each takes back a restore suspend_queued_restore handed out, once:
  // std::invalid_argument for any other (a second release would otherwise
  // take another restore's pin).
  void resume_suspended_restore(const SuspendedCheckpointRestore& restore);
  void release_suspended_restore(const SuspendedCheckpointRestore& restore);
  // The batch that carried last pass's copies was issued: stores become READY,
  // restores unpin. Refused (std::runtime_error) from an eviction handler
  // run by begin_store: the store being filed has not been handed out, let
  // alone written.
  void complete_inflight();
  // Publishes units held by `owner` as a READY checkpoint without a copy;
  // releases them and returns false when the hash is already held. The
  // units must be exactly units_per_checkpoint, all held by `owner`.
  bool adopt_units(const UnitIds& unit_ids, int64_t owner, int64_t prefix_hash);

  // ---- change log ----
  // Hashes whose READY state may have changed after `generation`, or nullopt
  // when the log cannot tell (too old, or a clear touched everything).
  std::optional<std::vector<int64_t>> changed_since(int64_t generation) const;

  // ---- removal ----
  bool unindex(int64_t prefix_hash);
  void clear();

  // ---- offload ----
  const std::deque<int64_t>& store_backlog() const { return offload_ready_; }
  std::vector<Source> take_offload_stores(int64_t max_inflight);
  std::optional<Source> acquire_checkpoint_source(int64_t prefix_hash,
                                                  std::optional<int64_t> max_inflight = std::nullopt);
  void release_offload_store_source(const StateStoreOperationId& op);
  void settle_offload_store(const StateStoreOperationId& op);
  bool has_offload_pins() const { return !offload_pins_.empty(); }
  int64_t reclaim_stale_offload_pins(double timeout_s);
  bool was_reclaimed(const StateStoreOperationId& op) const { return reclaimed_set_.count(op) != 0; }

  // ---- views ----
  // Live checkpoint ids in creation order.
  std::vector<int64_t> record_ids() const;
  const CheckpointRecord* record(int64_t checkpoint_id) const;
  int64_t num_records() const { return static_cast<int64_t>(slot_of_.size()); }
  // (hash, checkpoint id) of READY checkpoints, in the order they became READY.
  std::vector<std::pair<int64_t, int64_t>> hash_index() const;
  int64_t hash_index_size() const { return static_cast<int64_t>(hash_to_checkpoint_.size()); }
  int64_t hash_index_get(int64_t prefix_hash) const;  // -1 when absent
  // Units held by records (any state).
  int64_t units_held() const;

  // Live record handles (Python's CheckpointRecord from `records`): while a
  // record is watched, the state it was released in stays readable, as a
  // reference record object outlives its removal from the table.
  void watch(int64_t checkpoint_id) { ++watched_[checkpoint_id].handles; }
  void unwatch(int64_t checkpoint_id);
  // The live record, else the state a watched record was released in, else null.
  const CheckpointRecord* watched_record(int64_t checkpoint_id) const;
  void check_consistency() const;

  // The form the caller's hashes come in (core/hash_form.h); the
  // coordinator's are its store's.
  HashForm& hash_form() const { return hash_form_; }

  static constexpr size_t kChangeLogLimit = 4096;
  static constexpr size_t kReclaimedMemory = 4096;
  static constexpr size_t kOffloadBacklogCap = 8192;

 private:
  mutable HashForm hash_form_;
  struct Slot {
    CheckpointRecord rec;
    int64_t id = -1;
    int32_t prev = -1, next = -1;  // READY LRU
    bool on_lru = false;
    bool store_inflight = false;  // scattered by the batch being built
    uint64_t ready_seq = 0;
  };
  struct OffloadPin {
    int64_t checkpoint_id;
    double pinned_at;
    bool source_released;
    bool timeout_reclaimable;
    uint64_t seq;
  };
  struct Change {
    int64_t generation;
    int64_t prefix_hash;
    bool everything;
  };

  Slot* find(int64_t checkpoint_id);
  int32_t slot_index(int64_t checkpoint_id) const;  // of a live record
  const Slot* find(int64_t checkpoint_id) const;
  int32_t new_slot(int64_t checkpoint_id, int64_t prefix_hash, const UnitIds& units, CheckpointState state);
  void free_slot(int32_t idx);

  // Eligibility: the one rule for what may be spent.
  static bool is_evictable(const Slot& s, int64_t protected_id) {
    return s.id != protected_id && s.rec.state == CheckpointState::kReady && s.rec.pin_count == 0;
  }
  // Policy: which eligible checkpoint to spend first (least recently used).
  // Returns its slab index, or -1.
  int32_t next_victim(int64_t protected_id = -1) const;

  // Every change of state or pins goes through these two, which keep the
  // evictable-unit total in step with `is_evictable`.
  void set_state(Slot& s, CheckpointState state);
  void add_pins(Slot& s, int64_t delta);

  void lru_push_back(int32_t idx);
  void lru_unlink(int32_t idx);
  void note_change(std::optional<int64_t> prefix_hash);
  void index_ready(Slot& s);
  void queue_offload_store(int64_t checkpoint_id);
  Source pin_offload_source(int64_t checkpoint_id, bool timeout_reclaimable, double now);
  // Index of the outstanding suspended restore equal to `restore`, or throws.
  size_t find_suspended(const SuspendedCheckpointRestore& restore) const;
  void release_offload_pin(int64_t checkpoint_id, const char* what);
  // Both take a slab index: the eviction path already holds it, and a
  // probe of the id table would cost a cache miss per victim.
  void evict(int32_t idx);
  void release_slot(int32_t idx);
  void release_record(int64_t checkpoint_id) { release_slot(slot_index(checkpoint_id)); }
  int64_t new_identity() { return next_checkpoint_id_++; }

  std::shared_ptr<BlockPool> pool_;             // exactly one of these two is set
  std::shared_ptr<PageUnitProvider> provider_;  // (a provider's calls may run foreign code)
  PagedStateCheckpointSpec spec_;
  bool offload_sink_;
  Clock clock_;

  std::vector<Slot> slab_;
  std::vector<int32_t> free_slots_;
  FlatInt64Map<int32_t> slot_of_;  // checkpoint id -> slab index
  int32_t lru_head_ = -1, lru_tail_ = -1;
  CheckpointEvictionOrder eviction_;  // kept beside the LRU under kCost only
  int64_t evictable_units_ = 0;
  uint64_t ready_seq_ = 0;

  // hash -> slab index of the READY / COPYING record filed under it.
  FlatInt64Map<int32_t> hash_to_checkpoint_;
  FlatInt64Map<int32_t> pending_by_hash_;
  std::vector<int64_t> inflight_stores_;
  UnitIds reserve_buf_;  // begin_store's reservation, reused across calls
  int filing_ = 0;       // begin_store calls waiting for their reservation
  std::vector<std::pair<int64_t, CheckpointRestoreOp>> queued_restores_;
  std::vector<int64_t> inflight_restores_;
  std::vector<SuspendedCheckpointRestore> suspended_;  // handed out, not yet resumed or released
  int64_t next_checkpoint_id_ = 0;
  int64_t generation_ = 0;
  int64_t evictions_ = 0;
  std::deque<Change> changes_;

  struct Watch {
    int64_t handles = 0;
    std::optional<CheckpointRecord> released;
  };
  std::unordered_map<int64_t, Watch> watched_;

  std::deque<int64_t> offload_ready_;
  int64_t offload_nominations_dropped_ = 0;
  std::unordered_map<StateStoreOperationId, OffloadPin, StateStoreOperationIdHash> offload_pins_;
  std::unordered_map<int64_t, int64_t> pins_per_hash_;  // hash -> dispatched operations
  int64_t offload_generation_ = 0;
  uint64_t pin_seq_ = 0;
  int64_t offload_pins_reclaimed_ = 0;
  std::deque<StateStoreOperationId> reclaimed_order_;
  std::unordered_set<StateStoreOperationId, StateStoreOperationIdHash> reclaimed_set_;
};

}  // namespace statecache
