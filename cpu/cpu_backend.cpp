// The CPU backend: activations in host memory, weights read in place from the
// model's mapping, OpenMP threads (one pool, shared with oneDNN). Compiled for
// baseline x86-64: its vector kernels are in backend_kernels_{avx2,scalar}.cpp,
// chosen at run time (cpu/backend_kernels.h).
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <tuple>
#include <vector>

#include "core/backend/registry.h"
#include "core/gguf/gguf.h"
#include "core/tensor/types.h"
#include "core/util/fault.h"
#include "core/util/huge_pages.h"
#include "core/util/status.h"
#include "cpu/backend_kernels.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "cpu/scratch_buffer.h"
#include "cpu/thread_governor.h"

namespace ember {

namespace cpu::detail {
const BackendKernels& backend_kernels() {
  const Isa isa = active_isa();
  if (isa == Isa::kAvx512Vnni && isa_supported(Isa::kAvx512Vnni)) return backend_kernels_avx512();
  return isa_supported(Isa::kAvx2) && isa != Isa::kScalar ? backend_kernels_avx2() : backend_kernels_scalar();
}
}  // namespace cpu::detail

namespace {

std::atomic<size_t> g_buffer_bytes{0};  // cpu_buffer_bytes()

// llama.cpp's ggml_table_gelu_f16: gelu (tanh approximation, libm tanhf) of
// every f16 value, rounded to f16. 1 + a*x*x is one FMA, as the reference's
// compiler contracts it (-march=native builds).
const uint16_t* gelu_f16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    for (uint32_t i = 0; i < t.size(); ++i) {
      const float x = fp16_to_fp32(static_cast<uint16_t>(i));
      const float inner = std::fma(0.044715f * x, x, 1.0f);
      const float y = 0.5f * x * (1.0f + std::tanh(0.79788456080286535587989211986876f * x * inner));
      t[i] = fp32_to_fp16(y);
    }
    return t;
  }();
  return table.data();
}

// A weight read in place from the model's mapping, plus (made on its first
// matmul, so an embedding table never gets one) the packed copy the active
// kernels stream faster (cpu::packed_bytes; declined quietly when memory is
// short).
// x rounded to f16 and back (round to nearest even, as fp32_to_fp16), 8 at a
// time with F16C; only called where the AVX2 variant may run.
__attribute__((target("avx,f16c"))) void round_f16_f16c(const float* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = fp16_to_fp32(fp32_to_fp16(in[i]));
}

// gelu(gate) * up for one value as llama.cpp's CPU computes it (CpuBackend::
// geglu): the f16-rounded gate looked up in gelu_f16_table, the tails below
// -10 and above 10 taken as 0 and the identity.
inline float geglu_value(float g, float u, const uint16_t* table) {
  if (g <= -10.0f) return 0.0f;
  if (g >= 10.0f) return g * u;
  return fp16_to_fp32(table[fp32_to_fp16(g)]) * u;
}

// geglu's values (CpuBackend::geglu), 8 at a time with F16C: the gate
// rounded to f16 by the same round-to-nearest-even as fp32_to_fp16, the
// table's f16 widened exactly; the same bits as the scalar loop. Only called
// where the AVX2 variant may run.
__attribute__((target("avx,f16c"))) void geglu_f16c(const float* gate, const float* up, int64_t n,
                                                    const uint16_t* table, float* out) {
  int64_t i = 0;
  alignas(16) uint16_t h[8], t[8];
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  for (; i + 8 <= n; i += 8) {  // (out may be gate or up: both are read before the store)
    const __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
    _mm_store_si128(reinterpret_cast<__m128i*>(h), _mm256_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT));
    for (int j = 0; j < 8; ++j) t[j] = table[h[j]];
    __m256 y = _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(t))), u);
    y = _mm256_blendv_ps(y, _mm256_mul_ps(g, u), _mm256_cmp_ps(g, hi, _CMP_GE_OQ));  // the tails: g * u,
    y = _mm256_andnot_ps(_mm256_cmp_ps(g, lo, _CMP_LE_OQ), y);                       // and +0
    _mm256_storeu_ps(out + i, y);
  }
  for (; i < n; ++i) out[i] = geglu_value(gate[i], up[i], table);
}

// ---- LoRA dot products in llama.cpp's order. For a batch of several
// tokens its CPU multiplies an F32, F16 or BF16 lora_a / lora_b with
// llamafile's tinyBLAS (K a multiple of the vector width): per output, one
// accumulator vector of L lanes, an FMA of L weights and L inputs (the input
// rounded to the weight's type) per step of L, then the lanes folded in
// halves (upper half onto lower) down to one; L = 16 where llama.cpp is
// built for AVX-512, 8 for AVX2. Prompt rows get that order from
// cpu::matmul's float kernels; the functions below compute it for one row
// (the scalar one the 8-lane order with std::fma), which BF16 one-token rows
// use. A K that is not a multiple of L adds its tail after the fold
// (llama.cpp then takes another kernel: such ranks are not bit-exact).
inline float lora_weight_at(DType t, const void* row, int64_t k) {
  if (t == DType::F16) return fp16_to_fp32(static_cast<const uint16_t*>(row)[k]);
  if (t == DType::BF16) return bf16_to_fp32(static_cast<const uint16_t*>(row)[k]);
  return static_cast<const float*>(row)[k];
}

inline float lora_dot_scalar1(DType t, const void* w, const float* x, int64_t K) {
  constexpr int L = 8;
  float acc[L] = {};
  int64_t k = 0;
  for (; k + L <= K; k += L)
    for (int l = 0; l < L; ++l) acc[l] = std::fma(lora_weight_at(t, w, k + l), x[k + l], acc[l]);
  for (int w2 = L / 2; w2 >= 1; w2 /= 2)
    for (int l = 0; l < w2; ++l) acc[l] = acc[l + w2] + acc[l];
  float s = acc[0];
  for (; k < K; ++k) s += lora_weight_at(t, w, k) * x[k];
  return s;
}

__attribute__((target("avx2,fma,f16c"))) inline float lora_dot_avx2_1(DType t, const void* w, const float* x,
                                                                      int64_t K) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv;
    if (t == DType::F16) {
      wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + k)));
    } else if (t == DType::BF16) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + k));
      wv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      wv = _mm256_loadu_ps(static_cast<const float*>(w) + k);
    }
    acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + k), acc);
  }
  __m128 v = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_movehdup_ps(v));
  float s = _mm_cvtss_f32(v);
  for (; k < K; ++k) s += lora_weight_at(t, w, k) * x[k];
  return s;
}

// (GCC 12 warns about its own intrinsics' undefined pass-through operands here.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) inline float lora_dot_avx512_1(DType t,
                                                                                                  const void* w,
                                                                                                  const float* x,
                                                                                                  int64_t K) {
  __m512 acc = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv;
    if (t == DType::F16) {
      wv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + k)));
    } else if (t == DType::BF16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + k));
      wv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      wv = _mm512_loadu_ps(static_cast<const float*>(w) + k);
    }
    acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + k), acc);
  }
  // _mm512_reduce_add_ps's order: halves folded down to one lane.
  alignas(64) float l16[16];
  _mm512_store_ps(l16, acc);
  for (int w2 = 8; w2 >= 1; w2 /= 2)
    for (int l = 0; l < w2; ++l) l16[l] = l16[l + w2] + l16[l];
  float s = l16[0];
  for (; k < K; ++k) s += lora_weight_at(t, w, k) * x[k];
  return s;
}

// One-token rows: llama.cpp's ggml_vec_dot_f16 / _f32 (its mul_mat without
// llamafile for a batch of one token): four accumulators of L lanes over
// steps of 4L, reduced (a0+a2) + (a1+a3), then the vector summed (L = 8:
// its 128-bit halves added, two hadds; L = 16: halves folded), then the
// elements past the last full step: F16 in double, F32 with FMAs (its
// compiler contracts `sumf += x*y`). BF16 takes the batched order here.
inline float vec_reduce8(const float* a0, const float* a1, const float* a2, const float* a3) {
  float s[8], t[4];
  for (int l = 0; l < 8; ++l) s[l] = (a0[l] + a2[l]) + (a1[l] + a3[l]);
  for (int l = 0; l < 4; ++l) t[l] = s[l] + s[l + 4];
  return (t[0] + t[1]) + (t[2] + t[3]);
}

inline float vec_tail(DType t, const void* w, const float* x, int64_t k, int64_t K, float head) {
  if (t == DType::F16) {
    double d = head;
    for (; k < K; ++k) d += static_cast<double>(lora_weight_at(t, w, k) * x[k]);
    return static_cast<float>(d);
  }
  float f = head;
  for (; k < K; ++k) f = std::fma(lora_weight_at(t, w, k), x[k], f);
  return f;
}

float lora_vec_scalar1(DType t, const void* w, const float* x, int64_t K) {
  if (t == DType::BF16) return lora_dot_scalar1(t, w, x, K);
  float a[4][8] = {};
  const int64_t np = K & ~int64_t{31};
  for (int64_t i = 0; i < np; i += 32)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 8; ++l) {
        const int64_t k = i + 8 * j + l;
        a[j][l] = std::fma(lora_weight_at(t, w, k), x[k], a[j][l]);
      }
  return vec_tail(t, w, x, np, K, vec_reduce8(a[0], a[1], a[2], a[3]));
}

__attribute__((target("avx2,fma,f16c"))) inline __m256 lora_load8(DType t, const void* w, int64_t k) {
  if (t == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + k)));
  }
  return _mm256_loadu_ps(static_cast<const float*>(w) + k);
}

