// Span planner, CPU runner and (when built) the GPU copy engine. Every class
// here takes raw addresses, so all are private (underscore names, not
// exported by statecache): statecache.executor reaches them only with
// addresses read off tensors it checks before each batch. The GIL is held
// throughout every call: the planner's scratch and the engine's staging are
// shared state.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <type_traits>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "bindings/docs.h"
#include "bindings/fast_call.h"
#include "bindings/paged_ops.h"
#include "core/paged_types.h"
#include "core/span_planner.h"
#ifdef STATECACHE_WITH_GPU
#include "kernels/copy_kernels.h"
#endif

namespace statecache::bindings {

namespace {

std::vector<Segment> as_segments(py::handle obj, const char* name) {
  std::vector<int64_t> flat = as_int_list(obj, name);
  if (flat.size() % 3 != 0)
    throw py::value_error(std::string(name) + " must hold (base, stride, bytes) triples, got " +
                          std::to_string(flat.size()) + " ints");
  std::vector<Segment> out;
  for (size_t i = 0; i < flat.size(); i += 3) {
    if (flat[i] < 0 || flat[i + 1] < 0)
      throw py::value_error(std::string(name) + "[" + std::to_string(i / 3) + "]: base and stride must be >= 0");
    out.push_back({static_cast<uint64_t>(flat[i]), flat[i + 1], flat[i + 2]});
  }
  return out;
}

std::string item_name(const char* kind, size_t i) { return std::string(kind) + "[" + std::to_string(i) + "]"; }

std::vector<SlotCopyOp> as_pairs(py::handle obj, const char* kind) {
  std::vector<SlotCopyOp> out;
  if (obj.is_none()) return out;
  size_t i = 0;
  for (py::handle pair : py::iter(obj)) {
    std::string name = item_name(kind, i++);
    std::vector<int64_t> v = as_int_list(pair, name.c_str());
    if (v.size() != 2) throw py::value_error(name + " must be a (src, dst) pair, got " + py_repr(pair));
    out.push_back({v[0], v[1]});
  }
  return out;
}

// statecache's own op types are read in C++; anything else with the same
// attributes (a reference dataclass, a test stand-in) through Python.
template <typename Op>
bool read_bound(py::handle op, PagedCopyOp& p) {
  if (!ops::is_op<Op>(op.ptr())) return false;
  const Op& o = ops::value_of<Op>(op.ptr());
  if constexpr (std::is_same_v<Op, CheckpointStoreOp>)
    p.slot = o.src_slot;
  else
    p.slot = o.dst_slot;
  p.unit_ids.assign(o.unit_ids.begin(), o.unit_ids.end());
  p.total_bytes = o.total_bytes;
  p.layout_id = o.layout_id;
  return true;
}

template <typename Op>
std::vector<PagedCopyOp> as_paged(py::handle obj, const char* kind, const char* slot_attr) {
  std::vector<PagedCopyOp> out;
  if (obj.is_none()) return out;
  size_t i = 0;
  for (py::handle op : py::iter(obj)) {
    std::string name = item_name(kind, i++);
    PagedCopyOp p;
    if (read_bound<Op>(op, p)) {
      out.push_back(std::move(p));
      continue;
    }
    std::string field = name + "." + slot_attr;
    p.slot = as_int(op.attr(slot_attr), field.c_str());
    field = name + ".unit_ids";
    p.unit_ids = as_int_list(op.attr("unit_ids"), field.c_str());
    field = name + ".total_bytes";
    p.total_bytes = as_int(op.attr("total_bytes"), field.c_str());
    py::object layout = op.attr("layout_id");
    field = name + ".layout_id";
    if (!PyUnicode_Check(layout.ptr())) raise_type(field.c_str(), "a str", layout);
    p.layout_id = as_text(layout, field.c_str());
    out.push_back(std::move(p));
  }
  return out;
}

MaintenanceBatch as_batch(py::handle relocations, py::handle copies, py::handle stores, py::handle restores) {
  MaintenanceBatch b;
  b.relocations = as_pairs(relocations, "relocations");
  b.copies = as_pairs(copies, "copies");
  b.stores = as_paged<CheckpointStoreOp>(stores, "stores", "src_slot");
  b.restores = as_paged<CheckpointRestoreOp>(restores, "restores", "dst_slot");
  return b;
}

// `restores` is read after the lists, as the reference reads them.
CompiledBatch compile_paged_batch(const SpanPlanner& p, py::handle slots, py::handle unit_ids, py::handle restores) {
  const IntSpan s(slots, "slots"), u(unit_ids, "unit_ids");
  return p.compile_paged(s.span().data(), s.span().size(), u.span().data(), u.span().size(),
                         as_bool(restores, "restores"));
}

}  // namespace

void bind_copy(py::module_& m) {
  // The layouts' per-batch check that their tensors keep the storage the
  // segment tables were read from, in one call (it runs before every batch).
  // A changed shape over the same storage moves no byte outside it, so the
  // address and the storage's size are what is compared. The entry holds the
  // storage the rows were read from, so its memory stays allocated: a tensor
  // given new storage (set_) cannot get that address back unnoticed, and a
  // resize of that storage shows in its size.
  m.def(
      "_first_changed",
      [](py::handle fingerprint) -> Py_ssize_t {
        if (!PyTuple_Check(fingerprint.ptr())) raise_type("fingerprint", "a tuple", fingerprint);
        // The tuple and its entries are immutable and held by the caller for
        // the call, so the calls into Python below cannot free them.
        static PyObject* const nbytes_name = PyUnicode_InternFromString("nbytes");
        const Py_ssize_t n = PyTuple_GET_SIZE(fingerprint.ptr());
        for (Py_ssize_t i = 0; i < n; ++i) {
          PyObject* e = PyTuple_GET_ITEM(fingerprint.ptr(), i);
          if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 6)
            throw py::type_error("fingerprint[" + std::to_string(i) +
                                 "] must be (tensor, data_ptr, storage, ptr, nbytes, shape)");
          auto same = [](PyObject* now, PyObject* then) {
            if (!now) throw py::error_already_set();
            const int eq = PyObject_RichCompareBool(now, then, Py_EQ);
            Py_DECREF(now);
            if (eq < 0) throw py::error_already_set();
            return eq == 1;
          };
          if (!same(PyObject_CallNoArgs(PyTuple_GET_ITEM(e, 1)), PyTuple_GET_ITEM(e, 3))) return i;
          if (!same(PyObject_CallMethodNoArgs(PyTuple_GET_ITEM(e, 2), nbytes_name), PyTuple_GET_ITEM(e, 4))) return i;
        }
        return -1;
      },
      py::arg("fingerprint"), doc("_first_changed"));

