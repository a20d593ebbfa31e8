#include "core/tensor/types.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <immintrin.h>

#include "core/util/status.h"

namespace ember {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------------------
// Type table

struct Row {
  DType type;
  const char* name;
  uint32_t block_size, type_size;
  bool has_dequant;
};

const Row kRows[] = {
    {DType::F32, "f32", 1, 4, true},        {DType::F16, "f16", 1, 2, true},
    {DType::BF16, "bf16", 1, 2, true},      {DType::Q4_0, "q4_0", 32, 18, true},
    {DType::Q4_1, "q4_1", 32, 20, true},    {DType::Q5_0, "q5_0", 32, 22, true},
    {DType::Q5_1, "q5_1", 32, 24, true},    {DType::Q8_0, "q8_0", 32, 34, true},
    {DType::Q8_1, "q8_1", 32, 36, false},   {DType::Q2_K, "q2_K", 256, 84, true},
    {DType::Q3_K, "q3_K", 256, 110, true},  {DType::Q4_K, "q4_K", 256, 144, true},
    {DType::Q5_K, "q5_K", 256, 176, true},  {DType::Q6_K, "q6_K", 256, 210, true},
    {DType::Q8_K, "q8_K", 256, 292, false}, {DType::I8, "i8", 1, 1, false},
    {DType::I16, "i16", 1, 2, false},       {DType::I32, "i32", 1, 4, false},
    {DType::I64, "i64", 1, 8, false},       {DType::F64, "f64", 1, 8, false},
};

TEST(TypeTable, EveryTypeHasTheGgufGeometry) {
  for (const Row& r : kRows) {
    SCOPED_TRACE(r.name);
    const TypeTraits* t = type_traits(r.type);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, r.type);
    EXPECT_STREQ(t->name, r.name);
    EXPECT_STREQ(type_name(static_cast<uint32_t>(r.type)), r.name);
    EXPECT_EQ(t->block_size, r.block_size);
    EXPECT_EQ(t->type_size, r.type_size);
    EXPECT_EQ(t->dequantize_row != nullptr, r.has_dequant);
    EXPECT_EQ(type_traits(static_cast<uint32_t>(r.type)), t);
  }
}

TEST(TypeTable, UnknownIdsHaveNoRow) {
  for (uint32_t id : {4u, 5u, 16u, 20u, 23u, 29u, 31u, 32u, 39u, 1000u, 0xFFFFFFFFu}) {
    EXPECT_EQ(type_traits(id), nullptr) << id;
    EXPECT_STREQ(type_name(id), "unknown") << id;
  }
  int known = 0;
  for (uint32_t id = 0; id < 256; ++id) known += type_traits(id) != nullptr;
  EXPECT_EQ(known, static_cast<int>(std::size(kRows)));
}

TEST(TypeTable, BlockStructsMatchTable) {
  EXPECT_EQ(sizeof(BlockQ4_0), type_traits(DType::Q4_0)->type_size);
  EXPECT_EQ(sizeof(BlockQ4_1), type_traits(DType::Q4_1)->type_size);
  EXPECT_EQ(sizeof(BlockQ8_0), type_traits(DType::Q8_0)->type_size);
}

TEST(TypeTable, RowBytes) {
  EXPECT_EQ(row_bytes(DType::F32, 3), 12u);
  EXPECT_EQ(row_bytes(DType::F16, 5), 10u);
  EXPECT_EQ(row_bytes(DType::Q4_0, 64), 36u);
  EXPECT_EQ(row_bytes(DType::Q4_1, 4096), 128u * 20u);
  EXPECT_EQ(row_bytes(DType::Q8_0, 576), 18u * 34u);
  EXPECT_EQ(row_bytes(DType::Q4_K, 256), 144u);
  EXPECT_EQ(row_bytes(DType::Q6_K, 512), 420u);
  EXPECT_EQ(row_bytes(DType::F32, 0), 0u);
  EXPECT_THROW(row_bytes(DType::Q4_0, 33), Error);
  EXPECT_THROW(row_bytes(DType::Q4_K, 32), Error);
  EXPECT_THROW(row_bytes(DType::F32, -1), Error);
  EXPECT_THROW(row_bytes(DType::I64, std::numeric_limits<int64_t>::max()), Error);
  EXPECT_THROW(row_bytes(static_cast<DType>(4), 32), Error);
}

// ---------------------------------------------------------------------------
// fp16