__attribute__((target("avx2,fma,f16c"))) float lora_vec_avx2_1(DType t, const void* w, const float* x, int64_t K) {
  if (t == DType::BF16) return lora_dot_avx2_1(t, w, x, K);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t np = K & ~int64_t{31};
  for (int64_t i = 0; i < np; i += 32) {
    a0 = _mm256_fmadd_ps(lora_load8(t, w, i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(lora_load8(t, w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(lora_load8(t, w, i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(lora_load8(t, w, i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  a0 = _mm256_add_ps(a0, a2);
  a1 = _mm256_add_ps(a1, a3);
  a0 = _mm256_add_ps(a0, a1);
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  const __m128 t1 = _mm_hadd_ps(t0, t0);
  return vec_tail(t, w, x, np, K, _mm_cvtss_f32(_mm_hadd_ps(t1, t1)));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) inline __m512 lora_load16(DType t, const void* w,
                                                                                             int64_t k) {
  if (t == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + k)));
  }
  return _mm512_loadu_ps(static_cast<const float*>(w) + k);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) float lora_vec_avx512_1(DType t, const void* w,
                                                                                           const float* x, int64_t K) {
  if (t == DType::BF16) return lora_dot_avx512_1(t, w, x, K);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t np = K & ~int64_t{63};
  for (int64_t i = 0; i < np; i += 64) {
    a0 = _mm512_fmadd_ps(lora_load16(t, w, i), _mm512_loadu_ps(x + i), a0);
    a1 = _mm512_fmadd_ps(lora_load16(t, w, i + 16), _mm512_loadu_ps(x + i + 16), a1);
    a2 = _mm512_fmadd_ps(lora_load16(t, w, i + 32), _mm512_loadu_ps(x + i + 32), a2);
    a3 = _mm512_fmadd_ps(lora_load16(t, w, i + 48), _mm512_loadu_ps(x + i + 48), a3);
  }
  a0 = _mm512_add_ps(a0, a2);
  a1 = _mm512_add_ps(a1, a3);
  a0 = _mm512_add_ps(a0, a1);
  alignas(64) float l16[16];
  _mm512_store_ps(l16, a0);
  for (int w2 = 8; w2 >= 1; w2 /= 2)
    for (int l = 0; l < w2; ++l) l16[l] = l16[l + w2] + l16[l];
  return vec_tail(t, w, x, np, K, l16[0]);
}
#pragma GCC diagnostic pop

#pragma GCC diagnostic pop

// The one-token lora_b product (vec order, F16, rank a multiple of 8 up to
// 32: every element is the tail, summed in double) for M rows at once: each
// weight row converted once for all of them. u[m * ldu + i] = row (i) of w .
// x[m]. Each product of two f16 values is exact in f32, and a double holds
// the sum of up to 32 of them exactly unless their magnitudes span more than
// ~2^24: the sum is then the same in any order, and the float it rounds to is
// llama.cpp's. So the products are summed 4 lanes at a time.
__attribute__((target("avx2,fma,f16c"))) void lora_vec_b_rows_f16(const uint8_t* w, size_t row_bytes, int64_t n,
                                                                  const float* x, int64_t M, int64_t K, float* u,
                                                                  int64_t ldu) {
  for (int64_t o = 0; o < n; ++o) {
    const uint16_t* row = reinterpret_cast<const uint16_t*>(w + static_cast<size_t>(o) * row_bytes);
    __m256 wv[4];
    for (int64_t q = 0; q < K / 8; ++q)
      wv[q] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8 * q)));
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * K;
      __m256d acc = _mm256_setzero_pd();
      for (int64_t q = 0; q < K / 8; ++q) {
        const __m256 prod = _mm256_mul_ps(wv[q], _mm256_loadu_ps(xm + 8 * q));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(prod)));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(prod, 1)));
      }
      const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(acc), _mm256_extractf128_pd(acc, 1));
      u[m * ldu + o] = static_cast<float>(_mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h))));
    }
  }
}

// vec order for K below one step (a rank-r lora_b: every element is the
// tail): per output, the products added one by one (F16: in double; F32:
// FMAs), eight outputs interleaved so their chains overlap; the products of
// a row are formed eight at a time (f16 x f16 is exact in f32).
__attribute__((target("avx2,fma,f16c"))) void lora_vec_tail_rows_avx2(DType t, const uint8_t* w, size_t row_bytes,
                                                                      int64_t n, const float* x, int64_t K,
                                                                      float* out) {
  if (t == DType::F16 && K % 8 == 0 && K <= 32) return lora_vec_b_rows_f16(w, row_bytes, n, x, 1, K, out, n);
  constexpr int kMaxK = 63;              // K < 32 (AVX2 order) or < 64 (AVX-512 order)
  constexpr int kOut = 16;               // outputs interleaved
  alignas(32) float p[kMaxK + 1][kOut];  // p[k][i]: output i's k-th product
  for (int64_t o = 0; o < n; o += kOut) {
    const int64_t cnt = std::min<int64_t>(kOut, n - o);
    for (int64_t i = 0; i < kOut; ++i) {
      const void* row = w + static_cast<size_t>(o + std::min(i, cnt - 1)) * row_bytes;
      if (t == DType::F16) {
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
          alignas(32) float v[8];
          _mm256_store_ps(v, _mm256_mul_ps(lora_load8(t, row, k), _mm256_loadu_ps(x + k)));
          for (int l = 0; l < 8; ++l) p[k + l][i] = v[l];
        }
        for (; k < K; ++k) p[k][i] = lora_weight_at(t, row, k) * x[k];
      } else {
        for (int64_t k = 0; k < K; ++k) p[k][i] = static_cast<const float*>(row)[k];  // the weights (FMAs below)
      }
    }
    if (t == DType::F16) {  // sumf += (double)(w * x), element by element
      __m256d d[kOut / 4];
      for (auto& v : d) v = _mm256_setzero_pd();
      for (int64_t k = 0; k < K; ++k)
        for (int q = 0; q < kOut / 4; ++q) d[q] = _mm256_add_pd(d[q], _mm256_cvtps_pd(_mm_load_ps(p[k] + 4 * q)));
      alignas(32) double r[kOut];
      for (int q = 0; q < kOut / 4; ++q) _mm256_store_pd(r + 4 * q, d[q]);
      for (int64_t i = 0; i < cnt; ++i) out[o + i] = static_cast<float>(r[i]);
    } else {  // F32: sumf = fma(w, x, sumf), element by element
      __m256 f[kOut / 8];
      for (auto& v : f) v = _mm256_setzero_ps();
      for (int64_t k = 0; k < K; ++k) {
        const __m256 xk = _mm256_set1_ps(x[k]);
        for (int q = 0; q < kOut / 8; ++q) f[q] = _mm256_fmadd_ps(_mm256_load_ps(p[k] + 8 * q), xk, f[q]);
      }
      alignas(32) float r[kOut];
      for (int q = 0; q < kOut / 8; ++q) _mm256_store_ps(r + 8 * q, f[q]);
      for (int64_t i = 0; i < cnt; ++i) out[o + i] = r[i];
    }
  }
}

// y[j] = y[j] + u[j] * s, n elements: a multiply, then an add (no FMA: as
// ggml_scale then ggml_add).
__attribute__((target("avx"))) void lora_scale_add_avx(float* y, const float* u, int64_t n, float s) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 prod = _mm256_mul_ps(_mm256_loadu_ps(u + j), sv);
    _mm256_storeu_ps(y + j, _mm256_add_ps(_mm256_loadu_ps(y + j), prod));
  }
  for (; j < n; ++j) y[j] = y[j] + u[j] * s;
}

void lora_vec_scalar(DType t, const uint8_t* w, size_t row_bytes, int64_t n, const float* x, int64_t K, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = lora_vec_scalar1(t, w + static_cast<size_t>(i) * row_bytes, x, K);
}
__attribute__((target("avx2,fma,f16c"))) void lora_vec_avx2(DType t, const uint8_t* w, size_t row_bytes, int64_t n,
                                                            const float* x, int64_t K, float* out) {
  if (K < 32 && t != DType::BF16) return lora_vec_tail_rows_avx2(t, w, row_bytes, n, x, K, out);
  for (int64_t i = 0; i < n; ++i) out[i] = lora_vec_avx2_1(t, w + static_cast<size_t>(i) * row_bytes, x, K);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))) void lora_vec_avx512(DType t, const uint8_t* w,
                                                                                        size_t row_bytes, int64_t n,
                                                                                        const float* x, int64_t K,
                                                                                        float* out) {
  if (K < 64 && t != DType::BF16) return lora_vec_tail_rows_avx2(t, w, row_bytes, n, x, K, out);
  for (int64_t i = 0; i < n; ++i) out[i] = lora_vec_avx512_1(t, w + static_cast<size_t>(i) * row_bytes, x, K);
}

// out[i] = row i of w (rows of row_bytes) . x, n rows, in llama.cpp's
// one-token order for this CPU. (Prompt rows take cpu::matmul, whose float
// kernels sum in its batched order.)
using LoraDot = void (*)(DType, const uint8_t*, size_t, int64_t, const float*, int64_t, float*);
LoraDot lora_vec_for(cpu::Isa isa) {
  switch (isa) {
    case cpu::Isa::kAvx512Vnni: return lora_vec_avx512;
    case cpu::Isa::kAvx2: return lora_vec_avx2;
    default: return lora_vec_scalar;
  }
}

// ---- Packed weights: one copy per weight and kernel layout in the process ----
//
// A weight's packed copy (cpu::pack_weight: the layout its kernels stream
// fastest) is made on its first matmul, so an embedding table never gets one,
// and shared by every engine of the process that uses the same weight on the
// same kernels. A batch-invariant engine's kernels then read only the packed
// copy, so the weight's pages in the model's image are released as they are
// packed (gguf::release_image_pages, a megabyte at a time: the peak stays
// near the model's size): the model costs its file size once, not twice
// (EMBER_CPU_RELEASE_PACKED=0 keeps both). Every other reader of the GGUF
// bytes holds a gguf::ImagePin over them, which brings them back first.
struct PackKey {
  const void* data;
  DType type;
  int64_t rows, cols;
  cpu::Isa isa;
  bool tiles;  // the tile layout (cpu::tile_layout)
  bool operator<(const PackKey& o) const {
    return std::tie(data, type, rows, cols, isa, tiles) < std::tie(o.data, o.type, o.rows, o.cols, o.isa, o.tiles);
  }
};