  // Host rows (buffers: NumPy views of an arena) -> entry indices of the
  // buffer at `base`, for the host-move planner, without a Python attribute
  // per row.
  m.def(
      "_buffer_entries",
      [](py::handle rows, py::handle base_obj, py::handle entry_obj, py::handle count_obj) -> py::object {
        const auto base = static_cast<uint64_t>(as_nonneg_int(base_obj, "base"));
        const auto entry = static_cast<uint64_t>(as_nonneg_int(entry_obj, "entry_bytes"));
        const auto count = static_cast<uint64_t>(as_nonneg_int(count_obj, "num_entries"));
        if (entry == 0) throw py::value_error("entry_bytes must be > 0");
        py::tuple items = sequence_snapshot(rows, "rows");
        const Py_ssize_t n = PyTuple_GET_SIZE(items.ptr());
        py::array_t<int64_t> out(n);
        int64_t* dst = out.mutable_data();
        for (Py_ssize_t i = 0; i < n; ++i) {
          Py_buffer view;
          if (PyObject_GetBuffer(PyTuple_GET_ITEM(items.ptr(), i), &view, PyBUF_C_CONTIGUOUS) != 0) {
            PyErr_Clear();
            return py::none();  // not one contiguous buffer
          }
          const auto addr = reinterpret_cast<uint64_t>(view.buf);
          const auto len = static_cast<uint64_t>(view.len);
          PyBuffer_Release(&view);
          if (len != entry || addr < base || (addr - base) % entry || (addr - base) / entry >= count) return py::none();
          dst[i] = static_cast<int64_t>((addr - base) / entry);
        }
        return out;
      },
      py::arg("rows"), py::arg("base"), py::arg("entry_bytes"), py::arg("num_entries"), doc("_buffer_entries"));

#ifdef STATECACHE_WITH_GPU
  m.attr("has_gpu_kernels") = true;
#else
  m.attr("has_gpu_kernels") = false;
#endif

  py::class_<CompiledBatch>(m, "_CopyBatch", STATECACHE_GUARDED(CompiledBatch), doc("_CopyBatch"))
      .def_property_readonly("num_ops", [](const CompiledBatch& b) { return b.ops.size(); })
      .def_property_readonly("num_slot_copies", [](const CompiledBatch& b) { return b.num_pair_ops; })
      .def_property_readonly("num_paged_ops", [](const CompiledBatch& b) { return b.num_paged_ops; })
      .def_property_readonly("bytes", [](const CompiledBatch& b) { return b.bytes; });

