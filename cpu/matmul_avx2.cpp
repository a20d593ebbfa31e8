// AVX2 + FMA + F16C variant (the library baseline).
//
// Quantized weights: the activation rows are quantized once per call to
// 8-bit blocks of 32 (natural layout, matmul_internal.h). A weight block is
// unpacked to 32 bytes in element order, _mm256_maddubs_epi16 (u8 x s8 ->
// s16 pairs) and _mm256_madd_epi16 (-> s32) give 8 lanes of 4 consecutive
// products, which are converted, scaled by dw*dx and accumulated with one FMA
// per block and output: the summation order of quant_dot_reference (and of
// llama.cpp's AVX2 dot products), so results are bit-identical to the scalar
// variant. Saturation cannot happen: Q4_1 nibbles are <= 15 against
// activations in [-127, 127]; Q4_0/Q8_0 use |w| <= 128 with sign(a, w), two
// products per s16 lane (<= 32512).
//   Q4_0: w = dw*(q-8)   Q4_1: w = dw*q + mw (+ mw * s, s = dx*sum(a))   Q8_0: w = dw*q
// The weight block loaders are matmul_avx2_blocks.inc, the prefill
// dequantization dequant_avx2.cpp.
#include <algorithm>
#include <cstddef>
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

inline int hsum_epi32(__m256i v) {  // exact: the order of integer additions does not matter
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(t);
}
inline int hsum_epi32(__m128i t) {
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(t);
}
#include "cpu/matmul_avx2_blocks.inc"

// ---------------------------------------------------------------- activations

// Activations use the natural layout of matmul_internal.h (q8_natural_row):
// per row K int8 values in element order, then the block scales d and the
// Q4_1 sum terms s as f32.
size_t act_row_bytes(DType type, int64_t K) {
  return is_kquant(type) ? q8k_row_bytes(K) : is_quant(type) ? q8_natural_row_bytes(K) : 0;
}

// Quantizes one block of 32 floats: returns the 32 int8 values in element
// order, amax and sum(q) (scales: act_block_scales), and where asked the
// sums of its two 16-value halves.
inline __m256i quantize_block(const float* xb, float* amax_out, int* sum_out, int32_t* halves = nullptr) {
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
  if (halves) {
    halves[0] = hsum_epi32(_mm256_add_epi32(i0, i1));
    halves[1] = hsum_epi32(_mm256_add_epi32(i2, i3));
  }
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

// quantize_row_q8k (llama.cpp's quantize_row_q8_K_ref, which its x86 build
// uses) with vector operations and the same results for every input: the
// largest |x| by max (NaN skipped as the scalar comparison skips it), the
// first element of that magnitude gives the sign, then the same product,
// round-to-nearest-even and clamp (NaN to 127, as fminf does).
void quantize_row_q8k_avx2(const float* x, int64_t K, Q8KBlock* y) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < K / kQK_K; ++b, x += kQK_K) {
    Q8KBlock& o = y[b];
    __m256 amax8 = _mm256_setzero_ps();
    for (int j = 0; j < kQK_K; j += 8)  // (max_ps returns its second operand when one is NaN)
      amax8 = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), amax8);
    const float amax = hmax8(amax8);
    if (amax == 0.f) {
      o.d = 0.f;
      std::memset(o.qs, 0, sizeof(o.qs));
      std::memset(o.bsums, 0, sizeof(o.bsums));
      continue;
    }
    float mx = 0.f;
    const __m256 am = _mm256_set1_ps(amax);
    for (int j = 0; j < kQK_K; j += 8) {
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), am, _CMP_EQ_OQ));
      if (hit) {
        mx = x[j + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.f / mx;
    const __m256 is = _mm256_set1_ps(iscale), hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-128.f);
    for (int j = 0; j < kQK_K; j += 32) {
      __m256i q[4];
      for (int v = 0; v < 4; ++v) {
        __m256 t = _mm256_round_ps(_mm256_mul_ps(is, _mm256_loadu_ps(x + j + 8 * v)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        t = _mm256_max_ps(_mm256_min_ps(t, hi), lo);  // (min_ps: NaN -> 127)
        q[v] = _mm256_cvtps_epi32(t);
      }
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.qs + j),
                          _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(o.qs + 16 * g)));
      o.bsums[g] = static_cast<int16_t>(hsum_epi32(_mm256_madd_epi16(w, _mm256_set1_epi16(1))));
    }
    o.d = 1.f / iscale;
  }
}

void prepare_acts(DType type, const float* x, int64_t M, int64_t K, uint8_t* act) {
  if (is_kquant(type)) {  // Q8_K: quantize_row_q8k's results, with vector operations
    const size_t rb = q8k_row_bytes(K);
    for (int64_t m = 0; m < M; ++m)
      quantize_row_q8k_avx2(x + m * K, K, reinterpret_cast<Q8KBlock*>(act + static_cast<size_t>(m) * rb));
    return;
  }
  if (!is_quant(type)) return;
  const size_t rb = q8_natural_row_bytes(K);
  const int64_t nb = K / kQK;
  for (int64_t m = 0; m < M; ++m) {
    uint8_t* base = act + static_cast<size_t>(m) * rb;
    float* d = reinterpret_cast<float*>(base + K);
    float* s = d + nb;
    const float* xr = x + m * K;
    for (int64_t b = 0; b < nb; ++b) {
      float amax;
      int sum;
      const __m256i q = quantize_block(xr + b * kQK, &amax, &sum);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + b * kQK), q);
      act_block_scales(type, amax, sum, d + b, s + b);
    }
  }
}

// amx_prepare_acts' rows (matmul_internal.h), the same values: per block
// quantize_block (quantize_block_q8_scalar's values), its scales by the Q8_1
// rule (sx), its halves' sums.
void tile_prepare_acts(const float* x, int64_t M, int64_t K, uint8_t* act) {
  const size_t arb = amx_act_row_bytes(K);
  const int64_t nb = K / kQK;
  for (int64_t m = 0; m < M; ++m) {
    uint8_t* row = act + static_cast<size_t>(m) * arb;
    uint8_t* scales = row + static_cast<size_t>(K);
    for (int64_t b = 0; b < nb; ++b) {
      float amax, d, s;
      int sum;
      int32_t halves[2];
      const __m256i q = quantize_block(x + m * K + b * kQK, &amax, &sum, halves);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 32 * b), q);
      act_block_scales(DType::Q4_1, amax, sum, &d, &s);
      std::memcpy(scales + 4 * static_cast<size_t>(b), &d, 4);
      std::memcpy(scales + 4 * static_cast<size_t>(nb + b), &s, 4);
      std::memcpy(scales + 8 * static_cast<size_t>(nb + b), halves, 8);
    }
  }
}

