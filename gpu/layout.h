// Device data layouts and the per-element / per-block arithmetic of the CUDA
// kernels, written once for host and device. The kernels (*.cu) call these
// functions; tests/unit/backend/gpu_layout_test.cpp runs the very same code on
// the host against the reference dequantizers (core/tensor/types.cpp) and the
// CPU matmul semantics, so the index math and the block formulas are checked
// on machines without a GPU. No CUDA header is needed to include this file.
//
// Weight layouts on the device (WeightDesc: rows N, cols K):
//  * Q4_0 / Q4_1 / Q8_0 ("split blocks"): a GGUF block is a header (the f16
//    scale d; for Q4_1 also the f16 min m) followed by the quants. On the
//    device the quants of all blocks are one array and the headers another,
//    both in the original block order (row-major, block b of row n is block
//    n * nb + b, nb = K / 32):
//        qs[N * nb][QB]   QB = 16 (Q4: nibble j = element j (low) / 16 + j (high)), 32 (Q8)
//        sc[N * nb]       uint16 d (Q4_0, Q8_0) or uint32 d | m << 16 (Q4_1)
//    so a lane loads one block's quants with one 16-byte load (two for Q8_0)
//    and a warp reads 512 contiguous bytes: no 18-/20-/34-byte strides.
//    The bits are GGUF's, only split: nothing is re-quantized.
//  * Q4_K / Q5_K / Q6_K (K-quants, super-blocks of 256 elements): block gb of
//    the weight (row n, super-block i: gb = n * (K / 256) + i) is
//        Q4_K, Q5_K: qs[gb][144 | 176] = the GGUF block verbatim (d, dmin,
//                    scales[12], [qh[32],] qs[128]); no header array
//        Q6_K:       qs[gb][208] = ql[128], qh[64], scales[16]; sc[gb] = uint16 d
//    Every field a lane loads with a 16-byte load (Q4_K/Q5_K: d..scales,
//    qh halves, 16-byte pieces of qs; Q6_K: pieces of ql and qh) is at a
//    multiple of 16 bytes (144, 176, 208 are multiples of 16; GGUF's Q6_K
//    block is 210 bytes, hence its d moves to the header array). Same bits.
//  * F16 / BF16 / F32: row-major with the row stride rounded up to a multiple
//    of 8 elements (zero padding), so 16-byte loads are always aligned.
//
// Activations of the quantized GEMV (as the CPU decode path, see
// cpu/matmul_internal.h quantize_block_q8_scalar): per row, int8 xq[K] and per
// block of 32 an ActScale {d, s}: x ~= d * q, s ~= d * sum(q) (act_block_scale).
// K-quant weights: the CPU's Q8_K (quantize_row_q8k): int8 xq[K] and per
// super-block of 256 a KActBlock {d (f32), bsums[16]} (x ~= d * q, bsums[g]
// = sum of the q of elements 16g..16g+15), in the same buffer as the ActScales.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#if !defined(__CUDACC__)
#include <type_traits>
#include <vector>
#endif

#include "core/tensor/types.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define EMBER_HD __host__ __device__ __forceinline__
#else
#define EMBER_HD inline
#endif

namespace ember::gpu {

inline constexpr int kQK = 32;  // elements per quant block
inline constexpr int kWarp = 32;
inline constexpr int kGemvWarps = 4;  // warps (= output rows) per GEMV thread block
inline constexpr int kGemvMaxNR = 8;  // activation rows per GEMV pass

struct alignas(16) U32x4 {
  uint32_t x, y, z, w;
};
struct alignas(16) F32x4 {
  float x, y, z, w;
};
struct alignas(8) ActScale {
  float d;  // block scale
  float s;  // d * sum(q)
};
// One Q8_K activation super-block's scale and group sums (the quants are in
// xq as for the other types).
struct KActBlock {
  float d;            // x ~= d * q (f32, negative when the largest |x| is positive: llama.cpp's Q8_K)
  int16_t bsums[16];  // sum of the q of elements 16g..16g+15
};
static_assert(sizeof(KActBlock) == 36, "packed f32 + 16 x int16");

// ---------------------------------------------------------------- types

// Q5_0 / Q5_1 are expanded at upload to one int8 per element (Q5_0: q - 16,
// Q5_1: q) and then computed as Q8_0 / Q4_1 are (a block costs 34 / 36 bytes
// on the device instead of 22 / 24: simple, exact, not memory-optimal).
// K-quants keep their GGUF bits (see the layouts above) and have their own
// lane code (kquant_gemv_lane).
EMBER_HD bool is_kquant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
EMBER_HD bool is_quant(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0 || t == DType::Q5_0 || t == DType::Q5_1 ||
         is_kquant(t);
}
// Header d, m (32-element blocks only; K-quants' mins are per sub-block); q8_1 s.
EMBER_HD bool has_min(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }
EMBER_HD bool int8_quants(DType t) { return t == DType::Q8_0 || t == DType::Q5_0 || t == DType::Q5_1; }
EMBER_HD bool is_float(DType t) { return t == DType::F16 || t == DType::BF16 || t == DType::F32; }
// Elements per weight block (32, or 256 for K-quants).
EMBER_HD int block_elems(DType t) { return is_kquant(t) ? kQK_K : kQK; }
// Bytes of quants per block on the device.
EMBER_HD int quant_qs_bytes(DType t) {
  return t == DType::Q4_K ? 144 : t == DType::Q5_K ? 176 : t == DType::Q6_K ? 208 : int8_quants(t) ? 32 : 16;
}
// Bytes of header (scale, min) per block on the device (Q4_K / Q5_K: none,
// their d and dmin stay in the block).
EMBER_HD int quant_header_bytes(DType t) { return t == DType::Q4_K || t == DType::Q5_K ? 0 : has_min(t) ? 4 : 2; }
EMBER_HD int gguf_block_bytes(DType t) {
  return t == DType::Q5_0   ? 22
         : t == DType::Q5_1 ? 24
         : t == DType::Q4_K ? 144
         : t == DType::Q5_K ? 176
         : t == DType::Q6_K ? 210
                            : quant_header_bytes(t) + quant_qs_bytes(t);
}
// Which activation quantization a quant weight reads (a quantized input is
// shared only between weights of the same kind): 0 q8_0 scales, 1 q8_1
// (Q4_1/Q5_1: fp16 s), 2 Q8_K (K-quants).
EMBER_HD int act_kind(DType t) { return is_kquant(t) ? 2 : has_min(t) ? 1 : 0; }
// Bytes of the activation scales of M rows of K (ActScale per 32 or
// KActBlock per 256 elements).
EMBER_HD size_t act_scale_bytes(DType t, int64_t M, int64_t K) {
  return is_kquant(t) ? static_cast<size_t>(M) * static_cast<size_t>(K / kQK_K) * sizeof(KActBlock)
                      : static_cast<size_t>(M) * static_cast<size_t>(K / kQK) * sizeof(ActScale);
}
EMBER_HD int float_elem_bytes(DType t) { return t == DType::F32 ? 4 : 2; }
EMBER_HD int64_t float_row_stride(int64_t K) { return (K + 7) / 8 * 8; }

// ---------------------------------------------------------------- scalars

EMBER_HD float f16_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return fp16_to_fp32(h);
#endif
}
EMBER_HD float bf16_bits_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
#if defined(__CUDA_ARCH__)
  f = __uint_as_float(u);
