// What StateSlotPool and StateGroupPool add to the free list alike: the
// transfer they checkpoint with, which sequences they apply to, the
// resumable-hit cap, and retire_top's record type.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "core/errors.h"
#include "core/free_list.h"
#include "core/sequence.h"
#include "core/state_transfer.h"

namespace statecache {

// What a fork checkpoint will do, decided before anything changes, so that a
// caller writing the sequence's fields back to a Python object can do so
// before the pool commits (bindings, generic sequences).
struct ForkPlan {
  bool forks = false;    // the owner moves from `old` to `fresh`
  bool dropped = false;  // nothing free: counted, nothing else changes
  int64_t old = -1;
  int64_t fresh = -1;
  bool operator==(const ForkPlan&) const = default;
};

template <class Retire>
class CheckpointPool : public StateFreeList {
 public:
  const StateTransfer& transfer() const { return transfer_; }
  int64_t min_fork_tokens() const { return transfer_.fork_tokens; }
  double successor_room() const { return transfer_.successor_room(); }
  bool readable_midstep() const { return transfer_.readable_midstep; }
  int64_t hash_block_size() const { return hash_block_size_; }

  // Whether this pool gates or checkpoints anything for `seq`.
  bool applies(const Sequence& seq) const { return enabled() && seq.has_per_req_cache; }

  std::optional<Retire> retire_top() {
    auto r = StateFreeList::retire_top();
    if (!r) return std::nullopt;
    return Retire{*r};
  }

  // The largest L <= hit whose boundary is checkpointed and leaves the
  // resuming forward min_fork_tokens (0 is always valid); `hit` itself when
  // the pool does not apply or the state is replayed. `hash_at(i)` yields
  // block i's hash, i < num_hashes.
  template <class HashAt>
  int64_t resumable_hit(const Sequence& seq, int64_t hit, int64_t num_hashes, HashAt&& hash_at,
                        bool assume_checkpointed = false) const {
    if (hit < 0) bad_argument("hit", hit, "must be >= 0");
    if (!applies(seq) || transfer_.replays()) return hit;
    if (hit_within_hashes(seq, assume_checkpointed) && hit > num_hashes) out_of_range("hit", hit, num_hashes + 1);
    return scan_resumable(seq.num_tokens, hit, min_fork_tokens(), hash_block_size_, assume_checkpointed, hash_at);
  }
  // Whether resumable_hit reads seq's hash list, so that `hit` must lie
  // within it.
  bool hit_within_hashes(const Sequence& seq, bool assume_checkpointed) const {
    return applies(seq) && !transfer_.replays() && (reads_assumed_hashes_ || !assume_checkpointed);
  }
  int64_t resumable_hit(const Sequence& seq, int64_t hit, std::span<const int64_t> hashes,
                        bool assume_checkpointed = false) const {
    return resumable_hit(
        seq, hit, static_cast<int64_t>(hashes.size()), [&](int64_t i) { return hashes[static_cast<size_t>(i)]; },
        assume_checkpointed);
  }

 protected:
  // The fork decision for an owner now holding `old` (owned, in range).
  ForkPlan plan_fork(int64_t old) {
    ForkPlan p;
    if (!has_free()) {
      p.dropped = true;
      return p;
    }
    p.forks = true;
    p.old = old;
    p.fresh = peek_pop();
    return p;
  }
  // Carries out a plan_fork: returns the fresh index, files `old` under h.
  int64_t apply_fork(const ForkPlan& p, int64_t h, int64_t position = 0) {
    if (p.dropped) ++fates_.dropped;
    if (!p.forks) return -1;
    const int64_t fresh = pop();
    check_invariant(fresh == p.fresh, "a fork plan went stale before it was applied");
    file_checkpoint(h, p.old, position);
    return fresh;
  }

  // -1 means "no hash" everywhere: never a content hash (docs/contract.md, "Words").
  static void check_hash(const char* name, int64_t h) {
    if (h == -1) bad_argument(name, h, "is -1, which means \"no hash\"; it cannot name a checkpoint");
  }
  // Whether `boundary_blocks` ends exactly at token position `known`
  // (without overflowing on absurd block counts).
  bool boundary_is(int64_t boundary_blocks, int64_t known) const {
    int64_t pos = 0;
    return !__builtin_mul_overflow(boundary_blocks, hash_block_size_, &pos) && pos == known;
  }

  // `reads_assumed_hashes`: whether `hit` must stay within the hash list even
  // when checkpoints are assumed (the slot pool's reference reads the list
  // either way, the group pool's does not).
  CheckpointPool(int64_t count, StateTransfer transfer, int64_t hash_block_size, bool enabled, const char* kind,
                 bool reads_assumed_hashes)
      : StateFreeList(count, enabled, kind),
        transfer_(std::move(transfer)),
        hash_block_size_(hash_block_size),
        reads_assumed_hashes_(reads_assumed_hashes) {
    if (hash_block_size < 1) bad_argument("hash_block_size", hash_block_size, "must be >= 1");
  }

 private:
  StateTransfer transfer_;
  int64_t hash_block_size_;
  bool reads_assumed_hashes_;
};

}  // namespace statecache
