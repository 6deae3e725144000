#include "core/group_pool.h"

namespace statecache {

StateGroupPool::StateGroupPool(int64_t num_groups, StateTransfer transfer, int64_t hash_block_size,
                               bool enabled)
    : CheckpointPool(num_groups, std::move(transfer), hash_block_size, enabled, "group",
                     /*reads_assumed_hashes=*/false) {}

void StateGroupPool::checkpoint(const std::shared_ptr<Sequence>& seq_ptr, int64_t boundary_blocks,
                                int64_t h) {
  (void)boundary_blocks;  // a group is one entry, not a span ending at the boundary
  Sequence& seq = *seq_ptr;
  if (!applies(seq)) return;
  // SPEC.md §4: none() and replay() keep nothing, not even a dropped count.
  if (!transfer().forks() && !transfer().copies()) return;
  const int64_t old = seq.per_req_cache_group;
  if (old < 0) return;
  check_index("seq.per_req_cache_group", old, size());
  if (transfer().copies()) {
    if (seq.pending_checkpoint == -1) pending_.push_back(seq_ptr);
    // A later boundary supersedes an earlier one: only the last is true.
    seq.pending_checkpoint = h;
    return;
  }
  if (is_free(old))
    bad_argument("seq.per_req_cache_group", old, "is free, so the sequence does not own it");
  if (!has_free()) {
    ++fates_.dropped;
    return;
  }
  seq.per_req_cache_group = pop();
  seq.state_fork_src = old;
  file_checkpoint(h, old);
  pin(old, /*reader_is_next_batch=*/true);
  ++fates_.kept;
}

void StateGroupPool::commit_pending() {
  // Each destination goes straight back to the free list as a checkpoint:
  // capacity-neutral, spent lazily by whoever pops it next. A sequence that
  // lost its group since (preempted, finished) is skipped.
  for (const auto& seq : pending_) {
    const int64_t h = seq->pending_checkpoint;
    seq->pending_checkpoint = -1;
    const int64_t src = seq->per_req_cache_group;
    if (h == -1 || src < 0) continue;
    if (!has_free()) {
      ++fates_.dropped;
      continue;
    }
    const int64_t dst = pop();
    put_back(dst);
    file_checkpoint(h, dst);
    copies_.emplace_back(src, dst);
    ++fates_.kept;
  }
  pending_.clear();
}

void StateGroupPool::record_copy(int64_t src, int64_t dst) {
  check_index("src", src, capacity());
  check_index("dst", dst, capacity());
  copies_.emplace_back(src, dst);
}

std::vector<std::pair<int64_t, int64_t>> StateGroupPool::take_copies() {
  commit_pending();
  std::vector<std::pair<int64_t, int64_t>> out;
  out.swap(copies_);
  return out;
}

}  // namespace statecache
