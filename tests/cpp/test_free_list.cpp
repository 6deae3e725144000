#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "core/errors.h"
#include "core/free_list.h"
#include "core/hash_index.h"

using namespace statecache;

namespace {

// The free list with its protected steps reachable, so a checkpoint can be
// filed without a pool around it.
struct TestList : StateFreeList {
  using StateFreeList::StateFreeList;
  void file(int64_t h, int64_t u) { file_checkpoint(h, u); }
};

// Owns `u`, files it under `h`, and hands it back: a free checkpoint.
void make_checkpoint(TestList& l, int64_t u, int64_t h) {
  l.claim(u);
  l.file(h, u);
  l.release(u);
}

}  // namespace

TEST(HashIndex, KeepsInsertionOrderLikeADict) {
  HashIndex m;
  for (int64_t k : std::vector<int64_t>{5, -3, 9, int64_t{1} << 40}) m.set(k, k * 2);
  m.set(-3, 7);  // assignment keeps the place
  m.erase(5);
  m.set(5, 1);  // re-insertion goes to the end
  std::vector<std::pair<int64_t, int64_t>> seen;
  m.for_each([&](int64_t k, int64_t v) { seen.emplace_back(k, v); });
  std::vector<std::pair<int64_t, int64_t>> want{{-3, 7}, {9, 18}, {1LL << 40, 1LL << 41}, {5, 1}};
  EXPECT_EQ(seen, want);
  EXPECT_EQ(m.size(), 4u);
  EXPECT_FALSE(m.contains(6));
  EXPECT_EQ(m.get(6, -1), -1);
}

TEST(HashIndex, ChurnMatchesAStdMap) {
  HashIndex m;
  std::map<int64_t, int64_t> model;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const int64_t k = static_cast<int64_t>(rng() % 300) - 150;
    if (rng() % 3 == 0) {
      EXPECT_EQ(m.erase(k), model.erase(k) == 1);
    } else {
      m.set(k, i);
      model[k] = i;
    }
    ASSERT_EQ(m.size(), model.size());
  }
  for (const auto& [k, v] : model) EXPECT_EQ(m.get(k, -999), v);
}

