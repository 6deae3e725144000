// Core tests for BlockPool, PageUnitCheckpointStore, the coordinator and the
// offload index, without Python.
#include <gtest/gtest.h>

#include <random>
#include <unordered_map>

#include "core/block_pool.h"
#include "core/checkpoint_coordinator.h"
#include "core/checkpoint_store.h"
#include "core/errors.h"
#include "core/flat_map.h"
#include "core/offload_index.h"

using namespace statecache;

namespace {

const PagedStateCheckpointSpec kSpec(100, 400, "L", 350);  // 4 units

std::shared_ptr<BlockPool> make_pool(int64_t n) { return std::make_shared<BlockPool>(n); }

void expect_conserved(const BlockPool& pool) {
  pool.check_consistency();
  EXPECT_EQ(pool.num_free() + pool.num_reserved() + pool.num_kv_blocks(), pool.num_blocks());
}

int64_t make_ready(PageUnitCheckpointStore& store, int64_t h) {
  EXPECT_TRUE(store.begin_store(h, 0).has_value());
  store.complete_inflight();
  return store.lookup(h);
}

class VectorScratch : public ScratchSlotSource {
 public:
  explicit VectorScratch(int64_t n) {
    for (int64_t i = n - 1; i >= 0; --i) free.push_back(i);
  }
  bool has_free(int64_t count) const override { return static_cast<int64_t>(free.size()) >= count; }
  int64_t pop() override {
    const int64_t s = free.back();
    free.pop_back();
    return s;
  }
  void release(int64_t slot) override { free.push_back(slot); }
  std::vector<int64_t> free;
};

}  // namespace

TEST(BlockPool, UnitsComeFromTheSameFreeListAsKvBlocks) {
  auto pool = make_pool(6);
  std::vector<int64_t> kv, units;
  ASSERT_TRUE(pool->allocate(2, kv));
  ASSERT_TRUE(pool->reserve_units(4, owner_token::make(owner_token::kOther, 1), units));
  EXPECT_EQ(pool->num_free(), 0);
  EXPECT_FALSE(pool->allocate(1, kv));
  EXPECT_TRUE(kv.empty());
  expect_conserved(*pool);
}

TEST(BlockPool, ReleaseByANonOwnerChangesNothing) {
  auto pool = make_pool(4);
  std::vector<int64_t> units;
  const int64_t me = owner_token::make(owner_token::kOther, 1), you = owner_token::make(owner_token::kOther, 2);
  pool->reserve_units(3, me, units);
  EXPECT_THROW(pool->release_units({units[0], 3}, me), std::invalid_argument);  // 3 is free
  EXPECT_THROW(pool->release_units(units, you), std::invalid_argument);
  EXPECT_THROW(pool->rekey_units({units[0], units[0]}, me, you), std::invalid_argument);
  EXPECT_THROW(pool->release_units({7}, me), std::out_of_range);
  EXPECT_EQ(pool->units_held(me), 3);
  pool->rekey_units(units, me, you);
  EXPECT_EQ(pool->units_held(you), 3);
  EXPECT_EQ(pool->units_held(me), 0);
  pool->release_units(units, you);
  EXPECT_EQ(pool->num_free(), 4);
  expect_conserved(*pool);
}

TEST(BlockPool, FreedHashedBlocksStayFindableUntilHandedOut) {
  auto pool = make_pool(3);
  std::vector<int64_t> evicted;
  pool->set_on_evict([&](int64_t h) { evicted.push_back(h); });
  std::vector<int64_t> b;
  ASSERT_TRUE(pool->allocate(2, b));
  EXPECT_TRUE(pool->publish(b[0], 10));
  EXPECT_TRUE(pool->publish(b[1], 11));
  pool->free({b[1], b[0]});  // 11 freed first: least recently freed
  EXPECT_EQ(pool->lookup(10), b[0]);
  std::vector<int64_t> c;
  ASSERT_TRUE(pool->allocate(1, c));  // the never-hashed block first
  EXPECT_EQ(c[0], 2);
  ASSERT_TRUE(pool->allocate(1, c));
  EXPECT_EQ(c[0], b[1]);
  EXPECT_EQ(evicted, std::vector<int64_t>{11});
  EXPECT_EQ(pool->lookup(11), -1);
  pool->incref({pool->lookup(10)});  // a hit revives the cached block
  EXPECT_EQ(pool->ref_count(b[0]), 1);
  expect_conserved(*pool);
}

