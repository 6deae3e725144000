// PagedStateCheckpointCoordinator and StateOffloadIndex (docs/contract.md, "Objects", "Tiers").
#include <pybind11/stl.h>

#include <unordered_map>

#include "bindings/batch_args.h"
#include "bindings/bindings.h"
#include "bindings/docs.h"
#include "bindings/fast_call.h"
#include "bindings/paged_store_methods.h"
#include "bindings/paged_values.h"
#include "core/checkpoint_coordinator.h"

namespace statecache::bindings {

namespace {

using Coordinator = PagedStateCheckpointCoordinator;

// A scratch slot pool given from Python that is not a statecache.StateSlotPool:
// anything with has_free(), pop() and release(slot) (a reference pool, a test
// stand-in), called through Python. has_free and pop are asked before the
// coordinator changes anything; release only notifies, so an exception from
// it is reported as unraisable.
class PyScratchSource : public ScratchSlotSource {
 public:
  explicit PyScratchSource(py::object pool) : pool(std::move(pool)) {}
  bool has_free(int64_t count) const override {
    py::object p = pool;
    py::object r = count == 1 ? p.attr("has_free")() : p.attr("has_free")(count);
    const int truth = PyObject_IsTrue(r.ptr());
    if (truth < 0) throw py::error_already_set();
    return truth == 1;
  }
  int64_t pop() override {
    py::object p = pool;
    return as_nonneg_int(p.attr("pop")(), "slot_pool.pop()");
  }
  void release(int64_t slot) override {
    py::object p = pool;
    try {
      p.attr("release")(slot);
    } catch (py::error_already_set& e) {
      e.restore();
      report_callback_error("slot_pool.release");
    }
  }
  py::object pool;
};

// A tier given from Python that is not a StateOffloadIndex: asked through
// its could_serve method.
class PyOffloadVote : public OffloadVote {
 public:
  // `form`: the coordinator's, which the tier is asked in.
  PyOffloadVote(py::object tier, const HashForm& form) : tier(std::move(tier)), form_(form) {}
  bool could_serve(int64_t h) const override {
    py::object t = tier;
    py::object r = t.attr("could_serve")(hash_object(h, form_));
    const int truth = PyObject_IsTrue(r.ptr());
    if (truth < 0) throw py::error_already_set();
    return truth == 1;
  }
  py::object tier;

 private:
  const HashForm& form_;
};

// The coordinator plus the Python objects it was handed, so `offload` reads
// back the very object attached and transfer owners keep their identity.
// Every Python reference it holds is reported to the collector here, once:
// the store's Python object (which reports the pool's), the tier and the
// scratch pool, and the copies the vote and scratch adapters hold.
class PyCoordinator : public Coordinator {
 public:
  PyCoordinator(py::handle pool_obj, const UnitPoolArg& pool, PagedStateCheckpointSpec spec, bool enabled,
                py::object offload, bool readable_midstep)
      : Coordinator(make_py_store(pool_obj, pool, std::move(spec), !offload.is_none()), enabled, readable_midstep) {
    store_obj = fast::cast_cached<PyStore>(std::static_pointer_cast<PyStore>(store_ptr()));
    set_offload(std::move(offload), true);
  }

  void set_offload(py::object tier, bool sink) {
    std::shared_ptr<const OffloadVote> vote;
    std::shared_ptr<PyOffloadVote> py_vote;
    if (py::isinstance<StateOffloadIndex>(tier)) {
      vote = tier.cast<std::shared_ptr<StateOffloadIndex>>();
    } else if (!tier.is_none()) {
      py_vote = std::make_shared<PyOffloadVote>(tier, hash_form());
      vote = py_vote;
    }
    const bool attached = !tier.is_none();
    py::object old = std::move(offload_);  // dropped last
    std::shared_ptr<PyOffloadVote> old_vote = std::move(py_vote_);
    offload_ = std::move(tier);
    py_vote_ = std::move(py_vote);
    attach_offload(std::move(vote), attached, sink);
  }
  const py::object& offload() const { return offload_; }
  // Whether resumable_hit's scan calls into Python (a tier that is not a
  // StateOffloadIndex votes through its could_serve).
  bool votes_in_python() const { return py_vote_ != nullptr; }

