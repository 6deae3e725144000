// Vectorcall methods and getters for the hot paths (pools, PAGE store and
// coordinator), and the instance guard and pointer cache they and the
// collector use.
//
// A serving loop calls the pools once or more per sequence per pass, and
// pybind11's generic dispatcher costs a few times a plain Python method call,
// which is more than most of these methods' work. fast::def registers a
// CPython METH_FASTCALL descriptor with a small keyword parser: positional and
// keyword forms, defaults and keyword-only parameters as the reference has
// them, a text signature built from the same parameter list, the docstring
// docs/api.md gives "Class.method" (docs.h), and C++ exceptions mapped as
// everywhere else in the module. It is the one way a fast method is defined.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings/call_gate.h"
#include "bindings/convert.h"
#include "bindings/docs.h"
#include "core/errors.h"
#include "core/sequence.h"

namespace statecache::bindings::fast {

namespace py = pybind11;

inline constexpr int kMaxParams = 6;

struct Params {
  std::string func;
  std::vector<std::string> names;
  std::vector<const char*> cnames;  // names[i].c_str(), filled once names is complete
  int required = 0;                 // leading parameters without a default
  int positional = 0;               // how many may be given positionally (rest keyword-only)
  // Table methods (fast::method) only: per parameter, its Arg::Check and the
  // default its text gives.
  std::array<uint8_t, kMaxParams> kind{};
  std::array<int64_t, kMaxParams> defaults{};
};

// A parameter of a table method: "name", "name=default" (the default as the
// text signature shows it: an int, True, False or None), or "*" (the rest are
// keyword-only).
struct Arg {
  enum Check : uint8_t { kPlain, kHash, kNonNeg };
  const char* text;
  // kHash: an int read as a hash, in the instance's HashForm (as_hash);
  // kNonNeg: an int >= 0 (as_nonneg_int).
  Check kind = kPlain;
  constexpr Arg(const char* t) : text(t) {}  // NOLINT: a name is an Arg
  constexpr Arg(const char* t, Check k) : text(t), kind(k) {}
};
constexpr Arg hash_arg(const char* text) { return Arg(text, Arg::kHash); }
constexpr Arg nonneg_arg(const char* text) { return Arg(text, Arg::kNonNeg); }

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
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::overflow_error& e) {
    PyErr_SetString(PyExc_OverflowError, e.what());
  } catch (const std::domain_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::length_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::range_error& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

// Fills out[i] for each parameter of `p`; optional ones not given stay
// nullptr. Returns false with a TypeError set, the way CPython words it.
// Allocates nothing.
inline bool parse(const Params& p, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, PyObject** out) {
  const char* func = p.func.c_str();
  const int n = static_cast<int>(p.cnames.size());
  if (nargs > p.positional) {
    PyErr_Format(PyExc_TypeError, "%s() takes %d positional argument%s but %zd were given", func, p.positional,
                 p.positional == 1 ? "" : "s", nargs);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) out[i] = args[i];
  if (kwnames) {
    const Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; ++k) {
      PyObject* key = PyTuple_GET_ITEM(kwnames, k);
      int slot = -1;
      for (int i = 0; i < n; ++i)
        if (PyUnicode_CompareWithASCIIString(key, p.cnames[static_cast<size_t>(i)]) == 0) slot = i;
      if (slot < 0) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", func, key);
        return false;
      }
      if (out[slot]) {
        PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", func, key);
        return false;
      }
      out[slot] = args[nargs + k];
    }
  }
  for (int i = 0; i < p.required; ++i)
    if (!out[i]) {
      PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", func, p.cnames[static_cast<size_t>(i)]);
      return false;
    }
  return true;
}

// ---- instances: found without pybind11 internals, never uninitialized ----
//
// Every class that uses these helpers is declared with
//   py::metaclass(fast::guarded_metaclass()), py::custom_type_setup(&fast::instance_setup<T>)
// which (1) refuses `cls.__new__(cls)` outside a call of the class, so an
// instance whose __init__ never ran cannot be made by ordinary code (pybind11's
// own dispatcher would hand such an instance raw storage), and (2) appends one
// pointer-sized field of ours to the instance layout, caching the C++ object
// as soon as the instance exists (pybind11's public caster produces it; see
// cache_fills and cast_cached). The cache is valid for the instance's life:
// its holder is never replaced (a second __init__ is a no-op) or released
// (nothing disowns these types). Nothing here reads pybind11's own layout.

// The class this thread is calling (set by the metaclass, consumed by
// tp_new). Per thread: another thread's construction, whose Python __new__
// may be running, never lets this one's bare __new__ through, nor consumes
// it.
inline thread_local PyObject* constructing = nullptr;

inline PyObject* guarded_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  if (constructing != reinterpret_cast<PyObject*>(type)) {
    PyErr_Format(PyExc_TypeError,
                 "%s objects are created by calling the class; %s.__new__() alone would leave one "
                 "uninitialized (and cannot be pickled or copied)",
                 type->tp_name, type->tp_name);
    return nullptr;
  }
  constructing = nullptr;
  PyTypeObject* base = type->tp_base;
  while (base && base->tp_new == &guarded_new) base = base->tp_base;
  return base->tp_new(type, args, kwargs);
}

// Per class with a cache field: fills an instance's cache (instance_setup
// registers it; the metaclass calls it once __init__ has run).
using CacheFill = void (*)(PyObject*);
inline std::vector<std::pair<PyTypeObject*, CacheFill>> cache_fills;