#else
  __builtin_memcpy(&f, &u, 4);
#endif
  return f;
}
// Exactly rounded multiply / fused multiply-add: the kernels spell every
// accumulation step so that the compiler cannot contract or reorder it; a
// row's result then depends only on K (never on M or the launch shape).
EMBER_HD float fmul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;  // no contraction into a neighbouring add
  return r;
#endif
}
EMBER_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
EMBER_HD float fadd_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}

// An activation block's scale and sum term exactly as the CPU keeps them
// (cpu/matmul_internal.h act_block_scales: llama.cpp's fp16 q8_0/q8_1 scales;
// Q4_1's s is the fp16 of the unrounded d times sum(q); beyond fp16 range the
// f32 value stays).
EMBER_HD float round_act_scale(float v) {
#if defined(__CUDA_ARCH__)
  const float r = __half2float(__float2half_rn(v));
#else
  const float r = fp16_to_fp32(fp32_to_fp16(v));
#endif
  return std::isinf(r) ? v : r;
}
EMBER_HD ActScale act_block_scale(DType t, float amax, int sum) {
  const float d32 = amax / 127.0f;
  const float d = round_act_scale(d32);
  const float s =
      has_min(t) ? round_act_scale(fmul_rn(d32, static_cast<float>(sum))) : fmul_rn(d, static_cast<float>(sum));
  return ActScale{d, s};
}

// Signed 4 x int8 dot product plus c (CUDA __dp4a).
EMBER_HD int dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i) {
    const int8_t x = static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i));
    const int8_t y = static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
    c += static_cast<int>(x) * static_cast<int>(y);
  }
  return c;
#endif
}

// ---------------------------------------------------------------- blocks

// Splits one GGUF block (src: any alignment) into its device quants and header.
EMBER_HD void split_block(DType t, const uint8_t* src, uint8_t* qs_dst, uint8_t* header_dst) {
  const int hb = quant_header_bytes(t), qb = quant_qs_bytes(t);
  if (is_kquant(t)) {  // Q4_K, Q5_K: the block as is; Q6_K: ql, qh, scales | d
    for (int i = 0; i < qb; ++i) qs_dst[i] = src[i];
    for (int i = 0; i < hb; ++i) header_dst[i] = src[qb + i];
    return;
  }
  for (int i = 0; i < hb; ++i) header_dst[i] = src[i];
  if (t == DType::Q5_0 || t == DType::Q5_1) {  // d [, m], qh[4], qs[16] -> 32 int8 values
    const uint8_t* qh = src + hb;
    const uint8_t* q4 = src + hb + 4;
    const int off = t == DType::Q5_0 ? 16 : 0;
    for (int j = 0; j < 16; ++j) {
      const int h0 = (qh[j / 8] >> (j % 8)) & 1, h1 = (qh[2 + j / 8] >> (j % 8)) & 1;
      qs_dst[j] = static_cast<uint8_t>(static_cast<int8_t>(((q4[j] & 0x0F) | (h0 << 4)) - off));
      qs_dst[j + 16] = static_cast<uint8_t>(static_cast<int8_t>(((q4[j] >> 4) | (h1 << 4)) - off));
    }
    return;
  }
  for (int i = 0; i < qb; ++i) qs_dst[i] = src[hb + i];
}

// The header of block gb (a global block index n * nb + b); 0 for Q4_K / Q5_K
// (no header array).
EMBER_HD uint32_t load_header(DType t, const uint8_t* sc, int64_t gb) {
  if (t == DType::Q4_K || t == DType::Q5_K) return 0;
  if (has_min(t)) return reinterpret_cast<const uint32_t*>(sc)[gb];
  return reinterpret_cast<const uint16_t*>(sc)[gb];
}

// Element j (0..31) of a device block: quants qs (QB bytes), header hdr.
EMBER_HD float dequant_elem(DType t, const uint8_t* qs, uint32_t hdr, int j) {
  const float d = f16_to_f32(static_cast<uint16_t>(hdr & 0xFFFFu));
  if (t == DType::Q8_0 || t == DType::Q5_0) return static_cast<float>(static_cast<int8_t>(qs[j])) * d;
  if (t == DType::Q5_1)
    return fma_rn(static_cast<float>(static_cast<int8_t>(qs[j])), d, f16_to_f32(static_cast<uint16_t>(hdr >> 16)));
  const uint8_t byte = qs[j & 15];
  const int q = j < 16 ? (byte & 0x0F) : (byte >> 4);
  if (t == DType::Q4_0) return static_cast<float>(q - 8) * d;
  const float m = f16_to_f32(static_cast<uint16_t>(hdr >> 16));
  // Q4_1, as dequantize_row_q4_1 compiled with FMA contraction (the library's
  // baseline flags): one fused multiply-add on host and device alike.
  return fma_rn(static_cast<float>(q), d, m);
}

// ---------------------------------------------------------------- K-quant blocks