// ---------------------------------------------------------------- quantized kernels
//
// The order of the float arithmetic is the one of matmul_internal.h's
// quant_dot_reference (llama.cpp's on AVX2): per block, 8 integer lanes of 4
// consecutive products, scaled by dw*dx (exact: two fp16 values) and
// fused-multiply-added into 8 f32 lanes; the lanes are summed at the end by
// hsum8 and, for Q4_1, the sequential sum of mw*s is added. So the result of
// an output never depends on the tile shape, M or the thread count.

// Unsigned weight values (and a min term): Q4_1, Q5_1.
template <DType T>
inline constexpr bool kUnsignedW = T == DType::Q4_1 || T == DType::Q5_1;

// 8 lanes, lane k = sum of w*a over the elements 4k..4k+3. Signed weights
// use |w| * sign(a, w) (u8 x s8 pairs: at most 2 * 128 * 127, no saturation);
// Q4_1's nibbles are unsigned already (2 * 15 * 127).
template <DType T>
inline __m256 lane_dot(__m256i w, __m256i wabs, __m256i a) {
  const __m256i p16 = kUnsignedW<T> ? _mm256_maddubs_epi16(w, a) : _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(a, w));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
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
  const int64_t nb = c.K / kQK;
  const uint8_t* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = c.w + static_cast<size_t>(n + r) * c.w_row_bytes;
  const size_t pf_dist = R * c.w_row_bytes;
  Q8Row a[MT];
  for (int m = 0; m < MT; ++m) a[m] = q8_natural_row(c.act, c.act_row_bytes, c.K, m0 + m);
  __m256 acc[R][MT];
  float summs[R][MT];
  __m128 summ4[R];
  for (int r = 0; r < R; ++r) {
    summ4[r] = _mm_setzero_ps();
    for (int m = 0; m < MT; ++m) {
      acc[r][m] = _mm256_setzero_ps();
      summs[r][m] = 0.f;
    }
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i w[R], wabs[R];
    __m256 dw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = wr[r] + static_cast<size_t>(b) * I::kBytes;
      prefetch(blk + pf_dist);
      w[r] = load_wblock<T>(blk);
      wabs[r] = kUnsignedW<T> ? w[r] : _mm256_sign_epi8(w[r], w[r]);
      dw[r] = _mm256_set1_ps(h2f(load_u16(blk)));
    }
    for (int m = 0; m < MT; ++m) {
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[m].qs + b * kQK));
      const __m256 dx = _mm256_broadcast_ss(a[m].d + b);
      for (int r = 0; r < R; ++r)
        acc[r][m] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), lane_dot<T>(w[r], wabs[r], av), acc[r][m]);
    }
    if constexpr (kUnsignedW<T>) {  // (mw * s: exact products of two fp16 values)
      if constexpr (MT == 4) {      // the 4 rows' sums in one register per weight row
        const __m128 sv = _mm_setr_ps(a[0].s[b], a[1].s[b], a[2].s[b], a[3].s[b]);
        for (int r = 0; r < R; ++r) {
          const __m128 mw = _mm_set1_ps(h2f(load_u16(wr[r] + static_cast<size_t>(b) * I::kBytes + 2)));
          summ4[r] = _mm_add_ps(summ4[r], _mm_mul_ps(mw, sv));
        }
      } else {
        for (int r = 0; r < R; ++r) {
          const float mw = h2f(load_u16(wr[r] + static_cast<size_t>(b) * I::kBytes + 2));
          for (int m = 0; m < MT; ++m) summs[r][m] += mw * a[m].s[b];
        }
      }
    }
  }
  if constexpr (kUnsignedW<T> && MT == 4)
    for (int r = 0; r < R; ++r) _mm_storeu_ps(summs[r], summ4[r]);
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) {
      float v = hsum8(acc[r][m]);
      if constexpr (kUnsignedW<T>) v += summs[r][m];
      c.y[(m0 + m) * c.ldy + n + r] = v;
    }
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

// ---------------------------------------------------------------- K-quant kernels
//
// Q2_K ... Q6_K against Q8_K activations, in the order of
// kquant_dot_reference for the call's DecodeCtx::korder (llama.cpp's
// ggml_vec_dot_q{2,...,6}_K_q8_K, its tiled kernels, its q4_K_8x8 GEMV / GEMM):
// bit-identical to the scalar variant. A super-block is unpacked once per
// group of up to 4 activation rows into 8 registers of 32 unsigned values
// (Q2_K 0..3, Q3_K 0..7 (biased by 4), Q4_K 0..15, Q5_K 0..31, Q6_K 0..63;
// maddubs pairs <= 2*63*127, no saturation) plus per-group s16 scale vectors
// (KBlockRegs and kblock_load, matmul_avx2_blocks.inc).

// The totals of four vectors' lanes: [sum(a), sum(b), sum(c), sum(d)].
inline __m128i hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// The float steps of kquant_dot_reference after a super-block's exact
// integer parts, for one weight row and one activation row, in order O.
// sumi: the 8 kVec lanes (Q6_K / Q3_K offsets applied); pairs: for kGemm8x8
// the totals of the four pairs of groups; mins: madd(mins, q8s), the four
// pairs' min terms (Q4_K / Q5_K), or madd(mins16, bsums), the eight groups'
// (Q2_K).
template <DType T, KOrder O>
struct KAcc {
  __m256 lanes = _mm256_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  float summs = 0.f, acc = 0.f, acc_min = 0.f;

