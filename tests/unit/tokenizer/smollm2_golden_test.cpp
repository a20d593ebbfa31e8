// SmolLM2-135M-Instruct ("gpt2" BPE, pre-tokenizer "smollm") against golden
// ids from llama.cpp (tests/golden/tokenizer/, made by
// tools/tokenizer_golden.py). Skipped when the model file is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode.h"
#include "core/util/status.h"
#include "tok_test_util.h"

namespace ember {
namespace {

using namespace tok_test;

// What decode(encode(text)) gives: the text without the bytes that have no
// token. SmolLM2's vocabulary lacks 0x04 0x06 0x13 0x14 0x16 0x1D (and bytes
// that never occur in UTF-8, and the lead bytes F1 F2); llama.cpp drops them
// silently, and so do we.
std::string without_untokenizable_bytes(const Tokenizer& tok, const std::string& text) {
  std::string out;
  for (char c : text)
    if (tok.find_token(unicode::byte_to_utf8(static_cast<uint8_t>(c))) >= 0) out.push_back(c);
  return out;
}

TEST(SmolLM2Tokenizer, Metadata) {
  EMBER_REQUIRE_SMOLLM2(tok);
  EXPECT_EQ(tok->n_vocab(), 49152);
  EXPECT_EQ(tok->vocab_type(), Tokenizer::VocabType::kBpe);
  EXPECT_EQ(tok->pre_type(), Tokenizer::PreType::kSmolLM);
  EXPECT_EQ(tok->pre_name(), "smollm");
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_EQ(tok->eot(), 2);  // <|im_end|>
  EXPECT_EQ(tok->unk(), 0);
  EXPECT_EQ(tok->pad(), 2);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  // EOG as llama.cpp: <|endoftext|>, <|im_end|>, and <reponame> (taken as the FIM repo token).
  EXPECT_EQ(tok->eog_ids(), (std::vector<int32_t>{0, 2, 4}));
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));
  EXPECT_EQ(tok->find_token("<|im_start|>"), 1);
  EXPECT_EQ(tok->find_token("<|im_end|>"), 2);
  EXPECT_EQ(tok->find_token("no such token"), -1);
  EXPECT_TRUE(tok->is_control(1));
  EXPECT_FALSE(tok->is_control(100));
  EXPECT_EQ(tok->token_to_piece(1), "<|im_start|>");
  const int32_t the = tok->find_token("\xC4\xA0the");  // "Ġthe"
  ASSERT_GE(the, 0);
  EXPECT_EQ(tok->token_to_piece(the), " the");
  EXPECT_EQ(tok->token_type(the), Tokenizer::TokenType::kNormal);
  EXPECT_EQ(tok->decode(tok->encode("<|im_start|>user\nHi<|im_end|>", true, true)), "<|im_start|>user\nHi<|im_end|>");
  EXPECT_THROW(tok->token_to_piece(49152), Error);
}

TEST(SmolLM2Tokenizer, InvalidUtf8IsRejected) {
  EMBER_REQUIRE_SMOLLM2(tok);
  // llama.cpp silently maps these to U+FFFD, accepts overlong forms and
  // surrogates, and aborts on F4 90.. (see tools/tokenizer_golden.py probe-invalid).
  for (const char* bad : {"\xFF",
                          "a\x80"
                          "b",
                          "ok\xC3", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80"}) {
    try {
      tok->encode(bad, false, false);
      ADD_FAILURE() << testing::PrintToString(std::string(bad));
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("invalid UTF-8 at byte"), std::string::npos);
    }
  }
}

// Runs the "case" blocks of a golden file; returns the number of cases.
int run_cases(const Tokenizer& tok, const std::string& path) {
  const auto lines = read_lines(path);
  EXPECT_FALSE(lines.empty()) << path;
  std::string name, flags, text;
  int n = 0, failed = 0;
  for (const std::string& line : lines) {
    if (line.rfind("case ", 0) == 0) {
      name = line.substr(5);
    } else if (line.rfind("flags ", 0) == 0) {
      flags = line;
    } else if (line.rfind("text ", 0) == 0) {
      text = from_hex(line.substr(5));
    } else if (line.rfind("ids ", 0) == 0) {
      const auto want = parse_ids(line.substr(4));
      const bool add_special = flags.find("add_special=1") != std::string::npos;
      const bool parse_special = flags.find("parse_special=1") != std::string::npos;
      const auto got = tok.encode(text, add_special, parse_special);
      ++n;
      if (got != want) {
        ++failed;
        ADD_FAILURE() << path << ": case " << name << " (" << flags << ") text " << testing::PrintToString(text)
                      << "\n  want: " << ids_str(want) << "\n  got:  " << ids_str(got);
      }
      EXPECT_EQ(tok.decode(got), without_untokenizable_bytes(tok, text)) << "round trip of case " << name;
    }
  }
  EXPECT_EQ(failed, 0) << path;
  return n;
}

