// Batched per-pass calls (docs/contract.md, "Batched calls"): one call per
// scheduler pass instead of one per sequence, for the slot pool, the group pool
// and the PAGE coordinator alike.
//
// Every batch is validated as a whole first (lengths, -1 hashes, a sequence
// named twice, each entry's own checks) and throws before anything changes;
// then each entry runs exactly as the per-sequence call would, in order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/sequence.h"

namespace statecache::batch {

// std::invalid_argument unless `name` has as many entries as `of`.
void check_length(const char* name, size_t n, const char* of, size_t expected);
// std::invalid_argument naming the first entry whose key repeats an earlier
// one; `keys` identify the sequences (a sequence's identity, not its fields).
void check_distinct(const char* name, std::span<const uintptr_t> keys);
// std::invalid_argument naming the first -1 ("no hash") among `hashes`.
void check_hashes(const char* name, std::span<const int64_t> hashes);
// std::invalid_argument naming the first negative entry.
void check_nonnegative(const char* name, std::span<const int64_t> values);

// Runs `check()` on behalf of entry `i` of `name`: what it throws comes out
// with the same type and "name[i]: " in front.
template <class Check>
void check_entry(const char* name, size_t i, Check&& check) {
  try {
    check();
  } catch (const std::exception& e) {
    const std::string what = std::string(name) + "[" + std::to_string(i) + "]: " + e.what();
    try {
      throw;
    } catch (const InvariantError&) {
      throw InvariantError(what);
    } catch (const std::out_of_range&) {
      throw std::out_of_range(what);
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(what);
    }
  }
}

// resumable_hit for every sequence, in order. `rows` gives each sequence's
// hash list: rows.length(i) hashes, rows.scan(i, f) returns f(n, hash_at)
// where hash_at(k) reads hash k (lazily: a scan reads only what it needs; the
// reader is chosen once per row, not per hash), and rows.prefetch(i, hit,
// stage) may start loading what a scan of row i below `hit` reads first
// (stage 0: where the hashes are, 1: the hashes). Any cache with
//   int64_t resumable_hit(const Sequence&, hit, num_hashes, hash_at, assume)
//   bool hit_within_hashes(const Sequence&, assume)  // whether hit <= length
// works. std::invalid_argument, before any scan, for a length mismatch, a
// negative hit, or a hit past its list where the per-sequence call reads it.
template <class Cache, class Rows>
std::vector<int64_t> resumable_hits(const Cache& cache, std::span<Sequence* const> seqs, std::span<const int64_t> hits,
                                    Rows& rows, bool assume_checkpointed) {
  check_length("hits", hits.size(), "seqs", seqs.size());
  check_length("block_hashes", rows.size(), "seqs", seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (hits[i] < 0) bad_argument(("hits[" + std::to_string(i) + "]").c_str(), hits[i], "must be >= 0");
    if (cache.hit_within_hashes(*seqs[i], assume_checkpointed) && hits[i] > rows.length(i))
      bad_argument(
          ("hits[" + std::to_string(i) + "]").c_str(), hits[i],
          ("exceeds len(block_hashes[" + std::to_string(i) + "]) = " + std::to_string(rows.length(i))).c_str());
  }
  std::vector<int64_t> out;
  out.reserve(seqs.size());
  // Hash lists of a pass are often cold (one per request, scattered in
  // memory). While row i is scanned, row i + kAhead has its first hashes
  // fetched (stage 1) and row i + 2 kAhead what locates them (stage 0), so
  // those misses overlap; a per-sequence call cannot do that.
  constexpr size_t kAhead = 4;
  const size_t n = seqs.size();
  for (size_t r = 0; r < std::min(n, 2 * kAhead); ++r) rows.prefetch(r, hits[r], r < kAhead ? 1 : 0);
  for (size_t i = 0; i < n; ++i) {
    if (i + 2 * kAhead < n) rows.prefetch(i + 2 * kAhead, hits[i + 2 * kAhead], 0);
    if (i + kAhead < n) rows.prefetch(i + kAhead, hits[i + kAhead], 1);
    out.push_back(rows.scan(i, [&](int64_t len, auto&& hash_at) {
      return cache.resumable_hit(*seqs[i], hits[i], len, hash_at, assume_checkpointed);
    }));
  }
  return out;
}

// checkpoint for every sequence, in order, once the whole batch passed: one
// entry per sequence in each argument, no -1 hash, no sequence twice (two
// boundaries of one sequence in one call would need an order the caller did
// not state), and `check(i)` for each entry, which must throw what the
// per-sequence call would (and be enough: `apply(i)` must then not throw).
// `keys[i]` is sequence i's identity (see identities()).
template <class Check, class Apply>
void checkpoint_many(size_t num_seqs, std::span<const uintptr_t> keys, std::span<const int64_t> boundary_blocks,
                     std::span<const int64_t> hashes, Check&& check, Apply&& apply) {
  check_length("boundary_blocks", boundary_blocks.size(), "seqs", num_seqs);
  check_length("hashes", hashes.size(), "seqs", num_seqs);
  check_length("keys", keys.size(), "seqs", num_seqs);
  check_hashes("hashes", hashes);
  check_distinct("seqs", keys);
  for (size_t i = 0; i < num_seqs; ++i) check_entry("seqs", i, [&] { check(i); });
  for (size_t i = 0; i < num_seqs; ++i) apply(i);
}

// The identity of each sequence of a C++ batch: its address.
template <class SeqPtr>
std::vector<uintptr_t> identities(std::span<const SeqPtr> seqs) {
  std::vector<uintptr_t> keys;
  keys.reserve(seqs.size());
  for (const SeqPtr& s : seqs) keys.push_back(reinterpret_cast<uintptr_t>(&*s));
  return keys;
}

}  // namespace statecache::batch
