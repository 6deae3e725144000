// Arguments of the batched per-pass calls (core/batch.h): the `seqs` list and
// the per-sequence hash lists, converted for the core without per-item Python
// allocations. Shared by both pools and the PAGE coordinator.
//
// Re-entrancy: `seqs` and an explicit `block_hashes` are read from owned tuple
// snapshots, so the caller's lists may change under us without effect. Every
// Python object reached is held by a strong reference for the call. A hash
// list is read in place, one item at a time, only where no Python code runs
// between the read and its use; see HashRows.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bindings/convert.h"
#include "bindings/fast_call.h"
#include "core/batch.h"
#include "core/sequence.h"

namespace statecache::bindings {

namespace py = pybind11;

// An owned tuple of a batch argument's items: a list or tuple (or another
// iterable, read whole). TypeError naming `name` for str, bytes, mappings
// and non-iterables.
inline py::tuple batch_items(py::handle obj, const char* name, const char* want) {
  PyObject* p = obj.ptr();
  if (PyTuple_CheckExact(p)) return py::reinterpret_borrow<py::tuple>(obj);
  if (PyList_CheckExact(p)) return py::reinterpret_steal<py::tuple>(PyList_AsTuple(p));
  if (PyUnicode_Check(p) || PyBytes_Check(p) || PyByteArray_Check(p) || PyDict_Check(p) ||
      !PyObject_HasAttrString(p, "__iter__"))
    raise_type(name, want, obj);
  PyObject* t = PySequence_Tuple(p);
  if (!t) throw py::error_already_set();
  return py::reinterpret_steal<py::tuple>(t);
}

// The `seqs` argument of a batch: each item a statecache.Sequence (its C++
// object, read and written in place) or any object with the sequence
// attributes (read into a snapshot by fast::SeqArg, `reads` as there).
// A native Sequence lives as long as its Python object, which items_ holds,
// so the pointers stay valid for the call whatever Python code runs.
class SeqBatch {
 public:
  SeqBatch(py::handle seqs, const char* name, unsigned reads, HashForm* hashes = nullptr)
      : items_(batch_items(seqs, name, "a list of statecache.Sequence (or objects with its attributes)")) {
    const Py_ssize_t n = PyTuple_GET_SIZE(items_.ptr());
    ptrs_.reserve(static_cast<size_t>(n));
    keys_.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* obj = PyTuple_GET_ITEM(items_.ptr(), i);
      Sequence* native = fast::SeqArg::native_of(obj, name, i);
      if (!native) {
        // Room for every entry left, once: the snapshots never move (ptrs_
        // points into them), and a batch of engine objects allocates once.
        if (generic_.empty()) generic_.reserve(static_cast<size_t>(n - i));
        generic_.emplace_back(obj, name, i, reads, hashes);
        generic_at_.resize(static_cast<size_t>(n), -1);
        generic_at_[static_cast<size_t>(i)] = static_cast<int32_t>(generic_.size() - 1);
        native = &generic_.back().get();
      }
      ptrs_.push_back(native);
      keys_.push_back(reinterpret_cast<uintptr_t>(obj));
    }
  }

  size_t size() const { return ptrs_.size(); }
  bool all_native() const { return generic_.empty(); }
  // Entry i's fields: the C++ object, or the generic object's snapshot.
  std::span<Sequence* const> seqs() const { return ptrs_; }
  Sequence& seq(size_t i) const { return *ptrs_[i]; }
  // Entry i's identity: its Python object.
  std::span<const uintptr_t> keys() const { return keys_; }
  PyObject* object(size_t i) const { return PyTuple_GET_ITEM(items_.ptr(), static_cast<Py_ssize_t>(i)); }
  py::object ref(size_t i) const { return py::reinterpret_borrow<py::object>(object(i)); }
  bool is_native(size_t i) const { return generic_at_.empty() || generic_at_[i] < 0; }
  // The generic entry's argument, or nullptr for a native one.
  fast::SeqArg* generic(size_t i) {
    if (generic_at_.empty() || generic_at_[i] < 0) return nullptr;
    return &generic_[static_cast<size_t>(generic_at_[i])];
  }

  // What one generic entry's write-back sets, in order (at most three fields).
  struct Writes {
    size_t entry = 0;
    std::array<std::pair<fast::SeqField, int64_t>, 3> fields{};
    size_t count = 0;
    void add(fast::SeqField f, int64_t v) { fields[count++] = {f, v}; }
    std::span<const std::pair<fast::SeqField, int64_t>> span() const { return {fields.data(), count}; }
  };

