// Which hashes a tier below GPU memory holds, and its load bookkeeping
// (docs/contract.md, "Tiers"). Membership is optimistic — "was stored once" — and capped as
// an LRU; a load that finds the entry missing retracts it.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/hash_form.h"

namespace statecache {

// What the PAGE coordinator asks a tier when capping a hit.
class OffloadVote {
 public:
  virtual ~OffloadVote() = default;
  virtual bool could_serve(int64_t prefix_hash) const = 0;
};

struct OffloadStats {
  int64_t stores_attempted = 0;
  int64_t stores_completed = 0;
  int64_t stores_failed = 0;
  int64_t stores_untrusted = 0;
  int64_t loads_attempted = 0;
  int64_t loads_completed = 0;
  int64_t loads_failed = 0;
  int64_t loads_missing = 0;
  int64_t loads_abandoned = 0;
  int64_t loads_untrusted = 0;  // copies that failed their key or checksum check
  int64_t evicted = 0;
};

class StateOffloadIndex : public OffloadVote {
 public:
  explicit StateOffloadIndex(bool can_store = true, bool can_load = true,
                             std::optional<int64_t> capacity = std::nullopt);

  bool can_store() const { return can_store_; }
  bool can_load() const { return can_load_; }
  std::optional<int64_t> capacity() const { return capacity_; }

  bool contains(int64_t prefix_hash) const { return where_.count(prefix_hash) != 0; }
  int64_t size() const { return static_cast<int64_t>(where_.size()); }
  // Least recently stored or loaded first.
  std::vector<int64_t> hashes() const { return {lru_.begin(), lru_.end()}; }
  bool could_serve(int64_t prefix_hash) const override { return can_load_ && contains(prefix_hash); }

  // ---- store side ----
  void note_store_started(int64_t prefix_hash);
  // The tier now holds `prefix_hash` (most recently used); the least recently
  // used entry beyond the capacity is forgotten.
  void note_stored(int64_t prefix_hash);
  // A store that wrote nothing usable; `untrusted` when its source was
  // reclaimed under it (docs/contract.md, "Tiers": never indexed).
  void note_store_failed(int64_t prefix_hash, bool untrusted = false);
  bool forget(int64_t prefix_hash);

  // ---- load side ----
  // Starts a load when the tier could serve it; false otherwise.
  bool request_load(int64_t prefix_hash);
  void complete_load(int64_t prefix_hash);
  // A load that failed; forgets the hash only when the tier reported it
  // missing. `untrusted`: a copy failed its key or checksum check (docs/contract.md, "Tiers").
  void fail_load(int64_t prefix_hash, bool missing = false, bool untrusted = false);
  void abandon_load(int64_t prefix_hash);
  int64_t loads_in_flight() const { return in_flight_total_; }

  const OffloadStats& stats() const { return stats_; }
  // The form the caller's hashes come in (core/hash_form.h).
  HashForm& hash_form() const { return hash_form_; }

 private:
  mutable HashForm hash_form_;
  void end_load(int64_t prefix_hash);  // std::invalid_argument when none in flight
  void touch(int64_t prefix_hash);

  bool can_store_, can_load_;
  std::optional<int64_t> capacity_;
  std::list<int64_t> lru_;
  std::unordered_map<int64_t, std::list<int64_t>::iterator> where_;
  std::unordered_map<int64_t, int64_t> loading_;
  int64_t in_flight_total_ = 0;
  OffloadStats stats_;
};

}  // namespace statecache
