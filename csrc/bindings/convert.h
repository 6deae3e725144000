// Argument conversion shared by every binding file: strict ints (bool is not
// an int here), int lists from lists, tuples, integer buffers and other
// sequences, and errors that name the argument and the bad value.
//
// Re-entrancy rule: converting an element may run Python code (`__index__`),
// which may mutate or free the container. No borrowed item pointer is kept
// across such a call: lists and tuples are read directly only while every
// element is an exact int (no Python code runs); the first other element
// restarts the conversion on an owned tuple snapshot.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace statecache::bindings {

namespace py = pybind11;

inline std::string py_repr(py::handle obj) {
  PyObject* r = PyObject_Repr(obj.ptr());
  if (!r) {
    PyErr_Clear();
    return std::string("<") + Py_TYPE(obj.ptr())->tp_name + " object>";
  }
  py::object keep = py::reinterpret_steal<py::object>(r);
  const char* s = PyUnicode_AsUTF8(r);
  if (!s) {
    PyErr_Clear();
    return "<unprintable>";
  }
  std::string out(s);
  if (out.size() > 200) out = out.substr(0, 200) + "...";
  return out;
}

[[noreturn]] inline void raise_type(const char* name, const char* want, py::handle got) {
  throw py::type_error(std::string(name) + " must be " + want + ", got " + Py_TYPE(got.ptr())->tp_name + " " +
                       py_repr(got));
}

// A str argument's UTF-8 bytes; ValueError naming `name` for a str that has
// none (a lone surrogate), TypeError for anything but a str.
inline std::string as_text(py::handle obj, const char* name) {
  PyObject* p = obj.ptr();
  if (!PyUnicode_Check(p)) raise_type(name, "a str", obj);
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(p, &n);
  if (s == nullptr) {
    PyErr_Clear();
    throw py::value_error(std::string(name) + "=" + py_repr(obj) +
                          " cannot be encoded as UTF-8 (it holds a lone surrogate)");
  }
  return std::string(s, static_cast<size_t>(n));
}

// An int that does not fit: OverflowError as docs/contract.md, "Errors" says, and a ValueError
// too, since it is a bad value (set up by bind_common; OverflowError before).
inline PyObject* int_range_error = PyExc_OverflowError;

[[noreturn]] inline void raise_overflow(const char* name, py::handle got) {
  PyErr_Clear();
  PyErr_SetString(int_range_error,
                  (std::string(name) + "=" + py_repr(got) + " does not fit in a signed 64-bit int").c_str());
  throw py::error_already_set();
}

// An exact int's value without calling into Python; false when it does not
// fit (no error left set).
inline bool exact_int_value(PyObject* p, int64_t& out) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
  if (overflow != 0) return false;
  out = v;
  return true;
}

// A Python int (not bool), an int subclass or an `__index__` integer (NumPy
// scalars) that fits in int64; OverflowError / TypeError naming `name`.
inline int64_t as_int(py::handle obj, const char* name) {
  PyObject* p = obj.ptr();
  int64_t v = 0;
  if (PyLong_CheckExact(p)) {
    if (!exact_int_value(p, v)) raise_overflow(name, obj);
    return v;
  }
  if (PyBool_Check(p) || PyFloat_Check(p) || !PyIndex_Check(p)) raise_type(name, "an int", obj);
  // int subclasses and __index__ types: normalise to an exact int first (may
  // run Python code; nothing borrowed is held across it).
  py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(p));
  if (!idx) throw py::error_already_set();
  if (!PyLong_Check(idx.ptr())) raise_type(name, "an int", obj);
  if (!exact_int_value(idx.ptr(), v)) raise_overflow(name, obj);
  return v;
}

inline int64_t as_nonneg_int(py::handle obj, const char* name) {
  int64_t v = as_int(obj, name);
  if (v < 0) throw py::value_error(std::string(name) + "=" + std::to_string(v) + " must be >= 0");
  return v;
}