// Byte k (0..3) of a little-endian word.
EMBER_HD int byte_of(uint32_t w, int k) { return static_cast<int>((w >> (8 * k)) & 0xFFu); }

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block, as
// kquant_scale_min / ggml's get_scale_min_k4, from the three words of
// scales[12]: s0 = scales[0..3], s1 = scales[4..7], s2 = scales[8..11].
//   j < 4:  sc = scales[j] & 63,                                  m = scales[j + 4] & 63
//   j >= 4: sc = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4, m = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4
EMBER_HD void kq_scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2, int* sc, int* m) {
  const int k = j & 3;
  const int a = byte_of(s0, k), b = byte_of(s1, k), c = byte_of(s2, k);  // scales[k], [k + 4], [k + 8]
  if (j < 4) {
    *sc = a & 63;
    *m = b & 63;
  } else {
    *sc = (c & 0xF) | ((a >> 6) << 4);
    *m = (c >> 4) | ((b >> 6) << 4);
  }
}
// A little-endian word from any alignment.
EMBER_HD uint32_t load_u32_bytes(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// Element e (0..255) of a K-quant device block (blk: its quants, hdr: its
// header, only Q6_K has one), as the reference dequantizers
// (core/tensor/types.cpp):
//   Q4_K / Q5_K: (d * sc) * q - dmin * m     sub-block e / 32; qs[32 * (e / 64) + e % 32],
//                                            low nibble for (e / 32) even, high for odd;
//                                            Q5_K: 5th bit = bit e / 32 of qh[e % 32]
//   Q6_K:        (d * sc[e / 16]) * (q - 32) half h = e / 128, r = e % 128, l = r % 32, quarter c = r / 32:
//                                            ql[64 h + 32 (c & 1) + l], low nibble for c < 2, high otherwise;
//                                            high 2 bits = bits 2c, 2c+1 of qh[32 h + l]
// Every product is exact in f32 (at most 11 + 8 + 6 significant bits), so the
// value does not depend on the order or on contraction into FMAs.
EMBER_HD float kquant_elem(DType t, const uint8_t* blk, uint32_t hdr, int e) {
  if (t == DType::Q6_K) {
    const int h = e >> 7, r = e & 127, l = r & 31, c = r >> 5;
    const int ql = blk[64 * h + 32 * (c & 1) + l];
    const int qh = blk[128 + 32 * h + l];
    const int q = ((c < 2 ? ql & 0xF : ql >> 4) | (((qh >> (2 * c)) & 3) << 4)) - 32;
    const float d = f16_to_f32(static_cast<uint16_t>(hdr & 0xFFFFu));
    const int sc = static_cast<int8_t>(blk[192 + (e >> 4)]);
    return fmul_rn(fmul_rn(d, static_cast<float>(sc)), static_cast<float>(q));
  }
  const uint32_t w0 = load_u32_bytes(blk);
  const float d = f16_to_f32(static_cast<uint16_t>(w0 & 0xFFFFu));
  const float dmin = f16_to_f32(static_cast<uint16_t>(w0 >> 16));
  const int sub = e >> 5, l = e & 31;
  int sc, m;
  kq_scale_min(sub, load_u32_bytes(blk + 4), load_u32_bytes(blk + 8), load_u32_bytes(blk + 12), &sc, &m);
  const int qs_off = t == DType::Q5_K ? 48 : 16;
  const int byte = blk[qs_off + 32 * (sub >> 1) + l];
  int q = (sub & 1) ? byte >> 4 : byte & 0xF;
  if (t == DType::Q5_K) q |= ((blk[16 + l] >> sub) & 1) << 4;
  const float d1 = fmul_rn(d, static_cast<float>(sc)), m1 = fmul_rn(dmin, static_cast<float>(m));
  return fadd_rn(fmul_rn(d1, static_cast<float>(q)), -m1);
}

// Element k of row n of a quant-type device weight (K columns).
EMBER_HD float quant_weight_elem(DType t, const uint8_t* qs, const uint8_t* sc, int64_t K, int64_t n, int64_t k) {
  const int be = block_elems(t);
  const int64_t gb = n * (K / be) + k / be;
  const uint8_t* blk = qs + gb * quant_qs_bytes(t);
  const uint32_t hdr = load_header(t, sc, gb);
  if (is_kquant(t)) return kquant_elem(t, blk, hdr, static_cast<int>(k % be));
  return dequant_elem(t, blk, hdr, static_cast<int>(k % be));
}

// Element k of row n of a float-type device weight.
EMBER_HD float float_weight_elem(DType t, const void* data, int64_t stride, int64_t n, int64_t k) {
  const int64_t i = n * stride + k;
  if (t == DType::F32) return static_cast<const float*>(data)[i];
  const uint16_t h = static_cast<const uint16_t*>(data)[i];
  return t == DType::F16 ? f16_to_f32(h) : bf16_bits_to_f32(h);
}

// Integer dot of one device weight block with one int8 activation block
// (a: the 32 activation bytes as 8 ints).
EMBER_HD int block_sumi(DType t, const U32x4* wq, const int* a) {
  int sumi = 0;
  if (int8_quants(t)) {
    const U32x4 w0 = wq[0], w1 = wq[1];
    sumi = dp4a(static_cast<int>(w0.x), a[0], sumi);
    sumi = dp4a(static_cast<int>(w0.y), a[1], sumi);
    sumi = dp4a(static_cast<int>(w0.z), a[2], sumi);
    sumi = dp4a(static_cast<int>(w0.w), a[3], sumi);
    sumi = dp4a(static_cast<int>(w1.x), a[4], sumi);
    sumi = dp4a(static_cast<int>(w1.y), a[5], sumi);
    sumi = dp4a(static_cast<int>(w1.z), a[6], sumi);
    sumi = dp4a(static_cast<int>(w1.w), a[7], sumi);
    return sumi;
  }
  // Q4: byte j of the quants holds element j (low nibble) and 16 + j (high).
  // Int i covers bytes 4i..4i+3: low nibbles = elements 4i..4i+3 (activation
  // int i), high nibbles = elements 16+4i.. (activation int 4+i).
  const U32x4 w = wq[0];
  const uint32_t wi[4] = {w.x, w.y, w.z, w.w};
  for (int i = 0; i < 4; ++i) {
    sumi = dp4a(static_cast<int>(wi[i] & 0x0F0F0F0Fu), a[i], sumi);
    sumi = dp4a(static_cast<int>((wi[i] >> 4) & 0x0F0F0F0Fu), a[4 + i], sumi);
  }
  return sumi;
}

// acc + (this block's contribution), with the CPU's formulas
// (cpu/matmul_scalar.cpp block_dot):
//   Q4_0: dw * (dx * sumi - 8 * sx)      sum((q - 8) * a)
//   Q4_1: dw * dx * sumi + mw * sx
//   Q8_0: dw * dx * sumi
EMBER_HD float block_accumulate(DType t, int sumi, uint32_t hdr, ActScale xs, float acc) {
  const float dw = f16_to_f32(static_cast<uint16_t>(hdr & 0xFFFFu));
  const float t0 = fmul_rn(xs.d, static_cast<float>(sumi));
  if (t == DType::Q4_0) return fma_rn(dw, fma_rn(-8.0f, xs.s, t0), acc);
  if (has_min(t)) {  // Q4_1, Q5_1
    const float mw = f16_to_f32(static_cast<uint16_t>(hdr >> 16));
    return fma_rn(mw, xs.s, fma_rn(dw, t0, acc));
  }
  return fma_rn(dw, t0, acc);
}

// ---------------------------------------------------------------- GEMV lanes
//
// One warp computes one output row n for up to NR activation rows. Lane l
// handles the blocks (quant) or 8-element chunks (float) l, l + 32, l + 64, ...
// in increasing order, then the warp sums the 32 partials with the butterfly
// xor 16, 8, 4, 2, 1. The order of every floating-point operation therefore
// depends on K only: a row gives the same bits whatever M and NR are, which
// is what Backend::matmul's rows_are_decodes asks for.

struct QuantGemvArgs {
  DType type;
  int64_t K;                      // multiple of 32
  const uint8_t* qs;              // device quants, row 0
  const uint8_t* sc;              // device headers, row 0
  const int8_t* xq;               // [M][K]
  const ActScale* xs;             // [M][K / 32] (32-element types)
  const KActBlock* xk = nullptr;  // [M][K / 256] (K-quants)
};

template <int NR>
EMBER_HD void quant_gemv_lane(const QuantGemvArgs& g, int64_t n, int64_t m0, int m_valid, int lane, float* acc) {
  const int64_t nb = g.K / kQK;
  const int qb = quant_qs_bytes(g.type);
  for (int j = 0; j < NR; ++j) acc[j] = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll 4
#endif
  for (int64_t b = lane; b < nb; b += kWarp) {
    const int64_t gb = n * nb + b;
    const U32x4* wq = reinterpret_cast<const U32x4*>(g.qs + gb * qb);
    const uint32_t hdr = load_header(g.type, g.sc, gb);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < NR; ++j) {
      if (j < m_valid) {
        const int64_t m = m0 + j;
        const U32x4* ap = reinterpret_cast<const U32x4*>(g.xq + m * g.K + b * kQK);
        const U32x4 a0 = ap[0], a1 = ap[1];
        const int a[8] = {static_cast<int>(a0.x), static_cast<int>(a0.y), static_cast<int>(a0.z),
                          static_cast<int>(a0.w), static_cast<int>(a1.x), static_cast<int>(a1.y),
                          static_cast<int>(a1.z), static_cast<int>(a1.w)};
        const int sumi = block_sumi(g.type, wq, a);
        acc[j] = block_accumulate(g.type, sumi, hdr, g.xs[m * nb + b], acc[j]);
      }
    }
  }
}

