// Batched per-pass calls (core/batch.h) against the per-sequence calls they
// stand for, and refused batches that must leave everything unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "batch_rows.h"
#include "core/batch.h"
#include "core/group_pool.h"
#include "core/slot_pool.h"

using namespace statecache;
using statecache::test_support::VecRows;

namespace {

// Everything observable of a free-list pool, for before/after comparisons.
struct PoolState {
  std::vector<int64_t> lru, pinned, deferred, speculative, hashes;
  std::vector<std::pair<int64_t, int64_t>> index;
  int64_t kept, dropped, evicted, orphaned, free;
  bool operator==(const PoolState&) const = default;
};

PoolState state_of(const StateFreeList& p) {
  PoolState s{p.lru_order(),  p.pinned_indices(), p.deferred_indices(), p.speculative_indices(), {},          {},
              p.fates().kept, p.fates().dropped,  p.fates().evicted,    p.fates().orphaned,      p.num_free()};
  for (int64_t u = 0; u < p.capacity(); ++u) s.hashes.push_back(p.hash_of(u));
  p.index().for_each([&](int64_t h, int64_t u) { s.index.emplace_back(h, u); });
  return s;
}

struct SeqFields {
  std::vector<int64_t> slots;
  int64_t fork_src, group, pending;
  bool operator==(const SeqFields&) const = default;
};
SeqFields fields_of(const Sequence& s) {
  return {s.state_slots, s.state_fork_src, s.per_req_cache_group, s.pending_checkpoint};
}

std::vector<Sequence*> ptrs_of(std::vector<Sequence>& seqs) {
  std::vector<Sequence*> out;
  for (Sequence& s : seqs) out.push_back(&s);
  return out;
}

// Two identical pools, each with `n` sequences owning one index and hash
// lists drawn from a small set of prefixes (so checkpoints are shared).
template <class Pool>
struct Twins {
  Pool a, b;
  std::vector<Sequence> sa, sb;
  std::vector<std::vector<int64_t>> hashes;
  Twins(Pool pa, Pool pb, int n, bool slots) : a(std::move(pa)), b(std::move(pb)) {
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> hs;
      for (int k = 0; k < 40; ++k) hs.push_back((i % 5) * 1000 + k);
      hashes.push_back(hs);
      for (auto [pool, seqs] : {std::pair{&a, &sa}, std::pair{&b, &sb}}) {
        Sequence s;
        s.num_tokens = 200;
        s.num_prompt_tokens = 200;
        s.block_hashes = hs;
        if (slots)
          s.state_slots = {pool->pop()};
        else
          s.per_req_cache_group = pool->pop();
        seqs->push_back(s);
      }
    }
  }
};

template <class Pool>
void run_random_passes(Twins<Pool>& t, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = t.sa.size();
  for (int pass = 0; pass < 30; ++pass) {
    t.a.release_pins();
    t.b.release_pins();
    std::vector<int64_t> hits;
    for (size_t i = 0; i < n; ++i) hits.push_back(static_cast<int64_t>(rng() % 41));
    std::vector<int64_t> one_by_one;
    for (size_t i = 0; i < n; ++i) one_by_one.push_back(t.a.resumable_hit(t.sa[i], hits[i], t.hashes[i]));
    VecRows rows{t.hashes};
    auto pb = ptrs_of(t.sb);
    EXPECT_EQ(batch::resumable_hits(t.b, pb, hits, rows, false), one_by_one);

    std::vector<Sequence*> chosen;
    std::vector<int64_t> blocks, hs;
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 2) continue;
      const int64_t k = 1 + static_cast<int64_t>(rng() % 40);
      t.a.checkpoint(t.sa[i], k, t.hashes[i][static_cast<size_t>(k - 1)]);
      chosen.push_back(&t.sb[i]);
      blocks.push_back(k);
      hs.push_back(t.hashes[i][static_cast<size_t>(k - 1)]);
    }
    const auto keys = batch::identities<Sequence*>(chosen);
    t.b.checkpoint_many(chosen, keys, blocks, hs);
    ASSERT_EQ(state_of(t.a), state_of(t.b)) << "pass " << pass;
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(fields_of(t.sa[i]), fields_of(t.sb[i]));
    t.a.check_invariants();
    t.b.check_invariants();
  }
}

}  // namespace

TEST(Batch, SlotPoolMatchesPerSequenceCalls) {
  for (uint32_t seed = 0; seed < 4; ++seed) {
    Twins<StateSlotPool> t(StateSlotPool(64, StateTransfer(TransferKind::kFork, 4), 4),
                           StateSlotPool(64, StateTransfer(TransferKind::kFork, 4), 4), 20, true);
    run_random_passes(t, seed);
  }
}

TEST(Batch, GroupPoolForkMatchesPerSequenceCalls) {
  for (uint32_t seed = 0; seed < 4; ++seed) {
    Twins<StateGroupPool> t(StateGroupPool(64, StateTransfer(TransferKind::kFork, 4), 4),
                            StateGroupPool(64, StateTransfer(TransferKind::kFork, 4), 4), 20, false);
    run_random_passes(t, seed);
  }
}

