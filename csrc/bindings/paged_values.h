// Conversions shared by the paged binding files: owners, operation ids, the
// Python-facing BlockPool.
#pragma once

#include <memory>
#include <optional>
#include <unordered_map>

#include "bindings/convert.h"
#include "core/block_pool.h"
#include "core/checkpoint_store.h"
#include "core/paged_types.h"

namespace statecache::bindings {

// Maps Python owners to the core's owner tokens and back. Owners the store
// and coordinator build, ("state-checkpoint", id) and ("state-transfer", x),
// map to their own token kinds; anything else hashable is interned. Interned
// owners that hold no units and are not retained are swept lazily.
class OwnerTable {
 public:
  int64_t token(py::handle owner, const BlockPool& pool);
  int64_t transfer_token(py::handle inner, const BlockPool& pool);
  // The Python owner for a token; None for a free or KV-held block.
  py::object owner(int64_t token) const;
  // Keeps an interned owner alive while something outside the pool names it.
  void retain(int64_t token);
  void unretain(int64_t token);

 private:
  struct Entry {
    py::object key;
    int64_t retained = 0;
  };
  int64_t intern(py::dict& ids, int kind, py::handle key, const BlockPool& pool);
  void sweep(const BlockPool& pool);

  py::dict transfer_ids_, other_ids_;
  std::unordered_map<int64_t, Entry> entries_;
  int64_t next_id_ = 0;
  size_t sweep_at_ = 256;
};

// The BlockPool Python sees: the core pool plus its owner table and the
// Python on_evict handler.
class PyBlockPool : public BlockPool {
 public:
  using BlockPool::BlockPool;
  OwnerTable owners;
  py::object on_evict = py::none();
};

std::shared_ptr<PyBlockPool> as_block_pool(py::handle obj, const char* name);

// What Python's CheckpointRecord holds: a value of its own (constructed from
// Python), or a live handle on one of a store's records, which reads the
// record's current fields, and after its release the fields it was released
// with (as the reference's record objects do).
class RecordHandle {
 public:
  explicit RecordHandle(CheckpointRecord value) : value_(std::move(value)) {}
  RecordHandle(std::shared_ptr<PageUnitCheckpointStore> store, int64_t checkpoint_id)
      : store_(std::move(store)), checkpoint_id_(checkpoint_id) {
    store_->watch(checkpoint_id_);
  }
  RecordHandle(const RecordHandle& o) : value_(o.get()), store_(o.store_), checkpoint_id_(o.checkpoint_id_) {
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
  bool operator==(const RecordHandle& o) const { return get() == o.get(); }

 private:
  CheckpointRecord value_;
  std::shared_ptr<PageUnitCheckpointStore> store_;
  int64_t checkpoint_id_ = -1;
};

// statecache.StateStoreOperationId(h, gen), a tuple subclass.
py::object to_py(const StateStoreOperationId& op);
// A 2-tuple of ints (StateStoreOperationId or a plain tuple); nullopt for any
// other hashable value, which can never name an operation. TypeError when
// unhashable, as a dict lookup would raise.
std::optional<StateStoreOperationId> as_operation_id(py::handle obj);
// (operation, unit_ids) as the store hands a source to a tier.
py::tuple to_py_source(const StateStoreOperationId& op, const UnitIds& units);

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
