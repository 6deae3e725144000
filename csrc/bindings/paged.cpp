// BlockPool and PageUnitCheckpointStore (docs/contract.md, "Objects", "API guarantees"), with the owner
// table that turns Python owners into core tokens.
#include <pybind11/functional.h>

#include <pybind11/stl.h>
#include <algorithm>

#include "bindings/bindings.h"
#include "bindings/docs.h"
#include "bindings/paged_store_methods.h"
#include "bindings/paged_values.h"
#include "core/checkpoint_store.h"

namespace statecache::bindings {

namespace ot = owner_token;

// ------------------------------------------------------------ owner table --

namespace {

// Set while an owner's __hash__ / __eq__ may run: the table is consistent
// then, and a nested owner operation from the same thread is refused rather
// than interleaved; another thread's waits for its turn (call_gate.h).
class BusyScope {
 public:
  BusyScope(CallGate& gate, bool& busy) : busy_(busy) {
    if (busy_ && gate.held_by_this_thread())
      throw std::runtime_error("BlockPool: an owner's __hash__ or __eq__ called back into the pool's owner table");
    hold_.emplace(gate);
    busy_ = true;
  }
  ~BusyScope() { busy_ = false; }
  BusyScope(const BusyScope&) = delete;
  BusyScope& operator=(const BusyScope&) = delete;

 private:
  bool& busy_;
  std::optional<CallGate::Hold> hold_;  // released after busy_ is cleared
};

// The checkpoint id an owner's second field stands for: an int, or a value
// equal to one (7.0, numpy.int64(7)), as a dict would match it.
std::optional<int64_t> checkpoint_id_of(PyObject* inner) {
  auto in_range = [](long long v) { return v >= 0 && v < ot::kMaxId; };
  if (PyLong_Check(inner)) {
    int overflow = 0;
    const long long id = PyLong_AsLongLongAndOverflow(inner, &overflow);
    if (overflow == 0 && in_range(id)) return id;
    return std::nullopt;
  }
  if (PyFloat_Check(inner)) {
    const double d = PyFloat_AS_DOUBLE(inner);
    if (d >= 0 && d < static_cast<double>(ot::kMaxId) && d == static_cast<double>(static_cast<int64_t>(d)))
      return static_cast<int64_t>(d);
    return std::nullopt;
  }
  if (PyIndex_Check(inner)) {
    py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(inner));
    if (!idx) throw py::error_already_set();
    const int eq = PyObject_RichCompareBool(inner, idx.ptr(), Py_EQ);
    if (eq < 0) throw py::error_already_set();
    if (eq == 1) return checkpoint_id_of(idx.ptr());
  }
  return std::nullopt;
}

}  // namespace

int64_t OwnerTable::intern(py::dict& ids, int kind, py::handle key, const BlockPool* pool) {
  BusyScope scope(gate_, busy_);
  if (entries_.size() >= sweep_at_) sweep(pool);
  PyObject* found = PyDict_GetItemWithError(ids.ptr(), key.ptr());  // TypeError if unhashable
  if (found != nullptr) {
    const int64_t token = ot::make(kind, PyLong_AsLongLong(found));
    auto it = entries_.find(token);
    if (it != entries_.end()) return token;
    // A sweep could not delete the key: the id is still the owner's.
    entries_.emplace(token, Entry{py::reinterpret_borrow<py::object>(key), 0});
    return token;
  }
  if (PyErr_Occurred()) throw py::error_already_set();
  const int64_t id = next_id_;
  py::object value = py::reinterpret_steal<py::object>(PyLong_FromLongLong(id));
  if (!value || PyDict_SetItem(ids.ptr(), key.ptr(), value.ptr()) != 0) throw py::error_already_set();
  ++next_id_;
  const int64_t token = ot::make(kind, id);
  entries_.emplace(token, Entry{py::reinterpret_borrow<py::object>(key), 0});
  return token;
}

void OwnerTable::sweep(const BlockPool* pool) {
  // Entries go first, dict keys after: deleting a key runs its __eq__.
  std::vector<std::pair<int64_t, py::object>> dropped;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.retained == 0 && (pool == nullptr || pool->units_held(it->first) == 0)) {
      dropped.emplace_back(it->first, std::move(it->second.key));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  sweep_at_ = std::max<size_t>(256, 2 * entries_.size());
  for (auto& [token, key] : dropped) {
    py::dict& ids = ot::kind(token) == ot::kTransfer ? transfer_ids_ : other_ids_;
    if (PyDict_DelItem(ids.ptr(), key.ptr()) != 0) report_callback_error("BlockPool owner __hash__/__eq__");
  }
}

