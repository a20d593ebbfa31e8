// The architectures Ember runs, by GGUF `general.architecture`. Each is one
// file in this folder: its hyperparameters, its tensor names and its forward
// pass (a layer loop built from the shared blocks of decoder.h), defining
// `architecture_<name>()` with EMBER_ARCHITECTURE; adding one is that file
// and its name in the list of registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/backend/backend.h"
#include "core/model/forward.h"
#include "core/model/model.h"

namespace ember {

namespace gguf {
class GgufFile;
}

struct Architecture {
  const char* name;  // general.architecture
  // Reads what the architecture adds to the generic keys (`prefix` is
  // "<name>."): variations, sliding window, RoPE style. Throws ember::Error.
  void (*load_hparams)(const gguf::GgufFile& file, const std::string& prefix, ModelConfig& config);
  // Reads one layer's tensors (`prefix` is "blk.N."). Throws ember::Error.
  void (*load_layer)(const TensorGetter& get, const ModelConfig& config, const std::string& prefix,
                     LayerWeightDescs& layer);
  // Uploads the model's weights to `backend` (whose KV pool is initialised
  // with `block_size`) and returns its forward pass.
  std::unique_ptr<Forward> (*make_forward)(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size);
  // The chat template used when the file has none (jinja, as the model's
  // makers publish it), or nullptr.
  const char* default_chat_template;
};

// Defines an architecture's registry entry (in its own file).
#define EMBER_ARCHITECTURE(id, ...)                        \
  const Architecture& architecture_##id() {                \
    static const Architecture kArchitecture = __VA_ARGS__; \
    return kArchitecture;                                  \
  }

// nullptr when the architecture is not supported.
const Architecture* find_architecture(std::string_view name);
// "llama, ..." for error messages.
std::string supported_architectures();

// A forward pass of class T (a Decoder) for make_forward.
template <typename T>
std::unique_ptr<Forward> make_decoder(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size) {
  return std::make_unique<T>(std::move(model), backend, block_size);
}

}  // namespace ember
