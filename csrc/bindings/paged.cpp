// BlockPool and PageUnitCheckpointStore (SPEC.md §3, §5), with the owner
// table that turns Python owners into core tokens.
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/paged_store_methods.h"
#include "bindings/paged_values.h"
#include "core/checkpoint_store.h"

namespace statecache::bindings {

namespace ot = owner_token;

// ------------------------------------------------------------ owner table --

int64_t OwnerTable::intern(py::dict& ids, int kind, py::handle key, const BlockPool& pool) {
  PyObject* found = PyDict_GetItemWithError(ids.ptr(), key.ptr());  // TypeError if unhashable
  if (found != nullptr) return ot::make(kind, PyLong_AsLongLong(found));
  if (PyErr_Occurred()) throw py::error_already_set();
  if (entries_.size() >= sweep_at_) sweep(pool);
  const int64_t id = next_id_++;
  ids[key] = id;
  const int64_t token = ot::make(kind, id);
  entries_.emplace(token, Entry{py::reinterpret_borrow<py::object>(key), 0});
  return token;
}

void OwnerTable::sweep(const BlockPool& pool) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.retained == 0 && pool.units_held(it->first) == 0) {
      py::dict& ids = ot::kind(it->first) == ot::kTransfer ? transfer_ids_ : other_ids_;
      PyDict_DelItem(ids.ptr(), it->second.key.ptr());
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  sweep_at_ = std::max<size_t>(256, 2 * entries_.size());
}

int64_t OwnerTable::transfer_token(py::handle inner, const BlockPool& pool) {
  return intern(transfer_ids_, ot::kTransfer, inner, pool);
}

int64_t OwnerTable::token(py::handle owner, const BlockPool& pool) {
  PyObject* p = owner.ptr();
  if (PyTuple_Check(p) && PyTuple_GET_SIZE(p) == 2 && PyUnicode_Check(PyTuple_GET_ITEM(p, 0))) {
    PyObject* tag = PyTuple_GET_ITEM(p, 0);
    PyObject* inner = PyTuple_GET_ITEM(p, 1);
    if (PyUnicode_CompareWithASCIIString(tag, "state-checkpoint") == 0 && PyLong_Check(inner)) {
      int overflow = 0;
      const long long id = PyLong_AsLongLongAndOverflow(inner, &overflow);
      if (overflow == 0 && id >= 0 && id < ot::kMaxId) return ot::make(ot::kCheckpoint, id);
    }
    if (PyUnicode_CompareWithASCIIString(tag, "state-transfer") == 0)
      return intern(transfer_ids_, ot::kTransfer, inner, pool);
  }
  return intern(other_ids_, ot::kOther, owner, pool);
}

py::object OwnerTable::owner(int64_t token) const {
  if (token < 0) return py::none();
  switch (ot::kind(token)) {
    case ot::kCheckpoint:
      return py::make_tuple("state-checkpoint", ot::id(token));
    case ot::kTransfer:
      return py::make_tuple("state-transfer", entries_.at(token).key);
    default:
      return entries_.at(token).key;
  }
}

void OwnerTable::retain(int64_t token) {
  auto it = entries_.find(token);
  if (it != entries_.end()) ++it->second.retained;
}

void OwnerTable::unretain(int64_t token) {
  auto it = entries_.find(token);
  if (it != entries_.end() && it->second.retained > 0) --it->second.retained;
}

std::shared_ptr<PyBlockPool> as_block_pool(py::handle obj, const char* name) {
  if (!py::isinstance<PyBlockPool>(obj)) raise_type(name, "a statecache.BlockPool", obj);
  return obj.cast<std::shared_ptr<PyBlockPool>>();
}

