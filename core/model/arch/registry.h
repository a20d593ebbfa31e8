// The architectures Ember runs, by GGUF `general.architecture`. Adding one
// means one file in this folder (its hyperparameter hook, and its Forward if
// the shared decoder in llama.h cannot express it) and one line in
// registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/backend/backend.h"
#include "core/model/forward.h"

namespace ember {

class Model;
struct ModelConfig;
namespace gguf {
class GgufFile;
}

struct Architecture {
  const char* name;  // general.architecture
  // Reads what the architecture adds to the generic keys (`prefix` is
  // "<name>."): variations, sliding window, RoPE style. Throws ember::Error.
  void (*load_hparams)(const gguf::GgufFile& file, const std::string& prefix, ModelConfig& config);
  // Uploads the model's weights to `backend` (whose KV pool is initialised
  // with `block_size`) and returns its forward pass.
  std::unique_ptr<Forward> (*make_forward)(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size);
  // The chat template used when the file has none (jinja, as the model's
  // makers publish it), or nullptr.
  const char* default_chat_template;
};

// nullptr when the architecture is not supported.
const Architecture* find_architecture(std::string_view name);
// "llama, ..." for error messages.
std::string supported_architectures();

// The hooks of each architecture (one file each).
void load_llama_hparams(const gguf::GgufFile& file, const std::string& prefix, ModelConfig& config);
void load_qwen2_hparams(const gguf::GgufFile& file, const std::string& prefix, ModelConfig& config);
void load_gemma3_hparams(const gguf::GgufFile& file, const std::string& prefix, ModelConfig& config);
extern const char* const kGemmaChatTemplate;

}  // namespace ember
