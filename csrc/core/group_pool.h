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

#include "core/errors.h"
#include "core/free_list.h"
#include "core/sequence.h"
#include "core/state_transfer.h"

namespace statecache {

// What retire_top did to the group pool (see Retirement).
struct GroupRetirement : Retirement {};

class StateGroupPool : public StateFreeList {
 public:
  explicit StateGroupPool(int64_t num_groups, StateTransfer transfer = StateTransfer(),
                          int64_t hash_block_size = 1, bool enabled = true);

  const StateTransfer& transfer() const { return transfer_; }
  int64_t min_fork_tokens() const { return transfer_.fork_tokens; }
  double successor_room() const { return transfer_.successor_room(); }
  bool readable_midstep() const { return transfer_.readable_midstep; }
  int64_t hash_block_size() const { return hash_block_size_; }

  std::optional<GroupRetirement> retire_top() {
    auto r = StateFreeList::retire_top();
    if (!r) return std::nullopt;
    return GroupRetirement{*r};
  }

  bool applies(const Sequence& seq) const { return enabled() && seq.has_per_req_cache; }

  template <class HashAt>
  int64_t resumable_hit(const Sequence& seq, int64_t hit, int64_t num_hashes, HashAt&& hash_at,
                        bool assume_checkpointed = false) const {
    if (hit < 0) bad_argument("hit", hit, "must be >= 0");
    if (!applies(seq) || transfer_.replays()) return hit;
    // Assumed checkpoints never read the hashes, so their length is no limit.
    if (!assume_checkpointed && hit > num_hashes) out_of_range("hit", hit, num_hashes + 1);
    return scan_resumable(seq.num_tokens, hit, min_fork_tokens(), hash_block_size_,
                          assume_checkpointed, hash_at);
  }
  int64_t resumable_hit(const Sequence& seq, int64_t hit, std::span<const int64_t> hashes,
                        bool assume_checkpointed = false) const {
    return resumable_hit(seq, hit, static_cast<int64_t>(hashes.size()),
                         [&](int64_t i) { return hashes[static_cast<size_t>(i)]; },
                         assume_checkpointed);
  }

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

  StateTransfer transfer_;
  int64_t hash_block_size_;
  std::vector<std::shared_ptr<Sequence>> pending_;
  std::vector<std::pair<int64_t, int64_t>> copies_;
};

}  // namespace statecache
