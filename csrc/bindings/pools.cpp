// StateSlotPool, StateGroupPool and their retirement records. Argument
// conversion only; the behaviour lives in csrc/core.
#include <pybind11/stl.h>

#include <array>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "bindings/batch_args.h"
#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "bindings/docs.h"
#include "bindings/eviction.h"
#include "bindings/fast_call.h"
#include "bindings/value_type.h"
#include "core/group_pool.h"
#include "core/slot_pool.h"

namespace statecache::bindings {

namespace {

// ---- argument conversion ----------------------------------------------------

using fast::SeqArg;

StateTransfer transfer_arg(py::handle obj) {
  if (obj.is_none()) return StateTransfer();
  if (!py::isinstance<StateTransfer>(obj)) raise_type("transfer", "a StateTransfer or None", obj);
  return obj.cast<StateTransfer>();
}

// Runs the pool's resumable_hit over `block_hashes` without converting the
// list up front (scan_int_list: the scan reads right to left and usually stops
// early).
template <class Pool>
int64_t resumable_hit_arg(const Pool& pool, py::handle seq, py::handle hit_obj, py::handle hashes,
                          py::handle assume_obj) {
  // has_per_req_cache only when enabled, num_tokens only for a scan (as the reference reads them).
  SeqArg seq_arg(seq.ptr(), "seq", fast::read_if(pool.enabled(), fast::kHasCache));
  if (pool.applies(seq_arg.get()) && !pool.transfer().replays()) seq_arg.read(fast::kNumTokens);
  const Sequence& s = seq_arg.get();
  const int64_t hit = as_int(hit_obj, "hit");
  const bool assume = as_bool(assume_obj, "assume_checkpointed");
  return scan_int_list(hashes, "block_hashes", hit, pool.hash_form(),
                       [&](int64_t n, auto&& hash_at) { return pool.resumable_hit(s, hit, n, hash_at, assume); });
}

// release_many's argument: like the reference's `slots or ()`, anything
// falsy (None, an empty list) is nothing to release; other iterables of ints
// are read whole before anything is released.
std::vector<int64_t> slots_arg(PyObject* obj, const char* name = "slots") {
  std::vector<int64_t> v;
  py::handle h(obj);
  if (PyList_Check(obj) || PyTuple_Check(obj) || PyObject_CheckBuffer(obj)) {
    append_ints(h, name, v);
    return v;
  }
  const int truth = PyObject_IsTrue(obj);
  if (truth < 0) throw py::error_already_set();
  if (truth == 0) return v;
  if (PyUnicode_Check(obj) || !PyObject_HasAttrString(obj, "__iter__")) raise_type(name, "an iterable of ints", h);
  append_ints(h, name, v);  // sets, generators: read whole first
  return v;
}

// ---- engine-owned sequence objects (docs/contract.md, "Batched calls") ----
//
// A checkpoint that moves an engine object's sequence writes its new fields
// to the object before the pool commits: decide (the core's plan, nothing
// changes), write the fields back (setters may run any Python code), decide
// again and commit only if the decision still holds, else restore the fields
// and raise. The window holds the pool's call gate (call_gate.h), so another
// thread's call waits instead of changing the pool under it; what changes it
// is this thread's own setter, which is refused.

// StateSlotPool.checkpoint of a generic sequence.
void checkpoint_generic(StateSlotPool& p, fast::SeqArg& s, int64_t blocks, int64_t h) {
  const ForkPlan plan = p.plan_checkpoint(s.get(), h);
  if (plan.forks) {
    s.write_back_checked({{fast::kStateSlot, plan.fresh}, {fast::kForkSrc, plan.old}},
                         [&] { return p.plan_checkpoint(s.get(), h) == plan; });
  }
  p.apply_checkpoint(s.get(), plan, blocks, h);
}

// StateGroupPool.checkpoint of a generic sequence (PyGroupPool: the pending
// list's mirror changes with the list, no Python code in between).
struct PyGroupPool;
void checkpoint_generic(PyGroupPool& p, fast::SeqArg& s, int64_t blocks, int64_t h);

// A batch's copy intents write its hashes into statecache.Sequence objects:
// each must take the pool's form, checked for all before any is noted.
template <class Pool>
void note_forms(const Pool& p, SeqBatch& seqs, std::span<const int64_t> hashes) {
  const HashForm::Kind kind = p.hash_form().kind();
  if (!p.transfer().copies() || kind == HashForm::kUnset || hashes.size() != seqs.size())
    return;  // the core names a length mismatch
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs.is_native(i) && HashForm::has_form(hashes[i]) && !seqs.seq(i).hash_form.accepts(kind))
      throw std::invalid_argument("seqs[" + std::to_string(i) + "]: " +
                                  HashForm::conflict(("hashes[" + std::to_string(i) + "]").c_str(), hashes[i], kind));
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs.is_native(i)) seqs.seq(i).hash_form.note("hashes", hashes[i], kind);
}

