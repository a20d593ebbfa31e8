// Weight preparation, activation quantization, the GEMV kernels (decode and
// small M) and the conversions that feed cuBLAS (prefill).
//
// GEMV: one warp per output row, kGemvWarps rows per thread block; the lane
// arithmetic is in layout.h (quant_gemv_lane / float_gemv_lane), shared with
// the host tests. Quant weights: 16-byte loads of a block's quants, int8
// activations, __dp4a (as llama.cpp's MMVQ and the CPU decode path). The grid
// enumerates (row tile, activation group) with the groups of one row tile
// adjacent, so when M > NR the weight tile is read from DRAM once and from L2
// for the other groups.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu/kernels.h"

namespace ember::gpu {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;

__device__ __forceinline__ float warp_sum_ordered(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// ------------------------------------------------------------------ weights

__global__ void split_blocks_kernel(DType type, const uint8_t* __restrict__ raw, int64_t n_blocks,
                                    uint8_t* __restrict__ qs, uint8_t* __restrict__ sc) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_blocks) return;
  const int qb = quant_qs_bytes(type), hb = quant_header_bytes(type);
  split_block(type, raw + i * gguf_block_bytes(type), qs + i * qb, sc + i * hb);
}

// K-quants: one thread per byte of the output (the GGUF Q6_K block is 210
// bytes, so a per-block copy would be unaligned and uncoalesced): qs bytes
// first, then the header bytes.
__global__ void split_kblocks_kernel(DType type, const uint8_t* __restrict__ raw, int64_t n_blocks,
                                     uint8_t* __restrict__ qs, uint8_t* __restrict__ sc) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int qb = quant_qs_bytes(type), hb = quant_header_bytes(type), bb = gguf_block_bytes(type);
  const int64_t n_qs = n_blocks * qb;
  if (i < n_qs) {
    qs[i] = raw[(i / qb) * bb + i % qb];
  } else if (i < n_qs + n_blocks * hb) {
    const int64_t j = i - n_qs;
    sc[j] = raw[(j / hb) * bb + qb + j % hb];
  }
}

// One thread per 32 elements (a block, or a K-quant sub-block): chunk c of
// the weight is row c / (K / 32), columns (c % (K / 32)) * 32 ..+32.
__global__ void dequant_f16_kernel(DevWeight w, int64_t first_chunk, int64_t n_chunks, __half* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_chunks) return;
  const int64_t c = first_chunk + i;
  __half2* o = reinterpret_cast<__half2*>(out + i * kQK);
  if (is_kquant(w.type)) {
    const int64_t gb = c / (kQK_K / kQK);  // K is a multiple of 256: a row's chunks never straddle a super-block
    const int e0 = static_cast<int>(c % (kQK_K / kQK)) * kQK;
    const uint8_t* blk = w.qs + gb * quant_qs_bytes(w.type);
    const uint32_t hdr = load_header(w.type, w.sc, gb);
#pragma unroll 4
    for (int j = 0; j < kQK; j += 2) {
      o[j / 2] = __floats2half2_rn(kquant_elem(w.type, blk, hdr, e0 + j), kquant_elem(w.type, blk, hdr, e0 + j + 1));
    }
    return;
  }
  const uint8_t* qs = w.qs + c * quant_qs_bytes(w.type);
  const uint32_t hdr = load_header(w.type, w.sc, c);
#pragma unroll
  for (int j = 0; j < kQK; j += 2) {
    o[j / 2] = __floats2half2_rn(dequant_elem(w.type, qs, hdr, j), dequant_elem(w.type, qs, hdr, j + 1));
  }
}

// ------------------------------------------------------------------ activations

