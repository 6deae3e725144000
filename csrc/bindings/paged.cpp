#include "bindings/bindings.h"

namespace statecache::bindings {

void bind_paged(pybind11::module_& m) { bind_paged_types(m); }

}  // namespace statecache::bindings
