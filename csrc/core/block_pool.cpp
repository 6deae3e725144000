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
  owner_.assign(n, owner_token::kFree);
  refs_.assign(n, 0);
  hash_.assign(n, kNoHash);
  prev_.assign(n, -1);
  next_.assign(n, -1);
  on_list_.assign(n, kOffList);
  seen_.assign(n, 0);
  seen_count_.assign(n, 0);
  for (int32_t b = 0; b < static_cast<int32_t>(n); ++b) push_back(fresh_, b);
  index_.reserve(n);
}

void BlockPool::push_back(List& l, int32_t b) {
  prev_[b] = l.tail;
  next_[b] = -1;
  if (l.tail >= 0)
    next_[l.tail] = b;
  else
    l.head = b;
  l.tail = b;
  ++l.size;
  on_list_[b] = (&l == &fresh_) ? kFresh : kCached;
}

void BlockPool::unlink(List& l, int32_t b) {
  if (prev_[b] >= 0)
    next_[prev_[b]] = next_[b];
  else
    l.head = next_[b];
  if (next_[b] >= 0)
    prev_[next_[b]] = prev_[b];
  else
    l.tail = prev_[b];
  prev_[b] = next_[b] = -1;
  --l.size;
  on_list_[b] = kOffList;
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
  index_.erase(hash_[b]);
  evicted.push_back(hash_[b]);
  hash_[b] = kNoHash;
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

void BlockPool::check_block(int64_t block, const char* name) const {
  check_index(name, block, num_blocks());
}

void BlockPool::adjust_held(int64_t owner, int64_t delta) {
  auto it = held_.find(owner);
  if (it == held_.end()) {
    held_.emplace(owner, delta);
    return;
  }
  it->second += delta;
  if (it->second == 0) held_.erase(it);
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
    owner_[b] = owner;
    out.push_back(b);
  }
  reserved_ += count;
  if (count > 0) adjust_held(owner, count);
  notify(evicted);
  return true;
}

void BlockPool::check_units(const std::vector<int64_t>& units, int64_t owner, const char* name) const {
  if (++seen_epoch_ == 0) {
    std::fill(seen_.begin(), seen_.end(), 0);
    seen_epoch_ = 1;
  }
  for (int64_t u : units) {
    check_block(u, name);
    if (seen_[u] == seen_epoch_) bad_argument(name, u, "is listed twice");
    seen_[u] = seen_epoch_;
    if (owner_[u] != owner) {
      bad_argument(name, u,
                   owner_[u] == owner_token::kFree ? "is free, not held by this owner"
                                                   : "is not held by this owner");
    }
  }
}

void BlockPool::release_units(const std::vector<int64_t>& units, int64_t owner) {
  check_units(units, owner, "unit_ids");
  for (int64_t u : units) {
    owner_[u] = owner_token::kFree;
    push_back(fresh_, static_cast<int32_t>(u));
  }
  reserved_ -= static_cast<int64_t>(units.size());
  if (!units.empty()) adjust_held(owner, -static_cast<int64_t>(units.size()));
}

void BlockPool::rekey_units(const std::vector<int64_t>& units, int64_t old_owner, int64_t new_owner) {
  if (new_owner < 0) bad_argument("new_owner", new_owner, "is not a unit owner token");
  check_units(units, old_owner, "unit_ids");
  for (int64_t u : units) owner_[u] = new_owner;
  if (!units.empty() && old_owner != new_owner) {
    adjust_held(old_owner, -static_cast<int64_t>(units.size()));
    adjust_held(new_owner, static_cast<int64_t>(units.size()));
  }
}

int64_t BlockPool::owner_of(int64_t block) const {
  check_block(block, "unit");
  return owner_[block];
}

int64_t BlockPool::units_held(int64_t owner) const {
  auto it = held_.find(owner);
  return it == held_.end() ? 0 : it->second;
}

bool BlockPool::allocate(int64_t count, std::vector<int64_t>& out) {
  if (count < 0) bad_argument("count", count, "must be >= 0");
  out.clear();
  if (count > num_free()) return false;
  std::vector<int64_t> evicted;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int32_t b = take_free(evicted);
    owner_[b] = owner_token::kKv;
    refs_[b] = 1;
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
    if (owner_[b] != owner_token::kKv) bad_argument("block_ids", b, "is not held by the KV cache");
    if (seen_[b] != seen_epoch_) {
      seen_[b] = seen_epoch_;
      seen_count_[b] = 0;
    }
    if (++seen_count_[b] > refs_[b]) bad_argument("block_ids", b, "is freed more often than it is referenced");
  }
  for (int64_t b : blocks) {
    if (--refs_[b] > 0) continue;
    owner_[b] = owner_token::kFree;
    --kv_blocks_;
    push_back(hash_[b] == kNoHash ? fresh_ : cached_, static_cast<int32_t>(b));
  }
}

