// Methods the store and the coordinator expose alike (the coordinator only
// forwards them to its store): defined once, for any class with a store.
#pragma once

#include <pybind11/stl.h>

#include <cmath>

#include "bindings/docs.h"
#include "bindings/eviction.h"
#include "bindings/fast_call.h"
#include "bindings/paged_values.h"
#include "core/checkpoint_store.h"

namespace statecache::bindings {

inline std::optional<int64_t> optional_int(py::handle obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  return as_int(obj, name);
}

// A number of seconds: an int (any size; beyond a double it is +-inf, as
// Python's own comparisons would treat it) or a float, not a bool.
inline double as_seconds(py::handle obj, const char* name) {
  PyObject* p = obj.ptr();
  if (PyFloat_Check(p)) return PyFloat_AS_DOUBLE(p);
  if (PyBool_Check(p)) raise_type(name, "a number of seconds", obj);
  if (!PyLong_Check(p) && !PyIndex_Check(p)) {
    // Other real numbers (numpy.float32, Fraction) through __float__.
    if (Py_TYPE(p)->tp_as_number == nullptr || Py_TYPE(p)->tp_as_number->nb_float == nullptr)
      raise_type(name, "a number of seconds", obj);
    const double d = PyFloat_AsDouble(p);
    if (d == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    return d;
  }
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(p));
  if (!i) throw py::error_already_set();
  const double d = PyLong_AsDouble(i.ptr());
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return _PyLong_Sign(i.ptr()) > 0 ? HUGE_VAL : -HUGE_VAL;
  }
  return d;
}

inline py::object source_or_none(const std::optional<PageUnitCheckpointStore::Source>& src, const HashForm& form) {
  if (!src) return py::none();
  return to_py_source(src->first, src->second, form);
}

inline py::list sources(const std::vector<PageUnitCheckpointStore::Source>& srcs, const HashForm& form) {
  py::list out(srcs.size());
  for (size_t i = 0; i < srcs.size(); ++i)
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i),
                    to_py_source(srcs[i].first, srcs[i].second, form).release().ptr());
  return out;
}

// What the table below binds that is more than a member of the store.
inline py::list take_offload_stores(PageUnitCheckpointStore& s, int64_t max_inflight) {
  return sources(s.take_offload_stores(max_inflight), s.hash_form());
}
inline py::object acquire_checkpoint_source(PageUnitCheckpointStore& s, int64_t prefix_hash,
                                            std::optional<int64_t> max_inflight) {
  return source_or_none(s.acquire_checkpoint_source(prefix_hash, max_inflight), s.hash_form());
}
inline void release_offload_store_source(PageUnitCheckpointStore& s, py::handle op) {
  if (auto id = as_operation_id(op, s.hash_form())) s.release_offload_store_source(*id);
}
inline void settle_offload_store(PageUnitCheckpointStore& s, py::handle op) {
  if (auto id = as_operation_id(op, s.hash_form())) s.settle_offload_store(*id);
}
inline int64_t reclaim_stale_offload_pins(PageUnitCheckpointStore& s, py::handle timeout) {
  return s.reclaim_stale_offload_pins(as_seconds(timeout, "timeout_s"));
}
inline bool was_reclaimed(PageUnitCheckpointStore& s, py::handle op) {
  auto id = as_operation_id(op, s.hash_form());
  return id.has_value() && s.was_reclaimed(*id);
}

// `StoreOf{}(self)` gives the PageUnitCheckpointStore& behind `self` (a
// stateless lambda, so the fast methods can name it).
template <class T, class StoreOf>
void def_store_methods(py::classh<T>& cls, StoreOf store_of) {
  using Store = PageUnitCheckpointStore;
  using fast::hash_arg;
  fast::method<&Store::contains, StoreOf>(cls, "contains", {hash_arg("prefix_hash")});
  fast::method<&Store::has_available_units, StoreOf>(cls, "has_available_units",
                                                     {"count", hash_arg("protected_hash=None")});
  def_eviction_methods(cls, [store_of](T& self) -> Store& { return store_of(self); });
  fast::method<&Store::ensure_free_units, StoreOf>(cls, "ensure_free_units", {"count"});
  fast::method<&Store::restore_queued_for, StoreOf>(cls, "restore_queued_for", {"dst_slot"});
  fast::method<&Store::suspend_queued_restore, StoreOf>(cls, "suspend_queued_restore", {"dst_slot"});
  // pybind11's: the restore converts through its caster.
  cls.def(
         "resume_suspended_restore",
         [store_of](T& self, const SuspendedCheckpointRestore& r) { store_of(self).resume_suspended_restore(r); },
         py::arg("restore"), doc(cls, "resume_suspended_restore"))
      .def(
          "release_suspended_restore",
          [store_of](T& self, const SuspendedCheckpointRestore& r) { store_of(self).release_suspended_restore(r); },
          py::arg("restore"), doc(cls, "release_suspended_restore"));
  fast::method<&take_offload_stores, StoreOf>(cls, "take_offload_stores", {"max_inflight"});
  fast::method<&acquire_checkpoint_source, StoreOf>(cls, "acquire_checkpoint_source",
                                                    {hash_arg("prefix_hash"), "*", "max_inflight=None"});
  fast::method<&release_offload_store_source, StoreOf>(cls, "release_offload_store_source", {"op"});
  fast::method<&settle_offload_store, StoreOf>(cls, "settle_offload_store", {"op"});
  fast::method<&Store::has_offload_pins, StoreOf>(cls, "has_offload_pins", {});
  fast::method<&reclaim_stale_offload_pins, StoreOf>(cls, "reclaim_stale_offload_pins", {"timeout_s"});
  fast::method<&was_reclaimed, StoreOf>(cls, "was_reclaimed", {"op"});
}

}  // namespace statecache::bindings
