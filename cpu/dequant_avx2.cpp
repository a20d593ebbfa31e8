// AVX2 + FMA + F16C prefill dequantization: weight rows to f32 or bf16 for
// the GEMM tiles of a prefill (matmul.cpp), each value rounded as the
// reference dequantizers round it. Compiled with the AVX2 flags
// (cmake/EmberFlags.cmake); the decode kernels are matmul_avx2.cpp.
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "cpu/matmul_internal.h"

namespace ember::cpu::detail {
namespace {

#include "cpu/matmul_avx2_blocks.inc"

// ---------------------------------------------------------------- dequantization

// Writes 32 floats of one block given the 32 int8 values (as 32 bytes) and
// out = q * d + off.
struct F32Sink {
  float* p;
  inline void put8(__m256 v) {
    _mm256_storeu_ps(p, v);
    p += 8;
  }
};

inline __m256i f32_to_bf16_bits(__m256 v) {
  // Round to nearest even (NaN payloads are not special-cased; weights are finite).
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  return _mm256_srli_epi32(r, 16);
}

struct Bf16Sink {
  uint16_t* p;
  __m256i pending;
  bool have = false;
  inline void put8(__m256 v) {
    const __m256i b = f32_to_bf16_bits(v);
    if (!have) {
      pending = b;
      have = true;
      return;
    }
    // packus works per 128-bit lane: [p.lo, b.lo | p.hi, b.hi] -> fix order.
    __m256i packed = _mm256_packus_epi32(pending, b);
    packed = _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
    p += 16;
    have = false;
  }
};

// 32 int8 values (elements in order) -> 4 x 8 floats, q*d + off.
// (kOff false: q*d exactly as the reference computes it, sign of zero included.)
template <bool kOff, typename Sink>
inline void emit_block_i8(__m256i q, __m256 d, __m256 off, Sink& out) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (const __m128i& part : parts) {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part));
    out.put8(kOff ? _mm256_fmadd_ps(v, d, off) : _mm256_mul_ps(v, d));
  }
}

// One K-quant super-block: 8 groups of 32 values (r.q, element order),
// per 8 elements out = q * dsc [- off], the products and the subtraction
// rounded separately, exactly as the reference dequantizers compute
// (d*sc)*q - dmin*m, (d*sc)*(q - 32) and (d*(sc - 32))*(q - 4).
template <DType T, typename Sink>
inline void dequant_kblock(const uint8_t* blk, Sink& out) {
  KBlockRegs<T> r;
  kblock_load<T>(blk, r);
  float dsc[16], off[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  if constexpr (T == DType::Q2_K || T == DType::Q3_K) {
    int sc[16];
    if constexpr (T == DType::Q2_K) {
      const auto* b = reinterpret_cast<const BlockQ2_K*>(blk);
      for (int i = 0; i < 16; ++i) {
        sc[i] = b->scales[i] & 0xF;
        off[i] = r.dmin * static_cast<float>(b->scales[i] >> 4);
      }
    } else {
      q3k_scales(reinterpret_cast<const BlockQ3_K*>(blk)->scales, sc);
      for (int i = 0; i < 16; ++i) sc[i] -= 32;
    }
    for (int i = 0; i < 16; ++i) dsc[i] = r.d * static_cast<float>(sc[i]);
  } else if constexpr (T == DType::Q6_K) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(blk);
    for (int i = 0; i < 16; ++i) dsc[i] = r.d * static_cast<float>(b->scales[i]);
  } else {
    using B = std::conditional_t<T == DType::Q4_K, BlockQ4_K, BlockQ5_K>;
    const auto* b = reinterpret_cast<const B*>(blk);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      kquant_scale_min(j, b->scales, &sc, &m);
      dsc[j] = r.d * static_cast<float>(sc);
      off[j] = r.dmin * static_cast<float>(m);
    }
  }
  for (int g = 0; g < 8; ++g) {
    __m256i q = r.q[g];
    if constexpr (T == DType::Q6_K) q = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
    if constexpr (T == DType::Q3_K) q = _mm256_sub_epi8(q, _mm256_set1_epi8(4));
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i) {
      const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i]));
      if constexpr (T == DType::Q2_K) {
        const int s = 2 * g + i / 2;
        out.put8(_mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dsc[s]), v), _mm256_set1_ps(off[s])));
      } else if constexpr (T == DType::Q6_K || T == DType::Q3_K) {
        out.put8(_mm256_mul_ps(_mm256_set1_ps(dsc[2 * g + i / 2]), v));
      } else {
        out.put8(_mm256_sub_ps(_mm256_mul_ps(_mm256_set1_ps(dsc[g]), v), _mm256_set1_ps(off[g])));
      }
    }
  }
}