void BlockPool::incref(const std::vector<int64_t>& blocks) {
  for (int64_t b : blocks) {
    check_block(b, "block_ids");
    const bool held = owner_[b] == owner_token::kKv;
    const bool cached = owner_[b] == owner_token::kFree && hash_[b] != kNoHash;
    if (!held && !cached) bad_argument("block_ids", b, "is neither held by the KV cache nor cached");
  }
  for (int64_t b : blocks) {
    if (owner_[b] == owner_token::kFree) {
      unlink(cached_, static_cast<int32_t>(b));
      owner_[b] = owner_token::kKv;
      ++kv_blocks_;
    }
    ++refs_[b];
  }
}

int64_t BlockPool::lookup(int64_t hash) const {
  auto it = index_.find(hash);
  return it == index_.end() ? -1 : it->second;
}

bool BlockPool::publish(int64_t block, int64_t hash) {
  check_block(block, "block");
  if (hash == kNoHash) bad_argument("hash", hash, "-1 means no hash");
  if (owner_[block] != owner_token::kKv) bad_argument("block", block, "is not held by the KV cache");
  if (hash_[block] != kNoHash) {
    if (hash_[block] == hash) return true;
    bad_argument("block", block, ("already holds hash " + std::to_string(hash_[block])).c_str());
  }
  if (!index_.emplace(hash, static_cast<int32_t>(block)).second) return false;
  hash_[block] = hash;
  return true;
}

int64_t BlockPool::block_hash(int64_t block) const {
  check_block(block, "block");
  return hash_[block];
}

int64_t BlockPool::ref_count(int64_t block) const {
  check_block(block, "block");
  return refs_[block];
}

int64_t BlockPool::reset_prefix_cache() {
  std::vector<int64_t> evicted;
  evicted.reserve(index_.size());
  for (auto& [h, b] : index_) {
    evicted.push_back(h);
    hash_[b] = kNoHash;
    if (on_list_[b] == kCached) {
      unlink(cached_, b);
      push_back(fresh_, b);
    }
  }
  index_.clear();
  notify(evicted);
  return static_cast<int64_t>(evicted.size());
}

void BlockPool::check_consistency() const {
  int64_t fresh = 0, cached = 0, kv = 0, reserved = 0, hashed = 0;
  for (int64_t b = 0; b < num_blocks(); ++b) {
    const int64_t o = owner_[b];
    if (hash_[b] != kNoHash) {
      ++hashed;
      auto it = index_.find(hash_[b]);
      check_invariant(it != index_.end() && it->second == b, "BlockPool: hash of a block is not indexed to it");
    }
    if (o == owner_token::kFree) {
      check_invariant(refs_[b] == 0, "BlockPool: a free block is referenced");
      check_invariant(on_list_[b] == (hash_[b] == kNoHash ? kFresh : kCached), "BlockPool: free block on the wrong list");
      (hash_[b] == kNoHash ? fresh : cached)++;
    } else if (o == owner_token::kKv) {
      check_invariant(refs_[b] > 0 && on_list_[b] == kOffList, "BlockPool: held KV block unreferenced or listed");
      ++kv;
    } else {
      check_invariant(o >= 0 && refs_[b] == 0 && on_list_[b] == kOffList && hash_[b] == kNoHash,
                      "BlockPool: a unit is referenced, listed or hashed");
      ++reserved;
    }
  }
  check_invariant(fresh == fresh_.size && cached == cached_.size, "BlockPool: list sizes disagree");
  check_invariant(kv == kv_blocks_ && reserved == reserved_, "BlockPool: counts disagree");
  check_invariant(hashed == static_cast<int64_t>(index_.size()), "BlockPool: index has stale hashes");
  check_invariant(fresh + cached + kv + reserved == num_blocks(), "BlockPool: blocks not conserved");
  int64_t held = 0;
  for (auto& [o, n] : held_) held += n;
  check_invariant(held == reserved_, "BlockPool: per-owner counts disagree");
}

}  // namespace statecache
