// Chained token-block hashes: one call per sequence, not per block.
#include <pybind11/numpy.h>

#include "bindings/bindings.h"
#include "bindings/convert.h"
#include "core/block_hash.h"

namespace statecache::bindings {

void bind_hashing(pybind11::module_& m) {
  m.def(
      "chain_block_hashes",
      [](py::handle token_ids, py::handle block_size, py::handle parent_hash,
         py::handle numpy_obj) -> py::object {
        const bool as_numpy = as_bool(numpy_obj, "as_numpy");
        const int64_t bs = as_int(block_size, "block_size");
        if (bs <= 0)
          throw py::value_error("block_size=" + std::to_string(bs) + " must be > 0");
        const int64_t parent = as_int(parent_hash, "parent_hash");
        const std::vector<int64_t> tokens = as_int_list(token_ids, "token_ids");
        std::vector<int64_t> hashes;
        {
          py::gil_scoped_release nogil;
          hashes = chain_block_hashes(tokens, bs, parent);
        }
        if (!as_numpy) return to_list(hashes);
        py::array_t<int64_t> arr(static_cast<py::ssize_t>(hashes.size()));
        std::copy(hashes.begin(), hashes.end(), arr.mutable_data());
        return arr;
      },
      py::arg("token_ids"), py::arg("block_size"), py::arg("parent_hash") = -1,
      py::arg("as_numpy") = false,
      R"doc(Chained content hashes of every full block of ``token_ids``.

Block ``i`` covers tokens ``[i*block_size, (i+1)*block_size)``; its hash folds
in the hash of block ``i-1``, starting from ``parent_hash`` (-1: the root), so
one hash names the whole prefix. A trailing partial block is ignored. To extend
a sequence's hashes, pass the tokens from the next block boundary on and the
last hash as ``parent_hash``. Never returns -1 (the library's "none").
Returns a list of ints, or an int64 NumPy array with ``as_numpy=True``.)doc");
}

}  // namespace statecache::bindings
