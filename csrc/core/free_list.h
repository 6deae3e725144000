// The free-list core shared by StateSlotPool and StateGroupPool.
//
// Indices (slots or groups) of a preallocated state tensor. A free
// index is either vacant (nothing to lose; drawn first, lowest index first) or
// checkpointed (carries the state as of a hashed boundary; LRU, head spent
// first). Which half a free index is in follows from its hash alone, so every
// hash change of a free index goes through `set_hash`.
//
// Checkpointed indices are chained through prev/next fields of their own
// records, so unlinking one anywhere, moving it or swapping its index is O(1). The vacant half is a min-heap whose
// stale entries (claimed, or hashed since) are dropped when they surface.
//
// Public methods validate their arguments and throw before changing anything:
// std::out_of_range for an index outside the pool, std::invalid_argument for a
// value the protocol forbids (releasing a free index, a negative count).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/eviction_policy.h"
#include "core/hash_form.h"
#include "core/hash_index.h"

namespace statecache {

// What retire_top did; `relocated_to` is -1 when no bytes move.
struct Retirement {
  int64_t retired = -1;
  int64_t relocated_to = -1;
  bool held_checkpoint = false;
  bool operator==(const Retirement&) const = default;
};

// Cumulative fates of the checkpoints a pool was asked to keep.
struct CheckpointFates {
  int64_t kept = 0;      // filed
  int64_t dropped = 0;   // no free index to go to
  int64_t evicted = 0;   // filed, later spent on an allocation
  int64_t orphaned = 0;  // its KV prefix left the index first
};

struct Occupancy {
  int64_t total = 0;
  int64_t used = 0;
  int64_t held = 0;    // free and carrying a checkpoint
  int64_t vacant = 0;  // free and empty
};

class StateFreeList {
 public:
  // `kind` names the index in error messages ("slot", "group").
  StateFreeList(int64_t count, bool enabled, const char* kind);
  virtual ~StateFreeList() = default;

  // ---- capacity ---------------------------------------------------------
  int64_t size() const { return num_; }
  // Length of the hash array: grown by extend, never shrunk by retire_top.
  int64_t capacity() const { return static_cast<int64_t>(records_.size()); }
  bool enabled() const { return enabled_; }
  int64_t num_free() const { return free_count_; }
  bool has_free(int64_t count = 1) const;
  // Queries accept any index and answer false / 0 outside the pool.
  bool is_free(int64_t u) const { return in_capacity(u) && records_[idx(u)].free; }
  bool holds_checkpoint(int64_t u) const { return is_free(u) && records_[idx(u)].hash != -1; }
  // The hash index `u` carries, -1 for none; 0 <= u < capacity().
  int64_t hash_of(int64_t u) const { return records_[idx(u)].hash; }
  const HashIndex& index() const { return index_; }
  // The form the caller's hashes come in (core/hash_form.h).
  HashForm& hash_form() const { return hash_form_; }
  int64_t lookup(int64_t h) const { return enabled_ ? index_.get(h, -1) : -1; }

  // ---- free list --------------------------------------------------------
  // Vacant lowest-index first, else the LRU checkpoint (counted as evicted).
  // std::out_of_range when nothing is free.
  int64_t pop();
  // The index pop() would hand out now, or -1; changes nothing observable
  // (it only drops stale entries off the vacant heap).
  int64_t peek_pop();
  // Takes one specific free index off the list, hash and all.
  void claim(int64_t u);
  // Back to the half its hash puts it in; speculative checkpoints to the head.
  void release(int64_t u);
  // release() of each, every entry checked first (nothing released when one
  // fails); negative entries are skipped (a never-admitted request carries
  // -1) and an index listed twice is refused.
  void release_many(std::span<const int64_t> indices);
  void extend(int64_t count);
  // Gives up the top index; std::nullopt when it cannot go this pass. The
  // retired index keeps no hash and no index entry, so a later extend cannot
  // revive a stale hash -> index mapping.
  std::optional<Retirement> retire_top();

  // ---- checkpoint index -------------------------------------------------
  void invalidate(int64_t u);
  // Returns the index whose checkpoint was dropped, or -1.
  int64_t unindex(int64_t h);
  void clear_index();

  // ---- speculative marks ------------------------------------------------
  void mark_speculative(int64_t u);
  void promote(int64_t u);
  bool is_speculative(int64_t u) const { return in_capacity(u) && records_[idx(u)].spec; }

  // ---- eviction order (core/eviction_policy.h) ---------------------------
  // kLru (default) spends the LRU head; kCost ranks recency and value.
  // std::invalid_argument (nothing changed) for a bad model.
  void set_eviction_model(const EvictionCostModel& model);
  const EvictionCostModel& eviction_model() const { return eviction_.model(); }

  // ---- pins -------------------------------------------------------------
  void pin(int64_t u, bool reader_is_next_batch = false);
  bool is_pinned(int64_t u) const { return pin_count(u) > 0; }
  int64_t pin_count(int64_t u) const { return in_capacity(u) ? records_[idx(u)].pins : 0; }
  void unpin(int64_t u);
  void drop_reader(int64_t u);
  void release_pins();

  // ---- readings ---------------------------------------------------------
  const CheckpointFates& fates() const { return fates_; }
  Occupancy occupancy() const;

