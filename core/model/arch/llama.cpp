// Llama (general.architecture = "llama"; also Mistral, SmolLM, TinyLlama):
// pre-norm attention and a SwiGLU FFN, each with a residual (llama.cpp:
// src/models/llama.cpp). Llama 3.1/3.2 RoPE scaling is the optional
// rope_freqs tensor, which the generic loader reads. Mistral's GGUF files are
// "llama" (llama.cpp, like Hugging Face for v0.2 and later, attends over the
// whole context: no sliding window).
#include "core/model/arch/decoder.h"
#include "core/model/arch/registry.h"

namespace ember {

namespace {

class LlamaForward final : public Decoder {
 public:
  using Decoder::Decoder;

 private:
  void layers(Pass& p, int32_t n_layers) override {
    for (int32_t il = 0; il < n_layers; ++il) llama_layer(p, il, /*bias=*/false, /*head_norm=*/false);
  }
};

void load_hparams(const gguf::GgufFile&, const std::string&, ModelConfig&) {}

}  // namespace

EMBER_ARCHITECTURE(llama, {"llama", load_hparams, load_llama_layer, make_decoder<LlamaForward>, nullptr})

}  // namespace ember
