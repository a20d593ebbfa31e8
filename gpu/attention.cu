// Attention over the paged KV cache: flash-style (tiles of 32 cached tokens
// in shared memory, online softmax, the T x T matrix never exists), GQA (one
// thread block serves every query head of one kv head, so K/V are read once
// per group), and split-K flash-decoding (blockIdx.z splits a long cache; a
// second kernel merges the partial (max, sum, acc) triples).
//
// Work: grid (row tiles, kv heads, splits). A row tile is up to
// attn_rows_per_tile(G) rows of one sequence (one row for decodes); its query
// vectors (rows x G heads, <= 16) are spread over the block's warps, at most
// four per warp. Per KV tile: the block loads 32 tokens' K and V (16-byte
// loads, following the block table) into shared memory; each warp then, for
// each of its vectors, gives lane t the score of token t, updates the online
// softmax with warp reductions, and accumulates P.V with lane = output dims.
// Causality is per row: row r sees cache slots [0, kv_len[r]) (as the CPU);
// a token-tree row (alone in its tile) sees its ancestors' slots through the
// tile's slot map (AttnTileDesc::map_from).
//
// Shared memory: q [16][D] f32, K [32][D/2 + 1] half2 words (the odd row
// stride makes lane-per-token reads conflict-free), V [32][D] f16.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu/kernels.h"