// A packed copy of 2 MiB or more is in huge pages (core/util/huge_pages.h).
struct PackedCopy {
  ~PackedCopy() { deallocate(); }
  void* allocate(size_t n) {
    if (n < kHugePageBytes) return data = std::aligned_alloc(64, (n + 63) / 64 * 64);
    data = map_huge(n);
    mapped = data ? n : 0;
    return data;
  }
  void deallocate() {
    if (mapped)
      map_huge_free(data, mapped);
    else
      std::free(data);
    data = nullptr;
    mapped = 0;
  }
  std::mutex mu;  // held while it is being packed
  void* data = nullptr;
  size_t mapped = 0;  // bytes of a map_huge at data (0: from aligned_alloc)
};

class PackCache {
 public:
  static PackCache& get() {
    static PackCache* cache = new PackCache();  // (never destroyed: engines may outlive static destructors)
    return *cache;
  }
  // The copy for `key`, or null: made by another engine (done), when `create`
  // is false; otherwise an empty one is added when there is none.
  std::shared_ptr<PackedCopy> find(const PackKey& key, bool create) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) {
      if (auto copy = it->second.lock()) return copy;
      map_.erase(it);
    }
    if (!create) return nullptr;
    for (auto i = map_.begin(); i != map_.end();) i = i->second.expired() ? map_.erase(i) : std::next(i);
    auto copy = std::make_shared<PackedCopy>();
    map_.emplace(key, copy);
    return copy;
  }

 private:
  std::mutex mu_;
  std::map<PackKey, std::weak_ptr<PackedCopy>> map_;
};

