// The CUDA kernels' host entry points. Implemented in matmul.cu, ops.cu and
// attention.cu; called by cuda_backend.cpp (plain C++). Every function only
// enqueues work on `stream` and returns the launch status
// (cudaGetLastError()); none allocates or synchronises, so all of them may be
// captured into a CUDA graph. Pointers are device pointers unless noted.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/layout.h"

namespace ember::gpu {

// A weight on the device (see layout.h for the layouts).
struct DevWeight {
  DType type = DType::F32;
  int64_t N = 0;                // rows (output features)
  int64_t K = 0;                // cols (input features)
  const uint8_t* qs = nullptr;  // quant types: quants
  const uint8_t* sc = nullptr;  // quant types: block headers
  const void* data = nullptr;   // float types: rows of `stride` elements
  int64_t stride = 0;
};

struct KvView {
  uint16_t* base = nullptr;  // f16 pool, [layer][K|V][block][kv_head][slot][head_dim]
  int32_t num_layers = 0, num_kv_heads = 0, head_dim = 0, block_size = 0, num_blocks = 0;
};

struct MaxSum {
  float m;  // running max of the scores
  float l;  // sum of exp(score - m)
};

// ---------------------------------------------------------------- matmul.cu

// Splits n_blocks GGUF blocks (raw, contiguous) into quants and headers
// (block i -> qs + i * QB, sc + i * header bytes).
cudaError_t split_quant_blocks(DType type, const uint8_t* raw, int64_t n_blocks, uint8_t* qs, uint8_t* sc,
                               cudaStream_t stream);
// x[M][K] -> int8 xq[M][K] + xs[M][K / 32] (K a multiple of 32).
cudaError_t quantize_activations(DType type, const float* x, int64_t M, int64_t K, int8_t* xq, ActScale* xs,
                                 cudaStream_t stream);
// y[M][N] = x . W^T through the GEMV kernels (any M; rows in passes of up to
// kGemvMaxNR). Quant weights read xq/xs (quantize_activations first), float
// weights read x. Every row is computed as it would be for M = 1.
cudaError_t gemv(const DevWeight& w, const float* x, const int8_t* xq, const ActScale* xs, int64_t M, float* y,
                 cudaStream_t stream);
// Rows [row0, row0 + n_rows) of a quant weight to f16, out[n_rows][K].
cudaError_t dequantize_to_f16(const DevWeight& w, int64_t row0, int64_t n_rows, uint16_t* out, cudaStream_t stream);
// n floats to f16 (saturating to +-65504) or bf16 (round to nearest even).
cudaError_t f32_to_f16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);
cudaError_t f32_to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);

// ---------------------------------------------------------------- ops.cu

cudaError_t embed(const DevWeight& table, const int32_t* ids, int32_t n, float* out, cudaStream_t stream);
cudaError_t rms_norm(const float* x, const float* w, int32_t rows, int32_t dim, float eps, float* out,
                     cudaStream_t stream);
// Pair i of a row at position p turns by theta_i, theta_0 = p, theta_{i+1} =
// theta_i * theta_scale in f32 (as the CPU backend and ggml's rope cache).
// freq_scale / factors / neox generalise it as Backend::rope_ext (theta_i
// divided by factors[i] when given, then times freq_scale; NEOX pairs i and
// i + rot_dim/2 instead of 2i and 2i+1).
cudaError_t rope(float* x, const int32_t* positions, float theta_scale, int32_t rows, int32_t num_heads,
                 int32_t head_dim, int32_t rot_dim, cudaStream_t stream, float freq_scale = 1.0f,
                 const float* factors = nullptr, bool neox = false);
