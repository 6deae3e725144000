// The PAGE coordinator's batched calls against its per-sequence calls (its
// header and the slot pool's name their midstep reservations alike, hence a
// file of its own).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "batch_rows.h"
#include "core/batch.h"
#include "core/checkpoint_coordinator.h"

using namespace statecache;
using statecache::test_support::VecRows;

TEST(Batch, CoordinatorMatchesPerSequenceCalls) {
  const PagedStateCheckpointSpec spec(64, 256, "b", 256);
  PagedStateCheckpointCoordinator a(std::make_shared<BlockPool>(256), spec, true);
  PagedStateCheckpointCoordinator b(std::make_shared<BlockPool>(256), spec, true);
  std::vector<std::shared_ptr<Sequence>> sa, sb;
  std::vector<std::vector<int64_t>> hashes;
  for (int i = 0; i < 12; ++i) {
    std::vector<int64_t> hs;
    for (int k = 0; k < 20; ++k) hs.push_back((i % 4) * 100 + k);
    hashes.push_back(hs);
    for (auto* v : {&sa, &sb}) {
      auto s = std::make_shared<Sequence>();
      s->state_slots = {i};
      v->push_back(s);
    }
  }
  std::mt19937 rng(3);
  for (int pass = 0; pass < 20; ++pass) {
    a.complete_previous_batch();
    b.complete_previous_batch();
    std::vector<int64_t> hits, one_by_one;
    std::vector<Sequence*> pb;
    for (size_t i = 0; i < sa.size(); ++i) {
      hits.push_back(static_cast<int64_t>(rng() % 21));
      one_by_one.push_back(a.resumable_hit(
          *sa[i], hits[i], static_cast<int64_t>(hashes[i].size()),
          [&](int64_t k) { return hashes[i][static_cast<size_t>(k)]; }, false));
      pb.push_back(sb[i].get());
    }
    VecRows rows{hashes};
    ASSERT_EQ(batch::resumable_hits(b, pb, hits, rows, false), one_by_one);
    std::vector<std::shared_ptr<Sequence>> chosen;
    std::vector<int64_t> blocks, hs;
    for (size_t i = 0; i < sa.size(); ++i) {
      if (rng() % 5 >= 2) continue;
      const int64_t k = 1 + static_cast<int64_t>(rng() % 20);
      a.checkpoint(sa[i], k, hashes[i][static_cast<size_t>(k - 1)]);
      chosen.push_back(sb[i]);
      blocks.push_back(k);
      hs.push_back(hashes[i][static_cast<size_t>(k - 1)]);
    }
    b.checkpoint_many(chosen, batch::identities<std::shared_ptr<Sequence>>(chosen), blocks, hs);
    EXPECT_EQ(a.num_pending(), b.num_pending());
    if (pass % 7 == 3) {  // a finished request drops what it had pending
      a.forget_pending(*sa[pass % 12]);
      std::vector<Sequence*> gone{sb[pass % 12].get()};
      b.forget_pending_many(gone);
    }
    // Restores of boundaries filed in earlier passes (READY or not), into
    // slots that may repeat.
    std::vector<int64_t> rh, rs;
    std::vector<uint8_t> queued_a;
    for (int r = 0; r < 6; ++r) {
      rh.push_back(hashes[rng() % 12][rng() % 20]);
      rs.push_back(static_cast<int64_t>(rng() % 4));
      queued_a.push_back(a.begin_restore(rh.back(), rs.back()));
    }
    ASSERT_EQ(b.begin_restores(rh, rs), queued_a);
    ASSERT_EQ(a.take_checkpoint_ops(), b.take_checkpoint_ops());
    EXPECT_EQ(a.checkpoints_kept(), b.checkpoints_kept());
    EXPECT_EQ(a.checkpoints_dropped(), b.checkpoints_dropped());
    a.check_consistency();
    b.check_consistency();
  }
  // A refused batch files nothing.
  std::vector<std::shared_ptr<Sequence>> two{sb[0], sb[1]};
  const auto keys = batch::identities<std::shared_ptr<Sequence>>(two);
  EXPECT_THROW(b.checkpoint_many(two, keys, std::vector<int64_t>{1, -2}, std::vector<int64_t>{5, 6}),
               std::invalid_argument);
  EXPECT_THROW(b.checkpoint_many(two, keys, std::vector<int64_t>{1, 2}, std::vector<int64_t>{5, -1}),
               std::invalid_argument);
  EXPECT_EQ(b.num_pending(), 0);
  // A refused restore batch queues nothing, the good entries before the bad one included.
  b.complete_previous_batch();
  b.complete_previous_batch();
  EXPECT_THROW(b.begin_restores(std::vector<int64_t>{hashes[0][0], hashes[1][0]}, std::vector<int64_t>{0, -1}),
               std::invalid_argument);
  EXPECT_THROW(b.begin_restores(std::vector<int64_t>{hashes[0][0]}, std::vector<int64_t>{}), std::invalid_argument);
  EXPECT_TRUE(b.take_checkpoint_ops().second.empty());
  b.check_consistency();
}