  // (Q2_K: mins is madd(mins16, bsums), 8 lanes, lane g the min term of group g.)
  template <typename Mins>
  inline void add(float dx, float dw, float dmw, __m256i sumi, __m128i pairs, Mins mins) {
    if constexpr (T == DType::Q2_K) {
      add_q2k(dx, dw, dmw, sumi, mins);
    } else if constexpr (O == KOrder::kVec) {
      if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
        const float dmin = -dx * dmw;
        if constexpr (T == DType::Q4_K) {
          accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), accm);
        } else {
          const float isum = static_cast<float>(hsum_epi32(mins));
          summs = kQ5KSummsFused ? __builtin_fmaf(dmin, isum, summs) : summs + dmin * isum;
        }
      }
      lanes = _mm256_fmadd_ps(_mm256_set1_ps(dx * dw), _mm256_cvtepi32_ps(sumi), lanes);
    } else if constexpr (O == KOrder::kTiled) {
      float r = static_cast<float>(hsum_epi32(sumi)) * dw;
      if constexpr (T == DType::Q4_K || T == DType::Q5_K)
        r = __builtin_fmaf(-dmw, static_cast<float>(hsum_epi32(mins)), r);
      acc = __builtin_fmaf(r, dx, acc);
    } else if constexpr (O == KOrder::kGemv8x8) {
      acc = __builtin_fmaf(static_cast<float>(hsum_epi32(sumi)), dw * dx, acc);
      acc_min = __builtin_fmaf(static_cast<float>(hsum_epi32(mins)), dmw * dx, acc_min);
    } else {
      const float sd = dw * dx, sm = dmw * dx;
      alignas(16) float ps[4], pm[4];
      _mm_store_ps(ps, _mm_cvtepi32_ps(pairs));
      _mm_store_ps(pm, _mm_cvtepi32_ps(mins));
      for (int p = 0; p < 4; ++p) {
        acc = __builtin_fmaf(ps[p], sd, acc);
        acc_min = __builtin_fmaf(pm[p], sm, acc_min);
      }
    }
  }
  // Q2_K: vec_dot and tiled only (kquant_order).
  inline void add_q2k(float dx, float dw, float dmw, __m256i sumi, __m256i mins) {
    if constexpr (O == KOrder::kVec) {  // the min term first, in the same lanes
      lanes = _mm256_fmadd_ps(_mm256_set1_ps(-dx * dmw), _mm256_cvtepi32_ps(mins), lanes);
      lanes = _mm256_fmadd_ps(_mm256_set1_ps(dx * dw), _mm256_cvtepi32_ps(sumi), lanes);
    } else {
      float r = static_cast<float>(hsum_epi32(sumi)) * dw;
      r = __builtin_fmaf(-dmw, static_cast<float>(hsum_epi32(mins)), r);
      acc = __builtin_fmaf(r, dx, acc);
    }
  }
  inline float result() const {
    if constexpr (O == KOrder::kVec) {
      float v = hsum8(lanes);
      if constexpr (T == DType::Q4_K) {
        __m128 t = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
        t = _mm_add_ss(t, _mm_movehdup_ps(t));
        v += _mm_cvtss_f32(t);
      } else if constexpr (T == DType::Q5_K) {
        v += summs;
      }
      return v;
    } else if constexpr (O == KOrder::kTiled) {
      return acc;
    } else {
      return acc - acc_min;
    }
  }
};

// y[m0..m0+MT)[n] for weight row n, in order O.
template <DType T, KOrder O, int MT>
inline void ktile(const DecodeCtx& c, int64_t n, int64_t m0) {
  const int64_t nbk = c.K / kQK_K;
  constexpr size_t kBytes = kquant_block_bytes(T);
  const uint8_t* wr = c.w + static_cast<size_t>(n) * c.w_row_bytes;
  const Q8KBlock* a[MT];
  for (int m = 0; m < MT; ++m) a[m] = q8k_row(c.act, c.act_row_bytes, m0 + m);
  KAcc<T, O> acc[MT];
  KBlockRegs<T> r;
  for (int64_t i = 0; i < nbk; ++i) {
    const uint8_t* blk = wr + static_cast<size_t>(i) * kBytes;
    prefetch(blk + c.w_row_bytes);
    kblock_load<T>(blk, r);
    for (int m = 0; m < MT; ++m) {
      const Q8KBlock& y = a[m][i];
      __m256i part[4];
      for (int p = 0; p < 4; ++p) {
        const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 64 * p));
        const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 64 * p + 32));
        __m256i p0 = _mm256_maddubs_epi16(r.q[2 * p], a0), p1 = _mm256_maddubs_epi16(r.q[2 * p + 1], a1);
        if constexpr (T == DType::Q3_K) {  // the -4 offset, per s16 lane as llama.cpp subtracts it
          const __m256i four = _mm256_set1_epi8(4);
          p0 = _mm256_sub_epi16(p0, _mm256_maddubs_epi16(four, a0));
          p1 = _mm256_sub_epi16(p1, _mm256_maddubs_epi16(four, a1));
        }
        part[p] = _mm256_add_epi32(_mm256_madd_epi16(r.sc[2 * p], p0), _mm256_madd_epi16(r.sc[2 * p + 1], p1));
      }
      __m256i sumi = _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]), _mm256_add_epi32(part[2], part[3]));
      __m128i pairs = _mm_setzero_si128(), mins = _mm_setzero_si128();
      if constexpr (O == KOrder::kGemm8x8) pairs = hsum4_epi32(part[0], part[1], part[2], part[3]);
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
      if constexpr (T == DType::Q2_K) {
        acc[m].add(y.d, r.d, r.dmin, sumi, pairs, _mm256_madd_epi16(r.mins16, bsums));
      } else {
        if constexpr (T == DType::Q6_K) {
          sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, r.sc16), 5));
        } else if constexpr (T != DType::Q3_K) {
          const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
          mins = _mm_madd_epi16(r.mins, q8s);
        }
        acc[m].add(y.d, r.d, r.dmin, sumi, pairs, mins);
      }
    }
  }
  for (int m = 0; m < MT; ++m) c.y[(m0 + m) * c.ldy + n] = acc[m].result();
}

// kGemm8x8 (Q4_K) for four activation rows at once: the float steps run on
// f32x4 vectors whose lane m is row m (lane by lane KAcc's operations, so
// the same bits), the integer pair totals come out of one hadd tree per pair
// with the rows already in lanes.
inline void ktile_gemm4(const DecodeCtx& c, int64_t n, int64_t m0) {
  constexpr DType T = DType::Q4_K;
  const int64_t nbk = c.K / kQK_K;
  const uint8_t* wr = c.w + static_cast<size_t>(n) * c.w_row_bytes;
  const Q8KBlock* a[4];
  for (int m = 0; m < 4; ++m) a[m] = q8k_row(c.act, c.act_row_bytes, m0 + m);
  __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
  KBlockRegs<T> r;
  for (int64_t i = 0; i < nbk; ++i) {
    const uint8_t* blk = wr + static_cast<size_t>(i) * sizeof(BlockQ4_K);
    prefetch(blk + c.w_row_bytes);
    kblock_load<T>(blk, r);
    __m128 mf[4];
    alignas(16) float dx[4];
    for (int m = 0; m < 4; ++m) {
      const Q8KBlock& y = a[m][i];
      dx[m] = y.d;
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
      const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
      mf[m] = _mm_cvtepi32_ps(_mm_madd_epi16(r.mins, q8s));  // lane p: the min term of pair p
    }
    _MM_TRANSPOSE4_PS(mf[0], mf[1], mf[2], mf[3]);  // mf[p] lane m
    const __m128 dx4 = _mm_load_ps(dx);
    const __m128 sd = _mm_mul_ps(_mm_set1_ps(r.d), dx4), sm = _mm_mul_ps(_mm_set1_ps(r.dmin), dx4);
    for (int p = 0; p < 4; ++p) {
      __m256i part[4];
      for (int m = 0; m < 4; ++m) {
        const int8_t* qs = a[m][i].qs + 64 * p;
        const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
        const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32));
        part[m] = _mm256_add_epi32(_mm256_madd_epi16(r.sc[2 * p], _mm256_maddubs_epi16(r.q[2 * p], a0)),
                                   _mm256_madd_epi16(r.sc[2 * p + 1], _mm256_maddubs_epi16(r.q[2 * p + 1], a1)));
      }
      const __m128i tot = hsum4_epi32(part[0], part[1], part[2], part[3]);  // lane m
      acc = _mm_fmadd_ps(_mm_cvtepi32_ps(tot), sd, acc);
      accm = _mm_fmadd_ps(mf[p], sm, accm);
    }
  }
  alignas(16) float out[4];
  _mm_store_ps(out, _mm_sub_ps(acc, accm));
  for (int m = 0; m < 4; ++m) c.y[(m0 + m) * c.ldy + n] = out[m];
}