// ---------------------------------------------------------------- K-quant GEMV lanes
//
// A super-block of 256 is 8 units of 32 elements, one per lane: lane l takes
// unit u = l % 8 of the super-blocks l / 8, l / 8 + 4, l / 8 + 8, ... (in
// increasing order), so 8 lanes read one block's quants with 8 contiguous
// 16-byte loads. A unit is two runs of 16 elements, e0..e0+15 and
// e1..e1+15, from one 16-byte piece of the low-bit quants:
//   Q4_K / Q5_K: j = u / 2, s = u % 2: qs bytes 32j + 16s ..+16 (= 16u):
//                low nibbles = elements e0 = 64j + 16s + i (sub-block 2j),
//                high nibbles = e1 = e0 + 32 (sub-block 2j + 1);
//                Q5_K's 5th bits: bits 2j / 2j + 1 of qh bytes 16s ..+16.
//   Q6_K:        h = u / 4, r = (u / 2) % 2, s = u % 2: ql bytes
//                64h + 32r + 16s ..+16 (= 16u): low nibbles = e0 = 128h + 32r
//                + 16s + i, high nibbles = e1 = e0 + 64; the high 2 bits:
//                bits 2r, 2r+1 (e0) and 4+2r, 5+2r (e1) of qh bytes 32h + 16s ..+16;
//                scales sc[e0 / 16], sc[e1 / 16].
// The unit's integer dot with the Q8_K activations (exact, as the CPU's):
//   s0 = sum q * a over the e0 run, s1 over the e1 run (4 __dp4a each)
//   Q4_K / Q5_K: sumi = sc0 * s0 + sc1 * s1, mins = m0 * bsums[e0 / 16] + m1 * bsums[e1 / 16]
//                acc = fma(-(dx * dmin), mins, fma(dx * d, sumi, acc))
//   Q6_K:        sumi = sc0 * (s0 - 32 * bsums[e0 / 16]) + sc1 * (s1 - 32 * bsums[e1 / 16])
//                acc = fma(dx * d, sumi, acc)
// |sumi| < 2^24 and |mins| < 2^18, so the int -> float conversions are exact;
// the CPU (kquant_dot_reference) forms the same products of integers and
// scales, summed in another order (different f32 rounding only).

struct KUnit {
  uint32_t lo[4], hi[4];  // the 16 + 16 quant values (0..63), one per byte, runs e0 and e1
  int sc0, sc1;           // the runs' scales (Q6_K: signed)
  int m0, m1;             // the runs' mins (Q4_K / Q5_K)
  float d, dmin;
  int g0, g1;  // the runs' groups of 16 (bsums index): e0 / 16, e1 / 16
  int e0, e1;
};

