// Element-wise and row-wise ops of the forward pass, the KV cache writes and
// copies, and the sampling kernels. Semantics follow cpu/cpu_backend.cpp and
// core/sampling/sampler.cpp operation by operation (see docs/CUDA.md).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>

#include "gpu/kernels.h"

namespace ember::gpu {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;

inline unsigned grid_for(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  // Grid-stride loops below cover the rest.
  if (b > 65535LL * 32) b = 65535LL * 32;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024). All threads get
// the result. `red` is 32 floats of shared memory.
__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {  // only warp 0 reads the partials: it alone then writes red[0]
    v = lane < n_warps ? red[lane] : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

// ------------------------------------------------------------------ rows

__global__ void embed_kernel(DevWeight w, const int32_t* __restrict__ ids, int32_t n, float* __restrict__ out) {
  const int64_t total = static_cast<int64_t>(n) * w.K;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / w.K, k = i % w.K;
    const int64_t row = ids[r];
    float v;
    if (is_quant(w.type)) {
      v = quant_weight_elem(w.type, w.qs, w.sc, w.K, row, k);  // 32-element blocks and K-quants
    } else {
      v = float_weight_elem(w.type, w.data, w.stride, row, k);
    }
    out[i] = v;
  }
}

// One block per row. x may alias out (each thread writes what it read).
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, int32_t dim, float eps, float* out) {
  __shared__ float red[32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) sum = fmaf(xr[i], xr[i], sum);
  sum = block_sum(sum, red);
  const float scale = 1.0f / sqrtf(sum / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

// One thread per (row, head, pair). GGUF "normal" RoPE: adjacent pairs; NEOX:
// pairs (i, i + half).
__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ positions, float theta_scale,
                            int32_t rows, int32_t num_heads, int32_t head_dim, int32_t half, float freq_scale,
                            const float* __restrict__ factors, bool neox) {
  const int64_t total = static_cast<int64_t>(rows) * num_heads * half;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(t % half);
    const int64_t rh = t / half;  // row * num_heads + head
    const int64_t r = rh / num_heads;
    float theta = static_cast<float>(positions[r]);
    for (int32_t k = 0; k < i; ++k) theta *= theta_scale;  // the CPU's recurrence, rounding included
    theta = freq_scale * (factors ? theta / factors[i] : theta);
    float s, c;
    sincosf(theta, &s, &c);
    const int32_t off = neox ? half : 1;
    float* p = x + rh * head_dim + (neox ? i : 2 * i);
    const float x0 = p[0], x1 = p[off];
    p[0] = x0 * c - x1 * s;
    p[off] = x0 * s + x1 * c;
  }
}

__global__ void swiglu_kernel(const float* gate, const float* __restrict__ up, size_t n, float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void geglu_kernel(const float* gate, const float* __restrict__ up, size_t n, float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    float y;
    if (g <= -10.0f) {
      y = 0.0f;
    } else if (g >= 10.0f) {
      y = g * up[i];
    } else {
      const float xh = __half2float(__float2half_rn(g));
      const float inner = fmaf(0.044715f * xh, xh, 1.0f);
      const float gl = 0.5f * xh * (1.0f + tanhf(0.79788456080286535587989211986876f * xh * inner));
      y = __half2float(__float2half_rn(gl)) * up[i];
    }
    out[i] = y;
  }
}

__global__ void scale_kernel(float* x, size_t n, float s) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

__global__ void add_bias_kernel(float* x, const float* __restrict__ bias, int64_t total, int32_t dim) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += bias[i % dim];
  }
}

__global__ void add_kernel(float* x, const float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void gather_rows_kernel(const float* __restrict__ x, const int32_t* __restrict__ rows, int32_t n,
                                   int32_t dim, float* __restrict__ out) {
  const int64_t total = static_cast<int64_t>(n) * dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / dim, d = i % dim;
    out[i] = x[static_cast<int64_t>(rows[r]) * dim + d];
  }
}

// ------------------------------------------------------------------ LoRA

__device__ __forceinline__ float lora_weight(const DevWeight& w, int64_t row, int64_t col) {
  const int64_t i = row * w.stride + col;
  switch (w.type) {
    case DType::F16: return __half2float(reinterpret_cast<const __half*>(w.data)[i]);
    case DType::BF16: return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(w.data)[i]) << 16);
    default: return reinterpret_cast<const float*>(w.data)[i];
  }
}