namespace {

using Store = PageUnitCheckpointStore;

py::object list_or_none(bool ok, const std::vector<int64_t>& ids) {
  if (!ok) return py::none();
  return to_list(ids);
}

// ------------------------------------------------------------- BlockPool --

void bind_block_pool(py::module_& m) {
  py::classh<PyBlockPool> cls(m, "BlockPool", R"doc(
One pool of ``num_blocks`` blocks shared by the KV prefix cache and PAGE
checkpoint units.

Units: ``reserve_units(count, owner)`` takes ``count`` free blocks for
``owner`` (any hashable value, compared by equality) or returns None and takes
nothing; ``release_units`` / ``rekey_units`` raise ValueError, changing
nothing, unless ``owner`` holds every listed unit.

KV: ``allocate(count)`` hands out blocks with one reference each;
``free(block_ids)`` drops one reference per listed block; ``incref`` takes one
more (also revives a free block found by ``lookup``); ``publish(block, hash)``
files a full block under its content hash. A block whose last reference goes
keeps its hash and stays findable until the pool hands it out again (least
recently freed first, and only once no never-hashed block is free); then
``on_evict(hash)`` is called, after the pool is consistent again.)doc");
  cls.def(py::init([](py::handle num_blocks, py::handle on_evict) {
            auto pool = std::make_shared<PyBlockPool>(as_nonneg_int(num_blocks, "num_blocks"));
            if (!on_evict.is_none()) {
              if (!PyCallable_Check(on_evict.ptr())) raise_type("on_evict", "a callable or None", on_evict);
              pool->on_evict = py::reinterpret_borrow<py::object>(on_evict);
              PyBlockPool* raw = pool.get();
              pool->set_on_evict([raw](int64_t h) { raw->on_evict(h); });
            }
            return pool;
          }),
          py::arg("num_blocks"), py::arg("on_evict") = py::none())
      .def_property_readonly("num_blocks", &BlockPool::num_blocks)
      .def_property_readonly("num_free", &BlockPool::num_free,
                             "Blocks a reservation or allocation could take now (never-hashed + cached).")
      .def_property_readonly("num_cached", &BlockPool::num_cached, "Free blocks still findable by hash.")
      .def_property_readonly("num_kv_blocks", &BlockPool::num_kv_blocks, "Blocks held by the KV cache.")
      .def_property_readonly("num_reserved", &BlockPool::num_reserved, "Blocks held as units by an owner.")
      .def_property(
          "on_evict", [](const PyBlockPool& p) { return p.on_evict; },
          [](PyBlockPool& p, py::handle fn) {
            if (!fn.is_none() && !PyCallable_Check(fn.ptr())) raise_type("on_evict", "a callable or None", fn);
            p.on_evict = py::reinterpret_borrow<py::object>(fn);
            if (fn.is_none()) {
              p.set_on_evict(nullptr);
            } else {
              PyBlockPool* raw = &p;
              p.set_on_evict([raw](int64_t h) { raw->on_evict(h); });
            }
          },
          "Called with a hash when its block leaves the index (or None).")
      .def(
          "reserve_units",
          [](PyBlockPool& p, py::handle count, py::handle owner) {
            const int64_t n = as_nonneg_int(count, "count");
            const int64_t token = p.owners.token(owner, p);
            std::vector<int64_t> units;
            const bool ok = p.reserve_units(n, token, units);
            return list_or_none(ok, units);
          },
          py::arg("count"), py::arg("owner"))
      .def(
          "release_units",
          [](PyBlockPool& p, py::handle unit_ids, py::handle owner) {
            std::vector<int64_t> units = as_int_list(unit_ids, "unit_ids");
            p.release_units(units, p.owners.token(owner, p));
          },
          py::arg("unit_ids"), py::arg("owner"))
      .def(
          "rekey_units",
          [](PyBlockPool& p, py::handle unit_ids, py::handle old_owner, py::handle new_owner) {
            std::vector<int64_t> units = as_int_list(unit_ids, "unit_ids");
            const int64_t old_token = p.owners.token(old_owner, p);
            p.owners.retain(old_token);  // interning the new owner must not sweep the old
            int64_t new_token;
            try {
              new_token = p.owners.token(new_owner, p);
            } catch (...) {
              p.owners.unretain(old_token);
              throw;
            }
            p.owners.unretain(old_token);
            p.rekey_units(units, old_token, new_token);
          },
          py::arg("unit_ids"), py::arg("old_owner"), py::arg("new_owner"))
      .def(
          "owner_of", [](const PyBlockPool& p, py::handle unit) { return p.owners.owner(p.owner_of(as_int(unit, "unit"))); },
          py::arg("unit"), "The owner holding ``unit``; None for a free block or one held by the KV cache.")
      .def(
          "allocate",
          [](PyBlockPool& p, py::handle count) {
            std::vector<int64_t> blocks;
            const bool ok = p.allocate(as_nonneg_int(count, "count"), blocks);
            return list_or_none(ok, blocks);
          },
          py::arg("count"), "``count`` blocks with one reference each, or None (nothing taken).")
      .def(
          "free", [](PyBlockPool& p, py::handle ids) { p.free(as_int_list(ids, "block_ids")); },
          py::arg("block_ids"), "Drops one reference per listed block.")
      .def(
          "incref", [](PyBlockPool& p, py::handle ids) { p.incref(as_int_list(ids, "block_ids")); },
          py::arg("block_ids"), "Takes one more reference per listed block (a prefix hit).")
      .def(
          "lookup", [](const PyBlockPool& p, py::handle h) { return p.lookup(as_int(h, "hash")); },
          py::arg("hash"), "The block holding ``hash``, or -1.")
      .def(
          "publish",
          [](PyBlockPool& p, py::handle block, py::handle h) {
            return p.publish(as_int(block, "block"), as_int(h, "hash"));
          },
          py::arg("block"), py::arg("hash"),
          "Files a full KV block under ``hash``; False when another block already holds it.")
      .def(
          "block_hash", [](const PyBlockPool& p, py::handle b) { return p.block_hash(as_int(b, "block")); },
          py::arg("block"))
      .def(
          "ref_count", [](const PyBlockPool& p, py::handle b) { return p.ref_count(as_int(b, "block")); },
          py::arg("block"))
      .def("reset_prefix_cache", &BlockPool::reset_prefix_cache,
           "Drops every hash from the index (on_evict fires for each); returns how many.")
      .def("check_consistency", &BlockPool::check_consistency,
           "Raises AssertionError when an internal invariant is broken (for tests).");
}

// ------------------------------------------------------------ store views --

struct RecordsView {
  std::shared_ptr<Store> store;
};
struct HashIndexView {
  std::shared_ptr<Store> store;
};
struct BacklogView {
  std::shared_ptr<Store> store;
};

py::object record_or_none(const std::shared_ptr<Store>& s, py::handle key) {
  if (!PyLong_Check(key.ptr())) return py::none();
  int overflow = 0;
  const long long id = PyLong_AsLongLongAndOverflow(key.ptr(), &overflow);
  if (overflow != 0 || s->record(id) == nullptr) return py::none();
  return py::cast(RecordHandle(s, id));
}

py::object index_or_none(const std::shared_ptr<Store>& sp, py::handle key) {
  const Store& s = *sp;
  if (!PyLong_Check(key.ptr())) return py::none();
  int overflow = 0;
  const long long h = PyLong_AsLongLongAndOverflow(key.ptr(), &overflow);
  if (overflow != 0) return py::none();
  const int64_t id = s.hash_index_get(h);
  if (id < 0) return py::none();
  return py::int_(id);
}

py::list record_keys(const std::shared_ptr<Store>& s) { return to_list(s->record_ids()); }
py::list index_keys(const std::shared_ptr<Store>& s) {
  py::list out;
  for (const auto& [h, id] : s->hash_index()) out.append(h);
  return out;
}

py::dict records_dict(const std::shared_ptr<Store>& s) {
  py::dict d;
  for (int64_t id : s->record_ids()) d[py::int_(id)] = py::cast(RecordHandle(s, id));
  return d;
}
py::dict index_dict(const std::shared_ptr<Store>& s) {
  py::dict d;
  for (const auto& [h, id] : s->hash_index()) d[py::int_(h)] = id;
  return d;
}

// Read-only mapping protocol over one of the store's tables.
template <class View>
void def_mapping(py::class_<View>& cls, py::object (*get)(const std::shared_ptr<Store>&, py::handle),
                 py::list (*keys)(const std::shared_ptr<Store>&), py::dict (*as_dict)(const std::shared_ptr<Store>&),
                 int64_t (*size)(const Store&)) {
  cls.def("__len__", [size](const View& v) { return size(*v.store); })
      .def("__getitem__",
           [get](const View& v, py::handle k) {
             py::object r = get(v.store, k);
             if (r.is_none()) throw py::key_error(py_repr(k));
             return r;
           })
      .def("__contains__", [get](const View& v, py::handle k) { return !get(v.store, k).is_none(); })
      .def("__iter__", [keys](const View& v) { return py::iter(keys(v.store)); })
      .def("keys", [keys](const View& v) { return keys(v.store); })
      .def("values", [as_dict](const View& v) { return py::list(as_dict(v.store).attr("values")()); })
      .def("items", [as_dict](const View& v) { return py::list(as_dict(v.store).attr("items")()); })
      .def(
          "get",
          [get](const View& v, py::handle k, py::object dflt) {
            py::object r = get(v.store, k);
            return r.is_none() ? dflt : r;
          },
          py::arg("key"), py::arg("default") = py::none())
      .def("copy", [as_dict](const View& v) { return as_dict(v.store); })
      .def("__eq__", [as_dict](const View& v, py::handle other) { return as_dict(v.store).equal(other); })
      .def("__repr__", [as_dict](const View& v) { return py_repr(as_dict(v.store)); });
  py::module_::import("collections.abc").attr("Mapping").attr("register")(cls);
}

int64_t num_records(const Store& s) { return s.num_records(); }
int64_t num_indexed(const Store& s) { return s.hash_index_size(); }

void bind_store_views(py::module_& m) {
  py::class_<RecordsView> records(m, "CheckpointRecordsView",
                                  "Live read-only mapping checkpoint id -> CheckpointRecord (live, read-only), oldest first.");
  def_mapping(records, &record_or_none, &record_keys, &records_dict, &num_records);
  py::class_<HashIndexView> index(m, "CheckpointHashIndexView",
                                  "Live read-only mapping hash -> READY checkpoint id, in the order they became READY.");
  def_mapping(index, &index_or_none, &index_keys, &index_dict, &num_indexed);

  py::class_<BacklogView>(m, "OffloadBacklogView", "Live view of the checkpoint ids nominated for offload, oldest first.")
      .def("__len__", [](const BacklogView& v) { return v.store->store_backlog().size(); })
      .def("__bool__", [](const BacklogView& v) { return !v.store->store_backlog().empty(); })
      .def("__iter__",
           [](const BacklogView& v) {
             const auto& q = v.store->store_backlog();
             return py::iter(to_list(std::vector<int64_t>(q.begin(), q.end())));
           })
      .def("__getitem__",
           [](const BacklogView& v, int64_t i) {
             const auto& q = v.store->store_backlog();
             const int64_t n = static_cast<int64_t>(q.size());
             if (i < 0) i += n;
             if (i < 0 || i >= n) throw py::index_error("backlog index out of range");
             return q[static_cast<size_t>(i)];
           })
      .def("__eq__",
           [](const BacklogView& v, py::handle other) {
             const auto& q = v.store->store_backlog();
             return to_list(std::vector<int64_t>(q.begin(), q.end())).equal(py::list(py::reinterpret_borrow<py::object>(other)));
           })
      .def("__repr__", [](const BacklogView& v) {
        const auto& q = v.store->store_backlog();
        return "deque(" + py_repr(to_list(std::vector<int64_t>(q.begin(), q.end()))) + ")";
      });
}

}  // namespace

