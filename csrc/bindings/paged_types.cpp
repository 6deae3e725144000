// PAGE value types: PagedStateCheckpointSpec, the store / restore ops,
// CheckpointRecord, SuspendedCheckpointRestore, the state constants.
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/docs.h"
#include "bindings/paged_values.h"
#include "bindings/value_type.h"

namespace statecache::bindings {

namespace {

// A spec size: a Python int (not bool) and positive, checked in field order.
int64_t spec_size(py::handle obj, const char* name) {
  const bool is_int = PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr());
  int overflow = 0;
  const long long v = is_int ? PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow) : 0;
  if (!is_int || overflow != 0 || v <= 0)
    throw py::value_error(std::string(name) + " must be a positive integer, got " + py_repr(obj));
  return v;
}

PagedStateCheckpointSpec make_spec(py::handle page_unit_bytes, py::handle slot_bytes, py::handle layout_id,
                                   py::handle image_bytes) {
  const int64_t unit = spec_size(page_unit_bytes, "page_unit_bytes");
  const int64_t slot = spec_size(slot_bytes, "slot_bytes");
  const int64_t image = spec_size(image_bytes, "image_bytes");
  const bool named = PyUnicode_Check(layout_id.ptr()) && PyUnicode_GET_LENGTH(layout_id.ptr()) > 0;
  if (!named && image <= slot) throw py::value_error("layout_id must be a non-empty str, got " + py_repr(layout_id));
  return PagedStateCheckpointSpec(unit, slot, named ? as_text(layout_id, "layout_id") : "-", image);
}

std::string as_layout(py::handle obj) { return as_text(obj, "layout_id"); }

py::object spec_from_wire(py::handle wire) {
  static py::handle mapping =
      py::object(py::module_::import("collections.abc").attr("Mapping")).release();  // lives as long as the module
  if (!py::isinstance(wire, mapping))
    throw py::type_error("a PagedStateCheckpointSpec wire form must be a mapping, got " +
                         std::string(Py_TYPE(wire.ptr())->tp_name));
  static const char* const kFields[] = {"image_bytes", "layout_id", "page_unit_bytes", "slot_bytes"};
  py::set expected;
  for (const char* f : kFields) expected.add(py::str(f));
  py::set got(py::iter(wire));
  if (!got.equal(expected)) {
    py::object sorted = py::module_::import("builtins").attr("sorted");
    throw py::value_error("PagedStateCheckpointSpec wire fields: expected " + py_repr(sorted(expected)) + ", got " +
                          py_repr(sorted(wire)));
  }
  return py::cast(make_spec(wire[py::str("page_unit_bytes")], wire[py::str("slot_bytes")], wire[py::str("layout_id")],
                            wire[py::str("image_bytes")]));
}

py::tuple spec_fields(const PagedStateCheckpointSpec& s) {
  return py::make_tuple(s.page_unit_bytes, s.slot_bytes, s.layout_id, s.image_bytes);
}
py::tuple store_fields(const CheckpointStoreOp& o) {
  return py::make_tuple(o.src_slot, to_tuple(o.unit_ids), o.total_bytes, o.layout_id);
}
py::tuple restore_fields(const CheckpointRestoreOp& o) {
  return py::make_tuple(o.dst_slot, to_tuple(o.unit_ids), o.total_bytes, o.layout_id);
}
py::tuple record_fields(const RecordHandle& h) {
  const CheckpointRecord& r = h.get();
  return py::make_tuple(hash_object(r.prefix_hash, h.form()), to_tuple(r.unit_ids), checkpoint_state_name(r.state),
                        r.pin_count);
}
py::tuple suspended_fields(const SuspendedCheckpointRestore& s) {
  return py::make_tuple(s.checkpoint_id, py::cast(s.operation));
}

// ---- CheckpointStoreOp / CheckpointRestoreOp (bindings/paged_ops.h) ----

template <class Op>
struct OpText;
template <>
struct OpText<CheckpointStoreOp> {
  static constexpr const char* name = "CheckpointStoreOp";
  static constexpr const char* slot = "src_slot";
  static constexpr const char* params = "src_slot, unit_ids, total_bytes, layout_id";
  static py::tuple fields(const CheckpointStoreOp& o) { return store_fields(o); }
  static int64_t slot_of(const CheckpointStoreOp& o) { return o.src_slot; }
};
template <>
struct OpText<CheckpointRestoreOp> {
  static constexpr const char* name = "CheckpointRestoreOp";
  static constexpr const char* slot = "dst_slot";
  static constexpr const char* params = "dst_slot, unit_ids, total_bytes, layout_id";
  static py::tuple fields(const CheckpointRestoreOp& o) { return restore_fields(o); }
  static int64_t slot_of(const CheckpointRestoreOp& o) { return o.dst_slot; }
};