// The value as a weight of type `t` holds it (ggml's vec_dot_type rounding).
__device__ __forceinline__ float lora_round(DType t, float v) {
  if (t == DType::F16) return __half2float(__float2half_rn(v));
  if (t == DType::BF16) {
    const uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x00400000u) & 0xffff0000u);  // nan
    return __uint_as_float((u + (0x7fffu + ((u >> 16) & 1u))) & 0xffff0000u);
  }
  return v;
}

// One warp per (row m, rank j): t[m][j] = round_b(sum_k A[j][k] round_a(x[rows[m]][k])).
__global__ void lora_down_kernel(DevWeight a, DType b_type, const int32_t* __restrict__ rows, int32_t n,
                                 const float* __restrict__ x, float* __restrict__ t) {
  const int lane = threadIdx.x & 31;
  const int64_t total = static_cast<int64_t>(n) * a.N;
  const int64_t n_warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  // (warp-uniform loop: every lane of a warp takes the same iterations)
  for (int64_t w = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; w < total; w += n_warps) {
    const int64_t m = w / a.N, j = w % a.N;
    const float* xr = x + static_cast<int64_t>(rows[m]) * a.K;
    float acc = 0.f;
    for (int64_t k = lane; k < a.K; k += 32) acc += lora_weight(a, j, k) * lora_round(a.type, xr[k]);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
    if (lane == 0) t[m * a.N + j] = lora_round(b_type, acc);
  }
}

// One thread per (row m, output n): y[rows[m]][n] += (sum_j B[n][j] t[m][j]) * scale.
__global__ void lora_up_kernel(DevWeight b, float scale, const int32_t* __restrict__ rows, int32_t n,
                               const float* __restrict__ t, float* __restrict__ y) {
  const int64_t total = static_cast<int64_t>(n) * b.N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / b.N, o = i % b.N;
    const float* tm = t + m * b.K;
    float acc = 0.f;
    for (int64_t j = 0; j < b.K; ++j) acc += lora_weight(b, o, j) * tm[j];
    y[static_cast<int64_t>(rows[m]) * b.N + o] += acc * scale;
  }
}

// ------------------------------------------------------------------ KV cache

// One thread per (row, kv head, element).
__global__ void kv_store_kernel(KvView kv, int32_t layer, const float* __restrict__ k, const float* __restrict__ v,
                                const int32_t* __restrict__ slots, int32_t rows) {
  const int32_t hd = kv.head_dim, nkv = kv.num_kv_heads;
  const int64_t total = static_cast<int64_t>(rows) * nkv * hd;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t d = static_cast<int32_t>(t % hd);
    const int64_t rh = t / hd;
    const int32_t h = static_cast<int32_t>(rh % nkv);
    const int64_t r = rh / nkv;
    const int32_t slot = slots[r];
    const int32_t block = slot / kv.block_size, off = slot % kv.block_size;
    const int64_t ko = kv_offset(layer, 0, block, h, off, kv.num_blocks, nkv, kv.block_size, hd) + d;
    const int64_t vo = kv_offset(layer, 1, block, h, off, kv.num_blocks, nkv, kv.block_size, hd) + d;
    kv.base[ko] = __half_as_ushort(__float2half_rn(k[t]));
    kv.base[vo] = __half_as_ushort(__float2half_rn(v[t]));
  }
}

// grid: (n, layers * 2); each block copies one (layer, K|V) block.
__global__ void kv_copy_kernel(KvView kv, const int32_t* __restrict__ src, const int32_t* __restrict__ dst) {
  const int32_t i = blockIdx.x;
  const int32_t layer = blockIdx.y / 2, which = blockIdx.y % 2;
  const int64_t s = kv_offset(layer, which, src[i], 0, 0, kv.num_blocks, kv.num_kv_heads, kv.block_size, kv.head_dim);
  const int64_t d = kv_offset(layer, which, dst[i], 0, 0, kv.num_blocks, kv.num_kv_heads, kv.block_size, kv.head_dim);
  const int64_t vecs = static_cast<int64_t>(kv.num_kv_heads) * kv.block_size * kv.head_dim / 8;  // head_dim % 8 == 0
  const U32x4* from = reinterpret_cast<const U32x4*>(kv.base + s);
  U32x4* to = reinterpret_cast<U32x4*>(kv.base + d);
  for (int64_t j = threadIdx.x; j < vecs; j += blockDim.x) to[j] = from[j];
}

