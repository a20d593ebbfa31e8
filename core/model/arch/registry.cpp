#include "core/model/arch/registry.h"

#include "core/model/arch/llama.h"

namespace ember {

namespace {
std::unique_ptr<Forward> make_decoder(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size) {
  return std::make_unique<LlamaForward>(std::move(model), backend, block_size);
}

// Mistral's GGUF files are "llama" (llama.cpp, like Hugging Face for v0.2
// and later, attends over the whole context: no sliding window).
const Architecture kArchitectures[] = {
    {"llama", load_llama_hparams, make_decoder, nullptr},
    {"qwen2", load_qwen2_hparams, make_decoder, nullptr},
    {"gemma3", load_gemma3_hparams, make_decoder, kGemmaChatTemplate},
};
}  // namespace

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture& a : kArchitectures) {
    if (name == a.name) return &a;
  }
  return nullptr;
}

std::string supported_architectures() {
  std::string out;
  for (const Architecture& a : kArchitectures) {
    if (!out.empty()) out += ", ";
    out += a.name;
  }
  return out;
}

}  // namespace ember
