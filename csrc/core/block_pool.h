// One pool of fixed-size blocks shared by the KV prefix cache and PAGE
// checkpoint units (docs/contract.md, "Objects").
//
// Free blocks sit on two intrusive lists: `fresh` (no content hash; a stack,
// so a block freed last is reused first while still in cache) and `cached`
// (still findable by hash, least recently freed first). Anything
// that takes blocks drains `fresh` before `cached`, so a cached prefix is
// spent only when nothing spare is left. A cached block leaving the hash
// index fires `on_evict(hash)` — after the pool is consistent again, because
// the handler may release units back into this pool.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/flat_map.h"
#include "core/hash_form.h"

namespace statecache {

// Who holds a block. Unit owners are opaque non-negative tokens; the kind of
// owner lives in the low two bits so the core can build the owners the
// reference uses without knowing about Python.
namespace owner_token {
inline constexpr int64_t kFree = -1;
inline constexpr int64_t kKv = -2;     // held by the KV cache, reference counted
inline constexpr int kCheckpoint = 1;  // ("state-checkpoint", checkpoint_id)
inline constexpr int kTransfer = 2;    // ("state-transfer", owner)
inline constexpr int kOther = 3;       // any other owner, interned by the caller
inline constexpr int64_t make(int kind, int64_t id) { return id * 4 + kind; }
inline constexpr int kind(int64_t token) { return static_cast<int>(token & 3); }
inline constexpr int64_t id(int64_t token) { return token >> 2; }
// Largest id a token can carry.
inline constexpr int64_t kMaxId = (int64_t{1} << 60);
}  // namespace owner_token

class BlockPool {
 public:
  using EvictCallback = std::function<void(int64_t hash)>;

  explicit BlockPool(int64_t num_blocks);
  virtual ~BlockPool() = default;

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks an allocation or reservation could take now (fresh + cached).
  int64_t num_free() const { return fresh_.size + cached_.size; }
  // Free blocks still findable by hash.
  int64_t num_cached() const { return cached_.size; }
  // Blocks held by the KV cache (reference count > 0).
  int64_t num_kv_blocks() const { return kv_blocks_; }
  // Blocks held as units by some owner.
  int64_t num_reserved() const { return reserved_; }

  void set_on_evict(EvictCallback cb) { on_evict_ = std::move(cb); }

  // ---- page units ----
  // `count` free blocks for `owner` (a token >= 0), or nothing at all when
  // fewer are free.
  bool reserve_units(int64_t count, int64_t owner, std::vector<int64_t>& out);
  // Every unit must be held by `owner` (each listed once); checked before any
  // change, std::invalid_argument / std::out_of_range otherwise.
  void release_units(const std::vector<int64_t>& units, int64_t owner);
  void rekey_units(const std::vector<int64_t>& units, int64_t old_owner, int64_t new_owner);
  // Starts loading the listed blocks' records ahead of a release (a hint;
  // ids out of range are skipped).
  void prefetch_units(const std::vector<int64_t>& units) const {
    for (int64_t u : units)
      if (u >= 0 && u < num_blocks()) __builtin_prefetch(&blocks_[static_cast<size_t>(u)]);
  }
  // owner_token::kFree, kKv or the unit owner's token.
  int64_t owner_of(int64_t block) const;
  // Units `owner` holds now; 0 for checkpoint owners, whose store counts them.
  int64_t units_held(int64_t owner) const;

  // ---- KV cache ----
  // `count` blocks with reference count 1, or nothing when fewer are free.
  bool allocate(int64_t count, std::vector<int64_t>& out);
  // Drops one reference per listed block (a block may be listed as often as
  // it is referenced). A block reaching zero becomes free; a hashed one stays
  // findable until it is handed out again.
  void free(const std::vector<int64_t>& blocks);
  // Takes one more reference per listed block: a held block, or a free block
  // that still carries its hash (a prefix hit), which leaves the free list.
  void incref(const std::vector<int64_t>& blocks);
  // The block holding `hash` (held or cached), or -1.
  int64_t lookup(int64_t hash) const;
  // Files a full KV block under `hash`. False when another block already
  // holds that hash (this one stays unhashed); ValueError when the block is
  // not held by the KV cache or already carries a different hash.
  bool publish(int64_t block, int64_t hash);
  int64_t block_hash(int64_t block) const;
  int64_t ref_count(int64_t block) const;
  // Drops every hash from the index, firing on_evict for each. Returns how many.
  int64_t reset_prefix_cache();

  // Checks every internal invariant; InvariantError on the first broken one.
  void check_consistency() const;

  // The form the caller's block hashes come in (core/hash_form.h).
  HashForm& hash_form() const { return hash_form_; }

 private:
  mutable HashForm hash_form_;
  struct List {
    int32_t head = -1, tail = -1;
    int64_t size = 0;
  };
  static constexpr int64_t kNoHash = -1;
  static constexpr int64_t kChecking = -3;  // transient mark in check_units

  void push_back(List& l, int32_t b);
  void push_front(List& l, int32_t b);
  void unlink(List& l, int32_t b);
  // Takes one free block (fresh first); records a dropped hash in `evicted`.
  int32_t take_free(std::vector<int64_t>& evicted);
  void check_block(int64_t block, const char* name) const;
  void check_units(const std::vector<int64_t>& units, int64_t owner, const char* name);
  void adjust_held(int64_t owner, int64_t delta);
  void notify(const std::vector<int64_t>& evicted);

  // Everything about one block in one place: a unit's release touches one
  // cache line, not six arrays.
  struct Block {
    int64_t owner = owner_token::kFree;
    int64_t hash = kNoHash;
    int32_t prev = -1, next = -1;
    int32_t refs = 0;
    uint8_t list = 0;  // 0 none, 1 fresh, 2 cached
  };
  std::vector<Block> blocks_;
  List fresh_, cached_;
  FlatInt64Map<int32_t> index_;  // hash -> block
  FlatInt64Map<int64_t> held_;   // owner token -> units held
  int64_t kv_blocks_ = 0;
  int64_t reserved_ = 0;
  EvictCallback on_evict_;
  mutable std::vector<uint32_t> seen_;  // scratch for duplicate checks
  mutable std::vector<int32_t> seen_count_;
  mutable uint32_t seen_epoch_ = 0;
};

}  // namespace statecache
