// The decoder forward pass over a Batch, on any Backend: Llama, and the
// variations ModelConfig describes (Mistral, Qwen2's QKV bias, Gemma 3's
// norms, GeGLU and interleaved sliding-window layers). Each step is the op
// llama.cpp's graph applies, in its order, so the CPU's results follow it.
#pragma once

#include <memory>
#include <vector>

#include "core/backend/backend.h"
#include "core/model/batch.h"
#include "core/model/forward.h"
#include "core/model/model.h"

namespace ember {

class LlamaForward final : public Forward {
 public:
  // Uploads the model's weights to `backend`; the KV pool must already be
  // initialised with `block_size`.
  LlamaForward(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size);
  ~LlamaForward() override;

  // Runs the batch; writes logits of batch.logit_rows (in that order) to
  // `logits` (host, logit_rows.size() * n_vocab floats).
  void forward(const Batch& batch, float* logits) override;
  void forward_layers(const Batch& batch, float* logits, int32_t n_layers) override;
  void use_kv_layout(const KvLayerGroups& groups, const KvView* view) override;

 private:
  void ensure_capacity(int32_t rows, int32_t logit_rows);
  void release_buffers();

  struct LayerWeights {
    std::unique_ptr<DeviceWeight> attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
    std::unique_ptr<DeviceWeight> bq, bk, bv, q_norm, k_norm, post_attn_norm, post_ffn_norm;  // when used
  };
  std::shared_ptr<const Model> model_;
  Backend& backend_;
  int32_t block_size_;
  KvLayerGroups groups_;  // the pool's (batches with one table per group use it)
  KvView view_;           // num_kv_heads 0: the pool's own rows
  std::unique_ptr<DeviceWeight> token_embd_, output_norm_, output_;
  std::vector<LayerWeights> layers_;
  std::vector<float> rope_freqs_;  // host copy of rope_freqs.weight (config().rope_freqs)

  int32_t capacity_rows_ = 0, capacity_logits_ = 0;
  float *x_ = nullptr, *h_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr, *gate_ = nullptr,
        *up_ = nullptr, *sel_ = nullptr, *logits_dev_ = nullptr;
};

}  // namespace ember