// bool, or an int read by its truth (any size: 2**70 is true).
inline bool as_bool(py::handle obj, const char* name) {
  PyObject* p = obj.ptr();
  if (PyBool_Check(p)) return p == Py_True;
  if (PyLong_Check(p)) {
    const int t = PyObject_IsTrue(p);
    if (t < 0) throw py::error_already_set();
    return t != 0;
  }
  raise_type(name, "a bool", obj);
}

// A 1-D buffer of integers (NumPy integer arrays, array.array('q'), ...).
// `kind()`: kNone when the object exports no buffer (or a non-numeric one,
// e.g. NumPy object arrays, which are read as sequences instead), kInt64 when
// its items are native int64 and contiguous (read in place), kOther for other
// integer layouts. Float / bool / complex buffers raise TypeError naming the
// argument; more than one dimension raises ValueError.
class IntBuffer {
 public:
  enum Kind { kNone, kInt64, kOther };
  IntBuffer(PyObject* obj, const char* name) : name_(name) {
    if (!PyObject_CheckBuffer(obj) || PyUnicode_Check(obj)) return;
    if (PyBytes_Check(obj) || PyByteArray_Check(obj))  // text by intent, not a list of ints
      throw py::type_error(std::string(name) + " must be a sequence of ints, got " + Py_TYPE(obj)->tp_name);
    if (PyObject_GetBuffer(obj, &view_, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      if (PyObject_GetBuffer(obj, &view_, PyBUF_FULL_RO) != 0) {
        PyErr_Clear();
        return;
      }
    }
    held_ = true;
    const char* f = view_.format ? view_.format : "B";
    swap_ = false;
    if (*f == '<' || *f == '>' || *f == '!' || *f == '=' || *f == '@') {
      const bool little = *f == '<' || ((*f == '=' || *f == '@') && is_little());
      swap_ = little != is_little();
      ++f;
    }
    code_ = f[0];
    const bool single = f[0] != '\0' && f[1] == '\0';
    if (!single || !std::strchr("bBhHiIlLqQnN", code_)) {
      if (single && std::strchr("efdFDZ?c", code_)) {
        release();
        throw py::type_error(std::string(name) + " must hold integers, got a buffer of format '" + code_ + "'");
      }
      release();  // object arrays and the like: read as a sequence
      return;
    }
    if (view_.ndim != 1) {
      const int nd = view_.ndim;
      release();
      throw py::value_error(std::string(name) + " must be one-dimensional, got " + std::to_string(nd) + " dimensions");
    }
    const bool contiguous = !view_.strides || view_.strides[0] == view_.itemsize;
    kind_ = (view_.itemsize == 8 && (code_ == 'q' || code_ == 'l' || code_ == 'n') && contiguous && !swap_) ? kInt64
                                                                                                            : kOther;
  }
  ~IntBuffer() { release(); }
  IntBuffer(const IntBuffer&) = delete;
  IntBuffer& operator=(const IntBuffer&) = delete;

  Kind kind() const { return kind_; }
  int64_t size() const { return static_cast<int64_t>(view_.shape ? view_.shape[0] : view_.len / view_.itemsize); }
  // kInt64 only.
  const int64_t* data() const { return static_cast<const int64_t*>(view_.buf); }
  // Any integer kind; OverflowError for an unsigned value past INT64_MAX.
  int64_t at(int64_t i) const {
    const Py_ssize_t stride = view_.strides ? view_.strides[0] : view_.itemsize;
    const auto* p = static_cast<const unsigned char*>(view_.buf) + i * stride;
    unsigned char b[8] = {};
    const size_t n = static_cast<size_t>(view_.itemsize);
    std::memcpy(b, p, n);
    if (swap_)
      for (size_t k = 0; k < n / 2; ++k) std::swap(b[k], b[n - 1 - k]);
    const bool is_signed = std::strchr("bhilqn", code_) != nullptr;
    uint64_t u = 0;
    std::memcpy(&u, b, n);  // little-endian host (checked in is_little's callers)
    if (is_signed) {
      if (n < 8 && (u >> (8 * n - 1)) & 1) u |= ~uint64_t{0} << (8 * n);
      return static_cast<int64_t>(u);
    }
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      PyErr_SetString(int_range_error, (std::string(name_) + "[" + std::to_string(i) + "]=" + std::to_string(u) +
                                        " does not fit in a signed 64-bit int")
                                           .c_str());
      throw py::error_already_set();
    }
    return static_cast<int64_t>(u);
  }