template <typename Sink>
void dequant_any(DType type, const uint8_t* p, int64_t n, Sink& out) {
  switch (type) {
    case DType::Q2_K:
      for (int64_t b = 0; b < n / kQK_K; ++b, p += sizeof(BlockQ2_K)) dequant_kblock<DType::Q2_K>(p, out);
      break;
    case DType::Q3_K:
      for (int64_t b = 0; b < n / kQK_K; ++b, p += sizeof(BlockQ3_K)) dequant_kblock<DType::Q3_K>(p, out);
      break;
    case DType::Q4_K:
      for (int64_t b = 0; b < n / kQK_K; ++b, p += sizeof(BlockQ4_K)) dequant_kblock<DType::Q4_K>(p, out);
      break;
    case DType::Q5_K:
      for (int64_t b = 0; b < n / kQK_K; ++b, p += sizeof(BlockQ5_K)) dequant_kblock<DType::Q5_K>(p, out);
      break;
    case DType::Q6_K:
      for (int64_t b = 0; b < n / kQK_K; ++b, p += sizeof(BlockQ6_K)) dequant_kblock<DType::Q6_K>(p, out);
      break;
    case DType::Q4_0:
      for (int64_t b = 0; b < n / kQK; ++b, p += sizeof(BlockQ4_0)) {
        const __m256 d = _mm256_set1_ps(h2f(load_u16(p)));
        const __m256i q = _mm256_sub_epi8(unpack_q4(p + 2), _mm256_set1_epi8(8));
        emit_block_i8<false>(q, d, _mm256_setzero_ps(), out);
      }
      break;
    case DType::Q4_1:
      for (int64_t b = 0; b < n / kQK; ++b, p += sizeof(BlockQ4_1)) {
        const __m256 d = _mm256_set1_ps(h2f(load_u16(p)));
        const __m256 m = _mm256_set1_ps(h2f(load_u16(p + 2)));
        emit_block_i8<true>(unpack_q4(p + 4), d, m, out);
      }
      break;
    case DType::Q5_0:
      for (int64_t b = 0; b < n / kQK; ++b, p += sizeof(BlockQ5_0))
        emit_block_i8<false>(load_wblock<DType::Q5_0>(p), _mm256_set1_ps(h2f(load_u16(p))), _mm256_setzero_ps(), out);
      break;
    case DType::Q5_1:
      for (int64_t b = 0; b < n / kQK; ++b, p += sizeof(BlockQ5_1)) {
        const __m256 d = _mm256_set1_ps(h2f(load_u16(p)));
        const __m256 m = _mm256_set1_ps(h2f(load_u16(p + 2)));
        emit_block_i8<true>(load_wblock<DType::Q5_1>(p), d, m, out);
      }
      break;
    case DType::Q8_0:
      for (int64_t b = 0; b < n / kQK; ++b, p += sizeof(BlockQ8_0)) {
        const __m256 d = _mm256_set1_ps(h2f(load_u16(p)));
        emit_block_i8<false>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)), d, _mm256_setzero_ps(), out);
      }
      break;
    case DType::F16:
    case DType::BF16:
    case DType::F32: {
      // n is a multiple of 16 here (callers pass whole rows of K % 32 == 0
      // or handle tails); remaining elements are done by the caller.
      int64_t k = 0;
      for (; k + 8 <= n; k += 8) {
        if (type == DType::F16)
          out.put8(load8<DType::F16>(p, k));
        else if (type == DType::BF16)
          out.put8(load8<DType::BF16>(p, k));
        else
          out.put8(load8<DType::F32>(p, k));
      }
      break;
    }
    default: break;
  }
}

void dequant_f32(DType type, const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  if (type == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
    return;
  }
  F32Sink out{dst};
  dequant_any(type, p, n, out);
  if (!is_quant(type) && !is_kquant(type))
    for (int64_t k = n & ~int64_t{7}; k < n; ++k)
      dst[k] = type == DType::F16 ? load1<DType::F16>(p, k) : load1<DType::BF16>(p, k);
}

void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  Bf16Sink out{dst, _mm256_setzero_si256()};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    out.put8(_mm256_loadu_ps(src + k));
    out.put8(_mm256_loadu_ps(src + k + 8));
  }
  for (; k < n; ++k) dst[k] = f2bf(src[k]);
}

void dequant_bf16(DType type, const void* src, uint16_t* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  if (type == DType::BF16) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 2);
    return;
  }
  if (type == DType::F32) {
    f32_to_bf16(static_cast<const float*>(src), dst, n);
    return;
  }
  Bf16Sink out{dst, _mm256_setzero_si256()};
  if (is_quant(type) || is_kquant(type)) {
    dequant_any(type, p, n, out);  // 32 per block: always an even number of put8
    return;
  }
  // F16
  const int64_t n16 = n & ~int64_t{15};
  dequant_any(type, p, n16, out);
  for (int64_t k = n16; k < n; ++k) dst[k] = f2bf(load1<DType::F16>(p, k));
}

}  // namespace

void avx2_dequant_f32(DType type, const void* src, float* dst, int64_t n) { dequant_f32(type, src, dst, n); }
void avx2_dequant_bf16(DType type, const void* src, uint16_t* dst, int64_t n) { dequant_bf16(type, src, dst, n); }
void avx2_f32_to_bf16(const float* src, uint16_t* dst, int64_t n) { f32_to_bf16(src, dst, n); }

}  // namespace ember::cpu::detail
