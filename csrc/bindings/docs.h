// The docstrings of statecache._C, written in docs/api.md and embedded at
// build time (cmake/embed_docs.py). Every binding asks for its own text by
// name, so a call site carries none.
#pragma once

#include <pybind11/pybind11.h>

#include <string_view>

namespace statecache::bindings {

// The docstring docs/api.md gives `qualname` ("Class", "Class.member" or
// "function"); nullptr for an entry without text. Throws std::logic_error
// naming `qualname` when there is no entry, unless the name is private (a
// part with one leading underscore): then nullptr. A throw fails the import.
const char* doc(std::string_view qualname);

// The same for member `member` of class `cls` (by its __name__), so that a
// template binding several classes gets each one's own text.
const char* doc(pybind11::handle cls, std::string_view member);

// Throws std::logic_error naming the entries of docs/api.md no binding asked
// for (a member renamed or removed), except those of classes and functions
// this build does not bind (the GPU-only ones). Called once `m` is bound.
void check_docs_used(pybind11::module_& m);

}  // namespace statecache::bindings
