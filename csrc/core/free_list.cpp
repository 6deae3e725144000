#include "core/free_list.h"

#include <algorithm>
#include <climits>
#include <functional>

#include "core/errors.h"

namespace statecache {

StateFreeList::StateFreeList(int64_t count, bool enabled, const char* kind)
    : kind_(kind), enabled_(enabled && count > 0), num_(count) {
  if (count < 0) bad_argument(("num_" + kind_ + "s").c_str(), count, "must be >= 0");
  grow_to(static_cast<size_t>(count));
  index_.reserve(static_cast<size_t>(count));
  vacant_heap_.reserve(2 * static_cast<size_t>(count) + 4);
  for (int64_t u = 0; u < count; ++u) {
    records_[idx(u)].free = 1;
    vacant_heap_.push_back(u);  // ascending order is already a min-heap
  }
  free_count_ = count;
}

void StateFreeList::grow_to(size_t n) {
  if (n <= records_.size()) return;
  // Indices are stored as int32 in the per-index records.
  if (n > static_cast<size_t>(INT32_MAX))
    bad_argument(("num_" + kind_ + "s").c_str(), static_cast<long long>(n), "exceeds 2**31 - 1");
  records_.resize(n);
  pinned_bits_.resize((n + 63) / 64, 0);
}

// ---- argument checks ------------------------------------------------------

void StateFreeList::check_in_range(int64_t u) const { check_index(kind_.c_str(), u, num_); }

void StateFreeList::check_owned(int64_t u) const {
  check_in_range(u);
  if (records_[idx(u)].free) bad_argument(kind_.c_str(), u, "is already free");
  if (records_[idx(u)].pins > 0)
    bad_argument(kind_.c_str(), u, "is pinned (a forward still reads it); drop_reader or unpin it first");
}

void StateFreeList::check_count(const char* name, int64_t count) const {
  if (count < 0) bad_argument(name, count, "must be >= 0");
}

// ---- LRU (intrusive list) -------------------------------------------------

void StateFreeList::lru_push_back(int64_t u) {
  records_[idx(u)].prev = tail_;
  records_[idx(u)].next = -1;
  if (tail_ >= 0)
    records_[idx(tail_)].next = u;
  else
    head_ = u;
  tail_ = u;
  records_[idx(u)].in_lru = 1;
  ++lru_size_;
  eviction_.push(u, false);
}

void StateFreeList::lru_push_front(int64_t u) {
  records_[idx(u)].next = head_;
  records_[idx(u)].prev = -1;
  if (head_ >= 0)
    records_[idx(head_)].prev = u;
  else
    tail_ = u;
  head_ = u;
  records_[idx(u)].in_lru = 1;
  ++lru_size_;
  eviction_.push(u, true);  // only guesses go to the head
}

void StateFreeList::lru_remove(int64_t u) {
  check_invariant(records_[idx(u)].in_lru, "removing an index that is not on the checkpointed list");
  const int64_t p = records_[idx(u)].prev, n = records_[idx(u)].next;
  if (p >= 0)
    records_[idx(p)].next = n;
  else
    head_ = n;
  if (n >= 0)
    records_[idx(n)].prev = p;
  else
    tail_ = p;
  records_[idx(u)].prev = records_[idx(u)].next = -1;
  records_[idx(u)].in_lru = 0;
  --lru_size_;
  eviction_.remove(u);
}

void StateFreeList::lru_replace(int64_t old_u, int64_t new_u) {
  const int64_t p = records_[idx(old_u)].prev, n = records_[idx(old_u)].next;
  records_[idx(new_u)].prev = p;
  records_[idx(new_u)].next = n;
  if (p >= 0)
    records_[idx(p)].next = new_u;
  else
    head_ = new_u;
  if (n >= 0)
    records_[idx(n)].prev = new_u;
  else
    tail_ = new_u;
  records_[idx(old_u)].prev = records_[idx(old_u)].next = -1;
  records_[idx(old_u)].in_lru = 0;
  records_[idx(new_u)].in_lru = 1;
  eviction_.replace(old_u, new_u);
}

int64_t StateFreeList::lru_victim(int64_t exclude) const {
  if (eviction_.active()) return eviction_.victim([exclude](int64_t u) { return u != exclude; });
  for (int64_t c = head_; c >= 0; c = records_[idx(c)].next)
    if (c != exclude) return c;
  return -1;
}

void StateFreeList::set_eviction_model(const EvictionCostModel& model) {
  // Oldest first, so the new order starts with the ages the list had.
  eviction_.reset_model(model, [this](auto&& push) {
    for (int64_t u = head_; u >= 0; u = records_[idx(u)].next) push(u, records_[idx(u)].spec != 0);
  });
}

// ---- vacant heap ----------------------------------------------------------

void StateFreeList::heap_push(int64_t u) {
  vacant_heap_.push_back(u);
  std::push_heap(vacant_heap_.begin(), vacant_heap_.end(), std::greater<>());
}

void StateFreeList::rebuild_vacant_heap() {
  vacant_heap_.clear();
  for (size_t u = 0; u < records_.size(); ++u)
    if (records_[u].free && records_[u].hash == -1) vacant_heap_.push_back(static_cast<int64_t>(u));
  // Ascending order is a valid min-heap.
}

int64_t StateFreeList::take_vacant() {
  while (!vacant_heap_.empty()) {
    std::pop_heap(vacant_heap_.begin(), vacant_heap_.end(), std::greater<>());
    const int64_t u = vacant_heap_.back();
    vacant_heap_.pop_back();
    if (records_[idx(u)].free && records_[idx(u)].hash == -1) {
      set_free(u, false);
      return u;
    }
  }
  return -1;
}

// ---- free list ------------------------------------------------------------

void StateFreeList::set_free(int64_t u, bool free) {
  if (static_cast<bool>(records_[idx(u)].free) == free) return;
  records_[idx(u)].free = free ? 1 : 0;
  free_count_ += free ? 1 : -1;
}

bool StateFreeList::has_free(int64_t count) const {
  check_count("count", count);
  return free_count_ >= count;
}

int64_t StateFreeList::pop() {
  if (free_count_ == 0) throw std::out_of_range("pop from an empty " + kind_ + " pool: nothing is free");
  int64_t u = take_vacant();
  if (u < 0) {
    u = lru_victim(-1);
    lru_remove(u);
    set_free(u, false);
    ++fates_.evicted;
  }
  // A guess is spent with its index; the re-file inside file_checkpoint must
  // not clear a mark that was only just made, so this is not in drop_hash.
  records_[idx(u)].spec = 0;
  drop_hash(u);
  return u;
}

int64_t StateFreeList::peek_pop() {
  if (free_count_ == 0) return -1;
  while (!vacant_heap_.empty()) {
    const int64_t u = vacant_heap_.front();
    if (records_[idx(u)].free && records_[idx(u)].hash == -1) return u;
    std::pop_heap(vacant_heap_.begin(), vacant_heap_.end(), std::greater<>());
    vacant_heap_.pop_back();
  }
  return lru_victim(-1);
}

void StateFreeList::claim(int64_t u) {
  check_in_range(u);
  if (!records_[idx(u)].free) bad_argument(kind_.c_str(), u, "is not free, so it cannot be claimed");
  take_free(u);
}

void StateFreeList::take_free(int64_t u) {
  set_free(u, false);
  if (records_[idx(u)].hash != -1) lru_remove(u);
}

void StateFreeList::release(int64_t u) {
  check_owned(u);
  put_back(u);
}

void StateFreeList::release_many(std::span<const int64_t> indices) {
  std::vector<int64_t> real;
  real.reserve(indices.size());
  for (int64_t u : indices) {
    if (u < 0) continue;
    check_owned(u);
    real.push_back(u);
  }
  check_distinct(real);
  for (int64_t u : real) put_back(u);
}

void StateFreeList::check_distinct(std::vector<int64_t> indices) const {
  // The second release would be a release of a free index.
  std::sort(indices.begin(), indices.end());
  auto dup = std::adjacent_find(indices.begin(), indices.end());
  if (dup != indices.end()) bad_argument(kind_.c_str(), *dup, "is listed twice");
}

void StateFreeList::put_back(int64_t u) {
  ++records_[idx(u)].epoch;
  set_free(u, true);
  if (records_[idx(u)].hash != -1) {
    if (records_[idx(u)].spec)
      lru_push_front(u);
    else
      lru_push_back(u);
    return;
  }
  records_[idx(u)].spec = 0;
  heap_push(u);
  // Indices hashed while vacant leave stale entries; rebuilding once the heap
  // is twice the pool keeps it bounded at amortized O(1) per push.
  if (static_cast<int64_t>(vacant_heap_.size()) > 2 * num_ + 2) rebuild_vacant_heap();
}

void StateFreeList::set_hash(int64_t u, int64_t h) {
  if (!records_[idx(u)].free) {
    records_[idx(u)].hash = h;
    return;
  }
  take_free(u);
  records_[idx(u)].hash = h;
  put_back(u);
}

void StateFreeList::extend(int64_t count) {
  check_count("count", count);
  // Indices are int32 in the index records; checked before the add can overflow.
  if (count > static_cast<int64_t>(INT32_MAX) - num_)
    bad_argument("count", count, ("would take the pool past 2**31 - 1 " + kind_ + "s").c_str());
  grow_to(static_cast<size_t>(num_ + count));
  for (int64_t u = num_; u < num_ + count; ++u) {
    // retire_top left the index without a hash; a retired index filed
    // elsewhere since cannot be named by the index either.
    check_invariant(records_[idx(u)].hash == -1, "a retired index still carries a hash");
    put_back(u);
  }
  num_ += count;
}

std::optional<Retirement> StateFreeList::retire_top() {
  const int64_t top = num_ - 1;
  if (top < 0 || is_pinned(top)) return std::nullopt;
  const bool held = holds_checkpoint(top);
  if (records_[idx(top)].free && !held) {
    take_free(top);
    --num_;
    return Retirement{top, -1, false};
  }
  const int64_t dst = take_relocation_target(top);
  if (dst < 0 && !held) return std::nullopt;
  if (dst < 0) {
    // Nothing else is free: the top is the only checkpoint left, and LRU
    // would spend it anyway.
    take_free(top);
    drop_hash(top);
  } else if (held) {
    rehome_checkpoint(top, dst);
  } else {
    // An owned top that still carries a hash (a claimed checkpoint): its
    // owner moves to dst, the index entry would outlive the index. The
    // reference keeps it and a later extend revives it (README, divergences).
    drop_hash(top);
  }
  --num_;
  return Retirement{top, dst, held};
}

int64_t StateFreeList::take_relocation_target(int64_t exclude) {
  const int64_t u = take_vacant();
  if (u >= 0) return u;
  const int64_t c = lru_victim(exclude);
  if (c < 0) return -1;
  take_free(c);
  drop_hash(c);
  return c;
}

void StateFreeList::rehome_checkpoint(int64_t src, int64_t dst) {
  // Keeps the LRU position: only the address changed, not the use.
  const int64_t h = records_[idx(src)].hash;
  lru_replace(src, dst);
  set_free(src, false);
  set_free(dst, true);
  records_[idx(src)].hash = -1;
  records_[idx(dst)].hash = h;
  index_.set(h, dst);
}

// ---- checkpoint index -----------------------------------------------------

void StateFreeList::file_checkpoint(int64_t h, int64_t u, int64_t position) {
  if (!enabled_) return;
  drop_hash(u);
  eviction_.set_position(u, position);
  const int64_t prev = index_.exchange(h, u, -1);
  set_hash(u, h);
  // The index that held `h` before is orphaned; clear only its back-pointer,
  // the entry just written must stay.
  if (prev != -1 && prev != u) set_hash(prev, -1);
}

void StateFreeList::drop_hash(int64_t u) {
  if (!enabled_) return;
  const int64_t h = records_[idx(u)].hash;
  if (h == -1) return;
  set_hash(u, -1);
  const int64_t* at = index_.find(h);
  if (at && *at == u) index_.erase(h);
}

void StateFreeList::invalidate(int64_t u) {
  check_index(kind_.c_str(), u, capacity());
  drop_hash(u);
}

int64_t StateFreeList::unindex(int64_t h) {
  const int64_t u = index_.get(h, -1);
  if (u < 0) return -1;
  drop_hash(u);
  ++fates_.orphaned;
  return u;
}

void StateFreeList::clear_index() {
  scratch_.clear();
  index_.for_each([this](int64_t, int64_t u) { scratch_.push_back(u); });
  for (int64_t u : scratch_) drop_hash(u);
}

// ---- speculative marks ----------------------------------------------------

void StateFreeList::mark_speculative(int64_t u) {
  check_in_range(u);
  if (enabled_) records_[idx(u)].spec = 1;
}

void StateFreeList::promote(int64_t u) {
  if (!enabled_ || !is_speculative(u)) return;
  records_[idx(u)].spec = 0;
  if (records_[idx(u)].free && records_[idx(u)].hash != -1) {
    lru_remove(u);
    lru_push_back(u);
  }
}

// ---- pins -----------------------------------------------------------------

void StateFreeList::pin(int64_t u, bool reader_is_next_batch) {
  check_in_range(u);
  // A pinned index must never be handed out, so it cannot sit on the free list.
  if (records_[idx(u)].free) bad_argument(kind_.c_str(), u, "is free; claim it before pinning it");
  if (records_[idx(u)].pins++ == 0) {
    pinned_bits_[idx(u) / 64] |= uint64_t{1} << (idx(u) % 64);
    ++pinned_count_;
  }
  if (reader_is_next_batch) records_[idx(u)].deferred = 1;
}

void StateFreeList::unpin(int64_t u) {
  if (!in_capacity(u)) return;
  IndexRecord& x = records_[idx(u)];
  if (x.pins > 1) {
    --x.pins;
    return;
  }
  if (x.pins == 1) {
    pinned_bits_[idx(u) / 64] &= ~(uint64_t{1} << (idx(u) % 64));
    --pinned_count_;
  }
  x.pins = 0;
  x.deferred = 0;
}

void StateFreeList::drop_reader(int64_t u) {
  if (u < 0 || !is_pinned(u)) return;
  unpin(u);
  if (!is_pinned(u)) put_back(u);
}

void StateFreeList::release_pins() {
  if (pinned_count_ == 0) return;
  for (size_t w = 0; w < pinned_bits_.size(); ++w) {
    for (uint64_t bits = pinned_bits_[w]; bits != 0; bits &= bits - 1) {
      const int64_t u = static_cast<int64_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(bits)));
      IndexRecord& x = records_[idx(u)];
      // A deferred pin is read by the batch this pass builds: keep it one more.
      if (x.deferred) {
        x.deferred = 0;
        continue;
      }
      x.pins = 1;
      unpin(u);
      put_back(u);
    }
  }
}