// One warp per block of 32 activations (lane i: element i).
__global__ void quantize_act_kernel(DType type, const float* __restrict__ x, int64_t total_blocks,
                                    int8_t* __restrict__ xq, ActScale* __restrict__ xs) {
  const int64_t wid = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x & (kWarp - 1);
  if (wid >= total_blocks) return;  // uniform per warp
  // Row m, block b of x[M][K] starts at m * K + b * 32 = wid * 32 (K = nb * 32).
  const float v = x[wid * kQK + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  float qf = rintf(__fmul_rn(v, id));
  qf = fmaxf(-127.0f, fminf(127.0f, qf));
  const int q = static_cast<int>(qf);
  xq[wid * kQK + lane] = static_cast<int8_t>(q);
  int sum = q;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(kFull, sum, off);
  if (lane == 0) xs[wid] = act_block_scale(type, amax, sum);
}

// Q8_K (K-quant weights): one warp per super-block of 256, lane l: elements
// 8l..8l+7; exactly quantize_kblock_host (layout.h) / the CPU's
// quantize_row_q8k. The element of largest |x| is the first one on ties (a
// lane scans its elements in order with a strict >, lanes combine by
// (|x| larger, then index smaller)); NaNs never win (comparisons are false).
__global__ void quantize_q8k_kernel(const float* __restrict__ x, int64_t total_blocks, int8_t* __restrict__ xq,
                                    KActBlock* __restrict__ xk) {
  const int64_t wid = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  const int lane = threadIdx.x & (kWarp - 1);
  if (wid >= total_blocks) return;  // uniform per warp
  const float* xb = x + wid * kQK_K + lane * 8;
  float v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = xb[i];
  Q8KMax best = q8k_lane_max(v, lane);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    Q8KMax other;
    other.amax = __shfl_xor_sync(kFull, best.amax, off);
    other.mx = __shfl_xor_sync(kFull, best.mx, off);
    other.idx = __shfl_xor_sync(kFull, best.idx, off);
    best = q8k_max_combine(best, other);
  }
  uint32_t q[2];
  float d;
  int sum = q8k_lane_quantize(v, best.amax, best.mx, q, &d);
  *reinterpret_cast<uint2*>(xq + wid * kQK_K + lane * 8) = make_uint2(q[0], q[1]);
  sum += __shfl_xor_sync(kFull, sum, 1);  // the group of 16: lanes 2g, 2g + 1
  if ((lane & 1) == 0) xk[wid].bsums[lane / 2] = static_cast<int16_t>(sum);
  if (lane == 0) xk[wid].d = d;
}

__global__ void f32_to_f16_kernel(const float* __restrict__ x, int64_t n, __half* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  out[i] = __float2half_rn(fmaxf(-65504.0f, fminf(65504.0f, x[i])));
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint32_t u = __float_as_uint(x[i]);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    out[i] = static_cast<uint16_t>((u >> 16) | 0x40u);
  } else {
    u += 0x7FFFu + ((u >> 16) & 1u);
    out[i] = static_cast<uint16_t>(u >> 16);
  }
}

// ------------------------------------------------------------------ GEMV

template <DType T, int NR>
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    quant_gemv_kernel(QuantGemvArgs g, int64_t N, int64_t M, int n_groups, float* __restrict__ y) {
  g.type = T;  // constant-folds the type switches in the lane code
  const int lane = threadIdx.x & (kWarp - 1);
  const int warp = threadIdx.x / kWarp;
  const int64_t tile = blockIdx.x / n_groups;
  const int group = static_cast<int>(blockIdx.x % n_groups);
  const int64_t n = tile * kGemvWarps + warp;
  if (n >= N) return;  // uniform per warp
  const int64_t m0 = static_cast<int64_t>(group) * NR;
  const int m_valid = static_cast<int>(M - m0 < NR ? M - m0 : NR);
  float acc[NR];
  if constexpr (T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K) {
    kquant_gemv_lane<NR>(g, n, m0, m_valid, lane, acc);
  } else {
    quant_gemv_lane<NR>(g, n, m0, m_valid, lane, acc);
  }
#pragma unroll
  for (int j = 0; j < NR; ++j) acc[j] = warp_sum_ordered(acc[j]);
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < NR; ++j)
      if (j < m_valid) y[(m0 + j) * N + n] = acc[j];
  }
}

template <DType T, int NR>
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    float_gemv_kernel(FloatGemvArgs g, int64_t N, int64_t M, int n_groups, float* __restrict__ y) {
  g.type = T;
  const int lane = threadIdx.x & (kWarp - 1);
  const int warp = threadIdx.x / kWarp;
  const int64_t tile = blockIdx.x / n_groups;
  const int group = static_cast<int>(blockIdx.x % n_groups);
  const int64_t n = tile * kGemvWarps + warp;
  if (n >= N) return;
  const int64_t m0 = static_cast<int64_t>(group) * NR;
  const int m_valid = static_cast<int>(M - m0 < NR ? M - m0 : NR);
  float acc[NR];
  float_gemv_lane<NR>(g, n, m0, m_valid, lane, acc);
#pragma unroll
  for (int j = 0; j < NR; ++j) acc[j] = warp_sum_ordered(acc[j]);
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < NR; ++j)
      if (j < m_valid) y[(m0 + j) * N + n] = acc[j];
  }
}

