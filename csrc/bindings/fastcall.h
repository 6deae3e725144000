// Hot scheduler-path methods bound as plain METH_FASTCALL method descriptors.
//
// pybind11's dispatcher costs a few hundred nanoseconds per call (argument
// vectors on the heap, overload resolution, keyword matching); the serving
// loop calls these methods per sequence per pass, so they skip it. Each
// still only converts arguments and results.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstring>
#include <string>

namespace statecache::bindings {

namespace py = pybind11;

// Matches (args, nargs, kwnames) to `names`; the first `required` must be
// given. Missing optional arguments come back as nullptr.
template <size_t N>
std::array<PyObject*, N> fast_args(const char* fn, const std::array<const char*, N>& names, size_t required,
                                   PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  std::array<PyObject*, N> out{};
  if (nargs > static_cast<Py_ssize_t>(N))
    throw py::type_error(std::string(fn) + "() takes at most " + std::to_string(N) + " arguments (" +
                         std::to_string(nargs) + " given)");
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    size_t j = 0;
    while (j < N && PyUnicode_CompareWithASCIIString(key, names[j]) != 0) ++j;
    if (j == N)
      throw py::type_error(std::string(fn) + "() got an unexpected keyword argument " +
                           py::repr(key).cast<std::string>());
    if (out[j] != nullptr)
      throw py::type_error(std::string(fn) + "() got multiple values for argument '" + names[j] + "'");
    out[j] = args[nargs + k];
  }
  for (size_t i = 0; i < required; ++i)
    if (out[i] == nullptr)
      throw py::type_error(std::string(fn) + "() missing required argument '" + names[i] + "'");
  return out;
}

// The C++ object behind `self`. The method descriptor has already checked
// that `self` is an instance of the bound class, so no type lookup is needed.
template <class T>
T& fast_self(PyObject* self) {
  auto* inst = reinterpret_cast<py::detail::instance*>(self);
  void* value = inst->get_value_and_holder().value_ptr();
  if (value == nullptr) throw py::type_error("the object was not initialized (missing __init__ call?)");
  return *static_cast<T*>(value);
}

// Runs `body` (returning py::object) with pybind11's exception translation.
template <class Body>
PyObject* fast_call(Body&& body) {
  try {
    return body().release().ptr();
  } catch (...) {
    py::detail::try_translate_exceptions();
    return nullptr;
  }
}

// Installs `def` (static storage) on the bound class as a method descriptor.
inline void add_fast_method(py::handle cls, PyMethodDef* def) {
  py::object descr = py::reinterpret_steal<py::object>(
      PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), def));
  if (!descr) throw py::error_already_set();
  py::setattr(cls, def->ml_name, descr);
}

#define STATECACHE_FAST_METHOD(name, fn, doc) \
  PyMethodDef { name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fn)), METH_FASTCALL | METH_KEYWORDS, doc }

}  // namespace statecache::bindings
