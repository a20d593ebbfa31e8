#include "core/model/arch/registry.h"

// Every architecture, in the order error messages list them (one file each).
#define EMBER_ARCHITECTURES(X) X(llama) X(qwen2) X(gemma3) X(qwen3)

namespace ember {

#define EMBER_DECLARE(id) const Architecture& architecture_##id();
EMBER_ARCHITECTURES(EMBER_DECLARE)
#undef EMBER_DECLARE

namespace {
const Architecture* const* all() {
#define EMBER_ENTRY(id) &architecture_##id(),
  static const Architecture* const kAll[] = {EMBER_ARCHITECTURES(EMBER_ENTRY) nullptr};
#undef EMBER_ENTRY
  return kAll;
}
}  // namespace

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture* const* a = all(); *a; ++a) {
    if (name == (*a)->name) return *a;
  }
  return nullptr;
}

std::string supported_architectures() {
  std::string out;
  for (const Architecture* const* a = all(); *a; ++a) {
    if (!out.empty()) out += ", ";
    out += (*a)->name;
  }
  return out;
}

}  // namespace ember
