// Bookkeeping of the host tier's pinned arena (docs/contract.md, "Tiers").
//
// The arena is `num_entries` fixed-size entries (one page unit each) in one
// host buffer the caller owns; this class decides which entries hold what.
// A value (a checkpoint image or a KV block) takes `count` entries, is filed
// under its full tier key, and belongs to a class (state images, KV blocks).
// By default the classes share the arena's one byte budget and compete in one
// ranking; a class given a budget is capped at it (capped budgets must fit
// the arena together, so capped classes never crowd each other out).
//
// Lifecycle: allocate (writing: invisible, never evicted) -> seal (findable,
// rankable) -> remove or evict. Readers pin a sealed value; a pinned value is
// never evicted, and one removed while pinned goes back at the last unpin.
//
// Eviction ranks with the cost model the GPU caches use
// (core/eviction_policy.h: recency + weight x prefill FLOPs a hit at the
// value's position saves per byte), over all values (room in the arena) and
// per class (room under a class's cap). A value is filed with its `position`
// (in the model's position unit): for a state image where its prefix ends,
// for a KV block where the deepest state it leads to ends (the caller's
// choice; `refile` moves it), so a chain ranks no lower than what it serves.
// With `kv_bytes_per_position` set, the value is per byte of the whole prefix
// (state + KV). The 'lru' model ranks by recency alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/eviction_policy.h"

namespace statecache {

class HostArena {
 public:
  struct Value {
    std::vector<int32_t> entries;
    int64_t nbytes = 0;
    int64_t position = 0;
    int klass = 0;
    std::string meta;  // opaque to the arena (the tier keeps its header here)
  };

  struct ClassStats {
    int64_t budget_entries = 0;
    int64_t used_entries = 0;
    int64_t values = 0;
    int64_t evictions = 0;
    int64_t refused = 0;  // allocations that could not be made
  };

  // `class_budget_bytes[c]` caps class c (kShared: no cap, the class takes
  // what the arena has room for); the caps must fit the arena together.
  // `model` ranks every class (validated; std::invalid_argument naming the field).
  HostArena(int64_t entry_bytes, int64_t capacity_bytes, std::vector<int64_t> class_budget_bytes,
            const EvictionCostModel& model = cost_model());

  // The default: kCost, value = the position itself.
  static constexpr int64_t kShared = -1;

  static EvictionCostModel cost_model() {
    EvictionCostModel m;
    m.kind = EvictionCostModel::Kind::kCost;
    return m;
  }

  int64_t entry_bytes() const { return entry_bytes_; }
  int64_t num_entries() const { return num_entries_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int num_classes() const { return static_cast<int>(classes_.size()); }
  const EvictionCostModel& eviction_model() const { return model_; }
  // Installs a validated model (nothing changed on a bad one) and re-ranks
  // every class in its current order.
  void set_eviction_model(const EvictionCostModel& model);
  // KV bytes per position of a prefix (>= 0, finite): values rank per byte of
  // their whole prefix (see eviction_policy.h). Kept across set_eviction_model.
  void set_kv_bytes_per_position(double bytes);
  double kv_bytes_per_position() const { return kv_bytes_per_position_; }
  const ClassStats& class_stats(int klass) const;
  bool capped(int klass) const;

  // Keys `allocate` would evict to fit `count` entries in `klass`, in order;
  // nullopt when even evicting every unpinned sealed value would not do.
  std::optional<std::vector<std::string>> victims(int klass, int64_t count) const;
  // Reserves entries for `key` (which must not be filed), evicting victims as
  // `victims` lists them (their keys appended to `evicted`). nullopt, nothing
  // changed, when it cannot.
  std::optional<std::vector<int32_t>> allocate(const std::string& key, int klass, int64_t count, int64_t nbytes,
                                               int64_t position, std::vector<std::string>* evicted);
  // allocate() of each key in order (a step's saves, one call), each with its
  // count, nbytes and position; a key already filed, or one whose entries
  // cannot be had, gets nullopt and the rest go on. The arguments are checked
  // first: nothing changes on a bad one.
  std::vector<std::optional<std::vector<int32_t>>> allocate_many(const std::vector<std::string>& keys, int klass,
                                                                 const std::vector<int64_t>& counts,
                                                                 const std::vector<int64_t>& nbytes,
                                                                 const std::vector<int64_t>& positions,
                                                                 std::vector<std::string>* evicted);
  // A written value becomes findable.
  void seal(const std::string& key, std::string meta);
  // seal() of each key with its meta, in one call; the keys are checked first
  // (each allocated, not sealed, not twice): nothing changes on a bad one.
  void seal_many(const std::vector<std::string>& keys, std::vector<std::string> metas);
  // Files a sealed value at a new position, as a use (newest in the ranking;
  // a pinned one ranks there at its last unpin). False when absent.
  bool refile(const std::string& key, int64_t position);
  // Drops a value (written or sealed); false when absent. A pinned value is
  // hidden now and its entries return at the last unpin.
  bool remove(const std::string& key);

  bool contains(const std::string& key) const;  // sealed and not removed
  // contains() of each key, in one call (a resume checks a whole chain);
  // `touch`: each one found counts as a use, as lookup(key, true).
  std::vector<bool> contains_many(const std::vector<std::string>& keys, bool touch = false);
  // refile() of each key at its position (the positions are checked first:
  // nothing changes on a bad one); how many were there.
  int64_t refile_many(const std::vector<std::string>& keys, const std::vector<int64_t>& positions);
  // Bumped whenever what contains() answers may have changed (a seal, a
  // remove, an eviction), so an answer derived from it holds while this is
  // unchanged.
  uint64_t generation() const { return generation_; }
  // A sealed value, refreshed as used; nullptr when absent.
  const Value* lookup(const std::string& key, bool touch = true);
  void pin(const std::string& key);
  void unpin(const std::string& key);
  int64_t pins(const std::string& key) const;
  std::vector<std::string> keys() const;  // sealed values, any order
  void check_consistency() const;

 private:
  struct Slot {
    Value v;
    std::string key;
    bool live = false;
    bool sealed = false;
    bool doomed = false;  // removed while pinned
    int64_t pins = 0;
  };

  const Slot* find(const std::string& key) const;
  Slot* find(const std::string& key);
  bool rankable(const Slot& s) const { return s.live && s.sealed && !s.doomed && s.pins == 0; }
  void rank(int32_t idx);
  void unrank(int32_t idx);
  EvictionCostModel order_model(const EvictionCostModel& m) const;
  void release(int32_t idx);
  void check_class(int klass) const;

  int64_t entry_bytes_, num_entries_;
  EvictionCostModel model_;
  double kv_bytes_per_position_ = 0.0;
  uint64_t generation_ = 0;
  std::vector<ClassStats> classes_;
  std::vector<int32_t> free_;
  std::vector<Slot> slab_;
  std::vector<int32_t> free_slots_;
  std::unordered_map<std::string, int32_t> index_;
  std::vector<bool> capped_;
  // Sealed, unpinned values: all of them (room in the arena) and per class
  // (room under a class's cap), each in its own recency order.
  CheckpointEvictionOrder ranked_all_;
  std::vector<CheckpointEvictionOrder> ranked_;
};

}  // namespace statecache