template <DType T, KOrder O>
void kkernel_o(const DecodeCtx& c, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    if constexpr (T == DType::Q4_K && O == KOrder::kGemm8x8) {
      for (; m + 4 <= c.M; m += 4) ktile_gemm4(c, n, m);
    }
    for (; m + 4 <= c.M; m += 4) ktile<T, O, 4>(c, n, m);
    switch (c.M - m) {
      case 3: ktile<T, O, 3>(c, n, m); break;
      case 2: ktile<T, O, 2>(c, n, m); break;
      case 1: ktile<T, O, 1>(c, n, m); break;
      default: break;
    }
  }
}

// 4 activation bytes broadcast to every 32-bit lane (one load, no shuffle).
inline __m256i bcast4(const int8_t* q) {
  return _mm256_castps_si256(_mm256_broadcast_ss(reinterpret_cast<const float*>(q)));
}

// Q4_K on PackedQ4Kx8 groups (matmul_internal.h): MT activation rows x 8
// weight rows (lanes), in llama.cpp's q4_K_8x8 GEMM order (kGemm8x8: per
// pair of groups acc = fma(float(pair total), d * dx, acc), the min term
// likewise) or its GEMV order (kGemv8x8: per super-block, totals over the
// 8 groups). Each lane runs KAcc's operations for its row: the same bits.
template <KOrder O, int MT>
inline void q4k_packed_tile(const DecodeCtx& c, int64_t grp, int64_t m0) {
  const int64_t nbk = c.K / kQK_K;
  const auto* pk = reinterpret_cast<const PackedQ4Kx8*>(c.packed + static_cast<size_t>(grp) * c.packed_group_bytes);
  const Q8KBlock* a[MT];
  for (int m = 0; m < MT; ++m) a[m] = q8k_row(c.act, c.act_row_bytes, m0 + m);
  __m256 acc[MT], accm[MT];
  for (int m = 0; m < MT; ++m) acc[m] = accm[m] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nbk; ++i) {
    const PackedQ4Kx8& b = pk[i];
    prefetch_kx8_ahead(c.prefetch_l2, &b);
    const __m256 d = _mm256_loadu_ps(b.d), dmin = _mm256_loadu_ps(b.dmin);
    // Per row m: lane r of tot[m][p] = pair p's integer total (kGemm8x8), or
    // of tot[m][0] the super-block's (kGemv8x8).
    __m256i tot[MT][4];
    for (int m = 0; m < MT; ++m)
      for (int p = 0; p < 4; ++p) tot[m][p] = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      const __m128i s8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.sc + 8 * g));
      const __m256i sc = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s8, s8));  // s16 lanes 2r, 2r+1: row r's scale
      __m256i w[8];
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 128 * g + 32 * k));
        w[k] = _mm256_and_si256(v, m4);
        w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      }
      for (int m = 0; m < MT; ++m) {
        const int8_t* q = a[m][i].qs + 32 * g;
        // <= 8 * 2 * 15 * 128 = 30720 in magnitude: exact in 16 bits
        __m256i s16 = _mm256_maddubs_epi16(w[0], bcast4(q));
        for (int k = 1; k < 8; ++k) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[k], bcast4(q + 4 * k)));
        const __m256i s32 = _mm256_madd_epi16(s16, sc);
        const int p = O == KOrder::kGemm8x8 ? g / 2 : 0;
        tot[m][p] = _mm256_add_epi32(tot[m][p], s32);
      }
    }
    // The min terms: lane r of pair p = mn[2p][r] * bsum(2p) + mn[2p+1][r] * bsum(2p+1).
    __m256i mins[4];
    for (int p = 0; p < 4; ++p) {
      const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.mn + 16 * p));
      const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.mn + 16 * p + 8));
      mins[p] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi));
    }
    for (int m = 0; m < MT; ++m) {
      const Q8KBlock& y = a[m][i];
      const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
      const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
      alignas(16) int32_t gs[4];  // pair p: bsum(2p) | bsum(2p+1) << 16
      _mm_store_si128(reinterpret_cast<__m128i*>(gs), q8s);
      const __m256 dx = _mm256_set1_ps(y.d);
      const __m256 sd = _mm256_mul_ps(d, dx), sm = _mm256_mul_ps(dmin, dx);
      if constexpr (O == KOrder::kGemm8x8) {
        for (int p = 0; p < 4; ++p) {
          const __m256i mp = _mm256_madd_epi16(mins[p], _mm256_set1_epi32(gs[p]));
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[m][p]), sd, acc[m]);
          accm[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mp), sm, accm[m]);
        }
      } else {
        __m256i mt = _mm256_madd_epi16(mins[0], _mm256_set1_epi32(gs[0]));
        for (int p = 1; p < 4; ++p) mt = _mm256_add_epi32(mt, _mm256_madd_epi16(mins[p], _mm256_set1_epi32(gs[p])));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[m][0]), sd, acc[m]);
        accm[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mt), sm, accm[m]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    _mm256_storeu_ps(c.y + (m0 + m) * c.ldy + grp * kKx8PackRows, _mm256_sub_ps(acc[m], accm[m]));
}

