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
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/hash_form.h"

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

// ---- hashes (docs/contract.md, "Words") ----------------------------------

// Whether any of d[0:n] is a negative hash other than -1 (v & (v + 1) has
// its top bit set exactly for those): one pass the compiler vectorises.
inline bool has_signed_form(const int64_t* d, int64_t n) {
  uint64_t acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t v = static_cast<uint64_t>(d[i]);
    acc |= v & (v + 1);
  }
  return (acc >> 63) != 0;
}
//
// A hash argument is an int in [-2**63, 2**64): the library keys by its
// 64-bit pattern, and the object it is given to remembers the form (signed
// or unsigned) of a pattern with its top bit set (core/hash_form.h), so that
// it reads back as the int the caller gave. -1 is "no hash"; 2**64 - 1, the
// same bits unsigned, is refused.

[[noreturn]] inline void minus_one_unsigned(const char* name) {
  throw py::value_error(std::string(name) +
                        "=18446744073709551615 is 2**64 - 1, the unsigned spelling of -1 (\"no hash\"); "
                        "a hash is an int in [-2**63, 2**64) other than 2**64 - 1");
}

[[noreturn]] inline void raise_hash_range(const char* name, py::handle got) {
  PyErr_Clear();
  PyErr_SetString(int_range_error, (std::string(name) + "=" + py_repr(got) +
                                    " does not fit in 64 bits; a hash is an int in [-2**63, 2**64)")
                                       .c_str());
  throw py::error_already_set();
}

// An int object's hash pattern and form; false (no error left set) when it
// lies outside [-2**63, 2**64) or is 2**64 - 1. Runs no Python code.
inline bool exact_hash_value(PyObject* p, int64_t& out, HashForm::Kind& kind) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
  if (overflow == 0) {
    out = v;
    kind = v < -1 ? HashForm::kSigned : HashForm::kUnset;
    return true;
  }
  if (overflow < 0) return false;
  const unsigned long long u = PyLong_AsUnsignedLongLong(p);
  if (u == ~0ULL) {  // an error, or 2**64 - 1
    PyErr_Clear();
    return false;
  }
  out = static_cast<int64_t>(u);
  kind = HashForm::kUnsigned;
  return true;
}

// The pattern of the hash argument `obj` (an int, not a bool, or an
// __index__ integer), its form noted in `form`: OverflowError outside
// [-2**63, 2**64), ValueError for 2**64 - 1 and for the other form of an
// object's hashes, TypeError for a non-int; all naming `name`.
inline int64_t as_hash(py::handle obj, const char* name, HashForm& form) {
  PyObject* p = obj.ptr();
  py::object idx;
  if (!PyLong_CheckExact(p)) {
    if (PyBool_Check(p) || PyFloat_Check(p) || !PyIndex_Check(p)) raise_type(name, "an int", obj);
    idx = py::reinterpret_steal<py::object>(PyNumber_Index(p));  // may run Python code; nothing is held
    if (!idx) throw py::error_already_set();
    if (!PyLong_Check(idx.ptr())) raise_type(name, "an int", obj);
    p = idx.ptr();
  }
  int64_t bits = 0;
  HashForm::Kind kind = HashForm::kUnset;
  if (!exact_hash_value(p, bits, kind)) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(p);
    if (u == ~0ULL && !PyErr_Occurred()) minus_one_unsigned(name);
    raise_hash_range(name, obj);
  }
  form.note(name, bits, kind);
  return bits;
}

