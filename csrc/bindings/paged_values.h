// Conversions shared by the paged binding files: owners, operation ids, the
// Python-facing BlockPool.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>

#include "bindings/convert.h"
#include "bindings/fast_call.h"
#include "bindings/paged_ops.h"
#include "core/block_pool.h"
#include "core/checkpoint_store.h"
#include "core/paged_types.h"
#include "core/unit_provider.h"

namespace statecache::bindings {

// Maps Python owners to the core's owner tokens and back (one table per
// BlockPool, and one per store on any other pool). Owners the store
// and coordinator build, ("state-checkpoint", id) and ("state-transfer", x),
// map to their own token kinds; anything else hashable is interned (dict
// semantics: equal owners are one owner). Interned owners that hold no units
// and are not retained are swept lazily. An owner's __hash__ / __eq__ runs
// Python code: the table is never mid-change while it does, an owner
// operation started from inside one (same thread) raises RuntimeError, and
// one from another thread waits until it is done.
class OwnerTable {
 public:
  // `pool`: the BlockPool whose holdings keep owners interned; null for a
  // table whose owners stay only while retained.
  int64_t token(py::handle owner, const BlockPool* pool);
  int64_t transfer_token(py::handle inner, const BlockPool* pool);
  // The Python owner for a token; None for a free or KV-held block.
  py::object owner(int64_t token) const;
  // Keeps an interned owner alive while something outside the pool names it.
  void retain(int64_t token);
  void unretain(int64_t token);
  // GC support: every Python reference the table holds, and dropping them.
  int traverse(visitproc visit, void* arg) const;
  void clear();

 private:
  struct Entry {
    py::object key;
    int64_t retained = 0;
  };
  int64_t intern(py::dict& ids, int kind, py::handle key, const BlockPool* pool);
  void sweep(const BlockPool* pool);

  py::dict transfer_ids_, other_ids_;
  std::unordered_map<int64_t, Entry> entries_;
  int64_t next_id_ = 0;
  size_t sweep_at_ = 256;
  bool busy_ = false;  // inside an owner's __hash__ / __eq__
  CallGate gate_{};    // held meanwhile: other threads' owner operations wait
};

// The BlockPool Python sees: the core pool plus its owner table and the
// Python on_evict handler. The core calls `evicted` (installed once, so a
// handler may replace or detach itself while a report runs).
class PyBlockPool : public BlockPool {
 public:
  explicit PyBlockPool(int64_t num_blocks);
  OwnerTable owners;
  py::object on_evict = py::none();
  // Stores on this pool: a unit of one of their images is released or
  // rekeyed only by its store, never from Python under its owner's name
  // (the units could be handed out while a READY record still names them).
  void add_store(const std::shared_ptr<const PageUnitCheckpointStore>& store);
  void refuse_store_units(const std::vector<int64_t>& units, int64_t token) const;

 private:
  void evicted(int64_t hash);
  std::vector<std::weak_ptr<const PageUnitCheckpointStore>> stores_;
};

// A pool given from Python that is not a statecache.BlockPool: the store's
// units come from its num_free, reserve_units, release_units and
// rekey_units (docs/paged.md, "Pool protocol"), each read when the store
// needs it. Its errors propagate; what it returns is checked before the
// store uses it. While its code runs it holds `gate`, so another thread's
// call on the store or coordinator waits (call_gate.h); this thread's own
// calls back (an on_evict handler unindexing) pass.
class PyUnitPool : public PageUnitProvider {
 public:
  explicit PyUnitPool(py::object pool) : pool(std::move(pool)) {}
  int64_t num_free() override;
  bool reserve_units(int64_t count, int64_t owner, std::vector<int64_t>& out) override;
  void release_units(const std::vector<int64_t>& units, int64_t owner) override;
  void rekey_units(const std::vector<int64_t>& units, int64_t old_owner, int64_t new_owner) override;

  py::object pool;    // None once the collector cleared the store
  OwnerTable owners;  // transfer and adopted owners named to this pool
  CallGate gate{};

