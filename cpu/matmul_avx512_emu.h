// Test-only portable emulation of the AVX-512 intrinsics used by
// matmul_avx512_kernels.inc, so that the AVX-512 kernel logic can be tested
// on CPUs without AVX-512 (tests/ops/test_matmul.cpp). Never include this in
// library code.
//
// Each function follows the pseudo-code of Intel's intrinsics guide. To catch
// reliance on undefined values, the "cast" intrinsics that leave upper lanes
// undefined fill them with garbage, and the aligned loads check alignment.
// Include it after every other header of the translation unit: it #defines
// the intrinsic names (and __m512 & co.) to the emulation.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace ember_emu512 {

union V512 {
  float f[16];
  int32_t i32[16];
  uint32_t u32[16];
  int16_t i16[32];
  uint16_t u16[32];
  int8_t i8[64];
  uint8_t u8[64];
};

inline void check_aligned(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) std::abort();  // would fault on real hardware
}
inline V512 zero() {
  V512 r;
  std::memset(&r, 0, sizeof(r));
  return r;
}
inline V512 garbage() {
  V512 r;
  for (int i = 0; i < 16; ++i) r.u32[i] = 0x7fc0dead;  // a NaN, loud if it leaks into a result
  return r;
}

inline V512 setzero() { return zero(); }
inline V512 set1_ps(float v) {
  V512 r;
  for (float& x : r.f) x = v;
  return r;
}
inline V512 set1_epi32(int v) {
  V512 r;
  for (int32_t& x : r.i32) x = v;
  return r;
}
inline V512 set1_epi8(char v) {
  V512 r;
  for (int8_t& x : r.i8) x = static_cast<int8_t>(v);
  return r;
}
inline V512 setr_epi32(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8, int a9, int a10, int a11,
                       int a12, int a13, int a14, int a15) {
  const int v[16] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15};
  V512 r;
  for (int i = 0; i < 16; ++i) r.i32[i] = v[i];
  return r;
}
inline V512 loadu(const void* p) {
  V512 r;
  std::memcpy(&r, p, 64);
  return r;
}
inline V512 load(const void* p) {
  check_aligned(p);
  return loadu(p);
}
inline void storeu_ps(void* p, V512 v) { std::memcpy(p, &v, 64); }
inline V512 maskz_loadu_ps(uint16_t k, const void* p) {
  V512 r = zero();
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) std::memcpy(&r.f[i], static_cast<const char*>(p) + 4 * i, 4);  // masked-off lanes are not read
  return r;
}
inline V512 maskz_loadu_epi16(uint32_t k, const void* p) {
  V512 r = zero();
  for (int i = 0; i < 32; ++i)
    if ((k >> i) & 1) std::memcpy(&r.u16[i], static_cast<const char*>(p) + 2 * i, 2);
  return r;
}
inline __m256i maskz_loadu_epi16_256(uint16_t k, const void* p) {
  uint16_t v[16] = {};
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) std::memcpy(&v[i], static_cast<const char*>(p) + 2 * i, 2);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
}

// ---- float arithmetic
inline V512 mul_ps(V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) a.f[i] *= b.f[i];
  return a;
}
inline V512 fmadd_ps(V512 a, V512 b, V512 c) {
  for (int i = 0; i < 16; ++i) a.f[i] = std::fma(a.f[i], b.f[i], c.f[i]);
  return a;
}
inline V512 fmsub_ps(V512 a, V512 b, V512 c) {
  for (int i = 0; i < 16; ++i) a.f[i] = std::fma(a.f[i], b.f[i], -c.f[i]);
  return a;
}
inline V512 max_ps(V512 a, V512 b) {  // MAXPS: second operand if either is NaN
  for (int i = 0; i < 16; ++i) a.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i];
  return a;
}
inline V512 abs_ps(V512 a) {
  for (int i = 0; i < 16; ++i) a.u32[i] &= 0x7fffffffu;
  return a;
}
inline float reduce_add_ps(V512 a) {
  float t[16];
  std::memcpy(t, a.f, 64);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] = t[i] + t[i + w];
  return t[0];
}
inline float reduce_max_ps(V512 a) {
  float t[16];
  std::memcpy(t, a.f, 64);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] = t[i] > t[i + w] ? t[i] : t[i + w];
  return t[0];
}
inline V512 roundscale_ps(V512 a, int imm) {
  if ((imm >> 4) != 0) std::abort();  // only scale 0 (round to integer) is emulated
  for (int i = 0; i < 16; ++i) {
    float v = a.f[i];
    switch (imm & 3) {
      case 0: v = std::nearbyint(v); break;  // default rounding mode: nearest even
      case 1: v = std::floor(v); break;
      case 2: v = std::ceil(v); break;
      default: v = std::trunc(v); break;
    }
    a.f[i] = v;
  }
  return a;
}
inline V512 cvtps_epi32(V512 a) {  // MXCSR rounding (nearest even); invalid -> INT_MIN
  V512 r;
  for (int i = 0; i < 16; ++i) {
    const float v = std::nearbyint(a.f[i]);
    r.i32[i] = (v >= -2147483648.f && v < 2147483648.f) ? static_cast<int32_t>(v) : std::numeric_limits<int32_t>::min();
  }
  return r;
}
inline V512 cvtepi32_ps(V512 a) {
  for (int i = 0; i < 16; ++i) a.f[i] = static_cast<float>(a.i32[i]);
  return a;
}
inline V512 cvtph_ps(__m256i h) {
  uint16_t v[16];
  std::memcpy(v, &h, 32);
  V512 r;
  for (int i = 0; i < 16; ++i) r.f[i] = _cvtsh_ss(v[i]);
  return r;
}

