// Locates the default model for the C ABI tests; tests skip when absent (fail when $CI is set).
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

}  // namespace ember::test

#define EMBER_REQUIRE_MODEL()                                                                    \
  do {                                                                                           \
    if (!::ember::test::model_available()) {                                                     \
      if (std::getenv("CI")) FAIL() << "model missing: " << ::ember::test::default_model_path(); \
      GTEST_SKIP() << "model not found at " << ::ember::test::default_model_path();              \
    }                                                                                            \
  } while (0)
