// Where a PAGE store's units come from when the pool is not a BlockPool: the
// four calls the reference store makes on its pool (docs/paged.md, "Pool
// protocol"). The bindings implement it over an engine's own Python pool.
//
// Any call may run foreign code that throws or calls back into the store or
// coordinator being served; the store makes each call at a point where its
// own tables are consistent and re-reads what it needs afterwards.
#pragma once

#include <cstdint>
#include <vector>

namespace statecache {

class PageUnitProvider {
 public:
  virtual ~PageUnitProvider() = default;
  // Units a reservation could take now.
  virtual int64_t num_free() = 0;
  // `count` units for `owner` (an owner_token), or false with `out` empty.
  virtual bool reserve_units(int64_t count, int64_t owner, std::vector<int64_t>& out) = 0;
  virtual void release_units(const std::vector<int64_t>& units, int64_t owner) = 0;
  virtual void rekey_units(const std::vector<int64_t>& units, int64_t old_owner, int64_t new_owner) = 0;
};

}  // namespace statecache