// ---------------------------------------------------------- shared methods --
// The store's public methods, defined once and used by both the store and
// the coordinator's pass-throughs.

py::object changed_since_py(const Store& s, py::handle generation) {
  auto changed = s.changed_since(as_int(generation, "generation"));
  if (!changed) return py::none();
  py::set out;
  for (int64_t h : *changed) out.add(py::int_(h));
  return out;
}

namespace {

// ---- hot methods (fastcall) ----

PyObject* store_lookup(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return fast_call([&] {
    auto a = fast_args<1>("lookup", {"prefix_hash"}, 1, args, nargs, kwnames);
    const Store& s = fast_self<Store>(self);
    return py::reinterpret_steal<py::object>(PyLong_FromLongLong(s.lookup(as_int(a[0], "prefix_hash"))));
  });
}

PyObject* store_contains_or_pending(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return fast_call([&] {
    auto a = fast_args<1>("contains_or_pending", {"prefix_hash"}, 1, args, nargs, kwnames);
    const Store& s = fast_self<Store>(self);
    return py::reinterpret_steal<py::object>(PyBool_FromLong(s.contains_or_pending(as_int(a[0], "prefix_hash"))));
  });
}

PyObject* store_begin_store(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return fast_call([&]() -> py::object {
    auto a = fast_args<3>("begin_store", {"prefix_hash", "src_slot", "position"}, 2, args, nargs, kwnames);
    Store& s = fast_self<Store>(self);
    const int64_t position = a[2] == nullptr ? 0 : as_int(a[2], "position");
    if (position < 0) bad_argument("position", position, "must be >= 0");
    auto op = s.begin_store(as_int(a[0], "prefix_hash"), as_int(a[1], "src_slot"), position);
    return op ? py::cast(std::move(*op)) : py::none();
  });
}

PyObject* store_begin_restore(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return fast_call([&]() -> py::object {
    auto a = fast_args<2>("begin_restore", {"prefix_hash", "dst_slot"}, 2, args, nargs, kwnames);
    Store& s = fast_self<Store>(self);
    auto op = s.begin_restore(as_int(a[0], "prefix_hash"), as_int(a[1], "dst_slot"));
    return op ? py::cast(std::move(*op)) : py::none();
  });
}

std::shared_ptr<PyBlockPool> py_pool(const Store& s) { return std::dynamic_pointer_cast<PyBlockPool>(s.pool_ptr()); }

void bind_store(py::module_& m) {
  py::classh<Store> cls(m, "PageUnitCheckpointStore", R"doc(
Content index and unit ownership for PAGE checkpoint images.

``begin_store`` files a COPYING record whose units the next batch scatters
into; ``complete_inflight`` (top of the following pass) makes it READY, the
only state ``lookup`` finds. READY unpinned checkpoints are spent least
recently used first when units run short. Offload: READY checkpoints are
nominated to a tier (``offload_sink``), handed out pinned by
``take_offload_stores`` and unpinned in two phases.)doc");
  cls.def(py::init([](py::handle pool, py::handle spec, py::handle sink) {
            return std::make_shared<Store>(as_block_pool(pool, "pool"), as_spec(spec, "spec"),
                                           as_bool(sink, "offload_sink"));
          }),
          py::arg("pool"), py::arg("spec"), py::arg("offload_sink") = false)
      .def_property_readonly("pool", [](const Store& s) { return py_pool(s); })
      .def_property_readonly("spec", [](const Store& s) { return s.spec(); })
      .def_property_readonly("units_per_checkpoint", &Store::units_per_checkpoint)
      .def_property_readonly("generation", &Store::generation)
      .def_property_readonly("evictions", &Store::evictions)
      .def_property_readonly("offload_pins_reclaimed", &Store::offload_pins_reclaimed)
      .def_property_readonly("offload_nominations_dropped", &Store::offload_nominations_dropped)
      .def_property_readonly("records", [](const std::shared_ptr<Store>& s) { return RecordsView{s}; })
      .def_property_readonly("hash_to_checkpoint", [](const std::shared_ptr<Store>& s) { return HashIndexView{s}; })
      .def_property_readonly("store_backlog", [](const std::shared_ptr<Store>& s) { return BacklogView{s}; })
      .def("take_restore_ops", [](Store& s) { return to_py_tuple(s.take_restore_ops()); })
      .def("cancel_queued_restore",
           [](Store& s, py::handle slot) { s.cancel_queued_restore(as_int(slot, "dst_slot")); }, py::arg("dst_slot"))
      .def("changed_since", &changed_since_py, py::arg("generation"),
           "Hashes whose READY standing could differ from what it was at ``generation``; None once the log no longer reaches back that far.")
      .def(
          "adopt_units",
          [](Store& s, py::handle unit_ids, py::handle owner, py::handle h) {
            std::vector<int64_t> units = as_int_list(unit_ids, "unit_ids");
            const int64_t prefix_hash = as_int(h, "prefix_hash");
            auto pool = py_pool(s);
            return s.adopt_units(units, pool->owners.token(owner, *pool), prefix_hash);
          },
          py::arg("unit_ids"), py::arg("owner"), py::arg("prefix_hash"))
      .def("complete_inflight", &Store::complete_inflight)
      .def("unindex", [](Store& s, py::handle h) { return s.unindex(as_int(h, "prefix_hash")); },
           py::arg("prefix_hash"))

      .def("clear", &Store::clear)
      .def(
          "use_clock",
          [](Store& s, py::object clock) {
            if (clock.is_none()) {
              s.set_clock(nullptr);
              return;
            }
            if (!PyCallable_Check(clock.ptr())) raise_type("clock", "a callable or None", clock);
            s.set_clock([clock]() { return clock().cast<double>(); });
          },
          py::arg("clock"),
          "Reads pin ages from ``clock()`` (seconds) instead of the monotonic clock; None restores it. For tests.")
      .def("check_consistency", &Store::check_consistency,
           "Raises AssertionError when an internal invariant is broken (for tests).");
  def_store_methods(cls, [](Store& s) -> Store& { return s; });
  static PyMethodDef fast[] = {
      STATECACHE_FAST_METHOD("lookup", &store_lookup, "lookup(prefix_hash)\n--\n\nThe READY checkpoint id filed under the hash, or -1."),
      STATECACHE_FAST_METHOD("contains_or_pending", &store_contains_or_pending,
                             "contains_or_pending(prefix_hash)\n--\n\nREADY, or a store of it is on its way."),
      STATECACHE_FAST_METHOD("begin_store", &store_begin_store,
                             "begin_store(prefix_hash, src_slot, position=0)\n--\n\n"
                             "A CheckpointStoreOp filing a COPYING image (evicting if needed), or None."),
      STATECACHE_FAST_METHOD("begin_restore", &store_begin_restore,
                             "begin_restore(prefix_hash, dst_slot)\n--\n\n"
                             "A CheckpointRestoreOp reading the READY image (pinned until the batch completes), or None."),
  };
  for (PyMethodDef& def : fast) add_fast_method(cls, &def);
}

}  // namespace

void bind_paged(py::module_& m) {
  bind_paged_types(m);
  bind_block_pool(m);
  bind_store_views(m);
  bind_store(m);
  bind_paged_coordinator(m);
}

}  // namespace statecache::bindings
