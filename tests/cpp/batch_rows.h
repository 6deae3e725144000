// Hash lists over plain vectors, as core/batch.h reads them (C++ tests).
#pragma once

#include <cstdint>
#include <vector>

namespace statecache::test_support {

struct VecRows {
  const std::vector<std::vector<int64_t>>& v;
  size_t size() const { return v.size(); }
  int64_t length(size_t r) const { return static_cast<int64_t>(v[r].size()); }
  void prefetch(size_t, int64_t, int) const {}
  template <class F>
  int64_t scan(size_t r, F&& f) const {
    return f(length(r), [this, r](int64_t k) { return v[r].at(static_cast<size_t>(k)); });
  }
};

}  // namespace statecache::test_support
