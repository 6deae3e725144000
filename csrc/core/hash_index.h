// int64 prefix hash -> int64 index, open addressing, iterated in insertion
// order. Insertion order is kept because the Python pools expose the map as a
// dict, and a dict's iteration order is observable: re-assigning a key keeps
// its place, erasing and re-inserting moves it to the end.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace statecache {

class HashIndex {
 public:
  struct Entry {
    int64_t key;
    int64_t value;
    bool live;
  };

  explicit HashIndex(size_t expected = 0) { reserve(expected); }

  size_t size() const { return live_; }
  bool empty() const { return live_ == 0; }

  const int64_t* find(int64_t key) const {
    if (table_.empty()) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      const int32_t e = table_[i];
      if (e == kEmpty) return nullptr;
      if (e >= 0 && entries_[static_cast<size_t>(e)].key == key)
        return &entries_[static_cast<size_t>(e)].value;
    }
  }
  bool contains(int64_t key) const { return find(key) != nullptr; }
  int64_t get(int64_t key, int64_t fallback) const {
    const int64_t* v = find(key);
    return v ? *v : fallback;
  }

  // Inserts at the end of the order, or assigns in place when present.
  void set(int64_t key, int64_t value) {
    if ((used_ + 1) * 4 > table_.size() * 3) rehash(live_ + 1);
    size_t slot = home(key);
    size_t first_tomb = SIZE_MAX;
    for (;; slot = (slot + 1) & mask_) {
      const int32_t e = table_[slot];
      if (e == kEmpty) break;
      if (e == kTomb) {
        if (first_tomb == SIZE_MAX) first_tomb = slot;
      } else if (entries_[static_cast<size_t>(e)].key == key) {
        entries_[static_cast<size_t>(e)].value = value;
        return;
      }
    }
    if (first_tomb != SIZE_MAX) {
      slot = first_tomb;
    } else {
      ++used_;
    }
    table_[slot] = static_cast<int32_t>(entries_.size());
    entries_.push_back({key, value, true});
    ++live_;
  }

  bool erase(int64_t key) {
    if (table_.empty()) return false;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      const int32_t e = table_[i];
      if (e == kEmpty) return false;
      if (e >= 0 && entries_[static_cast<size_t>(e)].key == key) {
        entries_[static_cast<size_t>(e)].live = false;
        table_[i] = kTomb;
        --live_;
        // Dead entries are compacted away once they outnumber the live ones,
        // so a steady erase/insert churn reuses the same storage.
        if (entries_.size() > 2 * live_ + 16) rehash(live_);
        return true;
      }
    }
  }

  void clear() {
    entries_.clear();
    std::fill(table_.begin(), table_.end(), kEmpty);
    live_ = used_ = 0;
  }

  void reserve(size_t n) {
    if ((n + 1) * 4 > table_.size() * 3) rehash(n);
    entries_.reserve(n);
  }

  // Calls f(key, value) for every live entry, oldest insertion first.
  template <class F>
  void for_each(F&& f) const {
    for (const Entry& e : entries_)
      if (e.live) f(e.key, e.value);
  }

 private:
  static constexpr int32_t kEmpty = -1;
  static constexpr int32_t kTomb = -2;

  size_t home(int64_t key) const {
    // splitmix64 finalizer: content hashes may be small consecutive ints in
    // tests and adversarial in production; both must spread.
    uint64_t x = static_cast<uint64_t>(key);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return static_cast<size_t>(x) & mask_;
  }

  // Compacts the entries (keeping their order) and rebuilds the table sized
  // for at least `want` live entries.
  void rehash(size_t want) {
    size_t cap = 16;
    while (cap * 3 < (want + 1) * 4 * 2) cap <<= 1;
    if (cap < table_.size()) cap = table_.size();
    size_t w = 0;
    for (size_t r = 0; r < entries_.size(); ++r)
      if (entries_[r].live) entries_[w++] = entries_[r];
    entries_.resize(w);
    table_.assign(cap, kEmpty);
    mask_ = cap - 1;
    used_ = w;
    for (size_t k = 0; k < w; ++k) {
      size_t i = home(entries_[k].key);
      while (table_[i] != kEmpty) i = (i + 1) & mask_;
      table_[i] = static_cast<int32_t>(k);
    }
  }

  std::vector<Entry> entries_;
  std::vector<int32_t> table_;
  size_t mask_ = 0;
  size_t live_ = 0;
  size_t used_ = 0;  // table cells not empty (live + tombstones)
};

}  // namespace statecache
