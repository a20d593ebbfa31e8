// Qwen2 / Qwen2.5 (general.architecture = "qwen2"): Llama's layer with biases
// on Q, K and V, and NEOX RoPE (llama.cpp: src/models/qwen2.cpp).
#include "core/model/arch/decoder.h"
#include "core/model/arch/registry.h"

namespace ember {

namespace {

class Qwen2Forward final : public Decoder {
 public:
  using Decoder::Decoder;

 private:
  void layers(Pass& p, int32_t n_layers) override {
    for (int32_t il = 0; il < n_layers; ++il) llama_layer(p, il, /*bias=*/true, /*head_norm=*/false);
  }
};

void load_hparams(const gguf::GgufFile&, const std::string&, ModelConfig& c) { c.rope_style = RopeStyle::kNeox; }

void load_layer(const TensorGetter& get, const ModelConfig& c, const std::string& p, LayerWeightDescs& l) {
  load_llama_layer(get, c, p, l);
  const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  l.bq = get(p + "attn_q.bias", q_dim, 1, true);
  l.bk = get(p + "attn_k.bias", kv_dim, 1, true);
  l.bv = get(p + "attn_v.bias", kv_dim, 1, true);
}

}  // namespace

EMBER_ARCHITECTURE(qwen2, {"qwen2", load_hparams, load_layer, make_decoder<Qwen2Forward>, nullptr})

}  // namespace ember
