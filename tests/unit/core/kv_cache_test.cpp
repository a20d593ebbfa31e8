#include "core/kv_cache/kv_cache.h"
#include "cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <set>

#include "core/util/status.h"

namespace ember {
namespace {

KvGeometry small_geometry(int32_t blocks) {
  KvGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = 1;
  g.head_dim = 8;
  g.block_size = 4;
  g.num_blocks = blocks;
  return g;
}

TEST(KvCache, ReserveCoversSlotsAndIsAllOrNothing) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, small_geometry(4));
  std::vector<int32_t> a, b;
  ASSERT_TRUE(cache.reserve(a, 5));  // 2 blocks
  EXPECT_EQ(a.size(), 2u);
  ASSERT_TRUE(cache.reserve(a, 8));  // still 2 blocks
  EXPECT_EQ(a.size(), 2u);
  EXPECT_FALSE(cache.reserve(b, 9));  // needs 3, only 2 free
  EXPECT_TRUE(b.empty());
  ASSERT_TRUE(cache.reserve(b, 8));
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 4u);  // distinct blocks
  auto s = cache.stats();
  EXPECT_EQ(s.blocks_used, 4u);
  EXPECT_EQ(s.blocks_free, 0u);
}

TEST(KvCache, TruncateAndReleaseReturnBlocks) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, small_geometry(4));
  std::vector<int32_t> a;
  ASSERT_TRUE(cache.reserve(a, 16));
  cache.truncate(a, 5);
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(cache.stats().blocks_free, 2u);
  cache.release(a);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(cache.stats().blocks_free, 4u);
}

TEST(KvCache, RejectsBadGeometry) {
  auto backend = make_cpu_backend(1);
  EXPECT_THROW(KvCache(*backend, small_geometry(0)), Error);
  auto g = small_geometry(2);
  g.block_size = 0;
  EXPECT_THROW(KvCache(*backend, g), Error);
}

}  // namespace
}  // namespace ember

namespace ember {
namespace {

std::vector<int32_t> seq_tokens(int n, int salt = 0) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = i * 7 + salt;
  return t;
}

TEST(KvCachePrefix, FullBlocksAreReusedAndCounted) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, small_geometry(8));  // block size 4
  auto toks = seq_tokens(10);
  std::vector<int32_t> a;
  ASSERT_TRUE(cache.reserve(a, 10));
  cache.commit(a, toks.data(), 10);  // 2 full blocks indexed
  auto hit = cache.match_prefix(toks.data(), toks.size(), 100);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(hit[0], a[0]);
  EXPECT_EQ(hit[1], a[1]);
  auto s = cache.stats();
  EXPECT_EQ(s.prefix_hits, 2u);
  EXPECT_EQ(s.blocks_used, 3u);  // shared blocks counted once
  // A different prompt shares only the first block.
  auto other = toks;
  other[5] = 999;
  auto hit2 = cache.match_prefix(other.data(), other.size(), 100);
  EXPECT_EQ(hit2.size(), 1u);
  EXPECT_EQ(cache.stats().prefix_misses, 1u);
  cache.release(hit);
  cache.release(hit2);
  cache.release(a);
  s = cache.stats();
  EXPECT_EQ(s.blocks_used, 0u);
  EXPECT_EQ(s.blocks_cached, 2u);                                         // still indexed, reusable
  EXPECT_EQ(cache.match_prefix(toks.data(), toks.size(), 1).size(), 1u);  // max_blocks honoured
}

TEST(KvCachePrefix, CachedBlocksAreEvictedOldestFirst) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, small_geometry(4));
  auto t1 = seq_tokens(8, 1), t2 = seq_tokens(8, 2);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(cache.reserve(a, 8));
  cache.commit(a, t1.data(), 8);
  cache.release(a);  // t1's 2 blocks cached (oldest)
  ASSERT_TRUE(cache.reserve(b, 8));
  cache.commit(b, t2.data(), 8);
  cache.release(b);  // t2's 2 blocks cached
  EXPECT_EQ(cache.stats().blocks_cached, 4u);
  std::vector<int32_t> c;
  ASSERT_TRUE(cache.reserve(c, 4));  // needs one block: evicts from t1 (freed first)
  EXPECT_EQ(cache.stats().evictions, 1u);
  EXPECT_EQ(cache.match_prefix(t2.data(), 8, 10).size(), 2u);  // t2 intact
}

TEST(KvCachePrefix, SharedBlockIsCopiedBeforeWrite) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, small_geometry(8));
  auto toks = seq_tokens(8);
  std::vector<int32_t> a;
  ASSERT_TRUE(cache.reserve(a, 8));
  cache.commit(a, toks.data(), 8);
  auto b = cache.match_prefix(toks.data(), 8, 10);
  ASSERT_EQ(b.size(), 2u);
  // b rewrites from slot 6 (inside its second, shared block).
  ASSERT_TRUE(cache.prepare_write(b, 6));
  EXPECT_EQ(b[0], a[0]);
  EXPECT_NE(b[1], a[1]);
  EXPECT_EQ(cache.stats().cow_copies, 1u);
  // a alone holds its block now; writing it un-indexes it instead of copying.
  ASSERT_TRUE(cache.prepare_write(a, 5));
  EXPECT_EQ(cache.stats().cow_copies, 1u);
  EXPECT_EQ(cache.match_prefix(toks.data(), 8, 10).size(), 1u);
}

// Two shared blocks to copy and one free block: prepare_write refuses and
// changes nothing (it used to swap in the first copy, never filled, before
// finding no block for the second).
TEST(KvCachePrefix, CopyOnWriteIsAllOrNothing) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, small_geometry(5));
  auto toks = seq_tokens(8);
  std::vector<int32_t> a;
  ASSERT_TRUE(cache.reserve(a, 8));
  cache.commit(a, toks.data(), 8);
  auto b = cache.match_prefix(toks.data(), 8, 10);
  ASSERT_EQ(b.size(), 2u);
  std::vector<int32_t> filler;
  ASSERT_TRUE(cache.reserve(filler, 8));  // 2 of the 3 free blocks
  ASSERT_EQ(cache.available_blocks(), 1u);
  const std::vector<int32_t> before = b;
  EXPECT_FALSE(cache.prepare_write(b, 0));  // both blocks shared: 2 copies needed
  EXPECT_EQ(b, before);
  EXPECT_EQ(cache.stats().cow_copies, 0u);
  EXPECT_EQ(cache.available_blocks(), 1u);
  cache.release(filler);
  ASSERT_TRUE(cache.prepare_write(b, 0));
  EXPECT_EQ(cache.stats().cow_copies, 2u);
  cache.release(a);
  cache.release(b);
  EXPECT_EQ(cache.stats().blocks_used, 0u);
}

TEST(KvCachePrefix, HashCollisionIsNotAHit) {
  // Same tokens at a different place in the chain must not match.
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, small_geometry(8));
  std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> a;
  ASSERT_TRUE(cache.reserve(a, 8));
  cache.commit(a, t.data(), 8);
  std::vector<int32_t> shifted = {5, 6, 7, 8, 1, 2, 3, 4};
  EXPECT_EQ(cache.match_prefix(shifted.data(), 8, 10).size(), 0u);
}

}  // namespace
}  // namespace ember