TEST(BlockPool, EvictCallbackMayReleaseUnitsIntoTheSamePool) {
  auto pool = make_pool(6);
  PageUnitCheckpointStore store(pool, kSpec);
  std::vector<int64_t> seen_free;
  pool->set_on_evict([&](int64_t h) {
    seen_free.push_back(pool->num_free());
    pool->check_consistency();  // consistent before any handler runs
    store.unindex(h);
  });
  std::vector<int64_t> kv;
  ASSERT_TRUE(pool->allocate(2, kv));
  pool->publish(kv[0], 42);
  make_ready(store, 42);
  pool->free(kv);
  std::vector<int64_t> out;
  ASSERT_TRUE(pool->allocate(2, out));
  EXPECT_EQ(seen_free, std::vector<int64_t>{0});
  EXPECT_FALSE(store.contains(42));
  EXPECT_EQ(pool->num_free(), 4);
  expect_conserved(*pool);
  store.check_consistency();
}

TEST(Store, LifeCycleCopyingReadyEvicting) {
  auto pool = make_pool(8);
  PageUnitCheckpointStore store(pool, kSpec);
  auto op = store.begin_store(5, 2);
  ASSERT_TRUE(op.has_value());
  EXPECT_EQ(op->unit_ids.size(), 4u);
  EXPECT_EQ(store.lookup(5), -1);
  EXPECT_TRUE(store.contains_or_pending(5));
  store.complete_inflight();
  EXPECT_EQ(store.lookup(5), 0);
  auto r = store.begin_restore(5, 1);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(store.unindex(5));
  EXPECT_EQ(store.record(0)->state, CheckpointState::kEvicting);
  EXPECT_EQ(pool->num_free(), 4);  // the reader still holds the units
  store.take_restore_ops();
  store.complete_inflight();
  EXPECT_EQ(store.num_records(), 0);
  EXPECT_EQ(pool->num_free(), 8);
  store.check_consistency();
}

TEST(Store, AdmissionGateIgnoresTheVictimOrder) {
  auto pool = make_pool(16);
  PageUnitCheckpointStore store(pool, kSpec);
  for (int64_t h = 1; h <= 4; ++h) make_ready(store, h);
  store.begin_restore(1, 0);
  EXPECT_TRUE(store.has_available_units(12));
  EXPECT_FALSE(store.has_available_units(13));
  EXPECT_FALSE(store.has_available_units(12, 2));
  EXPECT_THROW(store.has_available_units(-1), std::invalid_argument);
  EXPECT_FALSE(store.ensure_free_units(13));
  EXPECT_EQ(store.evictions(), 0);
  EXPECT_TRUE(store.ensure_free_units(5));
  EXPECT_EQ(store.evictions(), 2);
  EXPECT_TRUE(store.contains(1));
  store.check_consistency();
}

TEST(Store, SuspendTwoRestoresForOneSlotIsAnInvariantError) {
  auto pool = make_pool(8);
  PageUnitCheckpointStore store(pool, kSpec);
  make_ready(store, 1);
  store.begin_restore(1, 3);
  store.begin_restore(1, 3);
  EXPECT_THROW(store.suspend_queued_restore(3), InvariantError);
  EXPECT_TRUE(store.restore_queued_for(3));
  EXPECT_EQ(store.record(0)->pin_count, 2);
}