// ---- integer
inline V512 and_si512(V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) a.u32[i] &= b.u32[i];
  return a;
}
inline V512 srlv_epi32(V512 a, V512 n) {
  for (int i = 0; i < 16; ++i) a.u32[i] = n.u32[i] > 31 ? 0 : a.u32[i] >> n.u32[i];
  return a;
}
inline V512 or_si512(V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) a.u32[i] |= b.u32[i];
  return a;
}
inline V512 maskz_mov_epi8(uint64_t k, V512 a) {
  for (int i = 0; i < 64; ++i)
    if (!((k >> i) & 1)) a.u8[i] = 0;
  return a;
}
inline V512 add_epi32(V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) a.u32[i] += b.u32[i];
  return a;
}
inline V512 sub_epi32(V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) a.u32[i] -= b.u32[i];
  return a;
}
inline V512 srli_epi32(V512 a, unsigned n) {
  for (int i = 0; i < 16; ++i) a.u32[i] = n > 31 ? 0 : a.u32[i] >> n;
  return a;
}
inline V512 slli_epi32(V512 a, unsigned n) {
  for (int i = 0; i < 16; ++i) a.u32[i] = n > 31 ? 0 : a.u32[i] << n;
  return a;
}
inline V512 srli_epi16(V512 a, unsigned n) {
  for (int i = 0; i < 32; ++i) a.u16[i] = static_cast<uint16_t>(n > 15 ? 0 : a.u16[i] >> n);
  return a;
}
inline int reduce_add_epi32(V512 a) {
  uint32_t s = 0;
  for (int i = 0; i < 16; ++i) s += a.u32[i];
  return static_cast<int>(s);
}
inline __m128i cvtepi32_epi8(V512 a) {  // VPMOVDB: truncation
  int8_t v[16];
  for (int i = 0; i < 16; ++i) v[i] = static_cast<int8_t>(a.u32[i] & 0xff);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
}
inline __m256i cvtepi32_epi16(V512 a) {  // VPMOVDW: truncation
  uint16_t v[16];
  for (int i = 0; i < 16; ++i) v[i] = static_cast<uint16_t>(a.u32[i] & 0xffff);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
}
inline V512 cvtepu8_epi32(__m128i a) {
  uint8_t v[16];
  std::memcpy(v, &a, 16);
  V512 r;
  for (int i = 0; i < 16; ++i) r.i32[i] = v[i];
  return r;
}
inline V512 cvtepi8_epi32(__m128i a) {
  int8_t v[16];
  std::memcpy(v, &a, 16);
  V512 r;
  for (int i = 0; i < 16; ++i) r.i32[i] = v[i];
  return r;
}
inline V512 cvtepu16_epi32(__m256i a) {
  uint16_t v[16];
  std::memcpy(v, &a, 32);
  V512 r;
  for (int i = 0; i < 16; ++i) r.i32[i] = v[i];
  return r;
}
// VPMADDUBSW: u8 (a) x s8 (b), adjacent products added with signed saturation to 16 bits.
inline V512 maddubs_epi16(V512 a, V512 b) {
  V512 r;
  for (int i = 0; i < 32; ++i) {
    const int v = a.u8[2 * i] * b.i8[2 * i] + a.u8[2 * i + 1] * b.i8[2 * i + 1];
    r.i16[i] = static_cast<int16_t>(v > 32767 ? 32767 : v < -32768 ? -32768 : v);
  }
  return r;
}
// VPDPWSSD: s16 x s16, two products per 32-bit lane added to src, no saturation.
inline V512 dpwssd_epi32(V512 src, V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) {
    const int64_t s =
        static_cast<int64_t>(a.i16[2 * i]) * b.i16[2 * i] + static_cast<int64_t>(a.i16[2 * i + 1]) * b.i16[2 * i + 1];
    src.u32[i] += static_cast<uint32_t>(s);
  }
  return src;
}
// VPMADDWD: s16 x s16, two products per 32-bit lane added (wrapping, as the instruction).
inline V512 madd_epi16(V512 a, V512 b) { return dpwssd_epi32(V512{}, a, b); }
// VPDPBUSD: u8 (a) x s8 (b), four products per 32-bit lane added to src, no saturation.
inline V512 dpbusd_epi32(V512 src, V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) {
    int64_t s = 0;
    for (int j = 0; j < 4; ++j) s += static_cast<int32_t>(a.u8[4 * i + j]) * static_cast<int32_t>(b.i8[4 * i + j]);
    src.u32[i] += static_cast<uint32_t>(s);
  }
  return src;
}
// VDPBF16PS: src + a[2i+1]*b[2i+1] + a[2i]*b[2i] (products exact in f32).
inline V512 dpbf16_ps(V512 src, V512 a, V512 b) {
  auto f = [](uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
  };
  for (int i = 0; i < 16; ++i) {
    float t = src.f[i];
    t += f(a.u16[2 * i + 1]) * f(b.u16[2 * i + 1]);
    t += f(a.u16[2 * i]) * f(b.u16[2 * i]);
    src.f[i] = t;
  }
  return src;
}

