// SentencePiece ("llama" vocabulary) behaviour on a small hand-made
// vocabulary: score order and ties, space prefix, byte fallback, unknown
// token, special tokens, defaults, invalid UTF-8, detokenize_llama rules.
// The expected ids follow llama.cpp's llm_tokenizer_spm_session by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"

namespace ember {
namespace {

using V = std::vector<int32_t>;

constexpr int32_t kUnk = 0, kBos = 1, kEos = 2;
constexpr int32_t byte_id(int b) { return 3 + b; }
// Pieces after the 256 byte tokens.
enum : int32_t {
  kSp = 259,  // ▁
  kA,
  kB,
  kC,
  kX,
  kY,
  kZ,
  kAB,    // -5
  kBC,    // -3
  kAA,    // -4
  kXY,    // -3
  kYZ,    // -3
  kSpA,   // ▁a  -2
  kSpAB,  // ▁ab -1
  kTag,   // <tag> user-defined
  kCtl,   // <ctl> control
  kSpSp,  // ▁▁ -2
  kEot,   // <end_of_turn> (control)
  kUnused,  // <unused0> (control)
};

const std::string kEsc = "\xE2\x96\x81";

Tokenizer::Vocab spm_vocab(bool byte_tokens = true) {
  Tokenizer::Vocab v;
  v.model = "llama";
  v.pre = "default";
  auto add = [&](const std::string& text, int32_t type, float score) {
    v.tokens.push_back(text);
    v.token_types.push_back(type);
    v.scores.push_back(score);
  };
  add("<unk>", 2, 0);
  add("<s>", 3, 0);
  add("</s>", 3, 0);
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    if (byte_tokens) {
      add(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 6, 0);
    } else {
      add("[nobyte" + std::to_string(b) + "]", 1, -100);
    }
  }
  add(kEsc, 1, -1);
  add("a", 1, -1);
  add("b", 1, -1);
  add("c", 1, -1);
  add("x", 1, -1);
  add("y", 1, -1);
  add("z", 1, -1);
  add("ab", 1, -5);
  add("bc", 1, -3);
  add("aa", 1, -4);
  add("xy", 1, -3);
  add("yz", 1, -3);
  add(kEsc + "a", 1, -2);
  add(kEsc + "ab", 1, -1);
  add("<tag>", 4, 0);
  add("<ctl>", 3, 0);
  add(kEsc + kEsc, 1, -2);
  add("<end_of_turn>", 3, 0);
  add("<unused0>", 3, 0);
  return v;
}

std::unique_ptr<Tokenizer> spm(bool space_prefix = true) {
  auto v = spm_vocab();
  v.add_space_prefix = space_prefix;
  return Tokenizer::from_vocab(v);
}

TEST(SpmSynthetic, Metadata) {
  auto tok = spm();
  EXPECT_EQ(tok->vocab_type(), Tokenizer::VocabType::kSpm);
  // llama.cpp's SPM defaults when the metadata names no ids.
  EXPECT_EQ(tok->bos(), kBos);
  EXPECT_EQ(tok->eos(), kEos);
  EXPECT_EQ(tok->unk(), kUnk);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  EXPECT_TRUE(tok->add_space_prefix());
  EXPECT_FALSE(spm(false)->add_space_prefix());
  EXPECT_EQ(tok->eot(), kEot);
  EXPECT_TRUE(tok->is_eog(kEot));
  EXPECT_TRUE(tok->is_eog(kEos));
  EXPECT_EQ(tok->token_type(kUnused), Tokenizer::TokenType::kControl);
  // The "pre" value is not checked for SPM (llama.cpp ignores it).
  auto v = spm_vocab();
  v.pre = "whatever";
  EXPECT_NO_THROW(Tokenizer::from_vocab(v));
  v = spm_vocab();
  v.add_bos = false;
  EXPECT_FALSE(Tokenizer::from_vocab(v)->add_bos());
}

TEST(SpmSynthetic, MergesByScoreThenLeftmost) {
  auto tok = spm(false);
  EXPECT_EQ(tok->encode("abc", false, false), (V{kA, kBC}));  // "bc" (-3) beats "ab" (-5)
  EXPECT_EQ(tok->encode("aaa", false, false), (V{kAA, kA}));  // equal scores: leftmost
  EXPECT_EQ(tok->encode("xyz", false, false), (V{kXY, kZ}));  // equal scores: leftmost
  EXPECT_EQ(tok->encode("aaaa", false, false), (V{kAA, kAA}));
  EXPECT_EQ(tok->encode("a b", false, false), (V{kA, kSp, kB}));  // "▁b" is no token
  EXPECT_EQ(tok->encode(" ab", false, false), (V{kSpAB}));
}

TEST(SpmSynthetic, SpacePrefix) {
  auto tok = spm(true);
  // "▁abc": ▁a (-2), then ▁ab (-1); "bc" is then stale.
  EXPECT_EQ(tok->encode("abc", false, false), (V{kSpAB, kC}));
  EXPECT_EQ(tok->encode("abc", true, false), (V{kBos, kSpAB, kC}));
  EXPECT_EQ(tok->encode(" ", false, false), (V{kSpSp}));
  EXPECT_EQ(tok->encode("", false, false), V{});
  EXPECT_EQ(tok->encode("", true, false), V{kBos});
  // After a special token the next text gets the prefix again.
  EXPECT_EQ(tok->encode("a<tag>b", false, false), (V{kSpA, kTag, kSp, kB}));
  EXPECT_EQ(tok->encode("<tag>", false, false), (V{kTag}));
  // Control tokens are text unless parse_special.
  EXPECT_EQ(tok->encode("a<ctl>b", false, false),
            (V{kSpA, byte_id('<'), kC, byte_id('t'), byte_id('l'), byte_id('>'), kB}));
  EXPECT_EQ(tok->encode("a<ctl>b", false, true), (V{kSpA, kCtl, kSp, kB}));
  EXPECT_EQ(tok->encode("<s>a", true, true), (V{kBos, kBos, kSpA}));
  auto v = spm_vocab();
  v.add_eos = true;
  EXPECT_EQ(Tokenizer::from_vocab(v)->encode("a", true, false), (V{kBos, kSpA, kEos}));
  EXPECT_EQ(Tokenizer::from_vocab(v)->encode("a", false, false), (V{kSpA}));
}

TEST(SpmSynthetic, ByteFallbackAndUnknown) {
  auto tok = spm(false);
  EXPECT_EQ(tok->encode("\xC3\xA9", false, false), (V{byte_id(0xC3), byte_id(0xA9)}));  // é
  EXPECT_EQ(tok->encode("a\xF0\x9F\x98\x80", false, false),
            (V{kA, byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80)}));
  EXPECT_EQ(tok->encode("\n", false, false), (V{byte_id('\n')}));
  // Invalid UTF-8 is accepted: symbols by lead byte, then bytes (llama.cpp).
  EXPECT_EQ(tok->encode("\xFF", false, false), (V{byte_id(0xFF)}));
  EXPECT_EQ(tok->encode("a\x80" "b", false, false), (V{kA, byte_id(0x80), kB}));
  EXPECT_EQ(tok->encode("\xE2\x96", false, false), (V{byte_id(0xE2), byte_id(0x96)}));
  EXPECT_EQ(spm(true)->encode("\xFF", false, false), (V{kSp, byte_id(0xFF)}));
  // Without byte tokens the unknown token stands for each byte.
  auto nob = Tokenizer::from_vocab(spm_vocab(false));
  EXPECT_EQ(nob->encode("\xC3\xA9" "a", false, false), (V{kSp, kUnk, kUnk, kA}));
}

