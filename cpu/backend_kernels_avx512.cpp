// The CPU backend's kernels (backend_kernels.inc) on AVX-512: the AVX2
// variant's 8-lane operations (Avx2Ops) with native 512-bit wide vectors, so
// attention's V pass, softmax and K rows run 16 lanes per instruction. Every
// wide operation is the 8-lane one on each half, so the results are the AVX2
// and scalar variants' bit for bit (tests/unit/backend/cpu_kernels_test.cpp).
// Compiled with the AVX-512 flags (cmake/EmberFlags.cmake): nothing here may
// run before isa_supported(Isa::kAvx512Vnni) was checked (backend_kernels()
// does).
// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*()
// values, which -Wall reports as (maybe-)uninitialized once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/backend_kernels.h"

namespace ember::cpu::detail {
namespace {

#include "cpu/backend_kernels_avx2_ops.inc"

struct Avx512Wide {
  using W = __m512;
  static constexpr int kLanes = 16;
  // The V pass's register tile: 4 queries x 4 vectors (64 dimensions) of
  // accumulators, 16 of the 32 registers.
  static constexpr int kGroupTile = 4;
  static constexpr int kDimTile = 4;
  // Step 1's tiles across rows: 8 queries' accumulators for two K rows
  // (tile_block8), or their two pairs for one K row (vec_block8).
  static constexpr int kQueryTile = 8;
  static constexpr int kVecQueryTile = 8;
  static W load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, W v) { _mm512_storeu_ps(p, v); }
  static W set1(float x) { return _mm512_set1_ps(x); }
  static W zero() { return _mm512_setzero_ps(); }
  static W add(W a, W b) { return _mm512_add_ps(a, b); }
  static W sub(W a, W b) { return _mm512_sub_ps(a, b); }
  static W mul(W a, W b) { return _mm512_mul_ps(a, b); }
  static W fmadd(W a, W b, W c) { return _mm512_fmadd_ps(a, b, c); }
  static W load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  using Half = Avx2Ops;
  static float h2f(uint16_t h) { return Avx2Ops::h2f(h); }
  static W load_i8(const int8_t* p) {  // 16 int8 -> f32 (exact)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static W join(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }
  static W load_i8_rows(const int8_t* a, const int8_t* b) {  // [8 int8 at a | 8 at b] -> f32
    const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(a));
    const __m128i both = _mm_unpacklo_epi64(lo, _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(both));
  }
  static W load_f16_rows(const uint16_t* a, const uint16_t* b) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
  }
  static W round_f16(W v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
  static W max(W a, W m) { return _mm512_max_ps(a, m); }
  static __m256 lo(W v) { return _mm512_castps512_ps256(v); }
  static __m256 hi(W v) { return _mm512_extractf32x8_ps(v, 1); }
  // Avx2Ops::expf8 on 16 lanes: the same operations and constants (masks in
  // place of the blend vectors).
  static W expf16(W x) {
    const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shifter);
    const __m512 n = _mm512_sub_ps(z, shifter);
    const __m512 b =
        _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(z), 23);
    const __m512 k = _mm512_castsi512_ps(_mm512_add_epi32(e, _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    const __m512 abs_n = _mm512_abs_ps(n);
    const __mmask16 big = _mm512_cmp_ps_mask(abs_n, _mm512_set1_ps(126.0f), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 hi = _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f));
    const __m512 lo = _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f));
    const __m512 j = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, u, lo), u, _mm512_mul_ps(_mm512_set1_ps(0x1.ffffecp-1f), b));
    if (!big) return _mm512_fmadd_ps(j, k, k);
    const __mmask16 le = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
    const __m512i g = _mm512_maskz_mov_epi32(le, _mm512_set1_epi32(static_cast<int>(0x82000000u)));
    const __m512 s1 = _mm512_castsi512_ps(_mm512_add_epi32(g, _mm512_set1_epi32(0x7f000000)));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_sub_epi32(e, g));
    const __mmask16 huge = _mm512_cmp_ps_mask(abs_n, _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    const __m512 scaled = _mm512_mul_ps(_mm512_fmadd_ps(s2, j, s2), s1);
    const __m512 normal = _mm512_fmadd_ps(k, j, k);
    return _mm512_mask_blend_ps(huge, _mm512_mask_blend_ps(big, normal, scaled), _mm512_mul_ps(s1, s1));
  }
};

#include "cpu/backend_kernels.inc"

}  // namespace

const BackendKernels& backend_kernels_avx512() { return kernel_table<Avx2Ops, Avx512Wide>("avx512"); }

}  // namespace ember::cpu::detail
