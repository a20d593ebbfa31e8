// Word splits of the hand-written pre-tokenizers, derived by hand from the
// llama.cpp regex lists (see pretokenize.h).
#include "core/tokenizer/pretokenize.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace ember::pretok {
namespace {

using V = std::vector<std::string>;
using P = Tokenizer::PreType;

TEST(Pretokenize, Gpt2) {
  EXPECT_EQ(split_words(P::kGpt2, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split_words(P::kGpt2, "a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(split_words(P::kGpt2, "a   "), (V{"a", "   "}));
  EXPECT_EQ(split_words(P::kGpt2, "I'm don't we're"), (V{"I", "'m", " don", "'t", " we", "'re"}));
  EXPECT_EQ(split_words(P::kGpt2, "IT'S"), (V{"IT", "'", "S"}));  // case-sensitive contractions
  EXPECT_EQ(split_words(P::kGpt2, " 12345 x"), (V{" 12345", " x"}));
  EXPECT_EQ(split_words(P::kGpt2, "a!!? b"), (V{"a", "!!?", " b"}));
  EXPECT_EQ(split_words(P::kGpt2, " !!"), (V{" !!"}));
  EXPECT_EQ(split_words(P::kGpt2, "x\n\ny"), (V{"x", "\n", "\n", "y"}));
  EXPECT_EQ(split_words(P::kGpt2, "\t\tx"), (V{"\t", "\t", "x"}));
  EXPECT_EQ(split_words(P::kGpt2, "caf\xC3\xA9"), (V{"caf\xC3\xA9"}));
  EXPECT_EQ(split_words(P::kGpt2, "e\xCC\x81x"), (V{"e", "\xCC\x81", "x"}));  // a mark is not \p{L}
  EXPECT_EQ(split_words(P::kGpt2, ""), (V{}));
}

TEST(Pretokenize, SmolLMSplitsDigitsFirst) {
  EXPECT_EQ(split_words(P::kSmolLM, " 12345 x"), (V{" ", "1", "2", "3", "4", "5", " x"}));
  // The digit split ends the range, so "\s+(?!\S)" cannot see the digit.
  EXPECT_EQ(split_words(P::kSmolLM, "a  1"), (V{"a", "  ", "1"}));
  EXPECT_EQ(split_words(P::kSmolLM, "x\xC2\xB2y"), (V{"x", "\xC2\xB2", "y"}));  // ² is \p{N}
  EXPECT_EQ(split_words(P::kSmolLM, "Hello world"), (V{"Hello", " world"}));
}

TEST(Pretokenize, Default) {
  // [\p{P}\$\+<=>\^~\|]+ first: runs of punctuation are their own ranges.
  EXPECT_EQ(split_words(P::kDefault, "a, b"), (V{"a", ",", " b"}));
  EXPECT_EQ(split_words(P::kDefault, "x$+y"), (V{"x", "$+", "y"}));
  // then \p{N}+ and [0-9]{3} split numbers into triples from the left.
  EXPECT_EQ(split_words(P::kDefault, " 1234567"), (V{" ", "123", "456", "7"}));
}

TEST(Pretokenize, Llama3) {
  EXPECT_EQ(split_words(P::kLlama3, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split_words(P::kLlama3, "IT'S"), (V{"IT", "'S"}));
  EXPECT_EQ(split_words(P::kLlama3, "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(split_words(P::kLlama3, "(hello"), (V{"(hello"}));
  EXPECT_EQ(split_words(P::kLlama3, "a.\n\nb"), (V{"a", ".\n\n", "b"}));
  EXPECT_EQ(split_words(P::kLlama3, "a \n\n b"), (V{"a", " \n\n", " b"}));
  EXPECT_EQ(split_words(P::kLlama3, "x   y"), (V{"x", "  ", " y"}));
}

// qwen2: the llama3 regex with \p{N} (one digit per word) instead of \p{N}{1,3}.
TEST(Pretokenize, Qwen2) {
  EXPECT_EQ(split_words(P::kQwen2, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split_words(P::kQwen2, "IT'S we're"), (V{"IT", "'S", " we", "'re"}));
  EXPECT_EQ(split_words(P::kQwen2, "1234567"), (V{"1", "2", "3", "4", "5", "6", "7"}));
  EXPECT_EQ(split_words(P::kQwen2, "x2y3 abc123def"), (V{"x", "2", "y", "3", " abc", "1", "2", "3", "def"}));
  EXPECT_EQ(split_words(P::kQwen2, " 42  7"), (V{" ", "4", "2", " ", " ", "7"}));  // "  7": \s+(?!\S) then \s+
  EXPECT_EQ(split_words(P::kQwen2, "\xD9\xA3\xC2\xB2"), (V{"\xD9\xA3", "\xC2\xB2"}));  // Arabic-Indic 3, superscript 2
  EXPECT_EQ(split_words(P::kQwen2, "(hello"), (V{"(hello"}));
  EXPECT_EQ(split_words(P::kQwen2, "a.\n\nb"), (V{"a", ".\n\n", "b"}));
  EXPECT_EQ(split_words(P::kQwen2, "a \n\n b"), (V{"a", " \n\n", " b"}));
  EXPECT_EQ(split_words(P::kQwen2, "x   y"), (V{"x", "  ", " y"}));
  EXPECT_EQ(split_words(P::kQwen2, "$1,000.50!"), (V{"$", "1", ",", "0", "0", "0", ".", "5", "0", "!"}));
}

// The words always cover the input exactly, in order (the BPE stage relies on it).
TEST(Pretokenize, WordsCoverTheInput) {
  const std::vector<std::string> pool = {"a",
                                         "Z",
                                         "7",
                                         " ",
                                         "  ",
                                         "\n",
                                         "\r",
                                         "\t",
                                         "'",
                                         "'s",
                                         "'LL",
                                         ".",
                                         "!",
                                         "$",
                                         "\xC3\xA9",
                                         "\xCC\x81",
                                         "\xC2\xB2",
                                         "\xE4\xB8\xAD",
                                         "\xE3\x80\x80",
                                         "\xC2\xA0",
                                         "\xF0\x9F\x98\x80",
                                         "\xE2\x80\x8D",
                                         "\x00",
                                         "\xEF\xBF\xBD"};
  std::mt19937 rng(42);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += pool[rng() % pool.size()];
    for (P type : {P::kGpt2, P::kSmolLM, P::kDefault, P::kLlama3, P::kQwen2}) {
      std::string joined;
      for (const std::string& w : split_words(type, text)) {
        EXPECT_FALSE(w.empty());
        joined += w;
      }
      ASSERT_EQ(joined, text) << static_cast<int>(type);
    }
  }
}

}  // namespace
}  // namespace ember::pretok