// One thread per (layer, block, kv head x slot, pair): as the CPU's
// kv_rope_shift, the pair is read as f32, rotated, and stored back as f16.
__global__ void kv_rope_shift_kernel(KvView kv, const int32_t* __restrict__ blocks, int32_t n,
                                     const float* __restrict__ cs, const float* __restrict__ sn, int32_t half,
                                     int32_t layer_stride, bool neox) {
  const int64_t rows = static_cast<int64_t>(kv.num_kv_heads) * kv.block_size;  // per block and layer
  const int64_t total = static_cast<int64_t>(kv.num_layers) * n * rows * half;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(t % half);
    int64_t rest = t / half;
    const int64_t r = rest % rows;  // kv_head * block_size + slot
    rest /= rows;
    const int32_t b = static_cast<int32_t>(rest % n);
    const int32_t layer = static_cast<int32_t>(rest / n);
    const int32_t block = blocks[b];
    if (block < 0 || block >= kv.num_blocks) continue;
    const int32_t off = neox ? half : 1;
    uint16_t* k = kv.base +
                  kv_offset(layer, 0, block, 0, 0, kv.num_blocks, kv.num_kv_heads, kv.block_size, kv.head_dim) +
                  r * kv.head_dim + (neox ? i : 2 * i);
    const float c = cs[static_cast<int64_t>(layer) * layer_stride + i];
    const float s = sn[static_cast<int64_t>(layer) * layer_stride + i];
    const float x0 = __half2float(__ushort_as_half(k[0])), x1 = __half2float(__ushort_as_half(k[off]));
    const float y0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
    const float y1 = __fmaf_rn(x0, s, __fmul_rn(x1, c));
    k[0] = __half_as_ushort(__float2half_rn(y0));
    k[off] = __half_as_ushort(__float2half_rn(y1));
  }
}

// ------------------------------------------------------------------ sampling

// Order-preserving map of a float to uint32 (larger float -> larger key);
// NaN maps to 0 (below everything).
__device__ __forceinline__ uint32_t float_key(float f) {
  if (isnan(f)) return 0u;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct ArgBest {
  float v;
  int32_t i;
};
// a before b: larger value, then smaller index (std::max_element keeps the first).
__device__ __forceinline__ bool better(const ArgBest& a, const ArgBest& b) {
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

// The block's argmax of one row (blockDim.x threads, a multiple of 32).
__device__ int32_t block_argmax(const float* __restrict__ row, int32_t vocab) {
  __shared__ ArgBest red[32];
  ArgBest best{-INFINITY, INT_MAX};
  for (int32_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = row[i];
    const ArgBest c{isnan(x) ? -INFINITY : x, i};  // NaN never wins
    if (better(c, best) || best.i == INT_MAX) best = c;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    ArgBest o{__shfl_xor_sync(kFull, best.v, off), __shfl_xor_sync(kFull, best.i, off)};
    if (better(o, best) || (best.i == INT_MAX && o.i != INT_MAX)) best = o;
  }
  __syncthreads();
  if (lane == 0) red[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < n_warps ? red[lane] : ArgBest{-INFINITY, INT_MAX};
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      ArgBest o{__shfl_xor_sync(kFull, best.v, off), __shfl_xor_sync(kFull, best.i, off)};
      if (better(o, best) || (best.i == INT_MAX && o.i != INT_MAX)) best = o;
    }
    if (lane == 0) red[0] = best;
  }
  __syncthreads();
  const int32_t r = red[0].i;
  __syncthreads();
  return r == INT_MAX ? 0 : r;
}

__global__ void argmax_kernel(const float* __restrict__ logits, int32_t vocab, int32_t* __restrict__ out) {
  const int32_t r = block_argmax(logits + static_cast<int64_t>(blockIdx.x) * vocab, vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = r;
}

__global__ void penalties_kernel(float* __restrict__ logits, int32_t vocab, const PenaltyEntry* __restrict__ e,
                                 int32_t n) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const PenaltyEntry p = e[i];
  if (p.token < 0 || p.token >= vocab) return;
  float& l = logits[static_cast<int64_t>(p.row) * vocab + p.token];
  float v = l;
  if (p.repeat != 1.0f && p.repeat > 0.0f) v = v > 0 ? v / p.repeat : v * p.repeat;
  v -= static_cast<float>(p.count) * p.frequency + (p.count > 0 ? p.presence : 0.0f);
  l = v;
}

constexpr int kSampleThreads = 1024;  // == kMaxTopK: one candidate per thread after selection

// Inclusive scan over the block (kSampleThreads threads) of doubles.
__device__ double block_inclusive_scan(double v, double* warp_tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const double o = __shfl_up_sync(kFull, v, off);
    if (lane >= off) v += o;
  }
  if (lane == 31) warp_tot[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double t = warp_tot[lane];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const double o = __shfl_up_sync(kFull, t, off);
      if (lane >= off) t += o;
    }
    warp_tot[lane] = t;  // inclusive prefix of warp totals
  }
  __syncthreads();
  if (warp > 0) v += warp_tot[warp - 1];
  __syncthreads();
  return v;
}