 private:
  py::object live() const;
};

// A store's `pool` argument: a statecache.BlockPool (the C++ path) or any
// other object but None (`foreign`, called through Python).
struct UnitPoolArg {
  std::shared_ptr<PyBlockPool> native;
  std::shared_ptr<PyUnitPool> foreign;
};
UnitPoolArg as_unit_pool(py::handle obj, const char* name);

// The store Python sees: the core store plus the Python objects it uses, so
// that they take part in garbage collection. `pool_obj` is the pool object
// given (kept alive, so a C++ pool has exactly one wrapper, which alone
// reports its on_evict to the collector); `clock` is use_clock's callable.
class PyStore : public PageUnitCheckpointStore {
 public:
  PyStore(py::object pool_obj, std::shared_ptr<PyBlockPool> pool, PagedStateCheckpointSpec spec, bool sink);
  PyStore(py::object pool_obj, std::shared_ptr<PyUnitPool> pool, PagedStateCheckpointSpec spec, bool sink);
  py::object pool_obj;
  py::object clock = py::none();
  void use_clock(py::object fn);
  // The BlockPool, or null for another pool.
  std::shared_ptr<PyBlockPool> py_pool() const { return std::static_pointer_cast<PyBlockPool>(pool_ptr()); }
  // The other pool's adapter, or null for a BlockPool.
  PyUnitPool* foreign() const { return static_cast<PyUnitPool*>(provider_ptr().get()); }
  // Where owners named to this store's pool are interned.
  OwnerTable& owners() const { return foreign() ? foreign()->owners : py_pool()->owners; }

 private:
  void install_clock();
};

// A new PyStore on `pool` (registered with a BlockPool, which then refuses
// Python's releases of its images' units).
std::shared_ptr<PyStore> make_py_store(py::handle pool_obj, const UnitPoolArg& pool, PagedStateCheckpointSpec spec,
                                       bool sink);

// Reports a callback's exception through sys.unraisablehook (the caller's
// call completes); `where` names the callback.
void report_callback_error(const char* where);

// What Python's CheckpointRecord holds: a value of its own (constructed from
// Python), or a live handle on one of a store's records, which reads the
// record's current fields, and after its release the fields it was released
// with (as the reference's record objects do).
class RecordHandle {
 public:
  RecordHandle(CheckpointRecord value, HashForm form) : value_(std::move(value)), form_(form) {}
  RecordHandle(std::shared_ptr<PageUnitCheckpointStore> store, int64_t checkpoint_id)
      : store_(std::move(store)), checkpoint_id_(checkpoint_id) {
    store_->watch(checkpoint_id_);
  }
  RecordHandle(const RecordHandle& o)
      : value_(o.get()), form_(o.form()), store_(o.store_), checkpoint_id_(o.checkpoint_id_) {
    if (store_) store_->watch(checkpoint_id_);
  }
  RecordHandle& operator=(const RecordHandle&) = delete;
  ~RecordHandle() {
    if (store_) store_->unwatch(checkpoint_id_);
  }

  const CheckpointRecord& get() const {
    if (store_) {
      if (const CheckpointRecord* r = store_->watched_record(checkpoint_id_)) return *r;
    }
    return value_;
  }
  // The value for a write; a store's record is read-only.
  CheckpointRecord& mutable_value();
  // The form prefix_hash reads back in: the store's, or the value's own.
  HashForm& form() const { return store_ ? store_->hash_form() : form_; }
  bool operator==(const RecordHandle& o) const { return get() == o.get(); }

 private:
  CheckpointRecord value_;
  mutable HashForm form_;
  std::shared_ptr<PageUnitCheckpointStore> store_;
  int64_t checkpoint_id_ = -1;
};

// statecache.StateStoreOperationId(h, gen), a tuple subclass; h in `form`.
py::object to_py(const StateStoreOperationId& op, const HashForm& form);
// A 2-tuple of ints (StateStoreOperationId or a plain tuple) whose hash is
// written in `form`; nullopt for any other hashable value, which can never
// name an operation. TypeError when unhashable, as a dict lookup would raise.
std::optional<StateStoreOperationId> as_operation_id(py::handle obj, const HashForm& form);
// (operation, unit_ids) as the store hands a source to a tier.
py::tuple to_py_source(const StateStoreOperationId& op, const UnitIds& units, const HashForm& form);

PagedStateCheckpointSpec as_spec(py::handle obj, const char* name);

// A tuple of bound values, moved in one by one (no intermediate list).
template <class T>
py::tuple to_py_tuple(std::vector<T>&& values) {
  py::tuple out(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    PyTuple_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), py::cast(std::move(values[i])).release().ptr());
  return out;
}

}  // namespace statecache::bindings