// A hash as the int its object's form writes it.
inline PyObject* hash_to_py(int64_t bits, const HashForm& form) {
  if (form.is_unsigned() && HashForm::has_form(bits)) return PyLong_FromUnsignedLongLong(static_cast<uint64_t>(bits));
  return PyLong_FromLongLong(bits);
}
inline py::object hash_object(int64_t bits, const HashForm& form) {
  PyObject* o = hash_to_py(bits, form);
  if (!o) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

// Whether `key` is a hash as `form` writes it (a mapping keyed by such ints
// holds no other key), and its pattern. An int that equals one (a float 5.0)
// counts, as in a dict. Runs no Python code, raises nothing.
inline bool hash_key(py::handle key, const HashForm& form, int64_t& bits) {
  PyObject* p = key.ptr();
  HashForm::Kind kind = HashForm::kUnset;
  if (PyLong_Check(p)) {
    if (!exact_hash_value(p, bits, kind)) return false;
  } else if (PyFloat_Check(p)) {
    const double x = PyFloat_AS_DOUBLE(p);
    if (!(x == static_cast<double>(static_cast<int64_t>(x))) || x < -9.2e18 || x > 9.2e18) return false;
    bits = static_cast<int64_t>(x);
    kind = bits < -1 ? HashForm::kSigned : HashForm::kUnset;
  } else {
    return false;
  }
  if (kind == HashForm::kUnset) return true;
  return (kind == HashForm::kUnsigned) == form.is_unsigned();
}

// A 1-D buffer of integers (NumPy integer arrays, array.array('q'), ...).
// `kind()`: kNone when the object exports no buffer (or a non-numeric one,
// e.g. NumPy object arrays, which are read as sequences instead), kInt64 when
// its items are native int64 and contiguous (read in place), kOther for other
// integer layouts. Float / bool / complex buffers raise TypeError naming the
// argument; more than one dimension raises ValueError.
class IntBuffer {
 public:
  enum Storage { kNone, kInt64, kOther };
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

  Storage kind() const { return kind_; }
  int64_t size() const { return static_cast<int64_t>(view_.shape ? view_.shape[0] : view_.len / view_.itemsize); }
  // kInt64 only.
  const int64_t* data() const { return static_cast<const int64_t*>(view_.buf); }
  // Item i as a hash (convert.h, "hashes"): any 64-bit pattern but an
  // unsigned 2**64 - 1; `kind` is its form when its top bit is set.
  int64_t hash_at(int64_t i, HashForm::Kind& kind) const {
    const bool is_signed = std::strchr("bhilqn", code_) != nullptr;
    if (is_signed || view_.itemsize < 8) {
      const int64_t v = at(i);
      kind = v < -1 ? HashForm::kSigned : HashForm::kUnset;
      return v;
    }
    uint64_t u = 0;
    std::memcpy(&u, static_cast<const unsigned char*>(view_.buf) + i * (view_.strides ? view_.strides[0] : 8), 8);
    if (swap_) u = __builtin_bswap64(u);
    if (u == ~uint64_t{0}) minus_one_unsigned((std::string(name_) + "[" + std::to_string(i) + "]").c_str());
    kind = u >> 63 ? HashForm::kUnsigned : HashForm::kUnset;
    return static_cast<int64_t>(u);
  }
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
  Storage kind_ = kNone;
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

namespace detail {

// Records element i's form; ValueError naming "name[i]" on a conflict. Off
// the hot path: most hashes have no form, and the rest repeat the object's.
[[gnu::cold, gnu::noinline]] inline void note_item(HashForm& form, const char* name, Py_ssize_t i, int64_t bits,
                                                   HashForm::Kind kind) {
  if (kind == HashForm::kUnset || form.kind() == kind) return;
  const std::string label = std::string(name) + "[" + std::to_string(i) + "]";
  form.note(label.c_str(), bits, kind);
}

inline int64_t hash_item(PyObject* item, const char* name, Py_ssize_t i, HashForm& form) {
  int64_t bits = 0;
  HashForm::Kind kind = HashForm::kUnset;
  if (PyLong_CheckExact(item) && exact_hash_value(item, bits, kind)) {
    note_item(form, name, i, bits, kind);
    return bits;
  }
  const std::string label = std::string(name) + "[" + std::to_string(i) + "]";
  return as_hash(item, label.c_str(), form);
}

// Appends the first `limit` hashes of an owned tuple (see append_tuple).
inline void append_hash_tuple(PyObject* tup, const char* name, std::vector<int64_t>& out, Py_ssize_t limit,
                              HashForm& form) {
  const Py_ssize_t n = std::min(PyTuple_GET_SIZE(tup), limit);
  out.reserve(out.size() + static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) out.push_back(hash_item(PyTuple_GET_ITEM(tup, i), name, i, form));
}

}  // namespace detail

// The first min(limit, n) items of a 1-D integer buffer (n items) as hashes,
// their forms noted.
inline void copy_hash_prefix(const IntBuffer& buf, const char* name, int64_t limit, std::vector<int64_t>& out,
                             HashForm& form) {
  const int64_t take = std::max<int64_t>(0, std::min<int64_t>(limit, buf.size()));
  out.reserve(out.size() + static_cast<size_t>(take));
  if (buf.kind() == IntBuffer::kInt64) {  // signed: negative patterns are the signed form
    const int64_t* d = buf.data();
    if (has_signed_form(d, take))
      for (int64_t i = 0; i < take; ++i)
        if (d[i] < -1) {
          detail::note_item(form, name, static_cast<Py_ssize_t>(i), d[i], HashForm::kSigned);
          break;
        }
    out.insert(out.end(), d, d + take);
    return;
  }
  for (int64_t i = 0; i < take; ++i) {
    HashForm::Kind kind = HashForm::kUnset;
    const int64_t bits = buf.hash_at(i, kind);
    detail::note_item(form, name, static_cast<Py_ssize_t>(i), bits, kind);
    out.push_back(bits);
  }
}

// append_ints for a list of hashes (the whole range, forms noted in `form`).
inline void append_hashes(py::handle obj, const char* name, std::vector<int64_t>& out, HashForm& form) {
  PyObject* p = obj.ptr();
  if (!(PyList_Check(p) || PyTuple_Check(p))) {
    IntBuffer buf(p, name);
    if (buf.kind() != IntBuffer::kNone) {
      copy_hash_prefix(buf, name, buf.size(), out, form);
      return;
    }
  }
  // Lists and tuples too: an owned snapshot (an element's __index__ may
  // change the caller's list; exact ints are read without calling Python).
  py::tuple snap = sequence_snapshot(obj, name);
  detail::append_hash_tuple(snap.ptr(), name, out, PY_SSIZE_T_MAX, form);
}

inline std::vector<int64_t> as_hash_list(py::handle obj, const char* name, HashForm& form) {
  std::vector<int64_t> out;
  append_hashes(obj, name, out, form);
  return out;
}

// Hashes as a list or tuple of the ints their object's form writes.
inline py::list to_hash_list(const std::vector<int64_t>& v, const HashForm& form) {
  py::list out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    PyObject* o = hash_to_py(v[i], form);
    if (!o) throw py::error_already_set();
    PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), o);
  }
  return out;
}