// checkpoint_many with engine objects among `seqs`: the whole batch checked
// first (core/batch.h), then each entry as its per-sequence call, in order:
// a statecache.Sequence through the core, an engine object through
// `file_generic`. A setter that raises (or changes the pool) stops the batch
// at its entry, whose fields are restored; the entries before it are filed,
// as their per-sequence calls would have been. No copy of the pool is made.
template <class Pool, class FileNative, class FileGeneric>
void checkpoint_many_generic(Pool& pool, SeqBatch& seqs, std::span<const int64_t> blocks,
                             std::span<const int64_t> hashes, FileNative&& file_native, FileGeneric&& file_generic) {
  batch::checkpoint_many(
      seqs.size(), seqs.keys(), blocks, hashes, [&](size_t i) { pool.check_checkpoint(seqs.seq(i), hashes[i]); },
      [&](size_t i) {
        if (fast::SeqArg* g = seqs.generic(i))
          file_generic(*g, i);
        else
          file_native(i);
      });
}

py::tuple pair_tuple(const std::pair<int64_t, int64_t>& p) { return py::make_tuple(p.first, p.second); }

// (src, dst) pairs as a list of tuples.
py::list pair_list(const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  py::list out(pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) out[i] = pair_tuple(pairs[i]);
  return out;
}

void cancel_midstep(StateSlotPool& p, py::handle reservations) {
  p.cancel_midstep(as_reservations<MidstepReservation>(reservations, p.hash_form()));
}

py::dict occupancy_dict(const StateSlotPool& p) {
  const Occupancy o = p.occupancy();
  py::dict d;
  d["slots_total"] = o.total;
  d["slots_used"] = o.used;
  d["slots_held"] = o.held;
  d["slots_vacant"] = o.vacant;
  return d;
}

py::tuple take_relocations(StateSlotPool& p) { return py::tuple(pair_list(p.take_relocations())); }
py::list debug_relocations(const StateSlotPool& p) { return pair_list(p.pending_relocations()); }

py::list reserve_midstep(StateSlotPool& p, py::handle seq, py::handle positions) {
  SeqArg seq_arg(seq.ptr(), "seq", fast::read_if(p.enabled(), fast::kHasCache));
  const Sequence& s = seq_arg.get();
  py::list out;
  for (const auto& r : p.reserve_midstep(s, as_positions(positions, p.hash_form())))
    out.append(py::make_tuple(r.slot, r.position, hash_object(r.hash, p.hash_form())));
  return out;
}

void publish_midstep(StateSlotPool& p, py::handle reservations, py::handle seq) {
  const std::vector<MidstepReservation> res = as_reservations<MidstepReservation>(reservations, p.hash_form());
  std::optional<SeqArg> s;
  if (!seq.is_none()) s.emplace(seq.ptr(), "seq", fast::kAnchors);
  p.publish_midstep(res, s ? &s->get() : nullptr);
}

py::dict fates_dict(const StateFreeList& p) {
  const CheckpointFates& f = p.fates();
  py::dict d;
  d["checkpoints_kept"] = f.kept;
  d["checkpoints_dropped"] = f.dropped;
  d["checkpoints_evicted"] = f.evicted;
  d["checkpoints_orphaned"] = f.orphaned;
  return d;
}

// ---- read-only live views -------------------------------------------------

// `hash_to_slot` / `hash_to_group`: a live Mapping over the checkpoint index,
// iterated in insertion order like the reference's dict.
struct CheckpointIndexView {
  std::shared_ptr<const StateFreeList> pool;
  py::object owner;  // the pool's Python object: a cycle through the view is collectable

  py::dict snapshot() const {
    py::dict d;
    const HashForm& form = pool->hash_form();
    pool->index().for_each([&](int64_t h, int64_t u) {
      py::object k = hash_object(h, form);
      py::int_ v(u);
      PyDict_SetItem(d.ptr(), k.ptr(), v.ptr());
    });
    return d;
  }
  const int64_t* find(py::handle k) const {
    int64_t key = 0;
    return hash_key(k, pool->hash_form(), key) ? pool->index().find(key) : nullptr;
  }
};

// `slot_hash` / `group_hash`: a live sequence of ints, one per index ever
// allocated (it grows with extend and never shrinks, as the reference's list).
struct IndexHashView {
  std::shared_ptr<const StateFreeList> pool;
  py::object owner;  // as CheckpointIndexView's
  int64_t size() const { return pool->capacity(); }
  py::list list() const {
    py::list out(static_cast<size_t>(size()));
    for (int64_t i = 0; i < size(); ++i)
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), hash_to_py(pool->hash_of(i), pool->hash_form()));
    return out;
  }
};

