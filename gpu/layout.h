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
//  * F16 / BF16 / F32: row-major with the row stride rounded up to a multiple
//    of 8 elements (zero padding), so 16-byte loads are always aligned.
//
// Activations of the quantized GEMV (as the CPU decode path, see
// cpu/matmul_internal.h quantize_block_q8_scalar): per row, int8 xq[K] and per
// block of 32 an ActScale {d, s}: x ~= d * q, s ~= d * sum(q) (act_block_scale).
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

// ---------------------------------------------------------------- types

// Q5_0 / Q5_1 are expanded at upload to one int8 per element (Q5_0: q - 16,
// Q5_1: q) and then computed as Q8_0 / Q4_1 are (a block costs 34 / 36 bytes
// on the device instead of 22 / 24: simple, exact, not memory-optimal).
// K-quants have no CUDA kernels yet (the backend rejects them).
EMBER_HD bool is_quant(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0 || t == DType::Q5_0 || t == DType::Q5_1;
}
EMBER_HD bool has_min(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }  // header d, m; q8_1 s
EMBER_HD bool int8_quants(DType t) { return t == DType::Q8_0 || t == DType::Q5_0 || t == DType::Q5_1; }
EMBER_HD bool is_float(DType t) { return t == DType::F16 || t == DType::BF16 || t == DType::F32; }
// Bytes of quants per block on the device.
EMBER_HD int quant_qs_bytes(DType t) { return int8_quants(t) ? 32 : 16; }
// Bytes of header (scale, min) per block, in GGUF and on the device.
EMBER_HD int quant_header_bytes(DType t) { return has_min(t) ? 4 : 2; }
EMBER_HD int gguf_block_bytes(DType t) {
  return t == DType::Q5_0 ? 22 : t == DType::Q5_1 ? 24 : quant_header_bytes(t) + quant_qs_bytes(t);
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

// The header of block gb (a global block index n * nb + b).
EMBER_HD uint32_t load_header(DType t, const uint8_t* sc, int64_t gb) {
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
  int64_t K;           // multiple of 32
  const uint8_t* qs;   // device quants, row 0
  const uint8_t* sc;   // device headers, row 0
  const int8_t* xq;    // [M][K]
  const ActScale* xs;  // [M][K / 32]
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
    const int64_t nb = K / kQK, total = N * nb;
    const int qb = quant_qs_bytes(type), hb = quant_header_bytes(type);
    std::vector<U32x4> qs(static_cast<size_t>(total) * qb / 16 + 1);
    std::vector<uint32_t> sc(static_cast<size_t>(total) * hb / 4 + 1);
    for (int64_t b = 0; b < total; ++b) {
      split_block(type, src + b * gguf_block_bytes(type), reinterpret_cast<uint8_t*>(qs.data()) + b * qb,
                  reinterpret_cast<uint8_t*>(sc.data()) + b * hb);
    }
    std::vector<U32x4> xq(static_cast<size_t>(M * K) / 16 + 1);
    std::vector<ActScale> xs(static_cast<size_t>(M * nb) + 1);
    auto* xq8 = reinterpret_cast<int8_t*>(xq.data());
    for (int64_t i = 0; i < M * nb; ++i) quantize_block_host(type, x + i * kQK, xq8 + i * kQK, &xs[i]);
    const QuantGemvArgs g{
        type, K,        reinterpret_cast<const uint8_t*>(qs.data()), reinterpret_cast<const uint8_t*>(sc.data()),
        xq8,  xs.data()};
    auto run = [&](auto nr_tag) {
      constexpr int NR = decltype(nr_tag)::value;
      host_gemv_passes<NR>(N, M, y, [&](int64_t n, int64_t m0, int mv, int lane, float* acc) {
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
