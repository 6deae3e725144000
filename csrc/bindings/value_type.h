// Value semantics for the frozen (or plain) value types the module binds.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "bindings/convert.h"

namespace statecache::bindings {

namespace py = pybind11;

// Dataclass-style value semantics from a type's field tuple: equality only
// with the same type, hash of the fields for frozen types, keyword repr,
// pickling through the constructor.
template <class Cls, class Fields>
void def_value(Cls& cls, Fields fields, std::initializer_list<const char*> names, bool frozen) {
  using T = typename Cls::type;
  std::vector<std::string> keys(names.begin(), names.end());
  cls.def("__eq__", [](const T& a, py::handle b) -> py::object {
    if (!py::isinstance<T>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    return py::bool_(a == b.cast<const T&>());
  });
  cls.def("__ne__", [](const T& a, py::handle b) -> py::object {
    if (!py::isinstance<T>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
    return py::bool_(!(a == b.cast<const T&>()));
  });
  if (frozen)
    cls.def("__hash__", [fields](const T& v) { return py::hash(fields(v)); });
  else
    cls.attr("__hash__") = py::none();
  cls.def("__repr__", [fields, keys](py::handle self) {
    py::tuple vals = fields(self.cast<const T&>());
    std::string out = py::type::of(self).attr("__name__").cast<std::string>() + "(";
    for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", " : "") + keys[i] + "=" + py_repr(vals[i]);
    return out + ")";
  });
  cls.def("__reduce__",
          [fields](py::handle self) { return py::make_tuple(py::type::of(self), fields(self.cast<const T&>())); });
}

}  // namespace statecache::bindings
