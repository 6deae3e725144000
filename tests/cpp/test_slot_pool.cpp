#include <gtest/gtest.h>

#include <memory>

#include "core/slot_pool.h"

using namespace statecache;

namespace {

Sequence owner_of(int64_t slot, int64_t num_tokens = 100, int64_t anchor = 0) {
  Sequence s;
  s.num_tokens = num_tokens;
  s.state_slots = {slot};
  s.checkpoint_end_pos = anchor;
  return s;
}

}  // namespace

TEST(StateSlotPool, ForkCheckpointPinsThroughNextPass) {
  StateSlotPool p(4, StateTransfer(TransferKind::kFork, 2), 2);
  Sequence s = owner_of(p.pop(), 100, 4);
  p.checkpoint(s, 2, 9);
  EXPECT_EQ(s.state_slot(), 1);
  EXPECT_EQ(s.state_fork_src, 0);
  EXPECT_EQ(p.lookup(9), 0);
  EXPECT_FALSE(p.is_speculative(0));  // the anchor is knowledge
  p.release_pins();
  EXPECT_TRUE(p.is_pinned(0));
  p.release_pins();
  EXPECT_TRUE(p.holds_checkpoint(0));
  EXPECT_EQ(p.fates().kept, 1);
  p.check_invariants();
}

TEST(StateSlotPool, GuessesAreSpentFirst) {
  StateSlotPool p(4, StateTransfer(TransferKind::kFork, 2), 2);
  Sequence a = owner_of(p.pop(), 100, 4), b = owner_of(p.pop());
  p.checkpoint(a, 2, 1);
  p.checkpoint(b, 2, 2);  // no anchor: a guess
  EXPECT_TRUE(p.is_speculative(1));
  p.release_pins();
  p.release_pins();
  EXPECT_EQ(p.lru_order(), (std::vector<int64_t>{1, 0}));
}

TEST(StateSlotPool, ResumableHitHonoursMinForkTokens) {
  StateSlotPool p(6, StateTransfer(TransferKind::kFork, 3), 2);
  Sequence s = owner_of(p.pop(), 100, 0);
  p.checkpoint(s, 3, 103);
  const std::vector<int64_t> hashes{101, 102, 103, 104};
  Sequence r;
  r.num_tokens = 8;
  EXPECT_EQ(p.resumable_hit(r, 4, hashes), 0);  // 8 - 6 < 3
  r.num_tokens = 9;
  EXPECT_EQ(p.resumable_hit(r, 4, hashes), 3);
  EXPECT_EQ(p.resumable_hit(r, 4, hashes, true), 3);
  EXPECT_THROW(p.resumable_hit(r, 5, hashes), std::out_of_range);
  EXPECT_THROW(p.resumable_hit(r, -1, hashes), std::invalid_argument);
  r.has_per_req_cache = false;
  EXPECT_EQ(p.resumable_hit(r, 4, hashes), 4);
  StateSlotPool replay(2, StateTransfer(TransferKind::kReplay));
  r.has_per_req_cache = true;
  EXPECT_EQ(replay.resumable_hit(r, 4, hashes), 4);
}

TEST(StateSlotPool, MidstepReservePublishCancel) {
  StateSlotPool p(5, StateTransfer(TransferKind::kFork, 2, std::nullopt, true), 2);
  Sequence s = owner_of(p.pop());
  s.midstep_anchor_pos = 6;
  const std::vector<std::pair<int64_t, int64_t>> pos{{2, 20}, {6, 60}};
  auto res = p.reserve_midstep(s, pos);
  ASSERT_EQ(res.size(), 2u);
  EXPECT_EQ(res[0], (MidstepReservation{1, 2, 20}));
  EXPECT_EQ(p.lookup(20), -1);
  p.publish_midstep(res, &s);
  EXPECT_EQ(p.lookup(20), 1);
  EXPECT_EQ(p.lru_order(), (std::vector<int64_t>{1, 2}));  // 2 != anchor: demoted
  auto more = p.reserve_midstep(s, pos);
  p.cancel_midstep(more);
  EXPECT_EQ(p.num_free(), 4);
  EXPECT_THROW(p.publish_midstep(res, nullptr), std::invalid_argument);  // already free
  p.check_invariants();
}