TEST(SmolLM2Tokenizer, GoldenCases) {
  EMBER_REQUIRE_SMOLLM2(tok);
  EXPECT_GT(run_cases(*tok, golden_path("smollm2_cases.txt")), 700);
}

// The same vocabulary under the other supported pre-tokenizers, against
// llama.cpp on vocab-only copies of the GGUF with tokenizer.ggml.pre changed.
void check_pre_variant(const std::string& pre, Tokenizer::PreType type) {
  const std::string mpath = model_path();
  if (!file_exists(mpath)) GTEST_SKIP() << "model not found: " << mpath;
  auto file = gguf::GgufFile::open(mpath);
  Tokenizer::Vocab v = Tokenizer::vocab_from_gguf(*file);
  v.pre = pre;
  auto tok = Tokenizer::from_vocab(std::move(v));
  EXPECT_EQ(tok->pre_type(), type);
  const std::string path = golden_path("smollm2_pre_" + pre + ".txt");
  EXPECT_GT(run_cases(*tok, path), 350);
  int books = 0;
  for (const std::string& line : read_lines(path)) {
    if (line.rfind("book ", 0) != 0) continue;
    const std::string book = line.substr(5, line.find(' ', 5) - 5);
    const std::string bpath = data_dir() + "/" + book;
    if (!file_exists(bpath)) continue;
    const std::string text = read_file(bpath);
    if (std::to_string(text.size()) != field(line, "bytes")) continue;  // check_book reports changed books
    const auto ids = tok->encode(text, false, false);
    char fnv[32];
    std::snprintf(fnv, sizeof fnv, "%016llx", static_cast<unsigned long long>(fnv1a_ids(ids.data(), ids.size())));
    EXPECT_TRUE(std::to_string(ids.size()) == field(line, "tokens") && fnv == field(line, "ids_fnv"))
        << pre << " " << book << ": got tokens=" << ids.size() << " ids_fnv=" << fnv << ", golden: " << line;
    ++books;
  }
  std::printf("pre '%s': %d books checked\n", pre.c_str(), books);
}

TEST(SmolLM2Tokenizer, PreGpt2) { check_pre_variant("gpt-2", Tokenizer::PreType::kGpt2); }
TEST(SmolLM2Tokenizer, PreDefault) { check_pre_variant("default", Tokenizer::PreType::kDefault); }
TEST(SmolLM2Tokenizer, PreLlama3) { check_pre_variant("llama-bpe", Tokenizer::PreType::kLlama3); }
TEST(SmolLM2Tokenizer, PreQwen2) { check_pre_variant("qwen2", Tokenizer::PreType::kQwen2); }