int64_t OwnerTable::transfer_token(py::handle inner, const BlockPool* pool) {
  return intern(transfer_ids_, ot::kTransfer, inner, pool);
}

int64_t OwnerTable::token(py::handle owner, const BlockPool* pool) {
  PyObject* p = owner.ptr();
  if (p == Py_None) throw py::value_error("owner=None: a unit owner must be a hashable value other than None");
  if (PyTuple_Check(p) && PyTuple_GET_SIZE(p) == 2 && PyUnicode_Check(PyTuple_GET_ITEM(p, 0))) {
    PyObject* tag = PyTuple_GET_ITEM(p, 0);
    py::object inner = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(p, 1));
    if (PyUnicode_CompareWithASCIIString(tag, "state-checkpoint") == 0) {
      if (auto id = checkpoint_id_of(inner.ptr())) return ot::make(ot::kCheckpoint, *id);
    } else if (PyUnicode_CompareWithASCIIString(tag, "state-transfer") == 0) {
      return intern(transfer_ids_, ot::kTransfer, inner, pool);
    }
  }
  return intern(other_ids_, ot::kOther, owner, pool);
}

py::object OwnerTable::owner(int64_t token) const {
  if (token < 0) return py::none();
  if (ot::kind(token) == ot::kCheckpoint) return py::make_tuple("state-checkpoint", ot::id(token));
  auto it = entries_.find(token);
  if (it == entries_.end()) throw std::logic_error("BlockPool: a unit's owner is not in the owner table");
  if (ot::kind(token) == ot::kTransfer) return py::make_tuple("state-transfer", it->second.key);
  return it->second.key;
}

void OwnerTable::retain(int64_t token) {
  auto it = entries_.find(token);
  if (it != entries_.end()) ++it->second.retained;
}

void OwnerTable::unretain(int64_t token) {
  auto it = entries_.find(token);
  if (it != entries_.end() && it->second.retained > 0) --it->second.retained;
}

int OwnerTable::traverse(visitproc visit, void* arg) const {
  Py_VISIT(transfer_ids_.ptr());
  Py_VISIT(other_ids_.ptr());
  for (const auto& kv : entries_) Py_VISIT(kv.second.key.ptr());
  return 0;
}

void OwnerTable::clear() {
  // Dropped after the table is empty: a key's __del__ may use the pool.
  py::dict transfer = std::move(transfer_ids_), other = std::move(other_ids_);
  std::unordered_map<int64_t, Entry> entries;
  entries.swap(entries_);
  transfer_ids_ = py::dict();
  other_ids_ = py::dict();
}

// -------------------------------------------------------------- callbacks --

void report_callback_error(const char* where) {
  if (!PyErr_Occurred()) return;
  py::object context = py::str(where);
  PyErr_WriteUnraisable(context.ptr());
}

PyBlockPool::PyBlockPool(int64_t num_blocks) : BlockPool(num_blocks) {
  set_on_evict([this](int64_t h) { evicted(h); });
}

void PyBlockPool::evicted(int64_t hash) {
  if (on_evict.is_none()) return;
  py::object fn = on_evict;  // the handler may replace or detach itself
  try {
    fn(hash_object(hash, hash_form()));
  } catch (py::error_already_set& e) {
    e.restore();
    report_callback_error("BlockPool.on_evict");
  } catch (...) {
    fast::set_error_from_current();  // the module's one C++ -> Python mapping
    report_callback_error("BlockPool.on_evict");
  }
}

void PyBlockPool::add_store(const std::shared_ptr<const PageUnitCheckpointStore>& store) {
  stores_.erase(std::remove_if(stores_.begin(), stores_.end(), [](const auto& w) { return w.expired(); }),
                stores_.end());
  stores_.push_back(store);
}

void PyBlockPool::refuse_store_units(const std::vector<int64_t>& units, int64_t token) const {
  if (ot::kind(token) != ot::kCheckpoint) return;
  for (const auto& weak : stores_) {
    auto store = weak.lock();
    const CheckpointRecord* rec = store ? store->record(ot::id(token)) : nullptr;
    if (rec == nullptr) continue;
    for (int64_t u : units)
      if (std::find(rec->unit_ids.begin(), rec->unit_ids.end(), u) != rec->unit_ids.end())
        throw py::value_error("unit_ids: unit " + std::to_string(u) + " belongs to checkpoint " +
                              std::to_string(ot::id(token)) +
                              " of a PageUnitCheckpointStore; only that store releases it");
  }
}