// The views' __ne__: the negation of their __eq__ (NotImplemented as is).
py::object ne_by_eq(py::handle self, py::handle other) {
  py::object eq = self.attr("__eq__")(other);
  if (eq.is(py::reinterpret_borrow<py::object>(Py_NotImplemented))) return eq;
  return py::bool_(!eq.cast<bool>());
}

void bind_views(py::module_& m) {
  py::classh<CheckpointIndexView> index_view(m, "CheckpointIndexView", py::is_final(),
                                             py::metaclass(fast::guarded_metaclass()),
                                             fast::owner_gc_setup<CheckpointIndexView>(), doc("CheckpointIndexView"));
  fast::refuse_copy(index_view);
  index_view.def("__len__", [](const CheckpointIndexView& s) { return s.pool->index().size(); })
      .def("__contains__", [](const CheckpointIndexView& s, py::handle k) { return s.find(k) != nullptr; })
      .def(
          "__getitem__",
          [](const CheckpointIndexView& s, py::handle k) {
            const int64_t* v = s.find(k);
            if (!v) throw py::key_error(py_repr(k));
            return *v;
          },
          doc(index_view, "__getitem__"))
      .def(
          "get",
          [](const CheckpointIndexView& s, py::handle k, py::object fallback) -> py::object {
            const int64_t* v = s.find(k);
            if (!v) return fallback;
            return py::int_(*v);
          },
          py::arg("key"), py::arg("default") = py::none(), doc(index_view, "get"))
      .def("__iter__", [](const CheckpointIndexView& s) { return py::iter(s.snapshot()); })
      .def(
          "keys", [](const CheckpointIndexView& s) { return s.snapshot().attr("keys")(); }, doc(index_view, "keys"))
      .def(
          "values", [](const CheckpointIndexView& s) { return s.snapshot().attr("values")(); },
          doc(index_view, "values"))
      .def(
          "items", [](const CheckpointIndexView& s) { return s.snapshot().attr("items")(); }, doc(index_view, "items"))
      .def("copy", &CheckpointIndexView::snapshot, doc(index_view, "copy"))
      .def("__eq__",
           [](const CheckpointIndexView& s, py::handle other) -> py::object {
             if (py::isinstance<CheckpointIndexView>(other))
               return py::bool_(s.snapshot().equal(other.cast<const CheckpointIndexView&>().snapshot()));
             if (!PyDict_Check(other.ptr()) && !PyMapping_Check(other.ptr()))
               return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::bool_(s.snapshot().equal(py::dict(py::reinterpret_borrow<py::object>(other))));
           })
      .def("__ne__", &ne_by_eq)
      .def("__repr__", [](const CheckpointIndexView& s) { return py_repr(s.snapshot()); });
  m.attr("CheckpointIndexView").attr("__hash__") = py::none();

  py::classh<IndexHashView> hash_view(m, "IndexHashView", py::is_final(), py::metaclass(fast::guarded_metaclass()),
                                      fast::owner_gc_setup<IndexHashView>(), doc("IndexHashView"));
  fast::refuse_copy(hash_view);
  hash_view.def("__len__", [](const IndexHashView& s) { return s.size(); })
      .def("__getitem__",
           [](const IndexHashView& s, py::handle i) -> py::object {
             if (PySlice_Check(i.ptr())) return s.list()[py::reinterpret_borrow<py::slice>(i)];
             int64_t k = as_int(i, "index");
             const int64_t n = s.size();
             if (k < 0) k += n;
             if (k < 0 || k >= n) throw py::index_error("list index out of range");
             return hash_object(s.pool->hash_of(k), s.pool->hash_form());
           })
      .def("__iter__", [](const IndexHashView& s) { return py::iter(s.list()); })
      .def("__contains__", [](const IndexHashView& s, py::handle x) { return s.list().contains(x); })
      .def(
          "count", [](const IndexHashView& s, py::handle x) { return s.list().attr("count")(x); },
          doc(hash_view, "count"))
      .def(
          "index", [](const IndexHashView& s, py::handle x) { return s.list().attr("index")(x); },
          doc(hash_view, "index"))
      .def("tolist", &IndexHashView::list, doc(hash_view, "tolist"))
      .def("copy", &IndexHashView::list, doc(hash_view, "copy"))
      .def("__eq__",
           [](const IndexHashView& s, py::handle other) -> py::object {
             if (py::isinstance<IndexHashView>(other))
               return py::bool_(s.list().equal(other.cast<const IndexHashView&>().list()));
             if (!PyList_Check(other.ptr())) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::bool_(s.list().equal(other));
           })
      .def("__ne__", &ne_by_eq)
      .def("__repr__", [](const IndexHashView& s) { return py_repr(s.list()); });
  m.attr("IndexHashView").attr("__hash__") = py::none();

  // A view reads its pool: it waits for the pool's gate as the pool's own calls do.
  fast::gate_link<CheckpointIndexView> = [](PyObject* self) -> PyObject* {
    const CheckpointIndexView* v = fast::cached_instance<CheckpointIndexView>(self);
    return v ? v->owner.ptr() : nullptr;
  };
  fast::gate_link<IndexHashView> = [](PyObject* self) -> PyObject* {
    const IndexHashView* v = fast::cached_instance<IndexHashView>(self);
    return v ? v->owner.ptr() : nullptr;
  };

  py::module_ abc = py::module_::import("collections.abc");
  abc.attr("Mapping").attr("register")(m.attr("CheckpointIndexView"));
  abc.attr("Sequence").attr("register")(m.attr("IndexHashView"));
}