// An int list argument as an owned vector. A caller's buffer is copied, never
// read in place: code that runs later in the call (an element's __index__, an
// engine object's getter or setter, a tier's vote) could resize or free it.
class IntSpan {
 public:
  IntSpan(py::handle obj, const char* name) { append_ints(obj, name, owned_); }
  // A list of hashes, their forms noted in `form`.
  IntSpan(py::handle obj, const char* name, HashForm& form) { append_hashes(obj, name, owned_, form); }
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

// exact_int_fast for a hash: the whole [-2**63, 2**64) range but 2**64 - 1,
// and its form.
[[gnu::always_inline]] inline bool exact_hash_fast(PyObject* item, int64_t& out, HashForm::Kind& kind) {
  if (!PyLong_CheckExact(item)) return false;
#if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
  const auto* v = reinterpret_cast<const PyLongObject*>(item);
  const Py_ssize_t n = Py_SIZE(v);
  const Py_ssize_t an = n < 0 ? -n : n;
  if (an <= 3 && (an < 3 || v->ob_digit[2] < 16)) {  // below 2**64
    uint64_t x = 0;
    for (Py_ssize_t k = an; k-- > 0;) x = (x << PyLong_SHIFT) | v->ob_digit[k];
    if (n < 0) {
      if (x > (uint64_t{1} << 63)) return false;
      out = static_cast<int64_t>(~x + 1);  // -x, INT64_MIN included
      kind = out < -1 ? HashForm::kSigned : HashForm::kUnset;
      return true;
    }
    if (x == ~uint64_t{0}) return false;
    out = static_cast<int64_t>(x);
    kind = x >> 63 ? HashForm::kUnsigned : HashForm::kUnset;
    return true;
  }
#endif
  return exact_hash_value(item, out, kind);
}

}  // namespace detail