template <int NR>
cudaError_t launch_gemv_nr(const DevWeight& w, const float* x, const int8_t* xq, const ActScale* xs, int64_t M,
                           float* y, cudaStream_t stream) {
  const int64_t n_groups = (M + NR - 1) / NR;
  const int64_t tiles = (w.N + kGemvWarps - 1) / kGemvWarps;
  const int64_t blocks = tiles * n_groups;
  if (blocks <= 0) return cudaSuccess;
  if (blocks > 0x7FFFFFFFLL) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks)), block(kGemvWarps * kWarp);
  const int ng = static_cast<int>(n_groups);
  if (is_quant(w.type)) {
    // K-quants: the scale area holds KActBlocks (quantize_activations).
    QuantGemvArgs g{w.type, w.K, w.qs, w.sc, xq, xs, reinterpret_cast<const KActBlock*>(xs)};
    switch (w.type) {
      case DType::Q4_K: quant_gemv_kernel<DType::Q4_K, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      case DType::Q5_K: quant_gemv_kernel<DType::Q5_K, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      case DType::Q6_K: quant_gemv_kernel<DType::Q6_K, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      case DType::Q4_0: quant_gemv_kernel<DType::Q4_0, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      case DType::Q4_1: quant_gemv_kernel<DType::Q4_1, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      case DType::Q5_0: quant_gemv_kernel<DType::Q5_0, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      case DType::Q5_1: quant_gemv_kernel<DType::Q5_1, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      default: quant_gemv_kernel<DType::Q8_0, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
    }
  } else {
    const bool x_vec = (w.K % 4 == 0) && (reinterpret_cast<uintptr_t>(x) % 16 == 0);
    FloatGemvArgs g{w.type, w.K, w.stride, w.data, x, x_vec};
    switch (w.type) {
      case DType::F16: float_gemv_kernel<DType::F16, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      case DType::BF16: float_gemv_kernel<DType::BF16, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
      default: float_gemv_kernel<DType::F32, NR><<<grid, block, 0, stream>>>(g, w.N, M, ng, y); break;
    }
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t split_quant_blocks(DType type, const uint8_t* raw, int64_t n_blocks, uint8_t* qs, uint8_t* sc,
                               cudaStream_t stream) {
  if (n_blocks <= 0) return cudaSuccess;
  if (is_kquant(type)) {
    const int64_t bytes = n_blocks * (quant_qs_bytes(type) + quant_header_bytes(type));
    split_kblocks_kernel<<<blocks_for(bytes, 256), 256, 0, stream>>>(type, raw, n_blocks, qs, sc);
    return cudaGetLastError();
  }
  split_blocks_kernel<<<blocks_for(n_blocks, 256), 256, 0, stream>>>(type, raw, n_blocks, qs, sc);
  return cudaGetLastError();
}

cudaError_t quantize_activations(DType type, const float* x, int64_t M, int64_t K, int8_t* xq, ActScale* xs,
                                 cudaStream_t stream) {
  if (is_kquant(type)) {
    const int64_t total = M * (K / kQK_K);
    if (total <= 0) return cudaSuccess;
    quantize_q8k_kernel<<<blocks_for(total * kWarp, 256), 256, 0, stream>>>(x, total, xq,
                                                                            reinterpret_cast<KActBlock*>(xs));
    return cudaGetLastError();
  }
  const int64_t total = M * (K / kQK);
  if (total <= 0) return cudaSuccess;
  quantize_act_kernel<<<blocks_for(total * kWarp, 256), 256, 0, stream>>>(type, x, total, xq, xs);
  return cudaGetLastError();
}

cudaError_t gemv(const DevWeight& w, const float* x, const int8_t* xq, const ActScale* xs, int64_t M, float* y,
                 cudaStream_t stream) {
  if (M <= 0 || w.N <= 0) return cudaSuccess;
  // The smallest pass width that takes all rows (up to 8) in one pass.
  if (M == 1) return launch_gemv_nr<1>(w, x, xq, xs, M, y, stream);
  if (M == 2) return launch_gemv_nr<2>(w, x, xq, xs, M, y, stream);
  if (M <= 4) return launch_gemv_nr<4>(w, x, xq, xs, M, y, stream);
  return launch_gemv_nr<8>(w, x, xq, xs, M, y, stream);
}

cudaError_t dequantize_to_f16(const DevWeight& w, int64_t row0, int64_t n_rows, uint16_t* out, cudaStream_t stream) {
  const int64_t nc = w.K / kQK;  // chunks of 32 per row (K-quants: 8 per super-block)
  const int64_t n_chunks = n_rows * nc;
  if (n_chunks <= 0) return cudaSuccess;
  dequant_f16_kernel<<<blocks_for(n_chunks, 128), 128, 0, stream>>>(w, row0 * nc, n_chunks,
                                                                    reinterpret_cast<__half*>(out));
  return cudaGetLastError();
}

cudaError_t f32_to_f16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  f32_to_f16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, n, reinterpret_cast<__half*>(out));
  return cudaGetLastError();
}

cudaError_t f32_to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  f32_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

}  // namespace ember::gpu