// Unit u of the device block blk (16-byte aligned) of type t; hdr: its header.
EMBER_HD KUnit kquant_load_unit(DType t, const uint8_t* blk, uint32_t hdr, int u) {
  KUnit w;
  if (t == DType::Q6_K) {
    const int h = u >> 2, r = (u >> 1) & 1, s = u & 1;
    const U32x4 ql = *reinterpret_cast<const U32x4*>(blk + 16 * u);
    const U32x4 qh = *reinterpret_cast<const U32x4*>(blk + 128 + 32 * h + 16 * s);
    const uint32_t l4[4] = {ql.x, ql.y, ql.z, ql.w}, h4[4] = {qh.x, qh.y, qh.z, qh.w};
    for (int k = 0; k < 4; ++k) {
      w.lo[k] = (l4[k] & 0x0F0F0F0Fu) | (((h4[k] >> (2 * r)) & 0x03030303u) << 4);
      w.hi[k] = ((l4[k] >> 4) & 0x0F0F0F0Fu) | (((h4[k] >> (4 + 2 * r)) & 0x03030303u) << 4);
    }
    w.e0 = 128 * h + 32 * r + 16 * s;
    w.e1 = w.e0 + 64;
    w.g0 = w.e0 >> 4;
    w.g1 = w.e1 >> 4;
    w.sc0 = static_cast<int8_t>(blk[192 + w.g0]);
    w.sc1 = static_cast<int8_t>(blk[192 + w.g1]);
    w.m0 = w.m1 = 0;
    w.d = f16_to_f32(static_cast<uint16_t>(hdr & 0xFFFFu));
    w.dmin = 0.0f;
    return w;
  }
  // Q4_K / Q5_K: d, dmin, scales[12] in the first 16 bytes.
  const U32x4 head = *reinterpret_cast<const U32x4*>(blk);
  const int j = u >> 1, s = u & 1;
  w.d = f16_to_f32(static_cast<uint16_t>(head.x & 0xFFFFu));
  w.dmin = f16_to_f32(static_cast<uint16_t>(head.x >> 16));
  kq_scale_min(2 * j, head.y, head.z, head.w, &w.sc0, &w.m0);
  kq_scale_min(2 * j + 1, head.y, head.z, head.w, &w.sc1, &w.m1);
  const U32x4 q = *reinterpret_cast<const U32x4*>(blk + (t == DType::Q5_K ? 48 : 16) + 16 * u);
  const uint32_t q4[4] = {q.x, q.y, q.z, q.w};
  for (int k = 0; k < 4; ++k) {
    w.lo[k] = q4[k] & 0x0F0F0F0Fu;
    w.hi[k] = (q4[k] >> 4) & 0x0F0F0F0Fu;
  }
  if (t == DType::Q5_K) {
    const U32x4 qh = *reinterpret_cast<const U32x4*>(blk + 16 + 16 * s);
    const uint32_t h4[4] = {qh.x, qh.y, qh.z, qh.w};
    for (int k = 0; k < 4; ++k) {
      w.lo[k] |= ((h4[k] >> (2 * j)) & 0x01010101u) << 4;
      w.hi[k] |= ((h4[k] >> (2 * j + 1)) & 0x01010101u) << 4;
    }
  }
  w.e0 = 64 * j + 16 * s;
  w.e1 = w.e0 + 32;
  w.g0 = w.e0 >> 4;
  w.g1 = w.e1 >> 4;
  return w;
}

// acc + the unit's contribution against one activation row's super-block
// (a: its 256 quants, 16-byte aligned; xb: its scale and sums).
EMBER_HD float kquant_unit_accumulate(DType t, const KUnit& w, const int8_t* a, const KActBlock& xb, float acc) {
  const U32x4 a0 = *reinterpret_cast<const U32x4*>(a + w.e0);
  const U32x4 a1 = *reinterpret_cast<const U32x4*>(a + w.e1);
  int s0 = 0, s1 = 0;
  s0 = dp4a(static_cast<int>(w.lo[0]), static_cast<int>(a0.x), s0);
  s0 = dp4a(static_cast<int>(w.lo[1]), static_cast<int>(a0.y), s0);
  s0 = dp4a(static_cast<int>(w.lo[2]), static_cast<int>(a0.z), s0);
  s0 = dp4a(static_cast<int>(w.lo[3]), static_cast<int>(a0.w), s0);
  s1 = dp4a(static_cast<int>(w.hi[0]), static_cast<int>(a1.x), s1);
  s1 = dp4a(static_cast<int>(w.hi[1]), static_cast<int>(a1.y), s1);
  s1 = dp4a(static_cast<int>(w.hi[2]), static_cast<int>(a1.z), s1);
  s1 = dp4a(static_cast<int>(w.hi[3]), static_cast<int>(a1.w), s1);
  const int b0 = xb.bsums[w.g0], b1 = xb.bsums[w.g1];
  const float dd = fmul_rn(xb.d, w.d);
  if (t == DType::Q6_K) {
    const int sumi = w.sc0 * (s0 - 32 * b0) + w.sc1 * (s1 - 32 * b1);
    return fma_rn(dd, static_cast<float>(sumi), acc);
  }
  const int sumi = w.sc0 * s0 + w.sc1 * s1;
  const int mins = w.m0 * b0 + w.m1 * b1;
  const float dm = fmul_rn(xb.d, w.dmin);
  return fma_rn(-dm, static_cast<float>(mins), fma_rn(dd, static_cast<float>(sumi), acc));
}

template <int NR>
EMBER_HD void kquant_gemv_lane(const QuantGemvArgs& g, int64_t n, int64_t m0, int m_valid, int lane, float* acc) {
  const int64_t nbk = g.K / kQK_K;
  const int qb = quant_qs_bytes(g.type);
  const int u = lane & 7;
  for (int j = 0; j < NR; ++j) acc[j] = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll 2
#endif
  for (int64_t i = lane >> 3; i < nbk; i += kWarp / 8) {
    const int64_t gb = n * nbk + i;
    const KUnit w = kquant_load_unit(g.type, g.qs + gb * qb, load_header(g.type, g.sc, gb), u);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < NR; ++j) {
      if (j < m_valid) {
        const int64_t m = m0 + j;
        acc[j] = kquant_unit_accumulate(g.type, w, g.xq + m * g.K + i * kQK_K, g.xk[m * nbk + i], acc[j]);
      }
    }
  }
}