// Never throws (it runs inside a C slot): an instance it cannot fill keeps an
// empty cache, as one made before the fill existed would.
inline void fill_cache(PyObject* obj) noexcept {
  try {
    for (PyTypeObject* t = Py_TYPE(obj); t != nullptr; t = t->tp_base)
      for (const auto& [type, fill] : cache_fills)
        if (type == t) return fill(obj);
  } catch (...) {
    PyErr_Clear();
  }
}

// The metaclass: pybind11's default with a call that marks the class being
// constructed and, once it is, caches the C++ object in the new instance.
// Created by init_guard (common.cpp) before any class is bound.
inline PyObject* guarded_meta = nullptr;
inline ternaryfunc base_meta_call = nullptr;

inline PyObject* guarded_meta_call(PyObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* saved = constructing;
  constructing = type;
  PyObject* r = base_meta_call(type, args, kwargs);
  constructing = saved;
  if (r != nullptr) fill_cache(r);
  return r;
}

inline py::handle guarded_metaclass() { return py::handle(guarded_meta); }

template <class T>
inline Py_ssize_t cache_offset = 0;  // 0: T's class carries no cache field

// Caches the C++ object of `obj`, an instance of T's class (or a subclass)
// whose __init__ has run, so its holder is constructed and the public raw
// pointer cast answers (whatever the holder type).
template <class T>
void remember_instance(PyObject* obj) {
  T* p = py::cast<T*>(py::handle(obj));
  if (p && cache_offset<T> != 0) *reinterpret_cast<T**>(reinterpret_cast<char*>(obj) + cache_offset<T>) = p;
}

// ---- call gates (call_gate.h) ----
//
// Every instance of a guarded class carries a CallGate right after its
// pointer cache (zeroed at allocation: open). A class may link a second
// object whose gate its calls also wait for (a view waits for its pool's, a
// coordinator for its scratch pool's, which it changes from C++).
using GateLink = PyObject* (*)(PyObject* self);

template <class T>
inline GateLink gate_link = nullptr;

// A C++ gate a class's calls also wait for: the one a store holds while a
// pool given from Python runs (paged_values.h, PyUnitPool). nullptr: none.
using InnerGate = CallGate* (*)(PyObject* self);

template <class T>
inline InnerGate inner_gate = nullptr;

// Waits for `self`'s inner gate when another thread holds it; returns
// whether it waited (the GIL was released meanwhile).
inline bool wait_inner(PyObject* self, InnerGate inner) {
  CallGate* g = inner ? inner(self) : nullptr;
  if (g == nullptr || !g->held() || g->held_by_this_thread()) return false;
  g->wait_turn();
  return true;
}

struct GateInfo {
  PyTypeObject* type;
  Py_ssize_t offset;
  GateLink* link;    // &gate_link<T>: set after the class is bound
  InnerGate* inner;  // &inner_gate<T>, likewise
};
inline std::vector<GateInfo> gate_infos;

inline CallGate& gate_at(PyObject* obj, Py_ssize_t offset) {
  return *reinterpret_cast<CallGate*>(reinterpret_cast<char*>(obj) + offset);
}

template <class T>
void instance_setup(PyHeapTypeObject* heap_type) {
  PyTypeObject* t = &heap_type->ht_type;
  cache_offset<T> = t->tp_basicsize;
  t->tp_basicsize += static_cast<Py_ssize_t>(sizeof(void*) + sizeof(CallGate));
  t->tp_new = &guarded_new;
  cache_fills.emplace_back(t, &remember_instance<T>);
  // Fixed capacity: gate_info keeps pointers into the table.
  if (gate_infos.empty()) gate_infos.reserve(128);
  if (gate_infos.size() == gate_infos.capacity())
    throw std::logic_error("more guarded classes than the gate table holds");
  gate_infos.push_back({t, cache_offset<T> + static_cast<Py_ssize_t>(sizeof(void*)), &gate_link<T>, &inner_gate<T>});
}

// The gate of an instance of T's class (or a subclass).
template <class T>
CallGate& gate_of(PyObject* self) {
  return gate_at(self, cache_offset<T> + static_cast<Py_ssize_t>(sizeof(void*)));
}

inline const GateInfo* gate_info(PyTypeObject* t) {
  // The last bound type asked about, by exact type: a method's forwarder asks
  // once per call. (gate_infos is complete once the module is bound.)
  static thread_local const GateInfo* last = nullptr;
  if (last != nullptr && last->type == t) return last;
  for (PyTypeObject* b = t; b != nullptr; b = b->tp_base)
    for (const GateInfo& g : gate_infos)
      if (g.type == b) {
        if (b == t) last = &g;
        return &g;
      }
  return nullptr;
}

// Waits until no other thread holds the gate of `obj` (any object; one of no
// guarded class has none) or of the object it links.
inline void wait_turn(PyObject* obj) {
  const GateInfo* g = gate_info(Py_TYPE(obj));
  if (g == nullptr) return;
  CallGate& own = gate_at(obj, g->offset);
  for (;;) {
    own.wait_turn();
    if (wait_inner(obj, *g->inner) && own.held() && !own.held_by_this_thread()) continue;
    PyObject* linked = *g->link ? (*g->link)(obj) : nullptr;
    if (linked == nullptr || linked == obj) return;
    py::object keep = py::reinterpret_borrow<py::object>(linked);
    wait_turn(linked);
    if (!own.held() || own.held_by_this_thread()) return;  // else another thread took ours meanwhile
  }
}