// Activation rows 0..M in tiles of 4 and one tile of the rest:
// tile(std::integral_constant<int, MT>{}, first row) (the packed kernels'
// row tiles; each row's result is the same in any tile).
template <typename F>
inline void row_tiles4(int64_t M, F&& tile) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile(std::integral_constant<int, 4>{}, m);
  switch (M - m) {
    case 3: tile(std::integral_constant<int, 3>{}, m); break;
    case 2: tile(std::integral_constant<int, 2>{}, m); break;
    case 1: tile(std::integral_constant<int, 1>{}, m); break;
    default: break;
  }
}

template <KOrder O>
void q4k_packed_kernel(const DecodeCtx& c, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g)
    row_tiles4(c.M, [&](auto mt, int64_t m) { q4k_packed_tile<O, decltype(mt)::value>(c, g, m); });
}

// Q6_K on PackedQ6Kx8 groups (matmul_internal.h). The 6-bit values of
// elements 16h + 4c .. 16h + 4c + 3 of group g, 8 rows (qh: the group's
// high-bit vector of half h).
inline __m256i q6k_chunk(const PackedQ6Kx8& b, int g, int h, int c, __m256i qh) {
  const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.grp[g].ql + 32 * c));
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i lo = h == 0 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
  __m256i hi;  // bits 2c..2c+1 to bits 4..5
  switch (c) {
    case 0: hi = _mm256_slli_epi16(qh, 4); break;
    case 1: hi = _mm256_slli_epi16(qh, 2); break;
    case 2: hi = qh; break;
    default: hi = _mm256_srli_epi16(qh, 2); break;
  }
  return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
}
// s16 lanes 2r, 2r+1: row r's scale of sub-block s (sign-extended).
inline __m256i q6k_scales(const PackedQ6Kx8& b, int s) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.sc + 8 * s));
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v));
}
// s16 lanes 2r, 2r+1: row r's scales of sub-blocks 2k and 2k+1.
inline __m256i q6k_scale_pair(const PackedQ6Kx8& b, int k) {
  const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.sc + 16 * k));
  const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.sc + 16 * k + 8));
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(lo, hi));
}

// Half h of group g: its four chunk registers in w, its rows' scales returned.
inline __m256i q6k_half(const PackedQ6Kx8& b, int g, int h, __m256i* w) {
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.grp[g].qh + 32 * h));
  for (int cc = 0; cc < 4; ++cc) w[cc] = q6k_chunk(b, g, h, cc, qh);
  return q6k_scales(b, 2 * g + h);
}

// Decode rows (kVec, ggml_vec_dot_q6_K_q8_K's order) for MT activation rows
// and 8 weight rows: lane r of s[m][c] / acc[m][l] is lane l of row r's
// vec_dot registers (transposed), reduced at the end in hsum8's order. The
// chunks of a half group are unpacked once for the MT rows.
template <int MT>
inline void q6k_packed_vec(const DecodeCtx& c, int64_t grp, int64_t m0) {
  const int64_t nbk = c.K / kQK_K;
  const auto* pk = reinterpret_cast<const PackedQ6Kx8*>(c.packed + static_cast<size_t>(grp) * c.packed_group_bytes);
  const Q8KBlock* a[MT];
  for (int m = 0; m < MT; ++m) a[m] = q8k_row(c.act, c.act_row_bytes, m0 + m);
  __m256 acc[MT][8];
  for (auto& row : acc)
    for (auto& v : row) v = _mm256_setzero_ps();
  for (int64_t i = 0; i < nbk; ++i) {
    const PackedQ6Kx8& b = pk[i];
    prefetch_kx8_ahead(c.prefetch_l2, &b);
    const __m256 d = _mm256_loadu_ps(b.d);
    for (int h = 0; h < 2; ++h) {  // lanes 4h .. 4h + 3
      __m256i s[MT][4];
      for (auto& row : s)
        for (auto& v : row) v = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        __m256i w[4];
        const __m256i sc = q6k_half(b, g, h, w);
        for (int m = 0; m < MT; ++m) {
          const int8_t* q = a[m][i].qs + 32 * g + 16 * h;
          for (int cc = 0; cc < 4; ++cc) {
            const __m256i p = _mm256_maddubs_epi16(w[cc], bcast4(q + 4 * cc));
            s[m][cc] = _mm256_add_epi32(s[m][cc], _mm256_madd_epi16(p, sc));
          }
        }
      }
      for (int m = 0; m < MT; ++m) {
        const Q8KBlock& y = a[m][i];
        int32_t bs[8];  // k: bsums[2k] | bsums[2k+1] << 16
        std::memcpy(bs, y.bsums, 32);
        const __m256 dxw = _mm256_mul_ps(_mm256_set1_ps(y.d), d);
        for (int cc = 0; cc < 4; ++cc) {
          const int k = 4 * h + cc;
          const __m256i off = _mm256_madd_epi16(q6k_scale_pair(b, k), _mm256_set1_epi32(bs[k]));
          const __m256i sumi = _mm256_sub_epi32(s[m][cc], _mm256_slli_epi32(off, 5));
          acc[m][k] = _mm256_fmadd_ps(dxw, _mm256_cvtepi32_ps(sumi), acc[m][k]);
        }
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    const __m256* l = acc[m];
    const __m256 r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
                                   _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])));
    _mm256_storeu_ps(c.y + (m0 + m) * c.ldy + grp * kKx8PackRows, r);
  }
}

