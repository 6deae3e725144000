#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/span_planner.h"

using namespace statecache;

namespace {

uint64_t addr(const std::vector<uint8_t>& v, size_t off = 0) { return reinterpret_cast<uint64_t>(v.data() + off); }

// Two slot tensors ([2 layers, 4 slots, 5 bytes] and [4 slots, 7 bytes], image
// = bytes 1..3 of the first and all of the second) and units of 4 + 2 bytes.
struct World {
  std::vector<uint8_t> a = std::vector<uint8_t>(2 * 4 * 5), b = std::vector<uint8_t>(4 * 7);
  std::vector<uint8_t> k = std::vector<uint8_t>(10 * 4), v = std::vector<uint8_t>(10 * 2);
  SpanPlanner planner{{{addr(a, 1), 5, 3}, {addr(a, 20 + 1), 5, 3}, {addr(b), 7, 7}},
                      {{addr(a), 5, 5}, {addr(a, 20), 5, 5}, {addr(b), 7, 7}},
                      {{addr(k), 4, 4}, {addr(v), 2, 2}},
                      4,
                      10,
                      "L"};
  World() {
    std::mt19937 rng(5);
    for (auto* t : {&a, &b, &k, &v})
      for (auto& x : *t) x = static_cast<uint8_t>(1 + rng() % 255);
  }
  std::vector<uint8_t> image(int slot) const {
    std::vector<uint8_t> out;
    for (int l = 0; l < 2; ++l)
      for (int i = 1; i < 4; ++i) out.push_back(a[l * 20 + slot * 5 + i]);
    for (int i = 0; i < 7; ++i) out.push_back(b[slot * 7 + i]);
    return out;
  }
  std::vector<uint8_t> units(const std::vector<int64_t>& ids) const {
    std::vector<uint8_t> out;
    for (int64_t u : ids) {
      for (int i = 0; i < 4; ++i) out.push_back(k[u * 4 + i]);
      for (int i = 0; i < 2; ++i) out.push_back(v[u * 2 + i]);
    }
    return out;
  }
};

}  // namespace

TEST(SpanPlanner, Geometry) {
  World w;
  EXPECT_EQ(w.planner.image_bytes(), 13);
  EXPECT_EQ(w.planner.slot_bytes(), 17);
  EXPECT_EQ(w.planner.unit_bytes(), 6);
  EXPECT_EQ(w.planner.units_per_image(), 3);
}

TEST(SpanPlanner, StoreThenRestoreRoundTrips) {
  World w;
  const std::vector<int64_t> ids = {7, 2, 9};
  const auto img = w.image(1);
  const auto untouched = w.units({0, 1, 3, 4, 5, 6, 8});
  const auto last_tail = w.units({9});
  MaintenanceBatch store;
  store.stores.push_back({1, ids, 13, "L"});
  CompiledBatch p = w.planner.compile(store);
  EXPECT_EQ(p.bytes, 13u);
  EXPECT_EQ(p.ops.size(), 1u);
  EXPECT_EQ(p.unit_ids.size(), 3u);
  w.planner.run_on_cpu(p);
  auto got = w.units(ids);
  EXPECT_TRUE(std::equal(img.begin(), img.end(), got.begin()));
  // The last unit's bytes past the image and unlisted units are untouched.
  EXPECT_TRUE(std::equal(got.begin() + 13, got.end(), last_tail.begin() + 1));
  EXPECT_EQ(w.units({0, 1, 3, 4, 5, 6, 8}), untouched);
  MaintenanceBatch restore;
  restore.restores.push_back({3, ids, 13, "L"});
  const uint8_t whole0 = w.a[3 * 5];  // outside the image
  w.planner.run_on_cpu(w.planner.compile(restore));
  EXPECT_EQ(w.image(3), img);
  EXPECT_EQ(w.a[3 * 5], whole0);
}

TEST(SpanPlanner, SlotCopiesMoveWholeSlots) {
  World w;
  std::vector<uint8_t> a0(w.a), b0(w.b);
  MaintenanceBatch batch;
  batch.relocations.push_back({0, 2});
  batch.copies.push_back({1, 3});
  w.planner.run_on_cpu(w.planner.compile(batch));
  for (int l = 0; l < 2; ++l)
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(w.a[l * 20 + 2 * 5 + i], a0[l * 20 + 0 * 5 + i]);
      EXPECT_EQ(w.a[l * 20 + 3 * 5 + i], a0[l * 20 + 1 * 5 + i]);
    }
  for (int i = 0; i < 7; ++i) EXPECT_EQ(w.b[2 * 7 + i], b0[i]);
}

