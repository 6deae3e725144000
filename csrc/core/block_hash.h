// Chained 64-bit content hashes of token blocks (docs/contract.md, "Words", "Reference engine").
//
// Block i of a token sequence covers tokens [i*block_size, (i+1)*block_size);
// its hash mixes the hash of block i-1 (the parent) with its own tokens, so a
// hash names the whole prefix ending at that block. -1 means "none" across the
// library, so no block ever hashes to -1.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace statecache {

// The hash a chain starts from when the caller gives no parent (-1).
inline constexpr int64_t kRootBlockHash = 0x243F6A8885A308D3LL;

// Hash of one block of tokens chained from `parent` (-1: the root).
int64_t hash_token_block(int64_t parent, std::span<const int64_t> tokens);

// Hashes of every full block of `tokens`, chained from `parent`. A trailing
// partial block is ignored. Throws std::invalid_argument for block_size <= 0.
std::vector<int64_t> chain_block_hashes(std::span<const int64_t> tokens, int64_t block_size, int64_t parent = -1);

// ---- 128-bit prefix keys (docs/contract.md, "Tiers") ----
//
// A lower tier outlives one process and may be shared by many engines, so its
// entries are named by a 128-bit key that a deployment seeds and may salt:
// SipHash-2-4 with 128-bit output, keyed by (seed, salt), chained like the
// 64-bit hashes (key i = SipHash(key i-1 || tokens of block i)). Without the
// deployment key nobody can construct two prefixes with the same key.
struct PrefixKey {
  uint64_t lo = 0, hi = 0;
  bool operator==(const PrefixKey&) const = default;
};

// The 128-bit SipHash key of a deployment: derived from `seed` and `salt`.
struct DeploymentKey {
  uint64_t k0 = 0, k1 = 0;
};
DeploymentKey deployment_key(uint64_t seed, std::string_view salt);

// SipHash-2-4, 128-bit output, of `bytes` under `key`.
PrefixKey siphash128(const DeploymentKey& key, std::span<const uint8_t> bytes);

// Key of one block of tokens chained from `parent` (nullptr: the root).
PrefixKey key_token_block(const DeploymentKey& key, const PrefixKey* parent, std::span<const int64_t> tokens);

// The 64-bit scheduler hash a 128-bit key names (never -1).
int64_t scheduler_hash(const PrefixKey& key);

// 128-bit keys of every full block of `tokens`, chained from `parent`
// (nullptr: the root). Throws std::invalid_argument for block_size <= 0.
std::vector<PrefixKey> chain_block_keys(const DeploymentKey& key, std::span<const int64_t> tokens, int64_t block_size,
                                        const PrefixKey* parent = nullptr);

}  // namespace statecache