// Prompt rows (kTiled: per super-block r = float(total) * d, acc = fma(r,
// dx, acc)) for MT activation rows and 8 weight rows. Two chunks are added
// in 16 bits before the scale multiply (|sum| <= 2 * 2 * 63 * 128 = 32256).
template <int MT>
inline void q6k_packed_tiled(const DecodeCtx& c, int64_t grp, int64_t m0) {
  const int64_t nbk = c.K / kQK_K;
  const auto* pk = reinterpret_cast<const PackedQ6Kx8*>(c.packed + static_cast<size_t>(grp) * c.packed_group_bytes);
  const Q8KBlock* a[MT];
  for (int m = 0; m < MT; ++m) a[m] = q8k_row(c.act, c.act_row_bytes, m0 + m);
  __m256 acc[MT];
  for (auto& v : acc) v = _mm256_setzero_ps();
  for (int64_t i = 0; i < nbk; ++i) {
    const PackedQ6Kx8& b = pk[i];
    prefetch_kx8_ahead(c.prefetch_l2, &b);
    __m256i tot[MT];
    for (auto& v : tot) v = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      for (int h = 0; h < 2; ++h) {
        __m256i w[4];
        const __m256i sc = q6k_half(b, g, h, w);
        for (int m = 0; m < MT; ++m) {
          const int8_t* q = a[m][i].qs + 32 * g + 16 * h;
          const __m256i p01 =
              _mm256_add_epi16(_mm256_maddubs_epi16(w[0], bcast4(q)), _mm256_maddubs_epi16(w[1], bcast4(q + 4)));
          const __m256i p23 =
              _mm256_add_epi16(_mm256_maddubs_epi16(w[2], bcast4(q + 8)), _mm256_maddubs_epi16(w[3], bcast4(q + 12)));
          tot[m] = _mm256_add_epi32(tot[m], _mm256_add_epi32(_mm256_madd_epi16(p01, sc), _mm256_madd_epi16(p23, sc)));
        }
      }
    }
    const __m256 d = _mm256_loadu_ps(b.d);
    for (int m = 0; m < MT; ++m) {
      const Q8KBlock& y = a[m][i];
      int32_t bs[8];
      std::memcpy(bs, y.bsums, 32);
      __m256i off = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k)
        off = _mm256_add_epi32(off, _mm256_madd_epi16(q6k_scale_pair(b, k), _mm256_set1_epi32(bs[k])));
      const __m256i isum = _mm256_sub_epi32(tot[m], _mm256_slli_epi32(off, 5));
      const __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), d);
      acc[m] = _mm256_fmadd_ps(r, _mm256_set1_ps(y.d), acc[m]);
    }
  }
  for (int m = 0; m < MT; ++m) _mm256_storeu_ps(c.y + (m0 + m) * c.ldy + grp * kKx8PackRows, acc[m]);
}

void q6k_packed_kernel(const DecodeCtx& c, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    if (c.korder == KOrder::kVec)
      row_tiles4(c.M, [&](auto mt, int64_t m) { q6k_packed_vec<decltype(mt)::value>(c, g, m); });
    else
      row_tiles4(c.M, [&](auto mt, int64_t m) { q6k_packed_tiled<decltype(mt)::value>(c, g, m); });
  }
}

template <DType T>
void kkernel(const DecodeCtx& c, int64_t n0, int64_t n1) {
  if constexpr (T == DType::Q4_K || T == DType::Q6_K) {
    const bool packed_order = T == DType::Q4_K ? (c.korder == KOrder::kGemm8x8 || c.korder == KOrder::kGemv8x8)
                                               : (c.korder == KOrder::kVec || c.korder == KOrder::kTiled);
    if (c.packed && packed_order) {
      // Whole groups of 8 rows from the packed copy, any others (a range
      // that does not start or end on a group) from the GGUF rows.
      const int64_t g0 = (n0 + kKx8PackRows - 1) / kKx8PackRows, g1 = n1 / kKx8PackRows;
      if (g0 < g1) {
        if (n0 < g0 * kKx8PackRows) {
          DecodeCtx plain = c;
          plain.packed = nullptr;
          plain.packed_group_bytes = 0;
          kkernel<T>(plain, n0, g0 * kKx8PackRows);
        }
        if constexpr (T == DType::Q6_K)
          q6k_packed_kernel(c, g0, g1);
        else if (c.korder == KOrder::kGemm8x8)
          q4k_packed_kernel<KOrder::kGemm8x8>(c, g0, g1);
        else
          q4k_packed_kernel<KOrder::kGemv8x8>(c, g0, g1);
        n0 = g1 * kKx8PackRows;
        if (n0 >= n1) return;
      }
    }
  }
  switch (c.korder) {
    case KOrder::kVec: return kkernel_o<T, KOrder::kVec>(c, n0, n1);
    case KOrder::kTiled: return kkernel_o<T, KOrder::kTiled>(c, n0, n1);
    case KOrder::kGemv8x8:
      if constexpr (T == DType::Q4_K) return kkernel_o<T, KOrder::kGemv8x8>(c, n0, n1);
      break;
    case KOrder::kGemm8x8:
      if constexpr (T == DType::Q4_K) return kkernel_o<T, KOrder::kGemm8x8>(c, n0, n1);
      break;
  }
  kkernel_o<T, KOrder::kVec>(c, n0, n1);  // (kquant_order gives the 8x8 orders to Q4_K only)
}

// ---------------------------------------------------------------- tile layout
//
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights in the tile layout
// (matmul_internal.h; on AVX2 CPUs every such weight but Q4_0 ones whose row
// count is not a multiple of 8: those llama.cpp's AVX2 build does not repack
// to q4_0_8x8, and sums in vec_dot's order as the GGUF kernels do): half a
// group (8 rows) per register, a chunk's 32 bytes holding values 4k..4k+3
// of each of the 8 rows (Q4 / Q5: low nibbles, chunk k + 4 the high ones,
// values 16+4k..; Q5 ORs in their fifth bits, the half's 32 bits of each of
// the block's 8 masks as one byte per bit; Q8_0 values plus 128). Per block
// and row the exact integer total t = sum(q * x) - off * sum(x), q the
// unsigned values (off = 8 for Q4_0, 16 for Q5_0, else 0), from maddubs
// pairs added in 16 bits (Q4: all 8 chunks, at most 8 * 2 * 15 * 127 =
// 30480; Q5: 4 chunks at a time, 4 * 2 * 31 * 127 = 31496; Q8_0: |w| times
// x with w's sign, one chunk at a time), then acc = fma(float(t), dw * dx,
// acc) and for Q4_1 / Q5_1 acc = fma(m, sx, acc): the AVX-512 tile kernels'
// (vnni_tile_kernel) order, to the bit, which for Q4_0 is also llama.cpp's
// ggml_gemv / ggml_gemm_q4_0_8x8_q8_0.
// MT activation rows against H halves of a group from half h0 (H = 2: both
// halves per block, so that a one-row call streams each chunk's cache line
// once); rows: the live rows from half h0 on (the stores stop there).
template <DType T>
inline constexpr int kTileOffsetAvx2 = T == DType::Q4_0   ? 8
                                       : T == DType::Q5_0 ? 16
                                                          : 0;

// Bits 32h..32h+31 of the 64-bit fifth-bit mask at p as 32 bytes, byte j =
// 0x10 where bit j is set, else 0.
inline __m256i fifth_bits16(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel), _mm256_set1_epi8(0x10));
}