  void set_scratch(py::object pool, int64_t max_ops) {
    std::shared_ptr<ScratchSlotSource> source;
    std::shared_ptr<PyScratchSource> py_source;
    if (!pool.is_none()) {
      try {
        source = as_scratch_source(pool, "slot_pool");  // a statecache.StateSlotPool, in C++
      } catch (const py::type_error&) {
        py_source = std::make_shared<PyScratchSource>(pool);  // any pool with has_free / pop / release
        source = py_source;
      }
    }
    py::object old = std::move(scratch_obj_);
    std::shared_ptr<PyScratchSource> old_source = std::move(py_scratch_);
    scratch_obj_ = std::move(pool);
    py_scratch_ = std::move(py_source);
    attach_midstep_scratch(std::move(source), max_ops);
  }

  int64_t transfer_owner(py::handle owner) {
    if (owner.is_none()) throw py::value_error("owner=None: a transfer reservation needs an owner");
    return owners().transfer_token(owner, store().pool_ptr().get());
  }
  PyStore& py_store() const { return static_cast<PyStore&>(store()); }
  OwnerTable& owners() const { return py_store().owners(); }
  py::object store_object() const {
    if (!store_obj.is_none()) return store_obj;
    return py::cast(std::static_pointer_cast<PyStore>(store_ptr()));
  }

  // ---- sequences that are not statecache.Sequence (docs/contract.md, "API guarantees") ----
  //
  // The core files a boundary under a Sequence it keeps until the drain and
  // tells sequences apart by that object. An engine's own request object
  // gets one snapshot here for as long as the core holds it, with a strong
  // reference to the object; its state_slot is re-read whenever the core
  // reads it (the drain, forget_pending), as the reference reads it.

  // The Sequence the core files `s`'s boundaries under: the statecache
  // Sequence itself, or the object's snapshot (made or refreshed here).
  std::shared_ptr<Sequence> filed_as(fast::SeqArg& s) {
    if (s.native()) return as_sequence(s.object(), "seq");
    auto it = generic_.find(s.object());
    if (it == generic_.end()) it = generic_.emplace(s.object(), Generic{s.ref(), std::make_shared<Sequence>()}).first;
    Sequence& snap = *it->second.snap;
    snap.has_per_req_cache = s.get().has_per_req_cache;
    snap.state_slots = s.get().state_slots;
    return it->second.snap;
  }
  // The snapshot the core may hold for a generic object, or nullptr.
  Sequence* filed_snapshot(PyObject* obj) {
    auto it = generic_.find(obj);
    return it == generic_.end() ? nullptr : it->second.snap.get();
  }
  // Re-reads every filed object's state_slot (may run Python code; raises
  // before anything changed).
  void refresh_generic() {
    std::vector<std::pair<py::object, std::shared_ptr<Sequence>>> filed;
    filed.reserve(generic_.size());
    for (auto& [obj, g] : generic_) filed.emplace_back(g.obj, g.snap);
    std::vector<int64_t> slots;
    slots.reserve(filed.size());
    for (auto& [obj, snap] : filed)
      slots.push_back(fast::SeqArg(obj.ptr(), "seq", fast::kStateSlot).get().state_slot());
    for (size_t i = 0; i < filed.size(); ++i) filed[i].second->set_state_slot(slots[i]);
  }
  // Lets go of the objects the core no longer holds; their references are
  // dropped once the map is consistent.
  void prune_generic() {
    std::vector<py::object> gone;
    for (auto it = generic_.begin(); it != generic_.end();) {
      if (it->second.snap.use_count() == 1) {
        gone.push_back(std::move(it->second.obj));
        it = generic_.erase(it);
      } else {
        ++it;
      }
    }
  }
  size_t num_generic() const { return generic_.size(); }
  // The scratch pool, whose call gate the coordinator's calls wait for (they
  // change it from C++).
  PyObject* scratch_object() const { return scratch_obj_.ptr(); }