// The trampolines' entry: wait_turn for an instance of T's class.
template <class T>
[[gnu::always_inline]] inline void enter(PyObject* self) {
  CallGate& own = gate_of<T>(self);
  for (;;) {
    if (own.held()) [[unlikely]]
      own.wait_turn();
    if (inner_gate<T> && wait_inner(self, inner_gate<T>) && own.held() && !own.held_by_this_thread()) [[unlikely]]
      continue;
    PyObject* linked = gate_link<T> ? gate_link<T>(self) : nullptr;
    if (linked == nullptr) return;
    py::object keep = py::reinterpret_borrow<py::object>(linked);
    wait_turn(linked);
    if (!own.held() || own.held_by_this_thread()) return;
  }
}

// The class_ extras that give T's class the guard, the cache field and the
// call gate.
#define STATECACHE_GUARDED(T)                                               \
  ::pybind11::metaclass(::statecache::bindings::fast::guarded_metaclass()), \
      ::pybind11::custom_type_setup(&::statecache::bindings::fast::instance_setup<T>)

// For a live object (a pool, a store, a view): pickling and copying raise
// TypeError up front (they would go through cls.__new__; value types define
// __reduce__ instead).
inline PyObject* refuse_live_copy(PyObject* self) {
  PyErr_Format(PyExc_TypeError, "cannot pickle or copy a %s (it is a live object, not a value)",
               Py_TYPE(self)->tp_name);
  return nullptr;
}

inline void refuse_copy(py::handle cls) {
  struct Refused {
    const char* name;
    PyCFunction meth;
    int flags;
    const char* params;  // the text signature's
  };
  static const Refused refused[] = {
      {"__reduce_ex__", [](PyObject* self, PyObject*) { return refuse_live_copy(self); }, METH_O,
       "($self, protocol, /)"},
      {"__reduce__", [](PyObject* self, PyObject*) { return refuse_live_copy(self); }, METH_NOARGS, "($self)"},
      {"__copy__", [](PyObject* self, PyObject*) { return refuse_live_copy(self); }, METH_NOARGS, "($self)"},
      {"__deepcopy__", [](PyObject* self, PyObject*) { return refuse_live_copy(self); }, METH_O, "($self, memo, /)"},
  };
  for (const Refused& r : refused) {
    // One definition per class, for its own docstring; never freed (as install's).
    const char* d = doc(cls, r.name);
    auto* text = new std::string(std::string(r.name) + r.params + "\n--\n\n" + (d ? d : ""));
    auto* md = new PyMethodDef{r.name, r.meth, r.flags, text->c_str()};
    py::object descr =
        py::reinterpret_steal<py::object>(PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), md));
    if (!descr) throw py::error_already_set();
    py::setattr(cls, r.name, descr);
  }
}

// The C++ object behind an instance of T's class (or a Python subclass), or
// nullptr when its __init__ has not run. The slow path is pybind11's public
// shared_ptr caster, the one form that reports an unconstructed holder.
template <class T>
[[gnu::noinline]] T* instance_ptr_slow(PyObject* obj) {
  T* p = nullptr;
  try {
    p = py::cast<std::shared_ptr<T>>(py::handle(obj)).get();
  } catch (const py::cast_error&) {
    return nullptr;
  } catch (const py::value_error&) {
    return nullptr;
  }
  if (p && cache_offset<T> != 0) *reinterpret_cast<T**>(reinterpret_cast<char*>(obj) + cache_offset<T>) = p;
  return p;
}

// A C++ value (or shared_ptr) of T as a new Python object with its cache
// filled: instances made in C++ do not pass through the metaclass.
template <class T, class V>
py::object cast_cached(V&& value) {
  py::object o = py::cast(std::forward<V>(value));
  remember_instance<T>(o.ptr());
  return o;
}

// The cached pointer only, for tp_traverse / tp_clear, which must not run
// casts. Filled when the instance was made (by calling the class, or by
// cast_cached); nullptr only for an instance whose __init__ did not run.
template <class T>
inline T* cached_instance(PyObject* obj) {
  if (cache_offset<T> == 0) return nullptr;
  return *reinterpret_cast<T**>(reinterpret_cast<char*>(obj) + cache_offset<T>);
}

// Registers tp_traverse / tp_clear for a bound class that holds Python
// objects: `visit_all(T&, visitproc, arg)` visits each reference the object
// owns exactly once, `clear_all(T&)` drops them (the C++ object stays usable).
// The class also takes the creation guard and the pointer cache the collector
// reads (fast::instance_setup; pybind11 takes one custom_type_setup per
// class): declare it with py::metaclass(fast::guarded_metaclass()), and make
// instances in C++ with fast::cast_cached.
template <class T, int (*Traverse)(T&, visitproc, void*), void (*Clear)(T&)>
py::custom_type_setup gc_setup() {
  return py::custom_type_setup([](PyHeapTypeObject* heap_type) {
    instance_setup<T>(heap_type);
    PyTypeObject* type = &heap_type->ht_type;
    type->tp_flags |= Py_TPFLAGS_HAVE_GC;
    type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) -> int {
      Py_VISIT(Py_TYPE(self));
      if (T* v = cached_instance<T>(self)) return Traverse(*v, visit, arg);
      return 0;
    };
    type->tp_clear = [](PyObject* self) -> int {
      if (T* v = cached_instance<T>(self)) Clear(*v);
      return 0;
    };
  });
}

