// An open-addressing hash map from int64 keys, for the hot indexes of the
// store and the pool: one probe sequence in one array, no node per entry.
// Linear probing with backward-shift deletion, so there are no tombstones.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace statecache {

template <class V>
class FlatInt64Map {
 public:
  FlatInt64Map() { rehash(16); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  V* find(int64_t key) {
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      if (!used_[i]) return nullptr;
      if (slots_[i].first == key) return &slots_[i].second;
    }
  }
  const V* find(int64_t key) const { return const_cast<FlatInt64Map*>(this)->find(key); }
  bool contains(int64_t key) const { return find(key) != nullptr; }

  // The value under `key`, default-constructed when absent.
  V& operator[](int64_t key) {
    if ((size_ + 1) * 4 > slots_.size() * 3) rehash(slots_.size() * 2);
    size_t i = home(key);
    for (; used_[i]; i = (i + 1) & mask_)
      if (slots_[i].first == key) return slots_[i].second;
    used_[i] = 1;
    slots_[i] = {key, V{}};
    ++size_;
    return slots_[i].second;
  }

  bool erase(int64_t key) {
    size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (!used_[i]) return false;
      if (slots_[i].first == key) break;
    }
    // Shift later members of the run back so every probe path stays unbroken.
    for (size_t j = (i + 1) & mask_; used_[j]; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].first);
      const bool movable = (i <= j) ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i] = std::move(slots_[j]);
        i = j;
      }
    }
    used_[i] = 0;
    slots_[i] = {};
    --size_;
    return true;
  }

  void clear() {
    std::fill(used_.begin(), used_.end(), 0);
    for (auto& s : slots_) s = {};
    size_ = 0;
  }

  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (used_[i]) f(slots_[i].first, slots_[i].second);
  }

 private:
  size_t home(int64_t key) const {
    return static_cast<size_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  void rehash(size_t capacity) {
    std::vector<std::pair<int64_t, V>> old_slots(capacity);
    std::vector<uint8_t> old_used(capacity, 0);
    old_slots.swap(slots_);
    old_used.swap(used_);
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (size_t i = 0; i < old_slots.size(); ++i)
      if (old_used[i]) (*this)[old_slots[i].first] = std::move(old_slots[i].second);
  }

  std::vector<std::pair<int64_t, V>> slots_;
  std::vector<uint8_t> used_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace statecache