namespace ember::gpu {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kMaxVecsPerWarp = 4;
constexpr int kMaxWarps = 4;

__host__ __device__ inline size_t attn_smem_bytes(int D) {
  return static_cast<size_t>(kAttnMaxVecs) * D * sizeof(float) +
         static_cast<size_t>(kAttnTile) * (D / 2 + 1) * sizeof(uint32_t) +
         static_cast<size_t>(kAttnTile) * D * sizeof(__half);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// DPL: output dims per lane = ceil(D / 32) rounded up to 2, 4 or 8.
template <int DPL>
__global__ void __launch_bounds__(kMaxWarps * 32) attention_kernel(AttnLaunch a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.head_dim;
  const int G = a.num_heads / a.num_kv_heads;
  const int kstride = D / 2 + 1;
  float* q_s = reinterpret_cast<float*>(smem);
  uint32_t* k_s = reinterpret_cast<uint32_t*>(q_s + kAttnMaxVecs * D);
  __half* v_s = reinterpret_cast<__half*>(k_s + kAttnTile * kstride);  // 16-byte aligned: 128 * kstride bytes above

  const AttnTileDesc td = a.tiles[blockIdx.x];
  const int h = blockIdx.y;
  const int split = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int QV = td.n_rows * G;

  for (int i = threadIdx.x; i < QV * D; i += blockDim.x) {
    const int v = i / D, d = i % D;
    const int r = v / G, g = v % G;
    q_s[i] = a.q[(static_cast<int64_t>(td.row0 + r) * a.num_heads + h * G + g) * D + d];
  }
  int max_len = 0;
  for (int r = 0; r < td.n_rows; ++r) max_len = max(max_len, a.kv_len[td.row0 + r]);
  const int kv_tiles = (max_len + kAttnTile - 1) / kAttnTile;
  const int t_begin = split * a.tiles_per_split;
  const int t_end = min(t_begin + a.tiles_per_split, kv_tiles);

  float m[kMaxVecsPerWarp], l[kMaxVecsPerWarp], acc[kMaxVecsPerWarp][DPL];
  int len[kMaxVecsPerWarp], lo[kMaxVecsPerWarp];  // row's visible slots: [lo, len) minus the hole
#pragma unroll
  for (int vi = 0; vi < kMaxVecsPerWarp; ++vi) {
    const int v = warp + vi * n_warps;
    len[vi] = v < QV ? a.kv_len[td.row0 + v / G] : 0;
    lo[vi] = a.window > 0 ? max(0, len[vi] - a.window) : 0;
    m[vi] = -INFINITY;
    l[vi] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[vi][i] = 0.0f;
  }

  const KvView& kv = a.kv;
  const int bs = kv.block_size;
  const int64_t block_elems = static_cast<int64_t>(kv.num_kv_heads) * bs * D;
  const uint16_t* k_layer = kv.base + kv_offset(a.layer, 0, 0, 0, 0, kv.num_blocks, kv.num_kv_heads, bs, D);
  const uint16_t* v_layer = kv.base + kv_offset(a.layer, 1, 0, 0, 0, kv.num_blocks, kv.num_kv_heads, bs, D);
  const int32_t* table = a.block_tables + td.bt_off;
  const int chunks_per_tok = D / 8;
  __syncthreads();  // q_s

  const int hb = td.hole_begin, he = td.hole_end > td.hole_begin ? td.hole_end : td.hole_begin;
  for (int t = t_begin; t < t_end; ++t) {
    const int base_pos = t * kAttnTile;
    if (base_pos >= hb && base_pos + kAttnTile <= he) continue;  // the whole tile is in the hole (uniform)
      // Load 32 tokens of K and V (zeros past max_len: p = 0 must not meet NaN).
#pragma unroll 4
    for (int c = threadIdx.x; c < kAttnTile * chunks_per_tok; c += blockDim.x) {
      const int j = c / chunks_per_tok, part = c % chunks_per_tok;
      const int pos = base_pos + j;
      U32x4 kk{0u, 0u, 0u, 0u}, vv{0u, 0u, 0u, 0u};
      if (pos < max_len) {
        const int slot = pos >= td.map_from ? a.tree_slots[td.map_off + pos - td.map_from] : pos;
        const int64_t blk = table[slot / bs];
        if (blk >= 0) {  // (-1: freed by a sliding-window group, outside every row's window: p = 0)
          const int64_t off = blk * block_elems + (static_cast<int64_t>(h) * bs + slot % bs) * D + part * 8;
          kk = *reinterpret_cast<const U32x4*>(k_layer + off);
          vv = *reinterpret_cast<const U32x4*>(v_layer + off);
        }
      }
      uint32_t* kd = k_s + j * kstride + part * 4;
      kd[0] = kk.x;
      kd[1] = kk.y;
      kd[2] = kk.z;
      kd[3] = kk.w;
      *reinterpret_cast<U32x4*>(v_s + j * D + part * 8) = vv;
    }
    __syncthreads();

#pragma unroll
    for (int vi = 0; vi < kMaxVecsPerWarp; ++vi) {
      const int v = warp + vi * n_warps;
      if (v < QV && base_pos < len[vi]) {  // uniform per warp
        const int pos = base_pos + lane;
        float s = -INFINITY;
        if (pos < len[vi] && pos >= lo[vi] && (pos < hb || pos >= he)) {
          const float2* qv = reinterpret_cast<const float2*>(q_s + v * D);
          const __half2* kr = reinterpret_cast<const __half2*>(k_s + lane * kstride);
          float dot = 0.0f;
          for (int d2 = 0; d2 < D / 2; ++d2) {
            const float2 kf = __half22float2(kr[d2]);
            const float2 qf = qv[d2];
            dot = fmaf(qf.x, kf.x, dot);
            dot = fmaf(qf.y, kf.y, dot);
          }
          s = dot * a.scale;
        }
        const float tile_max = warp_max(s);
        if (tile_max == -INFINITY) continue;  // every slot of this tile is in the hole (uniform per warp)
        const float new_m = fmaxf(m[vi], tile_max);
        const float corr = expf(m[vi] - new_m);  // m = -inf: 0
        const float p = expf(s - new_m);         // s = -inf: 0
        l[vi] = l[vi] * corr + warp_sum(p);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[vi][i] *= corr;
        const int n_valid = min(kAttnTile, len[vi] - base_pos);
        for (int j = 0; j < n_valid; ++j) {
          if (base_pos + j >= hb && base_pos + j < he) continue;  // uniform
          const float pj = __shfl_sync(kFull, p, j);
          const __half* vr = v_s + j * D;
#pragma unroll
          for (int i = 0; i < DPL; ++i) {
            const int d = lane + 32 * i;
            if (d < D) acc[vi][i] = fmaf(pj, __half2float(vr[d]), acc[vi][i]);
          }
        }
        m[vi] = new_m;
      }
    }
    __syncthreads();  // before the next tile overwrites k_s / v_s
  }

#pragma unroll
  for (int vi = 0; vi < kMaxVecsPerWarp; ++vi) {
    const int v = warp + vi * n_warps;
    if (v < QV) {
      const int64_t row = td.row0 + v / G;
      const int head = h * G + v % G;
      if (a.n_splits == 1) {
        float* o = a.out + (row * a.num_heads + head) * D;
        const float inv = l[vi] > 0.0f ? 1.0f / l[vi] : 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int d = lane + 32 * i;
          if (d < D) o[d] = acc[vi][i] * inv;
        }
      } else {
        const int64_t idx = (static_cast<int64_t>(split) * a.n_rows + row) * a.num_heads + head;
        float* pa = a.part_acc + idx * D;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int d = lane + 32 * i;
          if (d < D) pa[d] = acc[vi][i];
        }
        if (lane == 0) a.part_ml[idx] = MaxSum{m[vi], l[vi]};
      }
    }
  }
}

