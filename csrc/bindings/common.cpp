// Errors, StateTransfer and Sequence: the types every other area uses.
#include <pybind11/stl.h>

#include <cmath>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "bindings/docs.h"
#include "bindings/fast_call.h"
#include "core/sequence.h"
#include "core/state_transfer.h"

namespace statecache::bindings {

namespace {

// A live list view over one of a Sequence's int vectors, so that engine code
// may `seq.block_hashes.append(h)` as it would on a plain attribute.
struct IntListView {
  std::shared_ptr<Sequence> owner;
  std::vector<int64_t> Sequence::*field;
  std::vector<int64_t>& v() const { return (*owner).*field; }
  // block_hashes holds hashes: read and written in the Sequence's form.
  bool hashes() const { return field == &Sequence::block_hashes; }
  int64_t value_of(py::handle x, const char* name) const {
    return hashes() ? as_hash(x, name, owner->hash_form) : as_int(x, name);
  }
  py::object item(int64_t x) const { return hashes() ? hash_object(x, owner->hash_form) : py::int_(x); }
  py::list list() const { return hashes() ? to_hash_list(v(), owner->hash_form) : to_list(v()); }
  std::vector<int64_t> values_of(py::handle xs, const char* name) const {
    return hashes() ? as_hash_list(xs, name, owner->hash_form) : as_int_list(xs, name);
  }
  size_t norm(int64_t i) const {
    const int64_t n = static_cast<int64_t>(v().size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) throw py::index_error("list index out of range");
    return static_cast<size_t>(i);
  }
};

std::optional<std::string> as_layout_id(py::handle obj) {
  if (obj.is_none()) return std::nullopt;
  if (!PyUnicode_Check(obj.ptr())) raise_type("paged_layout_id", "a str or None", obj);
  return as_text(obj, "paged_layout_id");
}

StateTransfer make_transfer(py::handle kind, py::handle fork_tokens, py::handle layout, py::handle readable) {
  if (!PyUnicode_Check(kind.ptr())) raise_type("kind", "a str", kind);
  return StateTransfer(parse_transfer_kind(as_text(kind, "kind")), as_int(fork_tokens, "fork_tokens"),
                       as_layout_id(layout), as_bool(readable, "readable_midstep"));
}

py::object layout_or_none(const StateTransfer& t) {
  if (!t.paged_layout_id) return py::none();
  return py::str(*t.paged_layout_id);
}

void bind_state_transfer(py::module_& m) {
  m.attr("NONE") = "none";
  m.attr("FORK") = "fork";
  m.attr("COPY") = "copy";
  m.attr("REPLAY") = "replay";

  py::classh<StateTransfer> cls(m, "StateTransfer", py::is_final(), STATECACHE_GUARDED(StateTransfer),
                                doc("StateTransfer"));
  cls.attr("NONE") = "none";
  cls.attr("FORK") = "fork";
  cls.attr("COPY") = "copy";
  cls.attr("REPLAY") = "replay";
  cls.def(py::init(&make_transfer), py::arg("kind"), py::arg("fork_tokens") = 0,
          py::arg("paged_layout_id") = py::none(), py::arg("readable_midstep") = false, doc(cls, "__init__"))
      .def_property_readonly("kind", [](const StateTransfer& t) { return transfer_kind_name(t.kind); })
      .def_property_readonly("fork_tokens", [](const StateTransfer& t) { return t.fork_tokens; })
      .def_property_readonly("paged_layout_id", &layout_or_none)
      .def_property_readonly("readable_midstep", [](const StateTransfer& t) { return t.readable_midstep; })
      .def_property_readonly("copies", &StateTransfer::copies)
      .def_property_readonly("forks", &StateTransfer::forks)
      .def_property_readonly("replays", &StateTransfer::replays)
      .def_property_readonly("successor_room", &StateTransfer::successor_room, doc(cls, "successor_room"))
      .def_static(
          "none", [] { return StateTransfer(TransferKind::kNone); }, doc(cls, "none"))
      .def_static(
          "replay", [] { return StateTransfer(TransferKind::kReplay); }, doc(cls, "replay"))
      .def_static(
          "fork",
          [](py::handle tokens, py::handle readable) {
            return StateTransfer(TransferKind::kFork, as_int(tokens, "tokens"), std::nullopt,
                                 as_bool(readable, "readable_midstep"));
          },
          py::arg("tokens"), py::arg("readable_midstep") = false, doc(cls, "fork"))
      .def_static(
          "copy",
          [](py::handle layout, py::handle readable) {
            return StateTransfer(TransferKind::kCopy, 0, as_layout_id(layout), as_bool(readable, "readable_midstep"));
          },
          py::arg("layout_id") = py::none(), py::arg("readable_midstep") = false, doc(cls, "copy"))
      .def_static(
          "from_config",
          [](py::handle kind, py::handle fork_tokens, py::handle layout, py::handle readable) {
            if (!PyUnicode_Check(kind.ptr())) raise_type("kind", "a str", kind);
            TransferKind k = parse_transfer_kind(as_text(kind, "kind"));
            // Only a fork carries its token count across the process boundary.
            int64_t tokens = k == TransferKind::kFork ? as_int(fork_tokens, "fork_tokens") : 0;
            return StateTransfer(k, tokens, as_layout_id(layout), as_bool(readable, "readable_midstep"));
          },
          py::arg("kind"), py::arg("fork_tokens") = 0, py::arg("paged_layout_id") = py::none(),
          py::arg("readable_midstep") = false, doc(cls, "from_config"))
      .def(
          "to_wire",
          [](const StateTransfer& t) {
            py::dict d;
            d["kind"] = transfer_kind_name(t.kind);
            d["fork_tokens"] = t.fork_tokens;
            d["paged_layout_id"] = layout_or_none(t);
            d["readable_midstep"] = py::bool_(t.readable_midstep);
            return d;
          },
          doc(cls, "to_wire"))
      .def_static(
          "from_wire",
          [](py::handle wire) {
            if (!PyMapping_Check(wire.ptr()) || PyUnicode_Check(wire.ptr()) || PySequence_Check(wire.ptr()))
              raise_type("wire", "a mapping", wire);
            py::object keys = py::module_::import("builtins").attr("set")(wire);
            py::object want =
                py::module_::import("builtins")
                    .attr("set")(py::make_tuple("kind", "fork_tokens", "paged_layout_id", "readable_midstep"));
            if (!keys.equal(want))
              throw py::value_error("StateTransfer wire fields: expected " +
                                    py_repr(py::module_::import("builtins").attr("sorted")(want)) + ", got " +
                                    py_repr(py::module_::import("builtins").attr("sorted")(keys)));
            py::object get = wire.attr("__getitem__");
            return make_transfer(get("kind"), get("fork_tokens"), get("paged_layout_id"), get("readable_midstep"));
          },
          py::arg("wire"), doc(cls, "from_wire"))
      .def("__eq__",
           [](const StateTransfer& a, py::handle b) -> py::object {
             if (!py::isinstance<StateTransfer>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::bool_(a == b.cast<const StateTransfer&>());
           })
      .def("__hash__",
           [](const StateTransfer& t) {
             return py::hash(
                 py::make_tuple(transfer_kind_name(t.kind), t.fork_tokens, layout_or_none(t), t.readable_midstep));
           })
      .def("__repr__",
           [](const StateTransfer& t) {
             return std::string("StateTransfer(kind='") + transfer_kind_name(t.kind) +
                    "', fork_tokens=" + std::to_string(t.fork_tokens) +
                    ", paged_layout_id=" + py_repr(layout_or_none(t)) +
                    ", readable_midstep=" + (t.readable_midstep ? "True" : "False") + ")";
           })
      .def("__reduce__", [](py::handle self) {
        const StateTransfer& t = fast::self_of<StateTransfer>(self.ptr());
        return py::make_tuple(py::type::of(self), py::make_tuple(transfer_kind_name(t.kind), t.fork_tokens,
                                                                 layout_or_none(t), t.readable_midstep));
      });
}

void bind_int_list(py::module_& m) {
  py::classh<IntListView> cls(m, "IntListView", py::is_final(), STATECACHE_GUARDED(IntListView), doc("IntListView"));
  fast::refuse_copy(cls);
  cls.def("__len__", [](const IntListView& s) { return s.v().size(); })
      .def("__getitem__",
           [](const IntListView& s, py::handle i) -> py::object {
             if (PySlice_Check(i.ptr())) {
               // Materialize before slicing: an accessor into a temporary list dangles.
               py::list all = s.list();
               return all[py::reinterpret_borrow<py::slice>(i)];
             }
             const int64_t k = as_int(i, "index");
             return s.item(s.v()[s.norm(k)]);
           })
      .def("__setitem__",
           [](IntListView& s, py::handle i, py::handle x) {
             const int64_t k = as_int(i, "index");
             const int64_t v = s.value_of(x, "value");  // may run __index__: index checked after
             s.v()[s.norm(k)] = v;
           })
      .def("__iter__", [](const IntListView& s) { return py::iter(s.list()); })
      .def("__contains__",
           [](const IntListView& s, py::handle x) {
             int64_t v = 0;
             if (!PyLong_Check(x.ptr()) || PyBool_Check(x.ptr())) return false;
             if (s.hashes() ? !hash_key(x, s.owner->hash_form, v) : !exact_int_value(x.ptr(), v)) return false;
             for (int64_t e : s.v())
               if (e == v) return true;
             return false;
           })
      .def(
          "append", [](IntListView& s, py::handle x) { s.v().push_back(s.value_of(x, "value")); }, doc(cls, "append"))
      .def(
          "extend",
          [](IntListView& s, py::handle xs) {
            const std::vector<int64_t> add = s.values_of(xs, "values");  // all or nothing
            s.v().insert(s.v().end(), add.begin(), add.end());
          },
          doc(cls, "extend"))
      .def(
          "clear", [](IntListView& s) { s.v().clear(); }, doc(cls, "clear"))
      .def(
          "pop",
          [](IntListView& s, py::handle i) {
            const size_t k = s.norm(as_int(i, "index"));
            const int64_t x = s.v()[k];
            s.v().erase(s.v().begin() + static_cast<ptrdiff_t>(k));
            return s.item(x);
          },
          py::arg("index") = -1, doc(cls, "pop"))
      .def(
          "copy", [](const IntListView& s) { return s.list(); }, doc(cls, "copy"))
      .def("__eq__",
           [](const IntListView& s, py::handle other) {
             if (py::isinstance<IntListView>(other)) return s.v() == other.cast<const IntListView&>().v();
             if (!PyList_Check(other.ptr()) && !PyTuple_Check(other.ptr())) return false;
             return s.list().equal(py::list(py::reinterpret_borrow<py::object>(other)));
           })
      .def("__repr__", [](const IntListView& s) { return py_repr(s.list()); });
}

// Sequence's attributes are read and written by the engine for every request
// every pass, so they are getset descriptors (fast_call.h) rather than
// pybind11 properties.
template <std::vector<int64_t> Sequence::*Field>
void def_int_list(py::handle cls, const char* name) {
  fast::def_property<Sequence>(
      cls, name,
      [](Sequence&, PyObject* self) {
        auto s = py::cast<std::shared_ptr<Sequence>>(py::handle(self));
        return py::cast(IntListView{std::move(s), Field}).release().ptr();
      },
      [](Sequence& s, PyObject* xs, const char* name) {
        // Another Sequence's live view (`b.block_hashes = a.block_hashes`):
        // copied as a vector, no Python iteration.
        static PyTypeObject* const view_type = reinterpret_cast<PyTypeObject*>(py::type::of<IntListView>().ptr());
        std::vector<int64_t> v;
        if (Py_TYPE(xs) == view_type) {
          const IntListView& other = fast::self_of<IntListView>(xs);
          v = other.v();
          if (other.hashes() && Field == &Sequence::block_hashes)  // the hashes come with their form
            for (int64_t h : v) s.hash_form.note(name, h, other.owner->hash_form.kind());
        } else if (Field == &Sequence::block_hashes) {
          v = as_hash_list(xs, name, s.hash_form);
        } else {
          v = as_int_list(xs, name);
        }
        (s.*Field).swap(v);
      });
}

template <int64_t Sequence::*Field>
void def_int(py::handle cls, const char* name) {
  fast::def_property<Sequence>(
      cls, name, [](const Sequence& s) { return fast::to_py(s.*Field); },
      [](Sequence& s, PyObject* x, const char* name) { s.*Field = as_int(x, name); });
}

traverseproc dict_traverse = nullptr;  // pybind11's, for the dynamic attributes
PyTypeObject* sequence_type = nullptr;

// A Python subclass's traverse (CPython's subtype_traverse) visits the
// instance dict itself only where the subclass moved the dict (its dictoffset
// differs from ours, as on 3.11); then visiting it again here would count it
// twice. Elsewhere (3.12) only this traverse reaches the dict.
int sequence_traverse(PyObject* self, visitproc visit, void* arg) {
  PyTypeObject* type = Py_TYPE(self);
  if (type == sequence_type || type->tp_dictoffset == sequence_type->tp_dictoffset)
    return dict_traverse(self, visit, arg);
  Py_VISIT(type);
  return 0;
}

void sequence_type_setup(PyHeapTypeObject* heap_type) {
  fast::instance_setup<Sequence>(heap_type);
  sequence_type = &heap_type->ht_type;
  dict_traverse = heap_type->ht_type.tp_traverse;
  heap_type->ht_type.tp_traverse = &sequence_traverse;
}

void bind_sequence(py::module_& m) {
  py::classh<Sequence> cls(m, "Sequence", py::dynamic_attr(), py::metaclass(fast::guarded_metaclass()),
                           py::custom_type_setup(&sequence_type_setup), doc("Sequence"));
  fast::refuse_copy(cls);
  cls.def(py::init([](py::handle seq_id, py::handle num_tokens, py::handle num_prompt_tokens, py::handle has_cache) {
            auto s = std::make_shared<Sequence>();
            if (!seq_id.is_none()) s->seq_id = as_int(seq_id, "seq_id");
            s->num_tokens = as_int(num_tokens, "num_tokens");
            s->num_prompt_tokens = as_int(num_prompt_tokens, "num_prompt_tokens");
            s->has_per_req_cache = as_bool(has_cache, "has_per_req_cache");
            return s;
          }),
          py::arg("seq_id") = py::none(), py::arg("num_tokens") = 0, py::arg("num_prompt_tokens") = 0,
          py::arg("has_per_req_cache") = true, doc(cls, "__init__"));
  fast::def_property<Sequence>(
      cls, "seq_id", [](const Sequence& s) { return s.seq_id ? fast::to_py(*s.seq_id) : fast::none(); },
      [](Sequence& s, PyObject* x, const char* name) {
        if (x == Py_None)
          s.seq_id.reset();
        else
          s.seq_id = as_int(x, name);
      });
  def_int<&Sequence::num_tokens>(cls, "num_tokens");
  def_int<&Sequence::num_prompt_tokens>(cls, "num_prompt_tokens");
  fast::def_property<Sequence>(
      cls, "has_per_req_cache", [](const Sequence& s) { return fast::to_py(s.has_per_req_cache); },
      [](Sequence& s, PyObject* x, const char* name) { s.has_per_req_cache = as_bool(x, name); });
  def_int_list<&Sequence::state_slots>(cls, "state_slots");
  def_int_list<&Sequence::block_hashes>(cls, "block_hashes");
  fast::def_property<Sequence>(
      cls, "state_slot", [](const Sequence& s) { return fast::to_py(s.state_slot()); },
      [](Sequence& s, PyObject* x, const char* name) { s.set_state_slot(as_int(x, name)); });
  def_int<&Sequence::state_fork_src>(cls, "state_fork_src");
  def_int<&Sequence::per_req_cache_group>(cls, "per_req_cache_group");
  fast::def_property<Sequence>(
      cls, "pending_checkpoint", [](const Sequence& s) { return hash_to_py(s.pending_checkpoint, s.hash_form); },
      [](Sequence& s, PyObject* x, const char* name) { s.pending_checkpoint = as_hash(x, name, s.hash_form); });
  def_int<&Sequence::checkpoint_end_pos>(cls, "checkpoint_end_pos");
  def_int<&Sequence::midstep_anchor_pos>(cls, "midstep_anchor_pos");
  cls.def("__repr__", [](py::handle self) {
    const Sequence& s = fast::self_of<Sequence>(self.ptr());
    std::string name = py::type::of(self).attr("__name__").cast<std::string>();
    return name + "(seq_id=" + (s.seq_id ? std::to_string(*s.seq_id) : "None") +
           ", num_tokens=" + std::to_string(s.num_tokens) +
           ", num_prompt_tokens=" + std::to_string(s.num_prompt_tokens) +
           ", state_slots=" + py_repr(to_list(s.state_slots)) + ")";
  });
}

}  // namespace

std::shared_ptr<Sequence> as_sequence(py::handle obj, const char* name) {
  if (!py::isinstance<Sequence>(obj)) raise_type(name, "a statecache.Sequence", obj);
  return obj.cast<std::shared_ptr<Sequence>>();
}

namespace {

struct MetaclassProbe {};

// Creates fast::guarded_meta: pybind11's default metaclass (read off a
// throwaway class) with guarded_meta_call as its call.
void init_guard(py::module_& m) {
  if (fast::guarded_meta) return;
  py::class_<MetaclassProbe> probe(m, "_MetaclassProbe");
  PyTypeObject* base = Py_TYPE(probe.ptr());
  py::delattr(m, "_MetaclassProbe");
  fast::base_meta_call = base->tp_call;
  static PyType_Slot slots[] = {{Py_tp_call, reinterpret_cast<void*>(&fast::guarded_meta_call)}, {0, nullptr}};
  static PyType_Spec spec = {"statecache._C.pybind11_guarded_type", 0, 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
                             slots};
  py::tuple bases = py::make_tuple(py::handle(reinterpret_cast<PyObject*>(base)));
  PyObject* meta = PyType_FromSpecWithBases(&spec, bases.ptr());
  if (!meta) throw py::error_already_set();
  fast::guarded_meta = meta;  // lives as long as the process
}

}  // namespace

void bind_common(py::module_& m) {
  init_guard(m);
  {
    py::object err = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
        "statecache._C.IntRangeError", doc("IntRangeError"),
        py::make_tuple(py::handle(PyExc_OverflowError), py::handle(PyExc_ValueError)).ptr(), nullptr));
    if (!err) throw py::error_already_set();
    m.attr("IntRangeError") = err;
    int_range_error = err.release().ptr();  // lives as long as the process
  }
  // pybind11's functions map C++ exceptions as the fast methods do: one map
  // (fast::set_error_from_current), which leaves pybind11's own nothing to do.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (...) {
      fast::set_error_from_current();
    }
  });
  bind_state_transfer(m);
  bind_int_list(m);
  bind_sequence(m);
}

}  // namespace statecache::bindings
