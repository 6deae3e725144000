#include <gtest/gtest.h>

#include <memory>

#include "core/group_pool.h"

using namespace statecache;

namespace {

std::shared_ptr<Sequence> owner_of(int64_t group) {
  auto s = std::make_shared<Sequence>();
  s->num_tokens = 100;
  s->per_req_cache_group = group;
  return s;
}

}  // namespace

TEST(StateGroupPool, CopyCheckpointIsFiledAtTakeCopies) {
  StateGroupPool p(4, StateTransfer(TransferKind::kCopy));
  auto s = owner_of(p.pop());
  p.checkpoint(s, 1, 5);
  p.checkpoint(s, 2, 6);  // supersedes
  EXPECT_EQ(p.lookup(6), -1);
  EXPECT_EQ(p.pending_sequences().size(), 1u);
  auto pairs = p.take_copies();
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0], (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(p.lookup(6), 1);
  EXPECT_EQ(p.lookup(5), -1);
  EXPECT_TRUE(p.holds_checkpoint(1));
  EXPECT_EQ(s->pending_checkpoint, -1);
  p.check_invariants();
}

TEST(StateGroupPool, PendingSequenceOutlivesItsOwner) {
  StateGroupPool p(3, StateTransfer(TransferKind::kCopy));
  {
    auto s = owner_of(p.pop());
    p.checkpoint(s, 1, 8);
  }  // the engine dropped it; the pool still holds a reference
  EXPECT_EQ(p.take_copies().size(), 1u);
  EXPECT_EQ(p.lookup(8), 1);
}

TEST(StateGroupPool, ForgottenOrGoneOwnersAreSkipped) {
  StateGroupPool p(4, StateTransfer(TransferKind::kCopy));
  auto a = owner_of(p.pop()), b = owner_of(p.pop());
  p.checkpoint(a, 1, 1);
  p.checkpoint(b, 1, 2);
  p.forget_pending(*a);
  b->per_req_cache_group = -1;
  EXPECT_TRUE(p.take_copies().empty());
  EXPECT_EQ(p.fates().kept, 0);
}

TEST(StateGroupPool, ForkCheckpointPins) {
  StateGroupPool p(3, StateTransfer(TransferKind::kFork, 1));
  auto s = owner_of(p.pop());
  p.checkpoint(s, 1, 4);
  EXPECT_EQ(s->per_req_cache_group, 1);
  EXPECT_EQ(s->state_fork_src, 0);
  EXPECT_TRUE(p.is_pinned(0));
  EXPECT_EQ(p.lookup(4), 0);
}

TEST(StateGroupPool, NoneAndReplayKeepNothing) {
  for (TransferKind k : {TransferKind::kNone, TransferKind::kReplay}) {
    StateGroupPool p(1, StateTransfer(k));
    auto s = owner_of(p.pop());
    p.checkpoint(s, 1, 4);  // nothing free either: still not even a drop
    EXPECT_EQ(p.fates().dropped, 0);
    EXPECT_EQ(p.fates().kept, 0);
    EXPECT_EQ(s->per_req_cache_group, 0);
    EXPECT_EQ(s->pending_checkpoint, -1);
  }
}

TEST(StateGroupPool, UnindexReturnsTheGroup) {
  StateGroupPool p(3, StateTransfer(TransferKind::kCopy));
  auto s = owner_of(p.pop());
  p.checkpoint(s, 1, 9);
  p.take_copies();
  EXPECT_EQ(p.unindex(9), 1);
  EXPECT_EQ(p.unindex(9), -1);
  EXPECT_EQ(p.fates().orphaned, 1);
}

TEST(StateGroupPool, DroppedWhenFull) {
  StateGroupPool p(1, StateTransfer(TransferKind::kCopy));
  auto s = owner_of(p.pop());
  p.checkpoint(s, 1, 9);
  EXPECT_TRUE(p.take_copies().empty());
  EXPECT_EQ(p.fates().dropped, 1);
}

TEST(StateGroupPool, RecordCopyValidatesAndKeepsOrder) {
  StateGroupPool p(3, StateTransfer(TransferKind::kCopy));
  p.record_copy(2, 0);
  EXPECT_THROW(p.record_copy(0, 3), std::out_of_range);
  auto s = owner_of(p.pop());
  p.checkpoint(s, 1, 1);
  auto pairs = p.take_copies();
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0], (std::pair<int64_t, int64_t>{2, 0}));
  EXPECT_EQ(pairs[1], (std::pair<int64_t, int64_t>{0, 1}));
}
