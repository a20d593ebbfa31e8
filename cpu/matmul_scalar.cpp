// Portable reference variant ("scalar"): plain C++ loops with the same
// algorithm as the SIMD variants (8-bit activation blocks + integer dots for
// quantized weights in quant_dot_reference's order, bit-identical to AVX2;
// f32 accumulation for float weights).
#include <cstring>

#include "cpu/matmul_internal.h"

namespace ember::cpu::detail {
namespace {

size_t act_row_bytes(DType type, int64_t K) {
  return is_kquant(type) ? q8k_row_bytes(K) : is_quant(type) ? q8_natural_row_bytes(K) : 0;
}

void prepare_acts(DType type, const float* x, int64_t M, int64_t K, uint8_t* act) {
  if (is_kquant(type)) {
    const size_t rb = q8k_row_bytes(K);
    for (int64_t m = 0; m < M; ++m)
      quantize_row_q8k(x + m * K, K, reinterpret_cast<Q8KBlock*>(act + static_cast<size_t>(m) * rb));
    return;
  }
  if (!is_quant(type)) return;
  const size_t rb = q8_natural_row_bytes(K);
  const int64_t nb = K / kQK;
  for (int64_t m = 0; m < M; ++m) {
    uint8_t* base = act + static_cast<size_t>(m) * rb;
    int8_t* q = reinterpret_cast<int8_t*>(base);
    float* d = reinterpret_cast<float*>(base + K);
    float* s = d + nb;
    for (int64_t b = 0; b < nb; ++b) quantize_block_q8_scalar(type, x + m * K + b * kQK, q + b * kQK, d + b, s + b);
  }
}

template <DType T>
void quant_kernel(const DecodeCtx& c, int64_t n0, int64_t n1) {
  const int64_t nb = c.K / kQK;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = c.w + static_cast<size_t>(n) * c.w_row_bytes;
    for (int64_t m = 0; m < c.M; ++m) {
      const Q8Row a = q8_natural_row(c.act, c.act_row_bytes, c.K, m);
      c.y[m * c.ldy + n] = quant_dot_reference<T>(wr, a, nb);
    }
  }
}

template <DType T>
void kquant_kernel(const DecodeCtx& c, int64_t n0, int64_t n1) {
  const int64_t nbk = c.K / kQK_K;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = c.w + static_cast<size_t>(n) * c.w_row_bytes;
    for (int64_t m = 0; m < c.M; ++m)
      c.y[m * c.ldy + n] = kquant_dot_reference<T>(wr, q8k_row(c.act, c.act_row_bytes, m), nbk, c.korder);
  }
}

template <DType T>
void float_kernel(const DecodeCtx& c, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = c.w + static_cast<size_t>(n) * c.w_row_bytes;
    for (int64_t m = 0; m < c.M; ++m) {
      const float* xr = c.x + m * c.K;
      // 8 partial sums, like the SIMD lanes, to keep rounding error small.
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t k = 0;
      for (; k + 8 <= c.K; k += 8)
        for (int j = 0; j < 8; ++j) acc[j] += wval<T>(wr, k + j) * xr[k + j];
      for (; k < c.K; ++k) acc[k & 7] += wval<T>(wr, k) * xr[k];
      c.y[m * c.ldy + n] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
  }
}

DecodeKernel kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return quant_kernel<DType::Q4_0>;
    case DType::Q4_1: return quant_kernel<DType::Q4_1>;
    case DType::Q8_0: return quant_kernel<DType::Q8_0>;
    case DType::Q5_0: return quant_kernel<DType::Q5_0>;
    case DType::Q5_1: return quant_kernel<DType::Q5_1>;
    case DType::Q2_K: return kquant_kernel<DType::Q2_K>;
    case DType::Q3_K: return kquant_kernel<DType::Q3_K>;
    case DType::Q4_K: return kquant_kernel<DType::Q4_K>;
    case DType::Q5_K: return kquant_kernel<DType::Q5_K>;
    case DType::Q6_K: return kquant_kernel<DType::Q6_K>;
    case DType::F16: return float_kernel<DType::F16>;
    case DType::BF16: return float_kernel<DType::BF16>;
    case DType::F32: return float_kernel<DType::F32>;
    default: return nullptr;
  }
}

}  // namespace

const IsaImpl& scalar_impl() {
  static const IsaImpl impl{"scalar",           act_row_bytes,       prepare_acts,      kernel,
                            scalar_dequant_f32, scalar_dequant_bf16, scalar_f32_to_bf16};
  return impl;
}

}  // namespace ember::cpu::detail
