// Tokenizer behaviour on small hand-made vocabularies: validation errors, BPE
// merge order, special-token partitioning, decoding and streaming.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode.h"
#include "core/util/status.h"

namespace ember {
namespace {

using V = std::vector<int32_t>;

// Ids 0..255: the byte-level alphabet in byte order; then `extra` tokens.
Tokenizer::Vocab byte_vocab(const std::vector<std::string>& extra = {}, const std::vector<int32_t>& extra_types = {}) {
  Tokenizer::Vocab v;
  v.model = "gpt2";
  v.pre = "gpt-2";
  for (int b = 0; b < 256; ++b) v.tokens.push_back(unicode::byte_to_utf8(static_cast<uint8_t>(b)));
  v.token_types.assign(256, 1);
  for (size_t i = 0; i < extra.size(); ++i) {
    v.tokens.push_back(extra[i]);
    v.token_types.push_back(i < extra_types.size() ? extra_types[i] : 1);
  }
  v.merges = {"a b"};  // needs "ab" in extra when used; replaced by tests that need merges
  return v;
}

Tokenizer::Vocab merge_vocab() {
  // 256: he  257: ll  258: hell  259: aa  260: bc  261: ab  262: Ġw
  auto v = byte_vocab({"he", "ll", "hell", "aa", "bc", "ab", "\xC4\xA0w"});
  v.merges = {"h e", "l l", "he ll", "a a", "b c", "a b", "\xC4\xA0 w"};
  return v;
}

void expect_error(StatusCode code, const std::string& needle, const Tokenizer::Vocab& v) {
  try {
    Tokenizer::from_vocab(v);
    ADD_FAILURE() << "no error, expected " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerSynthetic, MergesApplyByRankThenLeftmost) {
  auto tok = Tokenizer::from_vocab(merge_vocab());
  EXPECT_EQ(tok->encode("hello", false, false), (V{258, 'o'}));
  EXPECT_EQ(tok->encode("aaa", false, false), (V{259, 'a'}));  // equal ranks: leftmost pair first
  EXPECT_EQ(tok->encode("abc", false, false), (V{'a', 260}));  // "b c" (rank 4) beats "a b" (rank 5)
  EXPECT_EQ(tok->encode("hello world", false, false), (V{258, 'o', 262, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(tok->decode(tok->encode("hello world", false, false)), "hello world");
  EXPECT_EQ(tok->encode("", true, true), V{});
}

TEST(TokenizerSynthetic, ByteLevelCoversEveryByte) {
  auto tok = Tokenizer::from_vocab(merge_vocab());
  std::string all;
  for (int c = 1; c < 128; ++c) all.push_back(static_cast<char>(c));
  all += "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";  // é 中 😀
  const V ids = tok->encode(all, false, false);
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_EQ(tok->token_to_piece(0xC3), "\xC3");  // a lone byte renders as that byte
}

TEST(TokenizerSynthetic, Errors) {
  auto v = merge_vocab();
  v.model = "wordpiece-xyz";
  expect_error(StatusCode::kUnsupported, "wordpiece-xyz", v);
  v = merge_vocab();
  v.pre = "weird-pre";
  expect_error(StatusCode::kUnsupported, "weird-pre", v);
  v = merge_vocab();
  v.token_types.pop_back();
  expect_error(StatusCode::kBadFormat, "token_type", v);
  v = merge_vocab();
  v.scores = {1.0f};
  expect_error(StatusCode::kBadFormat, "scores", v);
  v = merge_vocab();
  v.bos = static_cast<int64_t>(v.tokens.size());
  expect_error(StatusCode::kBadFormat, "bos_token_id", v);
  v = merge_vocab();
  v.eos = -5;
  expect_error(StatusCode::kBadFormat, "eos_token_id", v);
  v = merge_vocab();
  v.merges.push_back("x zz");
  expect_error(StatusCode::kBadFormat, "'x zz'", v);
  v = merge_vocab();
  v.merges.push_back("nospace");
  expect_error(StatusCode::kBadFormat, "nospace", v);
  v = merge_vocab();
  v.merges.clear();
  expect_error(StatusCode::kBadFormat, "merges", v);
  v = merge_vocab();
  v.tokens.push_back("he");
  v.token_types.push_back(1);
  expect_error(StatusCode::kBadFormat, "duplicate", v);
  v = merge_vocab();
  v.tokens.clear();
  v.token_types.clear();
  expect_error(StatusCode::kBadFormat, "empty", v);
  v = merge_vocab();
  v.add_bos = true;
  expect_error(StatusCode::kBadFormat, "add_bos_token", v);
}

TEST(TokenizerSynthetic, PreTypesAccepted) {
  for (const char* pre : {"default", "gpt-2", "gpt2", "smollm", "starcoder", "llama3", "llama-bpe", "dbrx"}) {
    auto v = merge_vocab();
    v.pre = pre;
    auto tok = Tokenizer::from_vocab(v);
    EXPECT_EQ(tok->decode(tok->encode("Hello, world 12345!", false, false)), "Hello, world 12345!") << pre;
  }
  auto v = merge_vocab();
  v.pre.reset();  // absent: "default", as llama.cpp
  EXPECT_EQ(Tokenizer::from_vocab(v)->pre_type(), Tokenizer::PreType::kDefault);
  v.pre = "llama3";
  v.bos = 'B';
  auto tok = Tokenizer::from_vocab(v);
  EXPECT_TRUE(tok->add_bos());  // llama3 adds BOS unless the metadata says otherwise
  EXPECT_EQ(tok->encode("a", true, false), (V{'B', 'a'}));
}

TEST(TokenizerSynthetic, SpecialTokens) {
  // 256 <c> (control)  257 <u> (user-defined)  258 <cc> (control)  259 bcd (control)  260 ab (control)
  auto v = byte_vocab({"<c>", "<u>", "<cc>", "bcd", "ab"}, {3, 4, 3, 3, 3});
  v.merges = {"a b"};
  v.bos = 256;
  v.eos = 258;
  v.add_bos = true;
  v.add_eos = true;
  auto tok = Tokenizer::from_vocab(v);
  EXPECT_EQ(tok->encode("x<c>y", false, true), (V{'x', 256, 'y'}));
  // parse_special=false: control tokens are text, user-defined ones still match.
  EXPECT_EQ(tok->encode("x<c>y", false, false), (V{'x', '<', 'c', '>', 'y'}));
  EXPECT_EQ(tok->encode("x<u>y", false, false), (V{'x', 257, 'y'}));
  EXPECT_EQ(tok->encode("<cc><c>", false, true), (V{258, 256}));
  // Longer special tokens are claimed first, wherever they are.
  EXPECT_EQ(tok->encode("abcd", false, true), (V{'a', 259}));
  EXPECT_EQ(tok->encode("abcd", false, false), (V{260, 'c', 'd'}));  // "ab" by BPE merge
  EXPECT_EQ(tok->encode("x", true, false), (V{256, 'x', 258}));
  EXPECT_EQ(tok->encode("", true, false), (V{256, 258}));
  EXPECT_EQ(tok->token_to_piece(256), "<c>");
  EXPECT_TRUE(tok->is_control(256));
  EXPECT_FALSE(tok->is_control(257));
  EXPECT_EQ(tok->token_type(257), Tokenizer::TokenType::kUserDefined);
  EXPECT_EQ(tok->decode({256, 'h', 'i', 258}), "<c>hi<cc>");
  EXPECT_TRUE(tok->is_eog(258));
  EXPECT_FALSE(tok->is_eog(256));
}

TEST(TokenizerSynthetic, EotAndEogHeuristics) {
  // <|im_end|> typed NORMAL still becomes control, EOT and EOG (llama.cpp does the same).
  auto v = byte_vocab({"<|im_end|>", "<|endoftext|>", "<|eot_id|>"}, {1, 3, 3});
  v.merges = {"a b"};
  v.tokens.push_back("ab");
  v.token_types.push_back(1);
  auto tok = Tokenizer::from_vocab(v);
  EXPECT_EQ(tok->eot(), 258);  // <|eot_id|> has priority over <|im_end|>
  EXPECT_TRUE(tok->is_control(256));
  EXPECT_TRUE(tok->is_eog(256));
  EXPECT_TRUE(tok->is_eog(257));
  EXPECT_TRUE(tok->is_eog(258));
  EXPECT_EQ(tok->eos(), -1);
  EXPECT_EQ(tok->encode("<|im_end|>", false, false).size(), 10u);  // control now: plain text
  v.eot = 257;
  EXPECT_EQ(Tokenizer::from_vocab(v)->eot(), 257);  // metadata wins
}

TEST(TokenizerSynthetic, InvalidInputAndIds) {
  auto tok = Tokenizer::from_vocab(merge_vocab());
  try {
    tok->encode("abc\xFF", false, false);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tok->encode("\xED\xA0\x80", false, false), Error);  // surrogate
  EXPECT_THROW(tok->encode("\xC0\x80", false, false), Error);      // overlong NUL
  for (int32_t bad : {-1, tok->n_vocab(), 1 << 30}) {
    try {
      tok->token_to_piece(bad);
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    }
    EXPECT_THROW(tok->decode({'a', bad}), Error);
    EXPECT_THROW(tok->token_text(bad), Error);
    EXPECT_FALSE(tok->is_control(bad));
    EXPECT_FALSE(tok->is_eog(bad));
  }
  EXPECT_EQ(tok->find_token("hell"), 258);
  EXPECT_EQ(tok->find_token("hello"), -1);
  EXPECT_EQ(tok->find_token(""), -1);
}

TEST(StreamingDetokenizerSynthetic, HoldsIncompleteAndReplacesInvalid) {
  auto tok = Tokenizer::from_vocab(merge_vocab());
  StreamingDetokenizer s(*tok);
  EXPECT_EQ(s.feed(0xC3), "");
  EXPECT_EQ(s.pending_bytes(), 1u);
  EXPECT_EQ(s.feed(0xA9), "\xC3\xA9");
  EXPECT_EQ(s.feed(0xF0), "");
  EXPECT_EQ(s.feed(0x9F), "");
  EXPECT_EQ(s.feed(0x98), "");
  EXPECT_EQ(s.feed(0x80), "\xF0\x9F\x98\x80");
  // A sequence that can never complete is replaced, and the stream goes on.
  EXPECT_EQ(s.feed(0xE2), "");
  EXPECT_EQ(s.feed('a'),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(s.feed(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(s.feed(0xC0), "\xEF\xBF\xBD");
  EXPECT_EQ(s.feed(0xED), "");
  EXPECT_EQ(s.feed(0xA0), "\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate lead + stray continuation
  // flush() turns an incomplete tail into one U+FFFD.
  EXPECT_EQ(s.feed(0xF0), "");
  EXPECT_EQ(s.feed(0x9F), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(s.flush(), "");
  EXPECT_THROW(s.feed(-1), Error);
  EXPECT_EQ(s.feed('h'), "h");
}

TEST(StreamingDetokenizerSynthetic, RenderSpecial) {
  auto v = byte_vocab({"<c>", "ab"}, {3, 1});
  v.merges = {"a b"};
  auto tok = Tokenizer::from_vocab(v);
  StreamingDetokenizer with(*tok), without(*tok, false);
  EXPECT_EQ(with.feed(256), "<c>");
  EXPECT_EQ(without.feed(256), "");
  EXPECT_EQ(without.feed(257), "ab");
}

}  // namespace
}  // namespace ember