// out = gelu_tanh(gate) * up with the gate rounded to f16 and gelu's value
// rounded to f16 (llama.cpp's CPU table), the identity above 10, 0 below -10.
cudaError_t geglu(const float* gate, const float* up, size_t n, float* out, cudaStream_t stream);
cudaError_t scale(float* x, size_t n, float s, cudaStream_t stream);
// x[r, :] += bias[:], rows of dim.
cudaError_t add_bias(float* x, const float* bias, int32_t rows, int32_t dim, cudaStream_t stream);
cudaError_t swiglu(const float* gate, const float* up, size_t n, float* out, cudaStream_t stream);
cudaError_t add(float* x, const float* y, size_t n, cudaStream_t stream);
cudaError_t gather_rows(const float* x, const int32_t* rows, int32_t n, int32_t dim, float* out, cudaStream_t stream);
// One LoRA term (Backend::lora) on n rows: t[m] = round_b(A round_a(x[rows[m]]))
// (a: rank rows of K, b: N rows of rank; F32, F16 or BF16, rows of `stride`
// elements; round_w = the value as the weight's type holds it), then
// y[rows[m]] += (B t[m]) * scale. `t` holds n * rank floats.
cudaError_t lora_term(const DevWeight& a, const DevWeight& b, float scale, const int32_t* rows, int32_t n,
                      const float* x, float* t, float* y, cudaStream_t stream);
cudaError_t kv_store(const KvView& kv, int32_t layer, const float* k, const float* v, const int32_t* slots,
                     int32_t rows, cudaStream_t stream);
// Whole blocks, all layers, K and V: src[i] -> dst[i]; the caller guarantees
// that no dst is also a src (otherwise it launches one copy at a time).
cudaError_t kv_copy_blocks(const KvView& kv, const int32_t* src, const int32_t* dst, int32_t n, cudaStream_t stream);

// Rotates the keys of n whole blocks (every layer) by the angles cs/sn
// (rot_dim / 2 each): RoPE(p) k -> RoPE(p + delta) k. Block ids outside the
// pool are skipped.
// cs/sn: per layer (layer_stride floats apart; 0: one table for all) the
// pairs' cos and sin; NEOX pairs i and i + rot_dim/2.
cudaError_t kv_rope_shift(const KvView& kv, const int32_t* blocks, int32_t n, const float* cs, const float* sn,
                          int32_t rot_dim, cudaStream_t stream, int32_t layer_stride = 0, bool neox = false);

// Sampling. out: device, rows entries.
cudaError_t argmax_rows(const float* logits, int32_t rows, int32_t vocab, int32_t* out, cudaStream_t stream);
struct SampleRow {
  float temperature;
  int32_t top_k;  // already clamped to [1, kMaxTopK]
  float top_p;
  float min_p;
  double uniform;
};
inline constexpr int kMaxTopK = 1024;
cudaError_t sample_rows(const float* logits, int32_t rows, int32_t vocab, const SampleRow* params, int32_t* out,
                        cudaStream_t stream);
struct PenaltyEntry {
  int32_t row, token, count;
  float repeat, frequency, presence;
};
cudaError_t apply_penalties(float* logits, int32_t vocab, const PenaltyEntry* entries, int32_t n, cudaStream_t stream);

// ---------------------------------------------------------------- attention.cu

struct AttnLaunch {
  KvView kv;
  int32_t layer = 0;
  const float* q = nullptr;  // [rows][num_heads * head_dim]
  float* out = nullptr;      // same shape
  const AttnTileDesc* tiles = nullptr;
  int32_t n_tiles = 0;
  int32_t rows_per_tile = 1;
  const int32_t* kv_len = nullptr;        // per batch row
  const int32_t* block_tables = nullptr;  // packed
  const int32_t* tree_slots = nullptr;    // token-tree rows' slot maps (AttnTileDesc::map_off)
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  int32_t window = 0;  // sliding window: row r skips slots below kv_len[r] - window (0: none)
  int32_t n_splits = 1, tiles_per_split = 1;
  int32_t n_rows = 0;         // batch rows (partials are indexed by row * num_heads + head)
  float* part_acc = nullptr;  // [n_splits][n_rows * num_heads][head_dim] when n_splits > 1
  MaxSum* part_ml = nullptr;  // [n_splits][n_rows * num_heads]
};
// Once per device before the first attention() (sets the shared-memory limit
// of the head_dim 256 variant).
cudaError_t attention_init();
// rows_per_tile: the largest n_rows of any tile (picks the warps per block).
cudaError_t attention(const AttnLaunch& a, cudaStream_t stream);

}  // namespace ember::gpu