// ---- retirement records -----------------------------------------------------

template <class R>
void bind_retirement(py::module_& m, const char* name) {
  py::classh<R> cls(m, name, py::is_final(), STATECACHE_GUARDED(R), doc(name));
  cls.def(py::init([](py::handle retired, py::handle relocated_to, py::handle held) {
            R r;
            r.retired = as_int(retired, "retired");
            r.relocated_to = as_int(relocated_to, "relocated_to");
            r.held_checkpoint = as_bool(held, "held_checkpoint");
            return r;
          }),
          py::arg("retired"), py::arg("relocated_to"), py::arg("held_checkpoint"))
      .def_property_readonly("retired", [](const R& r) { return r.retired; })
      .def_property_readonly("relocated_to", [](const R& r) { return r.relocated_to; })
      .def_property_readonly("held_checkpoint", [](const R& r) { return r.held_checkpoint; });
  def_value(
      cls, [](const R& r) { return py::make_tuple(r.retired, r.relocated_to, r.held_checkpoint); },
      {"retired", "relocated_to", "held_checkpoint"}, /*frozen=*/true);
  cls.attr("__match_args__") = py::make_tuple("retired", "relocated_to", "held_checkpoint");
}

// ---- what both pools share --------------------------------------------------

// The reference's parameter name for an index of each pool.
template <class Pool>
constexpr const char* kIndexKind = std::is_same_v<Pool, StateSlotPool> ? "slot" : "group";
template <class Pool>
constexpr const char* kIndexKinds = std::is_same_v<Pool, StateSlotPool> ? "slots" : "groups";

template <class Pool>
void release_many_arg(Pool& p, py::handle slots) {
  p.release_many(slots_arg(slots.ptr(), kIndexKinds<Pool>));
}

inline int64_t int_arg(PyObject* o, const char* name) { return as_int(py::handle(o), name); }

// Binds the methods and attributes the two pools share. The per-call hot ones
// go through fast::def (see fast_call.h); the rest through pybind11.
template <class Pool>
py::dict debug_state(const Pool& p) {
  py::dict d;
  d["checkpointed"] = to_list(p.lru_order());
  d["speculative"] = to_list(p.speculative_indices());
  py::dict pins;
  for (int64_t x : p.pinned_indices()) pins[py::int_(x)] = p.pin_count(x);
  d["pinned"] = pins;
  d["deferred"] = to_list(p.deferred_indices());
  return d;
}

template <class Pool>
PyObject* pool_applies(Pool& p, PyObject** a) {
  return fast::to_py(p.applies(SeqArg(a[0], "seq", fast::read_if(p.enabled(), fast::kHasCache)).get()));
}

template <class Pool>
PyObject* pool_resumable_hit(Pool& p, PyObject** a) {
  return fast::to_py(resumable_hit_arg(p, a[0], a[1], a[2], a[3] ? py::handle(a[3]) : py::handle(Py_False)));
}

template <class Pool>
PyObject* pool_resumable_hits(Pool& p, PyObject** a) {
  return resumable_hits_arg(p, a[0], a[1], a[2], a[3], fast::kHasCache | fast::kNumTokens).release().ptr();
}

