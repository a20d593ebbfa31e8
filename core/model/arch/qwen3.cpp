// Qwen3 (general.architecture = "qwen3"): Llama's layer without biases, with
// each head of Q and K RMS-normalised (attn_q_norm, attn_k_norm) before NEOX
// RoPE (llama.cpp: src/models/qwen3.cpp). Its head size may differ from
// n_embd / n_heads (attention.key_length), which the generic loader reads.
#include "core/model/arch/decoder.h"
#include "core/model/arch/registry.h"

namespace ember {

namespace {

class Qwen3Forward final : public Decoder {
 public:
  using Decoder::Decoder;

 private:
  void layers(Pass& p, int32_t n_layers) override {
    for (int32_t il = 0; il < n_layers; ++il) llama_layer(p, il, /*bias=*/false, /*head_norm=*/true);
  }
};

void load_hparams(const gguf::GgufFile&, const std::string&, ModelConfig& c) { c.rope_style = RopeStyle::kNeox; }

void load_layer(const TensorGetter& get, const ModelConfig& c, const std::string& p, LayerWeightDescs& l) {
  load_llama_layer(get, c, p, l);
  l.q_norm = get(p + "attn_q_norm.weight", c.head_dim, 1, true);
  l.k_norm = get(p + "attn_k_norm.weight", c.head_dim, 1, true);
}

}  // namespace

EMBER_ARCHITECTURE(qwen3, {"qwen3", load_hparams, load_layer, make_decoder<Qwen3Forward>, nullptr})

}  // namespace ember
