// Vectorcall methods and getters for the pools' hot paths.
//
// A serving loop calls the pools once or more per sequence per pass, and
// pybind11's generic dispatcher costs a few times a plain Python method call,
// which is more than most of these methods' work. Methods registered here are
// CPython METH_FASTCALL descriptors with a small keyword parser: positional and
// keyword forms, defaults and keyword-only parameters as the reference has
// them, and C++ exceptions mapped as everywhere else in the module.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/errors.h"
#include "core/sequence.h"

namespace statecache::bindings::fast {

namespace py = pybind11;

inline constexpr int kMaxParams = 6;

struct Params {
  std::string func;
  std::vector<std::string> names;
  int required = 0;     // leading parameters without a default
  int positional = 0;   // how many may be given positionally (rest keyword-only)
};

// Raises the Python exception for the C++ exception being handled.
inline void set_error_from_current() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const InvariantError& e) {
    PyErr_SetString(PyExc_AssertionError, e.what());
  } catch (const std::out_of_range& e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

// Fills out[i] for each parameter; optional ones not given stay nullptr.
// Returns false with a TypeError set, the way CPython words it.
inline bool parse(const Params& p, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                  PyObject** out) {
  const int n = static_cast<int>(p.names.size());
  if (nargs > p.positional) {
    PyErr_Format(PyExc_TypeError, "%s() takes %d positional argument%s but %zd were given", p.func.c_str(),
                 p.positional, p.positional == 1 ? "" : "s", nargs);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  if (kwnames) {
    const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      int slot = -1;
      for (int i = 0; i < n; ++i)
        if (PyUnicode_CompareWithASCIIString(key, p.names[static_cast<size_t>(i)].c_str()) == 0) slot = i;
      if (slot < 0) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", p.func.c_str(), key);
        return false;
      }
      if (out[slot]) {
        PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", p.func.c_str(), key);
        return false;
      }
      out[slot] = args[nargs + k];
    }
  }
  for (int i = 0; i < p.required; ++i)
    if (!out[i]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", p.func.c_str(),
                   p.names[static_cast<size_t>(i)].c_str());
      return false;
    }
  return true;
}

// The C++ object behind a pybind11 instance of T (or of a Python subclass).
// Reads the instance's first value slot directly once its type is known to
// carry exactly one pybind11 base (checked once per type; the last type seen
// is kept alive so its address cannot be reused). Anything unusual, and an
// instance whose __init__ has not run, goes through pybind11's caster, which
// raises the proper error.
template <class T>
T* instance_ptr(PyObject* obj) {
  static PyObject* verified = nullptr;  // guarded by the GIL
  PyTypeObject* type = Py_TYPE(obj);
  if (reinterpret_cast<PyObject*>(type) != verified) {
    if (py::detail::all_type_info(type).size() != 1) return py::cast<T*>(py::handle(obj));
    Py_XSETREF(verified, Py_NewRef(reinterpret_cast<PyObject*>(type)));
  }
  auto* inst = reinterpret_cast<py::detail::instance*>(obj);
  void* value = nullptr;
  bool constructed = false;
  if (inst->simple_layout) {
    value = inst->simple_value_holder[0];
    constructed = inst->simple_holder_constructed;
  } else {
    value = inst->nonsimple.values_and_holders[0];
    constructed = (inst->nonsimple.status[0] & py::detail::instance::status_holder_constructed) != 0;
  }
  if (!constructed || value == nullptr) return py::cast<T*>(py::handle(obj));
  return static_cast<T*>(value);
}

// A statecache.Sequence argument (or subclass instance); TypeError naming it.
inline Sequence& sequence_arg(PyObject* obj, const char* name) {
  static PyTypeObject* const type = reinterpret_cast<PyTypeObject*>(py::type::of<Sequence>().ptr());
  if (!PyObject_TypeCheck(obj, type))
    throw py::type_error(std::string(name) + " must be a statecache.Sequence, got " + Py_TYPE(obj)->tp_name);
  Sequence* s = instance_ptr<Sequence>(obj);
  if (!s) throw py::type_error(std::string(name) + " is a Sequence whose __init__ did not run");
  return *s;
}

inline PyObject* to_py(bool v) { return Py_NewRef(v ? Py_True : Py_False); }
inline PyObject* to_py(int64_t v) { return PyLong_FromLongLong(v); }
inline PyObject* to_py(double v) { return PyFloat_FromDouble(v); }
inline PyObject* none() { return Py_NewRef(Py_None); }