template <class Pool, class Retire>
void bind_free_list_api(py::classh<Pool>& cls) {
  constexpr const char* U = kIndexKind<Pool>;
  using fast::to_py;
  fast::refuse_copy(cls);
  def_eviction_methods(cls, [](Pool& p) -> StateFreeList& { return p; });
  fast::method<&Pool::num_free>(cls, "num_free", {});
  fast::method<&Pool::is_free>(cls, "is_free", {U});
  fast::method<&Pool::holds_checkpoint>(cls, "holds_checkpoint", {U});
  fast::method<&Pool::pop>(cls, "pop", {});
  fast::method<&Pool::claim>(cls, "claim", {U});
  fast::method<&Pool::release>(cls, "release", {U});
  fast::method<&Pool::extend>(cls, "extend", {"count"});
  fast::def<&pool_applies<Pool>>(cls, "applies", {"seq"});
  fast::def<&pool_resumable_hit<Pool>>(cls, "resumable_hit",
                                       {"seq", "hit", "block_hashes", "assume_checkpointed=False"});
  fast::def<&pool_resumable_hits<Pool>>(cls, "resumable_hits",
                                        {"seqs", "hits", "block_hashes=None", "assume_checkpointed=False"});
  fast::method<&release_many_arg<Pool>>(cls, "release_many", {kIndexKinds<Pool>});
  fast::method<&Pool::lookup>(cls, "lookup", {fast::hash_arg("h")});
  fast::method<&Pool::invalidate>(cls, "invalidate", {U});
  fast::method<&Pool::pin>(cls, "pin", {U, "*", "reader_is_next_batch=False"});
  fast::method<&Pool::is_pinned>(cls, "is_pinned", {U});
  fast::method<&Pool::pin_count>(cls, "pin_count", {U});
  fast::method<&Pool::unpin>(cls, "unpin", {U});
  fast::method<&Pool::drop_reader>(cls, "drop_reader", {U});
  fast::method<&Pool::release_pins>(cls, "release_pins", {});

  fast::def_readonly<Pool>(cls, "enabled", [](const Pool& p) { return to_py(p.enabled()); });
  fast::def_readonly<Pool>(cls, "min_fork_tokens", [](const Pool& p) { return to_py(p.min_fork_tokens()); });
  fast::def_readonly<Pool>(cls, "successor_room", [](const Pool& p) { return to_py(p.successor_room()); });
  fast::def_readonly<Pool>(cls, "readable_midstep", [](const Pool& p) { return to_py(p.readable_midstep()); });
  fast::def_readonly<Pool>(cls, "hash_block_size", [](const Pool& p) { return to_py(p.hash_block_size()); });
  fast::def_readonly<Pool>(cls, "checkpoints_kept", [](const Pool& p) { return to_py(p.fates().kept); });
  fast::def_readonly<Pool>(cls, "checkpoints_dropped", [](const Pool& p) { return to_py(p.fates().dropped); });
  fast::def_readonly<Pool>(cls, "checkpoints_evicted", [](const Pool& p) { return to_py(p.fates().evicted); });
  fast::def_readonly<Pool>(cls, "checkpoints_orphaned", [](const Pool& p) { return to_py(p.fates().orphaned); });

  fast::method<&Pool::retire_top>(cls, "retire_top", {});
  fast::method<&fates_dict>(cls, "checkpoint_fates", {});
  fast::def_readonly<Pool>(cls, "transfer", [](const Pool& p) { return py::cast(p.transfer()).release().ptr(); });
  // Introspection for tests: the private containers of the reference.
  fast::method<&Pool::check_invariants>(cls, "_check_invariants", {});
  fast::method<&Pool::index_is_exact>(cls, "_index_is_exact", {});
  fast::method<&debug_state<Pool>>(cls, "_debug_state", {});
}

template <class Pool>
void bind_views_of(py::classh<Pool>& cls, const char* index_name, const char* hash_name) {
  fast::def_readonly<Pool>(cls, index_name, [](const Pool&, PyObject* self) {
    std::shared_ptr<const StateFreeList> p = py::handle(self).cast<std::shared_ptr<Pool>>();
    return fast::cast_cached<CheckpointIndexView>(
               CheckpointIndexView{std::move(p), py::reinterpret_borrow<py::object>(self)})
        .release()
        .ptr();
  });
  fast::def_readonly<Pool>(cls, hash_name, [](const Pool&, PyObject* self) {
    std::shared_ptr<const StateFreeList> p = py::handle(self).cast<std::shared_ptr<Pool>>();
    return fast::cast_cached<IndexHashView>(IndexHashView{std::move(p), py::reinterpret_borrow<py::object>(self)})
        .release()
        .ptr();
  });
}

// The slot pool's unindex returns None, as the reference's does (the core
// also says which slot it freed).
void unindex_slot(StateSlotPool& p, int64_t h) { p.unindex(h); }

PyObject* slot_checkpoint(StateSlotPool& p, PyObject** a, PyObject* self) {
  SeqArg s(a[0], "seq", fast::read_if(p.enabled(), fast::kHasCache));
  const int64_t blocks = int_arg(a[1], "boundary_blocks");
  const int64_t h = as_hash(a[2], "h", p.hash_form());
  // The rest only where the reference reads it: the slot of a forking
  // sequence, then (a fork that happens) its anchors.
  if (p.applies(s.get()) && p.transfer().forks()) {
    s.read(fast::kStateSlot);
    if (s.get().state_slot() >= 0 && p.has_free()) s.read(fast::kAnchors | fast::if_present(fast::kForkSrc));
  }
  if (s.native()) {
    p.checkpoint(s.get(), blocks, h);
    return fast::none();
  }
  CallGate::Hold window(fast::gate_of<StateSlotPool>(self));
  checkpoint_generic(p, s, blocks, h);
  return fast::none();
}

