// The backend interface: what the core asks of a device. cpu/ implements it
// in-process; gpu/ implements it in the libember_cuda.so plugin. Nothing in
// core/ knows which device runs it.
//
// Activations are f32 row-major matrices in device memory (`float*` that the
// backend allocated); the core never dereferences them, it only passes them
// back. Host-side descriptors (token ids, positions, block tables) are passed
// by value/host pointer and the backend moves them to the device as needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor/types.h"
#include "core/util/status.h"

namespace ember {

// A weight as stored in the GGUF: `rows` rows of `cols` elements of `type`.
struct WeightDesc {
  DType type = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* host_data = nullptr;  // inside the model's mapping
};

// A weight resident on the device (the CPU backend simply points at the mapping).
class DeviceWeight {
 public:
  virtual ~DeviceWeight() = default;
  WeightDesc desc;
};

// Bytes of one cached K or V row of head_dim elements: f16 values, or Q8_0
// blocks (32 elements: an f16 scale d and 32 int8 q, value d * q; head_dim
// a multiple of 32). Other types are not KV types (0).
inline size_t kv_row_bytes(DType dtype, int64_t head_dim) {
  if (dtype == DType::F16) return static_cast<size_t>(head_dim) * 2;
  if (dtype == DType::Q8_0 && head_dim % 32 == 0) return static_cast<size_t>(head_dim / 32) * 34;
  return 0;
}

// Geometry of the paged KV cache: per layer, K and V are arrays of
// [num_blocks][num_kv_heads][block_size] rows of head_dim elements of
// `dtype` (kv_row_bytes each).
struct KvGeometry {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  DType dtype = DType::F16;  // F16, or Q8_0 (Backend::supports_kv_dtype)
  size_t row_bytes() const { return kv_row_bytes(dtype, head_dim); }
  size_t bytes_per_block() const {  // all layers, K and V
    return static_cast<size_t>(num_layers) * 2 * num_kv_heads * block_size * row_bytes();
  }
};

// Another model's K/V rows inside the pool's blocks (a draft model's KV in the
// target engine's pool): per pool layer and block, num_kv_heads x block_size
// x head_dim f16 at the start of the pool's chunk for that layer and block,
// the same arrangement as the pool's own (num_kv_heads * head_dim <= the
// pool's). Attention reads such rows when AttentionParams' num_kv_heads and
// head_dim are the view's.
struct KvView {
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
};

// One sequence's view in an attention call: the rows of the batch that
// belong to it and the cache blocks that hold its keys/values.
struct AttentionSeq {
  int32_t first_row = 0;                 // first batch row of this sequence
  int32_t n_rows = 0;                    // its rows are [first_row, first_row + n_rows)
  const int32_t* block_table = nullptr;  // host pointer, n_blocks entries
  int32_t n_blocks = 0;
  // Cache slots [hole_begin, hole_end) are skipped (tokens a window/sink
  // cache policy evicted next to its sinks); empty by default.
  int32_t hole_begin = 0;
  int32_t hole_end = 0;
};

struct AttentionParams {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  float scale = 1.0f;
  // Row r attends to cache slots [0, kv_len[r]) of its sequence: the causal
  // mask expressed by cache slot (cache slot == position inside the cache).
  const int32_t* kv_len = nullptr;  // host, one per batch row
  // Per batch row (host, may be null = all 0): 1 for a row whose token the
  // engine generated (fed back one at a time), 0 for a prompt or scored row.
  // A backend may sum the two kinds in different orders: the CPU follows
  // llama.cpp, whose one-token decode and batched evaluation differ in their
  // last bits, so that each kind of row equals the reference's to the bit.
  // A row's result never depends on the other rows or sequences of the step.
  const uint8_t* decode_rows = nullptr;
  // Sliding-window (local) attention: row r also skips the slots below
  // kv_len[r] - window, so it sees at most `window` slots (itself included).
  // 0: no window.
  int32_t window = 0;
  // Token trees (speculative verification), per batch row (host; null = no
  // tree rows): a row with tree_from[r] >= 0 sees the cache through a slot
  // map: index i < tree_from[r] is slot i as usual, index i in
  // [tree_from[r], kv_len[r]) is slot tree_slots[tree_begin[r] + i -
  // tree_from[r]] (the row's ancestors in the tree, root first, then the row
  // itself). Every index is summed where it would be for a sequence that
  // holds those tokens in consecutive slots, so a tree row computes exactly
  // what the same path decoded one token at a time computes.
  const int32_t* tree_from = nullptr;
  const int32_t* tree_begin = nullptr;
  const int32_t* tree_slots = nullptr;
};

// How rope_ext rotates: llama.cpp's ggml_rope_ext without YaRN
// (ext_factor 0, attn_factor 1). theta_i = freq_scale * (pos * freq_base^(-2i/rot_dim) / freq_factors[i]).
struct RopeSpec {
  int32_t rot_dim = 0;  // the first rot_dim dims of each head rotate
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  bool neox = false;                    // pairs (i, i + rot_dim/2) instead of (2i, 2i+1)
  const float* freq_factors = nullptr;  // host, rot_dim/2 divisors, or null
};

// What a backend's kernels support; the engine checks a model against it
// before loading the model's weights onto the backend.
struct BackendLimits {
  int32_t max_head_dim = 256;
  int32_t max_gqa_group = 16;     // query heads per KV head
  int32_t head_dim_multiple = 8;  // head_dim must be a multiple of this
};

// One LoRA adapter's product on some rows of a batch (Backend::lora).
struct LoraTerm {
  const DeviceWeight* a = nullptr;  // rank rows of K (lora_a)
  const DeviceWeight* b = nullptr;  // N rows of rank (lora_b)
  float scale = 1.0f;
  const int32_t* rows = nullptr;  // host: the batch rows it applies to
  int32_t n_rows = 0;
  // The rows are one-token decodes (a sequence's only row in the step):
  // the CPU sums them in llama.cpp's one-token order, others in its batched
  // order (as Backend::matmul's rows_are_decodes).
  bool decodes = false;
  // Where its products go: rows of b->desc.rows floats; null: the call's y.
  // (Q, K and V read the same x: one call for the three.)
  float* y = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual BackendLimits limits() const { return {}; }
  // True when its buffers (alloc) are host memory and its weights are read
  // in place from the model's host image (the CPU backend); false when
  // upload_weight copies a weight's bytes to a device.
  virtual bool host_memory() const { return false; }
  // Gives the system back the host memory freed since the last call (the
  // decoder calls it once a prompt's buffers are freed). Never throws.
  virtual void trim_host_memory() {}