struct FloatGemvArgs {
  DType type;  // F16, BF16, F32
  int64_t K;
  int64_t stride;  // weight row stride in elements (multiple of 8)
  const void* w;
  const float* x;  // [M][K]
  bool x_vec;      // x rows 16-byte aligned (K % 4 == 0 and x aligned)
};

// The 8 weights of chunk c of row n as floats.
EMBER_HD void load_weight_chunk(const FloatGemvArgs& g, int64_t n, int64_t c, float* w8) {
  if (g.type == DType::F32) {
    const F32x4* p = reinterpret_cast<const F32x4*>(static_cast<const float*>(g.w) + n * g.stride + c * 8);
    const F32x4 a = p[0], b = p[1];
    w8[0] = a.x;
    w8[1] = a.y;
    w8[2] = a.z;
    w8[3] = a.w;
    w8[4] = b.x;
    w8[5] = b.y;
    w8[6] = b.z;
    w8[7] = b.w;
    return;
  }
  const U32x4 v = *reinterpret_cast<const U32x4*>(static_cast<const uint16_t*>(g.w) + n * g.stride + c * 8);
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = static_cast<uint16_t>(u[i] & 0xFFFFu), hi = static_cast<uint16_t>(u[i] >> 16);
    if (g.type == DType::F16) {
      w8[2 * i] = f16_to_f32(lo);
      w8[2 * i + 1] = f16_to_f32(hi);
    } else {
      w8[2 * i] = bf16_bits_to_f32(lo);
      w8[2 * i + 1] = bf16_bits_to_f32(hi);
    }
  }
}

// The 8 activations of chunk c of row m (zeros past K).
EMBER_HD void load_x_chunk(const FloatGemvArgs& g, int64_t m, int64_t c, float* x8) {
  const float* xr = g.x + m * g.K;
  const int64_t k0 = c * 8;
  if (g.x_vec && k0 + 8 <= g.K) {
    const F32x4* p = reinterpret_cast<const F32x4*>(xr + k0);
    const F32x4 a = p[0], b = p[1];
    x8[0] = a.x;
    x8[1] = a.y;
    x8[2] = a.z;
    x8[3] = a.w;
    x8[4] = b.x;
    x8[5] = b.y;
    x8[6] = b.z;
    x8[7] = b.w;
    return;
  }
  for (int i = 0; i < 8; ++i) x8[i] = k0 + i < g.K ? xr[k0 + i] : 0.0f;
}

template <int NR>
EMBER_HD void float_gemv_lane(const FloatGemvArgs& g, int64_t n, int64_t m0, int m_valid, int lane, float* acc) {
  const int64_t chunks = (g.K + 7) / 8;
  for (int j = 0; j < NR; ++j) acc[j] = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll 4
#endif
  for (int64_t c = lane; c < chunks; c += kWarp) {
    float w8[8];
    load_weight_chunk(g, n, c, w8);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < NR; ++j) {
      if (j < m_valid) {
        float x8[8];
        load_x_chunk(g, m0 + j, c, x8);
        float a = acc[j];
        for (int i = 0; i < 8; ++i) a = fma_rn(w8[i], x8[i], a);
        acc[j] = a;
      }
    }
  }
}

// The host's picture of the warp butterfly: after the five xor steps every
// lane holds the same sum; lane 0's is stored. v: 32 partials, overwritten.
inline float host_warp_sum(float* v) {
  for (int off = 16; off > 0; off >>= 1) {
    float t[32];
    for (int l = 0; l < 32; ++l) t[l] = fadd_rn(v[l], v[l ^ off]);
    for (int l = 0; l < 32; ++l) v[l] = t[l];
  }
  return v[0];
}

// ---------------------------------------------------------------- activations

// Quantizes one block of 32 activations exactly as quantize_block_q8_scalar
// (cpu/matmul_internal.h): q = rint(x * 127 / amax) clamped to [-127, 127],
// scales from act_block_scale (they depend on the weight type). On the device
// a warp does one block (lane i element i); this is the host reference of the
// same arithmetic.
inline void quantize_block_host(DType t, const float* x, int8_t* q, ActScale* out) {
  float amax = 0.0f;
  for (int i = 0; i < kQK; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int i = 0; i < kQK; ++i) {
    float v = std::nearbyint(x[i] * id);
    v = std::fmax(-127.0f, std::fmin(127.0f, v));
    q[i] = static_cast<int8_t>(v);
    sum += static_cast<int>(v);
  }
  *out = act_block_scale(t, amax, sum);
}

// Quantizes one super-block of 256 activations to Q8_K exactly as the CPU's
// quantize_row_q8k (cpu/matmul_internal.h, llama.cpp's quantize_row_q8_K_ref):
// the first element of largest |x| gives mx, iscale = -127 / mx,
// q = rint(iscale * x) clamped to [-128, 127], d = 1 / iscale; an all-zero
// block (or one of NaNs) gets d = 0 and q = 0. On the device a warp does one
// super-block (lane l: elements 8l..8l+7); this is the host reference.
inline void quantize_kblock_host(const float* x, int8_t* q, KActBlock* out) {
  float mx = 0.0f, amax = 0.0f;
  for (int j = 0; j < kQK_K; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      mx = x[j];
    }
  }
  if (amax == 0.0f) {
    for (int j = 0; j < kQK_K; ++j) q[j] = 0;
    out->d = 0.0f;
    for (auto& b : out->bsums) b = 0;
    return;
  }
  const float iscale = -127.0f / mx;
  for (int j = 0; j < kQK_K; ++j) {
    float v = std::nearbyint(iscale * x[j]);
    v = std::fmax(-128.0f, std::fmin(127.0f, v));
    q[j] = static_cast<int8_t>(static_cast<int>(v));
  }
  for (int g = 0; g < kQK_K / 16; ++g) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += q[16 * g + i];
    out->bsums[g] = static_cast<int16_t>(sum);
  }
  out->d = 1.0f / iscale;
}

