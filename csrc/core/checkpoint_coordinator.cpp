#include "core/checkpoint_coordinator.h"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "core/batch.h"

namespace statecache {

PagedStateCheckpointCoordinator::PagedStateCheckpointCoordinator(std::shared_ptr<BlockPool> pool,
                                                                 PagedStateCheckpointSpec spec, bool enabled,
                                                                 bool offload_sink, bool readable_midstep)
    : enabled_(enabled),
      readable_midstep_(readable_midstep),
      store_(std::make_shared<PageUnitCheckpointStore>(std::move(pool), std::move(spec), offload_sink)) {}

PagedStateCheckpointCoordinator::PagedStateCheckpointCoordinator(std::shared_ptr<PageUnitCheckpointStore> store,
                                                                 bool enabled, bool readable_midstep)
    : enabled_(enabled), readable_midstep_(readable_midstep), store_(std::move(store)) {
  if (!store_) throw std::invalid_argument("store: a coordinator needs a PageUnitCheckpointStore");
}

// ---------------------------------------------------------------- midstep --

void PagedStateCheckpointCoordinator::attach_midstep_scratch(std::shared_ptr<ScratchSlotSource> scratch,
                                                             int64_t max_ops_per_batch) {
  scratch_ = std::move(scratch);
  max_ops_per_batch_ = max_ops_per_batch;
}

std::vector<MidstepReservation> PagedStateCheckpointCoordinator::reserve_midstep(
    const Sequence& seq, const std::vector<std::pair<int64_t, int64_t>>& positions) {
  std::vector<MidstepReservation> out;
  if (!(readable_midstep_ && applies(seq)) || !scratch_) return out;
  std::unordered_set<int64_t> queued;
  for (const auto& q : scratch_queued_) queued.insert(q.first);
  for (const auto& [pos, h] : positions)
    if (h == -1) bad_argument("positions", h, "-1 means no hash");
  // A scratch pool that throws part way gives back what it handed out.
  try {
    for (const auto& [pos, h] : positions) {
      // Already stored or on its way: a second image would be refused anyway.
      if (queued.count(h) != 0 || store_->contains_or_pending(h)) continue;
      if (!scratch_->has_free(1)) {
        ++dropped_;
        break;
      }
      out.emplace_back(scratch_->pop(), pos, h);
    }
  } catch (...) {
    for (const auto& r : out) scratch_->release(std::get<0>(r));
    throw;
  }
  reserved_.insert(reserved_.end(), out.begin(), out.end());
  return out;
}

namespace {
// Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "(" + std::string&&.
std::string reservation_text(const MidstepReservation& r) {
  std::string text(1, '(');
  text += std::to_string(std::get<0>(r));
  text += ", ";
  text += std::to_string(std::get<1>(r));
  text += ", ";
  text += std::to_string(std::get<2>(r));
  text += ')';
  return text;
}
}  // namespace

void PagedStateCheckpointCoordinator::check_reservations(const std::vector<MidstepReservation>& reservations) const {
  std::vector<MidstepReservation> open = reserved_;
  for (const auto& r : reservations) {
    auto it = std::find(open.begin(), open.end(), r);
    if (it == open.end())
      bad_argument("reservations", reservation_text(r),
                   "is not an open midstep reservation of this coordinator (published, cancelled or never reserved)");
    open.erase(it);
  }
}

void PagedStateCheckpointCoordinator::forget_reservations(const std::vector<MidstepReservation>& reservations) {
  for (const auto& r : reservations) reserved_.erase(std::find(reserved_.begin(), reserved_.end(), r));
}

void PagedStateCheckpointCoordinator::publish_midstep(const std::vector<MidstepReservation>& reservations) {
  check_reservations(reservations);
  forget_reservations(reservations);
  for (const auto& [slot, pos, h] : reservations) scratch_queued_.emplace_back(h, slot);
}

void PagedStateCheckpointCoordinator::cancel_midstep(const std::vector<MidstepReservation>& reservations) {
  check_reservations(reservations);
  forget_reservations(reservations);
  for (const auto& r : reservations) release_scratch(std::get<0>(r));
}

void PagedStateCheckpointCoordinator::take_scratch_stores(int64_t budget, std::vector<CheckpointStoreOp>& stores,
                                                          std::vector<int64_t>& begun) {
  std::vector<std::pair<int64_t, int64_t>> queued;
  queued.swap(scratch_queued_);
  size_t i = 0;
  // What is not begun waits, still holding its scratch slots, ahead of what
  // a pool's call back queued meanwhile.
  auto requeue_rest = [&] {
    std::vector<std::pair<int64_t, int64_t>> rest(queued.begin() + static_cast<ptrdiff_t>(i), queued.end());
    rest.insert(rest.end(), scratch_queued_.begin(), scratch_queued_.end());
    scratch_queued_.swap(rest);
  };
  try {
    // Past this batch's descriptor budget the rest waits.
    for (; i < queued.size() && budget > 0; ++i) {
      const auto [h, slot] = queued[i];
      std::optional<CheckpointStoreOp> op;
      if (!store_->contains_or_pending(h)) op = store_->begin_store(h, slot);
      if (!op) {
        // Nothing will read this scratch, and its forward has completed.
        release_scratch(slot);
        ++dropped_;
        continue;
      }
      stores.push_back(std::move(*op));
      begun.push_back(h);
      scratch_issued_.push_back(slot);
      ++kept_;
      --budget;
    }
  } catch (...) {
    requeue_rest();
    throw;
  }
  requeue_rest();
}

// -------------------------------------------------------------- admission --

bool PagedStateCheckpointCoordinator::reachable(int64_t prefix_hash) const {
  if (store_->contains(prefix_hash)) return true;
  return vote_ && vote_->could_serve(prefix_hash);
}

// ------------------------------------------------------------- boundaries --

void PagedStateCheckpointCoordinator::drop_pending_of(const Sequence* seq) {
  const int64_t* at = pending_index_.find(key_of(seq));
  if (at == nullptr) return;
  Pending& p = pending_[static_cast<size_t>(*at)];
  if (--pending_hashes_[p.prefix_hash] == 0) pending_hashes_.erase(p.prefix_hash);
  p.live = false;
  p.seq.reset();
  pending_index_.erase(key_of(seq));
}

void PagedStateCheckpointCoordinator::supersede(const Sequence* seq) {
  // The slot has moved past the earlier boundary: storing it now would file
  // the newer state under the older hash.
  if (!pending_index_.contains(key_of(seq))) return;
  drop_pending_of(seq);
  ++dropped_;
}

void PagedStateCheckpointCoordinator::check_checkpoint(int64_t boundary_blocks, int64_t prefix_hash) {
  if (boundary_blocks < 0) bad_argument("boundary_blocks", boundary_blocks, "must be >= 0");
  if (prefix_hash == -1) bad_argument("h", prefix_hash, "-1 means no hash");
}

void PagedStateCheckpointCoordinator::checkpoint_many(std::span<const std::shared_ptr<Sequence>> seqs,
                                                      std::span<const uintptr_t> keys,
                                                      std::span<const int64_t> boundary_blocks,
                                                      std::span<const int64_t> hashes) {
  batch::checkpoint_many(
      seqs.size(), keys, boundary_blocks, hashes, [&](size_t i) { check_checkpoint(boundary_blocks[i], hashes[i]); },
      [&](size_t i) { checkpoint(seqs[i], boundary_blocks[i], hashes[i]); });
}

std::vector<uint8_t> PagedStateCheckpointCoordinator::begin_restores(std::span<const int64_t> hashes,
                                                                     std::span<const int64_t> dst_slots) {
  batch::check_length("dst_slots", dst_slots.size(), "hashes", hashes.size());
  batch::check_nonnegative("dst_slots", dst_slots);  // the one thing begin_restore refuses
  std::vector<uint8_t> queued(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) queued[i] = store_->queue_restore(hashes[i], dst_slots[i]);
  return queued;
}

void PagedStateCheckpointCoordinator::checkpoint(const std::shared_ptr<Sequence>& seq, int64_t boundary_blocks,
                                                 int64_t prefix_hash) {
  check_checkpoint(boundary_blocks, prefix_hash);
  if (!applies(*seq) || seq->state_slot() < 0) return;
  supersede(seq.get());
  pending_index_[key_of(seq.get())] = static_cast<int64_t>(pending_.size());
  pending_.push_back(Pending{seq, prefix_hash, true, boundary_blocks});
  ++pending_hashes_[prefix_hash];
}

void PagedStateCheckpointCoordinator::forget_pending(const Sequence& seq) {
  drop_pending_of(&seq);
  store_->cancel_queued_restore(seq.state_slot());
}

std::pair<std::vector<CheckpointStoreOp>, std::vector<CheckpointRestoreOp>>
PagedStateCheckpointCoordinator::take_checkpoint_ops() {
  if (draining_)
    throw std::runtime_error("take_checkpoint_ops: called from inside take_checkpoint_ops (an eviction handler)");
  draining_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{draining_};
  std::vector<Pending> pending;
  pending.swap(pending_);
  pending_index_.clear();
  pending_hashes_.clear();
  std::vector<CheckpointStoreOp> stores;
  std::vector<int64_t> begun;  // the stores' hashes, should the drain fail
  stores.reserve(pending.size());
  size_t next = 0;
  try {
    for (; next < pending.size(); ++next) {
      Pending& p = pending[next];
      if (!p.live) continue;
      // The slot holds the state as of this boundary and no other (supersede).
      const int64_t src_slot = p.seq->state_slot();
      if (src_slot < 0 || store_->contains_or_pending(p.prefix_hash)) continue;
      auto op = store_->begin_store(p.prefix_hash, src_slot, p.boundary_blocks);
      if (!op) {
        ++dropped_;
        continue;
      }
      stores.push_back(std::move(*op));
      begun.push_back(p.prefix_hash);
      ++kept_;
    }
    if (!scratch_queued_.empty())
      take_scratch_stores(max_ops_per_batch_ - static_cast<int64_t>(stores.size()) - store_->num_queued_restores(),
                          stores, begun);
  } catch (...) {
    abandon_drain(begun, pending, next);
    throw;
  }
  // Restores are taken last: nothing after them can fail.
  std::vector<CheckpointRestoreOp> restores = store_->take_restore_ops();
  return {std::move(stores), std::move(restores)};
}

void PagedStateCheckpointCoordinator::abandon_drain(const std::vector<int64_t>& begun, std::vector<Pending>& pending,
                                                    size_t next) {
  // Nothing was handed out: the stores begun are dropped (still in flight,
  // so their units come back at the next complete_previous_batch) ...
  for (int64_t h : begun) store_->unindex(h);
  kept_ -= static_cast<int64_t>(begun.size());
  // ... and the boundaries not begun wait for the next drain, ahead of any
  // filed meanwhile (which supersede theirs).
  std::vector<Pending> kept;
  for (size_t i = next; i < pending.size(); ++i)
    if (pending[i].live && !pending_index_.contains(key_of(pending[i].seq.get())))
      kept.push_back(std::move(pending[i]));
  for (Pending& p : pending_)
    if (p.live) kept.push_back(std::move(p));
  pending_.swap(kept);
  pending_index_.clear();
  pending_hashes_.clear();
  for (size_t i = 0; i < pending_.size(); ++i) {
    pending_index_[key_of(pending_[i].seq.get())] = static_cast<int64_t>(i);
    ++pending_hashes_[pending_[i].prefix_hash];
  }
}

void PagedStateCheckpointCoordinator::complete_previous_batch() {
  if (draining_)
    throw std::runtime_error(
        "complete_previous_batch: called from inside take_checkpoint_ops (an eviction handler); "
        "the stores being begun are not written yet");
  store_->complete_inflight();
  // The stores reading these scratch slots went out with the last batch, and
  // stream order puts any new tenant's writes behind them: safe to free now.
  std::vector<int64_t> issued;
  issued.swap(scratch_issued_);
  for (int64_t slot : issued) release_scratch(slot);
}

// ------------------------------------------------------ external transfers --

std::optional<UnitIds> PagedStateCheckpointCoordinator::reserve_transfer_units(int64_t owner) {
  if (transfer_units_.count(owner) != 0) return std::nullopt;
  const int64_t n = store_->units_per_checkpoint();
  if (!store_->ensure_free_units(n)) return std::nullopt;
  UnitIds units;
  if (!store_->reserve_pool_units(n, owner, units)) return std::nullopt;
  if (transfer_units_.count(owner) != 0) {
    // Reserved for this owner meanwhile, by a call back from the pool.
    store_->release_pool_units(units, owner);
    return std::nullopt;
  }
  return transfer_units_.emplace(owner, std::move(units)).first->second;
}

void PagedStateCheckpointCoordinator::release_transfer_units(int64_t owner) {
  auto it = transfer_units_.find(owner);
  if (it == transfer_units_.end()) return;
  UnitIds units = std::move(it->second);
  transfer_units_.erase(it);
  store_->release_pool_units(units, owner);
}

bool PagedStateCheckpointCoordinator::adopt_transfer_units(int64_t owner, int64_t prefix_hash) {
  if (prefix_hash == -1) bad_argument("prefix_hash", prefix_hash, "-1 means no hash");
  auto it = transfer_units_.find(owner);
  if (it == transfer_units_.end()) return false;
  const UnitIds units = it->second;  // the pool may call back and change the map
  const bool adopted = store_->adopt_units(units, owner, prefix_hash);
  // Only now: had adoption thrown, the units would stay reachable for release.
  auto now = transfer_units_.find(owner);
  if (now != transfer_units_.end() && now->second == units) transfer_units_.erase(now);
  return adopted;
}

// ------------------------------------------------------------------- tier --

void PagedStateCheckpointCoordinator::attach_offload(std::shared_ptr<const OffloadVote> vote, bool attached,
                                                     bool sink) {
  vote_ = std::move(vote);
  store_->set_offload_sink(attached && sink);
}

void PagedStateCheckpointCoordinator::unindex(int64_t prefix_hash) {
  // One hash may be pending for several sequences; all of them lose it.
  bool stale = false;
  if (pending_hashes_.contains(prefix_hash)) {
    for (Pending& p : pending_) {
      if (!p.live || p.prefix_hash != prefix_hash) continue;
      drop_pending_of(p.seq.get());
      stale = true;
    }
  }
  // A queued midstep store dies with its hash too (the reference keeps it):
  // begun later, its image would outlive the KV block it goes with, and a
  // prefix whose block is filed under the hash next would resume it.
  std::vector<int64_t> slots;
  std::erase_if(scratch_queued_, [&](const std::pair<int64_t, int64_t>& q) {
    if (q.first != prefix_hash) return false;
    slots.push_back(q.second);
    return true;
  });
  stale = stale || !slots.empty();
  bool removed = true;  // a pool that throws has been given the image's units back
  FirstError error;
  error.run([&] { removed = store_->unindex(prefix_hash); });
  if (stale || removed) ++orphaned_;
  for (int64_t slot : slots) release_scratch(slot);  // last: may call into Python
  error.rethrow();
}

void PagedStateCheckpointCoordinator::check_consistency() const {
  store_->check_consistency();
  int64_t live = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    const Pending& p = pending_[i];
    if (!p.live) continue;
    ++live;
    check_invariant(p.prefix_hash != -1, "coordinator: a boundary pending under -1");
    const int64_t* at = pending_index_.find(key_of(p.seq.get()));
    check_invariant(at != nullptr && *at == static_cast<int64_t>(i), "coordinator: pending index disagrees");
  }
  check_invariant(live == static_cast<int64_t>(pending_index_.size()), "coordinator: pending index has stale entries");
  int64_t counted = 0;
  pending_hashes_.for_each([&](int64_t, int64_t n) { counted += n; });
  check_invariant(counted == live, "coordinator: pending hash counts drifted");
  for (const auto& [owner, units] : transfer_units_) {
    check_invariant(static_cast<int64_t>(units.size()) == store_->units_per_checkpoint(),
                    "coordinator: a transfer holds the wrong number of units");
    if (store_->pool_ptr())  // a foreign pool's ownership is its own business
      for (int64_t u : units)
        check_invariant(store_->pool_ptr()->owner_of(u) == owner, "coordinator: a transfer unit is not its own");
  }
  for (const auto& [h, slot] : scratch_queued_)
    check_invariant(h != -1, "coordinator: a scratch store queued under -1");
}

void PagedStateCheckpointCoordinator::clear_index() {
  pending_.clear();
  pending_index_.clear();
  pending_hashes_.clear();
  store_->clear();
}

}  // namespace statecache