bool release_packed_originals() {
  static const bool on = [] {
    const char* v = std::getenv("EMBER_CPU_RELEASE_PACKED");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// A weight's bytes in the model's image.
size_t weight_bytes(const WeightDesc& d) { return static_cast<size_t>(d.rows) * row_bytes(d.type, d.cols); }

// A weight read in place from the model's image, plus the packed copy above.
class CpuWeight final : public DeviceWeight {
 public:
  size_t bytes() const { return weight_bytes(desc); }

  // The packed copy when the kernels read one (made, or shared, on the first
  // call), else null. `release`: the caller's kernels read nothing else, so
  // the GGUF pages can go.
  const void* packed(bool release) {
    if (pack_tried_) return packed_ ? packed_->data : nullptr;
    pack_tried_ = true;
    tiles_ = cpu::tile_layout(desc.type) && cpu::packed_bytes(desc.type, desc.rows, desc.cols, true) > 0;
    const size_t n = cpu::packed_bytes(desc.type, desc.rows, desc.cols, tiles_);
    if (n == 0) return nullptr;
    auto copy = PackCache::get().find(key(), true);
    std::lock_guard<std::mutex> lock(copy->mu);
    if (copy->data) {
      // Another engine packed it: its pages may have come back for a reader since.
      if (release && release_packed_originals()) gguf::release_image_pages(desc.host_data, bytes());
    } else {
      if (testing::inject_alloc_failure(testing::AllocSite::kBackendWeight)) return nullptr;
      void* p = copy->allocate(n);
      if (!p) return nullptr;
      try {
        pack_into(p, release && release_packed_originals());
      } catch (...) {
        copy->deallocate();
        throw;
      }
    }
    packed_ = std::move(copy);
    return packed_->data;
  }

  // The packed copy if this weight or another engine's has made it (no
  // packing here: the embedding lookup).
  const void* packed_if_made() {
    if (packed_ || pack_tried_) return packed_ ? packed_->data : nullptr;
    const bool tiles = cpu::tile_layout(desc.type) && cpu::packed_bytes(desc.type, desc.rows, desc.cols, true) > 0;
    if (cpu::packed_bytes(desc.type, desc.rows, desc.cols, tiles) == 0) return nullptr;
    auto copy = PackCache::get().find(
        PackKey{desc.host_data, desc.type, desc.rows, desc.cols, cpu::active_isa(), tiles}, false);
    if (!copy) return nullptr;
    std::lock_guard<std::mutex> lock(copy->mu);
    if (!copy->data) return nullptr;
    pack_tried_ = true;
    tiles_ = tiles;
    packed_ = std::move(copy);
    return packed_->data;
  }

  bool packed_tiles() const { return tiles_; }

  // Keeps the GGUF bytes resident while this weight lives (kernels or oneDNN
  // read them).
  void pin_original() {
    if (pinned_) return;
    pin_ = gguf::ImagePin(desc.host_data, bytes());
    pinned_ = true;
  }

 private:
  PackKey key() const { return PackKey{desc.host_data, desc.type, desc.rows, desc.cols, cpu::active_isa(), tiles_}; }

  // Packs a megabyte of GGUF rows at a time (whole groups of 16 rows), each
  // pinned while it is read and released after when `release`.
  void pack_into(void* out, bool release) {
    const size_t rb = row_bytes(desc.type, desc.cols);
    const int64_t chunk = std::max<int64_t>(16, static_cast<int64_t>((size_t{1} << 20) / rb) / 16 * 16);
    const auto* src = static_cast<const uint8_t*>(desc.host_data);
    for (int64_t r0 = 0; r0 < desc.rows; r0 += chunk) {
      const int64_t n = std::min(chunk, desc.rows - r0);
      const uint8_t* rows = src + static_cast<size_t>(r0) * rb;
      {
        gguf::ImagePin pin(rows, static_cast<size_t>(n) * rb);
        cpu::pack_weight(cpu::WeightView{desc.type, n, desc.cols, rows, nullptr, tiles_},
                         static_cast<uint8_t*>(out) + cpu::packed_bytes(desc.type, r0, desc.cols, tiles_));
      }
      if (release) gguf::release_image_pages(rows, static_cast<size_t>(n) * rb);
    }
  }

  std::shared_ptr<PackedCopy> packed_;
  bool pack_tried_ = false;
  bool tiles_ = false;  // packed_ is the tile layout
  gguf::ImagePin pin_;
  bool pinned_ = false;
};

// Attention limits (per-thread stack state of the kernel).
using cpu::detail::kAttnMaxGroup;  // query heads per kv head
using cpu::detail::kAttnMaxHeadDim;

// A thread's attention scratch, in floats (ScratchBuffer: given back while
// decoding after a prompt).
class AttendScratch {
 public:
  void fit(size_t n) { p_ = static_cast<float*>(buf_.get(n * sizeof(float))); }
  float* data() { return p_; }

 private:
  cpu::ScratchBuffer buf_;
  float* p_ = nullptr;
};

class CpuBackend final : public Backend {
 public:
  // n_threads > 0: exactly that many; 0: up to every core, as many as
  // measure fastest (cpu/thread_governor.h).
  CpuBackend(int n_threads, bool batch_invariant, bool prompt_tiles)
      : governor_(n_threads > 0 ? n_threads : omp_get_num_procs(), n_threads <= 0),
        batch_invariant_(batch_invariant),
        prompt_tiles_(prompt_tiles) {}
  ~CpuBackend() override { release_kv(); }

  std::string name() const override { return std::string("cpu/") + cpu::isa_name(); }
  bool host_memory() const override { return true; }
  void trim_host_memory() override {
#if defined(__GLIBC__)
    // The pages of freed heap chunks: the step's small allocations (sampling,
    // batches) sit in the arena of the engine's thread between the weights'
    // (SmolLM2: 0.7 MB of free pages kept there).
    malloc_trim(0);
#endif
  }

  // Activation buffers of a megabyte or more are mappings of their own, so
  // that freeing one (the decoder shrinks its buffers after a prompt) gives
  // the memory back: from the heap glibc would keep it in the arena and raise
  // its mmap threshold for the host's allocations too. A 64-byte header before
  // each buffer holds its mapping's size (0: from the heap).
  static constexpr size_t kMapBytes = size_t{1} << 20, kHeader = 64;
  void* alloc(size_t bytes) override {
    if (bytes > (size_t{1} << 62))
      fail(StatusCode::kOutOfMemory, "cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    const size_t n = (std::max<size_t>(bytes, 64) + 63) / 64 * 64 + kHeader;
    bool mapped = false;
    void* base = testing::inject_alloc_failure(testing::AllocSite::kBackendBuffer)
                     ? nullptr
                     : cpu::alloc_host(n, kMapBytes, &mapped);
    if (!base) fail(StatusCode::kOutOfMemory, "cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    const size_t head[2] = {mapped ? n : 0, n};
    std::memcpy(base, head, sizeof head);
    g_buffer_bytes.fetch_add(n, std::memory_order_relaxed);
    return static_cast<uint8_t*>(base) + kHeader;
  }
  void free_buffer(void* ptr) override {
    if (!ptr) return;
    uint8_t* base = static_cast<uint8_t*>(ptr) - kHeader;
    size_t head[2];
    std::memcpy(head, base, sizeof head);
    g_buffer_bytes.fetch_sub(head[1], std::memory_order_relaxed);
    cpu::free_host(base, head[1], head[0] != 0);
  }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  std::unique_ptr<DeviceWeight> upload_weight(const WeightDesc& desc) override {
    if (desc.type != DType::F32 && !cpu::matmul_supports(desc.type)) {
      fail(StatusCode::kUnsupported,
           std::string("cpu: weights of type ") + type_name(static_cast<uint32_t>(desc.type)) + " are not supported");
    }
    if (testing::inject_alloc_failure(testing::AllocSite::kBackendWeight)) throw std::bad_alloc();
    auto w = std::make_unique<CpuWeight>();
    w->desc = desc;
    return w;
  }

  // The pool is reserved, not committed: anonymous zero pages that become
  // resident as blocks are first written, so an engine with a large budget
  // costs the host only the memory its sequences use.
  void kv_init(const KvGeometry& g) override {
    if (!supports_kv_dtype(g.dtype) || g.row_bytes() == 0) {
      fail(StatusCode::kUnsupported, "cpu backend: KV rows of " + std::to_string(g.head_dim) + " " +
                                         type_name(static_cast<uint32_t>(g.dtype)) +
                                         " are not supported (f16, or q8_0 with head_dim % 32 == 0)");
    }
    geom_ = g;
    release_kv();
    const size_t bytes = g.bytes_per_block() * static_cast<size_t>(g.num_blocks);
    if (bytes == 0) return;
    void* p = testing::inject_alloc_failure(testing::AllocSite::kKvPool)
                  ? MAP_FAILED
                  : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fail(StatusCode::kOutOfMemory, "cpu backend: cannot reserve the KV pool (" + std::to_string(bytes) + " bytes)");
    }
    kv_ = static_cast<uint8_t*>(p);
    kv_bytes_ = bytes;
  }

  void kv_copy_blocks(const int32_t* src, const int32_t* dst, int32_t n) override {
    const size_t per_layer_block = block_bytes();
    for (int32_t l = 0; l < geom_.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int32_t i = 0; i < n; ++i) {
          std::memcpy(block_ptr(l, kv, dst[i]), block_ptr(l, kv, src[i]), per_layer_block);
        }
      }
    }
  }

  bool supports_cache_policies() const override { return true; }
  bool supports_kv_dtype(DType dtype) const override { return dtype == DType::F16 || dtype == DType::Q8_0; }
  BackendLimits limits() const override {
    BackendLimits l;
    l.max_head_dim = kAttnMaxHeadDim;
    l.max_gqa_group = kAttnMaxGroup;
    l.head_dim_multiple = 8;
    return l;
  }

  void kv_rope_shift(const int32_t* blocks, int32_t n, int32_t delta, int32_t rot_dim, float freq_base) override {
    RopeSpec spec;
    spec.rot_dim = rot_dim;
    spec.freq_base = freq_base;
    const std::vector<RopeSpec> layers(static_cast<size_t>(geom_.num_layers), spec);
    kv_rope_shift_layers(blocks, n, delta, layers.data(), geom_.num_layers);
  }

  void kv_rope_shift_layers(const int32_t* blocks, int32_t n, int32_t delta, const RopeSpec* specs,
                            int32_t n_layers) override {
    if (n_layers != geom_.num_layers) fail(StatusCode::kInternal, "kv_rope_shift: one spec per layer needed");
    rope_shift(KvView{geom_.num_kv_heads, geom_.head_dim}, blocks, n, delta, specs, n_layers);
  }

  bool supports_kv_views() const override { return true; }

  void kv_rope_shift_view(const KvView& view, const int32_t* blocks, int32_t n, int32_t delta, const RopeSpec* specs,
                          int32_t n_layers) override {
    check_view(view);
    if (n_layers <= 0 || n_layers > geom_.num_layers) fail(StatusCode::kInternal, "kv_rope_shift: bad layer count");
    rope_shift(view, blocks, n, delta, specs, n_layers);
  }

  // The K of the first n_layers pool layers, rows laid out as `view`.
  void rope_shift(const KvView& view, const int32_t* blocks, int32_t n, int32_t delta, const RopeSpec* specs,
                  int32_t n_layers) {
    // One rotation by `delta` for every slot (RoPE(p+d) = R(d) RoPE(p)); the
    // angles in double so that repeated shifts add only the f16 rounding.
    const int32_t hd = view.head_dim;
    for (int32_t l = 0; l < n_layers; ++l) {
      if (hd > 512 || specs[l].rot_dim > hd || specs[l].rot_dim <= 0 || specs[l].rot_dim % 2 != 0) {
        fail(StatusCode::kInternal, "kv_rope_shift: unsupported head_dim / rot_dim");
      }
    }
    // Per layer and element: out = x * c + partner(x) * s. Adjacent pairs:
    // c = (cos, cos), s = (-sin, +sin), partner = swap_pairs (the vector
    // kernel). NEOX: element i and i + half, the same products.
    std::vector<float> tables(static_cast<size_t>(n_layers) * 2 * hd);
    for (int32_t l = 0; l < n_layers; ++l) {
      const RopeSpec& r = specs[l];
      float* cs = tables.data() + static_cast<size_t>(l) * 2 * hd;
      float* sn = cs + hd;
      const int32_t half = r.rot_dim / 2;
      for (int32_t i = 0; i < hd; ++i) cs[i] = 1.0f, sn[i] = 0.0f;
      for (int32_t i = 0; i < half; ++i) {
        double theta = delta * std::pow(static_cast<double>(r.freq_base), -2.0 * i / r.rot_dim) * r.freq_scale;
        if (r.freq_factors) theta /= r.freq_factors[i];
        const float c = static_cast<float>(std::cos(theta)), s = static_cast<float>(std::sin(theta));
        const int32_t a = r.neox ? i : 2 * i, b = r.neox ? i + half : 2 * i + 1;
        cs[a] = cs[b] = c;
        sn[a] = -s;
        sn[b] = s;
      }
    }
    const int32_t items = n_layers * n;
    const size_t rows = static_cast<size_t>(view.num_kv_heads) * geom_.block_size;
    const cpu::detail::BackendKernels& kernels = cpu::detail::backend_kernels();
#pragma omp parallel for num_threads(threads()) if (items > 4)
    for (int32_t it = 0; it < items; ++it) {
      const int32_t layer = it / n, block = blocks[it % n];
      if (block < 0 || block >= geom_.num_blocks) continue;
      const float* cs = tables.data() + static_cast<size_t>(layer) * 2 * hd;
      const float* sn = cs + hd;
      if (geom_.dtype == DType::Q8_0) {
        rope_shift_q8_rows(block_ptr(layer, 0, block), rows, hd, specs[layer], cs, sn);
        continue;
      }
      if (!specs[layer].neox) {
        kernels.rope_shift_rows(reinterpret_cast<uint16_t*>(block_ptr(layer, 0, block)), rows, hd, cs, sn);
        continue;
      }
      const int32_t half = specs[layer].rot_dim / 2;
      auto* k = reinterpret_cast<uint16_t*>(block_ptr(layer, 0, block));
      for (size_t row = 0; row < rows; ++row) {
        uint16_t* kr = k + row * hd;
        for (int32_t i = 0; i < half; ++i) {
          const float x0 = fp16_to_fp32(kr[i]), x1 = fp16_to_fp32(kr[i + half]);
          kr[i] = fp32_to_fp16(std::fma(x1, sn[i], x0 * cs[i]));
          kr[i + half] = fp32_to_fp16(std::fma(x0, sn[i + half], x1 * cs[i + half]));
        }
      }
    }
  }

  void kv_read_block(int32_t block, void* dst) override {
    if (block < 0 || block >= geom_.num_blocks) fail(StatusCode::kInternal, "kv_read_block: block outside the pool");
    const size_t bytes = block_bytes();
    auto* out = static_cast<uint8_t*>(dst);
    for (int32_t l = 0; l < geom_.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv, out += bytes) std::memcpy(out, block_ptr(l, kv, block), bytes);
    }
  }

  void kv_write_block(int32_t block, const void* src) override {
    if (block < 0 || block >= geom_.num_blocks) fail(StatusCode::kInternal, "kv_write_block: block outside the pool");
    const size_t bytes = block_bytes();
    const auto* in = static_cast<const uint8_t*>(src);
    for (int32_t l = 0; l < geom_.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv, in += bytes) std::memcpy(block_ptr(l, kv, block), in, bytes);
    }
  }

  // A tied table whose GGUF pages went after packing: each row is unpacked
  // from the packed copy (the same bytes) and dequantized as before.
  void embed(const DeviceWeight& table, const int32_t* ids, int32_t n, float* out) override {
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    const auto& d = table.desc;
    for (int32_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= d.rows) fail(StatusCode::kInvalidArgument, "token id out of range");
    }
    auto& cw = const_cast<CpuWeight&>(static_cast<const CpuWeight&>(table));
    if (const void* packed = cw.packed_if_made()) {
      const cpu::WeightView w{d.type, d.rows, d.cols, d.host_data, packed, cw.packed_tiles()};
      embed_row_.resize(row_bytes(d.type, d.cols));
      for (int32_t i = 0; i < n; ++i) {
        cpu::unpack_rows(w, ids[i], 1, embed_row_.data());
        cpu::dequantize_rows(cpu::WeightView{d.type, 1, d.cols, embed_row_.data()}, 0, 1,
                             out + static_cast<size_t>(i) * d.cols);
      }
      return;
    }
    const gguf::ImagePin pin(d.host_data, cw.bytes());
    const cpu::WeightView w{d.type, d.rows, d.cols, d.host_data};
    for (int32_t i = 0; i < n; ++i) cpu::dequantize_rows(w, ids[i], 1, out + static_cast<size_t>(i) * d.cols);
  }

  void rms_norm(const float* x, const DeviceWeight& weight, int32_t rows, int32_t dim, float eps, float* out) override {
    const float* w = static_cast<const float*>(weight.desc.host_data);
#pragma omp parallel for num_threads(threads()) if (rows > 8)
    for (int32_t r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * dim;
      float* o = out + static_cast<size_t>(r) * dim;
      // As ggml_rms_norm: f32 squares summed in double, mean and scale in f32.
      double sum = 0.0;
      for (int32_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i] * xr[i]);
      const float mean = static_cast<float>(sum / dim);
      const float scale = 1.0f / std::sqrt(mean + eps);
      for (int32_t i = 0; i < dim; ++i) o[i] = xr[i] * scale * w[i];
    }
  }

  void matmul(const DeviceWeight& w, const float* x, int32_t M, float* y, bool rows_are_decodes) override {
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    const auto t0 = std::chrono::steady_clock::now();
    matmul_locked(w, x, M, y, rows_are_decodes);
    governed(t0, M, weight_bytes(w.desc));
  }

  void matmul_group(const DeviceWeight* const* w, float* const* y, int32_t n, const float* x, int32_t M,
                    bool rows_are_decodes) override {
    if (n < 1 || n > cpu::kMaxGroup) fail(StatusCode::kInternal, "matmul_group: bad group size");
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    const auto t0 = std::chrono::steady_clock::now();
    omp_set_num_threads(threads());  // (before view_of: packing a weight keeps to the engine's threads too)
    cpu::WeightView views[cpu::kMaxGroup];
    size_t bytes = 0;
    for (int32_t i = 0; i < n; ++i) {
      views[i] = view_of(*w[i]);
      const auto& d = w[i]->desc;
      bytes += weight_bytes(d);
    }
    // Decode rows and row-invariant mode: one parallel pass (each row as
    // matmul() computes it). Other prefill chunks: oneDNN, weight by weight.
    if (batch_invariant_ || (rows_are_decodes && M <= cpu::decode_max_m())) {
      cpu::matmul_group(views, y, n, x, M, scratch_,
                        batch_invariant_ ? cpu::MatmulPath::kRowInvariant : cpu::MatmulPath::kAuto,
                        row_kind(rows_are_decodes));
    } else {
      for (int32_t i = 0; i < n; ++i) matmul_locked(*w[i], x, M, y[i], rows_are_decodes);
    }
    governed(t0, M, bytes);
  }

  void matmul_locked(const DeviceWeight& w, const float* x, int32_t M, float* y, bool rows_are_decodes) {
    const auto& d = w.desc;
    omp_set_num_threads(threads());  // (before view_of: packing a weight keeps to the engine's threads too)
    const cpu::WeightView view = view_of(w);
    if (batch_invariant_) {
      // Ember's kernels for every M: a row's result never depends on what it
      // is batched with (and on CPUs without native bf16 they also beat the
      // oneDNN f32 path, see docs/BENCHMARKS.md).
      cpu::matmul(view, x, M, y, scratch_, cpu::MatmulPath::kRowInvariant, row_kind(rows_are_decodes));
      return;
    }
    if (!rows_are_decodes) {
      cpu::matmul(view, x, M, y, scratch_);
      return;
    }
    // The decode kernels compute each row independently of M; keep every
    // chunk within their range so no row falls through to the GEMM path.
    const int64_t chunk = std::max<int64_t>(1, cpu::decode_max_m());
    for (int64_t first = 0; first < M; first += chunk) {
      const int64_t m = std::min<int64_t>(chunk, M - first);
      cpu::matmul(view, x + first * d.cols, m, y + first * d.rows, scratch_, cpu::MatmulPath::kAuto,
                  cpu::RowKind::kDecode);
    }
  }
  // Decode rows: llama.cpp's one-row kernels' orders; other rows: its
  // batched kernels' (cpu::RowKind).
  // Prompt rows on AMX tiles unless this engine prices its steps by rows
  // (prompt_tiles_: manual steps in a frame budget).
  cpu::RowKind row_kind(bool rows_are_decodes) const {
    if (rows_are_decodes) return cpu::RowKind::kDecode;
    return prompt_tiles_ ? cpu::RowKind::kPrompt : cpu::RowKind::kPromptNoTiles;
  }

  void rope(float* x, const int32_t* positions, int32_t rows, int32_t num_heads, int32_t head_dim, int32_t rot_dim,
            float freq_base) override {
    const int32_t half = rot_dim / 2;
    // Angles as llama.cpp's rope cache makes them (float recurrence
    // theta_{i+1} = theta_i * base^(-2/rot_dim) from theta_0 = pos): the
    // rounding then matches the reference's, not just the formula.
    const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(rot_dim));