TEST(Fp16, KnownValues) {
  EXPECT_EQ(bits(fp16_to_fp32(0x0000)), 0x00000000u);
  EXPECT_EQ(bits(fp16_to_fp32(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0xC000), -2.0f);
  EXPECT_EQ(fp16_to_fp32(0x3800), 0.5f);
  EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
  EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
  EXPECT_EQ(fp16_to_fp32(0xFBFF), -65504.0f);
  EXPECT_EQ(fp16_to_fp32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_fp32(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_fp32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(fp16_to_fp32(0x0200), std::ldexp(1.0f, -15));
  EXPECT_EQ(fp16_to_fp32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(fp16_to_fp32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7C01)));  // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(fp16_to_fp32(0xFFFF)));
}

TEST(Fp16, FromFloatRoundsToNearestEven) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(fp32_to_fp16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);  // just below the midpoint
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);                        // midpoint ties to even = inf
  EXPECT_EQ(fp32_to_fp16(-65520.0f), 0xFC00);
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(inf), 0x7C00);
  EXPECT_EQ(fp32_to_fp16(-inf), 0xFC00);
  // Ties between normals.
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // 1 + half ulp -> even (down)
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // -> even (up)
  EXPECT_EQ(fp32_to_fp16(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3C01);
  // Subnormal range (units of 2^-24).
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even zero
  EXPECT_EQ(fp32_to_fp16(-std::ldexp(1.0f, -25)), 0x8000);
  EXPECT_EQ(fp32_to_fp16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -24)), 0x0002);     // tie -> even
  EXPECT_EQ(fp32_to_fp16(std::ldexp(2.5f, -24)), 0x0002);     // tie -> even
  EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -26)), 0x0001);     // 0.75 units
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normal range
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(fp32_to_fp16(1e-10f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-1e-10f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // NaN stays NaN (quiet), never becomes inf.
  const uint16_t n1 = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(n1 & 0x7C00, 0x7C00);
  EXPECT_NE(n1 & 0x03FF, 0);
  const uint16_t n2 = fp32_to_fp16(from_bits(0x7F800001u));  // signalling NaN, payload only in low bits
  EXPECT_EQ(n2 & 0x7C00, 0x7C00);
  EXPECT_NE(n2 & 0x03FF, 0);
  EXPECT_EQ(fp32_to_fp16(from_bits(0xFFC00000u)) & 0x8000, 0x8000);
}

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const bool is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0;
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << h;
    } else {
      ASSERT_EQ(fp32_to_fp16(f), h) << h;
    }
  }
}

// The hardware conversions, compiled for F16C in this baseline file.
__attribute__((target("f16c"))) float hw_h2f(uint16_t h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) uint16_t hw_f2h(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

// The portable conversions must agree bit-for-bit with the hardware (the
// scalar CPU kernels rely on it to equal the F16C ones).
TEST(Fp16, MatchesF16C) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "this CPU has no F16C";
  for (uint32_t h = 0; h < 65536; ++h) {
    const bool is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0;
    if (is_nan) continue;
    ASSERT_EQ(bits(fp16_to_fp32(static_cast<uint16_t>(h))), bits(hw_h2f(static_cast<uint16_t>(h)))) << h;
  }
  std::mt19937 rng(42);
  auto check = [](uint32_t u) {
    const float f = from_bits(u);
    const uint16_t mine = fp32_to_fp16(f);
    const auto hw = hw_f2h(f);
    if (std::isnan(f)) {
      ASSERT_EQ(mine & 0x7C00, 0x7C00);
      ASSERT_NE(mine & 0x3FF, 0);
    } else {
      ASSERT_EQ(mine, hw) << std::hex << u;
    }
  };
  for (uint32_t i = 0; i < 2000000; ++i) check(rng());
  // Dense sweep over the interesting exponent range (subnormal/normal/overflow edges).
  for (uint32_t u = 0x32800000u; u < 0x38900000u; u += 0x101) check(u);
  for (uint32_t u = 0x477F0000u; u < 0x47810000u; u += 7) check(u);
}

// ---------------------------------------------------------------------------
// bf16

TEST(Bf16, Conversions) {
  EXPECT_EQ(bf16_to_fp32(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xC040), -3.0f);
  EXPECT_EQ(bits(bf16_to_fp32(0x8000)), 0x80000000u);
  EXPECT_EQ(bf16_to_fp32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_fp32(0x0001), from_bits(0x00010000u));  // subnormal
  EXPECT_TRUE(std::isnan(bf16_to_fp32(0x7FC0)));

  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808000u)), 0x3F80);  // tie -> even (down)
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F818000u)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808001u)), 0x3F81);  // above the tie
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80);  // below the tie
  EXPECT_EQ(fp32_to_bf16(from_bits(0x0000C000u)), 0x0001);  // subnormal rounds up
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // overflows to inf under RNE
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F7F7FFFu)), 0x7F7F);
  // NaNs stay NaN, even when the payload lives only in the dropped bits.
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(from_bits(u))))) << std::hex << u;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_bf16(f), h) << h;
  }
}

