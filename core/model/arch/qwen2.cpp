// Qwen2 / Qwen2.5 (general.architecture = "qwen2"): the shared decoder with
// biases on Q, K and V and NEOX RoPE (llama.cpp: src/models/qwen2.cpp).
#include <string>

#include "core/model/arch/registry.h"
#include "core/model/model.h"

namespace ember {

void load_qwen2_hparams(const gguf::GgufFile&, const std::string&, ModelConfig& c) {
  c.rope_style = RopeStyle::kNeox;
  c.qkv_bias = true;
}

}  // namespace ember
