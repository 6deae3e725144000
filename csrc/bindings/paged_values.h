// Conversions of the PAGE value types shared by the paged binding files.
#pragma once

#include <optional>

#include "bindings/convert.h"
#include "core/paged_types.h"

namespace statecache::bindings {

// statecache.StateStoreOperationId(h, gen), a tuple subclass.
py::object to_py(const StateStoreOperationId& op);
// A 2-tuple of ints (StateStoreOperationId or a plain tuple); nullopt for any
// other hashable value, which can never name an operation. TypeError when
// unhashable, as a dict lookup would raise.
std::optional<StateStoreOperationId> as_operation_id(py::handle obj);

// (operation, unit_ids) as the store hands a source to a tier.
py::tuple to_py_source(const StateStoreOperationId& op, const UnitIds& units);

}  // namespace statecache::bindings
