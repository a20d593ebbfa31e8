#include "core/model/arch/registry.h"

#include "core/model/arch/llama.h"

namespace ember {

namespace {
template <typename F>
std::unique_ptr<Forward> make(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size) {
  return std::make_unique<F>(std::move(model), backend, block_size);
}

constexpr Architecture kArchitectures[] = {
    {"llama", make<LlamaForward>},
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
