#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/block_hash.h"
#include "core/host_arena.h"

using namespace statecache;

namespace {
// "k<i>", appended: GCC 12 warns falsely (-Wrestrict) on "k" + std::string&&.
std::string key_k(unsigned long long i) {
  std::string key = "k";
  key += std::to_string(i);
  return key;
}
}  // namespace

TEST(PrefixKeys, SipHash128MatchesThePublishedVector) {
  // SipHash-2-4-128, key 00..0f, empty message and the 15-byte 00..0e message.
  DeploymentKey k{0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL};
  PrefixKey h = siphash128(k, {});
  const uint8_t want0[16] = {0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6,
                             0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55, 0x02, 0x93};
  uint8_t got[16];
  std::memcpy(got, &h.lo, 8);
  std::memcpy(got + 8, &h.hi, 8);
  EXPECT_EQ(0, std::memcmp(got, want0, 16));
}

TEST(PrefixKeys, ChainSeedAndSalt) {
  std::vector<int64_t> t(40);
  for (int i = 0; i < 40; ++i) t[i] = i;
  auto dk = deployment_key(0, "");
  auto keys = chain_block_keys(dk, t, 16);
  ASSERT_EQ(keys.size(), 2u);
  auto tail = chain_block_keys(dk, std::span<const int64_t>(t).subspan(16), 16, &keys[0]);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0], keys[1]);
  EXPECT_NE(chain_block_keys(deployment_key(1, ""), t, 16)[0], keys[0]);
  EXPECT_NE(chain_block_keys(deployment_key(0, "salt"), t, 16)[0], keys[0]);
  EXPECT_NE(scheduler_hash(keys[0]), -1);
  EXPECT_THROW(chain_block_keys(dk, t, 0), std::invalid_argument);
}

TEST(PrefixKeys, KeysOfShortAndLongBlocksAreStable) {
  // Keys name values in shared tiers that outlive a release: the message
  // layout (short blocks built on the stack, long ones on the heap) must not
  // change them. Values from the build before the stack path.
  const auto dk = deployment_key(0, "");
  std::vector<int64_t> t(40);
  for (int i = 0; i < 40; ++i) t[i] = i + 1;
  const PrefixKey root = key_token_block(dk, nullptr, std::span<const int64_t>(t).first(8));
  EXPECT_EQ(root.lo, 0x148bbafae9157f5eULL);
  EXPECT_EQ(root.hi, 0xb2ab0e4ea340aefcULL);
  const PrefixKey chained = key_token_block(dk, &root, t);  // 40 tokens: past the stack buffer
  EXPECT_EQ(chained.lo, 0x50c25789b17b94efULL);
  EXPECT_EQ(chained.hi, 0x428ee39ed59b8ef9ULL);
}

static EvictionCostModel lru_model() {
  EvictionCostModel m;
  m.kind = EvictionCostModel::Kind::kLru;
  return m;
}

TEST(HostArena, BudgetsPerClassAndEviction) {
  HostArena a(100, 1000, {600, 400}, lru_model());
  EXPECT_EQ(a.num_entries(), 10);
  std::vector<std::string> ev;
  ASSERT_TRUE(a.allocate("a", 0, 3, 300, 1, &ev));
  a.seal("a", "m");
  ASSERT_TRUE(a.allocate("b", 0, 3, 300, 1, &ev));
  a.seal("b", "m");
  ASSERT_TRUE(a.allocate("k", 1, 4, 400, 1, &ev));  // KV class: its own budget
  a.seal("k", "m");
  EXPECT_TRUE(ev.empty());
  ASSERT_NE(a.lookup("a"), nullptr);  // a is now more recent than b
  ASSERT_TRUE(a.allocate("c", 0, 2, 200, 1, &ev));
  EXPECT_EQ(ev, std::vector<std::string>{"b"});
  EXPECT_TRUE(a.contains("a"));
  EXPECT_FALSE(a.contains("c"));                     // not sealed yet
  EXPECT_FALSE(a.allocate("d", 0, 7, 700, 1, &ev));  // over the class budget
  a.check_consistency();
}

TEST(HostArena, CostModelKeepsValuablePrefixes) {
  EvictionCostModel m = HostArena::cost_model();  // kCost, value = position
  m.weight = 2;                                   // value outweighs recency
  HostArena a(10, 100, {100}, m);
  std::vector<std::string> ev;
  a.allocate("dear", 0, 5, 50, 100, &ev);  // older, but a deep prefix
  a.seal("dear", "");
  a.allocate("cheap", 0, 5, 50, 1, &ev);
  a.seal("cheap", "");
  a.allocate("new", 0, 5, 50, 10, &ev);
  EXPECT_EQ(ev, std::vector<std::string>{"cheap"});
  a.set_eviction_model(lru_model());  // recency alone now
  EXPECT_EQ(*a.victims(0, 5), std::vector<std::string>{"dear"});
  EvictionCostModel bad;
  bad.weight = -1;
  EXPECT_THROW(a.set_eviction_model(bad), std::invalid_argument);
  a.check_consistency();
}

