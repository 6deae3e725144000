// StateGroupPool: per-request state groups plus the checkpoint index over the
// free ones, for both handover mechanisms:
//   fork  the owner gives its group to the index and takes a fresh one; the
//         old group stays pinned until the next pass's batch has read it.
//   copy  the owner keeps its group; `checkpoint` only records the intent and
//         `take_copies` (called as the next batch is built) turns it into a
//         (src, dst) pair, filing dst at that moment.
// Under none() and replay() nothing is ever checkpointed (SPEC.md §4).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/checkpoint_pool.h"
#include "core/errors.h"
#include "core/sequence.h"
#include "core/state_transfer.h"

namespace statecache {

// What retire_top did to the group pool (see Retirement).
struct GroupRetirement : Retirement {};

class StateGroupPool : public CheckpointPool<GroupRetirement> {
 public:
  explicit StateGroupPool(int64_t num_groups, StateTransfer transfer = StateTransfer(),
                          int64_t hash_block_size = 1, bool enabled = true);

  // The pool keeps a strong reference to a sequence with a pending copy
  // checkpoint until the next take_copies.
  void checkpoint(const std::shared_ptr<Sequence>& seq, int64_t boundary_blocks, int64_t h);
  void forget_pending(Sequence& seq) { seq.pending_checkpoint = -1; }
  void record_copy(int64_t src, int64_t dst);
  // Commits last pass's copy intents, then hands over every pending pair.
  std::vector<std::pair<int64_t, int64_t>> take_copies();

  const std::vector<std::pair<int64_t, int64_t>>& pending_copies() const { return copies_; }
  const std::vector<std::shared_ptr<Sequence>>& pending_sequences() const { return pending_; }

 private:
  void commit_pending();

  std::vector<std::shared_ptr<Sequence>> pending_;
  std::vector<std::pair<int64_t, int64_t>> copies_;
};

}  // namespace statecache
