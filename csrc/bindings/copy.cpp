#include "bindings/bindings.h"

namespace statecache::bindings {

void bind_copy(pybind11::module_& m) { (void)m; }

}  // namespace statecache::bindings