// The stream of a tile-layout group's quants at block qb, prefetched ahead.
template <size_t kQuant>
inline void tile_prefetch(const DecodeCtx& c, const uint8_t* qb) {
  if (c.prefetch_l2) {
    // The whole block 64 blocks ahead (Q4_0: 16 KiB, Q8_0: 32 KiB), into L2
    // (kx8_prefetch_l2). Zen 4, 1B-shape Q4_0 on the AVX2 kernels
    // (`EMBER_CPU_ISA=avx2 ember bench -p 1 -n 96 -t 2`, median of 3),
    // tok/s: one line 4 blocks ahead 26.9-28.9, none 28.6, the block 16 /
    // 32 / 64 / 128 ahead 32.5 / 32.2-34.1 / 35.5-39.5 / 35.6 (the scale
    // stream too: no better).
    const char* pf = reinterpret_cast<const char*>(qb) + 64 * kQuant;
    for (size_t l = 0; l < kQuant; l += 64) _mm_prefetch(pf + l, _MM_HINT_T1);
  } else {
    _mm_prefetch(reinterpret_cast<const char*>(qb) + 4 * kQuant, _MM_HINT_T0);
  }
}

// Q8_0: a chunk's signed values (the layout stores them plus 128) and their
// magnitudes (-128: 0x80, 128 as the unsigned operand).
inline void q80_chunk(const uint8_t* p, __m256i* sgn, __m256i* mag) {
  *sgn = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                          _mm256_set1_epi8(static_cast<char>(0x80)));
  *mag = _mm256_abs_epi8(*sgn);
}
// Its 8 rows' sums of 4 products with x (4 activation bytes broadcast): |w|
// times x with w's sign (llama.cpp's mul_sum_i8_pairs: pairs of at most
// 2 * 128 * 127, exact).
inline __m256i q80_dot4(__m256i sgn, __m256i mag, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(x, sgn)), _mm256_set1_epi16(1));
}
// 8 outputs to y, the first `cols` of them (0..8).
inline void store_rows8(float* y, __m256 v, int cols) {
  if (cols == 8) {
    _mm256_storeu_ps(y, v);
  } else if (cols > 0) {
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    std::memcpy(y, t, static_cast<size_t>(cols) * sizeof(float));
  }
}

// Q8_0 rows of calls of up to 2 rows (decode rows), G groups from row nt
// (rows up to n1 stored), both halves of each: per chunk the signed values
// and their magnitudes, then every row's q80_dot4 added to its integer
// total, the chunks in the outer loop (no
// weight registers spilled, as tile_rows_avx2's loop order does with both
// halves). Four groups at once read four streams: 1B-shape Q8_0 (K = 2048 /
// 8192), `EMBER_CPU_ISA=avx2 ember bench -p 1 -n 32 -t 2`, median of 3,
// 27.8 -> 31.8 tok/s.
template <int MT, int G>
inline void q80_tile_rows2(const DecodeCtx& c, int64_t nt, int64_t n1) {
  constexpr int H = 2;
  constexpr size_t kQuant = tile_quant_bytes(DType::Q8_0), kScale = tile_scale_bytes(DType::Q8_0);
  const int64_t K = c.K, nb = K / kQK;
  const size_t arb = c.act_row_bytes;
  const uint8_t* a = c.act;
  const uint8_t* q[G];
  for (int g = 0; g < G; ++g) q[g] = c.packed + static_cast<size_t>(nt / kTileGroupRows + g) * c.packed_group_bytes;
  const size_t quants = static_cast<size_t>(nb) * kQuant;
  __m256 acc[G][H][MT];
  for (auto& gg : acc)
    for (auto& hh : gg)
      for (auto& v : hh) v = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i s32[G][H][MT];
    for (auto& gg : s32)
      for (auto& hh : gg)
        for (auto& v : hh) v = _mm256_setzero_si256();
    for (int g = 0; g < G; ++g) tile_prefetch<kQuant>(c, q[g] + static_cast<size_t>(b) * kQuant);
    for (int k = 0; k < 8; ++k) {
      __m256i x[MT];
      for (int m = 0; m < MT; ++m)
        x[m] = bcast4(reinterpret_cast<const int8_t*>(a + static_cast<size_t>(m) * arb + 32 * b + 4 * k));
      for (int g = 0; g < G; ++g)
        for (int h = 0; h < H; ++h) {
          __m256i sgn, mag;
          q80_chunk(q[g] + static_cast<size_t>(b) * kQuant + 64 * k + 32 * h, &sgn, &mag);
          for (int m = 0; m < MT; ++m) s32[g][h][m] = _mm256_add_epi32(s32[g][h][m], q80_dot4(sgn, mag, x[m]));
        }
    }
    for (int g = 0; g < G; ++g)
      for (int h = 0; h < H; ++h) {
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(q[g] + quants + static_cast<size_t>(b) * kScale + 16 * h)));
        for (int m = 0; m < MT; ++m) {
          float dx;
          std::memcpy(&dx, a + static_cast<size_t>(m) * arb + static_cast<size_t>(K) + 4 * static_cast<size_t>(b), 4);
          acc[g][h][m] =
              _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32[g][h][m]), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[g][h][m]);
        }
      }
  }
  for (int g = 0; g < G; ++g)
    for (int h = 0; h < H; ++h) {
      const int64_t r0 = nt + kTileGroupRows * g + 8 * h;
      const int cols = static_cast<int>(std::min<int64_t>(8, n1 - r0));
      for (int m = 0; m < MT; ++m) store_rows8(c.y + m * c.ldy + r0, acc[g][h][m], cols);
    }
}

