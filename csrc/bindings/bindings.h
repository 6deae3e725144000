// One registration function per area; module.cpp calls them in order.
#pragma once

#include <pybind11/pybind11.h>

namespace statecache::bindings {

void bind_common(pybind11::module_& m);             // errors, StateTransfer, Sequence
void bind_pools(pybind11::module_& m);              // StateSlotPool, StateGroupPool
void bind_paged(pybind11::module_& m);              // BlockPool, PAGE store + coordinator, offload index
void bind_paged_types(pybind11::module_& m);        // PAGE value types (called by bind_paged)
void bind_paged_coordinator(pybind11::module_& m);  // coordinator + offload index (called by bind_paged)
void bind_copy(pybind11::module_& m);               // span planner, CPU executor, GPU launch
void bind_hashing(pybind11::module_& m);            // chained token-block hashes and 128-bit prefix keys
void bind_tiers(pybind11::module_& m);              // host tier arena
// Last: text signatures for the pybind11-bound functions (signatures.cpp).
void add_text_signatures(pybind11::module_& m);

}  // namespace statecache::bindings

#include <memory>

#include "core/sequence.h"
#include "core/slot_source.h"

namespace statecache::bindings {

// A statecache.Sequence (or subclass) as the core's shared handle; TypeError
// naming `name` for anything else.
std::shared_ptr<Sequence> as_sequence(pybind11::handle obj, const char* name);

// A statecache.StateSlotPool as the scratch-slot source the PAGE coordinator
// borrows midstep slots from (shares ownership); TypeError naming `name`.
std::shared_ptr<ScratchSlotSource> as_scratch_source(pybind11::handle obj, const char* name);

}  // namespace statecache::bindings
