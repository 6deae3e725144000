// Chained token-block hashes: one call per sequence, not per block.
#include <pybind11/numpy.h>

#include <cstring>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "bindings/docs.h"
#include "core/block_hash.h"

namespace statecache::bindings {

namespace {

// Hashing a token list this long takes a few microseconds; below it, handing
// the GIL to another thread costs more than it frees, and getting it back can
// wait out that thread's switch interval (a scheduler hook pays that).
constexpr size_t kReleaseGilFromTokens = 4096;

template <class F>
auto hash_tokens(const std::vector<int64_t>& tokens, F&& hash) {
  if (tokens.size() < kReleaseGilFromTokens) return hash();
  py::gil_scoped_release nogil;
  return hash();
}

PrefixKey as_prefix_key(py::handle obj, const char* name) {
  if (!PyBytes_Check(obj.ptr())) raise_type(name, "16 bytes", obj);
  const std::string s = py::reinterpret_borrow<py::bytes>(obj).cast<std::string>();
  if (s.size() != 16) throw py::value_error(std::string(name) + " must be 16 bytes, got " + std::to_string(s.size()));
  PrefixKey k;
  std::memcpy(&k.lo, s.data(), 8);
  std::memcpy(&k.hi, s.data() + 8, 8);
  return k;
}

std::string salt_bytes(py::handle salt) {
  if (salt.is_none()) return {};
  if (PyBytes_Check(salt.ptr())) return py::reinterpret_borrow<py::bytes>(salt).cast<std::string>();
  if (PyUnicode_Check(salt.ptr())) return as_text(salt, "salt");
  raise_type("salt", "bytes, str or None", salt);
}

}  // namespace

void bind_hashing(pybind11::module_& m) {
  m.def(
      "chain_block_hashes",
      [](py::handle token_ids, py::handle block_size, py::handle parent_hash, py::handle numpy_obj) -> py::object {
        const bool as_numpy = as_bool(numpy_obj, "as_numpy");
        const int64_t bs = as_int(block_size, "block_size");
        if (bs <= 0) throw py::value_error("block_size=" + std::to_string(bs) + " must be > 0");
        // A parent given unsigned (an unsigned engine chaining on) gets its
        // hashes back unsigned too.
        HashForm form;
        const int64_t parent = as_hash(parent_hash, "parent_hash", form);
        const std::vector<int64_t> tokens = as_int_list(token_ids, "token_ids");
        const std::vector<int64_t> hashes = hash_tokens(tokens, [&] { return chain_block_hashes(tokens, bs, parent); });
        if (!as_numpy) return to_hash_list(hashes, form);
        if (form.is_unsigned()) {
          py::array_t<uint64_t> arr(static_cast<py::ssize_t>(hashes.size()));
          std::memcpy(arr.mutable_data(), hashes.data(), hashes.size() * sizeof(int64_t));
          return arr;
        }
        py::array_t<int64_t> arr(static_cast<py::ssize_t>(hashes.size()));
        std::copy(hashes.begin(), hashes.end(), arr.mutable_data());
        return arr;
      },
      py::arg("token_ids"), py::arg("block_size"), py::arg("parent_hash") = -1, py::arg("as_numpy") = false,
      doc("chain_block_hashes"));

  m.def(
      "chain_block_keys",
      [](py::handle token_ids, py::handle block_size, py::object parent_key, py::handle seed,
         py::object salt) -> py::tuple {
        const int64_t bs = as_int(block_size, "block_size");
        if (bs <= 0) throw py::value_error("block_size=" + std::to_string(bs) + " must be > 0");
        const DeploymentKey dk = deployment_key(static_cast<uint64_t>(as_int(seed, "seed")), salt_bytes(salt));
        PrefixKey parent;
        const bool has_parent = !parent_key.is_none();
        if (has_parent) parent = as_prefix_key(parent_key, "parent_key");
        const std::vector<int64_t> tokens = as_int_list(token_ids, "token_ids");
        const std::vector<PrefixKey> keys =
            hash_tokens(tokens, [&] { return chain_block_keys(dk, tokens, bs, has_parent ? &parent : nullptr); });
        py::list hashes(keys.size());
        std::string packed(16 * keys.size(), '\0');
        for (size_t i = 0; i < keys.size(); ++i) {
          hashes[i] = py::int_(scheduler_hash(keys[i]));
          std::memcpy(packed.data() + 16 * i, &keys[i].lo, 8);
          std::memcpy(packed.data() + 16 * i + 8, &keys[i].hi, 8);
        }
        return py::make_tuple(std::move(hashes), py::bytes(packed));
      },
      py::arg("token_ids"), py::arg("block_size"), py::arg("parent_key") = py::none(), py::arg("seed") = 0,
      py::arg("salt") = py::none(), doc("chain_block_keys"));

  m.def(
      "scheduler_hash", [](py::handle key) { return scheduler_hash(as_prefix_key(key, "key")); }, py::arg("key"),
      doc("scheduler_hash"));
}

}  // namespace statecache::bindings
