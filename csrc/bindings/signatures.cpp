// Text signatures for the functions pybind11 binds, so that inspect.signature,
// help() and editors read their parameters.
//
// pybind11 writes a typed signature into the docstring's first line
// ("name(self: T, count: object = 1) -> R"), a form inspect cannot parse, and
// its function objects take no attributes. Each such function (module level,
// method or static method of one of our classes) is re-exposed through a
// forwarding builtin whose doc starts with CPython's text-signature form
// ("name($fn, self, count=1)\n--\n\n"); the forwarder holds the pybind11
// function and passes every call through unchanged. Only public attributes
// (__doc__, __text_signature__) of the pybind11 functions are read.
#include <Python.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/fast_call.h"

namespace statecache::bindings {

namespace py = pybind11;

namespace {

PyObject* forward(PyObject* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return PyObject_Vectorcall(fn, args, static_cast<size_t>(nargs), kwnames);
}

// A method's forwarder also waits its turn on the instance's call gate
// (call_gate.h), as the fast methods' trampolines do.
PyObject* forward_method(PyObject* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs > 0) {
    try {
      fast::wait_turn(args[0]);
    } catch (...) {
      fast::set_error_from_current();
      return nullptr;
    }
  }
  return PyObject_Vectorcall(fn, args, static_cast<size_t>(nargs), kwnames);
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
  std::string sig = name + "($fn";
  for (const std::string& p : params) sig += ", " + p;
  sig += ")\n--\n\n";
  std::string body = eol == std::string::npos ? "" : doc.substr(eol + 1);
  body.erase(0, body.find_first_not_of('\n') == std::string::npos ? body.size() : body.find_first_not_of('\n'));
  return sig + body;
}

// The forwarding builtin for pybind11 function `fn` bound as `name`, or a
// null object when `fn` needs none (it has a text signature, or its doc is
// not one signature: an overload set).
py::object with_text_signature(py::handle fn, const std::string& name, bool method = false) {
  if (!PyCFunction_Check(fn.ptr())) return {};
  if (!py::getattr(fn, "__text_signature__", py::none()).is_none()) return {};
  py::object doc = py::getattr(fn, "__doc__", py::none());
  if (!py::isinstance<py::str>(doc)) return {};
  std::optional<std::string> text = signed_doc(name, doc.cast<std::string>());
  if (!text) return {};
  // Definitions live as long as the functions: never freed.
  auto* def_name = new std::string(name);
  auto* def_doc = new std::string(std::move(*text));
  auto* def =
      new PyMethodDef{def_name->c_str(),
                      reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(method ? &forward_method : &forward)),
                      METH_FASTCALL | METH_KEYWORDS, def_doc->c_str()};
  PyObject* f = PyCFunction_New(def, fn.ptr());  // holds `fn` as its __self__
  if (!f) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(f);
}

void sign_class(py::handle cls) {
  const py::dict members = py::reinterpret_borrow<py::dict>(py::getattr(cls, "__dict__")).attr("copy")();
  for (auto [key, value] : members) {
    const std::string name = py::cast<std::string>(key);
    if (PyInstanceMethod_Check(value.ptr())) {
      py::object w = with_text_signature(PyInstanceMethod_GET_FUNCTION(value.ptr()), name, /*method=*/true);
      if (!w) continue;
      PyObject* m = PyInstanceMethod_New(w.ptr());
      if (!m) throw py::error_already_set();
      py::setattr(cls, key, py::reinterpret_steal<py::object>(m));
    } else if (py::isinstance(value, py::module_::import("builtins").attr("staticmethod"))) {
      py::object w = with_text_signature(value.attr("__func__"), name);
      if (!w) continue;
      PyObject* s = PyStaticMethod_New(w.ptr());
      if (!s) throw py::error_already_set();
      py::setattr(cls, key, py::reinterpret_steal<py::object>(s));
    }
  }
}

}  // namespace

void add_text_signatures(py::module_& m) {
  const py::str module_name = m.attr("__name__");
  const py::dict members = py::reinterpret_borrow<py::dict>(m.attr("__dict__")).attr("copy")();
  for (auto [key, value] : members) {
    if (PyType_Check(value.ptr())) {
      if (py::getattr(value, "__module__", py::none()).equal(module_name)) sign_class(value);
    } else if (py::object w = with_text_signature(value, py::cast<std::string>(key))) {
      m.attr(key) = w;
    }
  }
}

}  // namespace statecache::bindings
