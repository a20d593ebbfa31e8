#include "core/kv_cache/kv_cache.h"

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