// ------------------------------------------------------------ other pools --

py::object PyUnitPool::live() const {
  if (pool.is_none())
    throw std::runtime_error("pool: the garbage collector cleared this store's pool; the store cannot take units");
  return pool;  // a reference of our own: the call may drop the store's
}

int64_t PyUnitPool::num_free() {
  CallGate::Hold hold(gate);
  py::object p = live();
  return as_int(p.attr("num_free"), "pool.num_free");
}

bool PyUnitPool::reserve_units(int64_t count, int64_t owner, std::vector<int64_t>& out) {
  out.clear();
  CallGate::Hold hold(gate);
  py::object p = live();
  py::object who = owners.owner(owner);
  py::object got = p.attr("reserve_units")(count, who);
  if (got.is_none()) return false;
  std::vector<int64_t> units = as_int_list(got, "pool.reserve_units()");
  std::string why;
  std::vector<int64_t> sorted(units);
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty() && sorted.front() < 0) {
    why = "returned a negative unit id (" + std::to_string(sorted.front()) + ")";
  } else if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    why = "returned a unit id twice";
  } else if (static_cast<int64_t>(units.size()) != count) {
    why = "returned " + std::to_string(units.size()) + " unit ids for a reservation of " + std::to_string(count);
    // Well-formed but not what was asked: they go back (best effort).
    try {
      p.attr("release_units")(to_tuple(units), who);
    } catch (py::error_already_set& e) {
      e.restore();
      report_callback_error("pool.release_units");
    }
  }
  if (!why.empty()) {
    throw py::value_error("pool.reserve_units(" + std::to_string(count) + ", " + py_repr(who) + ") " + why +
                          "; nothing was filed");
  }
  out = std::move(units);
  return true;
}

void PyUnitPool::release_units(const std::vector<int64_t>& units, int64_t owner) {
  CallGate::Hold hold(gate);
  py::object p = live();
  py::object who = owners.owner(owner);
  p.attr("release_units")(to_tuple(units), who);
}

void PyUnitPool::rekey_units(const std::vector<int64_t>& units, int64_t old_owner, int64_t new_owner) {
  CallGate::Hold hold(gate);
  py::object p = live();
  py::object from = owners.owner(old_owner), to = owners.owner(new_owner);
  p.attr("rekey_units")(to_tuple(units), from, to);
}

UnitPoolArg as_unit_pool(py::handle obj, const char* name) {
  if (py::isinstance<PyBlockPool>(obj)) return {obj.cast<std::shared_ptr<PyBlockPool>>(), nullptr};
  if (obj.is_none()) raise_type(name, "a statecache.BlockPool or a pool with its unit methods", obj);
  return {nullptr, std::make_shared<PyUnitPool>(py::reinterpret_borrow<py::object>(obj))};
}

PyStore::PyStore(py::object pool_object, std::shared_ptr<PyBlockPool> pool, PagedStateCheckpointSpec spec, bool sink)
    : PageUnitCheckpointStore(std::move(pool), std::move(spec), sink), pool_obj(std::move(pool_object)) {
  install_clock();
}

PyStore::PyStore(py::object pool_object, std::shared_ptr<PyUnitPool> pool, PagedStateCheckpointSpec spec, bool sink)
    : PageUnitCheckpointStore(std::shared_ptr<PageUnitProvider>(std::move(pool)), std::move(spec), sink),
      pool_obj(std::move(pool_object)) {
  install_clock();
}

void PyStore::install_clock() {
  // Installed once: the clock may be replaced while it runs.
  set_clock([this]() -> double {
    if (clock.is_none()) return monotonic_seconds();
    py::object fn = clock;
    py::object v = fn();
    if (PyFloat_Check(v.ptr())) return PyFloat_AS_DOUBLE(v.ptr());
    if (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) {
      const double d = PyLong_AsDouble(v.ptr());
      if (d == -1.0 && PyErr_Occurred()) throw py::error_already_set();
      return d;
    }
    raise_type("clock()", "a number of seconds", v);
  });
}

