// Methods the store and the coordinator expose alike (the coordinator only
// forwards them to its store): defined once, for any class with a store.
#pragma once

#include <pybind11/stl.h>

#include <cmath>

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
  fast::method<&Store::contains, StoreOf>(
      cls, "contains", {hash_arg("prefix_hash")},
      "Returns whether a READY image is filed under ``prefix_hash``. Raises only for a bad argument "
      "(docs/contract.md, \"Errors\").");
  fast::method<&Store::has_available_units, StoreOf>(
      cls, "has_available_units", {"count", hash_arg("protected_hash=None")},
      "Returns whether ``count`` units could be had, evicting unpinned READY images if it came to "
      "that (never the one filed under ``protected_hash``). Raises ValueError for ``count < 0``.");
  def_eviction_methods(cls, [store_of](T& self) -> Store& { return store_of(self); });
  fast::method<&Store::ensure_free_units, StoreOf>(
      cls, "ensure_free_units", {"count"},
      "Evicts unpinned READY images until ``count`` units are free; returns whether they are "
      "(an unreachable count is refused before evicting anything). Raises ValueError for "
      "``count < 0``.");
  fast::method<&Store::restore_queued_for, StoreOf>(
      cls, "restore_queued_for", {"dst_slot"},
      "Returns whether a restore into ``dst_slot`` is queued. Raises only for a bad argument "
      "(docs/contract.md, \"Errors\").");
  fast::method<&Store::suspend_queued_restore, StoreOf>(
      cls, "suspend_queued_restore", {"dst_slot"},
      "Takes the restore queued into ``dst_slot`` out of the batch, keeping its pin; returns "
      "it, or None when none is queued. Raises AssertionError, changing nothing, when two "
      "restores are queued for the slot.");
  // pybind11's: the restore converts through its caster.
  cls.def(
         "resume_suspended_restore",
         [store_of](T& self, const SuspendedCheckpointRestore& r) { store_of(self).resume_suspended_restore(r); },
         py::arg("restore"),
         "Queues a suspended restore again; returns None. Raises ValueError for a restore this "
         "store did not suspend (or already resumed or released), AssertionError when its image "
         "lost its pin.")
      .def(
          "release_suspended_restore",
          [store_of](T& self, const SuspendedCheckpointRestore& r) { store_of(self).release_suspended_restore(r); },
          py::arg("restore"),
          "Drops a suspended restore and its pin; returns None. Raises ValueError for a restore "
          "this store did not suspend (or already resumed or released).");
  fast::method<&take_offload_stores, StoreOf>(
      cls, "take_offload_stores", {"max_inflight"},
      "Returns up to ``max_inflight`` (operation, unit ids) pairs to hand the tier now, each "
      "source pinned (none when ``max_inflight`` are already out). Raises only for a bad "
      "argument (docs/contract.md, \"Errors\").");
  fast::method<&acquire_checkpoint_source, StoreOf>(
      cls, "acquire_checkpoint_source", {hash_arg("prefix_hash"), "*", "max_inflight=None"},
      "Pins a READY image for an external transfer (never reclaimed by time); returns "
      "(operation id, unit ids), or None when there is no such image or ``max_inflight`` are "
      "out. Raises only for a bad argument (docs/contract.md, \"Errors\").");
  fast::method<&release_offload_store_source, StoreOf>(
      cls, "release_offload_store_source", {"op"},
      "Phase one: the units were read out, so the source's pin goes; the operation stays "
      "dispatched. Returns None. Raises TypeError for an unhashable op.");
  fast::method<&settle_offload_store, StoreOf>(
      cls, "settle_offload_store", {"op"},
      "Phase two: the tier write completed; the operation is retired. Returns None. Raises "
      "TypeError for an unhashable op.");
  fast::method<&Store::has_offload_pins, StoreOf>(cls, "has_offload_pins", {},
                                                  "Returns whether any offload pin is held. Raises nothing.");
  fast::method<&reclaim_stale_offload_pins, StoreOf>(
      cls, "reclaim_stale_offload_pins", {"timeout_s"},
      "Takes back offload pins older than ``timeout_s`` seconds (monotonic clock); returns how "
      "many. ``timeout_s <= 0`` reclaims nothing. Raises TypeError for a value that is not a "
      "number of seconds.");
  fast::method<&was_reclaimed, StoreOf>(
      cls, "was_reclaimed", {"op"},
      "Returns whether a stale-pin reclamation took the operation's pin. Raises TypeError for "
      "an unhashable op.");
}

}  // namespace statecache::bindings