// gc_setup for a live view, whose one reference is `owner`, the object it
// reads (a cycle through the view is collectable).
template <class V>
int traverse_owner(V& v, visitproc visit, void* arg) {
  Py_VISIT(v.owner.ptr());
  return 0;
}
template <class V>
void clear_owner(V& v) {
  py::object old = std::move(v.owner);  // released after the view is consistent
  v.owner = py::none();
}
template <class V>
py::custom_type_setup owner_gc_setup() {
  return gc_setup<V, &traverse_owner<V>, &clear_owner<V>>();
}

// `obj` must be an instance of T's class (method descriptors and getsets
// check that before calling us).
template <class T>
inline T* instance_ptr(PyObject* obj) {
  if (cache_offset<T> != 0) {
    T* p = *reinterpret_cast<T**>(reinterpret_cast<char*>(obj) + cache_offset<T>);
    if (p) return p;
  }
  return instance_ptr_slow<T>(obj);
}

// The instance behind `self`; a TypeError when its __init__ did not run.
template <class T>
T& self_of(PyObject* self) {
  T* t = instance_ptr<T>(self);
  if (!t)
    throw py::type_error(std::string(Py_TYPE(self)->tp_name) +
                         " instance is not initialized (its __init__ did not run)");
  return *t;
}

// ---- any object as `seq` (docs/contract.md, "API guarantees") ----------
//
// A `seq` argument is a statecache.Sequence (fast path: the C++ object, read
// and written in place by the core) or any object with the sequence
// attributes, e.g. an engine's own request class (generic path). The generic
// path works in three steps, so that the pool and the object never disagree:
//   1. read: the constructor reads and validates every attribute the call
//      needs into a Sequence snapshot (get()), before anything changes;
//   2. write back: the caller computes what the pool will do without doing it
//      (core plan_* methods) and writes the fields that change to the object
//      (write_back); a failing write restores the fields already written and
//      raises, the pool untouched;
//   3. apply: the core runs on the snapshot (no Python code runs there), after
//      the caller re-checked that the plan still holds (a setter may re-enter).
// A pool that keeps a sequence across calls keeps ref() (a strong reference)
// and tells sequences apart by object() identity.
enum SeqField : unsigned {
  kHasCache = 1u << 0,   // has_per_req_cache (truth value)
  kNumTokens = 1u << 1,  // num_tokens
  kStateSlot = 1u << 2,  // state_slot (element 0 of state_slots, or -1)
  kForkSrc = 1u << 3,    // state_fork_src
  kGroup = 1u << 4,      // per_req_cache_group
  kPending = 1u << 5,    // pending_checkpoint
  kAnchors = 1u << 6,    // midstep_anchor_pos, checkpoint_end_pos (0 when absent)
};
// `f` where `on`, else no field: a read the reference makes only in one case.
constexpr unsigned read_if(bool on, SeqField f) { return on ? unsigned{f} : 0u; }
// `reads` may also name fields read only if present (the fields a call
// writes but the reference never reads: their value is what a failed
// write-back restores; an absent one is deleted again).
inline constexpr unsigned kOptionalShift = 8;
inline constexpr unsigned if_present(unsigned fields) { return fields << kOptionalShift; }

class SeqArg {
 public:
  // `hashes`: the form of the cache's hashes, which pending_checkpoint (a
  // hash) is read and written in; nullptr where it is never touched.
  SeqArg(PyObject* obj, const char* name, unsigned reads, HashForm* hashes = nullptr)
      : SeqArg(obj, name, -1, reads, hashes) {}
  // Entry `index` of a batch argument `name` (errors say "name[index]").
  SeqArg(PyObject* obj, const char* name, Py_ssize_t index, unsigned reads, HashForm* hashes = nullptr)
      : obj_(obj), name_(name), index_(index), hashes_(hashes) {
    native_ = native_of(obj, name, index);
    if (native_) return;
    if (obj == Py_None || PyLong_Check(obj) || PyUnicode_Check(obj))
      raise_type(label().c_str(), "a statecache.Sequence or an object with its attributes", obj);
    generic_.emplace();
    read(reads);
  }

  // Reads (generic path) the fields in `fields` not read yet, in a fixed
  // order; a call reads each field only once it knows the reference would
  // read it (an engine's object need not carry the rest). No-op on the fast
  // path.
  void read(unsigned fields) {
    if (native_) return;
    const unsigned optional = (fields >> kOptionalShift) & ~have_;
    fields &= ((1u << kOptionalShift) - 1) & ~have_;
    Sequence& snap = generic_->snap;
    if (fields & kHasCache) {
      const int t = PyObject_IsTrue(attr(aHasCache).ptr());
      if (t < 0) throw py::error_already_set();
      snap.has_per_req_cache = t != 0;
    }
    if (fields & kNumTokens) snap.num_tokens = int_attr(aNumTokens);
    if (fields & kStateSlot) snap.state_slots = {int_attr(aStateSlot)};
    if (fields & kForkSrc) snap.state_fork_src = int_attr(aForkSrc);
    if (fields & kGroup) snap.per_req_cache_group = int_attr(aGroup);
    if (fields & kPending) snap.pending_checkpoint = hash_attr(aPending);
    if (fields & kAnchors) {
      snap.midstep_anchor_pos = int_attr(aAnchor, /*optional=*/true);
      snap.checkpoint_end_pos = int_attr(aEndPos, /*optional=*/true);
    }
    for (SeqField f : {kStateSlot, kForkSrc, kGroup, kPending}) {
      if (!(optional & f) || (fields & f)) continue;
      py::object got = attr_if_present(attr_of(f));
      if (!got) {
        absent_ |= f;
      } else if (f == kPending) {
        snap.pending_checkpoint = hash_value(got, aPending);
      } else {
        const int64_t v = int_value(got, attr_of(f));
        if (f == kStateSlot) snap.state_slots = {v};
        if (f == kForkSrc) snap.state_fork_src = v;
        if (f == kGroup) snap.per_req_cache_group = v;
      }
      fields |= f;
    }
    have_ |= fields;
    generic_->read = {snap.state_slot(), snap.state_fork_src, snap.per_req_cache_group, snap.pending_checkpoint};
  }