// Runs `visit(n, at)` over a hash list argument read lazily: `at(i)` yields
// hash i (i < n), and a visit that stops early reads only what it needs; the
// forms of the hashes it reads are noted in `form`.
// A list or tuple is read in place only while the elements reached are exact
// ints (no Python code runs meanwhile, so nothing can change under the scan;
// the container is held by a strong reference); at the first other element
// the scan restarts on hashes converted from an owned snapshot of the first
// `limit` elements (converting may run __index__, which then sees only the
// caller's list). With `scan_calls_python` (the scan itself may run Python
// code, a tier's vote) a list is snapshotted first. A buffer's first `limit`
// items are copied (never read in place across the scan). `visit` reads no
// element at or past `limit`.
template <class Visit>
int64_t scan_int_list(py::handle obj, const char* name, int64_t limit, HashForm& form, Visit&& visit,
                      bool scan_calls_python = false) {
  PyObject* p = obj.ptr();
  const bool is_list = PyList_CheckExact(p);
  auto owned_scan = [&](int64_t n, const std::vector<int64_t>& v) {
    return visit(n, [&v, name](int64_t i) {
      if (static_cast<size_t>(i) >= v.size())  // a scan reading past `limit`: a caller bug, not UB
        throw std::out_of_range(std::string(name) + ": read past the converted prefix");
      return v[static_cast<size_t>(i)];
    });
  };
  if (is_list || PyTuple_CheckExact(p)) {
    py::object keep = py::reinterpret_borrow<py::object>(obj);
    const Py_ssize_t n = is_list ? PyList_GET_SIZE(p) : PyTuple_GET_SIZE(p);
    // An element that is not an exact int in range reads as -1 (no hash:
    // never found) and flags the result, which is then recomputed from
    // converted values (raising for it there).
    bool not_exact = scan_calls_python;
    int64_t r = 0;
    auto hash_of = [&form, name, &not_exact](PyObject* item, int64_t i) {
      int64_t v = -1;
      HashForm::Kind kind = HashForm::kUnset;
      if (!detail::exact_hash_fast(item, v, kind)) [[unlikely]] {
        not_exact = true;
        return int64_t{-1};
      }
      if (kind != HashForm::kUnset && kind != form.kind()) [[unlikely]]
        detail::note_item(form, name, static_cast<Py_ssize_t>(i), v, kind);
      return v;
    };
    if (scan_calls_python)
      ;  // straight to the snapshot
    else if (is_list)
      r = visit(static_cast<int64_t>(n), [p, name, &hash_of](int64_t i) {
        if (i >= PyList_GET_SIZE(p)) [[unlikely]]
          throw py::value_error(std::string(name) + " changed size while it was read");
        // Scans walk down the list; fetch the next int's object early.
        if (i > 0) __builtin_prefetch(PyList_GET_ITEM(p, i - 1));
        return hash_of(PyList_GET_ITEM(p, i), i);
      });
    else
      r = visit(static_cast<int64_t>(n), [p, &hash_of](int64_t i) { return hash_of(PyTuple_GET_ITEM(p, i), i); });
    if (!not_exact) return r;
    py::tuple snap = sequence_snapshot(obj, name);
    std::vector<int64_t> v;
    detail::append_hash_tuple(snap.ptr(), name, v, std::max<int64_t>(0, std::min<int64_t>(limit, n)), form);
    return owned_scan(static_cast<int64_t>(n), v);
  }
  std::vector<int64_t> v;
  int64_t n = -1;
  {
    IntBuffer buf(p, name);
    if (buf.kind() == IntBuffer::kInt64 && !scan_calls_python) {
      // No Python code runs before the scan ends: read it where it is (the
      // export is held), noting forms as they are read.
      const int64_t* d = buf.data();
      const int64_t readable = std::max<int64_t>(0, std::min<int64_t>(limit, buf.size()));
      if (has_signed_form(d, readable))  // the readable prefix's form
        for (int64_t i = 0; i < readable; ++i)
          if (d[i] < -1) {
            detail::note_item(form, name, static_cast<Py_ssize_t>(i), d[i], HashForm::kSigned);
            break;
          }
      return visit(buf.size(), [d, readable, name](int64_t i) {
        if (i >= readable) [[unlikely]]
          throw std::out_of_range(std::string(name) + ": read past the converted prefix");
        return d[i];
      });
    }
    if (buf.kind() != IntBuffer::kNone) {
      n = buf.size();
      copy_hash_prefix(buf, name, limit, v, form);
    }
  }
  if (n < 0) {
    append_hashes(obj, name, v, form);  // other iterables: converted whole
    n = static_cast<int64_t>(v.size());
  }
  return owned_scan(n, v);
}