  int traverse(visitproc visit, void* arg) const {
    for (const auto& [obj, g] : generic_) Py_VISIT(g.obj.ptr());
    Py_VISIT(store_obj.ptr());
    Py_VISIT(offload_.ptr());
    Py_VISIT(scratch_obj_.ptr());
    if (py_vote_) Py_VISIT(py_vote_->tier.ptr());
    if (py_scratch_) Py_VISIT(py_scratch_->pool.ptr());
    return 0;
  }
  void clear_python() {
    // Detached first, released when this returns: a __del__ run by the
    // release finds a coordinator without a tier or scratch pool.
    py::object store = std::move(store_obj), tier = std::move(offload_), scratch = std::move(scratch_obj_);
    std::shared_ptr<PyOffloadVote> vote = std::move(py_vote_);
    std::shared_ptr<PyScratchSource> source = std::move(py_scratch_);
    std::unordered_map<PyObject*, Generic> filed;
    filed.swap(generic_);
    store_obj = py::none();
    offload_ = py::none();
    scratch_obj_ = py::none();
    attach_offload(nullptr, false, false);
    attach_midstep_scratch(nullptr, 0);
  }

 private:
  py::object store_obj = py::none();
  py::object offload_ = py::none();
  py::object scratch_obj_ = py::none();
  std::shared_ptr<PyOffloadVote> py_vote_;
  std::shared_ptr<PyScratchSource> py_scratch_;
  struct Generic {
    py::object obj;
    std::shared_ptr<Sequence> snap;
  };
  std::unordered_map<PyObject*, Generic> generic_;  // keyed by the object, which obj keeps alive
};

// Runs `body` and then drops the generic objects the core let go of, also
// when it throws.
template <class Body>
decltype(auto) then_prune(PyCoordinator& c, Body&& body) {
  struct Prune {
    PyCoordinator& c;
    ~Prune() {
      if (c.num_generic() != 0) c.prune_generic();
    }
  } prune{c};
  return body();
}

int traverse_coordinator(PyCoordinator& c, visitproc visit, void* arg) { return c.traverse(visit, arg); }
void clear_coordinator(PyCoordinator& c) { c.clear_python(); }

// resumable_hit over block_hashes. A list or tuple is read in place, one
// item at a time and never held across a call into Python (an item's
// __index__ or the tier's could_serve may change the list); anything else
// is converted first.
int64_t hit_for(const PyCoordinator& c, const Sequence& seq, int64_t hit, py::handle hashes, bool assume) {
  return scan_int_list(
      hashes, "block_hashes", hit, c.hash_form(),
      [&](int64_t n, auto&& hash_at) { return c.resumable_hit(seq, hit, n, hash_at, assume); }, c.votes_in_python());
}

// ---- hot methods (fast::def) ----

py::object coord_resumable_hit(PyCoordinator& c, PyObject** a) {
  fast::SeqArg seq(a[0], "seq", fast::read_if(c.enabled(), fast::kHasCache));
  const bool assume = a[3] != nullptr && as_bool(a[3], "assume_checkpointed");
  return py::reinterpret_steal<py::object>(
      PyLong_FromLongLong(hit_for(c, seq.get(), as_int(a[1], "hit"), a[2], assume)));
}

py::object coord_resumable_hits(PyCoordinator& c, PyObject** a) {
  return resumable_hits_arg(c, a[0], a[1], a[2], a[3], fast::kHasCache, c.votes_in_python());
}

py::object coord_checkpoint(PyCoordinator& c, PyObject** a) {
  const int64_t blocks = as_int(a[1], "boundary_blocks");
  const int64_t h = as_hash(a[2], "h", c.hash_form());
  fast::SeqArg seq(a[0], "seq", fast::read_if(c.enabled(), fast::kHasCache));
  if (c.applies(seq.get())) seq.read(fast::kStateSlot);
  if (seq.native()) {
    c.checkpoint(as_sequence(a[0], "seq"), blocks, h);
    return py::none();
  }
  then_prune(c, [&] { c.checkpoint(c.filed_as(seq), blocks, h); });
  return py::none();
}

py::object coord_checkpoint_many(PyCoordinator& c, PyObject** a) {
  const IntSpan blocks(a[1], "boundary_blocks"), hashes(a[2], "hashes", c.hash_form());
  SeqBatch seqs(a[0], "seqs", fast::kHasCache | fast::kStateSlot);
  then_prune(c, [&] {
    std::vector<std::shared_ptr<Sequence>> filed;
    filed.reserve(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i)
      filed.push_back(seqs.is_native(i) ? as_sequence(seqs.object(i), "seqs") : c.filed_as(*seqs.generic(i)));
    c.checkpoint_many(filed, seqs.keys(), blocks.span(), hashes.span());
  });
  return py::none();
}

// What forget_pending works on for `obj` (whose fields were read into
// `read`): a statecache.Sequence itself; an engine object's snapshot, given
// the state_slot just read; or, when nothing is filed for it, `read`.
Sequence* forget_target(PyCoordinator& c, PyObject* obj, Sequence& read, bool native) {
  if (native) return &read;
  Sequence* snap = c.filed_snapshot(obj);
  if (!snap) return &read;
  snap->set_state_slot(read.state_slot());
  return snap;
}

void forget_pending_of(PyCoordinator& c, SeqBatch& seqs) {
  then_prune(c, [&] {
    std::vector<Sequence*> ptrs;
    ptrs.reserve(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i)
      ptrs.push_back(forget_target(c, seqs.object(i), seqs.seq(i), seqs.is_native(i)));
    c.forget_pending_many(ptrs);
  });
}

py::object coord_forget_pending_many(PyCoordinator& c, PyObject** a) {
  SeqBatch seqs(a[0], "seqs", fast::kStateSlot);
  forget_pending_of(c, seqs);
  return py::none();
}

py::object coord_begin_restore(PyCoordinator& c, PyObject** a) {
  const int64_t h = as_hash(a[0], "h", c.hash_form());
  return py::reinterpret_steal<py::object>(PyBool_FromLong(c.begin_restore(h, as_int(a[1], "dst_slot"))));
}

py::object coord_begin_restores(PyCoordinator& c, PyObject** a) {
  const IntSpan hashes(a[0], "hashes", c.hash_form()), slots(a[1], "dst_slots");
  const std::vector<uint8_t> queued = c.begin_restores(hashes.span(), slots.span());
  py::list out(queued.size());
  for (size_t i = 0; i < queued.size(); ++i)
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), Py_NewRef(queued[i] ? Py_True : Py_False));
  return out;
}