TEST(SpanPlanner, ValidationNamesTheOpAndPlansNothing) {
  World w;
  auto bad = [&](MaintenanceBatch b) { EXPECT_THROW(w.planner.compile(b), std::invalid_argument); };
  MaintenanceBatch b;
  b.stores.push_back({1, {0, 1, 2}, 13, "other"});
  bad(b);
  b.stores[0] = {1, {0, 1, 2}, 12, "L"};
  bad(b);
  b.stores[0] = {1, {0, 1}, 13, "L"};
  bad(b);
  b.stores[0] = {1, {0, 1, 10}, 13, "L"};
  bad(b);
  b.stores[0] = {4, {0, 1, 2}, 13, "L"};
  bad(b);
  b.stores[0] = {1, {0, 1, 1}, 13, "L"};
  bad(b);
  MaintenanceBatch c;
  c.relocations.push_back({0, 1});
  c.copies.push_back({2, 1});
  bad(c);
  c.copies[0] = {1, 3};  // reads what the relocation writes
  bad(c);
  try {
    MaintenanceBatch d;
    d.restores.push_back({-1, {0, 1, 2}, 13, "L"});
    w.planner.compile(d);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("restores[0]"), std::string::npos);
  }
}

TEST(SpanPlanner, RejectsBadTables) {
  std::vector<uint8_t> buf(64);
  EXPECT_THROW(SpanPlanner({}, {{addr(buf), 8, 8}}, {{addr(buf), 8, 8}}, 4, 4, "L"), std::invalid_argument);
  EXPECT_THROW(SpanPlanner({{addr(buf), 4, 8}}, {{addr(buf), 4, 8}}, {{addr(buf), 8, 8}}, 4, 4, "L"),
               std::invalid_argument);
  EXPECT_THROW(SpanPlanner({{addr(buf), 8, 8}}, {{addr(buf), 8, 8}}, {{addr(buf), 8, 8}}, 4, 4, ""),
               std::invalid_argument);
}

TEST(SpanPlanner, ScratchStampsDoNotLeakBetweenBatches) {
  World w;
  // A batch that fails half-way leaves stamps behind; the next batch, using
  // the same ids the other way round, is valid and must pass.
  MaintenanceBatch bad;
  bad.stores.push_back({1, {0, 1, 2}, 13, "L"});
  bad.stores.push_back({2, {2, 3, 4}, 13, "L"});
  EXPECT_THROW(w.planner.validate(bad), std::invalid_argument);
  for (int round = 0; round < 1000; ++round) {
    MaintenanceBatch ok;
    ok.restores.push_back({round % 2 ? 1 : 2, {0, 1, 2}, 13, "L"});
    ok.stores.push_back({3, {3 + round % 5, 9, 8}, 13, "L"});
    EXPECT_NO_THROW(w.planner.validate(ok));
  }
}

TEST(SpanPlanner, RefusesAnotherPlannersBatch) {
  World w, other;
  MaintenanceBatch b;
  b.relocations.push_back({0, 1});
  CompiledBatch mine = w.planner.compile(b);
  EXPECT_THROW(other.planner.run_on_cpu(mine), std::invalid_argument);
  EXPECT_EQ(w.planner.spans(mine).size(), w.planner.slot_template().size());
}

TEST(SpanPlanner, TemplateMergesPiecesAdjacentOnBothSides) {
  // Units of 2 x 4 bytes whose halves are neighbours in one buffer; one
  // 16-byte state row: one piece per unit, not two.
  std::vector<uint8_t> st(4 * 16), kv(8 * 8);
  SpanPlanner p({{addr(st), 16, 16}}, {{addr(st), 16, 16}}, {{addr(kv), 8, 4}, {addr(kv, 4), 8, 4}}, 4, 8, "L");
  EXPECT_EQ(p.units_per_image(), 2);
  EXPECT_EQ(p.paged_template().size(), 2u);
  EXPECT_EQ(p.paged_template()[1].unit_k, 1);
  EXPECT_EQ(p.paged_template()[0].bytes, 8u);
}
