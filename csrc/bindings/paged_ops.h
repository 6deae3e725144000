// CheckpointStoreOp and CheckpointRestoreOp as Python objects.
//
// A drain hands out an op per store and per restore, over a hundred a pass,
// and pybind11's generic cast costs more per object than the op's own work
// (a type lookup, the instance registry, a separate heap value, and as much
// again to free it). These two frozen values are therefore small CPython
// types of our own holding the C++ value inline (created in paged_types.cpp),
// and the casters below let every binding convert them as any bound type.
// Every file that converts an op includes this header (paged_values.h does).
#pragma once

#include <pybind11/pybind11.h>

#include <new>
#include <utility>

#include "core/paged_types.h"

namespace statecache::bindings::ops {

template <class Op>
struct Object {
  PyObject_HEAD Op value;
};

// The Python type of Op, set once by bind_paged_types.
template <class Op>
inline PyTypeObject* type = nullptr;

template <class Op>
bool is_op(PyObject* obj) {
  return type<Op> != nullptr && PyObject_TypeCheck(obj, type<Op>);
}

// `obj` must pass is_op<Op>.
template <class Op>
const Op& value_of(PyObject* obj) {
  return reinterpret_cast<Object<Op>*>(obj)->value;
}

// A new object of `cls` (Op's type or a subclass) holding `v`; nullptr with
// MemoryError set when allocation fails.
template <class Op>
PyObject* make(PyTypeObject* cls, Op&& v) noexcept {
  PyObject* obj;
  if (cls == type<Op>) {
    // The exact type: not collected, no __dict__; skip the generic alloc's memset.
    obj = static_cast<PyObject*>(PyObject_Malloc(sizeof(Object<Op>)));
    if (!obj) return PyErr_NoMemory();
    PyObject_Init(obj, cls);  // takes a reference to the heap type
  } else {
    obj = cls->tp_alloc(cls, 0);
    if (!obj) return nullptr;
  }
  new (&reinterpret_cast<Object<Op>*>(obj)->value) Op(std::move(v));
  return obj;
}

template <class Op>
PyObject* make(Op&& v) noexcept {
  return make<Op>(type<Op>, std::move(v));
}

}  // namespace statecache::bindings::ops

#define STATECACHE_OP_CASTER(Op, Name)                                                             \
  template <>                                                                                      \
  struct type_caster<Op> {                                                                         \
    PYBIND11_TYPE_CASTER(Op, const_name(Name));                                                    \
    bool load(handle src, bool) {                                                                  \
      if (!::statecache::bindings::ops::is_op<Op>(src.ptr())) return false;                        \
      value = ::statecache::bindings::ops::value_of<Op>(src.ptr());                                \
      return true;                                                                                 \
    }                                                                                              \
    static handle cast(Op&& v, return_value_policy, handle) {                                      \
      PyObject* o = ::statecache::bindings::ops::make<Op>(std::move(v));                           \
      if (!o) throw error_already_set();                                                           \
      return o;                                                                                    \
    }                                                                                              \
    static handle cast(const Op& v, return_value_policy p, handle h) { return cast(Op(v), p, h); } \
  };

namespace pybind11::detail {
STATECACHE_OP_CASTER(statecache::CheckpointStoreOp, "CheckpointStoreOp")
STATECACHE_OP_CASTER(statecache::CheckpointRestoreOp, "CheckpointRestoreOp")
}  // namespace pybind11::detail
#undef STATECACHE_OP_CASTER