// ---- shuffles and casts
inline V512 permutexvar_ps(V512 idx, V512 a) {
  V512 r;
  for (int i = 0; i < 16; ++i) r.f[i] = a.f[idx.u32[i] & 15];
  return r;
}
inline V512 permutexvar_epi32(V512 idx, V512 a) {
  V512 r;
  for (int i = 0; i < 16; ++i) r.u32[i] = a.u32[idx.u32[i] & 15];
  return r;
}
inline V512 add_ps(V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) a.f[i] += b.f[i];
  return a;
}
inline V512 sub_ps(V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) a.f[i] -= b.f[i];
  return a;
}
inline void store_ps(void* p, V512 a) {
  check_aligned(p);
  std::memcpy(p, a.f, 64);
}
inline V512 inserti64x4(V512 a, __m256i b, int imm) {
  std::memcpy(&a.u8[(imm & 1) * 32], &b, 32);
  return a;
}
inline V512 mullo_epi32(V512 a, V512 b) {
  for (int i = 0; i < 16; ++i) a.u32[i] *= b.u32[i];  // the low 32 bits, as the instruction
  return a;
}
inline __m256i extracti64x4_epi64(V512 a, int imm) {
  __m256i r;
  std::memcpy(&r, &a.u8[(imm & 1) * 32], 32);
  return r;
}
inline __m256i castsi512_si256(V512 a) {
  __m256i r;
  std::memcpy(&r, &a, 32);
  return r;
}
inline V512 castsi256_si512(__m256i a) {  // upper half undefined
  V512 r = garbage();
  std::memcpy(&r, &a, 32);
  return r;
}
inline V512 castps256_ps512(__m256 a) {
  V512 r = garbage();
  std::memcpy(&r, &a, 32);
  return r;
}
inline V512 castps128_ps512(__m128 a) {
  V512 r = garbage();
  std::memcpy(&r, &a, 16);
  return r;
}
inline V512 identity(V512 a) { return a; }

}  // namespace ember_emu512

