// A small synthetic GPT-2 byte-level BPE vocabulary for the fuzz targets: the
// 256 byte tokens, a few dozen English and multi-byte merges, control tokens
// (<|endoftext|>, <|im_start|>, <|im_end|>), a user-defined token, an unknown
// token and unused padding. No model file is needed.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode.h"

namespace ember::fuzz {

inline std::string byte_level(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += unicode::byte_to_utf8(c);
  return out;
}

// pre: tokenizer.ggml.pre ("gpt-2", "smollm", "llama3", "default", ...).
inline Tokenizer::Vocab synthetic_vocab(const std::string& pre) {
  // "left|right" in plain text; each result becomes a token; later merges
  // build on earlier results.
  static const char* const kMerges[] = {
      " |t", " |a", "h|e", "i|n", "r|e", "o|n", " t|he", "e|r", " |s", "a|t", " |w", " |o", "e|n",
      " |c", "i|t", "i|s", "a|n", "o|r", "e|s", " |b", "e|d", " |f", "in|g", " |p", "o|u", " a|n",
      "a|l", "a|r", " t|o", " |m", " o|f", " |in", " |d", " |h", " an|d", "l|l", " t|h", "i|c",
      " h|e", "o|m", "1|2", "12|3", "\n|\n", " | ", "  | ", "\xC3|\xA9", "\xE4\xB8|\xAD", "'|s",
      "<|\x7C", "T|h", "Th|e", "w|or", "wor|ld", " |wor", "\xF0\x9F|\x98", "\xF0\x9F\x98|\x80",
  };
  Tokenizer::Vocab v;
  v.model = "gpt2";
  v.pre = pre;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(unicode::byte_to_utf8(static_cast<uint8_t>(b)));
    v.token_types.push_back(1);  // normal
  }
  for (const char* m : kMerges) {
    const std::string s = m;
    const size_t bar = s.find('|', 1);
    const std::string left = s.substr(0, bar), right = s.substr(bar + 1);
    const std::string merged = byte_level(left + right);
    // A merge's parts must be tokens; skip the ones a later edit broke.
    if (std::find(v.tokens.begin(), v.tokens.end(), byte_level(left)) == v.tokens.end() ||
        std::find(v.tokens.begin(), v.tokens.end(), byte_level(right)) == v.tokens.end()) {
      continue;
    }
    v.merges.push_back(byte_level(left) + " " + byte_level(right));
    if (std::find(v.tokens.begin(), v.tokens.end(), merged) == v.tokens.end()) {
      v.tokens.push_back(merged);
      v.token_types.push_back(1);
    }
  }
  const auto add = [&](const std::string& text, int32_t type) {
    v.tokens.push_back(text);
    v.token_types.push_back(type);
    return static_cast<int64_t>(v.tokens.size() - 1);
  };
  v.eos = add("<|endoftext|>", 3);  // control
  v.bos = v.eos;
  add("<|im_start|>", 3);
  v.eot = add("<|im_end|>", 3);
  add("<tool_call>", 4);  // user-defined: matched in text even without parse_special
  add("\xE2\x96\x81user", 4);
  v.unk = add("<unk>", 2);  // unknown
  for (int i = 0; i < 4; ++i) add("<|reserved_" + std::to_string(i) + "|>", 5);  // unused
  return v;
}

}  // namespace ember::fuzz