#pragma omp parallel for num_threads(threads()) if (rows > 8)
    for (int32_t r = 0; r < rows; ++r) {
      float theta = static_cast<float>(positions[r]);
      for (int32_t i = 0; i < half; ++i, theta *= theta_scale) {
        const float c = std::cos(theta), s = std::sin(theta);
        for (int32_t h = 0; h < num_heads; ++h) {
          float* p = x + (static_cast<size_t>(r) * num_heads + h) * head_dim + 2 * i;
          const float x0 = p[0], x1 = p[1];
          // The reference's compiler contracts these into FMAs, x0's
          // product fused and x1's rounded: the same here.
          p[0] = std::fma(x0, c, -(x1 * s));
          p[1] = std::fma(x0, s, x1 * c);
        }
      }
    }
  }

  void kv_store(int32_t layer, const float* k, const float* v, const int32_t* slots, int32_t rows) override {
    store_rows(KvView{geom_.num_kv_heads, geom_.head_dim}, layer, k, v, slots, rows);
  }

  void kv_store_view(const KvView& view, int32_t layer, const float* k, const float* v, const int32_t* slots,
                     int32_t rows) override {
    check_view(view);
    store_rows(view, layer, k, v, slots, rows);
  }

  // A view's rows must fit the pool's (and the kernels' head sizes).
  void check_view(const KvView& view) const {
    if (view.num_kv_heads <= 0 || view.head_dim <= 0 || view.head_dim % 8 != 0 ||
        kv_row_bytes(geom_.dtype, view.head_dim) == 0 ||
        static_cast<int64_t>(view.num_kv_heads) * view.head_dim >
            static_cast<int64_t>(geom_.num_kv_heads) * geom_.head_dim) {
      fail(StatusCode::kInternal, "kv view: " + std::to_string(view.num_kv_heads) + " x " +
                                      std::to_string(view.head_dim) + " rows do not fit the pool's");
    }
  }

  void store_rows(const KvView& view, int32_t layer, const float* k, const float* v, const int32_t* slots,
                  int32_t rows) {
    const int32_t nkv = view.num_kv_heads, hd = view.head_dim, bs = geom_.block_size;
    if (layer < 0 || layer >= geom_.num_layers) fail(StatusCode::kInternal, "kv_store: layer outside the pool");
    const cpu::detail::BackendKernels& kernels = cpu::detail::backend_kernels();
    const size_t rb = kv_row_bytes(geom_.dtype, hd);
    const bool q8 = geom_.dtype == DType::Q8_0;
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t block = slots[r] / bs, off = slots[r] % bs;
      if (block < 0 || block >= geom_.num_blocks) fail(StatusCode::kInternal, "kv_store: slot outside the pool");
      for (int32_t h = 0; h < nkv; ++h) {
        const size_t src = (static_cast<size_t>(r) * nkv + h) * hd;
        uint8_t* kd = block_ptr(layer, 0, block) + (static_cast<size_t>(h) * bs + off) * rb;
        uint8_t* vd = block_ptr(layer, 1, block) + (static_cast<size_t>(h) * bs + off) * rb;
        if (q8) {
          quantize_q8_0(k + src, kd, hd);
          quantize_q8_0(v + src, vd, hd);
        } else {
          kernels.f32_to_f16(k + src, reinterpret_cast<uint16_t*>(kd), hd);
          kernels.f32_to_f16(v + src, reinterpret_cast<uint16_t*>(vd), hd);
        }
      }
    }
  }

  void attention(int32_t layer, const float* q, const AttentionSeq* seqs, int32_t n_seqs, const AttentionParams& p,
                 float* out) override {
    // Checked here, not in the workers: nothing may throw inside an OpenMP region.
    if (layer < 0 || layer >= geom_.num_layers ||
        static_cast<int64_t>(p.num_kv_heads) * p.head_dim > static_cast<int64_t>(geom_.num_kv_heads) * geom_.head_dim) {
      fail(StatusCode::kInternal, "cpu attention: layer or K/V row width outside the pool");
    }
    if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.num_heads / p.num_kv_heads > kAttnMaxGroup ||
        p.head_dim <= 0 || p.head_dim > kAttnMaxHeadDim || p.head_dim % 8 != 0 ||
        kv_row_bytes(geom_.dtype, p.head_dim) == 0) {
      fail(StatusCode::kUnsupported,
           "cpu attention: " + std::to_string(p.num_heads) + " heads over " + std::to_string(p.num_kv_heads) +
               " kv heads of " + std::to_string(p.head_dim) +
               " not supported (head_dim a multiple of 8 up to 256, of 32 with a q8_0 cache; at most 16 heads per kv"
               " head)");
    }
    // Work items: (rows, kv head). Each handles the group of query heads
    // that share the kv head, so K/V are read once per group; and the rows
    // of one sequence that see its cache in the same order with no window
    // (a token tree's rows, a prompt chunk's) run up to kAttnMaxRows
    // together, so the slots they share are read once for all of them
    // (attend_rows). No result depends on the grouping.
    const std::vector<RowRun> units = attention_units(seqs, n_seqs, p);
    const int32_t items = static_cast<int32_t>(units.size()) * p.num_kv_heads;
    const cpu::detail::BackendKernels& kernels = cpu::detail::backend_kernels();
    if (const int32_t parts = attention_parts(units, items, p); parts > 1) {
      attention_split(kernels, layer, q, seqs, units, parts, p, out);
      return;
    }
    std::atomic<bool> out_of_memory{false};  // (the per-thread scratch may fail to grow)
