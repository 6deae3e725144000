#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "core/block_pool.h"
#include "core/checkpoint_store.h"
#include "core/errors.h"
#include "core/eviction_policy.h"
#include "core/free_list.h"

using namespace statecache;

namespace {

EvictionCostModel cost_model(double weight = 1.0) {
  EvictionCostModel m;
  m.kind = EvictionCostModel::Kind::kCost;
  m.flops_per_token = 1.0;
  m.weight = weight;
  return m;
}

struct TestList : StateFreeList {
  using StateFreeList::StateFreeList;
  void file(int64_t h, int64_t u, int64_t position) { file_checkpoint(h, u, position); }
};

void make_checkpoint(TestList& l, int64_t u, int64_t h, int64_t position) {
  l.claim(u);
  l.file(h, u, position);
  l.release(u);
}

auto any = [](int64_t) { return true; };

}  // namespace

TEST(EvictionOrder, LruSettingHoldsNothing) {
  CheckpointEvictionOrder o;
  o.set_position(3, 100);
  o.push(3, false);
  EXPECT_FALSE(o.active());
  EXPECT_EQ(o.size(), 0);
  EXPECT_EQ(o.victim(any), -1);
}

TEST(EvictionOrder, RanksRecencyAgainstValue) {
  CheckpointEvictionOrder o;
  o.set_model(cost_model());
  // oldest first: a long prefix (64 blocks), then three short ones
  o.set_position(0, 64);
  o.push(0, false);
  for (int64_t i = 1; i <= 3; ++i) {
    o.set_position(i, 1);
    o.push(i, false);
  }
  // 0 is the oldest but worth the most: the oldest short one goes first
  EXPECT_EQ(o.victim(any), 1);
  // with no weight on value it is plain recency across segments
  EvictionCostModel m = cost_model(0.0);
  ASSERT_FALSE(o.needs_rebuild(m));
  o.set_model(m);
  EXPECT_EQ(o.victim(any), 0);
  // refused entries are walked past
  EXPECT_EQ(o.victim([](int64_t i) { return i != 0; }), 1);
}

TEST(EvictionOrder, GuessesFirstAndRemoveReplace) {
  CheckpointEvictionOrder o;
  o.set_model(cost_model());
  o.set_position(0, 1);
  o.push(0, false);
  o.set_position(1, 64);
  o.push(1, true);  // a guess, worth a lot, newest
  EXPECT_EQ(o.victim(any), 1);
  o.replace(1, 7);
  EXPECT_FALSE(o.contains(1));
  EXPECT_TRUE(o.contains(7));
  EXPECT_EQ(o.position(7), 64);
  EXPECT_EQ(o.victim(any), 7);
  o.remove(7);
  EXPECT_EQ(o.victim(any), 0);
  EXPECT_EQ(o.size(), 1);
  EvictionCostModel m = cost_model();
  m.guesses_first = false;
  EXPECT_TRUE(o.needs_rebuild(m));
}

TEST(EvictionOrder, BadModelsNameTheField) {
  EvictionCostModel m = cost_model();
  m.checkpoint_bytes = 0;
  EXPECT_THROW(m.validate(), std::invalid_argument);
  m = cost_model(-1.0);
  EXPECT_THROW(m.validate(), std::invalid_argument);
  m = cost_model();
  m.flops_per_token = std::numeric_limits<double>::infinity();
  EXPECT_THROW(m.validate(), std::invalid_argument);
  TestList l(4, true, "slot");
  EvictionCostModel bad = cost_model();
  bad.tokens_per_position = -2;
  EXPECT_THROW(l.set_eviction_model(bad), std::invalid_argument);
  EXPECT_EQ(l.eviction_model().kind, EvictionCostModel::Kind::kLru);  // nothing changed
}

TEST(FreeListCost, SpendsTheCheapOldOneAndKeepsInvariants) {
  TestList l(4, true, "slot");
  l.set_eviction_model(cost_model());
  make_checkpoint(l, 0, 100, 64);  // oldest, long
  make_checkpoint(l, 1, 101, 1);
  make_checkpoint(l, 2, 102, 1);
  make_checkpoint(l, 3, 103, 1);
  l.check_invariants();
  EXPECT_EQ(l.pop(), 1);  // not the LRU head (0)
  EXPECT_EQ(l.lookup(100), 0);
  EXPECT_EQ(l.lookup(101), -1);
  l.check_invariants();
  // switching back to the reference setting spends the LRU head again
  l.set_eviction_model(EvictionCostModel{});
  EXPECT_EQ(l.pop(), 0);
  l.check_invariants();
}

TEST(FreeListCost, WithoutValueWeightSpendsLikeLru) {
  // Differential: random claims / releases / files / pops on two lists, one
  // under LRU, one under kCost with weight 0 and no guesses; same victims.
  std::mt19937_64 rng(7);
  TestList a(32, true, "slot"), b(32, true, "slot");
  b.set_eviction_model(cost_model(0.0));
  std::vector<int64_t> owned;
  int64_t next_hash = 1000;
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0 && a.num_free() > 0) {
      const int64_t u = a.pop();
      EXPECT_EQ(b.pop(), u) << "step " << step;
      owned.push_back(u);
    } else if (op == 1 && !owned.empty()) {
      const size_t k = rng() % owned.size();
      const int64_t u = owned[k];
      owned.erase(owned.begin() + static_cast<ptrdiff_t>(k));
      if (rng() % 2) {
        const int64_t pos = 1 + static_cast<int64_t>(rng() % 200);
        a.file(next_hash, u, pos);
        b.file(next_hash, u, pos);
        ++next_hash;
      }
      a.release(u);
      b.release(u);
    } else if (op == 2 && a.num_free() > 0) {
      const int64_t u = static_cast<int64_t>(rng() % 32);
      if (a.is_free(u)) {
        a.claim(u);
        b.claim(u);
        owned.push_back(u);
      }
    }
    if (step % 97 == 0) {
      a.check_invariants();
      b.check_invariants();
    }
  }
  b.check_invariants();
}

TEST(StoreCost, EvictsByValueAndSkipsPinned) {
  const PagedStateCheckpointSpec spec(100, 400, "L", 350);  // 4 units
  auto pool = std::make_shared<BlockPool>(16);
  PageUnitCheckpointStore store(pool, spec);
  store.set_eviction_model(cost_model());
  ASSERT_TRUE(store.begin_store(10, 0, 64).has_value());  // oldest, long
  ASSERT_TRUE(store.begin_store(11, 1, 1).has_value());
  ASSERT_TRUE(store.begin_store(12, 2, 1).has_value());
  ASSERT_TRUE(store.begin_store(13, 3, 1).has_value());
  store.complete_inflight();
  store.check_consistency();
  ASSERT_TRUE(store.begin_restore(11, 5).has_value());   // pins 11 and makes it the newest
  ASSERT_TRUE(store.begin_store(14, 4, 1).has_value());  // needs room: evicts one
  EXPECT_TRUE(store.contains(10));                       // worth the most
  EXPECT_TRUE(store.contains(11));                       // pinned
  EXPECT_FALSE(store.contains(12));                      // the oldest cheap one
  EXPECT_TRUE(store.contains(13));
  store.check_consistency();
  store.take_restore_ops();
  store.complete_inflight();
  store.check_consistency();
  // the reference setting: least recently used, whatever its value
  store.set_eviction_model(EvictionCostModel{});
  ASSERT_TRUE(store.begin_store(15, 6, 1).has_value());
  EXPECT_FALSE(store.contains(10));
  store.check_consistency();
}