void check_book(const std::string& book) {
  EMBER_REQUIRE_SMOLLM2(tok);
  std::string head;
  std::vector<std::pair<size_t, uint64_t>> checkpoints;
  for (const std::string& line : read_lines(golden_path("smollm2_books.txt"))) {
    if (line.rfind("book " + book + " ", 0) == 0) head = line;
    if (line.rfind("checkpoint " + book + " ", 0) == 0) {
      std::istringstream in(line.substr(12 + book.size()));
      size_t count;
      std::string hex;
      in >> count >> hex;
      checkpoints.emplace_back(count, std::stoull(hex, nullptr, 16));
    }
  }
  ASSERT_FALSE(head.empty()) << "no golden line for " << book;
  const std::string path = data_dir() + "/" + book;
  if (!file_exists(path)) GTEST_SKIP() << "book not found: " << path;
  const std::string text = read_file(path);
  ASSERT_EQ(std::to_string(text.size()), field(head, "bytes")) << path << " changed; regenerate the golden file";
  char fnv[32];
  std::snprintf(fnv, sizeof fnv, "%016llx", static_cast<unsigned long long>(fnv1a_bytes(text)));
  ASSERT_EQ(fnv, field(head, "text_fnv")) << path << " changed; regenerate the golden file";

  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text, false, false);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n", book.c_str(), text.size(), ids.size(), secs,
              text.size() / secs / 1e6);

  std::snprintf(fnv, sizeof fnv, "%016llx", static_cast<unsigned long long>(fnv1a_ids(ids.data(), ids.size())));
  const bool same = std::to_string(ids.size()) == field(head, "tokens") && fnv == field(head, "ids_fnv");
  if (!same) {
    // Narrow it down with the checkpoints (cumulative hashes every 65536 tokens).
    size_t good = 0;
    for (const auto& [count, hash] : checkpoints) {
      if (count > ids.size() || fnv1a_ids(ids.data(), count) != hash) break;
      good = count;
    }
    std::string dumped;
    if (const char* dir = std::getenv("EMBER_TOKENIZER_DUMP_DIR"); dir && *dir) {
      dumped = std::string(dir) + "/" + book + ".ids";
      std::ofstream out(dumped);
      for (int32_t id : ids) out << id << '\n';
    }
    ADD_FAILURE() << book << ": got " << ids.size() << " tokens, hash " << fnv << "; golden: " << head
                  << "\n  the first " << good << " tokens match; the first difference is before token "
                  << (good + 65536)
                  << (dumped.empty() ? "\n  set EMBER_TOKENIZER_DUMP_DIR to dump the ids, then run"
                                     : "\n  ids written to " + dumped + "; run")
                  << " tools/tokenizer_golden.py diff " << path << " <ids file> to see where";
  }
  EXPECT_TRUE(tok->decode(ids) == text) << "decode(encode(x)) != x for " << book;
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(secs, 2.0) << "tokenizing " << book << " is too slow";
#endif
}

TEST(SmolLM2Tokenizer, BookPrideAndPrejudice) { check_book("pride_and_prejudice.txt"); }
TEST(SmolLM2Tokenizer, BookTinyShakespeare) { check_book("tinyshakespeare.txt"); }
TEST(SmolLM2Tokenizer, BookWarAndPeace) { check_book("war_and_peace.txt"); }

// Every code point in a few contexts (see tools/tokenizer_golden.py): checks
// the generated category tables against llama.cpp's.
TEST(SmolLM2Tokenizer, UnicodeSweep) {
  EMBER_REQUIRE_SMOLLM2(tok);
  const auto lines = read_lines(golden_path("smollm2_unicode.txt"));
  int blocks = 0;
  for (const std::string& line : lines) {
    if (line.rfind("block ", 0) != 0) continue;
    std::istringstream in(line.substr(6));
    std::string first_hex, last_hex;
    in >> first_hex >> last_hex;
    const uint32_t first = std::stoul(first_hex, nullptr, 16), last = std::stoul(last_hex, nullptr, 16);
    std::string text;
    for (uint32_t cp = first; cp <= last; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string c;
      unicode::append_utf8(c, cp);
      text += "x" + c + "y " + c + "y" + c + c + " 1" + c + "\n";
    }
    const auto ids = tok->encode(text, false, false);
    char fnv[32];
    std::snprintf(fnv, sizeof fnv, "%016llx", static_cast<unsigned long long>(fnv1a_ids(ids.data(), ids.size())));
    EXPECT_TRUE(std::to_string(ids.size()) == field(line, "tokens") && fnv == field(line, "ids_fnv"))
        << "code points " << first_hex << ".." << last_hex << ": got tokens=" << ids.size() << " ids_fnv=" << fnv
        << ", golden: " << line;
    ++blocks;
  }
  EXPECT_EQ(blocks, 0x110000 / 4096);
}

// Tokens of emoji and CJK text often end inside a character: the streaming
// detokenizer must hold those bytes back and still reproduce the text.
TEST(SmolLM2Tokenizer, StreamingSplitsNoCharacter) {
  EMBER_REQUIRE_SMOLLM2(tok);
  const std::string text =
      "Family: \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok "
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD! "
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xF0\x9F\xAB\xA8 caf\xC3\xA9 \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7";
  const auto ids = tok->encode(text, false, false);
  StreamingDetokenizer stream(*tok);
  std::string all;
  int held = 0;
  for (int32_t id : ids) {
    const std::string piece = tok->token_to_piece(id);
    const std::string out = stream.feed(id);
    EXPECT_TRUE(is_valid_utf8(out)) << testing::PrintToString(out);
    if (!is_valid_utf8(piece)) ++held;  // this token alone is not whole UTF-8
    all += out;
  }
  all += stream.flush();
  EXPECT_EQ(all, text);
  EXPECT_GT(held, 3) << "expected tokens that split characters";
}

}  // namespace
}  // namespace ember
