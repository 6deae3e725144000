// Argument conversion shared by every binding file: strict ints (bool is not
// an int here), int lists from list / tuple / NumPy int64 arrays, and errors
// that name the argument and the bad value.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

namespace statecache::bindings {

namespace py = pybind11;

inline std::string py_repr(py::handle obj) { return py::repr(obj).cast<std::string>(); }

[[noreturn]] inline void raise_type(const char* name, const char* want, py::handle got) {
  throw py::type_error(std::string(name) + " must be " + want + ", got " +
                       Py_TYPE(got.ptr())->tp_name + " " + py_repr(got));
}

// A Python int (not bool) that fits in int64.
inline int64_t as_int(py::handle obj, const char* name) {
  if (PyLong_CheckExact(obj.ptr()) || (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr()))) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow != 0)
      throw py::value_error(std::string(name) + "=" + py_repr(obj) + " does not fit in 64 bits");
    return v;
  }
  // NumPy integer scalars and other exact-integer types.
  if (!PyBool_Check(obj.ptr()) && !PyFloat_Check(obj.ptr()) && PyIndex_Check(obj.ptr())) {
    py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
    if (!idx) throw py::error_already_set();
    return as_int(idx, name);
  }
  raise_type(name, "an int", obj);
}

inline int64_t as_nonneg_int(py::handle obj, const char* name) {
  int64_t v = as_int(obj, name);
  if (v < 0) throw py::value_error(std::string(name) + "=" + std::to_string(v) + " must be >= 0");
  return v;
}

inline bool as_bool(py::handle obj, const char* name) {
  if (PyBool_Check(obj.ptr())) return obj.ptr() == Py_True;
  if (PyLong_Check(obj.ptr())) return PyLong_AsLongLong(obj.ptr()) != 0;
  raise_type(name, "a bool", obj);
}

// A sequence of ints: list and tuple without per-element Python calls beyond
// the int read, NumPy int64 / int32 arrays through the buffer protocol.
inline void append_ints(py::handle obj, const char* name, std::vector<int64_t>& out) {
  PyObject* p = obj.ptr();
  if (PyList_Check(p) || PyTuple_Check(p)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(p);
    PyObject** items = PySequence_Fast_ITEMS(p);
    out.reserve(out.size() + static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* it = items[i];
      if (PyLong_CheckExact(it)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(it, &overflow);
        if (overflow != 0)
          throw py::value_error(std::string(name) + "[" + std::to_string(i) + "]=" +
                                py_repr(it) + " does not fit in 64 bits");
        out.push_back(v);
      } else {
        out.push_back(as_int(it, name));
      }
    }
    return;
  }
  if (py::isinstance<py::array>(obj)) {
    auto arr = py::reinterpret_borrow<py::array>(obj);
    if (arr.ndim() != 1) throw py::value_error(std::string(name) + " must be one-dimensional");
    if (arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')
      throw py::type_error(std::string(name) + " must hold integers, got dtype " +
                           py::str(arr.dtype()).cast<std::string>());
    auto a64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
    const int64_t* d = a64.data();
    out.insert(out.end(), d, d + a64.size());
    return;
  }
  if (PyUnicode_Check(p) || PyBytes_Check(p) || !PySequence_Check(p))
    raise_type(name, "a sequence of ints", obj);
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  out.reserve(out.size() + seq.size());
  for (py::handle it : seq) out.push_back(as_int(it, name));
}

inline std::vector<int64_t> as_int_list(py::handle obj, const char* name) {
  std::vector<int64_t> out;
  append_ints(obj, name, out);
  return out;
}

inline py::list to_list(const std::vector<int64_t>& v) {
  py::list out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(v[i]));
  return out;
}

inline py::tuple to_tuple(const std::vector<int64_t>& v) {
  py::tuple out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    PyTuple_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(v[i]));
  return out;
}

}  // namespace statecache::bindings
