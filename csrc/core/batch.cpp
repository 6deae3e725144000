#include "core/batch.h"

#include <algorithm>
#include <utility>

namespace statecache::batch {

namespace {

std::string entry(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

}  // namespace

void check_length(const char* name, size_t n, const char* of, size_t expected) {
  if (n != expected)
    throw std::invalid_argument(std::string(name) + " has " + std::to_string(n) + " entries but " + of + " has " +
                                std::to_string(expected) + "; give one per sequence");
}

void check_distinct(const char* name, std::span<const uintptr_t> keys) {
  // Sorted (key, index) pairs: the repeat reported is the later of the
  // first pair found, which names both entries.
  std::vector<std::pair<uintptr_t, size_t>> order(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) order[i] = {keys[i], i};
  std::sort(order.begin(), order.end());
  size_t first = keys.size(), second = keys.size();
  for (size_t k = 1; k < order.size(); ++k)
    if (order[k].first == order[k - 1].first && order[k].second < second) {
      first = order[k - 1].second;
      second = order[k].second;
    }
  if (second == keys.size()) return;
  throw std::invalid_argument(entry(name, second) + " is " + entry(name, first) +
                              ": a sequence may appear once per batch");
}

void check_hashes(const char* name, std::span<const int64_t> hashes) {
  for (size_t i = 0; i < hashes.size(); ++i)
    if (hashes[i] == -1)
      bad_argument(entry(name, i).c_str(), -1, "is -1, which means \"no hash\"; it cannot name a checkpoint");
}

void check_nonnegative(const char* name, std::span<const int64_t> values) {
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i] < 0) bad_argument(entry(name, i).c_str(), values[i], "must be >= 0");
}

}  // namespace statecache::batch