template <class F>
inline Params params_of;

template <class T, class F>
PyObject* trampoline(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* a[kMaxParams] = {};
  if (!parse(params_of<F>, args, nargs, kwnames, a)) return nullptr;
  try {
    T* t = instance_ptr<T>(self);
    if (!t) throw py::type_error("the pool's __init__ did not run");
    return F{}(*t, a);
  } catch (...) {
    set_error_from_current();
    return nullptr;
  }
}

// Registers `F` (a captureless lambda PyObject*(T&, PyObject** args)) as
// method `name` of class `cls`. `names` are the parameter names; the first
// `required` have no default, and only the first `positional` may be passed
// positionally (-1: all of them).
template <class T, class F>
void def(py::handle cls, const char* name, F, std::initializer_list<const char*> names, int required,
         const char* doc, int positional = -1) {
  Params& p = params_of<F>;
  p.func = name;
  p.required = required;
  p.positional = positional < 0 ? static_cast<int>(names.size()) : positional;
  if (names.size() > kMaxParams) throw std::logic_error("too many parameters for a fast method");
  // A name may carry its default ("flag=False") for the text signature.
  std::string sig = std::string(name) + "($self";
  int i = 0;
  for (const char* raw : names) {
    std::string n(raw);
    if (i == p.positional) sig += ", *";
    sig += ", " + n;
    p.names.push_back(n.substr(0, n.find('=')));
    ++i;
  }
  sig += ")\n--\n\n";
  // Method definitions and their docs live as long as the type: never freed.
  const std::string d(doc ? doc : "");
  auto* text = new std::string(d.find("\n--\n\n") == std::string::npos ? sig + d : d);
  auto* md = new PyMethodDef{name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&trampoline<T, F>)),
                             METH_FASTCALL | METH_KEYWORDS, text->c_str()};
  py::object descr =
      py::reinterpret_steal<py::object>(PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), md));
  if (!descr) throw py::error_already_set();
  py::setattr(cls, name, descr);
}

// The instance behind `self`; a TypeError when its __init__ did not run.
template <class T>
T& self_of(PyObject* self) {
  T* t = instance_ptr<T>(self);
  if (!t) throw py::type_error(std::string(Py_TYPE(self)->tp_name) + " instance whose __init__ did not run");
  return *t;
}

template <class T, class F>
PyObject* getter(PyObject* self, void*) {
  try {
    if constexpr (std::is_invocable_v<F, T&, PyObject*>)
      return F{}(self_of<T>(self), self);  // wants the Python object too
    else
      return F{}(self_of<T>(self));
  } catch (...) {
    set_error_from_current();
    return nullptr;
  }
}

// `closure` is the attribute's name, for the setter's error messages.
template <class T, class F>
int setter(PyObject* self, PyObject* value, void* closure) {
  const char* name = static_cast<const char*>(closure);
  if (!value) {
    PyErr_Format(PyExc_AttributeError, "can't delete attribute '%s'", name);
    return -1;
  }
  try {
    F{}(self_of<T>(self), value, name);
    return 0;
  } catch (...) {
    set_error_from_current();
    return -1;
  }
}

inline void add_getset(py::handle cls, PyGetSetDef* gs) {
  py::object descr =
      py::reinterpret_steal<py::object>(PyDescr_NewGetSet(reinterpret_cast<PyTypeObject*>(cls.ptr()), gs));
  if (!descr) throw py::error_already_set();
  py::setattr(cls, gs->name, descr);
}

// A read-only attribute computed by `F` (captureless, PyObject*(const T&), or
// PyObject*(const T&, PyObject* self)).
// Getset descriptors live as long as the type: never freed.
template <class T, class F>
void def_readonly(py::handle cls, const char* name, F, const char* doc = nullptr) {
  add_getset(cls, new PyGetSetDef{name, &getter<T, F>, nullptr, doc, nullptr});
}

// A read-write attribute: `Get` as for def_readonly, `Set` captureless
// void(T&, PyObject* value, const char* name), raising before it changes anything.
template <class T, class Get, class Set>
void def_property(py::handle cls, const char* name, Get, Set, const char* doc = nullptr) {
  add_getset(cls, new PyGetSetDef{name, &getter<T, Get>, &setter<T, Set>, doc,
                                  const_cast<char*>(name)});
}

}  // namespace statecache::bindings::fast
