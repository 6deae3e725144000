#include "core/block_hash.h"

#include <cstring>

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

std::vector<int64_t> chain_block_hashes(std::span<const int64_t> tokens, int64_t block_size, int64_t parent) {
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

// ------------------------------------------------------ 128-bit keys --

namespace {

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
  void compress(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

uint64_t load_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // x86-64 / aarch64 Linux: little-endian
  return v;
}

}  // namespace

PrefixKey siphash128(const DeploymentKey& key, std::span<const uint8_t> bytes) {
  SipState s{key.k0 ^ 0x736f6d6570736575ULL, key.k1 ^ 0x646f72616e646f6dULL, key.k0 ^ 0x6c7967656e657261ULL,
             key.k1 ^ 0x7465646279746573ULL};
  s.v1 ^= 0xee;  // 128-bit output variant
  const size_t n = bytes.size();
  const uint8_t* p = bytes.data();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) s.compress(load_le64(p + i));
  uint64_t last = static_cast<uint64_t>(n & 0xff) << 56;
  for (size_t j = 0; i + j < n; ++j) last |= static_cast<uint64_t>(p[i + j]) << (8 * j);
  s.compress(last);
  s.v2 ^= 0xee;
  for (int r = 0; r < 4; ++r) s.round();
  PrefixKey out;
  out.lo = s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
  s.v1 ^= 0xdd;
  for (int r = 0; r < 4; ++r) s.round();
  out.hi = s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
  return out;
}

DeploymentKey deployment_key(uint64_t seed, std::string_view salt) {
  // A fixed key hashes (seed, salt) into the deployment's key.
  std::vector<uint8_t> msg(8 + salt.size());
  std::memcpy(msg.data(), &seed, 8);
  std::memcpy(msg.data() + 8, salt.data(), salt.size());
  const PrefixKey k = siphash128(DeploymentKey{0x5374617465636163ULL, 0x68652d6b65797331ULL}, msg);
  return DeploymentKey{k.lo, k.hi};
}

PrefixKey key_token_block(const DeploymentKey& key, const PrefixKey* parent, std::span<const int64_t> tokens) {
  // Message: parent key (or a root marker: zeros) then the tokens,
  // little-endian. Short blocks (a tail's chain hashes one token a call) are
  // built on the stack: no allocation per key.
  constexpr size_t kStackTokens = 32;
  uint8_t stack[17 + 8 * kStackTokens];
  std::vector<uint8_t> heap;
  const size_t n = 17 + 8 * tokens.size();
  uint8_t* msg = stack;
  if (tokens.size() > kStackTokens) {
    heap.resize(n);
    msg = heap.data();
  }
  msg[0] = parent != nullptr ? 1 : 0;
  if (parent != nullptr) {
    std::memcpy(msg + 1, &parent->lo, 8);
    std::memcpy(msg + 9, &parent->hi, 8);
  } else {
    std::memset(msg + 1, 0, 16);
  }
  if (!tokens.empty()) std::memcpy(msg + 17, tokens.data(), 8 * tokens.size());
  return siphash128(key, std::span<const uint8_t>(msg, n));
}

int64_t scheduler_hash(const PrefixKey& key) {
  const auto out = static_cast<int64_t>(key.lo);
  return out == -1 ? static_cast<int64_t>(kP5) : out;  // -1 means "none"
}

std::vector<PrefixKey> chain_block_keys(const DeploymentKey& key, std::span<const int64_t> tokens, int64_t block_size,
                                        const PrefixKey* parent) {
  if (block_size <= 0) bad_argument("block_size", block_size, "must be > 0");
  const size_t bs = static_cast<size_t>(block_size);
  const size_t n = tokens.size() / bs;
  std::vector<PrefixKey> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(key_token_block(key, i == 0 ? parent : &out.back(), tokens.subspan(i * bs, bs)));
  }
  return out;
}

}  // namespace statecache