 private:
  static bool is_little() {
    const uint16_t x = 1;
    unsigned char c;
    std::memcpy(&c, &x, 1);
    return c == 1;
  }
  void release() {
    if (held_) PyBuffer_Release(&view_);
    held_ = false;
    kind_ = kNone;
  }
  const char* name_;
  Py_buffer view_{};
  bool held_ = false;
  bool swap_ = false;
  char code_ = 'B';
  Kind kind_ = kNone;
};

namespace detail {

[[noreturn]] inline void bad_item(const char* name, Py_ssize_t i, PyObject* item) {
  throw py::type_error(std::string(name) + "[" + std::to_string(i) + "] must be an int, got " + Py_TYPE(item)->tp_name +
                       " " + py_repr(item));
}

// One element of an owned snapshot (may run __index__).
inline int64_t item_value(PyObject* item, const char* name, Py_ssize_t i) {
  if (PyLong_CheckExact(item)) {
    int64_t v = 0;
    if (!exact_int_value(item, v)) raise_overflow((std::string(name) + "[" + std::to_string(i) + "]").c_str(), item);
    return v;
  }
  if (PyBool_Check(item) || PyFloat_Check(item) || !PyIndex_Check(item)) bad_item(name, i, item);
  const std::string label = std::string(name) + "[" + std::to_string(i) + "]";
  return as_int(item, label.c_str());
}

// Appends a tuple's elements; the tuple is owned by the caller and immutable,
// so its items stay alive whatever __index__ does.
inline void append_tuple(PyObject* tup, const char* name, std::vector<int64_t>& out, Py_ssize_t limit) {
  const Py_ssize_t n = std::min(PyTuple_GET_SIZE(tup), limit);
  out.reserve(out.size() + static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) out.push_back(item_value(PyTuple_GET_ITEM(tup, i), name, i));
}

}  // namespace detail

// Reads up to `limit` leading elements of a list or tuple; returns false
// (having appended nothing) when an element is not an exact int that fits,
// so that the caller falls back to a snapshot. Runs no Python code.
inline bool append_exact_ints(PyObject* p, std::vector<int64_t>& out, Py_ssize_t limit = PY_SSIZE_T_MAX) {
  const size_t start = out.size();
  const Py_ssize_t n = std::min(PyList_Check(p) ? PyList_GET_SIZE(p) : PyTuple_GET_SIZE(p), limit);
  out.reserve(start + static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* it = PyList_Check(p) ? PyList_GET_ITEM(p, i) : PyTuple_GET_ITEM(p, i);
    int64_t v = 0;
    if (!PyLong_CheckExact(it) || !exact_int_value(it, v)) {
      out.resize(start);
      return false;
    }
    out.push_back(v);
  }
  return true;
}

// An owned tuple of a sequence's items (TypeError naming `name` for str,
// bytes, mappings and non-iterables).
inline py::tuple sequence_snapshot(py::handle obj, const char* name) {
  PyObject* p = obj.ptr();
  if (PyTuple_Check(p)) return py::reinterpret_borrow<py::tuple>(obj);
  if (PyUnicode_Check(p) || PyBytes_Check(p) || PyByteArray_Check(p) || PyDict_Check(p))
    raise_type(name, "a sequence of ints", obj);
  PyObject* it = PyObject_GetIter(p);
  if (!it) {
    PyErr_Clear();
    raise_type(name, "a sequence of ints", obj);
  }
  Py_DECREF(it);
  PyObject* t = PySequence_Tuple(p);
  if (!t) throw py::error_already_set();
  return py::reinterpret_steal<py::tuple>(t);
}