// Merges the splits: grid (row tiles, kv heads), one thread per output dim.
__global__ void attention_combine_kernel(AttnLaunch a) {
  const AttnTileDesc td = a.tiles[blockIdx.x];
  const int h = blockIdx.y;
  const int D = a.head_dim, G = a.num_heads / a.num_kv_heads;
  const int d = threadIdx.x;
  if (d >= D) return;
  const int64_t stride = static_cast<int64_t>(a.n_rows) * a.num_heads;
  for (int v = 0; v < td.n_rows * G; ++v) {
    const int64_t row = td.row0 + v / G;
    const int head = h * G + v % G;
    const int64_t idx0 = row * a.num_heads + head;
    float M = -INFINITY;
    for (int s = 0; s < a.n_splits; ++s) M = fmaxf(M, a.part_ml[s * stride + idx0].m);
    float L = 0.0f, o = 0.0f;
    if (M != -INFINITY) {
      for (int s = 0; s < a.n_splits; ++s) {
        const MaxSum ml = a.part_ml[s * stride + idx0];
        if (ml.m == -INFINITY) continue;
        const float w = expf(ml.m - M);
        L = fmaf(ml.l, w, L);
        o = fmaf(a.part_acc[(s * stride + idx0) * D + d], w, o);
      }
    }
    a.out[idx0 * D + d] = L > 0.0f ? o * (1.0f / L) : 0.0f;
  }
}

template <int DPL>
cudaError_t launch(const AttnLaunch& a, int n_warps, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.n_tiles), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(a.n_splits));
  attention_kernel<DPL><<<grid, n_warps * 32, attn_smem_bytes(a.head_dim), stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t attention_init() {
  // D = 256 needs a little more than the default 48 KiB of dynamic shared memory.
  return cudaFuncSetAttribute(attention_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(attn_smem_bytes(kAttnMaxHeadDim)));
}

cudaError_t attention(const AttnLaunch& a, cudaStream_t stream) {
  if (a.n_tiles <= 0) return cudaSuccess;
  const int G = a.num_heads / a.num_kv_heads;
  const int max_vecs = a.rows_per_tile * G;
  const int n_warps = max_vecs < kMaxWarps ? max_vecs : kMaxWarps;
  cudaError_t e;
  if (a.head_dim <= 64) {
    e = launch<2>(a, n_warps, stream);
  } else if (a.head_dim <= 128) {
    e = launch<4>(a, n_warps, stream);
  } else {
    e = launch<8>(a, n_warps, stream);
  }
  if (e != cudaSuccess || a.n_splits == 1) return e;
  const dim3 grid(static_cast<unsigned>(a.n_tiles), static_cast<unsigned>(a.num_kv_heads));
  const int threads = (a.head_dim + 31) / 32 * 32;
  attention_combine_kernel<<<grid, threads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ember::gpu