py::dict fates(const PyCoordinator& c) {
  const PageUnitCheckpointStore& s = c.store();
  py::dict d;
  d["checkpoints_kept"] = c.checkpoints_kept();
  d["checkpoints_dropped"] = c.checkpoints_dropped();
  d["checkpoints_evicted"] = s.evictions();
  d["offload_pins_reclaimed"] = s.offload_pins_reclaimed();
  d["checkpoints_orphaned"] = c.checkpoints_orphaned();
  const py::object& tier = c.offload();
  if (tier.is_none()) return d;
  const int truth = PyObject_IsTrue(tier.ptr());
  if (truth < 0) throw py::error_already_set();
  if (truth == 0) return d;
  py::object stats = py::getattr(tier, "stats", py::none());
  if (!PyCallable_Check(stats.ptr())) return d;
  for (auto kv : py::dict(stats())) d[py::str("state_offload_" + py::str(kv.first).cast<std::string>())] = kv.second;
  d["state_offload_store_backlog"] = s.store_backlog().size();
  d["state_offload_nominations_dropped"] = s.offload_nominations_dropped();
  return d;
}

bool coord_applies(const PyCoordinator& c, py::handle seq) {
  return c.applies(fast::SeqArg(seq.ptr(), "seq", fast::read_if(c.enabled(), fast::kHasCache)).get());
}

py::list coord_reserve_midstep(PyCoordinator& c, py::handle seq, py::handle positions) {
  const bool asks = c.readable_midstep() && c.enabled();  // the reference's order
  auto res = c.reserve_midstep(fast::SeqArg(seq.ptr(), "seq", fast::read_if(asks, fast::kHasCache)).get(),
                               as_positions(positions, c.hash_form()));
  py::list out;
  for (const auto& [slot, pos, h] : res) out.append(py::make_tuple(slot, pos, hash_object(h, c.hash_form())));
  return out;
}

