// AVX2 + FMA + F16C variant (the library baseline).
//
// Quantized weights: the activation rows are quantized once per call to
// 8-bit blocks of 32 (Q8_0-style) and stored in a "paired" layout (ActPair
// below) that matches how two consecutive Q4 weight blocks unpack into two
// registers: one 16-byte load per block, one shift and two ANDs give
// lo = [blk0 elems 0..15 | blk1 elems 0..15] and hi = [blk0 16..31 | blk1 16..31].
// _mm256_maddubs_epi16 (u8 x s8 -> s16 pairs) on lo and hi, one add, one
// _mm256_madd_epi16 (-> s32) and one conversion give 8 f32 lanes, lanes 0-3
// belonging to blk0 and 4-7 to blk1, which are scaled by per-lane scale
// vectors [d0 x4 | d1 x4]. So every conversion, scale and FMA serves two
// blocks. Saturation cannot happen: Q4 nibbles are <= 15 against activations
// in [-127, 127] (4 products per s16 lane after the add: <= 7620); Q8_0 uses
// |w| <= 128 with sign(a, w) (2 products per lane: <= 32512) and adds in s32.
//   Q4_0: w = dw*(q-8):  sum = dw*(dx*sum(q*a) - 8*s),   s = dx*sum(a)
//   Q4_1: w = dw*q + mw: sum = dw*dx*sum(q*a) + mw*s
//   Q8_0: w = dw*q:      sum = dw*dx*sum(|q| * sign(a, q))
// The per-block s terms are spread over the block's 4 lanes (ActPair::s holds
// 2s for Q4_0 and s/4 for Q4_1, see there).
#include <cstring>
#include <type_traits>

#include "cpu/matmul_internal.h"

namespace ember::cpu::detail {
namespace {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---------------------------------------------------------------- activations

// One record per pair of activation blocks (2p, 2p+1) of a row; an odd last
// block is paired with an all-zero block (d = s = 0).
struct alignas(32) ActPair {
  int8_t lo[32];  // [blk 2p elems 0..15 | blk 2p+1 elems 0..15]
  int8_t hi[32];  // [blk 2p elems 16..31 | blk 2p+1 elems 16..31]
  float d[8];     // [d_2p x4 | d_2p+1 x4]
  // s = d*sum(q) of the block, times 2 for Q4_0 (4 lanes x 2s = 8s) and
  // times 1/4 for Q4_1 (4 lanes x s/4 = s); unused (0) for Q8_0.
  float s[8];
};
static_assert(sizeof(ActPair) == 128);

inline int64_t n_pairs(int64_t K) { return (K / kQK + 1) / 2; }

size_t act_row_bytes(DType type, int64_t K) {
  return is_quant(type) ? static_cast<size_t>(n_pairs(K)) * sizeof(ActPair) : 0;
}

// Quantizes one block of 32 floats: returns the 32 int8 values in element
// order, amax and sum(q) (scales: act_block_scales).
inline __m256i quantize_block(const float* xb, float* amax_out, int* sum_out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
  const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
  const __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                                  _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
  const float amax = hmax8(mx);
  const float id = amax != 0.f ? 127.f / amax : 0.f;  // same formula as quantize_block_q8_scalar
  const __m256 mul = _mm256_set1_ps(id);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), kRound));
  __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), kRound));
  __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), kRound));
  __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), kRound));
  const __m256i sum4 = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  __m128i s2 = _mm_add_epi32(_mm256_castsi256_si128(sum4), _mm256_extracti128_si256(sum4, 1));
  s2 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, _MM_SHUFFLE(1, 0, 3, 2)));
  s2 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, _MM_SHUFFLE(2, 3, 0, 1)));
  *sum_out = _mm_cvtsi128_si32(s2);
  *amax_out = amax;
  // packs work per 128-bit lane; the permutation restores element order.
  i0 = _mm256_packs_epi32(i0, i1);
  i2 = _mm256_packs_epi32(i2, i3);
  i0 = _mm256_packs_epi16(i0, i2);
  return _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void prepare_acts(DType type, const float* x, int64_t M, int64_t K, uint8_t* act) {
  if (!is_quant(type)) return;
  const int64_t nb = K / kQK, np = n_pairs(K);
  const float s_mul = type == DType::Q4_0 ? 2.f : type == DType::Q4_1 ? 0.25f : 0.f;
  for (int64_t m = 0; m < M; ++m) {
    auto* pairs = reinterpret_cast<ActPair*>(act + static_cast<size_t>(m) * static_cast<size_t>(np) * sizeof(ActPair));
    const float* xr = x + m * K;
    for (int64_t p = 0; p < np; ++p) {
      ActPair& ap = pairs[p];
      for (int h = 0; h < 2; ++h) {
        const int64_t b = 2 * p + h;
        float amax = 0.f, d = 0.f, s = 0.f;
        int sum = 0;
        __m256i q = _mm256_setzero_si256();
        if (b < nb) {
          q = quantize_block(xr + b * kQK, &amax, &sum);
          act_block_scales(type, amax, sum, &d, &s);
        }
        _mm_store_si128(reinterpret_cast<__m128i*>(ap.lo + 16 * h), _mm256_castsi256_si128(q));
        _mm_store_si128(reinterpret_cast<__m128i*>(ap.hi + 16 * h), _mm256_extracti128_si256(q, 1));
        _mm_store_ps(ap.d + 4 * h, _mm_set1_ps(d));
        _mm_store_ps(ap.s + 4 * h, _mm_set1_ps(s_mul * s));
      }
    }
  }
}

