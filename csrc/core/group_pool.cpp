#include "core/group_pool.h"

#include "core/batch.h"

namespace statecache {

StateGroupPool::StateGroupPool(int64_t num_groups, StateTransfer transfer, int64_t hash_block_size, bool enabled)
    : CheckpointPool(num_groups, std::move(transfer), hash_block_size, enabled, "group",
                     /*reads_assumed_hashes=*/false) {}

void StateGroupPool::check_checkpoint(const Sequence& seq, int64_t h) const {
  check_hash("h", h);
  if (!applies(seq) || (!transfer().forks() && !transfer().copies())) return;
  const int64_t old = seq.per_req_cache_group;
  if (old < 0) return;
  check_index("seq.per_req_cache_group", old, size());
  if (transfer().forks() && is_free(old))
    bad_argument("seq.per_req_cache_group", old, "is free, so the sequence does not own it");
}

bool StateGroupPool::checkpoint(Sequence& seq, int64_t boundary_blocks, int64_t h) {
  // A group is one entry, not a span ending at the boundary: the boundary
  // only tells the eviction cost model what a hit there saves.
  check_checkpoint(seq, h);
  if (!applies(seq)) return false;
  // docs/contract.md, "Divergences": none() and replay() keep nothing, not even a dropped count.
  if (!transfer().forks() && !transfer().copies()) return false;
  const int64_t old = seq.per_req_cache_group;
  if (old < 0) return false;
  if (transfer().copies()) {
    // A later boundary supersedes an earlier one: only the last is true. A
    // sequence whose earlier intent died with its group joins again.
    bool joined = false;
    if (seq.pending_checkpoint == -1 || !group_has_intent(old)) {
      pending_.push_back({old, release_epoch(old), boundary_blocks});
      joined = true;
    } else {
      for (Intent& i : pending_)
        if (i.group == old && intent_alive(i)) i.position = boundary_blocks;
    }
    seq.pending_checkpoint = h;
    return joined;
  }
  const ForkPlan plan = plan_checkpoint(seq, h);
  if (!plan.forks) {
    apply_fork(plan, h, boundary_blocks);
    return false;
  }
  seq.per_req_cache_group = apply_fork(plan, h, boundary_blocks);
  seq.state_fork_src = old;
  pin(old, /*reader_is_next_batch=*/true);
  ++fates_.kept;
  return false;
}

std::vector<size_t> StateGroupPool::checkpoint_many(std::span<Sequence* const> seqs, std::span<const uintptr_t> keys,
                                                    std::span<const int64_t> boundary_blocks,
                                                    std::span<const int64_t> hashes) {
  // An entry's checks hold for the whole batch: no checkpoint frees a group
  // a sequence owns.
  std::vector<size_t> joined;
  batch::checkpoint_many(
      seqs.size(), keys, boundary_blocks, hashes, [&](size_t i) { check_checkpoint(*seqs[i], hashes[i]); },
      [&](size_t i) {
        if (checkpoint(*seqs[i], boundary_blocks[i], hashes[i])) joined.push_back(i);
      });
  return joined;
}

ForkPlan StateGroupPool::plan_checkpoint(const Sequence& seq, int64_t h) {
  check_checkpoint(seq, h);
  if (!applies(seq) || !transfer().forks() || seq.per_req_cache_group < 0) return {};
  return plan_fork(seq.per_req_cache_group);
}

bool StateGroupPool::plan_intent(const Sequence& seq, int64_t h) const {
  check_hash("h", h);
  if (!applies(seq) || !transfer().copies()) return false;
  const int64_t old = seq.per_req_cache_group;
  if (old < 0) return false;
  check_index("seq.per_req_cache_group", old, size());
  return true;
}

bool StateGroupPool::group_has_intent(int64_t g) const {
  for (const Intent& i : pending_)
    if (i.group == g && intent_alive(i)) return true;
  return false;
}

std::optional<GroupRetirement> StateGroupPool::retire_top() {
  const int64_t top = size() - 1;
  auto r = CheckpointPool::retire_top();
  if (r && r->relocated_to >= 0 && !r->held_checkpoint) {
    // The caller re-points the owner at relocated_to and the relocation runs
    // before the batch's group copies, so the intent follows the bytes.
    for (Intent& i : pending_)
      if (i.group == top && release_epoch(top) == i.epoch)
        i = {r->relocated_to, release_epoch(r->relocated_to), i.position};
  }
  return r;
}

std::vector<std::pair<int64_t, int64_t>> StateGroupPool::take_copies(std::span<const PendingSeq> seqs) {
  if (seqs.size() != pending_.size())
    bad_argument("seqs", static_cast<long long>(seqs.size()), "must give one entry per pending intent");
  // Each destination goes straight back to the free list as a checkpoint:
  // capacity-neutral, spent lazily by whoever pops it next. An intent whose
  // group was released since (its sequence preempted or finished, whether or
  // not forget_pending was called) or whose sequence moved is skipped.
  std::vector<uint8_t> consumed(pending_.size(), 0);
  for (const PendingSeq& p : seqs)
    if (p.seq >= pending_.size()) bad_argument("seqs seq", static_cast<long long>(p.seq), "out of range");
  for (size_t k = 0; k < pending_.size(); ++k) {
    const Intent& intent = pending_[k];
    const int64_t h = seqs[k].pending_checkpoint;
    const int64_t src = seqs[k].group;
    if (!intent_alive(intent) || consumed[seqs[k].seq]) continue;
    consumed[seqs[k].seq] = 1;
    if (h == -1 || src < 0 || src != intent.group) continue;
    if (!has_free()) {
      ++fates_.dropped;
      continue;
    }
    const int64_t dst = pop();
    put_back(dst);
    file_checkpoint(h, dst, intent.position);
    copies_.emplace_back(src, dst);
    ++fates_.kept;
  }
  pending_.clear();
  std::vector<std::pair<int64_t, int64_t>> out;
  out.swap(copies_);
  return out;
}

void StateGroupPool::record_copy(int64_t src, int64_t dst) {
  check_index("src", src, capacity());
  check_index("dst", dst, capacity());
  copies_.emplace_back(src, dst);
}

}  // namespace statecache
