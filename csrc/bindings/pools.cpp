#include "bindings/bindings.h"

namespace statecache::bindings {

void bind_pools(pybind11::module_& m) { (void)m; }

}  // namespace statecache::bindings