TEST(HostArena, PinnedValuesStayAndRemovedPinnedGoBackAtUnpin) {
  HostArena a(10, 30, {30}, lru_model());
  std::vector<std::string> ev;
  a.allocate("x", 0, 3, 30, 1, &ev);
  a.seal("x", "");
  a.pin("x");
  EXPECT_FALSE(a.allocate("y", 0, 1, 10, 1, &ev));
  EXPECT_TRUE(a.remove("x"));
  EXPECT_FALSE(a.contains("x"));
  EXPECT_EQ(a.num_free(), 0);
  a.unpin("x");
  EXPECT_EQ(a.num_free(), 3);
  EXPECT_THROW(a.unpin("x"), std::invalid_argument);
  a.check_consistency();
}

TEST(HostArena, RandomOperationsConserveEntries) {
  HostArena a(8, 8 * 64, {8 * 40, 8 * 24});
  std::mt19937 rng(7);
  std::vector<std::string> live;
  for (int i = 0; i < 3000; ++i) {
    const int op = static_cast<int>(rng() % 5);
    const std::string key = key_k(rng() % 50);
    if (op <= 1 && !a.contains(key) && a.pins(key) == 0) {
      std::vector<std::string> ev;
      a.remove(key);
      const int64_t n = 1 + static_cast<int64_t>(rng() % 6);
      if (a.allocate(key, static_cast<int>(rng() % 2), n, n * 8, rng() % 100, &ev)) a.seal(key, "m");
    } else if (op == 2) {
      a.remove(key);
    } else if (op == 3 && a.contains(key)) {
      a.pin(key);
      live.push_back(key);
    } else if (!live.empty()) {
      a.unpin(live.back());
      live.pop_back();
    }
    a.check_consistency();
  }
}

TEST(HostArena, SharedBudgetRanksEveryClassTogether) {
  // No caps: a state image and KV blocks compete for the one budget.
  HostArena a(100, 600, {HostArena::kShared, HostArena::kShared}, lru_model());
  EXPECT_EQ(a.class_stats(1).budget_entries, 6);
  std::vector<std::string> ev;
  ASSERT_TRUE(a.allocate("kv0", 1, 1, 100, 1, &ev));
  a.seal("kv0", "");
  ASSERT_TRUE(a.allocate("img", 0, 4, 400, 1, &ev));
  a.seal("img", "");
  ASSERT_TRUE(a.allocate("kv1", 1, 1, 100, 2, &ev));
  a.seal("kv1", "");
  EXPECT_TRUE(ev.empty());
  // KV needs room: the oldest value of any class goes, here kv0 then img.
  EXPECT_EQ(*a.victims(1, 1), std::vector<std::string>{"kv0"});
  EXPECT_EQ(*a.victims(1, 2), (std::vector<std::string>{"kv0", "img"}));
  ASSERT_TRUE(a.allocate("kv2", 1, 2, 200, 3, &ev));
  EXPECT_EQ(ev, (std::vector<std::string>{"kv0", "img"}));
  a.check_consistency();
}

TEST(HostArena, CapsBoundAClassUncappedClassesShareTheRest) {
  HostArena a(100, 600, {HostArena::kShared, 200}, lru_model());
  EXPECT_TRUE(a.capped(1));
  EXPECT_FALSE(a.capped(0));
  std::vector<std::string> ev;
  ASSERT_TRUE(a.allocate("k0", 1, 1, 100, 1, &ev));
  a.seal("k0", "");
  ASSERT_TRUE(a.allocate("s0", 0, 3, 300, 1, &ev));
  a.seal("s0", "");
  ASSERT_TRUE(a.allocate("k1", 1, 1, 100, 1, &ev));
  a.seal("k1", "");
  // KV at its cap: room comes from KV alone, though s0 is older than k1.
  EXPECT_EQ(*a.victims(1, 1), std::vector<std::string>{"k0"});
  // The uncapped class may take the KV's room when the arena is full.
  ASSERT_TRUE(a.allocate("s1", 0, 3, 300, 1, &ev));
  EXPECT_EQ(ev, (std::vector<std::string>{"k0", "s0"}));
  a.check_consistency();
  EXPECT_THROW(HostArena(100, 600, {400, 400}), std::invalid_argument);  // caps must fit together
}