// Appends the ints of a list, tuple, 1-D integer buffer or other iterable
// (read whole, as an owned snapshot) to `out`.
inline void append_ints(py::handle obj, const char* name, std::vector<int64_t>& out) {
  PyObject* p = obj.ptr();
  if (PyList_Check(p) || PyTuple_Check(p)) {
    if (append_exact_ints(p, out)) return;
    py::tuple snap = sequence_snapshot(obj, name);
    detail::append_tuple(snap.ptr(), name, out, PY_SSIZE_T_MAX);
    return;
  }
  {
    IntBuffer buf(p, name);
    if (buf.kind() == IntBuffer::kInt64) {
      out.insert(out.end(), buf.data(), buf.data() + buf.size());
      return;
    }
    if (buf.kind() == IntBuffer::kOther) {
      out.reserve(out.size() + static_cast<size_t>(buf.size()));
      for (int64_t i = 0; i < buf.size(); ++i) out.push_back(buf.at(i));
      return;
    }
  }
  py::tuple snap = sequence_snapshot(obj, name);
  detail::append_tuple(snap.ptr(), name, out, PY_SSIZE_T_MAX);
}

inline std::vector<int64_t> as_int_list(py::handle obj, const char* name) {
  std::vector<int64_t> out;
  append_ints(obj, name, out);
  return out;
}

// An int list argument as an owned vector. A caller's buffer is copied, never
// read in place: code that runs later in the call (an element's __index__, an
// engine object's getter or setter, a tier's vote) could resize or free it.
class IntSpan {
 public:
  IntSpan(py::handle obj, const char* name) { append_ints(obj, name, owned_); }
  std::span<const int64_t> span() const { return {owned_.data(), owned_.size()}; }

 private:
  std::vector<int64_t> owned_;
};

// The first min(limit, n) items of a 1-D integer buffer `buf` (n items),
// copied into `out`.
inline void copy_prefix(const IntBuffer& buf, int64_t limit, std::vector<int64_t>& out) {
  const int64_t take = std::max<int64_t>(0, std::min<int64_t>(limit, buf.size()));
  out.reserve(out.size() + static_cast<size_t>(take));
  if (buf.kind() == IntBuffer::kInt64) {
    out.insert(out.end(), buf.data(), buf.data() + take);
    return;
  }
  for (int64_t i = 0; i < take; ++i) out.push_back(buf.at(i));
}

namespace detail {

// An exact int's value read in place (CPython 3.11: up to three 30-bit digits
// directly; a prefix scan does this once per block it looks at); false for
// anything else, including exact ints past int64. Runs no Python code.
[[gnu::always_inline]] inline bool exact_int_fast(PyObject* item, int64_t& out) {
  if (!PyLong_CheckExact(item)) return false;
#if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
  const auto* v = reinterpret_cast<const PyLongObject*>(item);
  const Py_ssize_t n = Py_SIZE(v);
  const Py_ssize_t an = n < 0 ? -n : n;
  if (an <= 3 && (an < 3 || v->ob_digit[2] < 8)) {
    uint64_t x = 0;
    for (Py_ssize_t k = an; k-- > 0;) x = (x << PyLong_SHIFT) | v->ob_digit[k];
    out = n < 0 ? -static_cast<int64_t>(x) : static_cast<int64_t>(x);
    return true;
  }
#endif
  return exact_int_value(item, out);
}

}  // namespace detail

