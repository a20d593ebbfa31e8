// The architectures Ember runs, by GGUF `general.architecture`. Adding one
// means one file in this folder (its Forward) and one line in registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/backend/backend.h"
#include "core/model/forward.h"

namespace ember {

class Model;

struct Architecture {
  const char* name;  // general.architecture
  // Uploads the model's weights to `backend` (whose KV pool is initialised
  // with `block_size`) and returns its forward pass.
  std::unique_ptr<Forward> (*make_forward)(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size);
};

// nullptr when the architecture is not supported.
const Architecture* find_architecture(std::string_view name);
// "llama, ..." for error messages.
std::string supported_architectures();

}  // namespace ember