TEST(StateSlotPool, PopManyAndReleaseManyAreAllOrNothing) {
  StateSlotPool p(3);
  EXPECT_THROW(p.pop_many(4), std::out_of_range);
  EXPECT_EQ(p.num_free(), 3);
  auto got = p.pop_many(2);
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1}));
  const std::vector<int64_t> twice{0, -1, 0};
  EXPECT_THROW(p.release_many(twice), std::invalid_argument);
  EXPECT_EQ(p.num_free(), 1);
  const std::vector<int64_t> ok{-1, 1, 0};
  p.release_many(ok);
  EXPECT_EQ(p.num_free(), 3);
}

TEST(StateSlotPool, RejectsCopyTransfer) {
  EXPECT_THROW(StateSlotPool(2, StateTransfer(TransferKind::kCopy)), std::invalid_argument);
  EXPECT_THROW(StateSlotPool(2, StateTransfer(), 0), std::invalid_argument);
}

TEST(StateSlotPool, ServesAsScratchSlotSource) {
  auto pool = std::make_shared<StateSlotPool>(2);
  std::shared_ptr<ScratchSlotSource> scratch = pool;
  EXPECT_TRUE(scratch->has_free(2));
  const int64_t s = scratch->pop();
  EXPECT_EQ(pool->num_free(), 1);
  scratch->release(s);
  EXPECT_EQ(pool->num_free(), 2);
  EXPECT_THROW(scratch->release(s), std::invalid_argument);
}

TEST(StateSlotPool, RelocationsAreTakenOnce) {
  StateSlotPool p(4);
  p.record_relocation(3, 0);
  EXPECT_THROW(p.record_relocation(4, 0), std::out_of_range);
  auto moves = p.take_relocations();
  EXPECT_EQ(moves.size(), 1u);
  EXPECT_TRUE(p.take_relocations().empty());
}

TEST(StateSlotPool, MidstepTakesLiveReservationsOnly) {
  StateSlotPool p(6, StateTransfer(TransferKind::kFork, 1, std::nullopt, /*readable_midstep=*/true), 2);
  Sequence s = owner_of(p.pop());
  const std::vector<std::pair<int64_t, int64_t>> pos{{2, 21}, {4, 22}};
  auto res = p.reserve_midstep(s, pos);
  ASSERT_EQ(res.size(), 2u);
  // A live request's slot is not a reservation: refused, nothing changes.
  const std::vector<MidstepReservation> live{{s.state_slot(), 2, 23}};
  EXPECT_THROW(p.publish_midstep(live, &s), std::invalid_argument);
  // One bad row: nothing released.
  const std::vector<MidstepReservation> mixed{res[0], {s.state_slot(), 0, 24}};
  EXPECT_THROW(p.cancel_midstep(mixed), std::invalid_argument);
  EXPECT_TRUE(p.is_reserved(res[0].slot));
  const int64_t free_before = p.num_free();
  p.publish_midstep(std::span(res).first(1), &s);
  EXPECT_EQ(p.lookup(21), res[0].slot);
  EXPECT_THROW(p.publish_midstep(std::span(res).first(1), &s), std::invalid_argument);
  p.release(res[1].slot);  // released by hand: no longer a reservation
  EXPECT_FALSE(p.is_reserved(res[1].slot));
  EXPECT_EQ(p.num_free(), free_before + 2);
  EXPECT_THROW(p.reserve_midstep(s, std::vector<std::pair<int64_t, int64_t>>{{2, -1}}), std::invalid_argument);
  p.check_invariants();
}