// One block per row: top-k by radix select on the float keys (ties: lowest
// ids), bitonic sort of the k candidates (logit desc, id asc, as the CPU
// sampler's partial_sort), softmax with temperature in double, top-p, min-p,
// and the draw with the caller's uniform (the CPU sampler's rule: the first
// candidate whose cumulative probability exceeds u * total).
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(const float* __restrict__ logits, int32_t vocab, const SampleRow* __restrict__ params,
                  int32_t* __restrict__ out) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t c_key[kSampleThreads];
  __shared__ int32_t c_id[kSampleThreads];
  __shared__ float c_val[kSampleThreads];
  __shared__ double warp_tot[32];
  __shared__ uint32_t s_prefix, s_remaining, s_count_gt, s_taken;
  __shared__ int32_t s_min_a, s_min_b;

  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const SampleRow p = params[blockIdx.x];
  const int tid = threadIdx.x;

  if (p.temperature <= 0.0f) {
    const int32_t r = block_argmax(row, vocab);
    if (tid == 0) out[blockIdx.x] = r;
    return;
  }
  const uint32_t k = static_cast<uint32_t>(p.top_k < 1 ? 1 : (p.top_k > vocab ? vocab : p.top_k));

  // 1. Radix select: the k-th largest key T, and how many keys equal to T
  //    are taken (remaining); keys > T are all taken.
  if (tid == 0) {
    s_prefix = 0;
    s_remaining = k;
  }
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int32_t i = tid; i < vocab; i += blockDim.x) {
      const uint32_t key = float_key(row[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      uint32_t rem = s_remaining, above = 0;
      int digit = 0;
      for (int d = 255; d >= 0; --d) {
        if (above + hist[d] >= rem) {
          digit = d;
          break;
        }
        above += hist[d];
      }
      s_remaining = rem - above;
      s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
    }
    mask |= 0xFFu << shift;
    __syncthreads();
  }
  const uint32_t T = s_prefix;
  const uint32_t take_equal = s_remaining;  // >= 1
  const uint32_t count_gt = k - take_equal;

  // 2. Gather: keys > T in any order, then keys == T in increasing id order.
  if (tid == 0) {
    s_count_gt = 0;
    s_taken = 0;
  }
  c_key[tid] = 0;
  c_id[tid] = INT_MAX;
  c_val[tid] = -INFINITY;
  __syncthreads();
  for (int32_t i = tid; i < vocab; i += blockDim.x) {
    const float v = row[i];
    const uint32_t key = float_key(v);
    if (key > T) {
      const uint32_t slot = atomicAdd(&s_count_gt, 1u);
      c_key[slot] = key;
      c_id[slot] = i;
      c_val[slot] = v;
    }
  }
  __syncthreads();
  for (int32_t base = 0; base < vocab; base += blockDim.x) {
    const int32_t i = base + tid;
    const bool eq = i < vocab && float_key(row[i]) == T;
    // Rank among this chunk's equal keys, in id order.
    const unsigned ballot = __ballot_sync(kFull, eq);
    const int lane = tid & 31, warp = tid >> 5;
    __shared__ uint32_t warp_cnt[32];
    if (lane == 0) warp_cnt[warp] = __popc(ballot);
    __syncthreads();
    uint32_t before = 0;
    for (int w = 0; w < warp; ++w) before += warp_cnt[w];
    before += __popc(ballot & ((1u << lane) - 1u));
    uint32_t chunk_total = 0;
    for (int w = 0; w < (blockDim.x >> 5); ++w) chunk_total += warp_cnt[w];
    const uint32_t taken = s_taken;
    if (eq && taken + before < take_equal) {
      const uint32_t slot = count_gt + taken + before;
      c_key[slot] = T;
      c_id[slot] = i;
      c_val[slot] = row[i];
    }
    __syncthreads();
    if (tid == 0) s_taken = taken + chunk_total;
    __syncthreads();
    if (s_taken >= take_equal) break;
  }
  __syncthreads();

  // 3. Bitonic sort of kSampleThreads entries: key desc, id asc (padding sorts last).
  for (int size = 2; size <= kSampleThreads; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int j = tid ^ stride;
      if (j > tid) {
        const uint32_t ka = c_key[tid], kb = c_key[j];
        const int32_t ia = c_id[tid], ib = c_id[j];
        const bool b_first = kb > ka || (kb == ka && ib < ia);
        const bool a_first = ka > kb || (ka == kb && ia < ib);
        const bool up = (tid & size) == 0;
        if (up ? b_first : a_first) {
          c_key[tid] = kb;
          c_key[j] = ka;
          c_id[tid] = ib;
          c_id[j] = ia;
          const float t = c_val[tid];
          c_val[tid] = c_val[j];
          c_val[j] = t;
        }
      }
      __syncthreads();
    }
  }

  // 4. Softmax with temperature over the k survivors (double, as the CPU).
  const double max_l = c_val[0];
  const double prob =
      static_cast<uint32_t>(tid) < k ? exp((static_cast<double>(c_val[tid]) - max_l) / p.temperature) : 0.0;
  const double cum = block_inclusive_scan(prob, warp_tot);
  __shared__ double s_sum;
  if (tid == kSampleThreads - 1) s_sum = cum;
  if (tid == 0) {
    s_min_a = static_cast<int32_t>(k);
    s_min_b = static_cast<int32_t>(k);
  }
  __syncthreads();
  const double sum = s_sum;
  // top-p: keep the first i + 1 where the normalized cumulative sum >= top_p.
  if (p.top_p < 1.0f && static_cast<uint32_t>(tid) < k && cum / sum >= static_cast<double>(p.top_p)) {
    atomicMin(&s_min_a, tid + 1);
  }
  __syncthreads();
  int32_t n = s_min_a < 1 ? 1 : s_min_a;
  // min-p: cut at the first i >= 1 with prob < prob[0] * min_p.
  __shared__ double s_p0;
  if (tid == 0) s_p0 = prob;
  __syncthreads();
  if (p.min_p > 0.0f && tid >= 1 && tid < n && prob / sum < (s_p0 / sum) * static_cast<double>(p.min_p)) {
    atomicMin(&s_min_b, tid);
  }
  __syncthreads();
  if (p.min_p > 0.0f && s_min_b < n) n = s_min_b;
  // Draw: total = cum[n-1]; first i < n with cum[i] > u * total.
  __shared__ double s_total;
  if (tid == n - 1) s_total = cum / sum;
  if (tid == 0) s_min_a = n - 1;
  __syncthreads();
  const double r = p.uniform * s_total;
  if (tid < n && cum / sum > r) atomicMin(&s_min_a, tid);
  __syncthreads();
  if (tid == 0) out[blockIdx.x] = c_id[s_min_a];
}

}  // namespace