TEST(Store, ReclaimUsesTheInjectedClock) {
  auto pool = make_pool(8);
  PageUnitCheckpointStore store(pool, kSpec, true);
  double now = 50.0;
  store.set_clock([&] { return now; });
  make_ready(store, 1);
  auto out = store.take_offload_stores(2);
  ASSERT_EQ(out.size(), 1u);
  now += 2.0;
  EXPECT_EQ(store.reclaim_stale_offload_pins(0.0), 0);
  EXPECT_EQ(store.reclaim_stale_offload_pins(3.0), 0);
  EXPECT_EQ(store.reclaim_stale_offload_pins(1.0), 1);
  EXPECT_TRUE(store.was_reclaimed(out[0].first));
  EXPECT_EQ(store.record(0)->pin_count, 0);
}

TEST(Coordinator, MidstepBudgetAndScratchReturn) {
  auto pool = make_pool(32);
  PagedStateCheckpointCoordinator c(pool, kSpec, true, false, true);
  auto scratch = std::make_shared<VectorScratch>(3);
  c.attach_midstep_scratch(scratch, 2);
  Sequence seq;
  seq.state_slots = {0};
  auto res = c.reserve_midstep(seq, {{16, 1}, {32, 2}, {48, 3}});
  ASSERT_EQ(res.size(), 3u);
  c.publish_midstep(res);
  auto [stores, restores] = c.take_checkpoint_ops();
  EXPECT_EQ(stores.size(), 2u);
  EXPECT_TRUE(scratch->free.empty());
  c.complete_previous_batch();
  EXPECT_EQ(scratch->free.size(), 2u);
  EXPECT_TRUE(c.contains(1));
  EXPECT_TRUE(c.contains(2));
  auto [more, none] = c.take_checkpoint_ops();
  EXPECT_EQ(more.size(), 1u);
  c.complete_previous_batch();
  EXPECT_EQ(scratch->free.size(), 3u);
  EXPECT_EQ(c.checkpoints_kept(), 3);
}

TEST(Coordinator, NoScratchAttachedNeverCrashes) {
  auto pool = make_pool(8);
  PagedStateCheckpointCoordinator c(pool, kSpec, true, false, true);
  Sequence seq;
  seq.state_slots = {0};
  EXPECT_TRUE(c.reserve_midstep(seq, {{16, 1}}).empty());
  // Rows never reserved are refused, changing nothing.
  EXPECT_THROW(c.cancel_midstep({{0, 16, 1}}), std::invalid_argument);
  EXPECT_THROW(c.publish_midstep({{0, 16, 1}}), std::invalid_argument);
  c.take_checkpoint_ops();
  c.complete_previous_batch();
}

TEST(Coordinator, SupersedeDropsTheOlderBoundary) {
  auto pool = make_pool(16);
  PagedStateCheckpointCoordinator c(pool, kSpec, true);
  auto seq = std::make_shared<Sequence>();
  seq->state_slots = {4};
  c.checkpoint(seq, 1, 10);
  c.checkpoint(seq, 2, 20);
  EXPECT_EQ(c.checkpoints_dropped(), 1);
  auto [stores, restores] = c.take_checkpoint_ops();
  ASSERT_EQ(stores.size(), 1u);
  c.complete_previous_batch();
  EXPECT_TRUE(c.contains(20));
  EXPECT_FALSE(c.contains(10));
}

TEST(OffloadIndex, CappedLruAndMissingLoads) {
  StateOffloadIndex t(true, true, 2);
  t.note_stored(1);
  t.note_stored(2);
  t.note_stored(3);
  EXPECT_FALSE(t.contains(1));
  EXPECT_TRUE(t.request_load(2));
  t.fail_load(2, true);
  EXPECT_FALSE(t.could_serve(2));
  EXPECT_THROW(t.complete_load(3), std::invalid_argument);
  EXPECT_EQ(t.stats().loads_missing, 1);
}

