#include "core/checkpoint_store.h"

#include <algorithm>
#include <chrono>

#include "core/errors.h"

namespace statecache {

namespace {
int64_t checkpoint_owner(int64_t checkpoint_id) { return owner_token::make(owner_token::kCheckpoint, checkpoint_id); }
}  // namespace

PageUnitCheckpointStore::PageUnitCheckpointStore(std::shared_ptr<BlockPool> pool, PagedStateCheckpointSpec spec,
                                                 bool offload_sink)
    : pool_(std::move(pool)), spec_(std::move(spec)), offload_sink_(offload_sink), clock_(monotonic_seconds) {
  if (!pool_) throw std::invalid_argument("pool: a PageUnitCheckpointStore needs a BlockPool");
}

PageUnitCheckpointStore::PageUnitCheckpointStore(std::shared_ptr<PageUnitProvider> units, PagedStateCheckpointSpec spec,
                                                 bool offload_sink)
    : provider_(std::move(units)), spec_(std::move(spec)), offload_sink_(offload_sink), clock_(monotonic_seconds) {
  if (!provider_) throw std::invalid_argument("pool: a PageUnitCheckpointStore needs a unit pool");
}

void PageUnitCheckpointStore::set_clock(Clock clock) { clock_ = clock ? std::move(clock) : Clock(monotonic_seconds); }

double PageUnitCheckpointStore::monotonic_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------- records --

PageUnitCheckpointStore::Slot* PageUnitCheckpointStore::find(int64_t checkpoint_id) {
  const int32_t* idx = slot_of_.find(checkpoint_id);
  return idx == nullptr ? nullptr : &slab_[*idx];
}

const PageUnitCheckpointStore::Slot* PageUnitCheckpointStore::find(int64_t checkpoint_id) const {
  const int32_t* idx = slot_of_.find(checkpoint_id);
  return idx == nullptr ? nullptr : &slab_[*idx];
}

int32_t PageUnitCheckpointStore::slot_index(int64_t checkpoint_id) const {
  const int32_t* idx = slot_of_.find(checkpoint_id);
  check_invariant(idx != nullptr, "store: no record for a live checkpoint id");
  return *idx;
}

namespace {
// Drops `key` from `map` only while it still names slab slot `idx`.
void erase_if_names(FlatInt64Map<int32_t>& map, int64_t key, int32_t idx) {
  const int32_t* v = map.find(key);
  if (v != nullptr && *v == idx) map.erase(key);
}
}  // namespace

int32_t PageUnitCheckpointStore::new_slot(int64_t checkpoint_id, int64_t prefix_hash, const UnitIds& units,
                                          CheckpointState state) {
  int32_t idx;
  if (!free_slots_.empty()) {
    idx = free_slots_.back();
    free_slots_.pop_back();
  } else {
    idx = static_cast<int32_t>(slab_.size());
    slab_.emplace_back();
  }
  Slot& s = slab_[idx];
  s.id = checkpoint_id;
  s.rec.prefix_hash = prefix_hash;
  s.rec.unit_ids.assign(units.begin(), units.end());  // reuses the slot's capacity
  s.rec.state = CheckpointState::kCopying;
  s.rec.pin_count = 0;
  s.prev = s.next = -1;
  s.on_lru = false;
  s.store_inflight = false;
  slot_of_[checkpoint_id] = idx;
  set_state(s, state);
  return idx;
}

void PageUnitCheckpointStore::free_slot(int32_t idx) {
  Slot& s = slab_[idx];
  set_state(s, CheckpointState::kEvicting);  // leaves the evictable total
  slot_of_.erase(s.id);
  s.id = -1;
  free_slots_.push_back(idx);
}

void PageUnitCheckpointStore::set_state(Slot& s, CheckpointState state) {
  const bool before = is_evictable(s, -1);
  s.rec.state = state;
  const bool after = is_evictable(s, -1);
  if (before != after) evictable_units_ += (after ? 1 : -1) * static_cast<int64_t>(s.rec.unit_ids.size());
}

void PageUnitCheckpointStore::add_pins(Slot& s, int64_t delta) {
  const bool before = is_evictable(s, -1);
  s.rec.pin_count += delta;
  const bool after = is_evictable(s, -1);
  if (before != after) evictable_units_ += (after ? 1 : -1) * static_cast<int64_t>(s.rec.unit_ids.size());
}

void PageUnitCheckpointStore::lru_push_back(int32_t idx) {
  Slot& s = slab_[idx];
  s.prev = lru_tail_;
  s.next = -1;
  if (lru_tail_ >= 0)
    slab_[lru_tail_].next = idx;
  else
    lru_head_ = idx;
  lru_tail_ = idx;
  s.on_lru = true;
  eviction_.push(idx, false);
}

void PageUnitCheckpointStore::lru_unlink(int32_t idx) {
  Slot& s = slab_[idx];
  if (!s.on_lru) return;
  if (s.prev >= 0)
    slab_[s.prev].next = s.next;
  else
    lru_head_ = s.next;
  if (s.next >= 0)
    slab_[s.next].prev = s.prev;
  else
    lru_tail_ = s.prev;
  s.prev = s.next = -1;
  s.on_lru = false;
  eviction_.remove(idx);
}

void PageUnitCheckpointStore::note_change(std::optional<int64_t> prefix_hash) {
  ++generation_;
  changes_.push_back(Change{generation_, prefix_hash.value_or(-1), !prefix_hash.has_value()});
  if (changes_.size() > kChangeLogLimit) changes_.pop_front();
}

// ----------------------------------------------------------------- lookup --

int64_t PageUnitCheckpointStore::lookup(int64_t prefix_hash) const {
  const int32_t* idx = hash_to_checkpoint_.find(prefix_hash);
  if (idx == nullptr) return -1;
  const Slot& s = slab_[*idx];
  return s.rec.state == CheckpointState::kReady ? s.id : -1;
}

bool PageUnitCheckpointStore::contains_or_pending(int64_t prefix_hash) const {
  return contains(prefix_hash) || pending_by_hash_.contains(prefix_hash);
}

// --------------------------------------------------------------- capacity --

void PageUnitCheckpointStore::set_eviction_model(const EvictionCostModel& model) {
  eviction_.reset_model(model, [this](auto&& push) {
    for (int32_t idx = lru_head_; idx >= 0; idx = slab_[idx].next) push(idx, false);
  });
}

int32_t PageUnitCheckpointStore::next_victim(int64_t protected_id) const {
  if (eviction_.active())
    return static_cast<int32_t>(
        eviction_.victim([&](int64_t idx) { return is_evictable(slab_[static_cast<size_t>(idx)], protected_id); }));
  for (int32_t idx = lru_head_; idx >= 0; idx = slab_[idx].next)
    if (is_evictable(slab_[idx], protected_id)) return idx;
  return -1;
}

bool PageUnitCheckpointStore::has_available_units(int64_t count, std::optional<int64_t> protected_hash) const {
  if (count < 0) bad_argument("count", count, "must be >= 0");
  if (count <= pool_num_free()) return true;
  // Read again, as the reference reads it (a foreign pool's count may move).
  const int64_t free = pool_num_free();
  // The eligible set either reaches the shortfall or it does not; which
  // checkpoints make it up is the policy's business and cannot change that.
  int64_t reachable = evictable_units_;
  if (protected_hash) {
    const int32_t* idx = hash_to_checkpoint_.find(*protected_hash);
    if (idx != nullptr && is_evictable(slab_[*idx], -1))
      reachable -= static_cast<int64_t>(slab_[*idx].rec.unit_ids.size());
  }
  return count - free <= reachable;
}

bool PageUnitCheckpointStore::ensure_free_units(int64_t count) {
  if (count < 0) bad_argument("count", count, "must be >= 0");
  if (!has_available_units(count)) return false;
  while (pool_num_free() < count) {
    const int32_t victim = next_victim();
    if (victim < 0) return false;
    evict(victim);
  }
  return true;
}

// ---------------------------------------------------------- store/restore --

std::optional<CheckpointStoreOp> PageUnitCheckpointStore::begin_store(int64_t prefix_hash, int64_t src_slot,
                                                                      int64_t position) {
  if (prefix_hash == -1) bad_argument("prefix_hash", prefix_hash, "-1 means no hash");
  if (src_slot < 0) bad_argument("src_slot", src_slot, "must be >= 0");
  if (contains_or_pending(prefix_hash)) return std::nullopt;
  const int64_t needed = units_per_checkpoint();
  if (!ensure_free_units(needed)) return std::nullopt;
  const int64_t checkpoint_id = new_identity();
  // The pool may run on_evict handlers (which may unindex here) before
  // returning; the units are ours by then.
  UnitIds units;
  units.swap(reserve_buf_);  // a reentrant call would find it empty, and allocate
  units.clear();             // its capacity, not the last call's ids
  bool reserved;
  ++filing_;
  try {
    reserved = reserve_pool_units(needed, checkpoint_owner(checkpoint_id), units);
    --filing_;
  } catch (...) {
    --filing_;
    // An eviction handler threw after the units were taken: nobody would
    // ever learn of them, so they go straight back.
    if (static_cast<int64_t>(units.size()) == needed) release_pool_units(units, checkpoint_owner(checkpoint_id));
    units.clear();
    reserve_buf_.swap(units);
    throw;
  }
  if (reserved && contains_or_pending(prefix_hash)) {
    // Filed meanwhile by a call back from the pool: these units go back.
    UnitIds spare(units);
    units.clear();
    reserve_buf_.swap(units);
    release_pool_units(spare, checkpoint_owner(checkpoint_id));
    return std::nullopt;
  }
  int32_t idx = -1;
  if (reserved) {
    idx = new_slot(checkpoint_id, prefix_hash, units, CheckpointState::kCopying);
    eviction_.set_position(idx, position);
  }
  reserve_buf_.swap(units);
  if (!reserved) return std::nullopt;
  // The next store under pressure spends the LRU head and files the next id:
  // start loading both.
  if (lru_head_ >= 0) __builtin_prefetch(&slab_[lru_head_]);
  slot_of_.prefetch(next_checkpoint_id_);
  Slot& s = slab_[idx];
  s.store_inflight = true;
  pending_by_hash_[prefix_hash] = idx;
  inflight_stores_.push_back(checkpoint_id);
  return CheckpointStoreOp{src_slot, s.rec.unit_ids, spec_.image_bytes, spec_.layout_id};
}

bool PageUnitCheckpointStore::restore_queued_for(int64_t dst_slot) const {
  for (const auto& q : queued_restores_)
    if (q.second.dst_slot == dst_slot) return true;
  return false;
}

std::optional<CheckpointRestoreOp> PageUnitCheckpointStore::begin_restore(int64_t prefix_hash, int64_t dst_slot) {
  if (!queue_restore(prefix_hash, dst_slot)) return std::nullopt;
  return queued_restores_.back().second;
}

bool PageUnitCheckpointStore::queue_restore(int64_t prefix_hash, int64_t dst_slot) {
  if (dst_slot < 0) bad_argument("dst_slot", dst_slot, "must be >= 0");
  const int32_t* found = hash_to_checkpoint_.find(prefix_hash);
  if (found == nullptr || slab_[*found].rec.state != CheckpointState::kReady) return false;
  const int32_t idx = *found;
  Slot& s = slab_[idx];
  // Start the misses this needs together rather than one after another.
  if (s.prev >= 0) __builtin_prefetch(&slab_[s.prev]);
  if (s.next >= 0) __builtin_prefetch(&slab_[s.next]);
  __builtin_prefetch(s.rec.unit_ids.data());
  const int64_t checkpoint_id = s.id;
  add_pins(s, 1);
  lru_unlink(idx);
  lru_push_back(idx);
  queued_restores_.emplace_back(checkpoint_id,
                                CheckpointRestoreOp{dst_slot, s.rec.unit_ids, spec_.image_bytes, spec_.layout_id});
  return true;
}

std::vector<CheckpointRestoreOp> PageUnitCheckpointStore::take_restore_ops() {
  std::vector<CheckpointRestoreOp> ops;
  ops.reserve(queued_restores_.size());
  for (auto& [checkpoint_id, op] : queued_restores_) {
    inflight_restores_.push_back(checkpoint_id);
    ops.push_back(std::move(op));
  }
  queued_restores_.clear();
  return ops;
}

void PageUnitCheckpointStore::cancel_queued_restore(int64_t dst_slot) {
  std::vector<std::pair<int64_t, CheckpointRestoreOp>> kept;
  std::vector<std::pair<int64_t, CheckpointRestoreOp>> queued;
  queued.swap(queued_restores_);
  std::vector<int64_t> cancelled;
  for (auto& q : queued) {
    if (q.second.dst_slot == dst_slot)
      cancelled.push_back(q.first);
    else
      kept.push_back(std::move(q));
  }
  queued_restores_.swap(kept);
  // Pins go once the queue is consistent (a release may call into a pool).
  FirstError error;
  for (int64_t checkpoint_id : cancelled)
    error.run([&] { release_offload_pin(checkpoint_id, "checkpoint restore pin underflow"); });
  error.rethrow();
}

std::optional<SuspendedCheckpointRestore> PageUnitCheckpointStore::suspend_queued_restore(int64_t dst_slot) {
  size_t found = queued_restores_.size();
  for (size_t i = 0; i < queued_restores_.size(); ++i) {
    if (queued_restores_[i].second.dst_slot != dst_slot) continue;
    if (found != queued_restores_.size())
      throw InvariantError("multiple queued checkpoint restores target slot " + std::to_string(dst_slot));
    found = i;
  }
  if (found == queued_restores_.size()) return std::nullopt;
  SuspendedCheckpointRestore out{queued_restores_[found].first, std::move(queued_restores_[found].second)};
  queued_restores_.erase(queued_restores_.begin() + static_cast<ptrdiff_t>(found));
  suspended_.push_back(out);
  return out;
}

size_t PageUnitCheckpointStore::find_suspended(const SuspendedCheckpointRestore& restore) const {
  for (size_t i = 0; i < suspended_.size(); ++i)
    if (suspended_[i] == restore) return i;
  bad_argument("restore", "checkpoint " + std::to_string(restore.checkpoint_id),
               "is not a suspended restore of this store (already resumed or released?)");
}

void PageUnitCheckpointStore::resume_suspended_restore(const SuspendedCheckpointRestore& restore) {
  const size_t i = find_suspended(restore);
  const Slot* s = find(restore.checkpoint_id);
  if (s == nullptr || s->rec.pin_count <= 0) throw InvariantError("suspended checkpoint restore lost its source pin");
  suspended_.erase(suspended_.begin() + static_cast<ptrdiff_t>(i));
  queued_restores_.emplace_back(restore.checkpoint_id, restore.operation);
}

void PageUnitCheckpointStore::release_suspended_restore(const SuspendedCheckpointRestore& restore) {
  const size_t i = find_suspended(restore);
  suspended_.erase(suspended_.begin() + static_cast<ptrdiff_t>(i));
  release_offload_pin(restore.checkpoint_id, "checkpoint restore pin underflow");
}

void PageUnitCheckpointStore::index_ready(Slot& s) {
  set_state(s, CheckpointState::kReady);
  s.ready_seq = ++ready_seq_;
  const auto idx = static_cast<int32_t>(&s - slab_.data());
  hash_to_checkpoint_[s.rec.prefix_hash] = idx;
  lru_push_back(idx);
}

void PageUnitCheckpointStore::complete_inflight() {
  if (filing_ > 0)
    throw std::runtime_error(
        "complete_inflight: called while begin_store files a store (from an eviction handler); "
        "that store is not written yet");
  std::vector<int64_t> stores;
  stores.swap(inflight_stores_);
  for (int64_t checkpoint_id : stores) {
    if (Slot* s = find(checkpoint_id)) {
      s->store_inflight = false;
      hash_to_checkpoint_.prefetch(s->rec.prefix_hash);  // published below
    }
  }
  FirstError error;
  for (int64_t checkpoint_id : stores) {
    Slot* s = find(checkpoint_id);
    if (s == nullptr) continue;
    const int64_t h = s->rec.prefix_hash;
    erase_if_names(pending_by_hash_, h, static_cast<int32_t>(s - slab_.data()));
    if (s->rec.state == CheckpointState::kEvicting) {
      error.run([&] { release_record(checkpoint_id); });
      continue;
    }
    if (s->rec.state != CheckpointState::kCopying) continue;
    // Published only once the scatter has ridden a batch; a twin that made
    // it first wins.
    if (lookup(h) >= 0) {
      error.run([&] { release_record(checkpoint_id); });
      continue;
    }
    index_ready(*s);
    note_change(h);
    queue_offload_store(checkpoint_id);
  }
  std::vector<int64_t> restores;
  restores.swap(inflight_restores_);
  for (int64_t checkpoint_id : restores)
    error.run([&] { release_offload_pin(checkpoint_id, "checkpoint restore pin underflow"); });
  error.rethrow();
}

bool PageUnitCheckpointStore::adopt_units(const UnitIds& unit_ids, int64_t owner, int64_t prefix_hash) {
  if (static_cast<int64_t>(unit_ids.size()) != units_per_checkpoint())
    bad_argument(
        "unit_ids", static_cast<long long>(unit_ids.size()),
        ("units given; an image needs units_per_checkpoint=" + std::to_string(units_per_checkpoint())).c_str());
  if (prefix_hash == -1) bad_argument("prefix_hash", prefix_hash, "-1 means no hash");
  if (contains_or_pending(prefix_hash)) {
    release_pool_units(unit_ids, owner);
    return false;
  }
  const int64_t checkpoint_id = new_identity();
  rekey_pool_units(unit_ids, owner, checkpoint_owner(checkpoint_id));
  if (contains_or_pending(prefix_hash)) {
    // Filed meanwhile by a call back from the pool: the units are ours now,
    // and go back.
    release_pool_units(unit_ids, checkpoint_owner(checkpoint_id));
    return false;
  }
  const int32_t idx = new_slot(checkpoint_id, prefix_hash, unit_ids, CheckpointState::kCopying);
  eviction_.set_position(idx, 0);  // a transfer's image: where it resumes is not known here
  Slot& s = slab_[idx];
  index_ready(s);
  note_change(prefix_hash);
  return true;
}

// ------------------------------------------------------------- change log --

std::optional<std::vector<int64_t>> PageUnitCheckpointStore::changed_since(int64_t generation) const {
  std::vector<int64_t> changed;
  if (generation >= generation_) return changed;
  if (changes_.empty() || changes_.front().generation > generation + 1) return std::nullopt;
  for (auto it = changes_.rbegin(); it != changes_.rend() && it->generation > generation; ++it) {
    if (it->everything) return std::nullopt;
    changed.push_back(it->prefix_hash);
  }
  std::sort(changed.begin(), changed.end());
  changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
  return changed;
}

// ---------------------------------------------------------------- removal --

bool PageUnitCheckpointStore::unindex(int64_t prefix_hash) {
  note_change(prefix_hash);
  int64_t checkpoint_id = -1;
  if (const int32_t* idx = hash_to_checkpoint_.find(prefix_hash)) {
    checkpoint_id = slab_[*idx].id;
    hash_to_checkpoint_.erase(prefix_hash);
  } else if (const int32_t* pending = pending_by_hash_.find(prefix_hash)) {
    checkpoint_id = slab_[*pending].id;
    pending_by_hash_.erase(prefix_hash);
  }
  if (checkpoint_id < 0) return false;
  Slot* s = find(checkpoint_id);
  if (s == nullptr) return false;
  set_state(*s, CheckpointState::kEvicting);
  lru_unlink(slot_index(checkpoint_id));
  // A queued writer or a reader still needs the units; they go back later.
  if (!s->store_inflight && s->rec.pin_count == 0) release_record(checkpoint_id);
  return true;
}

void PageUnitCheckpointStore::clear() {
  note_change(std::nullopt);
  hash_to_checkpoint_.clear();
  pending_by_hash_.clear();
  for (int32_t idx = lru_head_; idx >= 0;) {
    const int32_t next = slab_[idx].next;
    slab_[idx].prev = slab_[idx].next = -1;
    slab_[idx].on_lru = false;
    idx = next;
  }
  lru_head_ = lru_tail_ = -1;
  eviction_.clear();
  FirstError error;
  for (int64_t checkpoint_id : record_ids()) {
    Slot* s = find(checkpoint_id);
    if (s == nullptr) continue;  // released by a pool's call back meanwhile
    set_state(*s, CheckpointState::kEvicting);
    if (!s->store_inflight && s->rec.pin_count == 0) error.run([&] { release_record(checkpoint_id); });
  }
  error.rethrow();
}

void PageUnitCheckpointStore::evict(int32_t idx) {
  Slot& s = slab_[idx];
  if (s.rec.state != CheckpointState::kReady || s.rec.pin_count != 0)
    throw InvariantError("only an unpinned READY checkpoint is evictable");
  // A victim is cold: start its misses together rather than one after another.
  __builtin_prefetch(s.rec.unit_ids.data());
  hash_to_checkpoint_.prefetch(s.rec.prefix_hash);
  slot_of_.prefetch(s.id);
  if (s.next >= 0) __builtin_prefetch(&slab_[s.next]);
  note_change(s.rec.prefix_hash);
  erase_if_names(hash_to_checkpoint_, s.rec.prefix_hash, idx);
  if (pool_) pool_->prefetch_units(s.rec.unit_ids);
  set_state(s, CheckpointState::kEvicting);
  lru_unlink(idx);
  release_slot(idx);
  ++evictions_;
}

void PageUnitCheckpointStore::release_slot(int32_t idx) {
  Slot& s = slab_[idx];
  const int64_t checkpoint_id = s.id;
  if (!watched_.empty()) {
    auto w = watched_.find(checkpoint_id);
    if (w != watched_.end()) w->second.released = s.rec;
  }
  const int64_t h = s.rec.prefix_hash;
  note_change(h);
  lru_unlink(idx);
  erase_if_names(hash_to_checkpoint_, h, idx);
  erase_if_names(pending_by_hash_, h, idx);
  // The record is gone before the units return, so nothing can find it while
  // the pool hands them out again.
  set_state(s, CheckpointState::kEvicting);
  UnitIds units = std::move(s.rec.unit_ids);
  free_slot(idx);
  if (!pool_) {
    // A foreign pool may call back and take this slot for a new record.
    provider_->release_units(units, checkpoint_owner(checkpoint_id));
    return;
  }
  pool_->release_units(units, checkpoint_owner(checkpoint_id));
  units.clear();
  slab_[idx].rec.unit_ids = std::move(units);  // keep the capacity for reuse
}

// ---------------------------------------------------------------- offload --

void PageUnitCheckpointStore::queue_offload_store(int64_t checkpoint_id) {
  if (!offload_sink_) return;
  offload_ready_.push_back(checkpoint_id);
  // Oldest nominations go first: a dropped one costs a missed offload, never
  // an image, since nominations do not pin.
  while (offload_ready_.size() > kOffloadBacklogCap) {
    offload_ready_.pop_front();
    ++offload_nominations_dropped_;
  }
}

std::vector<PageUnitCheckpointStore::Source> PageUnitCheckpointStore::take_offload_stores(int64_t max_inflight) {
  std::vector<Source> out;
  std::vector<int64_t> deferred;
  if (offload_ready_.empty() || static_cast<int64_t>(offload_pins_.size()) >= max_inflight) return out;
  const double now = clock_();  // before any change
  while (!offload_ready_.empty() && static_cast<int64_t>(offload_pins_.size()) < max_inflight) {
    const int64_t checkpoint_id = offload_ready_.front();
    offload_ready_.pop_front();
    const Slot* s = find(checkpoint_id);
    if (s == nullptr || s->rec.state != CheckpointState::kReady) continue;  // spent while waiting
    if (pins_per_hash_.count(s->rec.prefix_hash) != 0) {
      // An earlier attempt at this hash is still out; try again next time.
      deferred.push_back(checkpoint_id);
      continue;
    }
    out.push_back(pin_offload_source(checkpoint_id, true, now));
  }
  offload_ready_.insert(offload_ready_.begin(), deferred.begin(), deferred.end());
  return out;
}

std::optional<PageUnitCheckpointStore::Source> PageUnitCheckpointStore::acquire_checkpoint_source(
    int64_t prefix_hash, std::optional<int64_t> max_inflight) {
  if (max_inflight && static_cast<int64_t>(offload_pins_.size()) >= *max_inflight) return std::nullopt;
  const int64_t checkpoint_id = lookup(prefix_hash);
  if (checkpoint_id < 0 || pins_per_hash_.count(prefix_hash) != 0) return std::nullopt;
  return pin_offload_source(checkpoint_id, false, clock_());
}

PageUnitCheckpointStore::Source PageUnitCheckpointStore::pin_offload_source(int64_t checkpoint_id,
                                                                            bool timeout_reclaimable, double now) {
  Slot& s = *find(checkpoint_id);
  const StateStoreOperationId op{s.rec.prefix_hash, ++offload_generation_};
  add_pins(s, 1);
  offload_pins_.emplace(op, OffloadPin{checkpoint_id, now, false, timeout_reclaimable, ++pin_seq_});
  ++pins_per_hash_[op.prefix_hash];
  return {op, s.rec.unit_ids};
}

void PageUnitCheckpointStore::release_offload_pin(int64_t checkpoint_id, const char* what) {
  Slot* s = find(checkpoint_id);
  if (s == nullptr) return;
  if (s->rec.pin_count <= 0) throw InvariantError(what);
  add_pins(*s, -1);
  // Unindexed while read: the units go back once the last reader is done.
  if (s->rec.state == CheckpointState::kEvicting && s->rec.pin_count == 0) release_record(checkpoint_id);
}

void PageUnitCheckpointStore::release_offload_store_source(const StateStoreOperationId& op) {
  auto it = offload_pins_.find(op);
  if (it == offload_pins_.end() || it->second.source_released) return;
  it->second.source_released = true;
  release_offload_pin(it->second.checkpoint_id, "checkpoint offload pin underflow");
}

void PageUnitCheckpointStore::settle_offload_store(const StateStoreOperationId& op) {
  auto it = offload_pins_.find(op);
  if (it == offload_pins_.end()) return;
  const OffloadPin pin = it->second;
  offload_pins_.erase(it);
  if (--pins_per_hash_[op.prefix_hash] == 0) pins_per_hash_.erase(op.prefix_hash);
  if (!pin.source_released) release_offload_pin(pin.checkpoint_id, "checkpoint offload pin underflow");
}

int64_t PageUnitCheckpointStore::reclaim_stale_offload_pins(double timeout_s) {
  if (!(timeout_s > 0) || offload_pins_.empty()) return 0;
  const double cutoff = clock_() - timeout_s;
  std::vector<std::pair<uint64_t, StateStoreOperationId>> stale;
  for (const auto& [op, pin] : offload_pins_)
    if (pin.timeout_reclaimable && pin.pinned_at <= cutoff) stale.emplace_back(pin.seq, op);
  std::sort(stale.begin(), stale.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  FirstError error;
  for (const auto& entry : stale) {
    const StateStoreOperationId op = entry.second;
    auto it = offload_pins_.find(op);
    if (it == offload_pins_.end()) continue;  // settled by a pool's call back meanwhile
    const OffloadPin pin = it->second;
    offload_pins_.erase(it);
    if (--pins_per_hash_[op.prefix_hash] == 0) pins_per_hash_.erase(op.prefix_hash);
    ++offload_pins_reclaimed_;
    // Source already back: only the report was lost, and the bytes are sound.
    if (pin.source_released) continue;
    // The reader may still be in the gather: take the units back, and never
    // trust what that store writes.
    if (reclaimed_set_.insert(op).second) reclaimed_order_.push_back(op);
    while (reclaimed_order_.size() > kReclaimedMemory) {
      reclaimed_set_.erase(reclaimed_order_.front());
      reclaimed_order_.pop_front();
    }
    error.run([&] { release_offload_pin(pin.checkpoint_id, "checkpoint offload pin underflow"); });
  }
  error.rethrow();
  return static_cast<int64_t>(stale.size());
}

// ------------------------------------------------------------------ views --

void PageUnitCheckpointStore::unwatch(int64_t checkpoint_id) {
  auto it = watched_.find(checkpoint_id);
  if (it != watched_.end() && --it->second.handles <= 0) watched_.erase(it);
}

const CheckpointRecord* PageUnitCheckpointStore::watched_record(int64_t checkpoint_id) const {
  if (const Slot* s = find(checkpoint_id)) return &s->rec;
  auto it = watched_.find(checkpoint_id);
  if (it == watched_.end() || !it->second.released) return nullptr;
  return &*it->second.released;
}

std::vector<int64_t> PageUnitCheckpointStore::record_ids() const {
  std::vector<int64_t> ids;
  ids.reserve(slot_of_.size());
  slot_of_.for_each([&](int64_t id, int32_t) { ids.push_back(id); });
  std::sort(ids.begin(), ids.end());
  return ids;
}

const CheckpointRecord* PageUnitCheckpointStore::record(int64_t checkpoint_id) const {
  const Slot* s = find(checkpoint_id);
  return s == nullptr ? nullptr : &s->rec;
}

std::vector<std::pair<int64_t, int64_t>> PageUnitCheckpointStore::hash_index() const {
  std::vector<std::tuple<uint64_t, int64_t, int64_t>> order;
  order.reserve(hash_to_checkpoint_.size());
  hash_to_checkpoint_.for_each(
      [&](int64_t h, int32_t idx) { order.emplace_back(slab_[idx].ready_seq, h, slab_[idx].id); });
  std::sort(order.begin(), order.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  out.reserve(order.size());
  for (const auto& [seq, h, checkpoint_id] : order) out.emplace_back(h, checkpoint_id);
  return out;
}

int64_t PageUnitCheckpointStore::hash_index_get(int64_t prefix_hash) const {
  const int32_t* idx = hash_to_checkpoint_.find(prefix_hash);
  return idx == nullptr ? -1 : slab_[*idx].id;
}

int64_t PageUnitCheckpointStore::units_held() const {
  int64_t n = 0;
  slot_of_.for_each([&](int64_t, int32_t idx) { n += static_cast<int64_t>(slab_[idx].rec.unit_ids.size()); });
  return n;
}

void PageUnitCheckpointStore::check_consistency() const {
  int64_t evictable = 0, on_lru = 0;
  slot_of_.for_each([&](int64_t checkpoint_id, int32_t idx) {
    const Slot& s = slab_[idx];
    check_invariant(s.id == checkpoint_id, "store: slab slot names another checkpoint");
    check_invariant(s.rec.pin_count >= 0, "store: negative pin count");
    const bool ready = s.rec.state == CheckpointState::kReady;
    check_invariant(ready == s.on_lru, "store: READY and the LRU disagree");
    on_lru += s.on_lru;
    if (ready) {
      check_invariant(hash_index_get(s.rec.prefix_hash) == checkpoint_id, "store: READY record not indexed");
    }
    check_invariant(s.rec.prefix_hash != -1, "store: a record filed under -1");
    check_invariant(static_cast<int64_t>(s.rec.unit_ids.size()) == units_per_checkpoint(),
                    "store: a record does not hold units_per_checkpoint units");
    if (is_evictable(s, -1)) evictable += static_cast<int64_t>(s.rec.unit_ids.size());
    if (pool_)  // a foreign pool's ownership is its own business
      for (int64_t u : s.rec.unit_ids)
        check_invariant(pool_->owner_of(u) == checkpoint_owner(checkpoint_id), "store: a record's unit is not its own");
  });
  check_invariant(!hash_to_checkpoint_.contains(-1) && !pending_by_hash_.contains(-1), "store: -1 is indexed");
  pending_by_hash_.for_each([&](int64_t h, int32_t idx) {
    const Slot& s = slab_[idx];
    check_invariant(s.id >= 0 && s.rec.prefix_hash == h && s.rec.state == CheckpointState::kCopying,
                    "store: a pending hash names no COPYING record under it");
  });
  for (const auto& r : suspended_) {
    const Slot* s = find(r.checkpoint_id);
    check_invariant(s != nullptr && s->rec.pin_count > 0, "store: a suspended restore's checkpoint is unpinned");
  }
  hash_to_checkpoint_.for_each([&](int64_t h, int32_t idx) {
    const int64_t checkpoint_id = slab_[idx].id;
    const Slot* s = find(checkpoint_id);
    check_invariant(s && s->rec.state == CheckpointState::kReady && s->rec.prefix_hash == h,
                    "store: index names a record that is not READY under that hash");
  });
  int64_t walked = 0;
  for (int32_t idx = lru_head_; idx >= 0; idx = slab_[idx].next) ++walked;
  check_invariant(walked == on_lru, "store: LRU list length disagrees");
  if (eviction_.active()) {
    check_invariant(eviction_.size() == on_lru, "store: cost order and LRU disagree in size");
    for (int32_t idx = lru_head_; idx >= 0; idx = slab_[idx].next)
      check_invariant(eviction_.contains(idx), "store: a READY record is missing from the cost order");
  }
  check_invariant(evictable == evictable_units_, "store: evictable total drifted");
  int64_t pins = 0;
  for (const auto& kv : pins_per_hash_) pins += kv.second;
  check_invariant(pins == static_cast<int64_t>(offload_pins_.size()), "store: per-hash pin counts drifted");
  if (pool_) pool_->check_consistency();  // units conserved: free + reserved + KV-held == num_blocks
}

}  // namespace statecache
