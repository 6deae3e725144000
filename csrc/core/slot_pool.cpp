#include "core/slot_pool.h"

#include <algorithm>

#include "core/batch.h"

namespace statecache {

StateSlotPool::StateSlotPool(int64_t num_slots, StateTransfer transfer, int64_t hash_block_size, bool enabled)
    : CheckpointPool(num_slots, std::move(transfer), hash_block_size, enabled, "slot",
                     /*reads_assumed_hashes=*/true) {
  if (this->transfer().copies())
    bad_argument("transfer", "StateTransfer.copy()", "PAGE-copy checkpoints do not belong to StateSlotPool");
}

std::vector<int64_t> StateSlotPool::pop_many(int64_t count) {
  check_count("count", count);
  if (count > num_free())
    throw std::out_of_range("count=" + std::to_string(count) + " exceeds the " + std::to_string(num_free()) +
                            " free slots");
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out.push_back(pop());
  return out;
}

void StateSlotPool::checkpoint(Sequence& seq, int64_t boundary_blocks, int64_t h) {
  const ForkPlan plan = plan_checkpoint(seq, h);
  apply_checkpoint(seq, plan, boundary_blocks, h);
}

void StateSlotPool::check_checkpoint(const Sequence& seq, int64_t h) const {
  check_hash("h", h);
  if (!applies(seq) || !transfer().forks()) return;
  const int64_t old = seq.state_slot();
  if (old < 0) return;
  check_index("seq.state_slot", old, size());
  if (is_free(old)) bad_argument("seq.state_slot", old, "is free, so the sequence does not own it");
}

ForkPlan StateSlotPool::plan_checkpoint(const Sequence& seq, int64_t h) {
  check_checkpoint(seq, h);
  if (!applies(seq) || !transfer().forks() || seq.state_slot() < 0) return {};
  return plan_fork(seq.state_slot());
}

void StateSlotPool::checkpoint_many(std::span<Sequence* const> seqs, std::span<const uintptr_t> keys,
                                    std::span<const int64_t> boundary_blocks, std::span<const int64_t> hashes) {
  // An entry's checks hold for the whole batch: no checkpoint frees a slot
  // a sequence owns.
  batch::checkpoint_many(
      seqs.size(), keys, boundary_blocks, hashes, [&](size_t i) { check_checkpoint(*seqs[i], hashes[i]); },
      [&](size_t i) { checkpoint(*seqs[i], boundary_blocks[i], hashes[i]); });
}

void StateSlotPool::apply_checkpoint(Sequence& seq, const ForkPlan& plan, int64_t boundary_blocks, int64_t h) {
  if (!plan.forks) {
    apply_fork(plan, h);
    return;
  }
  const int64_t known = anchor_of(seq);
  const bool guess = known == 0 || !boundary_is(boundary_blocks, known);
  seq.set_state_slot(apply_fork(plan, h, boundary_blocks));
  seq.state_fork_src = plan.old;
  // `old` is not released: the forward that reads it is the one the next pass
  // builds, so it stays pinned through that pass.
  if (guess) mark_speculative(plan.old);
  pin(plan.old, /*reader_is_next_batch=*/true);
  ++fates_.kept;
}

std::vector<MidstepReservation> StateSlotPool::reserve_midstep(const Sequence& seq,
                                                               std::span<const std::pair<int64_t, int64_t>> positions) {
  for (const auto& [pos, h] : positions) check_hash("positions hash", h);
  std::vector<MidstepReservation> out;
  if (!applies(seq) || !readable_midstep()) return out;
  for (const auto& [pos, h] : positions) {
    // Best effort, in order: the earliest position survives a shortage.
    if (!has_free()) {
      ++fates_.dropped;
      break;
    }
    out.push_back({pop(), pos, h});
    set_reserved(out.back().slot, true);
  }
  return out;
}

bool StateSlotPool::is_reserved(int64_t slot) const {
  return slot >= 0 && slot < size() && static_cast<size_t>(slot) < reserved_at_.size() && !is_free(slot) &&
         reserved_at_[static_cast<size_t>(slot)] == release_epoch(slot) + 1;
}

void StateSlotPool::set_reserved(int64_t slot, bool reserved) {
  if (static_cast<size_t>(slot) >= reserved_at_.size()) reserved_at_.resize(static_cast<size_t>(capacity()), 0);
  reserved_at_[static_cast<size_t>(slot)] = reserved ? release_epoch(slot) + 1 : 0;
}

std::optional<SlotRetirement> StateSlotPool::retire_top() {
  const int64_t top = size() - 1;
  const bool reserved = is_reserved(top);
  auto r = CheckpointPool::retire_top();
  if (r && reserved) {
    set_reserved(top, false);
    // The caller re-points the reservation at the relocation target.
    if (r->relocated_to >= 0 && !r->held_checkpoint) set_reserved(r->relocated_to, true);
  }
  return r;
}

void StateSlotPool::check_returnable(std::span<const MidstepReservation> reservations) const {
  std::vector<int64_t> slots;
  slots.reserve(reservations.size());
  for (const auto& r : reservations) {
    check_in_range(r.slot);
    if (!is_reserved(r.slot))
      bad_argument("reservations slot", r.slot, "is not a live midstep reservation of this pool");
    check_owned(r.slot);
    check_hash("reservations hash", r.hash);
    slots.push_back(r.slot);
  }
  check_distinct(std::move(slots));
}

void StateSlotPool::publish_midstep(std::span<const MidstepReservation> reservations, const Sequence* seq) {
  check_returnable(reservations);
  // Without a sequence a guess cannot be told from knowledge: demote nothing.
  // With one but no anchor, everything it files is a guess.
  const int64_t known = seq ? anchor_of(*seq) : 0;
  for (const auto& r : reservations) {
    if (seq && (known == 0 || r.position != known)) mark_speculative(r.slot);
    set_reserved(r.slot, false);
    file_checkpoint(r.hash, r.slot, r.position / hash_block_size());
    put_back(r.slot);
    ++fates_.kept;
  }
}

void StateSlotPool::cancel_midstep(std::span<const MidstepReservation> reservations) {
  check_returnable(reservations);
  // Never written, so released vacant and never indexed.
  for (const auto& r : reservations) {
    set_reserved(r.slot, false);
    put_back(r.slot);
  }
}

void StateSlotPool::record_relocation(int64_t src, int64_t dst) {
  check_index("src", src, capacity());
  check_index("dst", dst, capacity());
  relocations_.emplace_back(src, dst);
}

std::vector<std::pair<int64_t, int64_t>> StateSlotPool::take_relocations() {
  std::vector<std::pair<int64_t, int64_t>> out;
  out.swap(relocations_);
  return out;
}

}  // namespace statecache