// The value an op's constructor arguments describe; throws for bad ones.
template <class Op>
Op op_from_args(PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {OpText<Op>::slot, "unit_ids", "total_bytes", "layout_id", nullptr};
  static const std::string format = std::string("OOOO:") + OpText<Op>::name;
  PyObject *slot, *units, *total, *layout;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, format.c_str(), const_cast<char**>(kw), &slot, &units, &total,
                                   &layout))
    throw py::error_already_set();
  return Op{as_int(slot, OpText<Op>::slot), as_int_list(units, "unit_ids"), as_int(total, "total_bytes"),
            as_layout(layout)};
}

template <class Op>
PyObject* op_new(PyTypeObject* cls, PyObject* args, PyObject* kwargs) {
  try {
    return ops::make<Op>(cls, op_from_args<Op>(args, kwargs));
  } catch (...) {
    fast::set_error_from_current();
    return nullptr;
  }
}

template <class Op>
PyObject* op_init(PyObject*, PyObject* args, PyObject* kwargs) {
  try {
    op_from_args<Op>(args, kwargs);
    Py_RETURN_NONE;
  } catch (...) {
    fast::set_error_from_current();
    return nullptr;
  }
}

template <class Op>
void op_dealloc(PyObject* self) {
  PyTypeObject* cls = Py_TYPE(self);
  reinterpret_cast<ops::Object<Op>*>(self)->value.~Op();
  cls->tp_free(self);
  Py_DECREF(cls);  // a heap type's instances own a reference to it
}

// Runs `body` (returning py::object) for a slot function: C++ exceptions become Python ones.
template <class Body>
PyObject* op_slot(Body&& body) {
  try {
    return body().release().ptr();
  } catch (...) {
    fast::set_error_from_current();
    return nullptr;
  }
}

// "sig\n--\n\n" + the docstring docs/api.md gives `qualname`: kept for the
// life of the type (CPython reads a method's doc from its definition).
const char* signed_doc(const std::string& sig, const std::string& qualname) {
  const char* d = doc(qualname);
  return (new std::string(sig + "\n--\n\n" + (d ? d : "")))->c_str();
}

template <class Op>
void bind_op(py::module_& m) {
  using Text = OpText<Op>;
  const std::string name = Text::name;
  static PyGetSetDef getset[] = {
      {Text::slot,
       [](PyObject* self, void*) -> PyObject* { return PyLong_FromLongLong(Text::slot_of(ops::value_of<Op>(self))); },
       nullptr, nullptr, nullptr},
      {"unit_ids",
       [](PyObject* self, void*) {
         return op_slot([&] { return py::object(to_tuple(ops::value_of<Op>(self).unit_ids)); });
       },
       nullptr, nullptr, nullptr},
      {"total_bytes",
       [](PyObject* self, void*) -> PyObject* { return PyLong_FromLongLong(ops::value_of<Op>(self).total_bytes); },
       nullptr, nullptr, nullptr},
      {"layout_id",
       [](PyObject* self, void*) -> PyObject* {
         const std::string& s = ops::value_of<Op>(self).layout_id;
         return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
       },
       nullptr, nullptr, nullptr},
      {nullptr, nullptr, nullptr, nullptr, nullptr},
  };
  static PyMethodDef methods[] = {
      {"__init__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&op_init<Op>)),
       METH_VARARGS | METH_KEYWORDS,
       signed_doc(std::string("__init__($self, ") + Text::params + ")", name + ".__init__")},
      {"__reduce__",
       [](PyObject* self, PyObject*) {
         return op_slot([&] {
           return py::object(py::make_tuple(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(self))),
                                            Text::fields(ops::value_of<Op>(self))));
         });
       },
       METH_NOARGS, signed_doc("__reduce__($self)", name + ".__reduce__")},
      {nullptr, nullptr, 0, nullptr},
  };
  static PyType_Slot slots[] = {
      {Py_tp_new, reinterpret_cast<void*>(&op_new<Op>)},
      {Py_tp_dealloc, reinterpret_cast<void*>(&op_dealloc<Op>)},
      {Py_tp_doc, const_cast<char*>(signed_doc(name + "(" + Text::params + ")", name))},
      {Py_tp_getset, getset},
      {Py_tp_methods, methods},
      {Py_tp_richcompare, reinterpret_cast<void*>(+[](PyObject* a, PyObject* b, int op) -> PyObject* {
         if ((op != Py_EQ && op != Py_NE) || !ops::is_op<Op>(b)) Py_RETURN_NOTIMPLEMENTED;
         const bool eq = ops::value_of<Op>(a) == ops::value_of<Op>(b);
         return Py_NewRef(eq == (op == Py_EQ) ? Py_True : Py_False);
       })},
      {Py_tp_hash, reinterpret_cast<void*>(+[](PyObject* self) -> Py_hash_t {
         PyObject* fields = op_slot([&] { return py::object(Text::fields(ops::value_of<Op>(self))); });
         if (!fields) return -1;
         const Py_hash_t h = PyObject_Hash(fields);
         Py_DECREF(fields);
         return h;
       })},
      {Py_tp_repr, reinterpret_cast<void*>(+[](PyObject* self) {
         return op_slot([&] {
           static const char* const keys[] = {Text::slot, "unit_ids", "total_bytes", "layout_id"};
           py::tuple vals = Text::fields(ops::value_of<Op>(self));
           std::string out = py::type::of(self).attr("__name__").template cast<std::string>() + "(";
           for (size_t i = 0; i < 4; ++i) out += (i ? ", " : "") + std::string(keys[i]) + "=" + py_repr(vals[i]);
           return py::object(py::str(out + ")"));
         });
       })},
      {0, nullptr},
  };
  static const std::string qualified = std::string("statecache._C.") + Text::name;
  static PyType_Spec spec = {qualified.c_str(), static_cast<int>(sizeof(ops::Object<Op>)), 0,
                             Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, slots};
  PyObject* cls = PyType_FromSpec(&spec);
  if (!cls) throw py::error_already_set();
  ops::type<Op> = reinterpret_cast<PyTypeObject*>(cls);  // the module keeps it alive
  m.add_object(Text::name, py::reinterpret_steal<py::object>(cls));
}

