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
#include "core/util/hash.h"

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

// $EMBER_HOME/gemma-3-270m-q4_k_m.gguf (tools/fetch_model.sh gemma3).
inline std::string gemma3_model_path() {
  const std::string smol = model_path();
  if (smol.empty()) return {};
  return smol.substr(0, smol.rfind('/')) + "/gemma-3-270m-q4_k_m.gguf";
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

constexpr uint64_t kFnvOffset = kFnv1aOffset;

inline uint64_t fnv1a_bytes(const std::string& s, uint64_t h = kFnvOffset) { return fnv1a(s, h); }

inline uint64_t fnv1a_ids(const int32_t* ids, size_t n, uint64_t h = kFnvOffset) {
  for (size_t i = 0; i < n; ++i) h = fnv1a_u32(static_cast<uint32_t>(ids[i]), h);
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

// The Gemma 3 tokenizer (SentencePiece), built straight from the GGUF's
// tokenizer.ggml.* metadata (not through Model::load), once per process;
// nullptr when the file is absent.
inline const Tokenizer* gemma3() {
  static std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    const std::string path = gemma3_model_path();
    if (!file_exists(path)) return nullptr;
    auto file = gguf::GgufFile::open(path);
    return Tokenizer::from_gguf(*file);
  }();
  return tok.get();
}

#define EMBER_REQUIRE_GEMMA3(tok)                              \
  const ::ember::Tokenizer* tok = ::ember::tok_test::gemma3(); \
  if (!tok) GTEST_SKIP() << "model not found: " << ::ember::tok_test::gemma3_model_path()

// Golden-file helpers: hex text ("-" = empty), id lists ("-" = none), a short
// printable id list, and the value of " key=value" in a line.
inline std::string from_hex(const std::string& hex) {
  std::string out;
  if (hex == "-") return out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

inline std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  if (s == "-") return ids;
  std::istringstream in(s);
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

inline std::string ids_str(const std::vector<int32_t>& ids, size_t max = 40) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < max; ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  if (ids.size() > max) s += " ...";
  return s;
}

inline std::string field(const std::string& line, const std::string& key) {
  const std::string k = " " + key + "=";
  const size_t p = line.find(k);
  if (p == std::string::npos) return {};
  const size_t b = p + k.size();
  return line.substr(b, line.find(' ', b) - b);
}

// True when s is valid UTF-8.
inline bool is_valid_utf8(const std::string& s) { return unicode::find_invalid_utf8(s) == std::string::npos; }

}  // namespace ember::tok_test
