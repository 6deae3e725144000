#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <vector>

#include "core/block_hash.h"

using namespace statecache;

TEST(BlockHash, ChainsFromParentAndIgnoresPartialTail) {
  std::vector<int64_t> t = {1, 2, 3, 4, 5, 6, 7};
  auto h = chain_block_hashes(t, 3);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], hash_token_block(-1, std::span<const int64_t>(t).subspan(0, 3)));
  EXPECT_EQ(h[1], hash_token_block(h[0], std::span<const int64_t>(t).subspan(3, 3)));
  // Extending from the last hash gives the same chain as hashing everything.
  std::vector<int64_t> more = {4, 5, 6, 7, 8, 9};
  auto tail = chain_block_hashes(more, 3, h[0]);
  std::vector<int64_t> all = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto full = chain_block_hashes(all, 3);
  ASSERT_EQ(full.size(), 3u);
  EXPECT_EQ(tail[0], full[1]);
  EXPECT_EQ(tail[1], full[2]);
}

TEST(BlockHash, PrefixDependsOnEveryEarlierToken) {
  std::vector<int64_t> a = {1, 2, 3, 4, 5, 6};
  std::vector<int64_t> b = {9, 2, 3, 4, 5, 6};
  auto ha = chain_block_hashes(a, 3);
  auto hb = chain_block_hashes(b, 3);
  EXPECT_NE(ha[0], hb[0]);
  EXPECT_NE(ha[1], hb[1]);                  // same second block, different parent
  EXPECT_EQ(ha, chain_block_hashes(a, 3));  // deterministic
}

TEST(BlockHash, DistinctOverManySmallBlocksAndNeverMinusOne) {
  std::set<int64_t> seen;
  for (int64_t x = 0; x < 20000; ++x) {
    std::vector<int64_t> t = {x, x >> 3};
    const int64_t h = hash_token_block(-1, t);
    EXPECT_NE(h, -1);
    seen.insert(h);
  }
  EXPECT_EQ(seen.size(), 20000u);
}

TEST(BlockHash, RejectsBadBlockSize) {
  std::vector<int64_t> t = {1, 2};
  EXPECT_THROW(chain_block_hashes(t, 0), std::invalid_argument);
  EXPECT_THROW(chain_block_hashes(t, -2), std::invalid_argument);
  EXPECT_TRUE(chain_block_hashes(std::vector<int64_t>{}, 4).empty());
}