PyObject* slot_checkpoint_many(StateSlotPool& p, PyObject** a, PyObject* self) {
  const IntSpan blocks(a[1], "boundary_blocks"), hashes(a[2], "hashes", p.hash_form());
  SeqBatch seqs(a[0], "seqs", fast::kHasCache | fast::kStateSlot | fast::kAnchors | fast::if_present(fast::kForkSrc));
  if (seqs.all_native()) {
    p.checkpoint_many(seqs.seqs(), seqs.keys(), blocks.span(), hashes.span());
    return fast::none();
  }
  const std::span<const int64_t> bs = blocks.span(), hs = hashes.span();
  CallGate::Hold window(fast::gate_of<StateSlotPool>(self));
  checkpoint_many_generic(
      p, seqs, bs, hs, [&](size_t i) { p.checkpoint(seqs.seq(i), bs[i], hs[i]); },
      [&](SeqArg& s, size_t i) { checkpoint_generic(p, s, bs[i], hs[i]); });
  return fast::none();
}

void bind_slot_pool(py::module_& m) {
  py::classh<StateSlotPool> cls(m, "StateSlotPool", py::is_final(), STATECACHE_GUARDED(StateSlotPool),
                                doc("StateSlotPool"));
  cls.def(py::init([](py::handle n, py::handle transfer, py::handle hbs, py::handle enabled) {
            return std::make_shared<StateSlotPool>(as_int(n, "num_slots"), transfer_arg(transfer),
                                                   as_int(hbs, "hash_block_size"), as_bool(enabled, "enabled"));
          }),
          py::arg("num_slots"), py::arg("transfer") = py::none(), py::arg("hash_block_size") = 1,
          py::arg("enabled") = true);
  bind_free_list_api<StateSlotPool, SlotRetirement>(cls);
  bind_views_of(cls, "hash_to_slot", "slot_hash");
  using fast::to_py;
  using P = StateSlotPool;
  fast::def_readonly<P>(cls, "num_slots", [](const P& p) { return to_py(p.size()); });
  fast::method<&P::has_free>(cls, "has_free", {"count=1"});
  fast::method<&P::pop_many>(cls, "pop_many", {"count"});
  fast::method<&P::mark_speculative>(cls, "mark_speculative", {"slot"});
  fast::method<&P::promote>(cls, "promote", {"slot"});
  fast::def<&slot_checkpoint>(cls, "checkpoint", {"seq", "boundary_blocks", "h"});
  fast::def<&slot_checkpoint_many>(cls, "checkpoint_many", {"seqs", "boundary_blocks", "hashes"});
  fast::method<&unindex_slot>(cls, "unindex", {fast::hash_arg("h")});
  fast::method<&reserve_midstep>(cls, "reserve_midstep", {"seq", "positions"});
  fast::method<&publish_midstep>(cls, "publish_midstep", {"reservations", "seq=None"});
  fast::method<&cancel_midstep>(cls, "cancel_midstep", {"reservations"});
  fast::method<&occupancy_dict>(cls, "occupancy", {});
  fast::method<&P::record_relocation>(cls, "record_relocation", {"src", "dst"});
  fast::method<&take_relocations>(cls, "take_relocations", {});
  fast::method<&P::clear_index>(cls, "clear_index", {});
  fast::method<&debug_relocations>(cls, "_debug_relocations", {});
}

// The group pool as Python sees it: the core plus the sequences behind its
// pending copy intents (strong references, entry for entry with the core's
// pending list), which take part in garbage collection.
struct PyGroupPool : StateGroupPool {
  using StateGroupPool::StateGroupPool;
  std::vector<py::object> pending_seqs;

  // The fields take_copies reads from each pending sequence; entries of one
  // object (by identity) share a `seq` number.
  std::vector<PendingSeq> read_pending(const std::vector<py::object>& seqs) const {
    std::vector<PendingSeq> out(seqs.size());
    for (size_t k = 0; k < seqs.size(); ++k) {
      size_t first = k;
      for (size_t j = 0; j < k; ++j)
        if (seqs[j].ptr() == seqs[k].ptr()) {
          first = j;
          break;
        }
      if (first != k) {
        out[k] = out[first];
        continue;
      }
      SeqArg s(seqs[k].ptr(), "pending seq", fast::kPending | fast::kGroup, &hash_form());
      out[k] = {s.get().pending_checkpoint, s.get().per_req_cache_group, k};
    }
    return out;
  }
};

