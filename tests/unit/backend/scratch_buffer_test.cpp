#include "cpu/scratch_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace ember::cpu {
namespace {

TEST(ScratchBuffer, GrowsAlignedAndKeepsItsSizeWhileCallsNeedIt) {
  ScratchBuffer b;
  void* p = b.get(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_GE(b.capacity(), 100u);
  std::memset(p, 1, 100);
  EXPECT_EQ(b.get(50), p);  // small calls under kKeepBytes never shrink it
  void* q = b.get(size_t{3} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % 64, 0u);
  EXPECT_GE(b.capacity(), size_t{3} << 20);
  std::memset(q, 2, size_t{3} << 20);  // all of it writable (mapped on its own)
}

TEST(ScratchBuffer, APromptsBufferGoesBackAfterTheDecodeCallsThatNeedAQuarterOrLess) {
  ScratchBuffer b;
  const size_t big = size_t{2} << 20, small = 4096;
  b.get(big);
  const size_t cap = b.capacity();
  for (int i = 0; i < ScratchBuffer::kShrinkAfter - 1; ++i) {
    b.get(small);
    ASSERT_EQ(b.capacity(), cap) << "released after " << i + 1 << " calls";
  }
  b.get(small);
  EXPECT_LT(b.capacity(), ScratchBuffer::kKeepBytes);
  EXPECT_GE(b.capacity(), small);
}

TEST(ScratchBuffer, LargeCallsBetweenSmallOnesKeepIt) {
  // A continuous batch: steps mixing a prompt chunk with decode rows.
  ScratchBuffer b;
  const size_t big = size_t{2} << 20;
  b.get(big);
  const size_t cap = b.capacity();
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < ScratchBuffer::kShrinkAfter - 1; ++i) b.get(4096);
    b.get(big / 2);  // more than a quarter: the count starts again
  }
  EXPECT_EQ(b.capacity(), cap);
  b.release();
  EXPECT_EQ(b.capacity(), 0u);
}

}  // namespace
}  // namespace ember::cpu