TEST(HostArena, RefileMovesAValueAndCountsAsAUse) {
  EvictionCostModel m = HostArena::cost_model();
  m.weight = 4;  // value dominates recency
  HostArena a(10, 30, {HostArena::kShared}, m);
  std::vector<std::string> ev;
  for (const char* k : {"a", "b", "c"}) {
    a.allocate(k, 0, 1, 10, 1, &ev);
    a.seal(k, "");
  }
  EXPECT_EQ(*a.victims(0, 1), std::vector<std::string>{"a"});
  EXPECT_TRUE(a.refile("a", 64));  // a now leads to a deep prefix
  EXPECT_EQ(*a.victims(0, 1), std::vector<std::string>{"b"});
  EXPECT_FALSE(a.refile("zz", 3));
  EXPECT_THROW(a.refile("a", -1), std::invalid_argument);
  a.pin("b");
  EXPECT_TRUE(a.refile("b", 64));  // pinned: filed there at unpin
  a.unpin("b");
  EXPECT_EQ(*a.victims(0, 1), std::vector<std::string>{"c"});
  a.check_consistency();
}

TEST(HostArena, ValuePerByteOfTheWholePrefix) {
  // checkpoint_bytes = 10 (a state), 10 KV bytes per position, value linear
  // in tokens: per byte, a prefix at 100 is worth 100/1010 and one at 1
  // 1/20; with kv bytes ignored, 100/10 and 1/10.
  EvictionCostModel m = HostArena::cost_model();
  m.checkpoint_bytes = 10;
  EXPECT_DOUBLE_EQ(m.value(100), 10.0);
  m.kv_bytes_per_position = 10;
  EXPECT_DOUBLE_EQ(m.value(100), 100.0 / 1010.0);
  EXPECT_DOUBLE_EQ(m.value(1), 1.0 / 20.0);
  HostArena a(10, 100, {HostArena::kShared}, HostArena::cost_model());
  a.set_kv_bytes_per_position(10);
  EXPECT_EQ(a.kv_bytes_per_position(), 10);
  a.set_eviction_model(HostArena::cost_model());  // kept across a new model
  EXPECT_EQ(a.kv_bytes_per_position(), 10);
  EXPECT_THROW(a.set_kv_bytes_per_position(-1), std::invalid_argument);
  m.kv_bytes_per_position = -1;
  EXPECT_THROW(m.validate(), std::invalid_argument);
}

TEST(HostArena, AnUncappedClassTakesRoomFromWhateverRanksLowest) {
  HostArena a(1, 5, {HostArena::kShared, HostArena::kShared}, lru_model());
  std::vector<std::string> ev;
  for (const char* k : {"s", "k1", "k2", "k3", "k4"}) {
    a.allocate(k, k[0] == 's' ? 0 : 1, 1, 1, 0, &ev);
    a.seal(k, "");
  }
  // KV holds 4 of 5 entries; room for 5 more takes the oldest first, the
  // state included, not every KV block before it.
  EXPECT_EQ(*a.victims(1, 5), (std::vector<std::string>{"s", "k1", "k2", "k3", "k4"}));
  EXPECT_EQ(*a.victims(1, 1), std::vector<std::string>{"s"});
}

