// The CPU backend's kernels (backend_kernels.inc) in portable C++, for CPUs
// without AVX2/FMA/F16C. Each operation is the AVX2 variant's, lane by lane:
// fused multiply-adds as fmaf (exact in software where the CPU has no FMA),
// f16 conversions that equal F16C's for every non-NaN value, the same
// reduction trees and the same exp algorithm, so the results are the AVX2
// variant's bit for bit (tests/unit/backend/backend_ops_test.cpp).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/tensor/types.h"
#include "cpu/backend_kernels.h"

namespace ember::cpu::detail {
namespace {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct ScalarOps {
  struct V {
    float l[8];
  };
  static constexpr int kLanes = 8;
  template <class F>
  static V map(F f) {
    V r;
    for (int i = 0; i < 8; ++i) r.l[i] = f(i);
    return r;
  }
  static V load(const float* p) {
    return map([&](int i) { return p[i]; });
  }
  static void store(float* p, const V& v) { std::memcpy(p, v.l, sizeof v.l); }
  static V set1(float x) {
    return map([&](int) { return x; });
  }
  static V zero() { return set1(0.0f); }
  static V add(const V& a, const V& b) {
    return map([&](int i) { return a.l[i] + b.l[i]; });
  }
  static V sub(const V& a, const V& b) {
    return map([&](int i) { return a.l[i] - b.l[i]; });
  }
  static V mul(const V& a, const V& b) {
    return map([&](int i) { return a.l[i] * b.l[i]; });
  }
  static V div(const V& a, const V& b) {
    return map([&](int i) { return a.l[i] / b.l[i]; });
  }
  static V fmadd(const V& a, const V& b, const V& c) {
    return map([&](int i) { return __builtin_fmaf(a.l[i], b.l[i], c.l[i]); });
  }
  static V max(const V& a, const V& m) {  // _mm256_max_ps: m unless a > m
    return map([&](int i) { return a.l[i] > m.l[i] ? a.l[i] : m.l[i]; });
  }
  static V halves_lo(const V& a, const V& b) {
    return map([&](int i) { return i < 4 ? a.l[i] : b.l[i - 4]; });
  }
  static V halves_hi(const V& a, const V& b) {
    return map([&](int i) { return i < 4 ? a.l[i + 4] : b.l[i]; });
  }
  static V hadd(const V& a, const V& b) {  // _mm256_hadd_ps
    return map([&](int i) {
      const V& s = (i & 2) ? b : a;
      const int base = (i & 4) + 2 * (i & 1);
      return s.l[base] + s.l[base + 1];
    });
  }
  static V pick_0101(const V& a, const V& b) {  // _mm256_shuffle_ps(a, b, 0x44)
    return map([&](int i) { return ((i & 2) ? b : a).l[(i & 4) + (i & 1)]; });
  }
  static V pick_2323(const V& a, const V& b) {  // _mm256_shuffle_ps(a, b, 0xEE)
    return map([&](int i) { return ((i & 2) ? b : a).l[(i & 4) + 2 + (i & 1)]; });
  }
  static float h2f(uint16_t h) { return fp16_to_fp32(h); }
  static uint16_t f2h(float f) { return fp32_to_fp16(f); }
  static V load_i8(const int8_t* p) {
    return map([&](int i) { return static_cast<float>(p[i]); });
  }
  static V load_f16(const uint16_t* p) {
    uint16_t h[8];
    std::memcpy(h, p, sizeof h);
    return map([&](int i) { return h2f(h[i]); });
  }
  static void store_f16(uint16_t* p, const V& v) {
    uint16_t h[8];
    for (int i = 0; i < 8; ++i) h[i] = f2h(v.l[i]);
    std::memcpy(p, h, sizeof h);
  }
  static V round_f16(const V& v) {
    return map([&](int i) { return h2f(f2h(v.l[i])); });
  }
  static V swap_pairs(const V& v) {
    return map([&](int i) { return v.l[i ^ 1]; });
  }
  static float hsum8(const V& v) {
    const float* l = v.l;
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
  }
  static float hsum8_hadd(const V& v) {
    const float* l = v.l;
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
  }
  // Avx2Ops::expf8 (llama.cpp's ggml_v_expf), one lane at a time.
  static float expf1(float x) {
    const float shifter = 0x1.8p23f;
    const float z = __builtin_fmaf(x, 0x1.715476p+0f, shifter);
    const float n = z - shifter;
    const float b = __builtin_fmaf(-n, 0x1.7f7d1cp-20f, __builtin_fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = bits(z) << 23;
    const float k = from_bits(e + bits(1.0f));
    const float abs_n = from_bits(bits(n) & 0x7fffffffu);
    const float u = b * b;
    const float hi = __builtin_fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f);
    const float lo = __builtin_fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f);
    const float j = __builtin_fmaf(__builtin_fmaf(hi, u, lo), u, 0x1.ffffecp-1f * b);
    if (!(abs_n > 126.0f)) return __builtin_fmaf(j, k, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = from_bits(g + 0x7f000000u);
    const float s2 = from_bits(e - g);
    if (abs_n > 192.0f) return s1 * s1;
    return __builtin_fmaf(s2, j, s2) * s1;
  }
  static V expf8(const V& x) {
    return map([&](int i) { return expf1(x.l[i]); });
  }
};

#include "cpu/backend_kernels.inc"

}  // namespace

const BackendKernels& backend_kernels_scalar() { return kernel_table<ScalarOps, PairOps<ScalarOps>>("scalar"); }

}  // namespace ember::cpu::detail
