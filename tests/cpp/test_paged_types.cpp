#include <gtest/gtest.h>

#include "core/paged_types.h"

using namespace statecache;

TEST(PagedStateCheckpointSpec, UnitsRoundUp) {
  EXPECT_EQ(PagedStateCheckpointSpec(4096, 10000, "L", 9000).units_per_checkpoint(), 3);
  EXPECT_EQ(PagedStateCheckpointSpec(4096, 8192, "L", 8192).units_per_checkpoint(), 2);
  EXPECT_EQ(PagedStateCheckpointSpec(4096, 8192, "L", 1).units_per_checkpoint(), 1);
}

TEST(PagedStateCheckpointSpec, Validation) {
  EXPECT_THROW(PagedStateCheckpointSpec(0, 1, "L", 1), std::invalid_argument);
  EXPECT_THROW(PagedStateCheckpointSpec(1, -1, "L", 1), std::invalid_argument);
  EXPECT_THROW(PagedStateCheckpointSpec(1, 1, "L", 0), std::invalid_argument);
  EXPECT_THROW(PagedStateCheckpointSpec(1, 1, "L", 2), std::invalid_argument);
  EXPECT_THROW(PagedStateCheckpointSpec(1, 1, "", 1), std::invalid_argument);
  EXPECT_EQ(PagedStateCheckpointSpec(1, 2, "L", 2), PagedStateCheckpointSpec(1, 2, "L", 2));
}

TEST(PagedTypes, StateNames) {
  for (auto s : {CheckpointState::kCopying, CheckpointState::kReady, CheckpointState::kEvicting})
    EXPECT_EQ(parse_checkpoint_state(checkpoint_state_name(s)), s);
  EXPECT_THROW(parse_checkpoint_state("DONE"), std::invalid_argument);
  EXPECT_EQ(checkpoint_copy_ops_per_batch(5), 10);
}

TEST(PagedTypes, OperationIdHashSeparatesGenerations) {
  StateStoreOperationIdHash hash;
  EXPECT_NE(hash({7, 1}), hash({7, 2}));
  EXPECT_EQ((StateStoreOperationId{7, 1}), (StateStoreOperationId{7, 1}));
}