TEST(HostArena, BatchedContainsAndRefileAgreeWithOneByOne) {
  EvictionCostModel m = HostArena::cost_model();
  m.weight = 4;
  HostArena a(10, 50, {HostArena::kShared}, m), b(10, 50, {HostArena::kShared}, m);
  std::vector<std::string> ev;
  for (HostArena* x : {&a, &b})
    for (const char* k : {"a", "b", "c", "d"}) {
      x->allocate(k, 0, 1, 10, 1, &ev);
      x->seal(k, "");
    }
  for (HostArena* x : {&a, &b}) x->allocate("open", 0, 1, 10, 1, &ev);  // allocated, not sealed: not findable
  const std::vector<std::string> ks = {"a", "zz", "c", "open"};
  EXPECT_EQ(a.contains_many(ks), (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(a.refile_many({"a", "zz", "c"}, {64, 5, 32}), 2);
  b.refile("a", 64);
  b.refile("c", 32);
  EXPECT_EQ(*a.victims(0, 3), *b.victims(0, 3));
  EXPECT_EQ(a.contains_many({"b", "zz"}, true), (std::vector<bool>{true, false}));  // b: a use
  b.lookup("b", true);
  EXPECT_EQ(*a.victims(0, 4), *b.victims(0, 4));
  const auto before = *a.victims(0, 4);
  EXPECT_THROW(a.refile_many({"b", "d"}, {64, -1}), std::invalid_argument);  // checked first
  EXPECT_THROW(a.refile_many({"b"}, {}), std::invalid_argument);
  EXPECT_EQ(*a.victims(0, 4), before);
  a.check_consistency();
}

TEST(HostArena, BatchedAllocateAndSealAgreeWithOneByOne) {
  EvictionCostModel m = HostArena::cost_model();
  m.weight = 4;
  HostArena a(10, 50, {HostArena::kShared}, m), b(10, 50, {HostArena::kShared}, m);
  std::vector<std::string> ev_a, ev_b;
  for (HostArena* x : {&a, &b})
    for (const char* k : {"a", "b", "c"}) {
      x->allocate(k, 0, 1, 10, 1, x == &a ? &ev_a : &ev_b);
      x->seal(k, "");
    }
  // "b" is filed already and "big" cannot fit: nullopt, the others go on, evicting as one by one would
  auto got =
      a.allocate_many({"d", "b", "big", "e", "f"}, 0, {1, 1, 9, 2, 1}, {10, 10, 90, 20, 10}, {5, 5, 5, 7, 2}, &ev_a);
  ASSERT_EQ(got.size(), 5u);
  ASSERT_TRUE(got[0] && !got[1] && !got[2] && got[3] && got[4]);
  EXPECT_EQ(*got[0], *b.allocate("d", 0, 1, 10, 5, &ev_b));
  EXPECT_FALSE(b.allocate("big", 0, 9, 90, 5, &ev_b));
  EXPECT_EQ(*got[3], *b.allocate("e", 0, 2, 20, 7, &ev_b));
  EXPECT_EQ(*got[4], *b.allocate("f", 0, 1, 10, 2, &ev_b));
  EXPECT_EQ(ev_a, ev_b);
  a.seal_many({"d", "e"}, {"md", "me"});
  b.seal("d", "md");
  b.seal("e", "me");
  EXPECT_EQ(a.lookup("e", false)->meta, "me");
  ASSERT_TRUE(a.victims(0, 4) && b.victims(0, 4));  // "f" is allocated, not sealed: never a victim
  EXPECT_EQ(*a.victims(0, 4), *b.victims(0, 4));
  const uint64_t gen = a.generation();
  // checked first: a bad count, a sealed key, a key twice or one never allocated change nothing
  EXPECT_THROW(a.allocate_many({"g", "h"}, 0, {1, 0}, {10, 10}, {1, 1}, &ev_a), std::invalid_argument);
  EXPECT_THROW(a.allocate_many({"g"}, 0, {1}, {10}, {}, &ev_a), std::invalid_argument);
  EXPECT_THROW(a.seal_many({"f", "d"}, {"", ""}), std::invalid_argument);
  EXPECT_THROW(a.seal_many({"f", "f"}, {"", ""}), std::invalid_argument);
  EXPECT_THROW(a.seal_many({"f", "zz"}, {"", ""}), std::invalid_argument);
  EXPECT_THROW(a.seal_many({"f"}, {}), std::invalid_argument);
  EXPECT_FALSE(a.contains("g") || a.contains("f"));
  EXPECT_EQ(a.generation(), gen);
  a.seal_many({"f"}, {""});
  EXPECT_TRUE(a.contains("f"));
  a.check_consistency();
}

// What an answer derived from contains() may rely on: while generation() is
// unchanged, contains() answers as it did for every key.
TEST(HostArena, UnchangedGenerationMeansUnchangedContains) {
  HostArena a(8, 8 * 16, {HostArena::kShared});
  std::mt19937 rng(11);
  std::vector<std::string> keys, pinned;
  for (int i = 0; i < 30; ++i) keys.push_back(key_k(i));
  uint64_t gen = a.generation();
  std::vector<bool> seen = a.contains_many(keys);
  int unchanged = 0;
  for (int i = 0; i < 5000; ++i) {
    const std::string& key = keys[rng() % keys.size()];
    std::vector<std::string> ev;
    switch (rng() % 7) {
      case 0:
      case 1:
        if (a.pins(key) == 0 && !a.contains(key)) {
          a.remove(key);
          const int64_t n = 1 + static_cast<int64_t>(rng() % 4);
          if (a.allocate(key, 0, n, n * 8, rng() % 50, &ev) && rng() % 4 != 0) a.seal(key, "");
        }
        break;
      case 2:
        a.remove(key);
        break;
      case 3:
        if (a.contains(key)) {
          a.pin(key);
          pinned.push_back(key);
        }
        break;
      case 4:
        if (!pinned.empty()) {
          a.unpin(pinned.back());
          pinned.pop_back();
        }
        break;
      case 5:
        a.refile(key, rng() % 50);
        break;
      default:
        a.lookup(key, true);
    }
    if (a.generation() == gen) {
      ++unchanged;
      EXPECT_EQ(a.contains_many(keys), seen) << "step " << i;
    } else {
      gen = a.generation();
      seen = a.contains_many(keys);
    }
  }
  EXPECT_GT(unchanged, 1000);  // the check ran often
  a.check_consistency();
}
