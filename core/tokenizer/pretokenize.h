// Hand-written pre-tokenizers (the regex word splitters that run before BPE),
// equivalent to llama.cpp's unicode_regex_split() for the regex lists below.
// Every stage splits each range it gets into consecutive sub-ranges (regex
// matches and the text between them alike), and the next stage only sees one
// such range at a time, so a lookahead never crosses a range boundary.
//
//   kGpt2:    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
//   kSmolLM:  \p{N}   then the kGpt2 regex
//   kDefault: [\p{P}\$\+<=>\^~\|]+   then kGpt2   then \p{N}+   then [0-9][0-9][0-9]
//   kLlama3:  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2:   the kLlama3 regex with \p{N} in place of \p{N}{1,3}
//             (llama.cpp's unicode_regex_split_custom_qwen2)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer/tokenizer.h"

namespace ember::pretok {

// Receives the words in order as [begin, end) code point indices.
class WordSink {
 public:
  virtual ~WordSink() = default;
  virtual void word(size_t begin, size_t end) = 0;
};

// Splits cps[0, n) into words.
void split(Tokenizer::PreType type, const uint32_t* cps, size_t n, WordSink& sink);

// Convenience for tests and tools: the words of valid UTF-8 text.
std::vector<std::string> split_words(Tokenizer::PreType type, std::string_view utf8);

}  // namespace ember::pretok