TEST(Batch, GroupPoolCopyReportsWhoJoinedThePendingList) {
  StateGroupPool a(16, StateTransfer(TransferKind::kCopy)), b(16, StateTransfer(TransferKind::kCopy));
  std::vector<Sequence> sa(3), sb(3);
  for (size_t i = 0; i < 3; ++i) {
    sa[i].per_req_cache_group = a.pop();
    sb[i].per_req_cache_group = b.pop();
  }
  sa[1].pending_checkpoint = sb[1].pending_checkpoint = 99;  // already pending, and its intent is dead
  std::vector<size_t> joined_one_by_one;
  const std::vector<int64_t> blocks{1, 2, 3}, hs{11, 12, 13};
  for (size_t i = 0; i < 3; ++i)
    if (a.checkpoint(sa[i], blocks[i], hs[i])) joined_one_by_one.push_back(i);
  auto pb = ptrs_of(sb);
  EXPECT_EQ(b.checkpoint_many(pb, batch::identities<Sequence*>(pb), blocks, hs), joined_one_by_one);
  EXPECT_EQ(a.pending_count(), b.pending_count());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(fields_of(sa[i]), fields_of(sb[i]));
}

TEST(Batch, RefusedCheckpointBatchChangesNothing) {
  StateSlotPool p(16, StateTransfer(TransferKind::kFork, 4), 4);
  std::vector<Sequence> seqs(3);
  for (Sequence& s : seqs) {
    s.num_tokens = 100;
    s.state_slots = {p.pop()};
  }
  p.checkpoint(seqs[0], 2, 500);  // something on the books
  const PoolState before = state_of(p);
  std::vector<SeqFields> fields;
  for (const Sequence& s : seqs) fields.push_back(fields_of(s));
  auto ptrs = ptrs_of(seqs);
  auto keys = batch::identities<Sequence*>(ptrs);
  const std::vector<int64_t> blocks{1, 2, 3};

  // -1 as a hash, named with its index.
  try {
    p.checkpoint_many(ptrs, keys, blocks, std::vector<int64_t>{7, 8, -1});
    FAIL() << "a -1 hash was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hashes[2]"), std::string::npos) << e.what();
  }
  // Lengths that differ.
  EXPECT_THROW(p.checkpoint_many(ptrs, keys, std::vector<int64_t>{1, 2}, std::vector<int64_t>{7, 8, 9}),
               std::invalid_argument);
  // One sequence twice.
  std::vector<Sequence*> twice{ptrs[0], ptrs[1], ptrs[0]};
  try {
    p.checkpoint_many(twice, batch::identities<Sequence*>(twice), blocks, std::vector<int64_t>{7, 8, 9});
    FAIL() << "a sequence named twice was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("seqs[2] is seqs[0]"), std::string::npos) << e.what();
  }
  // The last entry's slot is free: entries 0 and 1 would have forked.
  seqs[2].state_slots = {p.peek_pop()};
  try {
    p.checkpoint_many(ptrs, keys, blocks, std::vector<int64_t>{7, 8, 9});
    FAIL() << "a free slot was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("seqs[2]: seq.state_slot"), std::string::npos) << e.what();
  }
  // Out of range: IndexError's exception, still before anything changed.
  seqs[2].state_slots = {1000};
  EXPECT_THROW(p.checkpoint_many(ptrs, keys, blocks, std::vector<int64_t>{7, 8, 9}), std::out_of_range);

  EXPECT_EQ(state_of(p), before);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(fields_of(seqs[i]), fields[i]);
  p.check_invariants();
}

TEST(Batch, ResumableHitsRefusesBadHitsBeforeScanning) {
  StateSlotPool p(8, StateTransfer(TransferKind::kFork, 4), 4);
  std::vector<Sequence> seqs(2);
  for (Sequence& s : seqs) s.num_tokens = 100;
  auto ptrs = ptrs_of(seqs);
  std::vector<std::vector<int64_t>> hashes{{1, 2, 3}, {4, 5}};
  VecRows rows{hashes};
  EXPECT_THROW(batch::resumable_hits(p, ptrs, std::vector<int64_t>{1}, rows, false), std::invalid_argument);
  EXPECT_THROW(batch::resumable_hits(p, ptrs, std::vector<int64_t>{1, -1}, rows, false), std::invalid_argument);
  try {
    batch::resumable_hits(p, ptrs, std::vector<int64_t>{3, 3}, rows, false);
    FAIL() << "a hit past its hash list was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("hits[1]"), std::string::npos) << e.what();
  }
  // Where the per-sequence call reads no hashes, neither does the batch.
  seqs[1].has_per_req_cache = false;
  EXPECT_EQ(batch::resumable_hits(p, ptrs, std::vector<int64_t>{3, 7}, rows, false), (std::vector<int64_t>{0, 7}));
}

TEST(Batch, GroupReleaseManyChecksEveryEntryFirst) {
  StateGroupPool p(8, StateTransfer(TransferKind::kFork, 4));
  const int64_t g0 = p.pop(), g1 = p.pop();
  const PoolState before = state_of(p);
  EXPECT_THROW(p.release_many(std::vector<int64_t>{g0, g1, g0}), std::invalid_argument);  // twice
  EXPECT_THROW(p.release_many(std::vector<int64_t>{g0, 5}), std::invalid_argument);       // 5 is free
  EXPECT_THROW(p.release_many(std::vector<int64_t>{g0, 9}), std::out_of_range);
  EXPECT_EQ(state_of(p), before);
  p.release_many(std::vector<int64_t>{-1, g1, g0});
  EXPECT_EQ(p.num_free(), 8);
  p.check_invariants();
}

TEST(Batch, CheckDistinctNamesTheFirstRepeat) {
  const std::vector<uintptr_t> keys{5, 7, 9, 7, 5};
  try {
    batch::check_distinct("seqs", keys);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("seqs[3] is seqs[1]"), std::string::npos) << e.what();
  }
  batch::check_distinct("seqs", std::vector<uintptr_t>{1, 2, 3});
}