// The device's Q8_K quantization, split into the pieces a lane runs (one warp
// per super-block, lane l: elements 8l..8l+7), shared with the host test that
// runs them for 32 emulated lanes against quantize_kblock_host:
//  1. q8k_lane_max over the lane's 8 values in order (strict >: the first of
//     equal |x| wins, NaNs never do);
//  2. the warp butterfly (xor 16, 8, 4, 2, 1) of q8k_max_combine: the larger
//     |x|, on equal |x| the smaller index (a total order, so every lane ends
//     with the block's first largest element);
//  3. q8k_lane_quantize with that element's value (amax == 0: an all-zero
//     block); the lane's sum plus its neighbour's (xor 1) is bsums[l / 2].
EMBER_HD float fabs_f(float v) {
#if defined(__CUDA_ARCH__)
  return fabsf(v);
#else
  return std::fabs(v);
#endif
}
// Round half to even (the default rounding mode on the host), then clamp to
// [-128, 127] (a NaN gives 127: fmin returns the other operand).
EMBER_HD float round_clamp_q8k(float v) {
#if defined(__CUDA_ARCH__)
  return fmaxf(-128.0f, fminf(127.0f, rintf(v)));
#else
  return std::fmax(-128.0f, std::fmin(127.0f, std::nearbyint(v)));
#endif
}
struct Q8KMax {
  float amax;  // |x| of the candidate (0: none)
  float mx;    // its value
  int idx;     // its index in the super-block
};
EMBER_HD Q8KMax q8k_lane_max(const float* v, int lane) {
  Q8KMax r{0.0f, 0.0f, 0x7FFFFFFF};
  for (int i = 0; i < 8; ++i) {
    const float ax = fabs_f(v[i]);
    if (ax > r.amax) {
      r.amax = ax;
      r.mx = v[i];
      r.idx = lane * 8 + i;
    }
  }
  return r;
}
EMBER_HD Q8KMax q8k_max_combine(Q8KMax mine, Q8KMax other) {
  return (other.amax > mine.amax || (other.amax == mine.amax && other.idx < mine.idx)) ? other : mine;
}
// Quantizes the lane's 8 values (q[i], 4 per word, little-endian); returns
// their sum; *d = the block's scale. mx: the block's first largest element.
EMBER_HD int q8k_lane_quantize(const float* v, float amax, float mx, uint32_t* q, float* d) {
  q[0] = q[1] = 0u;
  *d = 0.0f;
  if (amax == 0.0f) return 0;
#if defined(__CUDA_ARCH__)
  const float iscale = __fdiv_rn(-127.0f, mx);
#else
  const float iscale = -127.0f / mx;
#endif
  int sum = 0;
  for (int i = 0; i < 8; ++i) {
    const int qi = static_cast<int>(round_clamp_q8k(fmul_rn(iscale, v[i])));
    sum += qi;
    q[i / 4] |= (static_cast<uint32_t>(qi) & 0xFFu) << (8 * (i % 4));
  }
#if defined(__CUDA_ARCH__)
  *d = __fdiv_rn(1.0f, iscale);
#else
  *d = 1.0f / iscale;
#endif
  return sum;
}

// ---------------------------------------------------------------- KV cache

// Element offset of (layer, K|V, block, kv head, slot) in the pool, laid out
// [layer][K|V][block][kv_head][slot][head_dim] f16 (as the CPU backend).
EMBER_HD int64_t kv_offset(int32_t layer, int kv, int64_t block, int32_t kv_head, int32_t slot, int32_t num_blocks,
                           int32_t num_kv_heads, int32_t block_size, int32_t head_dim) {
  const int64_t block_elems = static_cast<int64_t>(num_kv_heads) * block_size * head_dim;
  return (static_cast<int64_t>(layer) * 2 + kv) * block_elems * num_blocks + block * block_elems +
         (static_cast<int64_t>(kv_head) * block_size + slot) * head_dim;
}

// ---------------------------------------------------------------- attention work

inline constexpr int kAttnTile = 32;     // KV tokens per shared-memory tile
inline constexpr int kAttnMaxVecs = 16;  // query vectors (rows x group heads) per thread block
inline constexpr int kAttnMaxHeadDim = 256;

// Rows of one sequence handled together by one thread block (all query heads
// of one kv head for each row).
EMBER_HD int attn_rows_per_tile(int group) { return group >= kAttnMaxVecs ? 1 : kAttnMaxVecs / group; }

struct AttnTileDesc {
  int32_t row0;        // first batch row
  int32_t n_rows;      // rows in this tile
  int32_t bt_off;      // offset of the sequence's block table in the packed tables
  int32_t n_blocks;    // entries in that table
  int32_t hole_begin;  // the sequence's skipped cache slots [hole_begin, hole_end)
  int32_t hole_end;
  // A token-tree row (AttentionParams::tree_*; such a tile has one row):
  // index pos >= map_from reads slot tree_slots[map_off + pos - map_from].
  // map_from = INT32_MAX for ordinary tiles.
  int32_t map_from;
  int32_t map_off;
};
inline constexpr int kAttnTileInts = 8;
static_assert(sizeof(AttnTileDesc) == kAttnTileInts * sizeof(int32_t), "packed as int32s");

// Split-K plan for a call: KV tiles are bucketed to a power of two so that
// the launch shape (and a captured CUDA graph) only changes when a cache
// doubles.
struct AttnSplit {
  int32_t n_splits;
  int32_t tiles_per_split;
};
inline AttnSplit plan_attention_split(int64_t work_items, int32_t max_kv_len, int32_t sm_count) {
  int32_t tiles = (max_kv_len + kAttnTile - 1) / kAttnTile;
  int32_t bucket = 1;
  while (bucket < tiles) bucket <<= 1;
  const int64_t target = 2LL * (sm_count > 0 ? sm_count : 1);
  int64_t s = work_items > 0 ? (target + work_items - 1) / work_items : 1;
  const int32_t max_by_len = bucket >= 4 ? bucket / 2 : 1;  // at least 2 tiles (64 tokens) per split
  if (s > max_by_len) s = max_by_len;
  if (s > 32) s = 32;
  if (s < 1) s = 1;
  AttnSplit p;
  p.n_splits = static_cast<int32_t>(s);
  p.tiles_per_split = (bucket + p.n_splits - 1) / p.n_splits;
  return p;
}