// `seq` is taken and ignored, as the reference's is.
void coord_publish_midstep(PyCoordinator& c, py::handle reservations, py::handle) {
  c.publish_midstep(as_reservations<MidstepReservation>(reservations, c.hash_form()));
}

void coord_cancel_midstep(PyCoordinator& c, py::handle reservations) {
  c.cancel_midstep(as_reservations<MidstepReservation>(reservations, c.hash_form()));
}

void coord_forget_pending(PyCoordinator& c, py::handle seq) {
  fast::SeqArg s(seq.ptr(), "seq", fast::kStateSlot);
  then_prune(c, [&] { c.forget_pending(*forget_target(c, s.object(), s.get(), s.native())); });
}

py::tuple coord_take_checkpoint_ops(PyCoordinator& c) {
  // The drain reads each filed sequence's state_slot; an engine object's is
  // read here, before anything changes.
  c.refresh_generic();
  auto [stores, restores] = then_prune(c, [&] { return c.take_checkpoint_ops(); });
  return py::make_tuple(to_py_tuple(std::move(stores)), to_py_tuple(std::move(restores)));
}

py::object coord_reserve_transfer_units(PyCoordinator& c, py::handle owner) {
  const int64_t token = c.transfer_owner(owner);
  c.owners().retain(token);  // interned while the pool's code may run
  std::optional<UnitIds> units;
  try {
    units = c.reserve_transfer_units(token);
  } catch (...) {
    c.owners().unretain(token);
    throw;
  }
  if (!units) {
    c.owners().unretain(token);
    return py::none();
  }
  return to_tuple(*units);
}

void coord_release_transfer_units(PyCoordinator& c, py::handle owner) {
  const int64_t token = c.transfer_owner(owner);
  const bool had = c.has_transfer(token);
  try {
    c.release_transfer_units(token);  // a pool's error comes after the reservation is gone
  } catch (...) {
    if (had && !c.has_transfer(token)) c.owners().unretain(token);
    throw;
  }
  if (had && !c.has_transfer(token)) c.owners().unretain(token);
}

// The owner is read before the hash (an owner of None is the error named first).
bool coord_adopt_transfer_units(PyCoordinator& c, py::handle owner, py::handle h) {
  const int64_t token = c.transfer_owner(owner);
  const int64_t prefix_hash = as_hash(h, "prefix_hash", c.hash_form());
  const bool had = c.has_transfer(token);
  const bool adopted = c.adopt_transfer_units(token, prefix_hash);  // a failure keeps the reservation
  if (had && !c.has_transfer(token)) c.owners().unretain(token);
  return adopted;
}

void coord_unindex(PyCoordinator& c, int64_t prefix_hash) {
  const int64_t pending = c.num_pending();
  c.unindex(prefix_hash);
  if (c.num_pending() != pending) c.prune_generic();
}

void coord_clear_index(PyCoordinator& c) {
  then_prune(c, [&] { c.clear_index(); });
}