CheckpointState as_state(py::handle obj) {
  if (!PyUnicode_Check(obj.ptr())) raise_type("state", "a str", obj);
  return parse_checkpoint_state(as_text(obj, "state"));
}

}  // namespace

py::object to_py(const StateStoreOperationId& op, const HashForm& form) {
  static py::handle type =
      py::object(py::module_::import("statecache._operation_id").attr("StateStoreOperationId")).release();
  return type(hash_object(op.prefix_hash, form), op.generation);
}

std::optional<StateStoreOperationId> as_operation_id(py::handle obj, const HashForm& form) {
  PyObject* p = obj.ptr();
  if (PyTuple_Check(p) && PyTuple_GET_SIZE(p) == 2) {
    PyObject* h = PyTuple_GET_ITEM(p, 0);
    PyObject* g = PyTuple_GET_ITEM(p, 1);
    int64_t hv = 0;
    if (hash_key(h, form, hv) && PyLong_Check(h) && PyLong_Check(g)) {
      int overflow = 0;
      const long long gv = PyLong_AsLongLongAndOverflow(g, &overflow);
      if (overflow == 0) return StateStoreOperationId{hv, gv};
    }
  }
  (void)py::hash(obj);  // an unhashable key is a TypeError, as in a dict
  return std::nullopt;
}

py::tuple to_py_source(const StateStoreOperationId& op, const UnitIds& units, const HashForm& form) {
  return py::make_tuple(to_py(op, form), to_tuple(units));
}

CheckpointRecord& RecordHandle::mutable_value() {
  if (store_) throw py::attribute_error("a store's CheckpointRecord is read-only");
  return value_;
}

PagedStateCheckpointSpec as_spec(py::handle obj, const char* name) {
  if (py::isinstance<PagedStateCheckpointSpec>(obj)) return obj.cast<PagedStateCheckpointSpec>();
  // Any object with the four fields (the reference's dataclass, say), validated the same way.
  for (const char* field : {"page_unit_bytes", "slot_bytes", "layout_id", "image_bytes"})
    if (!py::hasattr(obj, field)) raise_type(name, "a PagedStateCheckpointSpec", obj);
  return make_spec(obj.attr("page_unit_bytes"), obj.attr("slot_bytes"), obj.attr("layout_id"), obj.attr("image_bytes"));
}