// ---------------------------------------------------------------- quantized kernels

template <DType T>
struct QInfo;
template <>
struct QInfo<DType::Q4_0> {
  static constexpr size_t kBytes = sizeof(BlockQ4_0);
  static constexpr size_t kQs = 2;
};
template <>
struct QInfo<DType::Q4_1> {
  static constexpr size_t kBytes = sizeof(BlockQ4_1);
  static constexpr size_t kQs = 4;
};
template <>
struct QInfo<DType::Q8_0> {
  static constexpr size_t kBytes = sizeof(BlockQ8_0);
  static constexpr size_t kQs = 2;
};

// 16 bytes of packed nibbles -> 32 bytes 0..15 in element order
// (low nibbles are elements 0..15, high nibbles 16..31). Used by dequantization.
inline __m256i unpack_q4(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

inline __m128i loadu128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// One weight row's pair of blocks, unpacked to match ActPair.
struct WPair {
  __m256i lo, hi;  // Q4: unsigned nibbles; Q8_0: signed values
  __m256 d;        // [d0 x4 | d1 x4]
  __m256 m;        // Q4_1: [m0 x4 | m1 x4]
};

// kHalf: blk1 does not exist (odd block count); its lanes become 0.
template <DType T, bool kHalf>
inline WPair load_wpair(const uint8_t* blk0) {
  using I = QInfo<T>;
  const uint8_t* blk1 = blk0 + I::kBytes;
  WPair w;
  if constexpr (T == DType::Q8_0) {
    const __m128i a0 = loadu128(blk0 + 2), a1 = loadu128(blk0 + 18);
    if constexpr (kHalf) {
      w.lo = _mm256_zextsi128_si256(a0);
      w.hi = _mm256_zextsi128_si256(a1);
    } else {
      w.lo = _mm256_inserti128_si256(_mm256_castsi128_si256(a0), loadu128(blk1 + 2), 1);
      w.hi = _mm256_inserti128_si256(_mm256_castsi128_si256(a1), loadu128(blk1 + 18), 1);
    }
  } else {
    const __m128i q0 = loadu128(blk0 + I::kQs);
    const __m256i v = kHalf ? _mm256_zextsi128_si256(q0)
                            : _mm256_inserti128_si256(_mm256_castsi128_si256(q0), loadu128(blk1 + I::kQs), 1);
    const __m256i mask = _mm256_set1_epi8(0x0F);
    w.lo = _mm256_and_si256(v, mask);
    w.hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  }
  if constexpr (T == DType::Q4_1) {
    // [d0, m0, d1, m1] in one conversion
    __m128i h = _mm_cvtsi32_si128(static_cast<int>(load_u32(blk0)));
    if constexpr (!kHalf) h = _mm_insert_epi32(h, static_cast<int>(load_u32(blk1)), 1);
    const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(h));
    w.d = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
    w.m = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
  } else {
    __m128i h = _mm_cvtsi32_si128(load_u16(blk0));
    if constexpr (!kHalf) h = _mm_insert_epi16(h, load_u16(blk1), 1);
    const __m256 f = _mm256_castps128_ps256(_mm_cvtph_ps(h));
    w.d = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
  }
  return w;
}

