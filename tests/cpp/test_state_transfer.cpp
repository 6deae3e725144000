#include <gtest/gtest.h>

#include <cmath>

#include "core/errors.h"
#include "core/sequence.h"
#include "core/state_transfer.h"

using namespace statecache;

TEST(StateTransfer, KindsAndRooms) {
  EXPECT_TRUE(std::isinf(StateTransfer().successor_room()));
  EXPECT_TRUE(std::isinf(StateTransfer(TransferKind::kReplay).successor_room()));
  EXPECT_EQ(StateTransfer(TransferKind::kFork, 3).successor_room(), 3.0);
  EXPECT_EQ(StateTransfer(TransferKind::kCopy, 0, "L").successor_room(), 0.0);
}

TEST(StateTransfer, Validation) {
  EXPECT_THROW(StateTransfer(TransferKind::kFork, 0), std::invalid_argument);
  EXPECT_THROW(StateTransfer(TransferKind::kNone, 2), std::invalid_argument);
  EXPECT_THROW(StateTransfer(TransferKind::kFork, 2, "L"), std::invalid_argument);
  EXPECT_THROW(StateTransfer(TransferKind::kReplay, 0, std::nullopt, true), std::invalid_argument);
  EXPECT_THROW(parse_transfer_kind("mamba"), std::invalid_argument);
  EXPECT_EQ(parse_transfer_kind("copy"), TransferKind::kCopy);
}

TEST(Sequence, StateSlotReplacesElementZeroOnly) {
  Sequence s;
  EXPECT_EQ(s.state_slot(), -1);
  s.state_slots = {4, 5};
  s.set_state_slot(9);
  EXPECT_EQ(s.state_slots, (std::vector<int64_t>{9, 5}));
}
