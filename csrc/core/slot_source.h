// Where the PAGE coordinator borrows midstep scratch slots from. StateSlotPool
// implements it; the coordinator only needs these three calls.
#pragma once

#include <cstdint>

namespace statecache {

class ScratchSlotSource {
 public:
  virtual ~ScratchSlotSource() = default;
  virtual bool has_free(int64_t count = 1) const = 0;
  virtual int64_t pop() = 0;
  virtual void release(int64_t slot) = 0;
};

}  // namespace statecache