  // Sets each entry's fields on its object, in order. If a setter raises,
  // every field already written (this entry's and the earlier ones') gets
  // its value as read back, best effort, and the error propagates.
  void write_back(const std::vector<Writes>& writes) {
    size_t done = 0;
    try {
      for (const Writes& w : writes) {
        generic(w.entry)->write_back(w.span());
        ++done;
      }
    } catch (...) {
      restore(std::span<const Writes>(writes).first(done));
      throw;
    }
  }
  void restore(std::span<const Writes> writes) {
    for (const Writes& w : writes) generic(w.entry)->restore(w.span());
  }

 private:
  py::tuple items_;
  std::vector<fast::SeqArg> generic_;  // reserved up front: never reallocated
  std::vector<int32_t> generic_at_;    // entry -> index in generic_, -1 native; empty when all native
  std::vector<Sequence*> ptrs_;
  std::vector<uintptr_t> keys_;
};

// One hash list per sequence of a batch, for core/batch.h's resumable_hits:
// `block_hashes` as given (a list or tuple of lists, tuples or 1-D integer
// buffers, or a 2-D int64 array with a row per sequence), or None for each
// sequence's own `block_hashes`.
//
// Exact-int lists and tuples are read in place, an item at a time: a read
// runs no Python code, checks the list's current length, and keeps no item
// pointer. A non-exact item (a NumPy scalar, an int subclass, anything with
// __index__) reads as -1 and sets saw_non_exact(); the caller then converts
// every such row with own_lists() (which may run __index__) and runs the
// batch again; so does a caller whose scan may run Python code (a tier's
// vote), before its first scan. Buffers are never read in place: row i's
// first min(limits[i], length) items (all a scan up to hit limits[i] reads)
// are copied, other iterables converted whole, up front. A
// statecache.Sequence's own hashes are read from its C++ vector, re-checking
// its length on every read.
class HashRows {
 public:
  // The forms of the hashes read are noted in `form` (the cache's). With
  // `no_python_after` (nothing the call does after this runs Python code: the
  // scans are C++ only) int64 buffers are read in place, their exports held,
  // when taking every row runs no Python code either (exact lists, tuples and
  // int64 buffers only; a generic sequence's attribute, say, does).
  HashRows(py::handle block_hashes, const SeqBatch& seqs, std::span<const int64_t> limits, HashForm& form,
           bool no_python_after = false)
      : limits_(limits), form_(form) {
    const size_t n = seqs.size();
    rows_.resize(n);
    if (block_hashes.is_none()) {
      for (size_t i = 0; i < n; ++i) {
        const Sequence& s = seqs.seq(i);
        PyObject* obj = seqs.object(i);
        if (seqs.is_native(i)) {
          rows_[i] = Row{kNative, nullptr, static_cast<int64_t>(s.block_hashes.size()), nullptr, &s};
          continue;
        }
        PyObject* attr = PyObject_GetAttrString(obj, "block_hashes");
        if (!attr) throw py::error_already_set();
        keep_.push_back(py::reinterpret_steal<py::object>(attr));
        set_row(i, attr, "seqs", ".block_hashes");
      }
      return;
    }
    in_place_ = no_python_after;
    if (set_matrix(block_hashes.ptr())) return;
    py::tuple items = batch_items(block_hashes, "block_hashes", "a list of hash lists (one per sequence) or None");
    keep_.push_back(items);
    for (Py_ssize_t i = 0; in_place_ && i < PyTuple_GET_SIZE(items.ptr()); ++i) {
      PyObject* row = PyTuple_GET_ITEM(items.ptr(), i);
      if (!PyList_CheckExact(row) && !PyTuple_CheckExact(row) && !PyObject_CheckBuffer(row))
        in_place_ = false;  // taking this row may run Python code: every buffer is copied
    }
    if (static_cast<size_t>(PyTuple_GET_SIZE(items.ptr())) != n) {
      // The core names the mismatch; rows past either end are never read.
      rows_.resize(static_cast<size_t>(PyTuple_GET_SIZE(items.ptr())));
    }
    for (size_t i = 0; i < rows_.size(); ++i)
      set_row(i, PyTuple_GET_ITEM(items.ptr(), static_cast<Py_ssize_t>(i)), "block_hashes", "");
  }