// ------------------------------------------------------------------ launchers

cudaError_t embed(const DevWeight& table, const int32_t* ids, int32_t n, float* out, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * table.K;
  if (total <= 0) return cudaSuccess;
  embed_kernel<<<grid_for(total, 256), 256, 0, stream>>>(table, ids, n, out);
  return cudaGetLastError();
}

cudaError_t rms_norm(const float* x, const float* w, int32_t rows, int32_t dim, float eps, float* out,
                     cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256;
  rms_norm_kernel<<<rows, threads, 0, stream>>>(x, w, dim, eps, out);
  return cudaGetLastError();
}

cudaError_t rope(float* x, const int32_t* positions, float theta_scale, int32_t rows, int32_t num_heads,
                 int32_t head_dim, int32_t rot_dim, cudaStream_t stream, float freq_scale, const float* factors,
                 bool neox) {
  const int32_t half = rot_dim / 2;
  const int64_t total = static_cast<int64_t>(rows) * num_heads * half;
  if (total <= 0) return cudaSuccess;
  rope_kernel<<<grid_for(total, 256), 256, 0, stream>>>(x, positions, theta_scale, rows, num_heads, head_dim, half,
                                                        freq_scale, factors, neox);
  return cudaGetLastError();
}

cudaError_t geglu(const float* gate, const float* up, size_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  geglu_kernel<<<grid_for(static_cast<int64_t>(n), 256), 256, 0, stream>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t scale(float* x, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<grid_for(static_cast<int64_t>(n), 256), 256, 0, stream>>>(x, n, s);
  return cudaGetLastError();
}

cudaError_t add_bias(float* x, const float* bias, int32_t rows, int32_t dim, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * dim;
  if (total <= 0) return cudaSuccess;
  add_bias_kernel<<<grid_for(total, 256), 256, 0, stream>>>(x, bias, total, dim);
  return cudaGetLastError();
}

cudaError_t swiglu(const float* gate, const float* up, size_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  swiglu_kernel<<<grid_for(static_cast<int64_t>(n), 256), 256, 0, stream>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t add(float* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  add_kernel<<<grid_for(static_cast<int64_t>(n), 256), 256, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t gather_rows(const float* x, const int32_t* rows, int32_t n, int32_t dim, float* out, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * dim;
  if (total <= 0) return cudaSuccess;
  gather_rows_kernel<<<grid_for(total, 256), 256, 0, stream>>>(x, rows, n, dim, out);
  return cudaGetLastError();
}

cudaError_t lora_term(const DevWeight& a, const DevWeight& b, float scale, const int32_t* rows, int32_t n,
                      const float* x, float* t, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int64_t warps = static_cast<int64_t>(n) * a.N;
  lora_down_kernel<<<grid_for(warps * 32, 256), 256, 0, stream>>>(a, b.type, rows, n, x, t);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  lora_up_kernel<<<grid_for(static_cast<int64_t>(n) * b.N, 256), 256, 0, stream>>>(b, scale, rows, n, t, y);
  return cudaGetLastError();
}

cudaError_t kv_store(const KvView& kv, int32_t layer, const float* k, const float* v, const int32_t* slots,
                     int32_t rows, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(rows) * kv.num_kv_heads * kv.head_dim;
  if (total <= 0) return cudaSuccess;
  kv_store_kernel<<<grid_for(total, 256), 256, 0, stream>>>(kv, layer, k, v, slots, rows);
  return cudaGetLastError();
}

cudaError_t kv_copy_blocks(const KvView& kv, const int32_t* src, const int32_t* dst, int32_t n, cudaStream_t stream) {
  if (n <= 0 || kv.num_layers <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(kv.num_layers * 2));
  kv_copy_kernel<<<grid, 256, 0, stream>>>(kv, src, dst);
  return cudaGetLastError();
}

cudaError_t kv_rope_shift(const KvView& kv, const int32_t* blocks, int32_t n, const float* cs, const float* sn,
                          int32_t rot_dim, cudaStream_t stream, int32_t layer_stride, bool neox) {
  const int32_t half = rot_dim / 2;
  const int64_t total = static_cast<int64_t>(kv.num_layers) * n * kv.num_kv_heads * kv.block_size * half;
  if (total <= 0) return cudaSuccess;
  kv_rope_shift_kernel<<<grid_for(total, 256), 256, 0, stream>>>(kv, blocks, n, cs, sn, half, layer_stride, neox);
  return cudaGetLastError();
}

cudaError_t argmax_rows(const float* logits, int32_t rows, int32_t vocab, int32_t* out, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  argmax_kernel<<<rows, 1024, 0, stream>>>(logits, vocab, out);
  return cudaGetLastError();
}

cudaError_t sample_rows(const float* logits, int32_t rows, int32_t vocab, const SampleRow* params, int32_t* out,
                        cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  sample_kernel<<<rows, kSampleThreads, 0, stream>>>(logits, vocab, params, out);
  return cudaGetLastError();
}

cudaError_t apply_penalties(float* logits, int32_t vocab, const PenaltyEntry* entries, int32_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  penalties_kernel<<<(n + 255) / 256, 256, 0, stream>>>(logits, vocab, entries, n);
  return cudaGetLastError();
}

}  // namespace ember::gpu