  // Resumable-hit scan shared by both pools: the largest L <= hit whose
  // boundary is checkpointed (or assumed so) and leaves the resuming forward
  // at least `min_fork_tokens`. `hash_at(i)` reads block i's hash lazily, so
  // a scan that stops early converts only what it read.
  template <class HashAt>
  int64_t scan_resumable(int64_t num_tokens, int64_t hit, int64_t min_fork_tokens, int64_t hash_block_size,
                         bool assume_checkpointed, HashAt&& hash_at) const {
    // The fork test (num_tokens - L * hbs >= min_fork_tokens) is monotone in
    // L: boundaries above `top` can never be the answer, those at or below
    // all pass it.
    int64_t room = 0;
    if (__builtin_sub_overflow(num_tokens, min_fork_tokens, &room) || room < 0) return 0;
    const int64_t top = std::min(hit, room / hash_block_size);
    if (assume_checkpointed) return top;
    if (index_.empty()) return 0;
    // Probe in chunks: read a chunk's hashes and start fetching their filter
    // bytes first, so the cache misses overlap instead of queueing.
    constexpr int64_t kChunk = 8;
    int64_t keys[kChunk];
    uint64_t mixed[kChunk];
    for (int64_t hi = top; hi >= 1; hi -= kChunk) {
      const int64_t n = std::min(kChunk, hi);
      for (int64_t k = 0; k < n; ++k) {
        keys[k] = hash_at(hi - 1 - k);
        mixed[k] = index_.prefetch(keys[k]);
      }
      for (int64_t k = 0; k < n; ++k)
        if (index_.contains(keys[k], mixed[k])) return hi - k;
    }
    return 0;
  }

  // ---- introspection (tests, debugging) ---------------------------------
  std::vector<int64_t> lru_order() const;
  std::vector<int64_t> pinned_indices() const;       // sorted
  std::vector<int64_t> deferred_indices() const;     // sorted
  std::vector<int64_t> speculative_indices() const;  // sorted
  // Throws InvariantError when a structural invariant is broken.
  void check_invariants() const;
  // Whether hash_to_index[h] == u implies index_hash[u] == h for every entry.
  // The reverse direction always holds; this one can break the way the
  // reference breaks it (extend re-adding a retired index that was live
  // with a hash), which the pools reproduce.
  // Always true since retire_top drops the retired index's entry (the
  // reference keeps it; see README, divergences); kept for the tests.
  bool index_is_exact() const;

  // Bumped each time the index goes back on the free list: something that
  // describes an index's bytes (a copy intent, a midstep reservation) records
  // it and is stale once it changed.
  uint32_t release_epoch(int64_t u) const { return records_[idx(u)].epoch; }

 protected:
  static size_t idx(int64_t u) { return static_cast<size_t>(u); }
  bool in_capacity(int64_t u) const { return u >= 0 && u < capacity(); }
  const std::string& kind() const { return kind_; }

  // Argument checks (throw before anything changes).
  void check_in_range(int64_t u) const;  // 0 <= u < size()
  void check_owned(int64_t u) const;     // in range, not free, not pinned
  void check_count(const char* name, int64_t count) const;
  void check_distinct(std::vector<int64_t> indices) const;  // none listed twice

  // Unchecked primitives, each a step of the reference's algorithm.
  int64_t take_vacant();
  void take_free(int64_t u);  // claim of an index known to be free
  void put_back(int64_t u);   // release of an index known to be owned
  void set_hash(int64_t u, int64_t h);
  void drop_hash(int64_t u);  // invalidate, unchecked
  // Files `u` under `h` (the reference's `_index`); no-op when disabled.
  // `position` (hash blocks, 0 unknown) is what the cost model ranks by.
  void file_checkpoint(int64_t h, int64_t u, int64_t position = 0);
  int64_t take_relocation_target(int64_t exclude);
  void rehome_checkpoint(int64_t src, int64_t dst);
  void set_free(int64_t u, bool free);

  CheckpointFates fates_;

 private:
  void grow_to(size_t n);
  void lru_push_back(int64_t u);
  void lru_push_front(int64_t u);
  void lru_remove(int64_t u);
  void lru_replace(int64_t old_u, int64_t new_u);
  void heap_push(int64_t u);
  void rebuild_vacant_heap();

  std::string kind_;
  bool enabled_;
  int64_t num_;
  int64_t free_count_ = 0;

  // Everything known about one index, in one record: the hot paths touch a
  // few indices at random, and one cache line each beats one per array.
  struct IndexRecord {
    int64_t hash = -1;  // checkpoint carried, -1 for none
    int32_t prev = -1;  // checkpointed-LRU links
    int32_t next = -1;
    int32_t pins = 0;  // readers holding it pinned
    // Flags and the release epoch share a word, keeping a record at 24 bytes.
    uint32_t free : 1 = 0;
    uint32_t spec : 1 = 0;  // a guess: filed at the LRU head
    uint32_t in_lru : 1 = 0;
    uint32_t deferred : 1 = 0;  // pinned for the batch the next pass builds
    // release_epoch, modulo 2**28: a record outlives at most a pass or two of
    // its index's releases, far fewer than a wrap.
    uint32_t epoch : 28 = 0;
  };
  static_assert(sizeof(IndexRecord) == 24);
  std::vector<IndexRecord> records_;
  HashIndex index_;

  std::vector<int64_t> vacant_heap_;  // min-heap, may hold stale entries

  // Checkpointed LRU: head is spent first.
  int64_t head_ = -1, tail_ = -1;
  int64_t lru_size_ = 0;
  CheckpointEvictionOrder eviction_;  // kept beside the LRU under kCost only
  // The checkpointed index to spend first, other than `exclude`; -1 if none.
  int64_t lru_victim(int64_t exclude) const;

  // Which indices are pinned, one bit each: release_pins walks them in index
  // order (as the reference's sorted()) without sorting.
  std::vector<uint64_t> pinned_bits_;
  int64_t pinned_count_ = 0;
  std::vector<int64_t> scratch_;  // reused by clear_index
  mutable HashForm hash_form_;
};

}  // namespace statecache