  // The C++ object when `obj` is a statecache.Sequence (or a subclass that
  // keeps its fields), else nullptr; TypeError for one whose __init__ did
  // not run. A subclass that redefines a field (a property, say) is read and
  // written through its attributes, as any engine object is, so per-sequence
  // and batched calls both honour the override.
  static Sequence* native_of(PyObject* obj, const char* name, Py_ssize_t index = -1) {
    static PyTypeObject* const type = reinterpret_cast<PyTypeObject*>(py::type::of<Sequence>().ptr());
    PyTypeObject* t = Py_TYPE(obj);
    if (t != type && (!PyType_IsSubtype(t, type) || overrides_fields(t, type))) return nullptr;
    Sequence* p = instance_ptr<Sequence>(obj);
    if (!p) throw py::type_error(label_of(name, index) + " is a Sequence whose __init__ did not run");
    return p;
  }

  // Whether subclass `t` of Sequence `base` redefines one of the fields the
  // pools read or write. Cached per (type, version tag): a type changed since
  // gets a new tag, and tags are never reused.
  static bool overrides_fields(PyTypeObject* t, PyTypeObject* base) {
    struct Known {
      PyTypeObject* type;
      unsigned int tag;
      bool overrides;
    };
    static std::vector<Known> known;
    if (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)
      for (const Known& k : known)
        if (k.type == t && k.tag == t->tp_version_tag) return k.overrides;
    static constexpr const char* kFields[] = {
        "has_per_req_cache",   "num_tokens",         "state_slot",         "state_slots",        "state_fork_src",
        "per_req_cache_group", "pending_checkpoint", "midstep_anchor_pos", "checkpoint_end_pos", "block_hashes"};
    bool overrides = false;
    for (const char* f : kFields) {
      PyObject* name = PyUnicode_InternFromString(f);
      if (!name) throw py::error_already_set();
      PyObject* mine = _PyType_Lookup(t, name);  // borrowed; runs no Python code
      PyObject* ours = _PyType_Lookup(base, name);
      Py_DECREF(name);
      if (mine != ours) overrides = true;
    }
    if (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) {
      if (known.size() >= 64) known.erase(known.begin());
      known.push_back({t, t->tp_version_tag, overrides});
    }
    return overrides;
  }

  bool native() const { return native_ != nullptr; }
  Sequence& get() { return native_ ? *native_ : generic_->snap; }
  PyObject* object() const { return obj_; }
  py::object ref() const { return py::reinterpret_borrow<py::object>(obj_); }

  // Generic path: sets each (field, value) on the object, in the order
  // given (state_slot, state_fork_src, per_req_cache_group or
  // pending_checkpoint). If one raises, the fields already written get the
  // values read at construction back (best effort) and the error propagates.
  // No-op on the fast path (the core writes the C++ object itself).
  void write_back(std::span<const std::pair<SeqField, int64_t>> values) {
    if (native_) return;
    size_t done = 0;
    try {
      for (const auto& [f, v] : values) {
        set(f, v);
        ++done;
      }
    } catch (...) {
      // The error is held by the exception in flight (pybind11 fetched it).
      restore(values.first(done));
      throw;
    }
  }
  void write_back(std::initializer_list<std::pair<SeqField, int64_t>> values) {
    write_back(std::span<const std::pair<SeqField, int64_t>>(values.begin(), values.size()));
  }
  // write_back, then the plan decided again (docs/contract.md, "Batched
  // calls"): when `still_holds()` no longer holds (or throws: a setter of
  // ours released what the call works on), the fields written get their
  // values as read back and the call raises, the pool untouched.
  template <class StillHolds>
  void write_back_checked(std::initializer_list<std::pair<SeqField, int64_t>> values, StillHolds&& still_holds) {
    write_back(values);
    if (native_) return;
    const std::span<const std::pair<SeqField, int64_t>> fields(values.begin(), values.size());
    bool holds = false;
    try {
      holds = still_holds();
    } catch (...) {
      restore(fields);
      throw;
    }
    if (holds) return;
    restore(fields);
    throw std::runtime_error("the pool changed while seq's fields were written back; nothing was filed");
  }
  // Gives the fields named in `values` their values as read back, deleting
  // those that were absent (best effort: a setter that raises now is
  // ignored; a field never read is left as written). Generic path only.
  void restore(std::span<const std::pair<SeqField, int64_t>> values) {
    if (native_) return;
    for (const auto& [f, v] : values) {
      if (!(have_ & f)) continue;
      try {
        if (absent_ & f) {
          if (PyObject_DelAttr(obj_, interned(attr_of(f))) != 0) throw py::error_already_set();
        } else {
          set(f, value(generic_->read, f));
        }
      } catch (...) {
        PyErr_Clear();
      }
    }
  }