  size_t size() const { return rows_.size(); }
  int64_t length(size_t r) const { return rows_[r].n; }
  // f(length, hash_at) for row r, hash_at specialised to the row's kind.
  template <class F>
  int64_t scan(size_t r, F&& f) const {
    const Row& row = rows_[r];
    switch (row.kind) {
      case kList: {
        PyObject* list = row.obj;
        return f(row.n, [this, list, r](int64_t k) {
          if (k >= PyList_GET_SIZE(list)) [[unlikely]]
            changed_size("block_hashes", r);
          // Scans walk down the list: start fetching the next item's object.
          if (k >= 4) __builtin_prefetch(PyList_GET_ITEM(list, k - 4));
          return item(PyList_GET_ITEM(list, k), r, k);
        });
      }
      case kTuple: {
        PyObject* tuple = row.obj;
        return f(row.n, [this, tuple, r](int64_t k) {
          if (k >= PyTuple_GET_SIZE(tuple)) [[unlikely]]
            throw std::out_of_range("block_hashes: read past the end");
          if (k > 0) __builtin_prefetch(PyTuple_GET_ITEM(tuple, k - 1));
          return item(PyTuple_GET_ITEM(tuple, k), r, k);
        });
      }
      case kNative: {
        const Sequence* seq = row.seq;
        return f(row.n, [seq, r](int64_t k) {
          if (static_cast<size_t>(k) >= seq->block_hashes.size()) [[unlikely]]
            changed_size("seqs[].block_hashes", r);
          return seq->block_hashes[static_cast<size_t>(k)];
        });
      }
      case kBuffer:  // in place, its readable prefix's form noted when it was taken
      case kData:
      default: {
        const int64_t* data = row.data;
        const int64_t readable = row.readable;
        return f(row.n, [data, readable](int64_t k) {
          if (k >= readable) [[unlikely]]
            throw std::out_of_range("block_hashes: read past the converted prefix");
          return data[k];
        });
      }
    }
  }
  // Starts loading what a scan of row r below `hit` reads first: stage 0
  // the item pointers (lists, tuples) or hashes, stage 1 the int objects
  // they point to. Reads only the list's length and item array pointer.
  void prefetch(size_t r, int64_t hit, int stage) const {
    const Row& row = rows_[r];
    const int64_t top = std::min(hit, row.n);
    if (top <= 0) return;
    switch (row.kind) {
      case kList:
      case kTuple: {
        PyObject* const* items = row.kind == kList ? reinterpret_cast<PyListObject*>(row.obj)->ob_item
                                                   : reinterpret_cast<PyTupleObject*>(row.obj)->ob_item;
        const Py_ssize_t size = row.kind == kList ? PyList_GET_SIZE(row.obj) : PyTuple_GET_SIZE(row.obj);
        if (top > size) return;
        if (stage == 0) {
          __builtin_prefetch(items + top - 1);
          if (top >= 8) __builtin_prefetch(items + top - 8);
          return;
        }
        for (int64_t k = top - 1; k >= std::max<int64_t>(0, top - 4); --k) __builtin_prefetch(items[k]);
        return;
      }
      case kData:
      case kBuffer:
        if (stage == 1 && top <= row.readable) __builtin_prefetch(row.data + top - 1);
        return;
      case kNative:
        return;
    }
  }
  bool saw_non_exact() const { return non_exact_; }

  // Converts every list or tuple row (with `native_too`, a
  // statecache.Sequence's own list as well), its first min(limits[i],
  // length) items (what a scan up to hit limits[i] can read), into owned
  // ints; those rows then run no Python code when read and nothing a
  // callback does changes them. May run __index__.
  void own_lists(std::span<const int64_t> limits, bool native_too = false) {
    non_exact_ = false;
    // Buffers read in place are copied first: converting the lists below may
    // run Python code, which could resize them.
    for (size_t i = 0; i < rows_.size(); ++i) {
      Row& row = rows_[i];
      if (row.kind != kBuffer) continue;
      const int64_t take = std::min<int64_t>(i < limits.size() ? std::max<int64_t>(0, limits[i]) : 0, row.n);
      for (int64_t k = 0; k < take; ++k)
        if (row.data[k] < -1) {
          detail::note_item(form_, "block_hashes", static_cast<Py_ssize_t>(k), row.data[k], HashForm::kSigned);
          break;
        }
      auto ints = std::make_unique<std::vector<int64_t>>(row.data, row.data + take);
      row = Row{kData, nullptr, row.n, ints->data(), nullptr, take};
      owned_.push_back(std::move(ints));
    }
    exports_.clear();
    buffers_.clear();
    for (size_t i = 0; i < rows_.size(); ++i) {
      Row& row = rows_[i];
      if (row.kind == kNative && native_too) {
        const int64_t take = std::min<int64_t>(i < limits.size() ? std::max<int64_t>(0, limits[i]) : 0, row.n);
        auto ints =
            std::make_unique<std::vector<int64_t>>(row.seq->block_hashes.begin(), row.seq->block_hashes.begin() + take);
        row = Row{kData, nullptr, row.n, ints->data(), nullptr, take};
        owned_.push_back(std::move(ints));
        continue;
      }
      if (row.kind != kList && row.kind != kTuple) continue;
      py::tuple snap = sequence_snapshot(row.obj, "block_hashes");
      const std::string label = "block_hashes[" + std::to_string(i) + "]";
      const int64_t limit = i < limits.size() ? std::max<int64_t>(0, limits[i]) : 0;
      auto ints = std::make_unique<std::vector<int64_t>>();
      detail::append_hash_tuple(snap.ptr(), label.c_str(), *ints, static_cast<Py_ssize_t>(limit), form_);
      row.n = PyTuple_GET_SIZE(snap.ptr());
      row.kind = kData;
      row.data = ints->data();
      row.readable = static_cast<int64_t>(ints->size());
      owned_.push_back(std::move(ints));
    }
  }