// Rows of exactly N ints, the last one a hash (its form noted in `form`),
// as the reference unpacks them (`for slot, pos, h in rows`): a row of
// another length is a ValueError, a row that is not a sequence or an item
// that is not an int a TypeError, each naming `name[i]`. Read from owned
// snapshots, all before the caller changes anything.
template <size_t N>
std::vector<std::array<int64_t, N>> hash_rows(py::handle obj, const char* name, const char* shape, HashForm& form) {
  py::tuple rows = sequence_snapshot(obj, name);
  std::vector<std::array<int64_t, N>> out;
  out.reserve(static_cast<size_t>(PyTuple_GET_SIZE(rows.ptr())));
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(rows.ptr()); ++i) {
    PyObject* row = PyTuple_GET_ITEM(rows.ptr(), i);
    const std::string label = std::string(name) + "[" + std::to_string(i) + "]";
    py::tuple items = sequence_snapshot(row, label.c_str());
    if (PyTuple_GET_SIZE(items.ptr()) != static_cast<Py_ssize_t>(N))
      throw py::value_error(label + " must be " + shape + ", got " + py_repr(row));
    std::array<int64_t, N> r{};
    for (size_t k = 0; k < N; ++k) {
      PyObject* item = PyTuple_GET_ITEM(items.ptr(), static_cast<Py_ssize_t>(k));
      r[k] = k + 1 == N ? as_hash(item, label.c_str(), form) : as_int(item, label.c_str());
    }
    out.push_back(r);
  }
  return out;
}

// The midstep calls' rows (the slot pool's and the coordinator's), as each
// core's reservation type `R`.
template <class R>
std::vector<R> as_reservations(py::handle obj, HashForm& form) {
  std::vector<R> out;
  for (const auto& r : hash_rows<3>(obj, "reservations", "a (slot, position, hash) tuple", form))
    out.push_back(R{r[0], r[1], r[2]});
  return out;
}
inline std::vector<std::pair<int64_t, int64_t>> as_positions(py::handle obj, HashForm& form) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& r : hash_rows<2>(obj, "positions", "a (position, hash) pair", form)) out.emplace_back(r[0], r[1]);
  return out;
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