TEST(FreeList, VacantLowestFirstThenLruCheckpoints) {
  TestList l(5, true, "slot");
  make_checkpoint(l, 3, 30);
  make_checkpoint(l, 1, 10);
  EXPECT_EQ(l.num_free(), 5);
  EXPECT_EQ(l.lru_order(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(l.pop(), 0);
  EXPECT_EQ(l.pop(), 2);
  EXPECT_EQ(l.pop(), 4);
  EXPECT_EQ(l.fates().evicted, 0);
  EXPECT_EQ(l.pop(), 3);  // LRU head
  EXPECT_EQ(l.lookup(30), -1);
  EXPECT_EQ(l.pop(), 1);
  EXPECT_EQ(l.fates().evicted, 2);
  EXPECT_THROW(l.pop(), std::out_of_range);
  l.check_invariants();
}

TEST(FreeList, ClaimAndReleaseRefreshLruPosition) {
  TestList l(4, true, "slot");
  make_checkpoint(l, 0, 1);
  make_checkpoint(l, 1, 2);
  make_checkpoint(l, 2, 3);
  l.claim(0);
  EXPECT_EQ(l.lru_order(), (std::vector<int64_t>{1, 2}));
  l.release(0);
  EXPECT_EQ(l.lru_order(), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(l.lookup(1), 0);  // claim keeps the hash: reuse counts as use
  l.check_invariants();
}

TEST(FreeList, SpeculativeGoesToHeadAndPromoteMovesItBack) {
  TestList l(4, true, "slot");
  make_checkpoint(l, 0, 1);
  l.claim(1);
  l.mark_speculative(1);
  l.file(2, 1);
  l.release(1);
  EXPECT_EQ(l.lru_order(), (std::vector<int64_t>{1, 0}));
  l.promote(1);
  EXPECT_EQ(l.lru_order(), (std::vector<int64_t>{0, 1}));
  EXPECT_FALSE(l.is_speculative(1));
  l.check_invariants();
}

TEST(FreeList, PinsDeferOnePassAndDropReader) {
  TestList l(3, true, "slot");
  const int64_t a = l.pop(), b = l.pop();
  l.pin(a, /*reader_is_next_batch=*/true);
  l.pin(b);
  l.pin(b);
  EXPECT_EQ(l.pin_count(b), 2);
  l.release_pins();
  EXPECT_TRUE(l.is_pinned(a));
  EXPECT_FALSE(l.is_pinned(b));
  EXPECT_TRUE(l.is_free(b));
  l.pin(a);
  l.drop_reader(a);
  EXPECT_EQ(l.pin_count(a), 1);
  l.drop_reader(a);
  EXPECT_TRUE(l.is_free(a));
  l.drop_reader(-1);
  l.unpin(77);  // anything unpinned: nothing
  l.check_invariants();
}

TEST(FreeList, RetireTopRehomesKeepingLruPosition) {
  TestList l(4, true, "slot");
  make_checkpoint(l, 3, 33);
  make_checkpoint(l, 1, 11);
  l.claim(0);
  auto r = l.retire_top();
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, (Retirement{3, 2, true}));
  EXPECT_EQ(l.lookup(33), 2);
  EXPECT_EQ(l.lru_order(), (std::vector<int64_t>{2, 1}));  // same position, new address
  EXPECT_EQ(l.size(), 3);
  EXPECT_EQ(l.capacity(), 4);
  l.check_invariants();
}

TEST(FreeList, RetiredOwnedTopDropsItsIndexEntry) {
  // A claimed checkpoint on the top is owned and still carries its hash; the
  // owner moves to the relocation target. The entry must go with the index,
  // or extend would revive it on a vacant (later someone else's) index.
  TestList l(3, true, "slot");
  make_checkpoint(l, 2, 22);
  l.claim(2);
  auto r = l.retire_top();
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, (Retirement{2, 0, false}));
  EXPECT_EQ(l.lookup(22), -1);
  l.check_invariants();
  l.extend(1);
  EXPECT_EQ(l.lookup(22), -1);
  EXPECT_FALSE(l.holds_checkpoint(2));
  EXPECT_TRUE(l.index_is_exact());
  l.check_invariants();
}

TEST(FreeList, HugeCountsDoNotOverflow) {
  TestList l(3, true, "slot");
  EXPECT_THROW(l.extend(INT64_MAX), std::invalid_argument);
  EXPECT_THROW(l.extend(int64_t{1} << 62), std::invalid_argument);
  EXPECT_FALSE(l.has_free(int64_t{1} << 62));
  EXPECT_EQ(l.size(), 3);
  l.check_invariants();
}

TEST(FreeList, RetireTopRefusesPinnedAndStrandedTop) {
  TestList l(2, true, "slot");
  l.pop();
  const int64_t top = l.pop();
  EXPECT_FALSE(l.retire_top());  // live, nowhere to go
  l.pin(top);
  EXPECT_FALSE(l.retire_top());
  TestList empty(0, true, "slot");
  EXPECT_FALSE(empty.enabled());
  EXPECT_FALSE(empty.retire_top());
}

TEST(FreeList, BadArgumentsThrowBeforeChanging) {
  TestList l(3, true, "slot");
  const int64_t a = l.pop();
  l.pin(a);
  const auto before = l.occupancy().used;
  EXPECT_THROW(l.release(5), std::out_of_range);
  EXPECT_THROW(l.release(2), std::invalid_argument);  // already free
  EXPECT_THROW(l.release(a), std::invalid_argument);  // pinned
  EXPECT_THROW(l.claim(a), std::invalid_argument);    // not free
  EXPECT_THROW(l.pin(2), std::invalid_argument);      // free
  EXPECT_THROW(l.has_free(-1), std::invalid_argument);
  EXPECT_THROW(l.extend(-1), std::invalid_argument);
  EXPECT_THROW(l.invalidate(3), std::out_of_range);
  EXPECT_THROW(TestList(-1, true, "slot"), std::invalid_argument);
  try {
    l.release(7);
  } catch (const std::out_of_range& e) {
    EXPECT_NE(std::string(e.what()).find("slot=7"), std::string::npos);
  }
  EXPECT_EQ(l.occupancy().used, before);
  EXPECT_EQ(l.pin_count(a), 1);
  l.check_invariants();
}

TEST(FreeList, DisabledKeepsNoHashes) {
  TestList l(2, false, "group");
  l.claim(0);
  l.file(5, 0);
  l.release(0);
  EXPECT_EQ(l.lookup(5), -1);
  EXPECT_EQ(l.unindex(5), -1);
  l.mark_speculative(1);
  EXPECT_FALSE(l.is_speculative(1));
  l.invalidate(1);
  l.check_invariants();
}

// Seeded random operations; the structural invariants hold after every step,
// a pinned index is never free, and pins clear within two passes.
TEST(FreeList, RandomOperationsKeepInvariants) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    TestList l(8, true, "slot");
    std::set<int64_t> owned;
    auto pick = [&](const auto& xs) {
      auto it = xs.begin();
      std::advance(it, static_cast<long>(rng() % xs.size()));
      return *it;
    };
    for (int step = 0; step < 600; ++step) {
      switch (rng() % 11) {
        case 0:
        case 1:
          if (l.has_free()) owned.insert(l.pop());
          break;
        case 2:
          if (!owned.empty()) {
            const int64_t u = pick(owned);
            owned.erase(u);
            l.release(u);
          }
          break;
        case 3:
          if (!owned.empty()) {
            const int64_t u = pick(owned);
            l.file(static_cast<int64_t>(rng() % 12), u);
            if (rng() % 3 == 0) l.mark_speculative(u);
          }
          break;
        case 4: {
          const int64_t u = static_cast<int64_t>(rng() % static_cast<uint64_t>(std::max<int64_t>(l.size(), 1)));
          if (l.is_free(u)) {
            l.claim(u);
            owned.insert(u);
          }
          break;
        }
        case 5:
          if (!owned.empty()) {
            const int64_t u = pick(owned);
            owned.erase(u);
            l.pin(u, rng() % 2 == 0);
          }
          break;
        case 6:
          l.release_pins();
          for (int64_t u : l.pinned_indices()) EXPECT_FALSE(l.is_free(u));
          break;
        case 7:
          l.unindex(static_cast<int64_t>(rng() % 12));
          break;
        case 8:
          if (rng() % 2) {
            l.extend(static_cast<int64_t>(rng() % 3));
          } else {
            const int64_t top = l.size() - 1;
            const bool top_owned = owned.count(top) > 0;
            auto r = l.retire_top();
            if (r && top_owned) {
              owned.erase(top);
              if (r->relocated_to >= 0) owned.insert(r->relocated_to);
            }
          }
          break;
        case 9:
          l.promote(static_cast<int64_t>(rng() % 10));
          break;
        case 10:
          if (!l.pinned_indices().empty()) l.drop_reader(pick(l.pinned_indices()));
          break;
      }
      l.check_invariants();
      const Occupancy o = l.occupancy();
      ASSERT_EQ(o.held + o.vacant, l.num_free());
      for (int64_t u : owned) ASSERT_FALSE(l.is_free(u));
    }
    // Two passes clear every pin.
    l.release_pins();
    l.release_pins();
    EXPECT_TRUE(l.pinned_indices().empty());
  }
}
