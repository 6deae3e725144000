// An open-addressing hash map from int64 keys, for the hot indexes of the
// store and the pool: one probe sequence in one array, no node per entry.
// Linear probing with backward-shift deletion, so there are no tombstones.
// The occupancy flag lives in the slot itself: a probe of a cold map costs
// one cache miss, not two.
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
      if (!slots_[i].used) return nullptr;
      if (slots_[i].key == key) return &slots_[i].value;
    }
  }
  const V* find(int64_t key) const { return const_cast<FlatInt64Map*>(this)->find(key); }
  bool contains(int64_t key) const { return find(key) != nullptr; }
  // Starts loading the key's home slot, so a miss overlaps other work.
  [[gnu::always_inline]] void prefetch(int64_t key) const { __builtin_prefetch(&slots_[home(key)]); }

  // The value under `key`, default-constructed when absent.
  V& operator[](int64_t key) {
    if ((size_ + 1) * 4 > slots_.size() * 3) rehash(slots_.size() * 2);
    size_t i = home(key);
    for (; slots_[i].used; i = (i + 1) & mask_)
      if (slots_[i].key == key) return slots_[i].value;
    slots_[i] = Slot{key, V{}, true};
    ++size_;
    return slots_[i].value;
  }

  bool erase(int64_t key) {
    size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (!slots_[i].used) return false;
      if (slots_[i].key == key) break;
    }
    // Shift later members of the run back so every probe path stays unbroken.
    for (size_t j = (i + 1) & mask_; slots_[j].used; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].key);
      const bool movable = (i <= j) ? (h <= i || h > j) : (h <= i && h > j);
      if (movable) {
        slots_[i] = std::move(slots_[j]);
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
    return true;
  }

  void clear() {
    for (auto& s : slots_) s = Slot{};
    size_ = 0;
  }

  template <class F>
  void for_each(F&& f) const {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].used) f(slots_[i].key, slots_[i].value);
  }

 private:
  size_t home(int64_t key) const {
    return static_cast<size_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  void rehash(size_t capacity) {
    std::vector<Slot> old_slots(capacity);
    old_slots.swap(slots_);
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
    size_ = 0;
    for (size_t i = 0; i < old_slots.size(); ++i)
      if (old_slots[i].used) (*this)[old_slots[i].key] = std::move(old_slots[i].value);
  }

  struct Slot {
    int64_t key = 0;
    V value{};
    bool used = false;  // sits in the padding after an int32 value
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

}  // namespace statecache