 private:
  static std::string label_of(const char* name, Py_ssize_t index) {
    return index < 0 ? std::string(name) : std::string(name) + "[" + std::to_string(index) + "]";
  }
  std::string label() const { return label_of(name_, index_); }
  // The fields a write-back sets, as read (no copy of the whole Sequence: a
  // batch of engine objects makes one per entry).
  struct Read {
    int64_t state_slot = -1, state_fork_src = -1, per_req_cache_group = -1, pending_checkpoint = -1;
  };
  static int64_t value(const Read& s, SeqField f) {
    switch (f) {
      case kStateSlot:
        return s.state_slot;
      case kForkSrc:
        return s.state_fork_src;
      case kGroup:
        return s.per_req_cache_group;
      case kPending:
        return s.pending_checkpoint;
      default:
        return 0;
    }
  }
  // The attributes read and written, and their names as interned strs made
  // once (*AttrString would build a new str on every access).
  enum Attr : uint8_t { aHasCache, aNumTokens, aStateSlot, aForkSrc, aGroup, aPending, aAnchor, aEndPos, kAttrs };
  static const char* text(Attr a) {
    static constexpr const char* kNames[kAttrs] = {"has_per_req_cache",  "num_tokens",          "state_slot",
                                                   "state_fork_src",     "per_req_cache_group", "pending_checkpoint",
                                                   "midstep_anchor_pos", "checkpoint_end_pos"};
    return kNames[a];
  }
  static PyObject* interned(Attr a) {
    static PyObject* objs[kAttrs] = {};
    if (!objs[a]) objs[a] = PyUnicode_InternFromString(text(a));  // lives as long as the process
    if (!objs[a]) throw py::error_already_set();
    return objs[a];
  }
  static Attr attr_of(SeqField f) {
    switch (f) {
      case kStateSlot:
        return aStateSlot;
      case kForkSrc:
        return aForkSrc;
      case kGroup:
        return aGroup;
      default:
        return aPending;
    }
  }
  void set(SeqField f, int64_t v) {
    py::object x =
        py::reinterpret_steal<py::object>(f == kPending && hashes_ ? hash_to_py(v, *hashes_) : PyLong_FromLongLong(v));
    if (!x || PyObject_SetAttr(obj_, interned(attr_of(f)), x.ptr()) != 0) throw py::error_already_set();
  }
  // The attribute, or a null object when it is absent.
  py::object attr_if_present(Attr field) {
    PyObject* v = PyObject_GetAttr(obj_, interned(field));
    if (v) return py::reinterpret_steal<py::object>(v);
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw py::error_already_set();
    PyErr_Clear();
    return py::object();
  }
  py::object attr(Attr field, bool optional = false) {
    PyObject* v = PyObject_GetAttr(obj_, interned(field));
    if (v) return py::reinterpret_steal<py::object>(v);
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) throw py::error_already_set();
    PyErr_Clear();
    if (optional) return py::int_(0);
    throw py::type_error(label() + " must be a statecache.Sequence or have the sequence attributes; " +
                         Py_TYPE(obj_)->tp_name + " has no attribute '" + text(field) + "'");
  }
  int64_t hash_attr(Attr field) { return hash_value(attr(field), field); }
  int64_t hash_value(const py::object& v, Attr field) {
    const std::string where = label() + "." + text(field);
    if (hashes_ == nullptr) return as_int(v, where.c_str());
    return as_hash(v, where.c_str(), *hashes_);
  }
  int64_t int_attr(Attr field, bool optional = false) { return int_value(attr(field, optional), field); }
  int64_t int_value(const py::object& v, Attr field) {
    int64_t out = 0;
    if (PyLong_CheckExact(v.ptr()) && exact_int_value(v.ptr(), out)) return out;
    const std::string where = label() + "." + text(field);  // only off the common path
    return as_int(v, where.c_str());
  }

  PyObject* obj_;  // borrowed: the caller's argument, alive for the call
  const char* name_;
  Py_ssize_t index_;
  HashForm* hashes_;
  Sequence* native_ = nullptr;
  unsigned have_ = 0;    // fields read (or found absent)
  unsigned absent_ = 0;  // optional fields the object did not have
  struct Generic {
    Sequence snap;  // what the call works on
    Read read;      // the written fields as read, for restoring a failed write-back
  };
  std::optional<Generic> generic_;  // engaged on the generic path only
};

inline PyObject* to_py(bool v) { return Py_NewRef(v ? Py_True : Py_False); }
inline PyObject* to_py(int64_t v) { return PyLong_FromLongLong(v); }
inline PyObject* to_py(double v) { return PyFloat_FromDouble(v); }
inline PyObject* none() { return Py_NewRef(Py_None); }

template <auto Fn>
inline Params def_params;  // a def function's parameters (fast::def)

// Fills `p` from the parameter list and installs method `name` on `cls`
// calling `meth`, its text signature built from the same list.
using FastMethod = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);

