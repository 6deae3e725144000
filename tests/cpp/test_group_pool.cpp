#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/group_pool.h"

using namespace statecache;

namespace {

std::shared_ptr<Sequence> owner_of(int64_t group) {
  auto s = std::make_shared<Sequence>();
  s->num_tokens = 100;
  s->per_req_cache_group = group;
  return s;
}

// What the bindings do around the core: keep each sequence that joined the
// pending list, hand its fields to take_copies, clear its pending checkpoint.
struct Harness {
  StateGroupPool& p;
  std::vector<std::shared_ptr<Sequence>> pending;
  void checkpoint(const std::shared_ptr<Sequence>& s, int64_t blocks, int64_t h) {
    if (p.checkpoint(*s, blocks, h)) pending.push_back(s);
  }
  std::vector<std::pair<int64_t, int64_t>> take_copies() {
    std::vector<StateGroupPool::PendingSeq> state;
    for (size_t k = 0; k < pending.size(); ++k) {
      size_t first = k;
      for (size_t j = 0; j < k; ++j)
        if (pending[j] == pending[k]) first = std::min(first, j);
      state.push_back({pending[k]->pending_checkpoint, pending[k]->per_req_cache_group, first});
    }
    for (auto& s : pending) s->pending_checkpoint = -1;
    auto out = p.take_copies(state);
    pending.clear();
    return out;
  }
};

}  // namespace

TEST(StateGroupPool, CopyCheckpointIsFiledAtTakeCopies) {
  StateGroupPool p(4, StateTransfer(TransferKind::kCopy));
  Harness hx{p, {}};
  auto s = owner_of(p.pop());
  hx.checkpoint(s, 1, 5);
  hx.checkpoint(s, 2, 6);  // supersedes
  EXPECT_EQ(p.lookup(6), -1);
  EXPECT_EQ(p.pending_count(), 1u);
  auto pairs = hx.take_copies();
  ASSERT_EQ(pairs.size(), 1u);
  EXPECT_EQ(pairs[0], (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(p.lookup(6), 1);
  EXPECT_EQ(p.lookup(5), -1);
  EXPECT_TRUE(p.holds_checkpoint(1));
  EXPECT_EQ(s->pending_checkpoint, -1);
  p.check_invariants();
}

TEST(StateGroupPool, IntentDiesWithItsGroup) {
  // A's intent describes group 0's bytes; A's group is released without
  // forget_pending and handed to B: B's state must not be filed under A's hash.
  StateGroupPool p(3, StateTransfer(TransferKind::kCopy));
  Harness hx{p, {}};
  auto a = owner_of(p.pop());
  hx.checkpoint(a, 1, 8);
  p.release(0);
  auto b = owner_of(p.pop());
  ASSERT_EQ(b->per_req_cache_group, 0);
  EXPECT_TRUE(hx.take_copies().empty());
  EXPECT_EQ(p.lookup(8), -1);
  EXPECT_EQ(p.fates().kept, 0);
  p.check_invariants();
}

TEST(StateGroupPool, RefusesMinusOneAsAHash) {
  StateGroupPool p(3, StateTransfer(TransferKind::kCopy));
  auto s = owner_of(p.pop());
  EXPECT_THROW(p.checkpoint(*s, 1, -1), std::invalid_argument);
  EXPECT_EQ(s->pending_checkpoint, -1);
  EXPECT_EQ(p.pending_count(), 0u);
}

TEST(StateGroupPool, ForgottenOrGoneOwnersAreSkipped) {
  StateGroupPool p(4, StateTransfer(TransferKind::kCopy));
  Harness hx{p, {}};
  auto a = owner_of(p.pop()), b = owner_of(p.pop());
  hx.checkpoint(a, 1, 1);
  hx.checkpoint(b, 1, 2);
  p.forget_pending(*a);
  b->per_req_cache_group = -1;
  EXPECT_TRUE(hx.take_copies().empty());
  EXPECT_EQ(p.fates().kept, 0);
}

TEST(StateGroupPool, ForkCheckpointPins) {
  StateGroupPool p(3, StateTransfer(TransferKind::kFork, 1));
  auto s = owner_of(p.pop());
  p.checkpoint(*s, 1, 4);
  EXPECT_EQ(s->per_req_cache_group, 1);
  EXPECT_EQ(s->state_fork_src, 0);
  EXPECT_TRUE(p.is_pinned(0));
  EXPECT_EQ(p.lookup(4), 0);
}

TEST(StateGroupPool, NoneAndReplayKeepNothing) {
  for (TransferKind k : {TransferKind::kNone, TransferKind::kReplay}) {
    StateGroupPool p(1, StateTransfer(k));
    auto s = owner_of(p.pop());
    p.checkpoint(*s, 1, 4);  // nothing free either: still not even a drop
    EXPECT_EQ(p.fates().dropped, 0);
    EXPECT_EQ(p.fates().kept, 0);
    EXPECT_EQ(s->per_req_cache_group, 0);
    EXPECT_EQ(s->pending_checkpoint, -1);
  }
}

TEST(StateGroupPool, UnindexReturnsTheGroup) {
  StateGroupPool p(3, StateTransfer(TransferKind::kCopy));
  Harness hx{p, {}};
  auto s = owner_of(p.pop());
  hx.checkpoint(s, 1, 9);
  hx.take_copies();
  EXPECT_EQ(p.unindex(9), 1);
  EXPECT_EQ(p.unindex(9), -1);
  EXPECT_EQ(p.fates().orphaned, 1);
}

TEST(StateGroupPool, DroppedWhenFull) {
  StateGroupPool p(1, StateTransfer(TransferKind::kCopy));
  Harness hx{p, {}};
  auto s = owner_of(p.pop());
  hx.checkpoint(s, 1, 9);
  EXPECT_TRUE(hx.take_copies().empty());
  EXPECT_EQ(p.fates().dropped, 1);
}

TEST(StateGroupPool, RecordCopyValidatesAndKeepsOrder) {
  StateGroupPool p(3, StateTransfer(TransferKind::kCopy));
  Harness hx{p, {}};
  p.record_copy(2, 0);
  EXPECT_THROW(p.record_copy(0, 3), std::out_of_range);
  auto s = owner_of(p.pop());
  hx.checkpoint(s, 1, 1);
  auto pairs = hx.take_copies();
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0], (std::pair<int64_t, int64_t>{2, 0}));
  EXPECT_EQ(pairs[1], (std::pair<int64_t, int64_t>{0, 1}));
}