void checkpoint_generic(PyGroupPool& p, fast::SeqArg& s, int64_t blocks, int64_t h) {
  const ForkPlan plan = p.plan_checkpoint(s.get(), h);
  if (plan.forks) {
    s.write_back_checked({{fast::kGroup, plan.fresh}, {fast::kForkSrc, plan.old}},
                         [&] { return p.plan_checkpoint(s.get(), h) == plan; });
  } else if (p.plan_intent(s.get(), h)) {
    s.write_back_checked({{fast::kPending, h}}, [&] { return p.plan_intent(s.get(), h); });
  }
  if (p.checkpoint(s.get(), blocks, h)) p.pending_seqs.push_back(s.ref());
}

bool group_has_free(const PyGroupPool& p) { return p.num_free() > 0; }
py::list debug_copies(const PyGroupPool& p) { return pair_list(p.pending_copies()); }
py::list debug_pending(const PyGroupPool& p) {
  py::list out;
  for (const auto& s : p.pending_seqs) out.append(s);
  return out;
}

int traverse_group_pool(PyGroupPool& p, visitproc visit, void* arg) {
  for (const py::object& o : p.pending_seqs) Py_VISIT(o.ptr());
  return 0;
}

void clear_group_pool(PyGroupPool& p) {
  p.drop_pending();
  std::vector<py::object> gone;
  gone.swap(p.pending_seqs);  // released after the pool is consistent
}

PyObject* group_checkpoint(PyGroupPool& p, PyObject** a, PyObject* self) {
  SeqArg s(a[0], "seq", fast::read_if(p.enabled(), fast::kHasCache), &p.hash_form());
  const int64_t blocks = int_arg(a[1], "boundary_blocks");
  const int64_t h = as_hash(a[2], "h", p.hash_form());
  // The group of a sequence it applies to, then pending_checkpoint only
  // under copy (as the reference reads them).
  if (p.applies(s.get())) {
    s.read(fast::kGroup);
    if (s.get().per_req_cache_group >= 0)
      s.read(p.transfer().copies() ? fast::kPending : fast::if_present(fast::kForkSrc));
  }
  if (s.native()) {
    // A copy intent writes h into the Sequence: it reads back in the pool's form.
    if (p.transfer().copies()) s.get().hash_form.note("h", h, p.hash_form().kind());
    if (p.checkpoint(s.get(), blocks, h)) p.pending_seqs.push_back(s.ref());
    return fast::none();
  }
  CallGate::Hold window(fast::gate_of<PyGroupPool>(self));
  checkpoint_generic(p, s, blocks, h);
  return fast::none();
}

PyObject* group_checkpoint_many(PyGroupPool& p, PyObject** a, PyObject* self) {
  const IntSpan blocks(a[1], "boundary_blocks"), hashes(a[2], "hashes", p.hash_form());
  SeqBatch seqs(
      a[0], "seqs",
      fast::kHasCache | fast::kGroup | (p.transfer().copies() ? fast::kPending : fast::if_present(fast::kForkSrc)),
      &p.hash_form());
  const std::span<const int64_t> bs = blocks.span(), hs = hashes.span();
  note_forms(p, seqs, hs);
  if (seqs.all_native()) {
    // The intent list and its mirror change together, with no Python
    // code in between.
    for (size_t i : p.checkpoint_many(seqs.seqs(), seqs.keys(), bs, hs)) p.pending_seqs.push_back(seqs.ref(i));
    return fast::none();
  }
  CallGate::Hold window(fast::gate_of<PyGroupPool>(self));
  checkpoint_many_generic(
      p, seqs, bs, hs,
      [&](size_t i) {
        if (p.checkpoint(seqs.seq(i), bs[i], hs[i])) p.pending_seqs.push_back(seqs.ref(i));
      },
      [&](SeqArg& s, size_t i) { checkpoint_generic(p, s, bs[i], hs[i]); });
  return fast::none();
}

PyObject* group_forget_pending_many(PyGroupPool& p, PyObject** a, PyObject* self) {
  // pending_checkpoint is written, never read (as in the reference):
  // read only to restore it should a later write fail.
  SeqBatch seqs(a[0], "seqs", fast::if_present(fast::kPending), &p.hash_form());
  // Generic objects first (a failing setter restores what was written,
  // nothing else changed), then the statecache.Sequence fields.
  std::vector<SeqBatch::Writes> writes;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs.is_native(i)) continue;
    SeqBatch::Writes w;
    w.entry = i;
    w.add(fast::kPending, -1);
    writes.push_back(w);
  }
  CallGate::Hold window(fast::gate_of<PyGroupPool>(self));
  seqs.write_back(writes);
  std::vector<Sequence*> native;
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs.is_native(i)) native.push_back(&seqs.seq(i));
  p.forget_pending_many(native);
  return fast::none();
}