inline void install(py::handle cls, const char* name, FastMethod meth, Params& p, std::initializer_list<Arg> args,
                    bool strict) {
  if (!p.func.empty()) throw std::logic_error(std::string("fast method bound twice: ") + name);
  p.func = name;
  std::string sig = std::string(name) + "($self";
  int i = 0;
  for (const Arg& a : args) {
    std::string n(a.text);
    if (n == "*") {
      p.positional = i;
      sig += ", *";
      continue;
    }
    if (i >= kMaxParams) throw std::logic_error(std::string("too many parameters for fast method ") + name);
    sig += ", " + n;
    const size_t eq = n.find('=');
    p.names.push_back(n.substr(0, eq));
    p.kind[static_cast<size_t>(i)] = a.kind;
    if (eq == std::string::npos) {
      p.required = i + 1;
    } else {
      // Only table methods read it (def's functions apply their own).
      const std::string d = n.substr(eq + 1);
      char* end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      p.defaults[static_cast<size_t>(i)] = d == "True" ? 1 : (d == "False" || d == "None") ? 0 : v;
      if (strict && d != "True" && d != "False" && d != "None" && (end == d.c_str() || *end != '\0'))
        throw std::logic_error(std::string("fast method ") + name + ": a default it cannot read: " + d);
    }
    ++i;
  }
  if (p.positional == 0 && sig.find(", *") == std::string::npos) p.positional = i;
  for (const std::string& n : p.names) p.cnames.push_back(n.c_str());
  sig += ")\n--\n\n";
  // Method definitions and their docs live as long as the type: never freed.
  const char* d = doc(cls, name);
  auto* text = new std::string(sig + (d ? d : ""));
  auto* md = new PyMethodDef{name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(meth)),
                             METH_FASTCALL | METH_KEYWORDS, text->c_str()};
  py::object descr =
      py::reinterpret_steal<py::object>(PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), md));
  if (!descr) throw py::error_already_set();
  py::setattr(cls, name, descr);
}

// The instance type a def function takes first.
template <class R, class T, class... A>
T instance_of(R (*)(T&, A...));

template <auto Fn>
PyObject* trampoline(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  using T = decltype(instance_of(Fn));
  PyObject* a[kMaxParams] = {};
  if (!parse(def_params<Fn>, args, nargs, kwnames, a)) return nullptr;
  try {
    enter<T>(self);
    decltype(auto) r = [&]() -> decltype(auto) {
      if constexpr (std::is_invocable_v<decltype(Fn), T&, PyObject**, PyObject*>)  // wants the Python object too
        return Fn(self_of<T>(self), a, self);
      else
        return Fn(self_of<T>(self), a);
    }();
    if constexpr (std::is_same_v<std::decay_t<decltype(r)>, py::object>)
      return r.release().ptr();
    else
      return r;
  } catch (...) {
    set_error_from_current();
    return nullptr;
  }
}

// Registers `Fn` (a function PyObject*(T&, PyObject** args) giving a new
// reference, or py::object(T&, PyObject** args); either may take the Python
// `self` as a third parameter) as method `name` of class `cls`: for a method
// whose work is more than converting its arguments (fast::method is for those
// that only convert). `args` as for fast::method; `Fn` converts them itself
// (a[i] is nullptr for an optional one not given).
template <auto Fn>
void def(py::handle cls, const char* name, std::initializer_list<Arg> args) {
  install(cls, name, &trampoline<Fn>, def_params<Fn>, args, /*strict=*/false);
}

// ---- table methods: the conversions deduced from the C++ signature ----------
//
// fast::method<&Core::member>(cls, "name", {"a", "b=0"}) binds a member
// (or a plain function taking the instance first) whose parameters and
// result convert by their C++ types: each argument as its parameter type
// (Conv below, errors naming the parameter), the result as to_result does.

template <class A>
struct Conv;  // by the C++ parameter type (decayed)

// The form a hash_arg is read in: the called object's.
template <class T>
HashForm& form_of(T& self) {
  if constexpr (requires { self.hash_form(); })
    return self.hash_form();
  else
    throw std::logic_error("a hash parameter on a class without a hash form");
}

template <>
struct Conv<int64_t> {
  template <class T>
  static int64_t get(PyObject* o, const Params& p, size_t i, T& self) {
    if (!o) return p.defaults[i];
    if (p.kind[i] == Arg::kHash) return as_hash(py::handle(o), p.cnames[i], form_of(self));
    if (p.kind[i] == Arg::kNonNeg) return as_nonneg_int(py::handle(o), p.cnames[i]);
    return as_int(py::handle(o), p.cnames[i]);
  }
};

// A list, tuple or other iterable of ints (as_int_list; of hashes for a hash_arg).
template <>
struct Conv<std::vector<int64_t>> {
  template <class T>
  static std::vector<int64_t> get(PyObject* o, const Params& p, size_t i, T& self) {
    if (p.kind[i] == Arg::kHash) return as_hash_list(py::handle(o), p.cnames[i], form_of(self));
    return as_int_list(py::handle(o), p.cnames[i]);
  }
};

template <>
struct Conv<bool> {
  template <class T>
  static bool get(PyObject* o, const Params& p, size_t i, T&) {
    return o ? as_bool(py::handle(o), p.cnames[i]) : p.defaults[i] != 0;
  }
};

// None (or not given, its default being None) is nullopt.
template <>
struct Conv<std::optional<int64_t>> {
  template <class T>
  static std::optional<int64_t> get(PyObject* o, const Params& p, size_t i, T& self) {
    if (!o || o == Py_None) return std::nullopt;
    return Conv<int64_t>::get(o, p, i, self);
  }
};

// The object as given (None when an optional one is not).
template <>
struct Conv<py::handle> {
  template <class T>
  static py::handle get(PyObject* o, const Params&, size_t, T&) {
    return py::handle(o ? o : Py_None);
  }
};