void bind_coordinator(py::module_& m) {
  py::classh<PyCoordinator> cls(m, "PagedStateCheckpointCoordinator", py::metaclass(fast::guarded_metaclass()),
                                fast::gc_setup<PyCoordinator, &traverse_coordinator, &clear_coordinator>(),
                                doc("PagedStateCheckpointCoordinator"));
  fast::refuse_copy(cls);
  fast::gate_link<PyCoordinator> = [](PyObject* self) -> PyObject* {
    const PyCoordinator* c = fast::cached_instance<PyCoordinator>(self);
    PyObject* scratch = c ? c->scratch_object() : nullptr;
    return scratch == Py_None ? nullptr : scratch;
  };
  fast::inner_gate<PyCoordinator> = [](PyObject* self) -> CallGate* {
    const PyCoordinator* c = fast::cached_instance<PyCoordinator>(self);
    PyUnitPool* f = c ? c->py_store().foreign() : nullptr;
    return f ? &f->gate : nullptr;
  };
  cls.attr("successor_room") = 0.0;
  cls.def(py::init([](py::handle pool, py::handle spec, py::handle enabled, py::object offload,
                      py::handle readable_midstep) {
            const UnitPoolArg p = as_unit_pool(pool, "pool");
            PagedStateCheckpointSpec sp = as_spec(spec, "spec");
            const bool on = as_bool(enabled, "enabled");
            const bool readable = as_bool(readable_midstep, "readable_midstep");
            return std::make_shared<PyCoordinator>(pool, p, std::move(sp), on, std::move(offload), readable);
          }),
          py::arg("pool"), py::arg("spec"), py::arg("enabled"), py::arg("offload") = py::none(),
          py::arg("readable_midstep") = false, doc(cls, "__init__"));
  using fast::to_py;
  using C = PyCoordinator;
  fast::attr<&C::enabled>(cls, "enabled");
  fast::attr<&C::readable_midstep>(cls, "readable_midstep");
  fast::def_readonly<C>(cls, "store", [](const C& c) { return c.store_object().release().ptr(); });
  fast::def_readonly<C>(cls, "offload", [](const C& c) { return Py_NewRef(c.offload().ptr()); });
  fast::attr<&C::checkpoints_kept>(cls, "checkpoints_kept");
  fast::attr<&C::checkpoints_dropped>(cls, "checkpoints_dropped");
  fast::attr<&C::checkpoints_orphaned>(cls, "checkpoints_orphaned");
  fast::method<&coord_applies>(cls, "applies", {"seq"});
  fast::method<&PyCoordinator::set_scratch>(cls, "attach_midstep_scratch",
                                            {"slot_pool", fast::nonneg_arg("max_ops_per_batch")});
  fast::method<&coord_reserve_midstep>(cls, "reserve_midstep", {"seq", "positions"});
  fast::method<&coord_publish_midstep>(cls, "publish_midstep", {"reservations", "seq=None"});
  fast::method<&coord_cancel_midstep>(cls, "cancel_midstep", {"reservations"});
  fast::method<&coord_forget_pending>(cls, "forget_pending", {"seq"});
  fast::method<&coord_take_checkpoint_ops>(cls, "take_checkpoint_ops", {});
  fast::method<&Coordinator::complete_previous_batch>(cls, "complete_previous_batch", {});
  fast::method<&coord_reserve_transfer_units>(cls, "reserve_transfer_units", {"owner"});
  fast::method<&coord_release_transfer_units>(cls, "release_transfer_units", {"owner"});
  fast::method<&coord_adopt_transfer_units>(cls, "adopt_transfer_units", {"owner", "prefix_hash"});
  fast::method<&PyCoordinator::set_offload>(cls, "attach_offload", {"index", "*", "sink=True"});
  fast::method<&coord_unindex>(cls, "unindex", {fast::hash_arg("h")});
  fast::method<&coord_clear_index>(cls, "clear_index", {});
  fast::method<&Coordinator::check_consistency>(cls, "check_consistency", {});
  fast::method<&fates>(cls, "checkpoint_fates", {});
  def_store_methods(cls, [](PyCoordinator& c) -> PageUnitCheckpointStore& { return c.store(); });
  fast::def<&coord_resumable_hit>(cls, "resumable_hit", {"seq", "hit", "block_hashes", "assume_checkpointed=False"});
  fast::def<&coord_resumable_hits>(cls, "resumable_hits",
                                   {"seqs", "hits", "block_hashes=None", "assume_checkpointed=False"});
  fast::def<&coord_checkpoint>(cls, "checkpoint", {"seq", "boundary_blocks", "h"});
  fast::def<&coord_checkpoint_many>(cls, "checkpoint_many", {"seqs", "boundary_blocks", "hashes"});
  fast::def<&coord_forget_pending_many>(cls, "forget_pending_many", {"seqs"});
  fast::def<&coord_begin_restore>(cls, "begin_restore", {"h", "dst_slot"});
  fast::def<&coord_begin_restores>(cls, "begin_restores", {"hashes", "dst_slots"});
}

// ----------------------------------------------------------- offload index --