template <DType T>
inline __m256 pair_dot(const WPair& w, const __m256i& wabs_lo, const __m256i& wabs_hi, const ActPair& a,
                       __m256 acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i alo = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.lo));
  const __m256i ahi = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.hi));
  const __m256 ad = _mm256_load_ps(a.d);
  if constexpr (T == DType::Q8_0) {
    const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs_lo, _mm256_sign_epi8(alo, w.lo)), ones);
    const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs_hi, _mm256_sign_epi8(ahi, w.hi)), ones);
    const __m256 p = _mm256_cvtepi32_ps(_mm256_add_epi32(plo, phi));
    return _mm256_fmadd_ps(_mm256_mul_ps(p, ad), w.d, acc);
  } else {
    const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, alo), _mm256_maddubs_epi16(w.hi, ahi));
    const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
    const __m256 as = _mm256_load_ps(a.s);
    if constexpr (T == DType::Q4_0) {
      // lanes: dx*sum(q*a) - 2s per lane -> dx*sum(q*a) - 8s per block
      return _mm256_fmadd_ps(_mm256_fmsub_ps(p, ad, as), w.d, acc);
    } else {
      acc = _mm256_fmadd_ps(_mm256_mul_ps(p, ad), w.d, acc);
      return _mm256_fmadd_ps(w.m, as, acc);
    }
  }
}

// Software prefetch (into L2) of the weight rows one row group ahead: the
// same position in row n + R. The rows are contiguous, so this runs exactly
// one group ahead of the loads whatever the row length. Measured on Zen 3
// with weights streamed from DRAM, 1 thread: ~1.3-1.6x over the hardware
// prefetcher alone; L2 (T1) beat L1 (T0), which a group-ahead distance of
// up to 8 x 16 KiB overflows. Prefetching past the chunk or the matrix is
// harmless (prefetches never fault).
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }

// y[m0..m0+MT)[n..n+R) for weight rows n..n+R.
template <DType T, int R, int MT>
inline void qtile(const DecodeCtx& c, int64_t n, int64_t m0) {
  using I = QInfo<T>;
  const int64_t nb = c.K / kQK, np = nb / 2;
  const uint8_t* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = c.w + static_cast<size_t>(n + r) * c.w_row_bytes;
  const size_t pf_dist = R * c.w_row_bytes;
  const ActPair* ap[MT];
  for (int m = 0; m < MT; ++m)
    ap[m] = reinterpret_cast<const ActPair*>(c.act + static_cast<size_t>(m0 + m) * c.act_row_bytes);
  __m256 acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = _mm256_setzero_ps();

  auto step = [&](int64_t p, auto half) {
    constexpr bool kHalf = decltype(half)::value;
    for (int r = 0; r < R; ++r) {
      prefetch(wr[r] + static_cast<size_t>(2 * p) * I::kBytes + pf_dist);
      const WPair w = load_wpair<T, kHalf>(wr[r] + static_cast<size_t>(2 * p) * I::kBytes);
      __m256i wabs_lo = w.lo, wabs_hi = w.hi;
      if constexpr (T == DType::Q8_0) {
        wabs_lo = _mm256_sign_epi8(w.lo, w.lo);
        wabs_hi = _mm256_sign_epi8(w.hi, w.hi);
      }
      for (int m = 0; m < MT; ++m) acc[r][m] = pair_dot<T>(w, wabs_lo, wabs_hi, ap[m][p], acc[r][m]);
    }
  };
  for (int64_t p = 0; p < np; ++p) step(p, std::false_type{});
  if (nb & 1) step(np, std::true_type{});

  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) c.y[(m0 + m) * c.ldy + n + r] = hsum8(acc[r][m]);
}

// All M rows for weight rows n..n+G (G = 4) or one row (G = 1).
template <DType T>
inline void qgroup4(const DecodeCtx& c, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= c.M; m += 4) {
    qtile<T, 2, 4>(c, n, m);
    qtile<T, 2, 4>(c, n + 2, m);
  }
  switch (c.M - m) {
    case 3:
      qtile<T, 2, 3>(c, n, m);
      qtile<T, 2, 3>(c, n + 2, m);
      break;
    case 2: qtile<T, 4, 2>(c, n, m); break;
    case 1: qtile<T, 4, 1>(c, n, m); break;
    default: break;
  }
}
template <DType T>
inline void qgroup1(const DecodeCtx& c, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= c.M; m += 4) qtile<T, 1, 4>(c, n, m);
  switch (c.M - m) {
    case 3: qtile<T, 1, 3>(c, n, m); break;
    case 2: qtile<T, 1, 2>(c, n, m); break;
    case 1: qtile<T, 1, 1>(c, n, m); break;
    default: break;
  }
}

template <DType T>
void qkernel(const DecodeCtx& c, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) qgroup4<T>(c, n);
  for (; n < n1; ++n) qgroup1<T>(c, n);
}

// ---------------------------------------------------------------- float kernels

