// The shared blocks of a decoder-only transformer's forward pass over a
// Batch, on any Backend. Each architecture's file (core/model/arch/<name>.cpp)
// builds its own layer loop from them (Decoder::layers), in the order of
// llama.cpp's graph for that architecture (src/models/<name>.cpp), so the
// CPU's results follow it; the batch's preparation (cache slots, attention
// views, matmul segments), the embeddings and the output head are common.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/backend/backend.h"
#include "core/model/batch.h"
#include "core/model/forward.h"
#include "core/model/lora.h"
#include "core/model/model.h"

namespace ember {

// The tensors every Llama-family layer has (blk.N.attn_norm, attn_q/k/v,
// attn_output, ffn_norm, ffn_gate/up/down); `prefix` is "blk.N.".
void load_llama_layer(const TensorGetter& get, const ModelConfig& c, const std::string& prefix, LayerWeightDescs& l);

class Decoder : public Forward {
 public:
  // Uploads the model's weights to `backend`; the KV pool must already be
  // initialised with `block_size`.
  Decoder(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size);
  ~Decoder() override;
  void forward(const Batch& batch, float* logits, float* embd = nullptr) override;
  void forward_layers(const Batch& batch, float* logits, int32_t n_layers) override;
  void use_kv_layout(const KvLayerGroups& groups, const KvView* view) override;
  void set_parallel(const ParallelContext& ctx) override;

 protected:
  struct LayerWeights {
    std::unique_ptr<DeviceWeight> attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
    std::unique_ptr<DeviceWeight> bq, bk, bv, q_norm, k_norm, post_attn_norm, post_ffn_norm;  // when the file has them
  };
  // One batch, prepared: its rows, the cache slots and attention views of
  // each layer group, and the matmul segments (decode rows together, each
  // sequence's run of other rows alone: a row's result depends only on its
  // own token and sequence).
  struct Pass {
    int32_t n = 0;  // rows
    const Batch* batch = nullptr;
    bool grouped = false;
    std::vector<std::vector<int32_t>> phys_slots;  // per group, per row
    std::vector<std::vector<AttentionSeq>> seqs;   // per group, per sequence
    struct Segment {
      int32_t first, rows;
      bool decodes;
    };
    std::vector<Segment> segments;
    std::vector<uint8_t> decode;  // per row: computed as a decode (decode_row)
    AttentionParams ap;
    RopeSpec rope;
    // Rows computed with LoRA adapters, grouped by adapter set (a set's
    // rows, in batch order, wherever its sequences sit in the batch).
    struct LoraGroup {
      const LoraSet* set;
      bool decodes;  // its rows are decode rows (decode_row)
      std::vector<int32_t> rows;
    };
    std::vector<LoraGroup> lora_groups;
    std::vector<LoraTerm> lora_terms;  // one product's terms (reused)
  };
  // The architecture's layers [0, n_layers): the residual stream x() holds
  // the rows' embeddings on entry and the last layer's output on return.
  virtual void layers(Pass& p, int32_t n_layers) = 0;

  // ---- blocks (every buffer holds p.n rows)
  const ModelConfig& config() const { return model_->config(); }  // this rank's shard's, when split
  const ModelShard& shard() const { return model_->shard_spec(); }
  const LayerWeights& layer(int32_t il) const { return layers_[static_cast<size_t>(il)]; }
  float* x() { return x_; }  // the residual stream (n_embd per row)
  float* h() { return h_; }  // a block's input / output (n_embd, or q_dim)
  // out = rms_norm(in) * w over rows of n_embd (in == out allowed).
  void norm(Pass& p, const DeviceWeight& w, const float* in, float* out);
  // Scales the residual stream (Gemma's embedding scale).
  void scale_x(Pass& p, float s);
  // q, k, v = W_{q,k,v} h, one backend call per segment.
  void qkv(Pass& p, const LayerWeights& w);
  // q, k, v += their biases (Qwen2).
  void qkv_bias(Pass& p, const LayerWeights& w);
  // Every head of q and k RMS-normalised with its own weight (Gemma 3, Qwen3).
  void qk_norm(Pass& p, const LayerWeights& w);
  // RoPE on q and k at the rows' positions: the model's base, style and
  // scaling, or `base` / `freq_scale` for this layer (sliding-window layers).
  void rope(Pass& p, float base, float freq_scale);
  // Queries scaled before attention (the softmax then takes them as they are).
  void scale_q(Pass& p, float s);
  // Writes k, v to layer il's cache and attends (window 0: global); then
  // h = W_o attn.
  void attention(Pass& p, int32_t il, const LayerWeights& w, int32_t window);
  // x += h.
  void residual(Pass& p);
  // h = W_down (act(W_gate h) * W_up h): SwiGLU (silu) or GeGLU (gelu).
  void glu_ffn(Pass& p, const LayerWeights& w, bool gelu);
  // The decoder layer most architectures share (Llama, Mistral, Qwen2,
  // Qwen3): pre-norm attention and a SwiGLU FFN, each with a residual;
  // `bias` adds Qwen2's QKV biases, `head_norm` Qwen3's per-head norms.
  void llama_layer(Pass& p, int32_t il, bool bias, bool head_norm);