TEST(SpmSynthetic, Pieces) {
  auto tok = spm();
  EXPECT_EQ(tok->token_to_piece(kSpAB), " ab");
  EXPECT_EQ(tok->token_to_piece(kSpSp), "  ");
  EXPECT_EQ(tok->token_to_piece(byte_id(0xC3)), "\xC3");
  EXPECT_EQ(tok->token_to_piece(byte_id('A')), "A");
  EXPECT_EQ(tok->token_to_piece(kCtl), "<ctl>");
  EXPECT_EQ(tok->token_to_piece(kUnk), "<unk>");
  const std::string text = "ab  c\xC3\xA9 x<tag>yz";
  // A space prefix at the start and after the special token.
  EXPECT_EQ(tok->decode(tok->encode(text, false, false)), " ab  c\xC3\xA9 x<tag> yz");
  // Streaming holds the first byte of é back.
  StreamingDetokenizer stream(*tok);
  EXPECT_EQ(stream.feed(byte_id(0xC3)), "");
  EXPECT_EQ(stream.feed(byte_id(0xA9)), "\xC3\xA9");
}

TEST(SpmSynthetic, DetokenizeLikeLlama) {
  auto tok = spm();
  auto d = [&](const V& ids, bool remove_special, bool unparse_special) {
    return tok->detokenize_llama(ids.data(), ids.size(), remove_special, unparse_special);
  };
  EXPECT_EQ(d({kSpAB, kC}, false, false), "abc");  // the space prefix is removed
  EXPECT_EQ(d({kSpAB, kC}, true, true), "abc");
  EXPECT_EQ(d({kBos, kSpAB}, true, false), " ab");  // BOS removed: the space stays (llama.cpp)
  EXPECT_EQ(d({kBos, kSpAB}, false, false), " ab");  // BOS renders as "", the strip chance is used up
  EXPECT_EQ(d({kBos, kSpAB}, false, true), "<s> ab");
  EXPECT_EQ(d({kSpSp, kA}, false, false), " a");  // one space only
  EXPECT_EQ(d({kCtl, kTag, kUnk}, false, false), "<tag>");
  EXPECT_EQ(d({kCtl, kTag, kUnk}, false, true), "<ctl><tag><unk>");
  EXPECT_EQ(d({}, true, true), "");
  EXPECT_EQ(spm(false)->detokenize_llama(V{kSpAB}.data(), 1, false, false), " ab");
  auto v = spm_vocab();
  v.add_eos = true;
  auto te = Tokenizer::from_vocab(v);
  const V ids{kBos, kSpA, kEos};
  EXPECT_EQ(te->detokenize_llama(ids.data(), ids.size(), true, true), " a");
  EXPECT_EQ(te->detokenize_llama(ids.data(), ids.size(), false, true), "<s> a</s>");
  EXPECT_THROW(tok->detokenize_llama(V{-1}.data(), 1, false, false), Error);
}

}  // namespace
}  // namespace ember