// docs/contract.md, "Invariants", under random operations: units conserved, the store and the
// pool consistent after every step.
TEST(Store, RandomSequencesConserveUnits) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::mt19937 rng(seed);
    auto pool = make_pool(10 + seed % 30);
    PageUnitCheckpointStore store(pool, kSpec, seed % 2 == 0);
    double now = 0;
    store.set_clock([&] { return now; });
    pool->set_on_evict([&](int64_t h) { store.unindex(h); });
    std::vector<StateStoreOperationId> ops;
    std::vector<std::vector<int64_t>> kv;
    for (int step = 0; step < 400; ++step) {
      const int64_t h = rng() % 8;
      switch (rng() % 12) {
        case 0:
        case 1:
        case 2:
          store.begin_store(h, rng() % 4);
          break;
        case 3:
          store.begin_restore(h, rng() % 4);
          break;
        case 4:
          store.take_restore_ops();
          break;
        case 5:
          store.complete_inflight();
          break;
        case 6:
          store.unindex(h);
          break;
        case 7:
          for (auto& s : store.take_offload_stores(3)) ops.push_back(s.first);
          break;
        case 8:
          if (!ops.empty()) {
            const auto op = ops[rng() % ops.size()];
            if (rng() % 2)
              store.release_offload_store_source(op);
            else
              store.settle_offload_store(op);
          }
          break;
        case 9:
          now += 1.0;
          store.reclaim_stale_offload_pins(1.5);
          break;
        case 10: {
          std::vector<int64_t> b;
          if (pool->allocate(1 + rng() % 3, b)) {
            pool->publish(b[0], rng() % 8);
            kv.push_back(b);
          }
          break;
        }
        case 11:
          if (rng() % 20 == 0)
            store.clear();
          else if (!kv.empty()) {
            pool->free(kv.back());
            kv.pop_back();
          }
          break;
      }
      expect_conserved(*pool);
      store.check_consistency();
      EXPECT_EQ(pool->num_reserved(), store.units_held());
    }
  }
}

TEST(FlatInt64Map, MatchesUnorderedMapUnderRandomChurn) {
  std::mt19937_64 rng(7);
  FlatInt64Map<int64_t> flat;
  std::unordered_map<int64_t, int64_t> ref;
  for (int step = 0; step < 200000; ++step) {
    // Small key ranges force long probe runs and many backward shifts.
    const int64_t key = static_cast<int64_t>(rng() % 512) * (step % 3 == 0 ? -7919 : 1);
    switch (rng() % 3) {
      case 0:
        flat[key] = step;
        ref[key] = step;
        break;
      case 1:
        EXPECT_EQ(flat.erase(key), ref.erase(key) == 1);
        break;
      case 2: {
        const int64_t* v = flat.find(key);
        auto it = ref.find(key);
        ASSERT_EQ(v != nullptr, it != ref.end());
        if (v) {
          EXPECT_EQ(*v, it->second);
        }
      }
    }
    ASSERT_EQ(flat.size(), ref.size());
  }
  size_t seen = 0;
  flat.for_each([&](int64_t k, int64_t v) {
    ++seen;
    EXPECT_EQ(ref.at(k), v);
  });
  EXPECT_EQ(seen, ref.size());
}

TEST(Store, SuspendedRestoreIsTakenBackOnce) {
  auto pool = make_pool(16);
  PageUnitCheckpointStore store(pool, kSpec);
  make_ready(store, 1);
  store.begin_restore(1, 3);
  auto s = store.suspend_queued_restore(3);
  ASSERT_TRUE(s.has_value());
  store.begin_restore(1, 4);  // a second reader of the same image
  store.release_suspended_restore(*s);
  EXPECT_THROW(store.release_suspended_restore(*s), std::invalid_argument);
  EXPECT_THROW(store.resume_suspended_restore(*s), std::invalid_argument);
  EXPECT_EQ(store.record(0)->pin_count, 1);  // the other restore keeps its pin
  store.check_consistency();
}