template <>
struct Conv<py::object> {
  template <class T>
  static py::object get(PyObject* o, const Params&, size_t, T&) {
    return py::reinterpret_borrow<py::object>(o ? o : Py_None);
  }
};

template <class R>
inline constexpr bool is_optional = false;
template <class R>
inline constexpr bool is_optional<std::optional<R>> = true;

template <class R>
PyObject* to_result(R&& r) {
  using D = std::decay_t<R>;
  if constexpr (std::is_same_v<D, bool>)
    return to_py(static_cast<bool>(r));
  else if constexpr (std::is_integral_v<D>)
    return PyLong_FromLongLong(static_cast<long long>(r));
  else if constexpr (std::is_floating_point_v<D>)
    return PyFloat_FromDouble(static_cast<double>(r));
  else if constexpr (std::is_base_of_v<py::handle, D>)
    return py::object(std::forward<R>(r)).release().ptr();
  else if constexpr (std::is_same_v<D, std::vector<int64_t>>)
    return to_list(r).release().ptr();
  else if constexpr (is_optional<D>)
    return r ? to_result(std::move(*r)) : none();
  else
    return py::cast(std::forward<R>(r)).release().ptr();
}

// What a member or function pointer takes and gives.
template <class R, class... A>
struct Sig {
  using Result = R;
  using Args = std::tuple<std::decay_t<A>...>;
};
template <class R, class C, class... A>
Sig<R, A...> sig_of(R (C::*)(A...));
template <class R, class C, class... A>
Sig<R, A...> sig_of(R (C::*)(A...) const);
template <class R, class S, class... A>
Sig<R, A...> sig_of(R (*)(S&, A...));
template <auto F>
using Signature = decltype(sig_of(F));

template <class T, auto F>
inline Params method_params;

template <auto F, class T, class Tuple>
decltype(auto) invoke(T& self, Tuple& args) {
  // std::invoke, not (self.*F): a base class's member on the bound subclass
  // made GCC 12 warn (falsely) of type punning.
  return std::apply([&](auto&... x) -> decltype(auto) { return std::invoke(F, self, x...); }, args);
}

template <auto F, class T, size_t... I>
PyObject* call_method(T& self, PyObject** a, const Params& p, std::index_sequence<I...>) {
  using S = Signature<F>;
  // Braced: the arguments convert left to right, so the first bad one is named.
  typename S::Args args{Conv<std::tuple_element_t<I, typename S::Args>>::get(a[I], p, I, self)...};
  if constexpr (std::is_void_v<typename S::Result>) {
    invoke<F>(self, args);
    return none();
  } else {
    return to_result(invoke<F>(self, args));
  }
}

template <class T, auto F, class Of>
PyObject* method_trampoline(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* a[kMaxParams] = {};
  const Params& p = method_params<T, F>;
  if (!parse(p, args, nargs, kwnames, a)) return nullptr;
  try {
    enter<T>(self);
    constexpr size_t n = std::tuple_size_v<typename Signature<F>::Args>;
    return call_method<F>(Of{}(self_of<T>(self)), a, p, std::make_index_sequence<n>{});
  } catch (...) {
    set_error_from_current();
    return nullptr;
  }
}

// Binds `F` (a member function of T or of a base, or a plain function whose
// first parameter is the instance; of Of{}(instance) when `Of` is given) as
// method `name` of `cls`, the class of T.
// `Of`: a stateless function from the instance to the object called (a
// coordinator's store, say).
template <auto F, class Of = std::identity, class T, class... Options>
void method(py::class_<T, Options...>& cls, const char* name, std::initializer_list<Arg> args) {
  constexpr size_t n = std::tuple_size_v<typename Signature<F>::Args>;
  size_t named = 0;
  for (const Arg& a : args) named += std::string_view(a.text) != "*";
  if (named != n) throw std::logic_error(std::string("fast method ") + name + ": parameter names do not match");
  install(cls, name, &method_trampoline<T, F, Of>, method_params<T, F>, args, /*strict=*/true);
}

template <class T, class F>
PyObject* getter(PyObject* self, void*) {
  try {
    enter<T>(self);
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
    enter<T>(self);
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
void def_readonly(py::handle cls, const char* name, F) {
  add_getset(cls, new PyGetSetDef{name, &getter<T, F>, nullptr, doc(cls, name), nullptr});
}

// A read-only attribute that is a member (or a function of the instance)
// taking nothing, its result converted as a table method's is.
template <auto F, class T>
PyObject* member_getter(PyObject* self, void*) {
  try {
    enter<T>(self);
    std::tuple<> none;
    return to_result(invoke<F>(self_of<T>(self), none));
  } catch (...) {
    set_error_from_current();
    return nullptr;
  }
}
template <auto F, class T, class... Options>
void attr(py::class_<T, Options...>& cls, const char* name) {
  add_getset(cls, new PyGetSetDef{name, &member_getter<F, T>, nullptr, doc(cls, name), nullptr});
}

// A read-write attribute: `Get` as for def_readonly, `Set` captureless
// void(T&, PyObject* value, const char* name), raising before it changes anything.
template <class T, class Get, class Set>
void def_property(py::handle cls, const char* name, Get, Set) {
  add_getset(cls, new PyGetSetDef{name, &getter<T, Get>, &setter<T, Set>, doc(cls, name), const_cast<char*>(name)});
}

}  // namespace statecache::bindings::fast
