#include "core/block_hash.h"

#include "core/errors.h"

namespace statecache {

namespace {

// xxHash64's primes and round; the lane is a token id, so no byte loads.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

constexpr uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

constexpr uint64_t mix_lane(uint64_t acc, uint64_t lane) {
  acc += lane * kP2;
  acc = rotl(acc, 31);
  return acc * kP1;
}

constexpr uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace

int64_t hash_token_block(int64_t parent, std::span<const int64_t> tokens) {
  const uint64_t seed = static_cast<uint64_t>(parent == -1 ? kRootBlockHash : parent);
  // Two independent accumulators so consecutive tokens do not serialize on
  // one multiply chain; the length goes in so [a] and [a, 0] differ.
  uint64_t a = seed + kP1 + kP2;
  uint64_t b = seed ^ kP5;
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2) {
    a = mix_lane(a, static_cast<uint64_t>(tokens[i]));
    b = mix_lane(b, static_cast<uint64_t>(tokens[i + 1]));
  }
  if (i < tokens.size()) a = mix_lane(a, static_cast<uint64_t>(tokens[i]));
  uint64_t h = rotl(a, 1) + rotl(b, 7) + static_cast<uint64_t>(tokens.size()) * kP4;
  h = avalanche(h ^ mix_lane(0, seed));
  const auto out = static_cast<int64_t>(h);
  // -1 is the library's "none"; move the one colliding value elsewhere.
  return out == -1 ? static_cast<int64_t>(kP5) : out;
}

std::vector<int64_t> chain_block_hashes(std::span<const int64_t> tokens, int64_t block_size,
                                        int64_t parent) {
  if (block_size <= 0) bad_argument("block_size", block_size, "must be > 0");
  const size_t bs = static_cast<size_t>(block_size);
  const size_t n = tokens.size() / bs;
  std::vector<int64_t> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    parent = hash_token_block(parent, tokens.subspan(i * bs, bs));
    out.push_back(parent);
  }
  return out;
}

}  // namespace statecache