// ---------------------------------------------------------------------------
// Reference dequantizers, against hand-computed blocks.

template <class T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v, size_t misalign = 0) {
  std::vector<uint8_t> out(misalign + v.size() * sizeof(T));
  std::memcpy(out.data() + misalign, v.data(), v.size() * sizeof(T));
  return out;
}

std::vector<float> dequant(DType t, const void* src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  type_traits(t)->dequantize_row(src, out.data(), n);
  return out;
}

TEST(Dequantize, F32) {
  const std::vector<float> x = {1.5f, -2.0f, 0.0f, 3.25f, 1e30f};
  const auto bytes = as_bytes(x, 1);  // deliberately misaligned
  EXPECT_EQ(dequant(DType::F32, bytes.data() + 1, 5), x);
}

TEST(Dequantize, F16) {
  const std::vector<uint16_t> h = {0x3C00, 0xC000, 0x3800, 0x0001, 0x7BFF, 0x8000};
  const std::vector<float> want = {1.0f, -2.0f, 0.5f, std::ldexp(1.0f, -24), 65504.0f, -0.0f};
  const auto bytes = as_bytes(h, 1);
  EXPECT_EQ(dequant(DType::F16, bytes.data() + 1, 6), want);
}

TEST(Dequantize, BF16) {
  const std::vector<uint16_t> h = {0x3F80, 0xC040, 0x4049, 0x0000};
  const std::vector<float> want = {1.0f, -3.0f, from_bits(0x40490000u), 0.0f};
  const auto bytes = as_bytes(h, 3);
  EXPECT_EQ(dequant(DType::BF16, bytes.data() + 3, 4), want);
}

TEST(Dequantize, Q8_0) {
  BlockQ8_0 b[2];
  b[0].d = 0x3800;  // 0.5
  b[1].d = 0xC000;  // -2
  for (int j = 0; j < 32; ++j) {
    b[0].qs[j] = static_cast<int8_t>(j - 16);
    b[1].qs[j] = static_cast<int8_t>(j % 2 ? 127 : -128);
  }
  std::vector<uint8_t> bytes(1 + sizeof(b));
  std::memcpy(bytes.data() + 1, b, sizeof(b));
  const auto y = dequant(DType::Q8_0, bytes.data() + 1, 64);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(y[j], (j - 16) * 0.5f) << j;
    EXPECT_EQ(y[32 + j], (j % 2 ? 127 : -128) * -2.0f) << j;
  }
}

TEST(Dequantize, Q4_0) {
  BlockQ4_0 b[2];
  b[0].d = 0x3C00;  // 1
  b[1].d = 0x3400;  // 0.25
  for (int j = 0; j < 16; ++j) {
    b[0].qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));  // low = j, high = 15 - j
    b[1].qs[j] = static_cast<uint8_t>(0x0F | (0x0 << 4));    // low = 15, high = 0
  }
  std::vector<uint8_t> bytes(sizeof(b));
  std::memcpy(bytes.data(), b, sizeof(b));
  const auto y = dequant(DType::Q4_0, bytes.data(), 64);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], static_cast<float>(j - 8)) << j;            // elements 0..15: low nibbles
    EXPECT_EQ(y[16 + j], static_cast<float>(15 - j - 8)) << j;  // elements 16..31: high nibbles
    EXPECT_EQ(y[32 + j], 7 * 0.25f) << j;
    EXPECT_EQ(y[48 + j], -8 * 0.25f) << j;
  }
}

TEST(Dequantize, Q4_1) {
  BlockQ4_1 b;
  b.d = 0x3800;  // 0.5
  b.m = 0xBC00;  // -1
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  std::vector<uint8_t> bytes(2 + sizeof(b));
  std::memcpy(bytes.data() + 2, &b, sizeof(b));
  const auto y = dequant(DType::Q4_1, bytes.data() + 2, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], j * 0.5f - 1.0f) << j;
    EXPECT_EQ(y[16 + j], (15 - j) * 0.5f - 1.0f) << j;
  }
  // A concrete spot check: nibble 13 -> 13 * 0.5 - 1 = 5.5.
  EXPECT_EQ(y[13], 5.5f);
}

}  // namespace
}  // namespace ember
