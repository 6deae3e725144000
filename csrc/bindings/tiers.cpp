// The host tier's arena bookkeeping (csrc/core/host_arena.h). Keys are bytes
// (the tier's full key); the entries' memory is a buffer the caller owns.
#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "bindings/docs.h"
#include "bindings/eviction.h"
#include "bindings/fast_call.h"
#include "core/host_arena.h"

namespace statecache::bindings {

namespace {

std::string as_key(py::handle obj, const char* name) {
  if (PyBytes_Check(obj.ptr())) return py::reinterpret_borrow<py::bytes>(obj).cast<std::string>();
  if (PyUnicode_Check(obj.ptr())) return as_text(obj, name);
  raise_type(name, "bytes or str", obj);
}

// A list or tuple of keys (each bytes or str), read whole before anything
// changes; errors name the item ("keys[3]"). Runs no Python code.
std::vector<std::string> as_keys(py::handle obj, const char* name) {
  PyObject* p = obj.ptr();
  if (!PyList_Check(p) && !PyTuple_Check(p)) raise_type(name, "a list of bytes or str", obj);
  const Py_ssize_t n = PyList_Check(p) ? PyList_GET_SIZE(p) : PyTuple_GET_SIZE(p);
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* it = PyList_Check(p) ? PyList_GET_ITEM(p, i) : PyTuple_GET_ITEM(p, i);
    if (PyBytes_Check(it)) {
      out.emplace_back(PyBytes_AS_STRING(it), static_cast<size_t>(PyBytes_GET_SIZE(it)));
      continue;
    }
    const std::string item = std::string(name) + "[" + std::to_string(i) + "]";
    if (!PyUnicode_Check(it)) raise_type(item.c_str(), "bytes or str", py::handle(it));
    out.push_back(as_text(py::handle(it), item.c_str()));
  }
  return out;
}

int as_class(const HostArena& a, py::handle obj) {
  const int64_t k = as_int(obj, "klass");
  if (k < 0 || k >= a.num_classes())
    throw py::index_error("klass=" + std::to_string(k) + " out of range [0, " + std::to_string(a.num_classes()) + ")");
  return static_cast<int>(k);
}

py::list to_py_entries(const std::vector<int32_t>& v) {
  py::list out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = py::int_(v[i]);
  return out;
}

// Budgets per class: an int >= 0 caps the class, None shares the arena.
std::vector<int64_t> as_budgets(py::handle obj) {
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr()))
    raise_type("class_budget_bytes", "a list of int or None", obj);
  std::vector<int64_t> out;
  for (py::handle b : obj) {
    if (b.is_none()) {
      out.push_back(HostArena::kShared);
      continue;
    }
    const int64_t v = as_int(b, "class_budget_bytes");
    if (v < 0) bad_argument("class_budget_bytes", v, "must be >= 0, or None for no cap");
    out.push_back(v);
  }
  return out;
}

py::list to_py_keys(const std::vector<std::string>& keys) {
  py::list out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = py::bytes(keys[i]);
  return out;
}

// The arena's parameters, converted by the table methods (fast::Conv below).
struct Key {  // bytes or str
  std::string s;
};
struct Keys {  // a list or tuple of bytes or str
  std::vector<std::string> v;
};
struct Meta {  // bytes
  std::string s;
};
struct Klass {  // a class of the arena
  int k;
};

// ---- the methods, as the table calls them ----------------------------------

py::object ranking(const HostArena& a) {
  return py::str(a.eviction_model().kind == EvictionCostModel::Kind::kLru ? "lru" : "cost");
}

py::object class_stats(const HostArena& a, Klass klass) {
  const auto& c = a.class_stats(klass.k);
  py::dict d;
  d["budget_entries"] = c.budget_entries;
  d["used_entries"] = c.used_entries;
  d["values"] = c.values;
  d["evictions"] = c.evictions;
  d["refused"] = c.refused;
  d["capped"] = a.capped(klass.k);
  return d;
}

bool refile(HostArena& a, Key key, int64_t position) { return a.refile(key.s, position); }

py::object victims(const HostArena& a, Klass klass, int64_t count) {
  auto v = a.victims(klass.k, count);
  return v ? py::object(to_py_keys(*v)) : py::none();
}

py::object allocate(HostArena& a, Key key, Klass klass, int64_t count, int64_t nbytes, int64_t position) {
  std::vector<std::string> evicted;
  auto e = a.allocate(key.s, klass.k, count, nbytes, position, &evicted);
  return e ? py::object(py::make_tuple(to_py_entries(*e), to_py_keys(evicted))) : py::none();
}

py::object allocate_many(HostArena& a, Keys keys, Klass klass, std::vector<int64_t> counts, std::vector<int64_t> nbytes,
                         std::vector<int64_t> positions) {
  const auto got = a.allocate_many(keys.v, klass.k, counts, nbytes, positions, nullptr);
  py::list out(got.size());
  for (size_t i = 0; i < got.size(); ++i) out[i] = got[i] ? py::object(to_py_entries(*got[i])) : py::none();
  return out;
}

void seal(HostArena& a, Key key, Meta meta) { a.seal(key.s, std::move(meta.s)); }
void seal_many(HostArena& a, Keys keys, Keys metas) { a.seal_many(keys.v, std::move(metas.v)); }
bool remove(HostArena& a, Key key) { return a.remove(key.s); }
bool contains(const HostArena& a, Key key) { return a.contains(key.s); }

