// Internal interface between the matmul driver (matmul.cpp) and the per-ISA
// kernel files (matmul_scalar.cpp, matmul_avx2.cpp, matmul_avx512.cpp).
// Not part of the public API.
//
// Included by baseline and ISA files alike: every function defined here is
// in an anonymous namespace, so each file gets its own copy compiled for its
// own ISA, and the linker can never hand a baseline caller an AVX2 copy.
#pragma once

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <cstddef>
#include <cstdint>

#include "core/tensor/types.h"

namespace ember::cpu::detail {

inline constexpr int64_t kQK = 32;  // elements per quant block (Q4_0/Q4_1/Q8_0 and activations)

namespace {

// f16 <-> f32: F16C in files compiled for it, else the portable conversions
// of core/tensor (equal to F16C's bit for bit for every non-NaN value,
// tests/unit/tensor/types_test.cpp Fp16.MatchesF16C).
#if defined(__F16C__)
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f2h(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
#else
inline float h2f(uint16_t h) { return fp16_to_fp32(h); }
inline uint16_t f2h(float f) { return fp32_to_fp16(f); }
#endif
inline uint16_t f2bf(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf2f(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

inline bool is_quant(DType t) { return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0; }

// Bytes of one weight row of K elements (K a multiple of the block size).
inline size_t weight_row_bytes(DType t, int64_t K) {
  switch (t) {
    case DType::Q4_0: return static_cast<size_t>(K / kQK) * sizeof(BlockQ4_0);
    case DType::Q4_1: return static_cast<size_t>(K / kQK) * sizeof(BlockQ4_1);
    case DType::Q8_0: return static_cast<size_t>(K / kQK) * sizeof(BlockQ8_0);
    case DType::F16:
    case DType::BF16: return static_cast<size_t>(K) * 2;
    case DType::F32: return static_cast<size_t>(K) * 4;
    default: return 0;
  }
}

}  // namespace

// Everything a decode kernel needs. Activations are "prepared" once per call
// by the variant's prepare_acts() into act (layout private to the variant);
// float weight types may read x directly.
struct DecodeCtx {
  DType type;
  const uint8_t* w;    // weight row 0
  size_t w_row_bytes;  // bytes between weight rows
  int64_t K;
  int64_t M;
  const float* x;        // [M][K] f32 activations
  const uint8_t* act;    // prepared activations (nullptr if the kernel reads x)
  size_t act_row_bytes;  // bytes between prepared activation rows
  float* y;              // y[m * ldy + n]
  int64_t ldy;
};

// Computes y[0..M)[n0..n1) for the weight rows n0..n1.
using DecodeKernel = void (*)(const DecodeCtx& c, int64_t n0, int64_t n1);
// Bytes of prepared activations per row (0 if the kernel reads x directly).
using ActRowBytesFn = size_t (*)(DType type, int64_t K);
// Prepare M activation rows of x into act (act_row_bytes(type, K) bytes each).
using PrepareActsFn = void (*)(DType type, const float* x, int64_t M, int64_t K, uint8_t* act);
// Dequantize n elements (n a multiple of the type's block size) of contiguous
// weight data to f32 / bf16.
using DequantF32Fn = void (*)(DType type, const void* src, float* dst, int64_t n);
using DequantBf16Fn = void (*)(DType type, const void* src, uint16_t* dst, int64_t n);
// f32 -> bf16 (round to nearest even), n elements.
using F32ToBf16Fn = void (*)(const float* src, uint16_t* dst, int64_t n);

struct IsaImpl {
  const char* name;
  ActRowBytesFn act_row_bytes;
  PrepareActsFn prepare_acts;
  DecodeKernel (*kernel)(DType type);  // nullptr for unsupported types
  DequantF32Fn dequant_f32;
  DequantBf16Fn dequant_bf16;
  F32ToBf16Fn f32_to_bf16;
};

const IsaImpl& scalar_impl();
const IsaImpl& avx2_impl();
const IsaImpl& avx512_impl();  // only call after isa_supported(Isa::kAvx512Vnni)

namespace {

// Natural activation layout shared by the scalar and AVX2 variants, per row:
//   int8  qs[K]            quantized values, block b at qs + 32*b
//   float d[K/32]          block scale (x ~= d * q)
//   float s[K/32]          d * sum(q of the block)
// padded to 64 bytes.
inline size_t q8_natural_row_bytes(int64_t K) {
  const size_t nb = static_cast<size_t>(K / kQK);
  size_t b = static_cast<size_t>(K) + 8 * nb;
  return (b + 63) & ~size_t{63};
}
struct Q8Row {
  const int8_t* qs;
  const float* d;
  const float* s;
};
inline Q8Row q8_natural_row(const uint8_t* act, size_t row_bytes, int64_t K, int64_t m) {
  const uint8_t* base = act + static_cast<size_t>(m) * row_bytes;
  const float* d = reinterpret_cast<const float*>(base + K);
  return {reinterpret_cast<const int8_t*>(base), d, d + K / kQK};
}

// The float arithmetic of one quantized dot product (a weight row of nb
// blocks against a prepared activation row), in the order every variant
// except AVX-512 follows, which is also llama.cpp's AVX2 order
// (ggml_vec_dot_q4_1_q8_1 and friends):
//   per block: 8 integer lanes, lane k = sum of w*a over elements 4k..4k+3,
//              lane_acc[k] = fma(dw*dx, lane_k, lane_acc[k])  (dw*dx exact);
//              Q4_1 also summs += mw * s                        (exact product);
//   result   = ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))  [+ summs for Q4_1].
// Keeping the order identical to the reference makes Ember's logits equal to
// llama.cpp's bit for bit where the rest of the computation matches too.
inline float hsum8_reference(const float l[8]) {
  const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
  return (t0 + t2) + (t1 + t3);
}
template <DType T>
inline float quant_dot_reference(const uint8_t* wrow, const Q8Row& a, int64_t nb) {
  static_assert(T == DType::Q4_0 || T == DType::Q4_1 || T == DType::Q8_0);
  constexpr size_t kBytes = T == DType::Q4_0   ? sizeof(BlockQ4_0)
                            : T == DType::Q4_1 ? sizeof(BlockQ4_1)
                                               : sizeof(BlockQ8_0);
  constexpr size_t kQs = T == DType::Q4_1 ? 4 : 2;  // offset of the values in a block
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float summs = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = wrow + static_cast<size_t>(b) * kBytes;
    const int8_t* ab = a.qs + b * kQK;
    int w[kQK];
    for (int i = 0; i < 16; ++i) {
      if constexpr (T == DType::Q8_0) {
        w[i] = static_cast<int8_t>(blk[kQs + i]);
        w[i + 16] = static_cast<int8_t>(blk[kQs + 16 + i]);
      } else {
        const int off = T == DType::Q4_0 ? 8 : 0;
        w[i] = (blk[kQs + i] & 0x0F) - off;
        w[i + 16] = (blk[kQs + i] >> 4) - off;
      }
    }
    uint16_t h[2];
    __builtin_memcpy(h, blk, T == DType::Q4_1 ? 4 : 2);
    const float dd = h2f(h[0]) * a.d[b];
    for (int k = 0; k < 8; ++k) {
      int sum = 0;
      for (int i = 4 * k; i < 4 * k + 4; ++i) sum += w[i] * ab[i];
      lanes[k] = __builtin_fmaf(dd, static_cast<float>(sum), lanes[k]);
    }
    if constexpr (T == DType::Q4_1) summs += h2f(h[1]) * a.s[b];
  }
  const float r = hsum8_reference(lanes);
  return T == DType::Q4_1 ? r + summs : r;
}

// An activation block's scale (and sum term) as llama.cpp keeps them: its
// q8_0 / q8_1 blocks store d = amax / 127 in fp16, and q8_1 (the activations
// of Q4_1 weights) also s = d * sum(q) in fp16, computed from the unrounded d.
// Rounding the same way is part of matching llama.cpp's logits bit for bit
// (tools/ref_llamacpp.py logits); the AVX-512 variant's Q4_0 algebra uses
// s = d * sum(q) of the rounded d. A value beyond the fp16 range
// (|x| > 8.3e6) keeps its f32 value instead of becoming inf.
inline float round_act_scale(float v) {
  const float r = h2f(f2h(v));
  return __builtin_isinf(r) ? v : r;
}
inline void act_block_scales(DType type, float amax, int sum, float* d_out, float* s_out) {
  const float d32 = amax / 127.f;
  const float d = round_act_scale(d32);
  *d_out = d;
  *s_out = type == DType::Q4_1 ? round_act_scale(d32 * static_cast<float>(sum)) : d * static_cast<float>(sum);
}

// Scalar quantization of one block of 32 floats (Q8_0-style, symmetric,
// round to nearest even), scales as act_block_scales. Shared reference for
// all variants' semantics.
inline void quantize_block_q8_scalar(DType type, const float* x, int8_t* q, float* d_out, float* s_out) {
  float amax = 0.f;
  for (int i = 0; i < kQK; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    amax = a > amax ? a : amax;
  }
  const float id = amax != 0.f ? 127.f / amax : 0.f;
  int sum = 0;
  for (int i = 0; i < kQK; ++i) {
    float v_f = __builtin_nearbyintf(x[i] * id);
    v_f = __builtin_fmaxf(-127.f, __builtin_fminf(127.f, v_f));  // also maps NaN (no UB)
    const int v = static_cast<int>(v_f);
    q[i] = static_cast<int8_t>(v);
    sum += v;
  }
  act_block_scales(type, amax, sum, d_out, s_out);
}

}  // namespace
}  // namespace ember::cpu::detail
