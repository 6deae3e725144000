// Text signatures for the functions pybind11 binds, so that inspect.signature,
// help() and editors read their parameters, and the call gate for the methods
// among them: both set on pybind11's own function objects.
//
// pybind11 writes a typed signature into the docstring's first line
// ("name(self: T, count: object = 1) -> R"), a form inspect cannot parse.
// CPython reads a builtin's text signature off its method definition's doc
// when that starts "name(self, count=1)\n--\n\n", so each function's doc is
// rewritten to that form, in place and as pybind11 itself installs it (a
// malloc'd string it frees with the function); the text after it is the one
// docs/api.md gives (docs.h). Untyped: inspect takes no
// annotations (the stub's types are .ci/stub_types.py's). A method's
// definition also gets an entry that waits its turn on the instance's call
// gate (call_gate.h), as the fast methods' trampolines do, and then runs
// pybind11's dispatcher: no second function object, no vectorcall between.
#include <Python.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/fast_call.h"

namespace statecache::bindings {

namespace py = pybind11;

namespace {

using Dispatch = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);
Dispatch pybind11_dispatch = nullptr;  // the one entry every pybind11 function has

PyObject* gated_dispatch(PyObject* record, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs > 0) {
    try {
      fast::wait_turn(args[0]);
    } catch (...) {
      fast::set_error_from_current();
      return nullptr;
    }
  }
  return pybind11_dispatch(record, args, nargs, kwnames);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// Splits at the commas outside brackets and quotes.
std::vector<std::string> split_top(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  char quote = 0;
  for (char c : s) {
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if (c == ')' || c == ']' || c == '}') {
      --depth;
    } else if (c == ',' && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
      continue;
    }
    cur += c;
  }
  if (!trim(cur).empty()) out.push_back(trim(cur));
  return out;
}

// "count: T = 1" -> "count=1"; "self: T" -> "self"; "*", "/", "*args" as is.
std::string untyped(const std::string& param) {
  size_t eq = std::string::npos;
  int depth = 0;
  for (size_t i = 0; i < param.size(); ++i) {
    const char c = param[i];
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (c == '=' && depth == 0) {
      eq = i;
      break;
    }
  }
  const std::string head = param.substr(0, eq);
  const std::string name = trim(head.substr(0, head.find(':')));
  if (eq == std::string::npos) return name;
  return name + "=" + trim(param.substr(eq + 1));
}

// The doc in text-signature form, or nullopt when the first line is not a
// single signature of `name` (then the function is left as it is).
std::optional<std::string> signed_doc(const std::string& name, const std::string& doc) {
  const size_t eol = doc.find('\n');
  const std::string first = doc.substr(0, eol);
  if (first.rfind(name + "(", 0) != 0) return std::nullopt;
  int depth = 0;
  size_t close = std::string::npos;
  for (size_t i = name.size(); i < first.size(); ++i) {
    if (first[i] == '(') ++depth;
    if (first[i] == ')' && --depth == 0) {
      close = i;
      break;
    }
  }
  if (close == std::string::npos) return std::nullopt;
  std::vector<std::string> params;
  size_t unnamed_end = 0;  // pybind11 names unnamed parameters arg0, arg1...: positional only
  for (const std::string& p : split_top(first.substr(name.size() + 1, close - name.size() - 1))) {
    params.push_back(untyped(p));
    const std::string& n = params.back();
    if (n.size() > 3 && n.rfind("arg", 0) == 0 && n.find_first_not_of("0123456789", 3) == std::string::npos)
      unnamed_end = params.size();
  }
  if (unnamed_end > 0 && std::find(params.begin(), params.end(), "/") == params.end())
    params.insert(params.begin() + static_cast<std::ptrdiff_t>(unnamed_end), "/");
  std::string sig = name + "(";
  for (size_t i = 0; i < params.size(); ++i) sig += (i ? ", " : "") + params[i];
  sig += ")\n--\n\n";
  std::string body = eol == std::string::npos ? "" : doc.substr(eol + 1);
  body.erase(0, body.find_first_not_of('\n') == std::string::npos ? body.size() : body.find_first_not_of('\n'));
  return sig + body;
}

// Gives pybind11 function `fn`, bound as `name`, its text signature (unless
// its doc is not one signature: an overload set) and, for a method, the gated
// entry. Anything else (a fast method, a slot wrapper) is left as it is.
void sign(py::handle fn, const std::string& name, bool method) {
  if (!PyCFunction_Check(fn.ptr())) return;
  PyMethodDef* def = reinterpret_cast<PyCFunctionObject*>(fn.ptr())->m_ml;
  if (def->ml_meth != reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pybind11_dispatch)) ||
      def->ml_flags != (METH_FASTCALL | METH_KEYWORDS))
    return;
  if (def->ml_doc && !py::getattr(fn, "__text_signature__", py::none()).is_none()) return;  // done
  if (def->ml_doc)
    if (std::optional<std::string> text = signed_doc(name, def->ml_doc)) {
      char* doc = strdup(text->c_str());
      if (!doc) throw std::bad_alloc();
      std::free(const_cast<char*>(def->ml_doc));
      def->ml_doc = doc;
    }
  if (method) def->ml_meth = reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&gated_dispatch));
}

void sign_class(py::handle cls) {
  // __dict__ is a mappingproxy: iterate a copy.
  const py::dict members = py::getattr(cls, "__dict__").attr("copy")();
  for (auto [key, value] : members) {
    const std::string name = py::cast<std::string>(key);
    if (PyInstanceMethod_Check(value.ptr()))
      sign(PyInstanceMethod_GET_FUNCTION(value.ptr()), name, /*method=*/true);
    else if (Py_IS_TYPE(value.ptr(), &PyStaticMethod_Type))
      sign(value.attr("__func__"), name, /*method=*/false);
  }
}

}  // namespace

void add_text_signatures(py::module_& m) {
  if (!pybind11_dispatch) {
    py::cpp_function probe([] {});
    pybind11_dispatch = reinterpret_cast<Dispatch>(reinterpret_cast<void (*)()>(PyCFunction_GET_FUNCTION(probe.ptr())));
    if (PyCFunction_GET_FLAGS(probe.ptr()) != (METH_FASTCALL | METH_KEYWORDS))
      throw std::logic_error("pybind11 functions are not METH_FASTCALL | METH_KEYWORDS: signatures.cpp needs updating");
  }
  const py::str module_name = m.attr("__name__");
  const py::dict members = py::reinterpret_borrow<py::dict>(m.attr("__dict__"));
  for (auto [key, value] : members) {
    if (PyType_Check(value.ptr())) {
      if (py::getattr(value, "__module__", py::none()).equal(module_name)) sign_class(value);
    } else {
      sign(value, py::cast<std::string>(key), /*method=*/false);
    }
  }
}

}  // namespace statecache::bindings