 private:
  enum RowSource : uint8_t { kList, kTuple, kNative, kData, kBuffer };
  struct Row {
    RowSource kind = kData;
    PyObject* obj = nullptr;  // kList / kTuple: held by keep_ (or the items tuple)
    int64_t n = 0;
    const int64_t* data = nullptr;  // kData
    const Sequence* seq = nullptr;  // kNative
    int64_t readable = 0;           // kData: how many of data[] exist
  };

  [[noreturn, gnu::noinline]] static void changed_size(const char* what, size_t r) {
    throw py::value_error(std::string(what) + " of entry " + std::to_string(r) + " changed size while it was read");
  }
  [[gnu::always_inline]] int64_t item(PyObject* it, size_t r, int64_t k) const {
    int64_t v = -1;
    HashForm::Kind kind = HashForm::kUnset;
    if (!detail::exact_hash_fast(it, v, kind)) [[unlikely]] {
      non_exact_ = true;  // converted (and refused if it is no hash) by own_lists
      return -1;
    }
    if (kind != HashForm::kUnset && kind != form_.kind()) [[unlikely]]
      detail::note_item(form_, ("block_hashes[" + std::to_string(r) + "]").c_str(), static_cast<Py_ssize_t>(k), v,
                        kind);
    return v;
  }

  int64_t limit(size_t i) const { return i < limits_.size() ? std::max<int64_t>(0, limits_[i]) : 0; }
  // Notes the signed form of row r's first `n` int64 hashes (one pass, no
  // branch per hash taken on the common all-small path).
  void note_signed(const int64_t* d, int64_t n, size_t r) {
    if (!has_signed_form(d, n)) return;
    for (int64_t k = 0; k < n; ++k)
      if (d[k] < -1) {
        detail::note_item(form_, ("block_hashes[" + std::to_string(r) + "]").c_str(), static_cast<Py_ssize_t>(k), d[k],
                          HashForm::kSigned);
        return;
      }
  }