TEST(Store, MinusOneAndWrongUnitCountsAreRefusedBeforeAnyChange) {
  auto pool = make_pool(16);
  PageUnitCheckpointStore store(pool, kSpec);
  EXPECT_THROW(store.begin_store(-1, 0), std::invalid_argument);
  const int64_t owner = owner_token::make(owner_token::kOther, 0);
  UnitIds units;
  ASSERT_TRUE(pool->reserve_units(3, owner, units));
  EXPECT_THROW(store.adopt_units(units, owner, 5), std::invalid_argument);
  UnitIds one;
  ASSERT_TRUE(pool->reserve_units(1, owner, one));
  units.push_back(one[0]);
  EXPECT_THROW(store.adopt_units(units, owner, -1), std::invalid_argument);
  EXPECT_EQ(pool->num_reserved(), 4);
  EXPECT_EQ(store.num_records(), 0);
  EXPECT_TRUE(store.adopt_units(units, owner, 5));
  store.check_consistency();
}

TEST(Store, ThrowingEvictHandlerLeavesNoOrphanUnits) {
  auto pool = make_pool(4);
  PageUnitCheckpointStore store(pool, kSpec);
  UnitIds kv;
  ASSERT_TRUE(pool->allocate(4, kv));
  for (int64_t b : kv) pool->publish(b, 100 + b);
  pool->free(kv);
  pool->set_on_evict([](int64_t) { throw std::runtime_error("handler"); });
  EXPECT_THROW(store.begin_store(7, 0), std::runtime_error);
  // The reservation went back: no unit owned by a checkpoint without a record.
  EXPECT_EQ(pool->num_free(), 4);
  EXPECT_EQ(store.num_records(), 0);
  store.check_consistency();
}

TEST(Store, ThrowingClockChangesNothing) {
  auto pool = make_pool(8);
  PageUnitCheckpointStore store(pool, kSpec, true);
  make_ready(store, 1);
  store.set_clock([]() -> double { throw std::runtime_error("clock"); });
  EXPECT_THROW(store.take_offload_stores(2), std::runtime_error);
  EXPECT_THROW(store.acquire_checkpoint_source(1), std::runtime_error);
  EXPECT_EQ(store.record(0)->pin_count, 0);
  EXPECT_FALSE(store.has_offload_pins());
  EXPECT_EQ(store.store_backlog().size(), 1u);
  store.check_consistency();
}

TEST(Coordinator, HandlerCannotCompleteStoresBeingBegun) {
  auto pool = make_pool(4);
  PagedStateCheckpointCoordinator c(pool, kSpec, true);
  UnitIds kv;
  ASSERT_TRUE(pool->allocate(4, kv));
  for (int64_t b : kv) pool->publish(b, 100 + b);
  pool->free(kv);
  int refused = 0;
  pool->set_on_evict([&](int64_t) {
    try {
      c.complete_previous_batch();
    } catch (const std::runtime_error&) {
      ++refused;
    }
  });
  auto seq = std::make_shared<Sequence>();
  seq->state_slots = {2};
  c.checkpoint(seq, 1, 9);
  auto [stores, restores] = c.take_checkpoint_ops();
  EXPECT_EQ(stores.size(), 1u);
  EXPECT_EQ(refused, 4);
  EXPECT_FALSE(c.contains(9));
  c.complete_previous_batch();
  EXPECT_TRUE(c.contains(9));
  c.check_consistency();
}

TEST(Coordinator, ThrowingScratchPopGivesBackItsSlots) {
  struct Flaky : VectorScratch {
    using VectorScratch::VectorScratch;
    int pops = 0;
    int64_t pop() override {
      if (++pops == 2) throw std::runtime_error("pop");
      return VectorScratch::pop();
    }
  };
  auto pool = make_pool(16);
  PagedStateCheckpointCoordinator c(pool, kSpec, true, false, true);
  auto scratch = std::make_shared<Flaky>(3);
  c.attach_midstep_scratch(scratch, 2);
  Sequence seq;
  seq.state_slots = {0};
  EXPECT_THROW(c.reserve_midstep(seq, {{16, 1}, {32, 2}}), std::runtime_error);
  EXPECT_EQ(scratch->free.size(), 3u);
  EXPECT_THROW(c.reserve_midstep(seq, {{16, -1}}), std::invalid_argument);
  c.check_consistency();
}
