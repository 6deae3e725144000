#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "statecache core: state pools, PAGE checkpoints, copy planning (C++)";
  using namespace statecache::bindings;
  bind_common(m);
  bind_pools(m);
  bind_paged(m);
  bind_copy(m);
  bind_hashing(m);
  bind_tiers(m);
}