struct OffloadHashesView {
  std::shared_ptr<StateOffloadIndex> index;
};

py::dict offload_stats(const StateOffloadIndex& i) {
  const OffloadStats& s = i.stats();
  py::dict d;
  d["stores_attempted"] = s.stores_attempted;
  d["stores_completed"] = s.stores_completed;
  d["stores_failed"] = s.stores_failed;
  d["stores_untrusted"] = s.stores_untrusted;
  d["loads_attempted"] = s.loads_attempted;
  d["loads_completed"] = s.loads_completed;
  d["loads_failed"] = s.loads_failed;
  d["loads_missing"] = s.loads_missing;
  d["loads_abandoned"] = s.loads_abandoned;
  d["loads_untrusted"] = s.loads_untrusted;
  d["hashes"] = i.size();
  d["evicted"] = s.evicted;
  return d;
}

void bind_offload_index(py::module_& m) {
  py::class_<OffloadHashesView> hashes(m, "OffloadHashesView", STATECACHE_GUARDED(OffloadHashesView),
                                       doc("OffloadHashesView"));
  fast::refuse_copy(hashes);
  hashes.def("__len__", [](const OffloadHashesView& v) { return v.index->size(); })
      .def("__contains__",
           [](const OffloadHashesView& v, py::handle h) {
             int64_t bits = 0;
             return PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()) && hash_key(h, v.index->hash_form(), bits) &&
                    v.index->contains(bits);
           })
      .def("__iter__",
           [](const OffloadHashesView& v) { return py::iter(to_hash_list(v.index->hashes(), v.index->hash_form())); })
      .def("__repr__",
           [](const OffloadHashesView& v) { return py_repr(to_hash_list(v.index->hashes(), v.index->hash_form())); });

  py::classh<StateOffloadIndex> index(m, "StateOffloadIndex", STATECACHE_GUARDED(StateOffloadIndex),
                                      doc("StateOffloadIndex"));
  fast::refuse_copy(index);
  index.def(py::init([](py::handle can_store, py::handle can_load, py::handle capacity) {
              std::optional<int64_t> cap;
              if (!capacity.is_none()) cap = as_nonneg_int(capacity, "capacity");
              return std::make_shared<StateOffloadIndex>(as_bool(can_store, "can_store"), as_bool(can_load, "can_load"),
                                                         cap);
            }),
            py::arg("can_store") = true, py::arg("can_load") = true, py::arg("capacity") = py::none(),
            doc(index, "__init__"));
  using fast::hash_arg;
  using fast::to_py;
  using I = StateOffloadIndex;
  fast::attr<&I::can_store>(index, "can_store");
  fast::attr<&I::can_load>(index, "can_load");
  fast::attr<&I::capacity>(index, "capacity");
  fast::def_readonly<I>(index, "hashes", [](const I&, PyObject* self) {
    return fast::cast_cached<OffloadHashesView>(OffloadHashesView{py::handle(self).cast<std::shared_ptr<I>>()})
        .release()
        .ptr();
  });
  fast::attr<&I::loads_in_flight>(index, "loads_in_flight");
  fast::method<&I::could_serve>(index, "could_serve", {hash_arg("h")});
  fast::method<&I::note_store_started>(index, "note_store_started", {hash_arg("h")});
  fast::method<&I::note_stored>(index, "note_stored", {hash_arg("h")});
  fast::method<&I::note_store_failed>(index, "note_store_failed", {hash_arg("h"), "untrusted=False"});
  fast::method<&I::forget>(index, "forget", {hash_arg("h")});
  fast::method<&I::request_load>(index, "request_load", {hash_arg("h")});
  fast::method<&I::complete_load>(index, "complete_load", {hash_arg("h")});
  fast::method<&I::fail_load>(index, "fail_load", {hash_arg("h"), "*", "missing=False", "untrusted=False"});
  fast::method<&I::abandon_load>(index, "abandon_load", {hash_arg("h")});
  fast::method<&offload_stats>(index, "stats", {});
}

}  // namespace

void bind_paged_coordinator(py::module_& m) {
  bind_offload_index(m);
  bind_coordinator(m);
}

}  // namespace statecache::bindings