template <DType T>
inline __m256 load8(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else if constexpr (T == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}
template <DType T>
inline float load1(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::F32) {
    float f;
    std::memcpy(&f, row + 4 * k, 4);
    return f;
  } else if constexpr (T == DType::F16) {
    return h2f(load_u16(row + 2 * k));
  } else {
    return bf2f(load_u16(row + 2 * k));
  }
}

template <DType T, int R, int MT>
inline void ftile(const DecodeCtx& c, int64_t n, int64_t m0) {
  const uint8_t* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = c.w + static_cast<size_t>(n + r) * c.w_row_bytes;
  const float* xr[MT];
  for (int m = 0; m < MT; ++m) xr[m] = c.x + (m0 + m) * c.K;
  __m256 acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = _mm256_setzero_ps();
  const size_t pf_dist = R * c.w_row_bytes;
  constexpr size_t kElemBytes = T == DType::F32 ? 4 : 2;
  int64_t k = 0;
  for (; k + 8 <= c.K; k += 8) {
    __m256 xv[MT];
    for (int m = 0; m < MT; ++m) xv[m] = _mm256_loadu_ps(xr[m] + k);
    for (int r = 0; r < R; ++r) {
      // one prefetch per 32 bytes of weights
      if (kElemBytes == 4 || (k & 15) == 0) prefetch(wr[r] + static_cast<size_t>(k) * kElemBytes + pf_dist);
      const __m256 wv = load8<T>(wr[r], k);
      for (int m = 0; m < MT; ++m) acc[r][m] = _mm256_fmadd_ps(wv, xv[m], acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) {
      float v = hsum8(acc[r][m]);
      for (int64_t kk = k; kk < c.K; ++kk) v += load1<T>(wr[r], kk) * xr[m][kk];
      c.y[(m0 + m) * c.ldy + n + r] = v;
    }
}

template <DType T>
inline void fgroup8(const DecodeCtx& c, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= c.M; m += 4)
    for (int g = 0; g < 8; g += 2) ftile<T, 2, 4>(c, n + g, m);
  switch (c.M - m) {
    case 3:
      for (int g = 0; g < 8; g += 2) ftile<T, 2, 3>(c, n + g, m);
      break;
    case 2:
      ftile<T, 4, 2>(c, n, m);
      ftile<T, 4, 2>(c, n + 4, m);
      break;
    case 1: ftile<T, 8, 1>(c, n, m); break;
    default: break;
  }
}
template <DType T>
inline void fgroup1(const DecodeCtx& c, int64_t n) {
  int64_t m = 0;
  for (; m + 4 <= c.M; m += 4) ftile<T, 1, 4>(c, n, m);
  switch (c.M - m) {
    case 3: ftile<T, 1, 3>(c, n, m); break;
    case 2: ftile<T, 1, 2>(c, n, m); break;
    case 1: ftile<T, 1, 1>(c, n, m); break;
    default: break;
  }
}

template <DType T>
void fkernel(const DecodeCtx& c, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 8 <= n1; n += 8) fgroup8<T>(c, n);
  for (; n < n1; ++n) fgroup1<T>(c, n);
}

DecodeKernel kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return qkernel<DType::Q4_0>;
    case DType::Q4_1: return qkernel<DType::Q4_1>;
    case DType::Q8_0: return qkernel<DType::Q8_0>;
    case DType::F16: return fkernel<DType::F16>;
    case DType::BF16: return fkernel<DType::BF16>;
    case DType::F32: return fkernel<DType::F32>;
    default: return nullptr;
  }
}

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

template <typename Sink>
void dequant_any(DType type, const uint8_t* p, int64_t n, Sink& out) {
  switch (type) {
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
        if (type == DType::F16) out.put8(load8<DType::F16>(p, k));
        else if (type == DType::BF16) out.put8(load8<DType::BF16>(p, k));
        else out.put8(load8<DType::F32>(p, k));
      }
      break;
    }
    default:
      break;
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
  if (!is_quant(type))
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
  if (is_quant(type)) {
    dequant_any(type, p, n, out);  // 32 per block: always an even number of put8
    return;
  }
  // F16
  const int64_t n16 = n & ~int64_t{15};
  dequant_any(type, p, n16, out);
  for (int64_t k = n16; k < n; ++k) dst[k] = f2bf(load1<DType::F16>(p, k));
}

}  // namespace

const IsaImpl& avx2_impl() {
  static const IsaImpl impl{"avx2", act_row_bytes, prepare_acts, kernel, dequant_f32, dequant_bf16, f32_to_bf16};
  return impl;
}

}  // namespace ember::cpu::detail
