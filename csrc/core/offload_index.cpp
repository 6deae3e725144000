#include "core/offload_index.h"

#include "core/errors.h"

namespace statecache {

StateOffloadIndex::StateOffloadIndex(bool can_store, bool can_load, std::optional<int64_t> capacity)
    : can_store_(can_store), can_load_(can_load), capacity_(capacity) {
  if (capacity_ && *capacity_ < 0) bad_argument("capacity", *capacity_, "must be >= 0 or None");
}

void StateOffloadIndex::touch(int64_t prefix_hash) {
  auto it = where_.find(prefix_hash);
  if (it != where_.end()) lru_.splice(lru_.end(), lru_, it->second);
}

void StateOffloadIndex::note_store_started(int64_t) { ++stats_.stores_attempted; }

void StateOffloadIndex::note_stored(int64_t prefix_hash) {
  ++stats_.stores_completed;
  auto it = where_.find(prefix_hash);
  if (it != where_.end()) {
    lru_.splice(lru_.end(), lru_, it->second);
  } else {
    lru_.push_back(prefix_hash);
    where_.emplace(prefix_hash, std::prev(lru_.end()));
  }
  while (capacity_ && static_cast<int64_t>(where_.size()) > *capacity_) {
    where_.erase(lru_.front());
    lru_.pop_front();
    ++stats_.evicted;
  }
}

void StateOffloadIndex::note_store_failed(int64_t, bool untrusted) {
  ++(untrusted ? stats_.stores_untrusted : stats_.stores_failed);
}

bool StateOffloadIndex::forget(int64_t prefix_hash) {
  auto it = where_.find(prefix_hash);
  if (it == where_.end()) return false;
  lru_.erase(it->second);
  where_.erase(it);
  return true;
}

bool StateOffloadIndex::request_load(int64_t prefix_hash) {
  if (!could_serve(prefix_hash)) return false;
  ++stats_.loads_attempted;
  ++loading_[prefix_hash];
  ++in_flight_total_;
  return true;
}

void StateOffloadIndex::end_load(int64_t prefix_hash) {
  auto it = loading_.find(prefix_hash);
  if (it == loading_.end()) bad_argument("prefix_hash", prefix_hash, "has no load in flight");
  if (--it->second == 0) loading_.erase(it);
  --in_flight_total_;
}

void StateOffloadIndex::complete_load(int64_t prefix_hash) {
  end_load(prefix_hash);
  ++stats_.loads_completed;
  touch(prefix_hash);
}

void StateOffloadIndex::fail_load(int64_t prefix_hash, bool missing, bool untrusted) {
  end_load(prefix_hash);
  ++stats_.loads_failed;
  if (untrusted) ++stats_.loads_untrusted;
  if (missing) {
    ++stats_.loads_missing;
    forget(prefix_hash);
  }
}

void StateOffloadIndex::abandon_load(int64_t prefix_hash) {
  end_load(prefix_hash);
  ++stats_.loads_abandoned;
}

}  // namespace statecache
