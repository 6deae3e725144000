#include "core/block_pool.h"

#include <exception>
#include <string>

#include "core/errors.h"

namespace statecache {

namespace {
constexpr uint8_t kOffList = 0, kFresh = 1, kCached = 2;
}

BlockPool::BlockPool(int64_t num_blocks) {
  if (num_blocks < 0) bad_argument("num_blocks", num_blocks, "must be >= 0");
  if (num_blocks > INT32_MAX) bad_argument("num_blocks", num_blocks, "must fit in 32 bits");
  const auto n = static_cast<size_t>(num_blocks);
  blocks_.assign(n, Block{});
  seen_.assign(n, 0);
  seen_count_.assign(n, 0);
  for (int32_t b = 0; b < static_cast<int32_t>(n); ++b) push_back(fresh_, b);
}

void BlockPool::push_back(List& l, int32_t b) {
  blocks_[b].prev = l.tail;
  blocks_[b].next = -1;
  if (l.tail >= 0)
    blocks_[l.tail].next = b;
  else
    l.head = b;
  l.tail = b;
  ++l.size;
  blocks_[b].list = (&l == &fresh_) ? kFresh : kCached;
}

void BlockPool::push_front(List& l, int32_t b) {
  blocks_[b].next = l.head;
  blocks_[b].prev = -1;
  if (l.head >= 0)
    blocks_[l.head].prev = b;
  else
    l.tail = b;
  l.head = b;
  ++l.size;
  blocks_[b].list = (&l == &fresh_) ? kFresh : kCached;
}

void BlockPool::unlink(List& l, int32_t b) {
  if (blocks_[b].prev >= 0)
    blocks_[blocks_[b].prev].next = blocks_[b].next;
  else
    l.head = blocks_[b].next;
  if (blocks_[b].next >= 0)
    blocks_[blocks_[b].next].prev = blocks_[b].prev;
  else
    l.tail = blocks_[b].prev;
  blocks_[b].prev = blocks_[b].next = -1;
  --l.size;
  blocks_[b].list = kOffList;
}

int32_t BlockPool::take_free(std::vector<int64_t>& evicted) {
  if (fresh_.head >= 0) {
    const int32_t b = fresh_.head;
    unlink(fresh_, b);
    return b;
  }
  const int32_t b = cached_.head;
  check_invariant(b >= 0, "BlockPool: no free block to take");
  unlink(cached_, b);
  index_.erase(blocks_[b].hash);
  evicted.push_back(blocks_[b].hash);
  blocks_[b].hash = kNoHash;
  return b;
}

void BlockPool::notify(const std::vector<int64_t>& evicted) {
  if (!on_evict_ || evicted.empty()) return;
  // Every handler runs even if one throws; the first error is re-raised.
  std::exception_ptr first;
  for (int64_t h : evicted) {
    try {
      on_evict_(h);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

void BlockPool::check_block(int64_t block, const char* name) const { check_index(name, block, num_blocks()); }

void BlockPool::adjust_held(int64_t owner, int64_t delta) {
  // Checkpoint owners are counted by their store; only owners a caller
  // interned are counted here (the binding sweeps those that hold nothing).
  if (owner_token::kind(owner) == owner_token::kCheckpoint) return;
  int64_t& n = held_[owner];
  n += delta;
  if (n == 0) held_.erase(owner);
}

bool BlockPool::reserve_units(int64_t count, int64_t owner, std::vector<int64_t>& out) {
  if (count < 0) bad_argument("count", count, "must be >= 0");
  if (owner < 0) bad_argument("owner", owner, "is not a unit owner token");
  out.clear();
  if (count > num_free()) return false;
  std::vector<int64_t> evicted;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int32_t b = take_free(evicted);
    blocks_[b].owner = owner;
    out.push_back(b);
  }
  reserved_ += count;
  if (count > 0) adjust_held(owner, count);
  notify(evicted);
  return true;
}

void BlockPool::check_units(const std::vector<int64_t>& units, int64_t owner, const char* name) {
  // Each listed unit is marked while it is checked, so a unit listed twice
  // is caught; the marks come off again before anything is reported.
  size_t checked = 0;
  auto unmark = [&] {
    for (size_t i = 0; i < checked; ++i) blocks_[units[i]].owner = owner;
  };
  for (; checked < units.size(); ++checked) {
    const int64_t u = units[checked];
    const char* why = nullptr;
    if (u < 0 || u >= num_blocks()) {
      unmark();
      out_of_range(name, u, num_blocks());
    }
    if (blocks_[u].owner == kChecking)
      why = "is listed twice";
    else if (blocks_[u].owner != owner)
      why = blocks_[u].owner == owner_token::kFree ? "is free, not held by this owner" : "is not held by this owner";
    if (why != nullptr) {
      unmark();
      bad_argument(name, u, why);
    }
    blocks_[u].owner = kChecking;
  }
  unmark();
}

void BlockPool::release_units(const std::vector<int64_t>& units, int64_t owner) {
  check_units(units, owner, "unit_ids");
  // Back on top of the fresh stack in their order, so the next reservation
  // reuses them while they are still in cache.
  for (auto it = units.rbegin(); it != units.rend(); ++it) {
    blocks_[*it].owner = owner_token::kFree;
    push_front(fresh_, static_cast<int32_t>(*it));
  }
  reserved_ -= static_cast<int64_t>(units.size());
  if (!units.empty()) adjust_held(owner, -static_cast<int64_t>(units.size()));
}

void BlockPool::rekey_units(const std::vector<int64_t>& units, int64_t old_owner, int64_t new_owner) {
  if (new_owner < 0) bad_argument("new_owner", new_owner, "is not a unit owner token");
  check_units(units, old_owner, "unit_ids");
  for (int64_t u : units) blocks_[u].owner = new_owner;
  if (!units.empty() && old_owner != new_owner) {
    adjust_held(old_owner, -static_cast<int64_t>(units.size()));
    adjust_held(new_owner, static_cast<int64_t>(units.size()));
  }
}

int64_t BlockPool::owner_of(int64_t block) const {
  check_block(block, "unit");
  return blocks_[block].owner;
}

int64_t BlockPool::units_held(int64_t owner) const {
  const int64_t* n = held_.find(owner);
  return n == nullptr ? 0 : *n;
}

bool BlockPool::allocate(int64_t count, std::vector<int64_t>& out) {
  if (count < 0) bad_argument("count", count, "must be >= 0");
  out.clear();
  if (count > num_free()) return false;
  std::vector<int64_t> evicted;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int32_t b = take_free(evicted);
    blocks_[b].owner = owner_token::kKv;
    blocks_[b].refs = 1;
    out.push_back(b);
  }
  kv_blocks_ += count;
  notify(evicted);
  return true;
}

void BlockPool::free(const std::vector<int64_t>& blocks) {
  if (++seen_epoch_ == 0) {
    std::fill(seen_.begin(), seen_.end(), 0);
    seen_epoch_ = 1;
  }
  for (int64_t b : blocks) {
    check_block(b, "block_ids");
    if (blocks_[b].owner != owner_token::kKv) bad_argument("block_ids", b, "is not held by the KV cache");
    if (seen_[b] != seen_epoch_) {
      seen_[b] = seen_epoch_;
      seen_count_[b] = 0;
    }
    if (++seen_count_[b] > blocks_[b].refs) bad_argument("block_ids", b, "is freed more often than it is referenced");
  }
  for (int64_t b : blocks) {
    if (--blocks_[b].refs > 0) continue;
    blocks_[b].owner = owner_token::kFree;
    --kv_blocks_;
    if (blocks_[b].hash == kNoHash)
      push_front(fresh_, static_cast<int32_t>(b));
    else
      push_back(cached_, static_cast<int32_t>(b));
  }
}

void BlockPool::incref(const std::vector<int64_t>& blocks) {
  for (int64_t b : blocks) {
    check_block(b, "block_ids");
    const bool held = blocks_[b].owner == owner_token::kKv;
    const bool cached = blocks_[b].owner == owner_token::kFree && blocks_[b].hash != kNoHash;
    if (!held && !cached) bad_argument("block_ids", b, "is neither held by the KV cache nor cached");
  }
  for (int64_t b : blocks) {
    if (blocks_[b].owner == owner_token::kFree) {
      unlink(cached_, static_cast<int32_t>(b));
      blocks_[b].owner = owner_token::kKv;
      ++kv_blocks_;
    }
    ++blocks_[b].refs;
  }
}

int64_t BlockPool::lookup(int64_t hash) const {
  const int32_t* b = index_.find(hash);
  return b == nullptr ? -1 : *b;
}

bool BlockPool::publish(int64_t block, int64_t hash) {
  check_block(block, "block");
  if (hash == kNoHash) bad_argument("hash", hash, "-1 means no hash");
  if (blocks_[block].owner != owner_token::kKv) bad_argument("block", block, "is not held by the KV cache");
  if (blocks_[block].hash != kNoHash) {
    if (blocks_[block].hash == hash) return true;
    bad_argument("block", block, ("already holds hash " + std::to_string(blocks_[block].hash)).c_str());
  }
  if (index_.contains(hash)) return false;
  index_[hash] = static_cast<int32_t>(block);
  blocks_[block].hash = hash;
  return true;
}

int64_t BlockPool::block_hash(int64_t block) const {
  check_block(block, "block");
  return blocks_[block].hash;
}

int64_t BlockPool::ref_count(int64_t block) const {
  check_block(block, "block");
  return blocks_[block].refs;
}

int64_t BlockPool::reset_prefix_cache() {
  std::vector<int64_t> evicted;
  evicted.reserve(index_.size());
  index_.for_each([&](int64_t h, int32_t b) {
    evicted.push_back(h);
    blocks_[b].hash = kNoHash;
    if (blocks_[b].list == kCached) {
      unlink(cached_, b);
      push_front(fresh_, b);
    }
  });
  index_.clear();
  notify(evicted);
  return static_cast<int64_t>(evicted.size());
}

void BlockPool::check_consistency() const {
  int64_t fresh = 0, cached = 0, kv = 0, reserved = 0, hashed = 0;
  for (int64_t b = 0; b < num_blocks(); ++b) {
    const int64_t o = blocks_[b].owner;
    if (blocks_[b].hash != kNoHash) {
      ++hashed;
      const int32_t* at = index_.find(blocks_[b].hash);
      check_invariant(at != nullptr && *at == b, "BlockPool: hash of a block is not indexed to it");
    }
    if (o == owner_token::kFree) {
      check_invariant(blocks_[b].refs == 0, "BlockPool: a free block is referenced");
      check_invariant(blocks_[b].list == (blocks_[b].hash == kNoHash ? kFresh : kCached),
                      "BlockPool: free block on the wrong list");
      (blocks_[b].hash == kNoHash ? fresh : cached)++;
    } else if (o == owner_token::kKv) {
      check_invariant(blocks_[b].refs > 0 && blocks_[b].list == kOffList,
                      "BlockPool: held KV block unreferenced or listed");
      ++kv;
    } else {
      check_invariant(o >= 0 && blocks_[b].refs == 0 && blocks_[b].list == kOffList && blocks_[b].hash == kNoHash,
                      "BlockPool: a unit is referenced, listed or hashed");
      ++reserved;
    }
  }
  check_invariant(fresh == fresh_.size && cached == cached_.size, "BlockPool: list sizes disagree");
  check_invariant(kv == kv_blocks_ && reserved == reserved_, "BlockPool: counts disagree");
  check_invariant(hashed == static_cast<int64_t>(index_.size()), "BlockPool: index has stale hashes");
  check_invariant(fresh + cached + kv + reserved == num_blocks(), "BlockPool: blocks not conserved");
  int64_t interned = 0;
  for (int64_t b = 0; b < num_blocks(); ++b)
    interned += blocks_[b].owner >= 0 && owner_token::kind(blocks_[b].owner) != owner_token::kCheckpoint;
  int64_t held = 0;
  held_.for_each([&](int64_t, int64_t n) { held += n; });
  check_invariant(held == interned, "BlockPool: per-owner counts disagree");
}

}  // namespace statecache