// Batch-invariant plan: splits of a fixed kAttnInvariantSplitTiles tiles, so
// the partials of a row (and their merge order) depend on its own kv_len only.
// A row whose cache fits one split gives the same bits through the merge as
// without it (weights exp(0) = 1).
inline constexpr int32_t kAttnInvariantSplitTiles = 16;  // 512 cache slots
inline AttnSplit plan_attention_split_invariant(int32_t max_kv_len) {
  const int32_t tiles = (max_kv_len + kAttnTile - 1) / kAttnTile;
  AttnSplit p;
  p.tiles_per_split = kAttnInvariantSplitTiles;
  p.n_splits =
      tiles <= kAttnInvariantSplitTiles ? 1 : (tiles + kAttnInvariantSplitTiles - 1) / kAttnInvariantSplitTiles;
  return p;
}

// ---------------------------------------------------------------- host reference

#if !defined(__CUDACC__)
// Pass width of the GEMV launch for M rows (as gpu::gemv in matmul.cu).
inline int gemv_pass_rows(int64_t M) { return M == 1 ? 1 : M == 2 ? 2 : M <= 4 ? 4 : 8; }

template <int NR, class Lane>
void host_gemv_passes(int64_t N, int64_t M, float* y, Lane lane_fn) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t m0 = 0; m0 < M; m0 += NR) {
      const int m_valid = static_cast<int>(M - m0 < NR ? M - m0 : NR);
      float part[NR][kWarp];
      for (int lane = 0; lane < kWarp; ++lane) {
        float acc[NR];
        lane_fn(n, m0, m_valid, lane, acc);
        for (int j = 0; j < NR; ++j) part[j][lane] = acc[j];
      }
      for (int j = 0; j < m_valid; ++j) y[(m0 + j) * N + n] = host_warp_sum(part[j]);
    }
  }
}

// The CUDA backend's GEMV path (activation quantization included) computed
// on the host with the same operations in the same order: the device result
// must equal it bit for bit. w: GGUF layout (N rows of K elements of type).
inline void reference_gemv(DType type, const void* w, int64_t N, int64_t K, const float* x, int64_t M, float* y,
                           int force_nr = 0) {
  const int nr = force_nr ? force_nr : gemv_pass_rows(M);
  const auto* src = static_cast<const uint8_t*>(w);
  if (is_quant(type)) {
    const int be = block_elems(type);
    const int64_t nb = K / be, total = N * nb;
    const int qb = quant_qs_bytes(type), hb = quant_header_bytes(type);
    std::vector<U32x4> qs(static_cast<size_t>(total) * qb / 16 + 1);
    std::vector<uint32_t> sc(static_cast<size_t>(total) * hb / 4 + 1);
    for (int64_t b = 0; b < total; ++b) {
      split_block(type, src + b * gguf_block_bytes(type), reinterpret_cast<uint8_t*>(qs.data()) + b * qb,
                  reinterpret_cast<uint8_t*>(sc.data()) + b * hb);
    }
    std::vector<U32x4> xq(static_cast<size_t>(M * K) / 16 + 1);
    auto* xq8 = reinterpret_cast<int8_t*>(xq.data());
    std::vector<ActScale> xs;
    std::vector<KActBlock> xk;
    if (is_kquant(type)) {
      xk.resize(static_cast<size_t>(M * nb) + 1);
      for (int64_t i = 0; i < M * nb; ++i) quantize_kblock_host(x + i * kQK_K, xq8 + i * kQK_K, &xk[i]);
    } else {
      xs.resize(static_cast<size_t>(M * nb) + 1);
      for (int64_t i = 0; i < M * nb; ++i) quantize_block_host(type, x + i * kQK, xq8 + i * kQK, &xs[i]);
    }
    const QuantGemvArgs g{type,
                          K,
                          reinterpret_cast<const uint8_t*>(qs.data()),
                          reinterpret_cast<const uint8_t*>(sc.data()),
                          xq8,
                          xs.empty() ? nullptr : xs.data(),
                          xk.empty() ? nullptr : xk.data()};
    auto run = [&](auto nr_tag) {
      constexpr int NR = decltype(nr_tag)::value;
      host_gemv_passes<NR>(N, M, y, [&](int64_t n, int64_t m0, int mv, int lane, float* acc) {
        if (is_kquant(type))
          kquant_gemv_lane<NR>(g, n, m0, mv, lane, acc);
        else
          quant_gemv_lane<NR>(g, n, m0, mv, lane, acc);
      });
    };
    if (nr == 1)
      run(std::integral_constant<int, 1>{});
    else if (nr == 2)
      run(std::integral_constant<int, 2>{});
    else if (nr == 4)
      run(std::integral_constant<int, 4>{});
    else
      run(std::integral_constant<int, 8>{});
    return;
  }
  const int64_t stride = float_row_stride(K);
  const int es = float_elem_bytes(type);
  std::vector<U32x4> dev(static_cast<size_t>(N * stride * es) / 16 + 1, U32x4{0, 0, 0, 0});
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = src + n * K * es;
    uint8_t* drow = reinterpret_cast<uint8_t*>(dev.data()) + n * stride * es;
    for (int64_t i = 0; i < K * es; ++i) drow[i] = row[i];
  }
  // x rows are 16-byte aligned exactly when the device's would be.
  std::vector<F32x4> xa(static_cast<size_t>(M * K) / 4 + 1);
  float* xf = reinterpret_cast<float*>(xa.data());
  for (int64_t i = 0; i < M * K; ++i) xf[i] = x[i];
  const FloatGemvArgs g{type, K, stride, dev.data(), xf, K % 4 == 0};
  auto run = [&](auto nr_tag) {
    constexpr int NR = decltype(nr_tag)::value;
    host_gemv_passes<NR>(N, M, y, [&](int64_t n, int64_t m0, int mv, int lane, float* acc) {
      float_gemv_lane<NR>(g, n, m0, mv, lane, acc);
    });
  };
  if (nr == 1)
    run(std::integral_constant<int, 1>{});
  else if (nr == 2)
    run(std::integral_constant<int, 2>{});
  else if (nr == 4)
    run(std::integral_constant<int, 4>{});
  else
    run(std::integral_constant<int, 8>{});
}
#endif

}  // namespace ember::gpu