void PyStore::use_clock(py::object fn) {
  if (!fn.is_none() && !PyCallable_Check(fn.ptr())) raise_type("clock", "a callable or None", fn);
  clock = std::move(fn);
}

std::shared_ptr<PyStore> make_py_store(py::handle pool_obj, const UnitPoolArg& pool, PagedStateCheckpointSpec spec,
                                       bool sink) {
  py::object obj = py::reinterpret_borrow<py::object>(pool_obj);
  if (pool.foreign) return std::make_shared<PyStore>(std::move(obj), pool.foreign, std::move(spec), sink);
  auto store = std::make_shared<PyStore>(std::move(obj), pool.native, std::move(spec), sink);
  pool.native->add_store(store);
  return store;
}

namespace {

using Store = PageUnitCheckpointStore;

py::object list_or_none(bool ok, const std::vector<int64_t>& ids) {
  if (!ok) return py::none();
  return to_list(ids);
}

// ------------------------------------------------------------- BlockPool --

int traverse_pool(PyBlockPool& p, visitproc visit, void* arg) {
  Py_VISIT(p.on_evict.ptr());
  return p.owners.traverse(visit, arg);
}

void clear_pool(PyBlockPool& p) {
  py::object old = std::move(p.on_evict);
  p.on_evict = py::none();
  p.owners.clear();
}

py::object block_owner(const PyBlockPool& p, int64_t unit) { return p.owners.owner(p.owner_of(unit)); }
py::object block_hash(const PyBlockPool& p, int64_t block) { return hash_object(p.block_hash(block), p.hash_form()); }

py::object reserve_units_for(PyBlockPool& p, int64_t count, py::handle owner) {
  const int64_t token = p.owners.token(owner, &p);
  std::vector<int64_t> units;
  const bool ok = p.reserve_units(count, token, units);
  return list_or_none(ok, units);
}

void release_units_of(PyBlockPool& p, const std::vector<int64_t>& units, py::handle owner) {
  const int64_t token = p.owners.token(owner, &p);
  p.refuse_store_units(units, token);
  p.release_units(units, token);
}

void rekey_units_of(PyBlockPool& p, const std::vector<int64_t>& units, py::handle old_owner, py::handle new_owner) {
  const int64_t old_token = p.owners.token(old_owner, &p);
  p.owners.retain(old_token);  // interning the new owner must not sweep the old
  int64_t new_token;
  try {
    new_token = p.owners.token(new_owner, &p);
  } catch (...) {
    p.owners.unretain(old_token);
    throw;
  }
  p.owners.unretain(old_token);
  p.refuse_store_units(units, old_token);
  p.rekey_units(units, old_token, new_token);
}

void bind_block_pool(py::module_& m) {
  py::classh<PyBlockPool> cls(m, "BlockPool", py::metaclass(fast::guarded_metaclass()),
                              fast::gc_setup<PyBlockPool, &traverse_pool, &clear_pool>(), doc("BlockPool"));
  fast::refuse_copy(cls);
  cls.def(py::init([](py::handle num_blocks, py::handle on_evict) {
            if (!on_evict.is_none() && !PyCallable_Check(on_evict.ptr()))
              raise_type("on_evict", "a callable or None", on_evict);
            auto pool = std::make_shared<PyBlockPool>(as_nonneg_int(num_blocks, "num_blocks"));
            pool->on_evict = py::reinterpret_borrow<py::object>(on_evict);
            return pool;
          }),
          py::arg("num_blocks"), py::arg("on_evict") = py::none(), doc(cls, "__init__"));
  using fast::to_py;
  using P = PyBlockPool;
  fast::attr<&P::num_blocks>(cls, "num_blocks");
  fast::attr<&P::num_free>(cls, "num_free");
  fast::attr<&P::num_cached>(cls, "num_cached");
  fast::attr<&P::num_kv_blocks>(cls, "num_kv_blocks");
  fast::attr<&P::num_reserved>(cls, "num_reserved");
  fast::def_property<P>(
      cls, "on_evict", [](const P& p) { return Py_NewRef(p.on_evict.ptr()); },
      [](P& p, PyObject* fn, const char* name) {
        if (fn != Py_None && !PyCallable_Check(fn)) raise_type(name, "a callable or None", py::handle(fn));
        py::object old = std::move(p.on_evict);  // released after the swap: its __del__ may use the pool
        p.on_evict = py::reinterpret_borrow<py::object>(fn);
      });
  fast::method<&reserve_units_for>(cls, "reserve_units", {fast::nonneg_arg("count"), "owner"});
  fast::method<&release_units_of>(cls, "release_units", {"unit_ids", "owner"});
  fast::method<&rekey_units_of>(cls, "rekey_units", {"unit_ids", "old_owner", "new_owner"});
  using fast::hash_arg;
  fast::method<&block_owner>(cls, "owner_of", {"unit"});
  // pybind11's own (tests/python/api/test_stubs.py reads its function object).
  cls.def(
      "allocate",
      [](PyBlockPool& p, py::handle count) {
        std::vector<int64_t> blocks;
        const bool ok = p.allocate(as_nonneg_int(count, "count"), blocks);
        return list_or_none(ok, blocks);
      },
      py::arg("count"), doc(cls, "allocate"));
  fast::method<&BlockPool::free>(cls, "free", {"block_ids"});
  fast::method<&BlockPool::incref>(cls, "incref", {"block_ids"});
  fast::method<&BlockPool::lookup>(cls, "lookup", {hash_arg("hash")});
  fast::method<&BlockPool::publish>(cls, "publish", {"block", hash_arg("hash")});
  fast::method<&block_hash>(cls, "block_hash", {"block"});
  fast::method<&BlockPool::ref_count>(cls, "ref_count", {"block"});
  fast::method<&BlockPool::reset_prefix_cache>(cls, "reset_prefix_cache", {});
  fast::method<&BlockPool::check_consistency>(cls, "check_consistency", {});
}

// ------------------------------------------------------------ store views --

// A live view holds its store's Python object (so the store, and whatever
// holds it, stays alive and collectable) and the C++ store it reads.
struct StoreView {
  py::object owner;
  std::shared_ptr<Store> store;
};
struct RecordsView : StoreView {};
struct HashIndexView : StoreView {};
struct BacklogView : StoreView {};

template <class View>
py::object make_view(py::handle store_obj) {
  View v;
  v.owner = py::reinterpret_borrow<py::object>(store_obj);
  v.store = store_obj.cast<std::shared_ptr<PyStore>>();
  return fast::cast_cached<View>(std::move(v));
}

py::object record_or_none(const std::shared_ptr<Store>& s, py::handle key) {
  if (!PyLong_Check(key.ptr())) return py::none();
  int overflow = 0;
  const long long id = PyLong_AsLongLongAndOverflow(key.ptr(), &overflow);
  if (overflow != 0 || s->record(id) == nullptr) return py::none();
  return py::cast(RecordHandle(s, id));
}

py::object index_or_none(const std::shared_ptr<Store>& sp, py::handle key) {
  const Store& s = *sp;
  int64_t h = 0;
  if (!PyLong_Check(key.ptr()) || !hash_key(key, s.hash_form(), h)) return py::none();
  const int64_t id = s.hash_index_get(h);
  if (id < 0) return py::none();
  return py::int_(id);
}

py::list record_keys(const std::shared_ptr<Store>& s) { return to_list(s->record_ids()); }
py::list index_keys(const std::shared_ptr<Store>& s) {
  py::list out;
  for (const auto& [h, id] : s->hash_index()) out.append(hash_object(h, s->hash_form()));
  return out;
}

py::dict records_dict(const std::shared_ptr<Store>& s) {
  py::dict d;
  for (int64_t id : s->record_ids()) d[py::int_(id)] = py::cast(RecordHandle(s, id));
  return d;
}
py::dict index_dict(const std::shared_ptr<Store>& s) {
  py::dict d;
  for (const auto& [h, id] : s->hash_index()) d[hash_object(h, s->hash_form())] = id;
  return d;
}

// Read-only mapping protocol over one of the store's tables.
template <class View>
void def_mapping(py::classh<View>& cls, py::object (*get)(const std::shared_ptr<Store>&, py::handle),
                 py::list (*keys)(const std::shared_ptr<Store>&), py::dict (*as_dict)(const std::shared_ptr<Store>&),
                 int64_t (*size)(const Store&)) {
  fast::refuse_copy(cls);
  cls.def("__len__", [size](const View& v) { return size(*v.store); })
      .def(
          "__getitem__",
          [get](const View& v, py::handle k) {
            py::object r = get(v.store, k);
            if (r.is_none()) throw py::key_error(py_repr(k));
            return r;
          },
          doc(cls, "__getitem__"))
      .def("__contains__", [get](const View& v, py::handle k) { return !get(v.store, k).is_none(); })
      .def("__iter__", [keys](const View& v) { return py::iter(keys(v.store)); })
      .def(
          "keys", [keys](const View& v) { return keys(v.store); }, doc(cls, "keys"))
      .def(
          "values", [as_dict](const View& v) { return py::list(as_dict(v.store).attr("values")()); },
          doc(cls, "values"))
      .def(
          "items", [as_dict](const View& v) { return py::list(as_dict(v.store).attr("items")()); }, doc(cls, "items"))
      .def(
          "get",
          [get](const View& v, py::handle k, py::object dflt) {
            py::object r = get(v.store, k);
            return r.is_none() ? dflt : r;
          },
          py::arg("key"), py::arg("default") = py::none(), doc(cls, "get"))
      .def(
          "copy", [as_dict](const View& v) { return as_dict(v.store); }, doc(cls, "copy"))
      .def("__eq__", [as_dict](const View& v, py::handle other) { return as_dict(v.store).equal(other); })
      .def("__repr__", [as_dict](const View& v) { return py_repr(as_dict(v.store)); });
  py::module_::import("collections.abc").attr("Mapping").attr("register")(cls);
}

int64_t num_records(const Store& s) { return s.num_records(); }
int64_t num_indexed(const Store& s) { return s.hash_index_size(); }

void bind_store_views(py::module_& m) {
  py::classh<RecordsView> records(m, "CheckpointRecordsView", py::metaclass(fast::guarded_metaclass()),
                                  fast::owner_gc_setup<RecordsView>(), doc("CheckpointRecordsView"));
  def_mapping(records, &record_or_none, &record_keys, &records_dict, &num_records);
  py::classh<HashIndexView> index(m, "CheckpointHashIndexView", py::metaclass(fast::guarded_metaclass()),
                                  fast::owner_gc_setup<HashIndexView>(), doc("CheckpointHashIndexView"));
  def_mapping(index, &index_or_none, &index_keys, &index_dict, &num_indexed);

  py::classh<BacklogView> backlog(m, "OffloadBacklogView", py::metaclass(fast::guarded_metaclass()),
                                  fast::owner_gc_setup<BacklogView>(), doc("OffloadBacklogView"));
  fast::refuse_copy(backlog);
  backlog.def("__len__", [](const BacklogView& v) { return v.store->store_backlog().size(); })
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
           [](const BacklogView& v, py::handle other) -> py::object {
             if (!py::isinstance<py::iterable>(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             const auto& q = v.store->store_backlog();
             py::list mine = to_list(std::vector<int64_t>(q.begin(), q.end()));
             return py::bool_(mine.equal(py::list(py::reinterpret_borrow<py::object>(other))));
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
  for (int64_t h : *changed) out.add(hash_object(h, s.hash_form()));
  return out;
}

namespace {

// ---- hot methods (fastcall) ----

py::object pool_object(const PyStore& s) {
  if (!s.pool_obj.is_none()) return s.pool_obj;
  if (s.foreign()) return s.foreign()->pool;
  return py::cast(s.py_pool());
}

int traverse_store(PyStore& s, visitproc visit, void* arg) {
  Py_VISIT(s.pool_obj.ptr());
  Py_VISIT(s.clock.ptr());
  if (PyUnitPool* f = s.foreign()) {
    Py_VISIT(f->pool.ptr());
    return f->owners.traverse(visit, arg);
  }
  return 0;
}

void clear_store(PyStore& s) {
  py::object pool = std::move(s.pool_obj), clock = std::move(s.clock), other;
  s.pool_obj = py::none();
  s.clock = py::none();
  if (PyUnitPool* f = s.foreign()) {
    other = std::move(f->pool);
    f->pool = py::none();
    f->owners.clear();
  }
}

py::tuple take_restore_ops(PyStore& s) { return to_py_tuple(s.take_restore_ops()); }

bool adopt_units(PyStore& s, const std::vector<int64_t>& units, py::handle owner, int64_t prefix_hash) {
  OwnerTable& owners = s.owners();
  const int64_t token = owners.token(owner, s.pool_ptr().get());
  owners.retain(token);  // named to the pool while the call runs
  try {
    const bool adopted = s.adopt_units(units, token, prefix_hash);
    owners.unretain(token);
    return adopted;
  } catch (...) {
    owners.unretain(token);
    throw;
  }
}

// position is checked first, as the reference's begin_store does.
py::object store_begin_store(PyStore& s, PyObject** a) {
  const int64_t position = a[2] == nullptr ? 0 : as_int(a[2], "position");
  if (position < 0) bad_argument("position", position, "must be >= 0");
  const int64_t prefix_hash = as_hash(a[0], "prefix_hash", s.hash_form());
  auto op = s.begin_store(prefix_hash, as_int(a[1], "src_slot"), position);
  return op ? py::cast(std::move(*op)) : py::none();
}

void bind_store(py::module_& m) {
  py::classh<PyStore> cls(m, "PageUnitCheckpointStore", py::metaclass(fast::guarded_metaclass()),
                          fast::gc_setup<PyStore, &traverse_store, &clear_store>(), doc("PageUnitCheckpointStore"));
  fast::refuse_copy(cls);
  fast::inner_gate<PyStore> = [](PyObject* self) -> CallGate* {
    const PyStore* s = fast::cached_instance<PyStore>(self);
    PyUnitPool* f = s ? s->foreign() : nullptr;
    return f ? &f->gate : nullptr;
  };
  cls.def(py::init([](py::handle pool, py::handle spec, py::handle sink) {
            const UnitPoolArg p = as_unit_pool(pool, "pool");
            const PagedStateCheckpointSpec sp = as_spec(spec, "spec");
            const bool offload_sink = as_bool(sink, "offload_sink");
            return make_py_store(pool, p, sp, offload_sink);
          }),
          py::arg("pool"), py::arg("spec"), py::arg("offload_sink") = false, doc(cls, "__init__"));
  using fast::to_py;
  fast::def_readonly<PyStore>(cls, "pool", [](const PyStore& s) { return pool_object(s).release().ptr(); });
  fast::def_readonly<PyStore>(cls, "spec", [](const PyStore& s) { return py::cast(s.spec()).release().ptr(); });
  fast::attr<&PyStore::units_per_checkpoint>(cls, "units_per_checkpoint");
  fast::attr<&PyStore::generation>(cls, "generation");
  fast::attr<&PyStore::evictions>(cls, "evictions");
  fast::attr<&PyStore::offload_pins_reclaimed>(cls, "offload_pins_reclaimed");
  fast::attr<&PyStore::offload_nominations_dropped>(cls, "offload_nominations_dropped");
  fast::def_readonly<PyStore>(
      cls, "records", [](const PyStore&, PyObject* self) { return make_view<RecordsView>(self).release().ptr(); });
  fast::def_readonly<PyStore>(cls, "hash_to_checkpoint", [](const PyStore&, PyObject* self) {
    return make_view<HashIndexView>(self).release().ptr();
  });
  fast::def_readonly<PyStore>(cls, "store_backlog", [](const PyStore&, PyObject* self) {
    return make_view<BacklogView>(self).release().ptr();
  });
  fast::method<&take_restore_ops>(cls, "take_restore_ops", {});
  fast::method<&Store::cancel_queued_restore>(cls, "cancel_queued_restore", {"dst_slot"});
  fast::method<&changed_since_py>(cls, "changed_since", {"generation"});
  fast::method<&adopt_units>(cls, "adopt_units", {"unit_ids", "owner", fast::hash_arg("prefix_hash")});
  fast::method<&Store::complete_inflight>(cls, "complete_inflight", {});
  fast::method<&Store::unindex>(cls, "unindex", {fast::hash_arg("prefix_hash")});
  fast::method<&Store::clear>(cls, "clear", {});
  fast::method<&PyStore::use_clock>(cls, "use_clock", {"clock"});
  fast::method<&Store::check_consistency>(cls, "check_consistency", {});
  def_store_methods(cls, [](PyStore& s) -> Store& { return s; });
  fast::method<&Store::lookup>(cls, "lookup", {fast::hash_arg("prefix_hash")});
  fast::method<&Store::contains_or_pending>(cls, "contains_or_pending", {fast::hash_arg("prefix_hash")});
  fast::def<&store_begin_store>(cls, "begin_store", {"prefix_hash", "src_slot", "position=0"});
  fast::method<&Store::begin_restore>(cls, "begin_restore", {fast::hash_arg("prefix_hash"), "dst_slot"});
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