void bind_paged_types(py::module_& m) {
  m.attr("COPYING") = "COPYING";
  m.attr("READY") = "READY";
  m.attr("EVICTING") = "EVICTING";

  m.def(
      "checkpoint_copy_ops_per_batch",
      [](py::handle max_num_seqs) -> int64_t {
        if (max_num_seqs.is_none()) return 0;
        const int64_t n = as_int(max_num_seqs, "max_num_seqs");  // an int, not int()'s "12" or 3.7
        try {
          return checkpoint_copy_ops_per_batch(n);
        } catch (const std::overflow_error& e) {
          PyErr_SetString(int_range_error, e.what());
          throw py::error_already_set();
        }
      },
      py::arg("max_num_seqs"), doc("checkpoint_copy_ops_per_batch"));

  py::class_<PagedStateCheckpointSpec> spec(m, "PagedStateCheckpointSpec", STATECACHE_GUARDED(PagedStateCheckpointSpec),
                                            doc("PagedStateCheckpointSpec"));
  spec.def(py::init(&make_spec), py::arg("page_unit_bytes"), py::arg("slot_bytes"), py::arg("layout_id"),
           py::arg("image_bytes"), doc(spec, "__init__"))
      .def_property_readonly("page_unit_bytes", [](const PagedStateCheckpointSpec& s) { return s.page_unit_bytes; })
      .def_property_readonly("slot_bytes", [](const PagedStateCheckpointSpec& s) { return s.slot_bytes; })
      .def_property_readonly("layout_id", [](const PagedStateCheckpointSpec& s) { return s.layout_id; })
      .def_property_readonly("image_bytes", [](const PagedStateCheckpointSpec& s) { return s.image_bytes; })
      .def_property_readonly("units_per_checkpoint", &PagedStateCheckpointSpec::units_per_checkpoint)
      .def(
          "to_wire",
          [](const PagedStateCheckpointSpec& s) {
            py::dict d;
            d["page_unit_bytes"] = s.page_unit_bytes;
            d["slot_bytes"] = s.slot_bytes;
            d["image_bytes"] = s.image_bytes;
            d["layout_id"] = s.layout_id;
            return d;
          },
          doc(spec, "to_wire"))
      .def_static("from_wire", &spec_from_wire, py::arg("wire"), doc(spec, "from_wire"));
  def_value(spec, &spec_fields, {"page_unit_bytes", "slot_bytes", "layout_id", "image_bytes"}, true);

  bind_op<CheckpointStoreOp>(m);
  bind_op<CheckpointRestoreOp>(m);

  py::class_<RecordHandle> record(m, "CheckpointRecord", STATECACHE_GUARDED(RecordHandle), doc("CheckpointRecord"));
  record
      .def(py::init([](py::handle h, py::handle units, py::handle state, py::handle pins) {
             HashForm form;
             const int64_t prefix_hash = as_hash(h, "prefix_hash", form);
             return RecordHandle(CheckpointRecord{prefix_hash, as_int_list(units, "unit_ids"), as_state(state),
                                                  as_int(pins, "pin_count")},
                                 form);
           }),
           py::arg("prefix_hash"), py::arg("unit_ids"), py::arg("state") = "COPYING", py::arg("pin_count") = 0)
      .def_property(
          "prefix_hash", [](const RecordHandle& r) { return hash_object(r.get().prefix_hash, r.form()); },
          [](RecordHandle& r, py::handle v) {
            CheckpointRecord& value = r.mutable_value();
            HashForm form;  // a value's form is that of its current hash
            value.prefix_hash = as_hash(v, "prefix_hash", form);
            r.form() = form;
          })
      .def_property(
          "unit_ids", [](const RecordHandle& r) { return to_tuple(r.get().unit_ids); },
          [](RecordHandle& r, py::handle v) { r.mutable_value().unit_ids = as_int_list(v, "unit_ids"); })
      .def_property(
          "state", [](const RecordHandle& r) { return checkpoint_state_name(r.get().state); },
          [](RecordHandle& r, py::handle v) { r.mutable_value().state = as_state(v); })
      .def_property(
          "pin_count", [](const RecordHandle& r) { return r.get().pin_count; },
          [](RecordHandle& r, py::handle v) { r.mutable_value().pin_count = as_int(v, "pin_count"); });
  def_value(record, &record_fields, {"prefix_hash", "unit_ids", "state", "pin_count"}, false);

  py::class_<SuspendedCheckpointRestore> suspended(m, "SuspendedCheckpointRestore",
                                                   STATECACHE_GUARDED(SuspendedCheckpointRestore),
                                                   doc("SuspendedCheckpointRestore"));
  suspended
      .def(py::init([](py::handle cid, const CheckpointRestoreOp& op) {
             return SuspendedCheckpointRestore{as_int(cid, "checkpoint_id"), op};
           }),
           py::arg("checkpoint_id"), py::arg("operation"))
      .def_property_readonly("checkpoint_id", [](const SuspendedCheckpointRestore& s) { return s.checkpoint_id; })
      .def_property_readonly("operation", [](const SuspendedCheckpointRestore& s) { return s.operation; });
  def_value(suspended, &suspended_fields, {"checkpoint_id", "operation"}, true);
}

}  // namespace statecache::bindings