PyObject* group_forget_pending(PyGroupPool& p, PyObject** a, PyObject* self) {
  // Writes the field without reading it, as the reference does.
  SeqArg s(a[0], "seq", 0, &p.hash_form());
  if (s.native()) {
    p.forget_pending(s.get());
    return fast::none();
  }
  CallGate::Hold window(fast::gate_of<PyGroupPool>(self));
  s.write_back({{fast::kPending, -1}});
  return fast::none();
}

PyObject* group_take_copies(PyGroupPool& p, PyObject**, PyObject* self) {
  // Read every pending sequence, clear their pending_checkpoint, then
  // commit in C++. Whatever fails before the commit (a getter or
  // setter that raises, a setter that changed the pending list) gives
  // the fields already cleared their values back: nothing changed.
  CallGate::Hold window(fast::gate_of<PyGroupPool>(self));
  const std::vector<py::object> seqs = p.pending_seqs;
  const std::vector<StateGroupPool::PendingSeq> state = p.read_pending(seqs);
  size_t cleared = 0;  // seqs[0:cleared] were written
  auto give_back = [&] {
    for (size_t j = 0; j < cleared; ++j) {
      if (state[j].seq != j) continue;
      SeqArg back(seqs[j].ptr(), "pending seq", 0, &p.hash_form());
      if (back.native()) {
        back.get().pending_checkpoint = state[j].pending_checkpoint;
        continue;
      }
      try {
        back.write_back({{fast::kPending, state[j].pending_checkpoint}});
      } catch (...) {
        PyErr_Clear();
      }
    }
  };
  try {
    for (size_t k = 0; k < seqs.size(); ++k) {
      if (state[k].seq == k) {
        SeqArg s(seqs[k].ptr(), "pending seq", 0, &p.hash_form());
        if (s.native())
          s.get().pending_checkpoint = -1;
        else
          s.write_back({{fast::kPending, -1}});  // restores itself when it raises
      }
      cleared = k + 1;
    }
    if (p.pending_seqs.size() != seqs.size() || p.pending_count() != seqs.size())
      throw std::runtime_error("the pool changed while pending sequences were written back; nothing was filed");
  } catch (...) {
    give_back();
    throw;
  }
  const auto pairs = p.take_copies(state);
  std::vector<py::object> done;
  done.swap(p.pending_seqs);  // released once the pool is consistent
  return pair_list(pairs).release().ptr();
}

void bind_group_pool(py::module_& m) {
  py::classh<PyGroupPool> cls(m, "StateGroupPool", py::is_final(), py::metaclass(fast::guarded_metaclass()),
                              fast::gc_setup<PyGroupPool, &traverse_group_pool, &clear_group_pool>(),
                              doc("StateGroupPool"));
  cls.def(py::init([](py::handle n, py::handle transfer, py::handle hbs, py::handle enabled) {
            return std::make_shared<PyGroupPool>(as_int(n, "num_groups"), transfer_arg(transfer),
                                                 as_int(hbs, "hash_block_size"), as_bool(enabled, "enabled"));
          }),
          py::arg("num_groups"), py::arg("transfer") = py::none(), py::arg("hash_block_size") = 1,
          py::arg("enabled") = true, doc(cls, "__init__"));
  bind_free_list_api<PyGroupPool, GroupRetirement>(cls);
  bind_views_of(cls, "hash_to_group", "group_hash");
  using fast::to_py;
  using G = PyGroupPool;
  fast::def_readonly<G>(cls, "num_groups", [](const G& p) { return to_py(p.size()); });
  fast::method<&group_has_free>(cls, "has_free", {});
  fast::def<&group_checkpoint>(cls, "checkpoint", {"seq", "boundary_blocks", "h"});
  fast::def<&group_checkpoint_many>(cls, "checkpoint_many", {"seqs", "boundary_blocks", "hashes"});
  fast::def<&group_forget_pending_many>(cls, "forget_pending_many", {"seqs"});
  fast::def<&group_forget_pending>(cls, "forget_pending", {"seq"});
  fast::method<&G::record_copy>(cls, "record_copy", {"src", "dst"});
  fast::method<&G::unindex>(cls, "unindex", {fast::hash_arg("h")});
  fast::def<&group_take_copies>(cls, "take_copies", {});
  fast::method<&debug_copies>(cls, "_debug_copies", {});
  fast::method<&debug_pending>(cls, "_debug_pending", {});
}

}  // namespace

std::shared_ptr<ScratchSlotSource> as_scratch_source(py::handle obj, const char* name) {
  if (!py::isinstance<StateSlotPool>(obj)) raise_type(name, "a statecache.StateSlotPool", obj);
  return obj.cast<std::shared_ptr<StateSlotPool>>();
}

void bind_pools(py::module_& m) {
  bind_views(m);
  bind_retirement<SlotRetirement>(m, "SlotRetirement");
  bind_retirement<GroupRetirement>(m, "GroupRetirement");
  bind_slot_pool(m);
  bind_group_pool(m);
}

}  // namespace statecache::bindings