  // Memory for activations (f32 unless noted). Freed by free_buffer, which
  // never throws (destructors call it, also at process exit).
  virtual void* alloc(size_t bytes) = 0;
  virtual void free_buffer(void* ptr) = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;

  virtual std::unique_ptr<DeviceWeight> upload_weight(const WeightDesc& desc) = 0;

  // The KV pool (one allocation for all layers).
  virtual void kv_init(const KvGeometry& geometry) = 0;
  // Copies whole blocks (copy-on-write, compaction): src[i] -> dst[i].
  virtual void kv_copy_blocks(const int32_t* src, const int32_t* dst, int32_t n) = 0;

  // out[i, :] = table[ids[i], :] (dequantized to f32).
  virtual void embed(const DeviceWeight& table, const int32_t* ids, int32_t n, float* out) = 0;
  // out[r] = x[r] / rms(x[r]) * weight, rows of `dim`.
  virtual void rms_norm(const float* x, const DeviceWeight& weight, int32_t rows, int32_t dim, float eps,
                        float* out) = 0;
  // y[M, N] = x[M, K] . W^T. With `rows_are_decodes`, the rows are single
  // tokens of different sequences: the backend must compute each row exactly
  // as it would for M = 1 (so batching never changes a sequence's output).
  virtual void matmul(const DeviceWeight& w, const float* x, int32_t M, float* y, bool rows_are_decodes) = 0;
  // y[i] = x . W_i^T for n (<= 4) weights with the same K that read the same
  // x (Q/K/V, gate/up), each exactly as matmul() computes it; a backend may
  // run them as one pass (the CPU: one parallel region instead of n).
  virtual void matmul_group(const DeviceWeight* const* w, float* const* y, int32_t n, const float* x, int32_t M,
                            bool rows_are_decodes) {
    for (int32_t i = 0; i < n; ++i) matmul(*w[i], x, M, y[i], rows_are_decodes);
  }
  // Rotates the first `rot_dim` dims of each head in place; GGUF "llama"
  // layout (pairs of adjacent elements). positions: host, one per row.
  virtual void rope(float* x, const int32_t* positions, int32_t rows, int32_t num_heads, int32_t head_dim,
                    int32_t rot_dim, float freq_base) = 0;
  // Writes K/V rows (f32 [rows, num_kv_heads*head_dim]) into the cache at
  // slots[r] = block * block_size + offset.
  virtual void kv_store(int32_t layer, const float* k, const float* v, const int32_t* slots, int32_t rows) = 0;
  // out[rows, num_heads*head_dim] = softmax(q K^T * scale) V per sequence,
  // over the paged cache of `layer`. With params.num_kv_heads and head_dim
  // other than the pool's (at most its row width), the cache holds rows of a
  // KvView (supports_kv_views()).
  virtual void attention(int32_t layer, const float* q, const AttentionSeq* seqs, int32_t n_seqs,
                         const AttentionParams& params, float* out) = 0;
  // Window/sink cache policies need kv_rope_shift and attention that skips
  // AttentionSeq holes; a backend that provides both says so here (sessions
  // with such a policy are refused otherwise). kv_read/write_block serve
  // session save/restore.
  virtual bool supports_cache_policies() const { return false; }
  // K-shift: re-rotates the keys of whole blocks, every layer, by `delta`
  // positions (RoPE(p) k becomes RoPE(p + delta) k; same layout as rope()).
  // Used when a cache policy moves kept tokens to lower positions.
  virtual void kv_rope_shift(const int32_t* blocks, int32_t n, int32_t delta, int32_t rot_dim, float freq_base) {
    (void)blocks, (void)n, (void)delta, (void)rot_dim, (void)freq_base;
    unsupported("kv_rope_shift");
  }
  // K-shift for any RoPE: layers[l] is layer l's (the base may differ by
  // layer, NEOX pairs, scaled frequencies); rotation by delta positions, angles
  // delta * freq_scale * base^(-2i/rot_dim) / factors[i]. The default serves
  // the case kv_rope_shift handles (one plain spec for all layers).
  virtual void kv_rope_shift_layers(const int32_t* blocks, int32_t n, int32_t delta, const RopeSpec* layers,
                                    int32_t n_layers) {
    for (int32_t l = 0; l < n_layers; ++l) {
      const RopeSpec& r = layers[l];
      if (r.neox || r.freq_scale != 1.0f || r.freq_factors || r.rot_dim != layers[0].rot_dim ||
          r.freq_base != layers[0].freq_base) {
        unsupported("kv_rope_shift_layers");
      }
    }
    if (n_layers > 0) kv_rope_shift(blocks, n, delta, layers[0].rot_dim, layers[0].freq_base);
  }
  // Copies one block (every layer, K then V: KvGeometry::bytes_per_block()
  // bytes, host memory) out of or into the pool: session save and restore.
  virtual void kv_read_block(int32_t block, void* dst) {
    (void)block, (void)dst;
    unsupported("kv_read_block");
  }
  virtual void kv_write_block(int32_t block, const void* src) {
    (void)block, (void)src;
    unsupported("kv_write_block");
  }
  // ---- Other models' K/V in this pool (plugin ABI 6): a backend that can
  // store and attend over KvView rows (and K-shift them) says so; the engine
  // then keeps a draft model's KV in its own pool instead of a second one.
  virtual bool supports_kv_views() const { return false; }
  // kv_store of rows laid out as `view` (view.num_kv_heads * view.head_dim
  // floats per row).
  virtual void kv_store_view(const KvView& view, int32_t layer, const float* k, const float* v, const int32_t* slots,
                             int32_t rows) {
    (void)view, (void)layer, (void)k, (void)v, (void)slots, (void)rows;
    unsupported("kv_store_view");
  }
  // kv_rope_shift_layers over the first n_layers pool layers of the blocks,
  // holding rows laid out as `view`.
  virtual void kv_rope_shift_view(const KvView& view, const int32_t* blocks, int32_t n, int32_t delta,
                                  const RopeSpec* layers, int32_t n_layers) {
    (void)view, (void)blocks, (void)n, (void)delta, (void)layers, (void)n_layers;
    unsupported("kv_rope_shift_view");
  }

