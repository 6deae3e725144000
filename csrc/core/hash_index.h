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

  // Inlined up to the filter test: a resumable-hit scan calls this per block,
  // and most of those lookups are misses.
  [[gnu::always_inline]] const int64_t* find(int64_t key) const {
    if (table_.empty()) return nullptr;
    // A byte-per-cell counting filter answers most misses.
    if (filter_[filter_slot(key)] == 0) return nullptr;
    return probe(key, mix(key));
  }
  [[gnu::always_inline]] bool contains(int64_t key) const { return find(key) != nullptr; }
  int64_t get(int64_t key, int64_t fallback) const {
    const int64_t* v = find(key);
    return v ? *v : fallback;
  }

  // Inserts at the end of the order, or assigns in place when present.
  void set(int64_t key, int64_t value) { exchange(key, value, 0); }

  // set(), returning the value it replaced, or `absent` for a new key.
  int64_t exchange(int64_t key, int64_t value, int64_t absent) {
    if ((used_ + 1) * 4 > table_.size() * 3) rehash(live_ + 1);
    const uint64_t m = mix(key);
    const uint32_t t = tag(m);
    size_t slot = m & mask_;
    size_t first_tomb = SIZE_MAX;
    for (;; slot = (slot + 1) & mask_) {
      const Cell c = table_[slot];
      if (c.entry == kEmpty) break;
      if (c.entry == kTomb) {
        if (first_tomb == SIZE_MAX) first_tomb = slot;
      } else if (c.tag == t && entries_[static_cast<size_t>(c.entry)].key == key) {
        const int64_t old = entries_[static_cast<size_t>(c.entry)].value;
        entries_[static_cast<size_t>(c.entry)].value = value;
        return old;
      }
    }
    if (first_tomb != SIZE_MAX) {
      slot = first_tomb;
    } else {
      ++used_;
    }
    table_[slot] = Cell{static_cast<int32_t>(entries_.size()), t};
    filter_add(key);
    entries_.push_back({key, value, true});
    ++live_;
    return absent;
  }

  // Brings the key's filter byte towards the cache ahead of a contains();
  // returns its position, which that contains() then reuses.
  // always_inline: a non-inlined call would be seen as side-effect free and
  // dropped whole, prefetch included.
  [[gnu::always_inline]] size_t prefetch(int64_t key) const {
    const size_t f = filter_slot(key);
    __builtin_prefetch(filter_.data() + f);
    return f;
  }
  // contains(key), given `at` = prefetch(key).
  [[gnu::always_inline]] bool contains(int64_t key, size_t at) const {
    if (filter_[at] == 0) return false;
    return probe(key, mix(key)) != nullptr;
  }

  bool erase(int64_t key) {
    if (table_.empty()) return false;
    const uint64_t m = mix(key);
    const uint32_t t = tag(m);
    for (size_t i = m & mask_;; i = (i + 1) & mask_) {
      const Cell c = table_[i];
      if (c.entry == kEmpty) return false;
      if (c.tag == t && c.entry >= 0 && entries_[static_cast<size_t>(c.entry)].key == key) {
        entries_[static_cast<size_t>(c.entry)].live = false;
        table_[i].entry = kTomb;
        filter_remove(key);
        --live_;
        // Dead entries are compacted away once they outnumber the live ones,
        // so a steady erase/insert churn reuses the same storage.
        if (entries_.size() > 3 * live_ + 256) rehash(live_);
        return true;
      }
    }
  }

  void clear() {
    entries_.clear();
    std::fill(table_.begin(), table_.end(), Cell{});
    std::fill(filter_.begin(), filter_.end(), 0);
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

  // A table cell: the entry's position plus a tag from the key's mixed bits.
  struct Cell {
    int32_t entry = kEmpty;
    uint32_t tag = 0;
  };

  // splitmix64 finalizer: content hashes may be small consecutive ints in
  // tests and adversarial in production; both must spread.
  static uint64_t mix(int64_t key) {
    uint64_t x = static_cast<uint64_t>(key);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
  }
  static uint32_t tag(uint64_t mixed) { return static_cast<uint32_t>(mixed >> 32); }

  // find() past the filter: walks the key's run of cells.
  const int64_t* probe(int64_t key, uint64_t m) const {
    const uint32_t t = tag(m);
    for (size_t i = m & mask_;; i = (i + 1) & mask_) {
      const Cell c = table_[i];
      if (c.entry == kEmpty) return nullptr;
      // The tag spares a visit to the entry for almost every other key.
      if (c.tag == t && c.entry >= 0 && entries_[static_cast<size_t>(c.entry)].key == key)
        return &entries_[static_cast<size_t>(c.entry)].value;
    }
  }

  // The filter has its own, cheaper hash (one multiply, top bits): a scan
  // tests it for every block it reads, and a filter collision only costs a
  // probe, never a wrong answer. A counter that reaches 255 sticks (it may
  // then over-report, never under-report). Never empty (sized in the
  // constructor), so a scan needs no emptiness test.
  size_t filter_slot(int64_t key) const {
    return static_cast<size_t>((static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ULL) >> filter_shift_);
  }
  void filter_add(int64_t key) {
    uint8_t& c = filter_[filter_slot(key)];
    if (c != 255) ++c;
  }
  void filter_remove(int64_t key) {
    uint8_t& c = filter_[filter_slot(key)];
    if (c != 255) --c;
  }

  // Compacts the entries (keeping their order) and rebuilds the table sized
  // for at least `want` live entries.
  void rehash(size_t want) {
    size_t cap = 16;
    while (cap < (want + 1) * 8) cap <<= 1;
    if (cap < table_.size()) cap = table_.size();
    size_t w = 0;
    for (size_t r = 0; r < entries_.size(); ++r)
      if (entries_[r].live) entries_[w++] = entries_[r];
    entries_.resize(w);
    table_.assign(cap, Cell{});
    mask_ = cap - 1;
    filter_.assign(cap, 0);
    filter_shift_ = 64 - __builtin_ctzll(cap);
    used_ = w;
    for (size_t k = 0; k < w; ++k) {
      const uint64_t m = mix(entries_[k].key);
      filter_add(entries_[k].key);
      size_t i = m & mask_;
      while (table_[i].entry != kEmpty) i = (i + 1) & mask_;
      table_[i] = Cell{static_cast<int32_t>(k), tag(m)};
    }
  }

  std::vector<Entry> entries_;
  std::vector<Cell> table_;
  std::vector<uint8_t> filter_ = std::vector<uint8_t>(2, 0);  // one counter per table cell (2 before any)
  int filter_shift_ = 63;                                     // 64 - log2(filter_.size())
  size_t mask_ = 0;
  size_t live_ = 0;
  size_t used_ = 0;  // table cells not empty (live + tombstones)
};

}  // namespace statecache
