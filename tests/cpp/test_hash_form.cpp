// HashForm (core/hash_form.h) and the arithmetic at the end of the int64
// range (issue 18 items 8 and 11).
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/hash_form.h"
#include "core/host_arena.h"
#include "core/paged_types.h"

using namespace statecache;

TEST(HashForm, TheFirstTopBitHashDecidesAndTheOtherFormIsRefused) {
  HashForm f;
  f.note("h", 5, HashForm::kUnset);    // small hashes take either form
  f.note("h", -1, HashForm::kSigned);  // -1 is "no hash": decides nothing
  EXPECT_EQ(f.kind(), HashForm::kUnset);
  f.note("h", static_cast<int64_t>(~uint64_t{0} - 4), HashForm::kUnsigned);
  EXPECT_TRUE(f.is_unsigned());
  f.note("h", -7, HashForm::kUnsigned);  // the same form again
  try {
    f.note("block_hashes[3]", -5, HashForm::kSigned);
    FAIL() << "the other form was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("block_hashes[3]=-5"), std::string::npos) << what;
    EXPECT_NE(what.find("18446744073709551611"), std::string::npos) << what;
  }
  EXPECT_TRUE(f.is_unsigned());  // nothing recorded on a refusal
  EXPECT_TRUE(HashForm::has_form(INT64_MIN));
  EXPECT_FALSE(HashForm::has_form(-1));
  EXPECT_FALSE(HashForm::has_form(INT64_MAX));
}

TEST(HashForm, SignedFirstRefusesUnsigned) {
  HashForm f;
  f.note("h", -5, HashForm::kSigned);
  EXPECT_FALSE(f.accepts(HashForm::kUnsigned));
  EXPECT_THROW(f.note("h", -5, HashForm::kUnsigned), std::invalid_argument);
  EXPECT_EQ(f.kind(), HashForm::kSigned);
}

TEST(PagedStateCheckpointSpec, UnitsPerCheckpointAtTheEndOfTheRange) {
  EXPECT_EQ(PagedStateCheckpointSpec(2, INT64_MAX, "x", INT64_MAX).units_per_checkpoint(), INT64_MAX / 2 + 1);
  EXPECT_EQ(PagedStateCheckpointSpec(INT64_MAX, INT64_MAX, "x", INT64_MAX).units_per_checkpoint(), 1);
  EXPECT_EQ(checkpoint_copy_ops_per_batch(INT64_MAX / 2), INT64_MAX - 1);
  EXPECT_THROW(checkpoint_copy_ops_per_batch(INT64_MAX / 2 + 1), std::overflow_error);
  EXPECT_THROW(checkpoint_copy_ops_per_batch(INT64_MIN / 2 - 1), std::overflow_error);
}

TEST(HostArena, CountsAtTheEndOfTheRangeNeverFit) {
  HostArena a(64, 64 * 16, {64 * 8, 64 * 8}, HostArena::cost_model());
  ASSERT_TRUE(a.allocate("first", 0, 1, 64, 0, nullptr).has_value());
  for (int64_t count : {int64_t{1} << 62, INT64_MAX}) {
    EXPECT_FALSE(a.victims(0, count).has_value());
    EXPECT_FALSE(a.allocate("huge", 0, count, 0, 0, nullptr).has_value());
  }
  EXPECT_EQ(a.class_stats(0).refused, 2);
  EXPECT_THROW(HostArena(1, INT32_MAX, {int64_t{1} << 62, int64_t{1} << 62}, HostArena::cost_model()),
               std::invalid_argument);
  a.check_consistency();
}