// Runs `scan(n, at)` over an int list argument read lazily: `at(i)` yields
// element i (i < n), and a scan that stops early reads only what it needs.
// A list or tuple is read in place only while the elements reached are exact
// ints (no Python code runs meanwhile, so nothing can change under the scan;
// the container is held by a strong reference); at the first other element
// the scan restarts on ints converted from an owned snapshot of the first
// `limit` elements (converting may run __index__, which then sees only the
// caller's list). With `scan_calls_python` (the scan itself may run Python
// code, a tier's vote) a list is snapshotted first. A buffer's first `limit`
// items are copied (never read in place across the scan). `scan` reads no
// element at or past `limit`.
template <class Scan>
int64_t scan_int_list(py::handle obj, const char* name, int64_t limit, Scan&& scan, bool scan_calls_python = false) {
  PyObject* p = obj.ptr();
  const bool is_list = PyList_CheckExact(p);
  auto owned_scan = [&](int64_t n, const std::vector<int64_t>& v) {
    return scan(n, [&v, name](int64_t i) {
      if (static_cast<size_t>(i) >= v.size())  // a scan reading past `limit`: a caller bug, not UB
        throw std::out_of_range(std::string(name) + ": read past the converted prefix");
      return v[static_cast<size_t>(i)];
    });
  };
  if (is_list || PyTuple_CheckExact(p)) {
    py::object keep = py::reinterpret_borrow<py::object>(obj);
    const Py_ssize_t n = is_list ? PyList_GET_SIZE(p) : PyTuple_GET_SIZE(p);
    // An element that is not an exact int reads as -1 (no hash: never found)
    // and flags the result, which is then recomputed from converted values.
    bool not_exact = scan_calls_python;
    int64_t r = 0;
    if (scan_calls_python)
      ;  // straight to the snapshot
    else if (is_list)
      r = scan(static_cast<int64_t>(n), [p, name, &not_exact](int64_t i) {
        if (i >= PyList_GET_SIZE(p)) [[unlikely]]
          throw py::value_error(std::string(name) + " changed size while it was read");
        // Scans walk down the list; fetch the next int's object early.
        if (i > 0) __builtin_prefetch(PyList_GET_ITEM(p, i - 1));
        int64_t v = -1;
        if (!detail::exact_int_fast(PyList_GET_ITEM(p, i), v)) [[unlikely]] {
          not_exact = true;
          v = -1;
        }
        return v;
      });
    else
      r = scan(static_cast<int64_t>(n), [p, &not_exact](int64_t i) {
        int64_t v = -1;
        if (!detail::exact_int_fast(PyTuple_GET_ITEM(p, i), v)) [[unlikely]] {
          not_exact = true;
          v = -1;
        }
        return v;
      });
    if (!not_exact) return r;
    py::tuple snap = sequence_snapshot(obj, name);
    std::vector<int64_t> v;
    detail::append_tuple(snap.ptr(), name, v, std::max<int64_t>(0, std::min<int64_t>(limit, n)));
    return owned_scan(static_cast<int64_t>(n), v);
  }
  std::vector<int64_t> v;
  int64_t n = -1;
  {
    IntBuffer buf(p, name);
    if (buf.kind() != IntBuffer::kNone) {
      n = buf.size();
      copy_prefix(buf, limit, v);
    }
  }
  if (n < 0) {
    append_ints(obj, name, v);  // other iterables: converted whole
    n = static_cast<int64_t>(v.size());
  }
  return owned_scan(n, v);
}

// A fixed-arity row of ints (a (slot, position, hash) tuple and the like),
// read from an owned snapshot of the row.
template <size_t N>
bool int_row(py::handle row, const char* name, int64_t (&out)[N]) {
  PyObject* p = row.ptr();
  if (!(PyTuple_Check(p) || PyList_Check(p))) return false;
  py::tuple snap = py::reinterpret_steal<py::tuple>(PySequence_Tuple(p));
  if (!snap) throw py::error_already_set();
  if (PyTuple_GET_SIZE(snap.ptr()) != static_cast<Py_ssize_t>(N)) return false;
  for (size_t k = 0; k < N; ++k) out[k] = as_int(PyTuple_GET_ITEM(snap.ptr(), static_cast<Py_ssize_t>(k)), name);
  return true;
}

inline py::list to_list(const std::vector<int64_t>& v) {
  py::list out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(v[i]));
  return out;
}

inline py::tuple to_tuple(const std::vector<int64_t>& v) {
  py::tuple out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    PyTuple_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), PyLong_FromLongLong(v[i]));
  return out;
}

}  // namespace statecache::bindings