  py::class_<SpanPlanner> planner(m, "_SpanPlanner", STATECACHE_GUARDED(SpanPlanner), doc("_SpanPlanner"));
  planner.def(py::init([](py::handle image, py::handle slot, py::handle unit, py::handle num_slots,
                          py::handle num_units, py::handle layout_id) {
                if (!PyUnicode_Check(layout_id.ptr())) raise_type("layout_id", "a str", layout_id);
                return std::make_unique<SpanPlanner>(as_segments(image, "image_segments"),
                                                     as_segments(slot, "slot_segments"),
                                                     as_segments(unit, "unit_segments"), as_int(num_slots, "num_slots"),
                                                     as_int(num_units, "num_units"), as_text(layout_id, "layout_id"));
              }),
              py::arg("image_segments"), py::arg("slot_segments"), py::arg("unit_segments"), py::arg("num_slots"),
              py::arg("num_units"), py::arg("layout_id"), doc(planner, "__init__"));
  using P = SpanPlanner;
  using fast::to_py;
  fast::attr<&P::num_slots>(planner, "num_slots");
  fast::attr<&P::num_units>(planner, "num_units");
  fast::attr<&P::image_bytes>(planner, "image_bytes");
  fast::attr<&P::slot_bytes>(planner, "slot_bytes");
  fast::attr<&P::unit_bytes>(planner, "unit_bytes");
  fast::attr<&P::units_per_image>(planner, "units_per_image");
  fast::attr<&P::layout_id>(planner, "layout_id");
  fast::def_readonly<P>(planner, "pieces_per_paged_op",
                        [](const P& p) { return fast::to_result(p.paged_template().size()); });
  fast::def_readonly<P>(planner, "pieces_per_slot_copy",
                        [](const P& p) { return fast::to_result(p.slot_template().size()); });
  planner.def(
      "compile",
      [](const SpanPlanner& p, py::handle relocations, py::handle copies, py::handle stores, py::handle restores) {
        return p.compile(as_batch(relocations, copies, stores, restores));
      },
      py::arg("relocations") = py::tuple(), py::arg("copies") = py::tuple(), py::arg("stores") = py::tuple(),
      py::arg("restores") = py::tuple(), doc(planner, "compile"));
  fast::method<&compile_paged_batch>(planner, "compile_paged", {"slots", "unit_ids", "restores"});
  planner
      .def(
          "validate",
          [](const SpanPlanner& p, py::handle relocations, py::handle copies, py::handle stores, py::handle restores) {
            p.validate(as_batch(relocations, copies, stores, restores));
          },
          py::arg("relocations") = py::tuple(), py::arg("copies") = py::tuple(), py::arg("stores") = py::tuple(),
          py::arg("restores") = py::tuple(), doc(planner, "validate"))
      // Holds the GIL: another thread could free or resize a tensor mid-copy.
      .def("run_on_cpu", &SpanPlanner::run_on_cpu, py::arg("batch"), doc(planner, "run_on_cpu"))
      .def(
          "spans",
          [](const SpanPlanner& p, const CompiledBatch& b) {
            py::list out;
            for (const CopySpan& s : p.spans(b)) out.append(py::make_tuple(s.src, s.dst, s.bytes));
            return out;
          },
          py::arg("batch"), doc(planner, "spans"));

#ifdef STATECACHE_WITH_GPU
  py::class_<GpuCopyEngine> engine(m, "_GpuCopyEngine", STATECACHE_GUARDED(GpuCopyEngine), doc("_GpuCopyEngine"));
  engine
      .def(py::init([](py::handle device, const SpanPlanner& planner, py::handle max_pair_ops, py::handle max_paged_ops,
                       py::handle buffers, py::handle variant, py::handle host_moves) {
             return std::make_unique<GpuCopyEngine>(static_cast<int>(as_nonneg_int(device, "device")), planner,
                                                    static_cast<size_t>(as_nonneg_int(max_pair_ops, "max_pair_ops")),
                                                    static_cast<size_t>(as_nonneg_int(max_paged_ops, "max_paged_ops")),
                                                    static_cast<int>(as_int(buffers, "buffers")),
                                                    static_cast<int>(as_int(variant, "variant")),
                                                    as_bool(host_moves, "host_moves"));
           }),
           py::arg("device"), py::arg("planner"), py::arg("max_pair_ops"), py::arg("max_paged_ops"),
           py::arg("buffers") = 2, py::arg("variant") = 0, py::arg("host_moves") = false, doc(engine, "__init__"))
      .def(
          "submit",
          [](GpuCopyEngine& e, const CompiledBatch& batch, py::handle stream, py::handle path) {
            const int64_t p = as_int(path, "path");
            if (p < 0 || p > 2)
              throw py::value_error("path=" + std::to_string(p) + " must be 0 (auto), 1 (sm) or 2 (dma)");
            return static_cast<int>(
                e.submit(batch, static_cast<uintptr_t>(as_nonneg_int(stream, "stream")), static_cast<HostPath>(p)));
          },
          py::arg("batch"), py::arg("stream"), py::arg("path") = 0, doc(engine, "submit"))
      .def(
          "set_host_blocks",
          [](GpuCopyEngine& e, py::handle to_host, py::handle from_host) {
            e.set_host_blocks(static_cast<int>(as_int(to_host, "to_host")),
                              static_cast<int>(as_int(from_host, "from_host")));
          },
          py::arg("to_host"), py::arg("from_host"), doc(engine, "set_host_blocks"))
      .def(
          "set_sm_slice_bytes",
          [](GpuCopyEngine& e, py::handle bytes) {
            e.set_sm_slice_bytes(static_cast<uint64_t>(as_nonneg_int(bytes, "bytes")));
          },
          py::arg("bytes"), doc(engine, "set_sm_slice_bytes"))
      .def(
          "set_dma_batch",
          [](GpuCopyEngine& e, py::handle runs) { e.set_dma_batch(static_cast<size_t>(as_nonneg_int(runs, "runs"))); },
          py::arg("runs"), doc(engine, "set_dma_batch"))
      .def(
          "host_blocks",
          [](GpuCopyEngine& e, py::handle to_host) { return e.host_blocks(as_bool(to_host, "to_host")); },
          py::arg("to_host"), doc(engine, "host_blocks"))
      .def("stage", &GpuCopyEngine::stage, py::arg("batch"), doc(engine, "stage"))
      .def(
          "launch",
          [](GpuCopyEngine& e, py::handle stream, py::handle full_transfer, py::handle copy_descriptors) {
            e.launch(static_cast<uintptr_t>(as_nonneg_int(stream, "stream")), as_bool(full_transfer, "full_transfer"),
                     as_bool(copy_descriptors, "copy_descriptors"));
          },
          py::arg("stream"), py::arg("full_transfer") = false, py::arg("copy_descriptors") = true,
          doc(engine, "launch"))
      .def(
          "record_consumed",
          [](GpuCopyEngine& e, py::handle stream) {
            e.record_consumed(static_cast<uintptr_t>(as_nonneg_int(stream, "stream")));
          },
          py::arg("stream"), doc(engine, "record_consumed"))
      .def_property_readonly("device", &GpuCopyEngine::device)
      .def_property_readonly("num_sms", &GpuCopyEngine::num_sms)
      .def_property_readonly("grid_blocks", &GpuCopyEngine::grid_blocks)
      .def_property_readonly("staging_bytes", &GpuCopyEngine::staging_bytes)
      .def_property_readonly("items_per_paged_op", &GpuCopyEngine::items_per_paged_op)
      .def_property_readonly("items_per_slot_copy", &GpuCopyEngine::items_per_slot_copy)
      .def_property_readonly("host_moves", &GpuCopyEngine::host_moves)
      .def_property_readonly("paged_run_bytes", &GpuCopyEngine::paged_run_bytes)
      .def_property_readonly_static("item_bytes", [](py::handle) { return GpuCopyEngine::item_bytes(); })
      .def_property_readonly_static("inline_bytes", [](py::handle) { return GpuCopyEngine::inline_bytes(); })
      .def_property_readonly_static("num_variants", [](py::handle) { return GpuCopyEngine::num_variants(); });