 private:
  void ensure_capacity(int32_t rows, int32_t logit_rows);
  void run(const Batch& batch, float* logits, float* embd, int32_t n_layers);
  // The final norm of the batch's embedding rows and the output head of its
  // logit rows, from the residual stream (the last layer's output).
  void outputs(Pass& p, float* logits, float* embd);
  void head_logits(float* logits, int32_t n_out);
  static bool decode_row(const Batch& batch, const BatchSeq& bs, int32_t r);
  // ---- a model split across ranks (set_parallel)
  // A tensor- or pipeline-parallel step.
  void run_split(const Batch& batch, float* logits, float* embd);
  // x = the rows' embeddings from this rank's vocabulary rows, summed over
  // the ranks (each token's row lives on exactly one).
  void embed_split(Pass& p);
  // buf[0, n) summed over the tensor-parallel ranks (nothing when not split).
  void all_reduce(float* buf, size_t n);
  // Exact tensor parallelism: each rank's `rows` x `dim` part gathered into
  // full rows (rows x tp*dim, the ranks' parts side by side in rank order).
  void gather_parts(const float* part, int32_t rows, int32_t dim, float* full);
  bool exact_tp() const { return par_.comm && par_.shard.tp > 1 && par_.shard.exact; }
  // W x through an exactly split matrix (its rows: n_embd / tp outputs): x's
  // parts gathered into full rows, this rank's outputs, h_ gathered.
  void exact_matmul(Pass& p, const DeviceWeight& w, const float* part, int32_t part_dim);
  void send_rows(const float* buf, size_t n, int peer, int tag);
  void recv_rows(float* buf, size_t n, int peer, int tag);
  ParallelContext par_;
  bool host_buffers_ = true;  // the backend's buffers are host memory (the CPU's)
  std::vector<float> scratch_, gathered_;
  // The head's rows in computing order (indices into logit_rows), their
  // batch rows, and the logits before they go back to output order.
  std::vector<int32_t> head_rows_, head_src_;
  std::vector<uint8_t> head_kind_;  // per batch row: 1 = the head computes it as a decode
  std::vector<float> head_tmp_;
  std::vector<int32_t> local_ids_, gather_index_;
  // Exact tensor parallelism's buffers: a gathered input (full rows), this
  // rank's outputs, the ranks' parts as they arrive.
  float *full_in_ = nullptr, *out_part_ = nullptr, *parts_ = nullptr;
  void release_buffers();
  void prepare(const Batch& batch, Pass& p);
  void matmul(Pass& p, const DeviceWeight& w, const float* in, float* out);
  // Each out += the LoRA terms of layer il's matrix for the rows that have
  // adapters, the matrices reading the same `in` in one Backend::lora call
  // (nothing without adapters).
  void lora(Pass& p, int32_t il, std::initializer_list<std::pair<LoraTarget, float*>> outs, const float* in);
  int32_t layer_index(const LayerWeights& w) const { return static_cast<int32_t>(&w - layers_.data()); }
  // The adapters' weights on the backend, per adapter in use (dropped once
  // no batch's set holds the adapter any more).
  struct DeviceLora {
    std::shared_ptr<const LoraAdapter> adapter;
    std::vector<std::unique_ptr<DeviceWeight>> a, b;  // per (layer, target) slot; null: none
  };
  const DeviceLora& device_lora(const std::shared_ptr<const LoraAdapter>& adapter);
  std::unordered_map<const LoraAdapter*, DeviceLora> lora_dev_;

  std::shared_ptr<const Model> model_;
  Backend& backend_;
  int32_t block_size_;
  KvLayerGroups groups_;  // the pool's (batches with one table per group use it)
  KvView view_;           // num_kv_heads 0: the pool's own rows
  std::unique_ptr<DeviceWeight> token_embd_, output_norm_, output_;
  std::vector<LayerWeights> layers_;
  std::vector<float> rope_freqs_;  // host copy of rope_freqs.weight (config().rope_freqs)

  int32_t capacity_rows_ = 0, capacity_logits_ = 0;
  int32_t small_steps_ = 0;  // steps in a row that used a quarter of the buffers or less
  float *x_ = nullptr, *h_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr, *gate_ = nullptr,
        *up_ = nullptr, *sel_ = nullptr, *logits_dev_ = nullptr;
};

}  // namespace ember