  // out = silu(gate) * up, n elements.
  virtual void swiglu(const float* gate, const float* up, size_t n, float* out) = 0;

  // ---- Operations of architectures beyond Llama (plugin ABI 4) ----
  // rope() generalised (NEOX pairs, frequency scale and factors). The default
  // serves the plain case through rope().
  virtual void rope_ext(float* x, const int32_t* positions, int32_t rows, int32_t num_heads, int32_t head_dim,
                        const RopeSpec& spec) {
    if (spec.neox || spec.freq_scale != 1.0f || spec.freq_factors) unsupported("rope_ext");
    rope(x, positions, rows, num_heads, head_dim, spec.rot_dim, spec.freq_base);
  }
  // out = gelu(gate) * up, n elements; gelu's tanh approximation as llama.cpp
  // computes it (on the CPU through its f16 table).
  virtual void geglu(const float* gate, const float* up, size_t n, float* out) {
    (void)gate, (void)up, (void)n, (void)out;
    unsupported("geglu");
  }
  // x *= s, n elements.
  virtual void scale(float* x, size_t n, float s) {
    (void)x, (void)n, (void)s;
    unsupported("scale");
  }
  // x[r, :] += bias[:] for `rows` rows of `dim` (bias: an F32 weight of dim).
  virtual void add_bias(float* x, const DeviceWeight& bias, int32_t rows, int32_t dim) {
    (void)x, (void)bias, (void)rows, (void)dim;
    unsupported("add_bias");
  }
  // x += y, n elements.
  virtual void add(float* x, const float* y, size_t n) = 0;
  // Gathers rows: out[i] = x[rows[i]] (rows of `dim`).
  virtual void gather_rows(const float* x, const int32_t* rows, int32_t n, int32_t dim, float* out) = 0;

  // ---- LoRA adapters (plugin ABI 7)
  // For each term in order and each of its rows r: y[r] += scale * (B (A
  // x[r])), x rows of K = a->desc.cols (every term the same K), y (the
  // term's own, else the call's) rows of N = b->desc.rows. A and B are F32, F16 or BF16; each product reads
  // its input rounded to the weight's type, as llama.cpp's CPU does (ggml's
  // vec_dot_type), and every row is computed on its own, whatever else the
  // call holds (a row's result never depends on the other rows or terms).
  virtual void lora(const LoraTerm* terms, int32_t n_terms, const float* x, float* y) {
    (void)terms, (void)n_terms, (void)x, (void)y;
    unsupported("lora");
  }

  // ---- Quantized KV (plugin ABI 8): the element types kv_init accepts in
  // KvGeometry::dtype (F16 always; Q8_0 where the backend stores, attends
  // over, K-shifts and copies such rows).
  virtual bool supports_kv_dtype(DType dtype) const { return dtype == DType::F16; }

 protected:
  [[noreturn]] void unsupported(const char* op) const {
    fail(StatusCode::kUnsupported, name() + ": " + op + " is not implemented by this backend");
  }
};

}  // namespace ember