  m.def(
      "_host_link_profile",
      [](py::handle device) {
        const HostLinkProfile& p = host_link_profile(static_cast<int>(as_nonneg_int(device, "device")));
        py::list samples;
        for (const HostLinkSample& x : p.samples)
          samples.append(py::dict(py::arg("to_host") = x.to_host, py::arg("dma") = x.dma,
                                  py::arg("row_bytes") = x.row_bytes, py::arg("blocks") = x.blocks,
                                  py::arg("gb_per_s") = x.gb_per_s));
        return py::dict(py::arg("sm_access") = p.sm_access, py::arg("batch_dma") = p.batch_dma,
                        py::arg("sm_count") = p.sm_count, py::arg("blocks_to_host") = p.blocks[0],
                        py::arg("blocks_from_host") = p.blocks[1], py::arg("crossover_to_host") = p.crossover[0],
                        py::arg("crossover_from_host") = p.crossover[1], py::arg("slice_to_host") = p.slice_bytes[0],
                        py::arg("slice_from_host") = p.slice_bytes[1], py::arg("samples") = samples);
      },
      py::arg("device"), doc("_host_link_profile"));
  m.def(
      "_host_memory_mapped",
      [](py::handle device, py::handle address, py::handle nbytes) {
        return host_memory_mapped(static_cast<int>(as_nonneg_int(device, "device")),
                                  static_cast<uintptr_t>(as_nonneg_int(address, "address")),
                                  static_cast<size_t>(as_nonneg_int(nbytes, "nbytes")));
      },
      py::arg("device"), py::arg("address"), py::arg("nbytes"), doc("_host_memory_mapped"));
#endif
}

}  // namespace statecache::bindings