#pragma omp parallel for num_threads(threads()) schedule(dynamic, 1)
    for (int32_t it = 0; it < items; ++it) {
      const RowRun& u = units[it / p.num_kv_heads];
      try {
        attend_rows(kernels, layer, q, seqs[u.seq], u, it % p.num_kv_heads, p, out);
      } catch (...) {
        out_of_memory = true;
      }
    }
    if (out_of_memory) fail(StatusCode::kOutOfMemory, "cpu attention: cannot allocate its scratch");
  }

  // SiLU(gate) * up as llama.cpp computes it (the kernel's swiglu8), libm's
  // expf for a tail of fewer than 8.
  void swiglu(const float* gate, const float* up, size_t n, float* out) override {
    const size_t n8 = n & ~size_t{7};
    constexpr size_t kChunk = 4096;  // elementwise: the chunking changes no result
    const auto& kernels = cpu::detail::backend_kernels();
    const int64_t chunks = static_cast<int64_t>((n8 + kChunk - 1) / kChunk);
#pragma omp parallel for num_threads(threads()) if (n > 65536)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t i0 = static_cast<size_t>(c) * kChunk, len = std::min(kChunk, n8 - i0);
      kernels.swiglu8(gate + i0, up + i0, len, out + i0);
    }
    for (size_t i = n8; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }

  // gelu(gate) * up as llama.cpp's CPU computes it (GGML_GELU_FP16): the
  // f16-rounded gate looked up in a table of f16 gelu values, the tails
  // below -10 and above 10 taken as 0 and the identity.
  // With F16C 8 values at a time (geglu_f16c, the same bits), in chunks
  // over the threads from 16,384 values (16 Gemma 3 sessions' rows: 32,768).
  // Serial and scalar it was 2.6% of the samples of `perf record ember bench
  // -m gemma-3-270m --sessions 16 -p 64 -n 128 -t 2`, all on the engine's
  // thread, the other thread waiting (its libgomp waits 9.1% -> 6.5% of the
  // samples); steady tok/s, 8 alternations: median 487.9 -> 540.3.
  void geglu(const float* gate, const float* up, size_t n, float* out) override {
    const uint16_t* table = gelu_f16_table();
    const bool f16c = cpu::active_isa() != cpu::Isa::kScalar;
    constexpr int64_t kChunk = 4096;  // elementwise: the chunking changes no result
    const int64_t total = static_cast<int64_t>(n), chunks = (total + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(threads()) if (n > 16384)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i0 = c * kChunk, i1 = std::min(total, i0 + kChunk);
      if (f16c) {
        geglu_f16c(gate + i0, up + i0, i1 - i0, table, out + i0);
        continue;
      }
      for (int64_t i = i0; i < i1; ++i) out[i] = geglu_value(gate[i], up[i], table);
    }
  }

  void scale(float* x, size_t n, float s) override {
    for (size_t i = 0; i < n; ++i) x[i] *= s;
  }

  void add_bias(float* x, const DeviceWeight& bias, int32_t rows, int32_t dim) override {
    if (bias.desc.type != DType::F32 || bias.desc.cols != dim) fail(StatusCode::kInternal, "add_bias: bad bias");
    const float* b = static_cast<const float*>(bias.desc.host_data);
    for (int32_t r = 0; r < rows; ++r) {
      float* xr = x + static_cast<size_t>(r) * dim;
      for (int32_t i = 0; i < dim; ++i) xr[i] += b[i];
    }
  }

  // NEOX pairs, frequency scale and factors as llama.cpp's rope cache and
  // rotate_pairs compute them (theta / factor, then * freq_scale; the same
  // FMA contraction as rope()).
  void rope_ext(float* x, const int32_t* positions, int32_t rows, int32_t num_heads, int32_t head_dim,
                const RopeSpec& spec) override {
    const int32_t half = spec.rot_dim / 2;
    if (spec.rot_dim <= 0 || spec.rot_dim > head_dim || spec.rot_dim % 2 != 0) {
      fail(StatusCode::kInternal, "rope_ext: bad rot_dim");
    }
    const float theta_scale = std::pow(spec.freq_base, -2.0f / static_cast<float>(spec.rot_dim));
    const int32_t stride = spec.neox ? 1 : 2, offset = spec.neox ? half : 1;
#pragma omp parallel for num_threads(threads()) if (rows > 8)
    for (int32_t r = 0; r < rows; ++r) {
      float theta = static_cast<float>(positions[r]);
      for (int32_t i = 0; i < half; ++i, theta *= theta_scale) {
        const float t = spec.freq_scale * (spec.freq_factors ? theta / spec.freq_factors[i] : theta);
        const float c = std::cos(t), s = std::sin(t);
        for (int32_t h = 0; h < num_heads; ++h) {
          float* p = x + (static_cast<size_t>(r) * num_heads + h) * head_dim + stride * i;
          const float x0 = p[0], x1 = p[offset];
          p[0] = std::fma(x0, c, -(x1 * s));
          p[offset] = std::fma(x0, s, x1 * c);
        }
      }
    }
  }

  void add(float* x, const float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
  }

  void gather_rows(const float* x, const int32_t* rows, int32_t n, int32_t dim, float* out) override {
    for (int32_t i = 0; i < n; ++i) {
      std::memcpy(out + static_cast<size_t>(i) * dim, x + static_cast<size_t>(rows[i]) * dim, dim * sizeof(float));
    }
  }

  // LoRA terms: t = round(x[rows]) A^T per term (work items: a term's rank
  // rows in chunks), then y[rows] += (round(t) B^T) * scale with the output
  // columns split across threads, every term in order inside a column chunk
  // (a row with several adapters adds them in set order). Each dot product
  // is llama.cpp's (lora_dot_*), so a row's result never depends on what
  // else the call holds.
  void lora(const LoraTerm* terms, int32_t n_terms, const float* x, float* y) override {
    if (n_terms <= 0) return;
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    const int64_t K = terms[0].a->desc.cols;
    std::vector<size_t> x_off(static_cast<size_t>(n_terms)), t_off(static_cast<size_t>(n_terms));
    size_t x_len = 0, t_len = 0;
    // The outputs, in order of first appearance, and the terms of each.
    struct Target {
      float* y;
      int64_t N;
      std::vector<int32_t> terms;
    };
    std::vector<Target> targets;
    for (int32_t i = 0; i < n_terms; ++i) {
      const LoraTerm& t = terms[i];
      const int64_t r = t.a->desc.rows;
      if (t.a->desc.cols != K || t.b->desc.cols != r || t.n_rows < 0) {
        fail(StatusCode::kInternal, "cpu lora: the terms' shapes disagree");
      }
      float* ty = t.y ? t.y : y;
      auto it = std::find_if(targets.begin(), targets.end(), [&](const Target& g) { return g.y == ty; });
      if (it == targets.end()) {
        targets.push_back({ty, t.b->desc.rows, {}});
        it = targets.end() - 1;
      }
      if (it->N != t.b->desc.rows) fail(StatusCode::kInternal, "cpu lora: one output, two widths");
      it->terms.push_back(i);
      x_off[i] = x_len;
      t_off[i] = t_len;
      x_len += static_cast<size_t>(t.n_rows) * K;
      t_len += static_cast<size_t>(t.n_rows) * r;
    }
    lora_x_.resize(x_len);
    lora_t_.resize(t_len);
    // The rows each term reads, rounded to its lora_a's type.
    for (int32_t i = 0; i < n_terms; ++i) {
      const LoraTerm& t = terms[i];
      for (int32_t m = 0; m < t.n_rows; ++m) {
        round_to(t.a->desc.type, x + static_cast<size_t>(t.rows[m]) * K, K,
                 lora_x_.data() + x_off[i] + static_cast<size_t>(m) * K);
      }
    }
    const cpu::Isa isa = cpu::active_isa();
    const int nt = threads();
    // Prompt rows: llama.cpp's batched (tinyBLAS) order is the row-invariant
    // float kernels' (one accumulator of the vector width, halves folded),
    // with the weights loaded once for several rows: cpu::matmul per product.
    bool any_decodes = false;
    omp_set_num_threads(nt);
    for (int32_t i = 0; i < n_terms; ++i) {
      const LoraTerm& t = terms[i];
      if (t.decodes || t.n_rows == 0) {
        any_decodes |= t.decodes && t.n_rows > 0;
        continue;
      }
      const WeightDesc& a = t.a->desc;
      const WeightDesc& b = t.b->desc;
      const int64_t r = a.rows;
      float* tm = lora_t_.data() + t_off[i];
      cpu::matmul(cpu::WeightView{a.type, r, K, a.host_data}, lora_x_.data() + x_off[i], t.n_rows, tm, scratch_,
                  cpu::MatmulPath::kRowInvariant, row_kind(false));
      round_to(b.type, tm, static_cast<int64_t>(t.n_rows) * r, tm);
      const int64_t N = b.rows;
      float* const ty = t.y ? t.y : y;
      lora_u_.resize(static_cast<size_t>(t.n_rows) * N);
      cpu::matmul(cpu::WeightView{b.type, N, r, b.host_data}, tm, t.n_rows, lora_u_.data(), scratch_,
                  cpu::MatmulPath::kRowInvariant, row_kind(false));
      for (int32_t m = 0; m < t.n_rows; ++m) {
        float* yr = ty + static_cast<size_t>(t.rows[m]) * N;
        const float* u = lora_u_.data() + static_cast<size_t>(m) * N;
        if (isa != cpu::Isa::kScalar) {
          lora_scale_add_avx(yr, u, N, t.scale);
        } else {
          for (int64_t j = 0; j < N; ++j) yr[j] = yr[j] + u[j] * t.scale;  // ggml_scale, then ggml_add
        }
      }
    }
    if (!any_decodes) return;
    // Phase 1 items: (term, chunk of rank rows).
    std::vector<std::pair<int32_t, int64_t>> items;
    for (int32_t i = 0; i < n_terms; ++i) {
      if (terms[i].n_rows == 0 || !terms[i].decodes) continue;
      for (int64_t r0 = 0; r0 < terms[i].a->desc.rows; r0 += kLoraRankChunk) items.emplace_back(i, r0);
    }
    // Phase 2 items: (output, column chunk) (multiples of 8, several per
    // thread); an item adds its output's terms in order.
    std::vector<std::pair<int32_t, int64_t>> cols;  // (target, first column)
    int64_t col_chunk = 8;
    {
      int64_t total = 0;
      for (const auto& g : targets) total += g.N;
      col_chunk = std::max<int64_t>(8, ((total + 4 * nt - 1) / (4 * nt) + 7) & ~int64_t{7});
      for (size_t g = 0; g < targets.size(); ++g) {
        for (int64_t c = 0; c < targets[g].N; c += col_chunk) cols.emplace_back(static_cast<int32_t>(g), c);
      }
    }
    const size_t work = t_len * static_cast<size_t>(K + targets[0].N);
#pragma omp parallel num_threads(nt) if (work > 65536)
    {
#pragma omp for schedule(dynamic, 1)
      for (size_t it = 0; it < items.size(); ++it) {
        const auto [i, r0] = items[it];
        const LoraTerm& t = terms[i];
        const LoraDot dot = lora_vec_for(isa);
        const WeightDesc& a = t.a->desc;
        const int64_t r = a.rows, r1 = std::min<int64_t>(r0 + kLoraRankChunk, r);
        const size_t a_row = row_bytes(a.type, K);
        for (int32_t m = 0; m < t.n_rows; ++m) {
          const float* xm = lora_x_.data() + x_off[i] + static_cast<size_t>(m) * K;
          float* tm = lora_t_.data() + t_off[i] + static_cast<size_t>(m) * r;
          float v[kLoraRankChunk];
          dot(a.type, static_cast<const uint8_t*>(a.host_data) + r0 * a_row, a_row, r1 - r0, xm, K, v);
          round_to(t.b->desc.type, v, r1 - r0, tm + r0);  // lora_b's input, rounded to its type
        }
      }  // (implicit barrier)
#pragma omp for schedule(dynamic, 1)
      for (size_t c = 0; c < cols.size(); ++c) {
        const Target& g = targets[static_cast<size_t>(cols[c].first)];
        const int64_t N = g.N;
        float* const y = g.y;  // (this output's)
        const int64_t n0 = cols[c].second, n1 = std::min<int64_t>(n0 + col_chunk, N);
        for (int32_t i : g.terms) {
          const LoraTerm& t = terms[i];
          if (!t.decodes) continue;  // (done above)
          const LoraDot dot = lora_vec_for(isa);
          const WeightDesc& b = t.b->desc;
          const int64_t r = b.cols;
          const size_t b_row = row_bytes(b.type, r);
          if (isa != cpu::Isa::kScalar && b.type == DType::F16 && r % 8 == 0 && r <= 32) {
            // Every row of the term per weight row (see lora_vec_b_rows_f16).
            constexpr int64_t kRowsAtOnce = 8;
            float u[kRowsAtOnce * kLoraColChunkMax];
            for (int32_t m0 = 0; m0 < t.n_rows; m0 += static_cast<int32_t>(kRowsAtOnce)) {
              const int64_t mn = std::min<int64_t>(kRowsAtOnce, t.n_rows - m0);
              for (int64_t c0 = n0; c0 < n1; c0 += kLoraColChunkMax) {
                const int64_t cn = std::min<int64_t>(kLoraColChunkMax, n1 - c0);
                lora_vec_b_rows_f16(static_cast<const uint8_t*>(b.host_data) + c0 * b_row, b_row, cn,
                                    lora_t_.data() + t_off[i] + static_cast<size_t>(m0) * r, mn, r, u,
                                    kLoraColChunkMax);
                for (int64_t m = 0; m < mn; ++m) {
                  lora_scale_add_avx(y + static_cast<size_t>(t.rows[m0 + m]) * N + c0, u + m * kLoraColChunkMax, cn,
                                     t.scale);
                }
              }
            }
            continue;
          }
          for (int32_t m = 0; m < t.n_rows; ++m) {
            const float* tm = lora_t_.data() + t_off[i] + static_cast<size_t>(m) * r;
            float* yr = y + static_cast<size_t>(t.rows[m]) * N;
            float u[kLoraColChunkMax];
            for (int64_t c0 = n0; c0 < n1; c0 += kLoraColChunkMax) {
              const int64_t cn = std::min<int64_t>(kLoraColChunkMax, n1 - c0);
              dot(b.type, static_cast<const uint8_t*>(b.host_data) + c0 * b_row, b_row, cn, tm, r, u);
              if (isa != cpu::Isa::kScalar) {
                lora_scale_add_avx(yr + c0, u, cn, t.scale);
              } else {
                for (int64_t j = 0; j < cn; ++j) yr[c0 + j] = yr[c0 + j] + u[j] * t.scale;  // ggml_scale, ggml_add
              }
            }
          }
        }
      }
    }
  }

 private:
  void release_kv() {
    if (kv_) munmap(kv_, kv_bytes_);
    kv_ = nullptr;
    kv_bytes_ = 0;
  }
  // One layer's K (or V) of one block.
  size_t block_bytes() const { return static_cast<size_t>(geom_.num_kv_heads) * geom_.block_size * geom_.row_bytes(); }
  // kv: 0 = K, 1 = V.
  uint8_t* block_ptr(int32_t layer, int kv, int32_t block) const {
    const size_t per = block_bytes(), layer_stride = 2 * per * geom_.num_blocks;
    return kv_ + layer * layer_stride + kv * per * geom_.num_blocks + block * per;
  }

  // llama.cpp's quantize_row_q8_0_ref: per 32 elements d = max|x| / 127
  // (stored as f16), q = roundf(x / d) (x * (1 / d)); n a multiple of 32.
  static void quantize_q8_0(const float* x, uint8_t* out, int32_t n) {
    for (int32_t b = 0; b < n; b += 32, out += 34) {
      float amax = 0.0f;
      for (int32_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t dh = fp32_to_fp16(d);
      std::memcpy(out, &dh, 2);
      for (int32_t j = 0; j < 32; ++j) {
        // |v| <= 127; clamped where 1 / d overflowed (subnormal rows), 0
        // for a NaN / inf row: never an out-of-range conversion.
        const float v = x[b + j] * id;
        const float c = v == v ? std::min(127.0f, std::max(-127.0f, v)) : 0.0f;
        out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(c)));
      }
    }
  }
  // K-shift of Q8_0 rows: each row dequantized, rotated as the f16 path
  // rotates (x * cs + partner * sn, adjacent or NEOX pairs), requantized.
  static void rope_shift_q8_rows(uint8_t* k, size_t rows, int32_t hd, const RopeSpec& spec, const float* cs,
                                 const float* sn) {
    float x[512], y[512];
    const size_t rb = kv_row_bytes(DType::Q8_0, hd);
    const int32_t half = spec.rot_dim / 2;
    const DequantizeRowFn dequantize = type_traits(DType::Q8_0)->dequantize_row;  // (the GGUF reader's)
    for (size_t r = 0; r < rows; ++r) {
      uint8_t* kr = k + r * rb;
      dequantize(kr, x, hd);
      for (int32_t i = 0; i < hd; ++i) {
        int32_t partner = i;
        if (spec.neox) {
          if (i < spec.rot_dim) partner = i < half ? i + half : i - half;
        } else {
          partner = i ^ 1;
        }
        y[i] = std::fma(x[partner], sn[i], x[i] * cs[i]);
      }
      quantize_q8_0(y, kr, hd);
    }
  }

  // Rows [row0, row0 + n) of sequence `seq`: one attention work item per kv head.
  struct RowRun {
    int32_t seq, row0, n;
  };

  // The work items' rows: runs of a sequence's rows in one order with no
  // window, cut into near-equal groups of at most kAttnMaxRows (fewer where
  // their scores would pass kRowsScoreFloats), and into more groups while
  // the items are fewer than the threads.
  std::vector<RowRun> attention_units(const AttentionSeq* seqs, int32_t n_seqs, const AttentionParams& p) const {
    constexpr size_t kRowsScoreFloats = size_t{1} << 20;
    const int32_t group = p.num_heads / p.num_kv_heads;
    auto order = [&](int32_t row) { return p.decode_rows != nullptr && p.decode_rows[row] != 0; };
    auto windowed = [&](int32_t row) { return p.window > 0 && p.kv_len[row] > p.window; };
    struct Run {
      RowRun rows;
      int32_t parts;
    };
    std::vector<Run> runs;
    for (int32_t s = 0; s < n_seqs; ++s) {
      for (int32_t r = seqs[s].first_row; r < seqs[s].first_row + seqs[s].n_rows; ++r) {
        if (!runs.empty()) {
          RowRun& last = runs.back().rows;
          const int32_t prev = last.row0 + last.n - 1;
          if (last.seq == s && prev == r - 1 && order(prev) == order(r) && !windowed(prev) && !windowed(r)) {
            ++last.n;
            continue;
          }
        }
        runs.push_back({{s, r, 1}, 1});
      }
    }
    size_t n_units = 0;
    for (Run& run : runs) {
      int32_t max_pad = 1;
      for (int32_t r = run.rows.row0; r < run.rows.row0 + run.rows.n; ++r)
        max_pad = std::max(max_pad, (p.kv_len[r] + 31) & ~31);
      const int32_t by_memory =
          static_cast<int32_t>(std::max<size_t>(1, kRowsScoreFloats / (static_cast<size_t>(group) * max_pad)));
      const int32_t per = std::min<int32_t>(cpu::detail::kAttnMaxRows, by_memory);
      run.parts = (run.rows.n + per - 1) / per;
      n_units += static_cast<size_t>(run.parts);
    }
    // Too few items for the threads, or fewer than twice the threads and
    // not a multiple of them (SmolLM2's 3 kv heads on 2 threads: one thread
    // idle a third of the time): split the run with the largest groups.
    const auto too_few = [&](size_t items) {
      const size_t t = static_cast<size_t>(threads());
      return items < t || (items < 2 * t && items % t != 0);
    };
    while (too_few(n_units * static_cast<size_t>(p.num_kv_heads))) {
      Run* best = nullptr;
      for (Run& run : runs) {
        if (run.parts < run.rows.n && (best == nullptr || run.rows.n * best->parts > best->rows.n * run.parts))
          best = &run;
      }
      if (best == nullptr) break;
      ++best->parts;
      ++n_units;
    }
    std::vector<RowRun> units;
    units.reserve(n_units);
    for (const Run& run : runs) {
      int32_t row = run.rows.row0;
      for (int32_t k = 0; k < run.parts; ++k) {
        const int32_t n = run.rows.n / run.parts + (k < run.rows.n % run.parts ? 1 : 0);
        units.push_back({run.rows.seq, row, n});
        row += n;
      }
    }
    return units;
  }

  // One item's scratch (AttendArgs: scores, lane accumulators, queries), in floats.
  static size_t attend_scratch_floats(const AttentionParams& p, int32_t kv_len) {
    const size_t group = static_cast<size_t>(p.num_heads / p.num_kv_heads);
    return group * (((kv_len + 31) & ~31) + 32 * static_cast<size_t>(p.head_dim) + cpu::detail::kAttnMaxHeadDim);
  }
  // Points a's scratch at buf (attend_scratch_floats of them).
  static void place_attend_scratch(cpu::detail::AttendArgs& a, float* buf, const AttentionParams& p) {
    const size_t group = static_cast<size_t>(p.num_heads / p.num_kv_heads);
    a.scores = buf;
    a.acc = a.scores + group * ((a.kv_len + 31) & ~31);
    a.qbuf = a.acc + group * 32 * static_cast<size_t>(p.head_dim);
  }

  // One item's kernel arguments, all but the scratch.
  void attend_args(cpu::detail::AttendArgs& a, int32_t layer, const float* q, const AttentionSeq& seq, int32_t row,
                   int32_t kvh, const AttentionParams& p, float* out) const {
    const int32_t kv_len = p.kv_len[row];
    a = cpu::detail::AttendArgs{};
    a.k_base = block_ptr(layer, 0, 0);
    a.v_base = block_ptr(layer, 1, 0);
    a.block_bytes = block_bytes();
    a.row_bytes = kv_row_bytes(geom_.dtype, p.head_dim);
    a.block_size = geom_.block_size;
    a.block_table = seq.block_table;
    a.hole_begin = seq.hole_begin;
    a.hole_end = seq.hole_end;
    a.window_begin = p.window > 0 ? std::max(0, kv_len - p.window) : 0;
    const bool tree = p.tree_from && p.tree_from[row] >= 0;
    a.map_from = tree ? p.tree_from[row] : INT32_MAX;
    a.slot_map = tree ? p.tree_slots + p.tree_begin[row] : nullptr;
    a.q = q;
    a.row = row;
    a.kvh = kvh;
    a.num_heads = p.num_heads;
    a.num_kv_heads = p.num_kv_heads;
    a.head_dim = p.head_dim;
    a.kv_len = kv_len;
    a.vec_order = p.decode_rows && p.decode_rows[row];
    a.scale = p.scale;
    a.out = out;
  }

  // Into how many parts each item is split over the threads (1: none): where
  // every item is one row and there are too few of them to keep the threads
  // busy (one decode row over a long context, its kv heads fewer than twice
  // the threads), as long as each part keeps kMinSlotsPerPart slots (the
  // split costs four barriers).
  int32_t attention_parts(const std::vector<RowRun>& units, int32_t items, const AttentionParams& p) const {
    constexpr int32_t kMinSlotsPerPart = 256;
    const int32_t t = threads();
    if (t <= 1 || items <= 0 || items >= 2 * t) return 1;
    int32_t min_slots = INT32_MAX;
    for (const RowRun& u : units) {
      if (u.n != 1) return 1;
      const int32_t kv_len = p.kv_len[u.row0];
      const int32_t first = p.window > 0 ? std::max(0, kv_len - p.window) & ~31 : 0;  // (attend_first)
      min_slots = std::min(min_slots, ((kv_len + 31) & ~31) - first);
    }
    const int32_t want = (2 * t + items - 1) / items;
    return std::max(1, std::min({want, 8, min_slots / kMinSlotsPerPart}));
  }

  // attention() with each item's phases split into `parts` over the threads
  // (BackendKernels::attend_phase: the same bits as the item in one piece).
  void attention_split(const cpu::detail::BackendKernels& kernels, int32_t layer, const float* q,
                       const AttentionSeq* seqs, const std::vector<RowRun>& units, int32_t parts,
                       const AttentionParams& p, float* out) {
    using cpu::detail::AttendPhase;
    const int32_t items = static_cast<int32_t>(units.size()) * p.num_kv_heads;
    // Scratch of the calling thread, shared by the workers.
    thread_local AttendScratch buf;
    thread_local std::vector<cpu::detail::AttendArgs> args;
    thread_local std::vector<std::array<bool, cpu::detail::kAttnMaxGroup>> live;
    try {
      size_t need = 0;
      for (const RowRun& u : units) need += p.num_kv_heads * attend_scratch_floats(p, p.kv_len[u.row0]);
      buf.fit(need);
      args.resize(static_cast<size_t>(items));
      live.resize(static_cast<size_t>(items));
    } catch (const std::bad_alloc&) {
      fail(StatusCode::kOutOfMemory, "cpu attention: cannot allocate its scratch");
    }
    size_t off = 0;
    for (int32_t it = 0; it < items; ++it) {
      const RowRun& u = units[it / p.num_kv_heads];
      cpu::detail::AttendArgs& a = args[it];
      attend_args(a, layer, q, seqs[u.seq], u.row0, it % p.num_kv_heads, p, out);
      place_attend_scratch(a, buf.data() + off, p);
      off += attend_scratch_floats(p, a.kv_len);
      a.live = live[it].data();
    }
    const auto phase = geom_.dtype == DType::Q8_0 ? kernels.attend_phase_q8 : kernels.attend_phase;
    const cpu::detail::AttendArgs* as = args.data();
#pragma omp parallel num_threads(threads())
    {
#pragma omp for schedule(static)
      for (int32_t it = 0; it < items; ++it) phase(as[it], AttendPhase::kQueries, 0, 1);
#pragma omp for schedule(dynamic, 1)
      for (int32_t w = 0; w < items * parts; ++w) phase(as[w / parts], AttendPhase::kScores, w % parts, parts);
#pragma omp for schedule(dynamic, 1)
      for (int32_t it = 0; it < items; ++it) phase(as[it], AttendPhase::kSoftmax, 0, 1);
#pragma omp for schedule(dynamic, 1)
      for (int32_t w = 0; w < items * parts; ++w) phase(as[w / parts], AttendPhase::kValues, w % parts, parts);
#pragma omp for schedule(static)
      for (int32_t it = 0; it < items; ++it) phase(as[it], AttendPhase::kOutput, 0, 1);
    }
  }

  // Fills the kernel's arguments for the (rows, kv head) item; the scratch
  // is per thread and grows here (in baseline code), never in a kernel.
  void attend_rows(const cpu::detail::BackendKernels& kernels, int32_t layer, const float* q, const AttentionSeq& seq,
                   const RowRun& u, int32_t kvh, const AttentionParams& p, float* out) const {
    size_t need = 0;
    for (int32_t j = 0; j < u.n; ++j) need += attend_scratch_floats(p, p.kv_len[u.row0 + j]);
    thread_local AttendScratch buf;
    buf.fit(need);
    cpu::detail::AttendArgs args[cpu::detail::kAttnMaxRows];
    size_t off = 0;
    for (int32_t j = 0; j < u.n; ++j) {
      attend_args(args[j], layer, q, seq, u.row0 + j, kvh, p, out);
      place_attend_scratch(args[j], buf.data() + off, p);
      off += attend_scratch_floats(p, args[j].kv_len);
    }
    (geom_.dtype == DType::Q8_0 ? kernels.attend_rows_q8 : kernels.attend_rows)(args, u.n);
  }

  int threads() const { return governor_.threads(); }
  // Weights come from upload_weight (CpuWeight); packing needs scratch_mutex_.
  // A batch-invariant engine's kernels read the packed copy alone when there
  // is one; otherwise (or for oneDNN's prefill) the GGUF bytes, pinned.
  cpu::WeightView view_of(const DeviceWeight& w) const {
    auto& cw = const_cast<CpuWeight&>(static_cast<const CpuWeight&>(w));
    const void* packed = cw.packed(batch_invariant_);
    if (!packed || !batch_invariant_) cw.pin_original();
    const auto& d = w.desc;
    return cpu::WeightView{d.type, d.rows, d.cols, d.host_data, packed, packed && cw.packed_tiles()};
  }
  // Decode-sized calls (weights streamed once for a few rows) teach the
  // governor how fast the current thread count is; larger ones are not
  // measured (work 0).
  void governed(std::chrono::steady_clock::time_point t0, int32_t M, size_t bytes) {
    const auto t1 = std::chrono::steady_clock::now();
    governor_.record(std::chrono::duration<double>(t1.time_since_epoch()).count(),
                     std::chrono::duration<double>(t1 - t0).count(),
                     M <= kGovernedRows ? static_cast<double>(bytes) : 0.0);
  }
  static constexpr int32_t kGovernedRows = 16;

  cpu::ThreadGovernor governor_;
  bool batch_invariant_;
  bool prompt_tiles_;
  KvGeometry geom_;
  uint8_t* kv_ = nullptr;
  size_t kv_bytes_ = 0;
  std::mutex scratch_mutex_;
  cpu::MatmulScratch scratch_;
  std::vector<uint8_t> embed_row_;  // embed(): one row unpacked (under scratch_mutex_)
  // LoRA (under scratch_mutex_): gathered rows, the rank-r products, and
  // per-thread matmul scratch and tiles.
  static constexpr int64_t kLoraRankChunk = 8;
  static constexpr int64_t kLoraColChunkMax = 256;
  static void round_to(DType type, const float* in, int64_t n, float* out) {
    switch (type) {
      case DType::F16:
        if (cpu::active_isa() != cpu::Isa::kScalar) {
          round_f16_f16c(in, n, out);
          return;
        }
        for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(fp32_to_fp16(in[i]));
        return;
      case DType::BF16:
        for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(fp32_to_bf16(in[i]));
        return;
      default: std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    }
  }
  std::vector<float> lora_x_, lora_t_, lora_u_;
};

}  // namespace

size_t cpu_buffer_bytes() { return g_buffer_bytes.load(std::memory_order_relaxed); }

std::unique_ptr<Backend> make_cpu_backend(int n_threads, bool batch_invariant, bool prompt_tiles) {
  return std::make_unique<CpuBackend>(n_threads, batch_invariant, prompt_tiles);
}

void register_cpu_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_backend(
        "cpu", [](const BackendOptions& o) { return make_cpu_backend(o.n_threads, o.batch_invariant, o.prompt_tiles); },
        [] {
          const cpu::Isa isa = cpu::active_isa();
          return BackendInfo{static_cast<int32_t>(isa), cpu::isa_to_string(isa)};
        });
  });
}

}  // namespace ember

// The CPU backend registers itself as its program or library loads. The link
// option -u ember_cpu_backend_registered (ember_cpu's INTERFACE link options)
// keeps this object in every link of the static library, though nothing
// calls into it directly. Hidden: libember does not export it.
extern "C" {
extern const bool ember_cpu_backend_registered;
const bool ember_cpu_backend_registered = (ember::register_cpu_backend(), true);
}