// ---- readings -------------------------------------------------------------

Occupancy StateFreeList::occupancy() const {
  return Occupancy{num_, num_ - free_count_, lru_size_, free_count_ - lru_size_};
}

std::vector<int64_t> StateFreeList::lru_order() const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(lru_size_));
  for (int64_t u = head_; u >= 0; u = records_[idx(u)].next) out.push_back(u);
  return out;
}

std::vector<int64_t> StateFreeList::pinned_indices() const {
  std::vector<int64_t> out;
  for (size_t u = 0; u < records_.size(); ++u)
    if (records_[u].pins > 0) out.push_back(static_cast<int64_t>(u));
  return out;
}

std::vector<int64_t> StateFreeList::deferred_indices() const {
  std::vector<int64_t> out;
  for (size_t u = 0; u < records_.size(); ++u)
    if (records_[u].deferred) out.push_back(static_cast<int64_t>(u));
  return out;
}

std::vector<int64_t> StateFreeList::speculative_indices() const {
  std::vector<int64_t> out;
  for (size_t u = 0; u < records_.size(); ++u)
    if (records_[u].spec) out.push_back(static_cast<int64_t>(u));
  return out;
}

bool StateFreeList::index_is_exact() const {
  bool exact = true;
  index_.for_each([&](int64_t h, int64_t u) {
    if (!in_capacity(u) || records_[idx(u)].hash != h) exact = false;
  });
  return exact;
}

