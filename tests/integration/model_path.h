// Locates the default model for integration tests; tests skip when absent.
#pragma once

#include <cstdlib>
#include <fstream>
#include <string>

namespace ember::test {

inline std::string default_model_path() {
  std::string home;
  if (const char* e = std::getenv("EMBER_HOME"); e && *e) {
    home = e;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    home = std::string(h) + "/.cache/ember";
  }
  return home + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline bool model_available() { return std::ifstream(default_model_path()).good(); }

// Gemma 3 270M Q4_K_M (bash tools/fetch_model.sh gemma3).
inline std::string gemma3_model_path() {
  const std::string d = default_model_path();
  return d.substr(0, d.rfind('/') + 1) + "gemma-3-270m-q4_k_m.gguf";
}
inline bool gemma3_available() { return std::ifstream(gemma3_model_path()).good(); }

}  // namespace ember::test

#define EMBER_REQUIRE_MODEL()                                                                    \
  do {                                                                                           \
    if (!::ember::test::model_available()) {                                                     \
      if (std::getenv("CI")) FAIL() << "model missing: " << ::ember::test::default_model_path(); \
      GTEST_SKIP() << "model not found at " << ::ember::test::default_model_path();              \
    }                                                                                            \
  } while (0)

#define EMBER_REQUIRE_GEMMA3()                                                                    \
  do {                                                                                            \
    if (!::ember::test::gemma3_available()) {                                                     \
      if (std::getenv("CI")) FAIL() << "model missing: " << ::ember::test::gemma3_model_path();   \
      GTEST_SKIP() << "Gemma 3 not found at " << ::ember::test::gemma3_model_path();              \
    }                                                                                             \
  } while (0)
