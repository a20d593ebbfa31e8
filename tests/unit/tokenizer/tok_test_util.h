// Helpers shared by the tokenizer tests: where the model, the golden files and
// the books are, reading them, and the FNV-1a hash used by the golden files
// (see tools/tokenizer_golden.py for their formats).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode.h"

namespace ember::tok_test {

inline bool file_exists(const std::string& p) {
  struct stat st {};
  return !p.empty() && ::stat(p.c_str(), &st) == 0;
}

// $EMBER_HOME/SmolLM2-135M-Instruct.Q4_1.gguf (EMBER_HOME: ~/.cache/ember).
inline std::string model_path() {
  std::string home;
  if (const char* e = std::getenv("EMBER_HOME"); e && *e) {
    home = e;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    home = std::string(h) + "/.cache/ember";
  } else {
    return {};
  }
  return home + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// $EMBER_DATA_DIR, default ../shared/data next to the source tree.
inline std::string data_dir() {
  if (const char* e = std::getenv("EMBER_DATA_DIR"); e && *e) return e;
  return std::string(EMBER_SOURCE_DIR) + "/../shared/data";
}

inline std::string golden_path(const std::string& name) {
  return std::string(EMBER_TEST_DATA_DIR) + "/tokenizer/" + name;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

constexpr uint64_t kFnvOffset = 0xCBF29CE484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001B3ULL;

inline uint64_t fnv1a_bytes(const std::string& s, uint64_t h = kFnvOffset) {
  for (unsigned char c : s) h = (h ^ c) * kFnvPrime;
  return h;
}

inline uint64_t fnv1a_ids(const int32_t* ids, size_t n, uint64_t h = kFnvOffset) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = static_cast<uint32_t>(ids[i]);
    for (int k = 0; k < 4; ++k) h = (h ^ ((v >> (8 * k)) & 0xFF)) * kFnvPrime;
  }
  return h;
}

// The SmolLM2 tokenizer, loaded once per process; nullptr when the model file
// is absent (tests then GTEST_SKIP).
inline const Tokenizer* smollm2() {
  static std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    const std::string path = model_path();
    if (!file_exists(path)) return nullptr;
    auto file = gguf::GgufFile::open(path);
    return Tokenizer::from_gguf(*file);
  }();
  return tok.get();
}

#define EMBER_REQUIRE_SMOLLM2(tok)                              \
  const ::ember::Tokenizer* tok = ::ember::tok_test::smollm2(); \
  if (!tok) GTEST_SKIP() << "model not found: " << ::ember::tok_test::model_path()

// True when s is valid UTF-8.
inline bool is_valid_utf8(const std::string& s) { return unicode::find_invalid_utf8(s) == std::string::npos; }

}  // namespace ember::tok_test