py::object contains_many(HostArena& a, Keys keys, bool touch) {
  const std::vector<bool> got = a.contains_many(keys.v, touch);
  py::list out(got.size());
  for (size_t i = 0; i < got.size(); ++i) out[i] = py::bool_(got[i]);
  return out;
}

int64_t refile_many(HostArena& a, Keys keys, std::vector<int64_t> positions) {
  return a.refile_many(keys.v, positions);
}

py::object lookup(HostArena& a, Key key, bool touch) {
  const HostArena::Value* v = a.lookup(key.s, touch);
  if (v == nullptr) return py::none();
  return py::make_tuple(to_py_entries(v->entries), v->nbytes, py::bytes(v->meta), v->klass);
}

void pin(HostArena& a, Key key) { a.pin(key.s); }
void unpin(HostArena& a, Key key) { a.unpin(key.s); }
int64_t pins(const HostArena& a, Key key) { return a.pins(key.s); }
py::object keys(const HostArena& a) { return to_py_keys(a.keys()); }

}  // namespace

namespace fast {

template <>
struct Conv<Key> {
  template <class T>
  static Key get(PyObject* o, const Params& p, size_t i, T&) {
    return {as_key(py::handle(o), p.cnames[i])};
  }
};
template <>
struct Conv<Keys> {
  template <class T>
  static Keys get(PyObject* o, const Params& p, size_t i, T&) {
    return {as_keys(py::handle(o), p.cnames[i])};
  }
};
template <>
struct Conv<Meta> {
  template <class T>
  static Meta get(PyObject* o, const Params& p, size_t i, T&) {
    if (!PyBytes_Check(o)) raise_type(p.cnames[i], "bytes", py::handle(o));
    return {std::string(PyBytes_AS_STRING(o), static_cast<size_t>(PyBytes_GET_SIZE(o)))};
  }
};
template <>
struct Conv<Klass> {
  static Klass get(PyObject* o, const Params&, size_t, const HostArena& a) { return {as_class(a, py::handle(o))}; }
};

}  // namespace fast

void bind_tiers(py::module_& m) {
  py::class_<HostArena> arena(m, "HostArena", STATECACHE_GUARDED(HostArena), doc("HostArena"));
  arena.def(py::init([](py::handle entry_bytes, py::handle capacity_bytes, py::handle budgets, py::handle ranking_obj) {
              const std::string ranking = as_text(ranking_obj, "ranking");
              EvictionCostModel m = HostArena::cost_model();
              if (ranking == "lru")
                m.kind = EvictionCostModel::Kind::kLru;
              else if (ranking != "cost")
                throw py::value_error("ranking=" + py_repr(py::str(ranking)) + " must be 'lru' or 'cost'");
              return new HostArena(as_int(entry_bytes, "entry_bytes"), as_int(capacity_bytes, "capacity_bytes"),
                                   as_budgets(budgets), m);
            }),
            py::arg("entry_bytes"), py::arg("capacity_bytes"), py::arg("class_budget_bytes"),
            py::arg("ranking") = "cost", doc(arena, "__init__"));
  fast::attr<&HostArena::entry_bytes>(arena, "entry_bytes");
  fast::attr<&HostArena::num_entries>(arena, "num_entries");
  fast::attr<&HostArena::num_free>(arena, "num_free");
  fast::attr<&HostArena::num_classes>(arena, "num_classes");
  fast::attr<&ranking>(arena, "ranking");
  fast::method<&class_stats>(arena, "class_stats", {"klass"});
  fast::attr<&HostArena::kv_bytes_per_position>(arena, "kv_bytes_per_position");
  arena.def(
      "set_kv_bytes_per_position", [](HostArena& a, double bytes) { a.set_kv_bytes_per_position(bytes); },
      py::arg("bytes"), doc(arena, "set_kv_bytes_per_position"));
  fast::method<&refile>(arena, "refile", {"key", "position"});
  fast::method<&victims>(arena, "victims", {"klass", "count"});
  fast::method<&allocate>(arena, "allocate", {"key", "klass", "count", "nbytes", "position"});
  fast::method<&allocate_many>(arena, "allocate_many", {"keys", "klass", "counts", "nbytes", "positions"});
  fast::method<&seal>(arena, "seal", {"key", "meta"});
  fast::method<&seal_many>(arena, "seal_many", {"keys", "metas"});
  fast::method<&remove>(arena, "remove", {"key"});
  fast::method<&contains>(arena, "contains", {"key"});
  fast::method<&contains_many>(arena, "contains_many", {"keys", "touch=False"});
  fast::method<&refile_many>(arena, "refile_many", {"keys", "positions"});
  fast::attr<&HostArena::generation>(arena, "generation");
  arena
      .def("__contains__",
           [](const HostArena& a, py::handle key) {
             return PyBytes_Check(key.ptr()) || PyUnicode_Check(key.ptr()) ? a.contains(as_key(key, "key")) : false;
           })
      .def("__len__", [](const HostArena& a) { return a.keys().size(); });
  fast::method<&lookup>(arena, "lookup", {"key", "touch=True"});
  fast::method<&pin>(arena, "pin", {"key"});
  fast::method<&unpin>(arena, "unpin", {"key"});
  fast::method<&pins>(arena, "pins", {"key"});
  fast::method<&keys>(arena, "keys", {});
  arena.def("check_consistency", &HostArena::check_consistency, doc(arena, "check_consistency"));
  def_eviction_methods(arena, [](HostArena& a) -> HostArena& { return a; });
}

}  // namespace statecache::bindings
