// Chained 64-bit content hashes of token blocks (SPEC.md §2, §9).
//
// Block i of a token sequence covers tokens [i*block_size, (i+1)*block_size);
// its hash mixes the hash of block i-1 (the parent) with its own tokens, so a
// hash names the whole prefix ending at that block. -1 means "none" across the
// library, so no block ever hashes to -1.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace statecache {

// The hash a chain starts from when the caller gives no parent (-1).
inline constexpr int64_t kRootBlockHash = 0x243F6A8885A308D3LL;

// Hash of one block of tokens chained from `parent` (-1: the root).
int64_t hash_token_block(int64_t parent, std::span<const int64_t> tokens);

// Hashes of every full block of `tokens`, chained from `parent`. A trailing
// partial block is ignored. Throws std::invalid_argument for block_size <= 0.
std::vector<int64_t> chain_block_hashes(std::span<const int64_t> tokens, int64_t block_size,
                                        int64_t parent = -1);

}  // namespace statecache