template <DType T, int MT, int H>
inline void tile_rows_avx2(const DecodeCtx& c, const uint8_t* q, const uint8_t* sc, int h0, int64_t m0, int64_t n,
                           int rows) {
  constexpr size_t kQuant = tile_quant_bytes(T), kScale = tile_scale_bytes(T);
  const int64_t K = c.K, nb = K / kQK;
  const size_t arb = c.act_row_bytes;
  const uint8_t* a = c.act + static_cast<size_t>(m0) * arb;
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[H][MT];
  for (int h = 0; h < H; ++h)
    for (int m = 0; m < MT; ++m) acc[h][m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* qb = q + static_cast<size_t>(b) * kQuant;
    tile_prefetch<kQuant>(c, qb);
    for (int h = 0; h < H; ++h) {
      const int hh = h0 + h;
      __m256i w[8];                     // chunk k: values 4k..4k+3 of the 8 rows (Q8_0: their magnitudes)
      [[maybe_unused]] __m256i sgn[8];  // Q8_0: the signed values
      if constexpr (T == DType::Q8_0) {
        for (int k = 0; k < 8; ++k) q80_chunk(qb + 64 * k + 32 * hh, &sgn[k], &w[k]);
      } else {
        for (int k = 0; k < 4; ++k) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 64 * k + 32 * hh));
          w[k] = _mm256_and_si256(v, m4);
          w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
      }
      if constexpr (tile_five_bit(T))
        for (int k = 0; k < 8; ++k) w[k] = _mm256_or_si256(w[k], fifth_bits16(qb + 256 + 8 * k + 4 * hh));
      const __m256 dw = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + static_cast<size_t>(b) * kScale + 16 * hh)));
      [[maybe_unused]] __m256 dm;  // Q4_1 / Q5_1: the rows' mins
      if constexpr (tile_min(T))
        dm = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + static_cast<size_t>(b) * kScale + 32 + 16 * hh)));
      for (int m = 0; m < MT; ++m) {
        const uint8_t* am = a + static_cast<size_t>(m) * arb;
        const auto* v = reinterpret_cast<const int8_t*>(am + 32 * b);
        const uint8_t* scales = am + static_cast<size_t>(K);
        float dx;
        int32_t hs[2];
        std::memcpy(&dx, scales + 4 * static_cast<size_t>(b), 4);
        std::memcpy(hs, scales + 8 * static_cast<size_t>(nb + b), 8);
        __m256i s32;
        if constexpr (T == DType::Q8_0) {
          s32 = q80_dot4(sgn[0], w[0], bcast4(v));
          for (int k = 1; k < 8; ++k) s32 = _mm256_add_epi32(s32, q80_dot4(sgn[k], w[k], bcast4(v + 4 * k)));
          acc[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[h][m]);
          continue;
        }
        __m256i s16 = _mm256_maddubs_epi16(w[0], bcast4(v));
        for (int k = 1; k < 4; ++k) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[k], bcast4(v + 4 * k)));
        if constexpr (!tile_five_bit(T)) {
          for (int k = 0; k < 4; ++k)
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[k + 4], bcast4(v + 16 + 4 * k)));
          s32 = _mm256_madd_epi16(s16, ones);
        } else {
          __m256i s16b = _mm256_maddubs_epi16(w[4], bcast4(v + 16));
          for (int k = 1; k < 4; ++k)
            s16b = _mm256_add_epi16(s16b, _mm256_maddubs_epi16(w[k + 4], bcast4(v + 16 + 4 * k)));
          s32 = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_madd_epi16(s16b, ones));
        }
        const __m256i t = _mm256_sub_epi32(s32, _mm256_set1_epi32(kTileOffsetAvx2<T> * (hs[0] + hs[1])));
        acc[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[h][m]);
        if constexpr (tile_min(T)) {
          float sx;
          std::memcpy(&sx, scales + 4 * static_cast<size_t>(nb + b), 4);
          acc[h][m] = _mm256_fmadd_ps(dm, _mm256_set1_ps(sx), acc[h][m]);
        }
      }
    }
  }
  for (int h = 0; h < H; ++h)
    for (int m = 0; m < MT; ++m) store_rows8(c.y + (m0 + m) * c.ldy + n + 8 * h, acc[h][m], std::min(8, rows - 8 * h));
}

// Groups of 16 rows: calls of up to 2 rows take both halves at once, bigger
// ones a half at a time (the other half's bytes then come from L1 / L2).
template <DType T>
void tile_kernel_avx2(const DecodeCtx& c, int64_t n0, int64_t n1) {
  const size_t quants = static_cast<size_t>(c.K / kQK) * tile_quant_bytes(T);
  for (int64_t nt = n0; nt < n1; nt += kTileGroupRows) {
    const uint8_t* q = c.packed + static_cast<size_t>(nt / kTileGroupRows) * c.packed_group_bytes;
    const uint8_t* sc = q + quants;
    const int rows = static_cast<int>(std::min<int64_t>(kTileGroupRows, n1 - nt));
    if constexpr (T == DType::Q8_0) {
      if (c.M <= 2) {  // four groups at a time where there are four, else one
        const bool four = nt + 4 * kTileGroupRows <= n1;
        if (c.M == 2)
          four ? q80_tile_rows2<2, 4>(c, nt, n1) : q80_tile_rows2<2, 1>(c, nt, n1);
        else
          four ? q80_tile_rows2<1, 4>(c, nt, n1) : q80_tile_rows2<1, 1>(c, nt, n1);
        if (four) nt += 3 * kTileGroupRows;
        continue;
      }
    }
    if (rows > 8 && c.M <= 2) {
      if (c.M == 2)
        tile_rows_avx2<T, 2, 2>(c, q, sc, 0, 0, nt, rows);
      else
        tile_rows_avx2<T, 1, 2>(c, q, sc, 0, 0, nt, rows);
      continue;
    }
    for (int h = 0; 8 * h < rows; ++h)
      row_tiles4(c.M, [&](auto mt, int64_t m) {
        tile_rows_avx2<T, decltype(mt)::value, 1>(c, q, sc, h, m, nt + 8 * h, rows - 8 * h);
      });
  }
}

// ---------------------------------------------------------------- float kernels

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
    case DType::Q5_0: return qkernel<DType::Q5_0>;
    case DType::Q5_1: return qkernel<DType::Q5_1>;
    case DType::Q2_K: return kkernel<DType::Q2_K>;
    case DType::Q3_K: return kkernel<DType::Q3_K>;
    case DType::Q4_K: return kkernel<DType::Q4_K>;
    case DType::Q5_K: return kkernel<DType::Q5_K>;
    case DType::Q6_K: return kkernel<DType::Q6_K>;
    case DType::F16: return fkernel<DType::F16>;
    case DType::BF16: return fkernel<DType::BF16>;
    case DType::F32: return fkernel<DType::F32>;
    default: return nullptr;
  }
}

}  // namespace

void avx2_tile_prepare_acts(const float* x, int64_t M, int64_t K, uint8_t* act) { tile_prepare_acts(x, M, K, act); }
DecodeKernel avx2_tile_kernel_for(DType t) {
  switch (t) {
    case DType::Q4_0: return tile_kernel_avx2<DType::Q4_0>;
    case DType::Q4_1: return tile_kernel_avx2<DType::Q4_1>;
    case DType::Q5_0: return tile_kernel_avx2<DType::Q5_0>;
    case DType::Q5_1: return tile_kernel_avx2<DType::Q5_1>;
    case DType::Q8_0: return tile_kernel_avx2<DType::Q8_0>;
    default: return nullptr;
  }
}

const IsaImpl& avx2_impl() {
  static const IsaImpl impl{"avx2",
                            act_row_bytes,
                            prepare_acts,
                            kernel,
                            avx2_dequant_f32,
                            avx2_dequant_bf16,
                            avx2_f32_to_bf16,
                            /*reads_packed=*/false,
                            /*reads_packed_kx8=*/true};
  return impl;
}

}  // namespace ember::cpu::detail