void StateFreeList::check_invariants() const {
  const size_t cap = records_.size();
  int64_t free_seen = 0;
  for (size_t u = 0; u < cap; ++u) {
    if (records_[u].free) {
      ++free_seen;
      check_invariant(static_cast<int64_t>(u) < num_, "a free index lies past the top of the pool");
      check_invariant(records_[u].pins == 0, "a pinned index is on the free list");
    }
    // Free with a hash <=> on the checkpointed list.
    check_invariant(static_cast<bool>(records_[u].in_lru) == (records_[u].free && records_[u].hash != -1),
                    "checkpointed list membership disagrees with free/hash");
    if (records_[u].deferred) check_invariant(records_[u].pins > 0, "a deferred index is not pinned");
    check_invariant(records_[u].pins >= 0, "negative pin count");
    if (records_[u].hash != -1) {
      check_invariant(enabled_, "a disabled pool carries a hash");
      check_invariant(index_.get(records_[u].hash, -2) == static_cast<int64_t>(u),
                      "index_hash names a hash the index files elsewhere");
    }
  }
  check_invariant(free_seen == free_count_, "free count is out of step");

  int64_t walked = 0, prev = -1;
  for (int64_t u = head_; u >= 0; u = records_[idx(u)].next) {
    check_invariant(records_[idx(u)].prev == prev, "checkpointed list back-link broken");
    check_invariant(++walked <= lru_size_, "checkpointed list longer than its size");
    prev = u;
  }
  check_invariant(walked == lru_size_ && tail_ == prev, "checkpointed list size or tail wrong");
  if (eviction_.active()) {
    check_invariant(eviction_.size() == lru_size_, "cost order and checkpointed list disagree in size");
    for (int64_t u = head_; u >= 0; u = records_[idx(u)].next)
      check_invariant(eviction_.contains(u), "a checkpointed index is missing from the cost order");
  }

  // Every free vacant index must still have a heap entry, or pop would miss it.
  std::vector<uint8_t> in_heap(cap, 0);
  for (int64_t u : vacant_heap_) in_heap[idx(u)] = 1;
  for (size_t u = 0; u < cap; ++u)
    if (records_[u].free && records_[u].hash == -1)
      check_invariant(in_heap[u], "a vacant index is missing from the heap");

  int64_t pinned_seen = 0;
  for (size_t u = 0; u < cap; ++u) {
    const bool bit = (pinned_bits_[u / 64] >> (u % 64)) & 1;
    check_invariant(bit == (records_[u].pins > 0), "pinned bitset out of step with pin counts");
    pinned_seen += bit;
  }
  check_invariant(pinned_seen == pinned_count_, "pin count total out of step");
  // Index side: hash_to_index[h] == u <=> index_hash[u] == h, no -1 key, and
  // nothing at or past the top.
  index_.for_each([&](int64_t h, int64_t u) {
    check_invariant(h != -1, "the index files -1 (no hash) as a content hash");
    check_invariant(in_capacity(u), "the index names an index outside the pool");
    check_invariant(u < num_, "the index names a retired index");
    check_invariant(records_[idx(u)].hash == h, "hash_to_index names an index that carries another hash");
  });
}

}  // namespace statecache