#undef __m512
#define __m512 ::ember_emu512::V512
#undef __m512i
#define __m512i ::ember_emu512::V512
#undef __m512bh
#define __m512bh ::ember_emu512::V512
#undef _mm512_setzero_ps
#define _mm512_setzero_ps ::ember_emu512::setzero
#undef _mm512_setzero_si512
#define _mm512_setzero_si512 ::ember_emu512::setzero
#undef _mm512_set1_ps
#define _mm512_set1_ps ::ember_emu512::set1_ps
#undef _mm512_set1_epi32
#define _mm512_set1_epi32 ::ember_emu512::set1_epi32
#undef _mm512_set1_epi8
#define _mm512_set1_epi8 ::ember_emu512::set1_epi8
#undef _mm512_setr_epi32
#define _mm512_setr_epi32 ::ember_emu512::setr_epi32
#undef _mm512_loadu_ps
#define _mm512_loadu_ps ::ember_emu512::loadu
#undef _mm512_loadu_si512
#define _mm512_loadu_si512 ::ember_emu512::loadu
#undef _mm512_load_ps
#define _mm512_load_ps ::ember_emu512::load
#undef _mm512_load_si512
#define _mm512_load_si512 ::ember_emu512::load
#undef _mm512_storeu_ps
#define _mm512_storeu_ps ::ember_emu512::storeu_ps
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps ::ember_emu512::maskz_loadu_ps
#undef _mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi16 ::ember_emu512::maskz_loadu_epi16
#undef _mm256_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16 ::ember_emu512::maskz_loadu_epi16_256
#undef _mm512_mul_ps
#define _mm512_mul_ps ::ember_emu512::mul_ps
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps ::ember_emu512::fmadd_ps
#undef _mm512_fmsub_ps
#define _mm512_fmsub_ps ::ember_emu512::fmsub_ps
#undef _mm512_max_ps
#define _mm512_max_ps ::ember_emu512::max_ps
#undef _mm512_abs_ps
#define _mm512_abs_ps ::ember_emu512::abs_ps
#undef _mm512_reduce_add_ps
#define _mm512_reduce_add_ps ::ember_emu512::reduce_add_ps
#undef _mm512_reduce_max_ps
#define _mm512_reduce_max_ps ::ember_emu512::reduce_max_ps
#undef _mm512_roundscale_ps
#define _mm512_roundscale_ps ::ember_emu512::roundscale_ps
#undef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32 ::ember_emu512::cvtps_epi32
#undef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps ::ember_emu512::cvtepi32_ps
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps ::ember_emu512::cvtph_ps
#undef _mm512_and_si512
#define _mm512_and_si512 ::ember_emu512::and_si512
#undef _mm512_srlv_epi32
#define _mm512_srlv_epi32 ::ember_emu512::srlv_epi32
#undef _mm512_or_si512
#define _mm512_or_si512 ::ember_emu512::or_si512
#undef _mm512_maskz_mov_epi8
#define _mm512_maskz_mov_epi8 ::ember_emu512::maskz_mov_epi8
#undef _mm512_add_epi32
#define _mm512_add_epi32 ::ember_emu512::add_epi32
#undef _mm512_sub_epi32
#define _mm512_sub_epi32 ::ember_emu512::sub_epi32
#undef _mm512_srli_epi32
#define _mm512_srli_epi32 ::ember_emu512::srli_epi32
#undef _mm512_slli_epi32
#define _mm512_slli_epi32 ::ember_emu512::slli_epi32
#undef _mm512_srli_epi16
#define _mm512_srli_epi16 ::ember_emu512::srli_epi16
#undef _mm512_reduce_add_epi32
#define _mm512_reduce_add_epi32 ::ember_emu512::reduce_add_epi32
#undef _mm512_cvtepi32_epi8
#define _mm512_cvtepi32_epi8 ::ember_emu512::cvtepi32_epi8
#undef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16 ::ember_emu512::cvtepi32_epi16
#undef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32 ::ember_emu512::cvtepu8_epi32
#undef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32 ::ember_emu512::cvtepi8_epi32
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32 ::ember_emu512::cvtepu16_epi32
#undef _mm512_maddubs_epi16
#define _mm512_maddubs_epi16 ::ember_emu512::maddubs_epi16
#undef _mm512_dpwssd_epi32
#define _mm512_dpwssd_epi32 ::ember_emu512::dpwssd_epi32
#undef _mm512_madd_epi16
#define _mm512_madd_epi16 ::ember_emu512::madd_epi16
#undef _mm512_dpbusd_epi32
#define _mm512_dpbusd_epi32 ::ember_emu512::dpbusd_epi32
#undef _mm512_dpbf16_ps
#define _mm512_dpbf16_ps ::ember_emu512::dpbf16_ps
#undef _mm512_permutexvar_ps
#define _mm512_permutexvar_ps ::ember_emu512::permutexvar_ps
#undef _mm512_permutexvar_epi32
#define _mm512_permutexvar_epi32 ::ember_emu512::permutexvar_epi32
#undef _mm512_add_ps
#define _mm512_add_ps ::ember_emu512::add_ps
#undef _mm512_sub_ps
#define _mm512_sub_ps ::ember_emu512::sub_ps
#undef _mm512_store_ps
#define _mm512_store_ps ::ember_emu512::store_ps
#undef _mm512_inserti64x4
#define _mm512_inserti64x4 ::ember_emu512::inserti64x4
#undef _mm512_mullo_epi32
#define _mm512_mullo_epi32 ::ember_emu512::mullo_epi32
#undef _mm512_extracti64x4_epi64
#define _mm512_extracti64x4_epi64 ::ember_emu512::extracti64x4_epi64
#undef _mm512_castsi512_si256
#define _mm512_castsi512_si256 ::ember_emu512::castsi512_si256
#undef _mm512_castsi256_si512
#define _mm512_castsi256_si512 ::ember_emu512::castsi256_si512
#undef _mm512_castps256_ps512
#define _mm512_castps256_ps512 ::ember_emu512::castps256_ps512
#undef _mm512_castps128_ps512
#define _mm512_castps128_ps512 ::ember_emu512::castps128_ps512
#undef _mm512_castps_si512
#define _mm512_castps_si512 ::ember_emu512::identity
#undef _mm512_castsi512_ps
#define _mm512_castsi512_ps ::ember_emu512::identity
