// core::Model: an immutable loaded model — the mapped GGUF, its Llama-family
// hyperparameters, weight descriptors, tokenizer and chat template. Shared by
// any number of engines and threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"

namespace ember {

namespace gguf {
class GgufFile;
}
class Tokenizer;
class ChatTemplate;

// Hyperparameters of a Llama-architecture model, all read from GGUF metadata.
struct LlamaConfig {
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;
  int32_t n_embd = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t n_ff = 0;
  int32_t rope_dim = 0;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
};

struct LayerWeightDescs {
  WeightDesc attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
};

class Model {
 public:
  // Loads and validates a GGUF model. Throws ember::Error.
  static std::shared_ptr<Model> load(const std::string& path, bool use_mmap = true);
  ~Model();

  const std::string& architecture() const { return architecture_; }
  const std::string& name() const { return name_; }
  const LlamaConfig& config() const { return config_; }
  uint64_t n_params() const { return n_params_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // nullptr when the model has no template or it cannot be parsed;
  // chat_template_error() then says why.
  const ChatTemplate* chat_template() const { return chat_template_.get(); }
  const std::string& chat_template_error() const { return chat_template_error_; }

  const WeightDesc& token_embd() const { return token_embd_; }
  const WeightDesc& output_norm() const { return output_norm_; }
  const WeightDesc& output() const { return output_; }  // token_embd when tied
  const std::vector<LayerWeightDescs>& layers() const { return layers_; }

 private:
  Model() = default;
  void load_config();
  void load_weights();

  std::unique_ptr<gguf::GgufFile> file_;
  std::vector<uint8_t> owned_bytes_;  // when not memory-mapped
  std::string architecture_, name_;
  LlamaConfig config_;
  uint64_t n_params_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::string chat_template_error_;
  WeightDesc token_embd_, output_norm_, output_;
  std::vector<LayerWeightDescs> layers_;
};

}  // namespace ember