  // A 2-D int64 buffer (a NumPy array, row i = sequence i's hashes), each
  // row's readable prefix copied; false (nothing held) for anything else.
  bool set_matrix(PyObject* obj) {
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj) || !PyObject_CheckBuffer(obj)) return false;
    Py_buffer view{};
    if (PyObject_GetBuffer(obj, &view, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      return false;
    }
    const char* f = view.format ? view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') ++f;  // native order on a little-endian host
    const bool int64 =
        view.itemsize == 8 && (std::strcmp(f, "q") == 0 || std::strcmp(f, "l") == 0 || std::strcmp(f, "n") == 0);
    if (view.ndim != 2 || !int64 || (view.strides && view.strides[1] != 8)) {
      PyBuffer_Release(&view);
      return false;  // read as a sequence of rows
    }
    const Py_ssize_t row_stride = view.strides ? view.strides[0] : view.shape[1] * 8;
    rows_.resize(static_cast<size_t>(view.shape[0]));
    if (in_place_) {  // nothing runs Python code before the scans end: read it where it is
      for (Py_ssize_t i = 0; i < view.shape[0]; ++i) {
        const auto* row = reinterpret_cast<const int64_t*>(static_cast<const char*>(view.buf) + i * row_stride);
        const int64_t take = std::min<int64_t>(limit(static_cast<size_t>(i)), view.shape[1]);
        note_signed(row, take, static_cast<size_t>(i));
        rows_[static_cast<size_t>(i)] = Row{kBuffer, nullptr, view.shape[1], row, nullptr, take};
      }
      exports_.push_back(std::make_unique<Export>(view));
      return true;
    }
    for (Py_ssize_t i = 0; i < view.shape[0]; ++i) {
      const auto* row = reinterpret_cast<const int64_t*>(static_cast<const char*>(view.buf) + i * row_stride);
      const int64_t take = std::min<int64_t>(limit(static_cast<size_t>(i)), view.shape[1]);
      note_signed(row, take, static_cast<size_t>(i));
      auto ints = std::make_unique<std::vector<int64_t>>(row, row + take);
      rows_[static_cast<size_t>(i)] = Row{kData, nullptr, view.shape[1], ints->data(), nullptr, take};
      owned_.push_back(std::move(ints));
    }
    PyBuffer_Release(&view);
    return true;
  }

  void set_row(size_t i, PyObject* obj, const char* name, const char* suffix) {
    Row& row = rows_[i];
    if (PyList_CheckExact(obj)) {
      row = Row{kList, obj, PyList_GET_SIZE(obj)};
      return;
    }
    if (PyTuple_CheckExact(obj)) {
      row = Row{kTuple, obj, PyTuple_GET_SIZE(obj)};
      return;
    }
    const std::string label = std::string(name) + "[" + std::to_string(i) + "]" + suffix;
    auto ints = std::make_unique<std::vector<int64_t>>();
    {
      auto buf = std::make_unique<IntBuffer>(obj, label.c_str());
      if (in_place_ && buf->kind() == IntBuffer::kInt64) {  // see the constructor
        const int64_t take = std::min<int64_t>(limit(i), buf->size());
        note_signed(buf->data(), take, i);
        row = Row{kBuffer, nullptr, buf->size(), buf->data(), nullptr, take};
        buffers_.push_back(std::move(buf));
        return;
      }
    }
    {
      IntBuffer buf(obj, label.c_str());
      if (buf.kind() != IntBuffer::kNone) {
        copy_hash_prefix(buf, label.c_str(), limit(i), *ints, form_);
        row = Row{kData, nullptr, buf.size(), ints->data(), nullptr, static_cast<int64_t>(ints->size())};
        owned_.push_back(std::move(ints));
        return;
      }
    }
    append_hashes(py::handle(obj), label.c_str(), *ints, form_);
    row = Row{kData,        nullptr, static_cast<int64_t>(ints->size()),
              ints->data(), nullptr, static_cast<int64_t>(ints->size())};
    owned_.push_back(std::move(ints));
  }

  // A held 2-D buffer export, released with the rows.
  struct Export {
    Py_buffer view;
    explicit Export(const Py_buffer& v) : view(v) {}
    Export(const Export&) = delete;
    Export& operator=(const Export&) = delete;
    ~Export() { PyBuffer_Release(&view); }
  };

  std::span<const int64_t> limits_;
  HashForm& form_;
  bool in_place_ = false;
  std::vector<std::unique_ptr<Export>> exports_;
  std::vector<std::unique_ptr<IntBuffer>> buffers_;
  std::vector<Row> rows_;
  std::vector<py::object> keep_;
  std::vector<std::unique_ptr<std::vector<int64_t>>> owned_;
  mutable bool non_exact_ = false;
};

// resumable_hits(seqs, hits, block_hashes=None, assume_checkpointed=False) of
// any cache core/batch.h serves; `reads` are the fields its resumable_hit
// reads from a sequence. Returns the list of capped hits.
// With `scan_calls_python` (a tier's vote written in Python) the hash lists
// are converted before the first scan.
template <class Cache>
py::list resumable_hits_arg(const Cache& cache, PyObject* seqs_obj, PyObject* hits_obj, PyObject* hashes_obj,
                            PyObject* assume_obj, unsigned reads, bool scan_calls_python = false) {
  const bool assume = assume_obj != nullptr && as_bool(assume_obj, "assume_checkpointed");
  const IntSpan hits(hits_obj, "hits");
  const SeqBatch seqs(seqs_obj, "seqs", reads);
  HashRows rows(py::handle(hashes_obj ? hashes_obj : Py_None), seqs, hits.span(), cache.hash_form(),
                /*no_python_after=*/!scan_calls_python);
  if (scan_calls_python) rows.own_lists(hits.span(), /*native_too=*/true);
  std::vector<int64_t> out = batch::resumable_hits(cache, seqs.seqs(), hits.span(), rows, assume);
  if (rows.saw_non_exact()) {
    rows.own_lists(hits.span());
    out = batch::resumable_hits(cache, seqs.seqs(), hits.span(), rows, assume);
  }
  return to_list(out);
}

}  // namespace statecache::bindings
