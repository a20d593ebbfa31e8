// Gemma 3 270M (SentencePiece "llama" vocabulary, 262,144 tokens) against
// golden output of llama.cpp (tests/golden/tokenizer/gemma3_*.txt, made by
// tools/tokenizer_golden.py gen-gemma3). The tokenizer is built from the
// GGUF's metadata directly, so these tests do not depend on Model::load
// supporting the gemma3 architecture. Skipped when the model file is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode.h"
#include "core/util/status.h"
#include "tok_test_util.h"

namespace ember {
namespace {

using namespace tok_test;

std::string hex16(uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Lines of gemma3_detok.txt that start with `prefix`.
std::string detok_line(const std::string& prefix) {
  for (const std::string& line : read_lines(golden_path("gemma3_detok.txt")))
    if (line.rfind(prefix, 0) == 0) return line;
  return {};
}

TEST(Gemma3Tokenizer, Metadata) {
  EMBER_REQUIRE_GEMMA3(tok);
  EXPECT_EQ(tok->n_vocab(), 262144);
  EXPECT_EQ(tok->vocab_type(), Tokenizer::VocabType::kSpm);
  EXPECT_EQ(tok->pre_name(), "default");
  EXPECT_EQ(tok->bos(), 2);
  EXPECT_EQ(tok->eos(), 1);
  EXPECT_EQ(tok->eot(), 106);  // <end_of_turn>, found by its text as llama.cpp does
  EXPECT_EQ(tok->unk(), 3);
  EXPECT_EQ(tok->pad(), 0);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  EXPECT_FALSE(tok->add_space_prefix());  // tokenizer.ggml.add_space_prefix = false in this file
  EXPECT_EQ(tok->token_text(105), "<start_of_turn>");
  EXPECT_EQ(tok->token_type(107), Tokenizer::TokenType::kUserDefined);  // "\n"
  EXPECT_EQ(tok->token_to_piece(26352), " Hello");
  EXPECT_EQ(tok->token_to_piece(493), "\xFF");  // <0xFF>

  // llama.cpp's view (gemma3_detok.txt): special ids, EOG set, control count.
  const std::string special = detok_line("special ");
  ASSERT_FALSE(special.empty());
  EXPECT_EQ(field(special, "bos"), std::to_string(tok->bos()));
  EXPECT_EQ(field(special, "eos"), std::to_string(tok->eos()));
  EXPECT_EQ(field(special, "eot"), std::to_string(tok->eot()));
  EXPECT_EQ(field(special, "pad"), std::to_string(tok->pad()));
  EXPECT_EQ(field(special, "add_bos"), tok->add_bos() ? "1" : "0");
  EXPECT_EQ(field(special, "add_eos"), tok->add_eos() ? "1" : "0");
  const std::string eog = detok_line("eog ");
  ASSERT_FALSE(eog.empty());
  EXPECT_EQ(tok->eog_ids(), parse_ids(eog.substr(4)));
  const std::string control = detok_line("control ");
  ASSERT_FALSE(control.empty());
  int n_control = 0;
  for (int32_t id = 0; id < tok->n_vocab(); ++id) n_control += tok->is_control(id);
  EXPECT_EQ(std::to_string(n_control), control.substr(8));
}

// Loading the 262k-token vocabulary (GGUF metadata -> ready tokenizer).
TEST(Gemma3Tokenizer, LoadTime) {
  const std::string path = gemma3_model_path();
  if (!file_exists(path)) GTEST_SKIP() << "model not found: " << path;
  const auto t0 = std::chrono::steady_clock::now();
  auto file = gguf::GgufFile::open(path);
  const auto t1 = std::chrono::steady_clock::now();
  Tokenizer::Vocab v = Tokenizer::vocab_from_gguf(*file);
  const auto t2 = std::chrono::steady_clock::now();
  auto tok = Tokenizer::from_vocab(std::move(v));
  const auto t3 = std::chrono::steady_clock::now();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf("gemma3 vocabulary: open %.1f ms, vocab_from_gguf %.1f ms, from_vocab %.1f ms, total %.1f ms\n",
              ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t0, t3));
  EXPECT_EQ(tok->n_vocab(), 262144);
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(ms(t0, t3), 1000.0) << "loading the Gemma 3 vocabulary is too slow";
#endif
}

TEST(Gemma3Tokenizer, GoldenCases) {
  EMBER_REQUIRE_GEMMA3(tok);
  const std::string path = golden_path("gemma3_cases.txt");
  const auto lines = read_lines(path);
  ASSERT_FALSE(lines.empty()) << path;
  std::string name, flags, text;
  int n = 0, failed = 0;
  size_t n_ids = 0;
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
      const auto got = tok->encode(text, add_special, parse_special);
      ++n;
      n_ids += want.size();
      if (got != want) {
        ++failed;
        ADD_FAILURE() << "case " << name << " (" << flags << ") text " << testing::PrintToString(text)
                      << "\n  want: " << ids_str(want) << "\n  got:  " << ids_str(got);
      }
      // (Decoding is checked against llama.cpp's own detokenizer in GoldenDetokenize: a round trip is
      // not the identity for every text, e.g. invalid UTF-8 splits the escaped spaces into byte tokens.)
    }
  }
  EXPECT_EQ(failed, 0);
  EXPECT_GT(n, 900);
  std::printf("gemma3: %d cases, %zu ids compared\n", n, n_ids);
}

TEST(Gemma3Tokenizer, GoldenDetokenize) {
  EMBER_REQUIRE_GEMMA3(tok);
  const auto lines = read_lines(golden_path("gemma3_detok.txt"));
  std::string name;
  std::vector<int32_t> ids;
  int n = 0;
  for (const std::string& line : lines) {
    if (line.rfind("detok ", 0) == 0) {
      name = line.substr(6);
    } else if (line.rfind("ids ", 0) == 0) {
      ids = parse_ids(line.substr(4));
    } else if (line.rfind("out ", 0) == 0) {
      const bool remove_special = line[4] == '1', unparse_special = line[5] == '1';
      const std::string want = from_hex(line.substr(7));
      EXPECT_EQ(tok->detokenize_llama(ids.data(), ids.size(), remove_special, unparse_special), want)
          << name << " remove_special=" << remove_special << " unparse_special=" << unparse_special;
      ++n;
    } else if (line.rfind("pieces ", 0) == 0) {
      // llama_token_to_piece(id, lstrip=0, special) for every id; here the
      // single-token detokenize_llama (no space prefix to strip in this vocab).
      const bool special = field(line, "special") == "1";
      ASSERT_EQ(field(line, "n"), std::to_string(tok->n_vocab()));
      uint64_t h = kFnvOffset;
      for (int32_t id = 0; id < tok->n_vocab(); ++id) {
        const std::string piece = tok->detokenize_llama(&id, 1, false, special);
        const uint32_t len = static_cast<uint32_t>(piece.size());
        std::string len_bytes(4, '\0');
        for (int k = 0; k < 4; ++k) len_bytes[k] = static_cast<char>((len >> (8 * k)) & 0xFF);
        h = fnv1a_bytes(len_bytes, h);
        h = fnv1a_bytes(piece, h);
        if (special) {
          EXPECT_EQ(piece, tok->token_to_piece(id));
        }
      }
      EXPECT_EQ(hex16(h), field(line, "fnv")) << "token pieces, special=" << special;
      ++n;
    }
  }
  EXPECT_GT(n, 1500);
}

void check_book(const std::string& book) {
  EMBER_REQUIRE_GEMMA3(tok);
  std::string head;
  std::vector<std::pair<size_t, uint64_t>> checkpoints;
  std::vector<int32_t> sample;
  for (const std::string& line : read_lines(golden_path("gemma3_books.txt"))) {
    if (line.rfind("book " + book + " ", 0) == 0) head = line;
    if (line.rfind("checkpoint " + book + " ", 0) == 0) {
      std::istringstream in(line.substr(12 + book.size()));
      size_t count;
      std::string hex;
      in >> count >> hex;
      checkpoints.emplace_back(count, std::stoull(hex, nullptr, 16));
    }
    if (line.rfind("sample " + book + " 0 ", 0) == 0) sample = parse_ids(line.substr(10 + book.size()));
  }
  ASSERT_FALSE(head.empty()) << "no golden line for " << book;
  const std::string path = data_dir() + "/" + book;
  if (!file_exists(path)) GTEST_SKIP() << "book not found: " << path;
  const std::string text = read_file(path);
  ASSERT_EQ(std::to_string(text.size()), field(head, "bytes")) << path << " changed; regenerate the golden file";
  ASSERT_EQ(hex16(fnv1a_bytes(text)), field(head, "text_fnv")) << path << " changed; regenerate the golden file";

  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text, false, false);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("gemma3 %s: %zu bytes -> %zu tokens in %.3f s (%.2f MB/s, %.0f tokens/s)\n", book.c_str(), text.size(),
              ids.size(), secs, text.size() / secs / 1e6, ids.size() / secs);

  ASSERT_FALSE(sample.empty());
  const std::vector<int32_t> head_ids(ids.begin(), ids.begin() + std::min(ids.size(), sample.size()));
  EXPECT_EQ(head_ids, sample) << "the first " << sample.size() << " ids differ";
  const std::string fnv = hex16(fnv1a_ids(ids.data(), ids.size()));
  if (std::to_string(ids.size()) != field(head, "tokens") || fnv != field(head, "ids_fnv")) {
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
                  << (good + 65536) << (dumped.empty() ? "" : "\n  ids written to " + dumped)
                  << "\n  see tools/tokenizer_golden.py diff --model <gemma gguf>";
  }
  EXPECT_TRUE(tok->decode(ids) == text) << "decode(encode(x)) != x for " << book;
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  EXPECT_LT(secs, 5.0) << "tokenizing " << book << " is too slow";
#endif
}

TEST(Gemma3Tokenizer, BookPrideAndPrejudice) { check_book("pride_and_prejudice.txt"); }
TEST(Gemma3Tokenizer, BookTinyShakespeare) { check_book("tinyshakespeare.txt"); }
TEST(Gemma3Tokenizer, BookWarAndPeace) { check_book("war_and_peace.txt"); }

TEST(Gemma3Tokenizer, UnicodeSweep) {
  EMBER_REQUIRE_GEMMA3(tok);
  int blocks = 0;
  for (const std::string& line : read_lines(golden_path("gemma3_unicode.txt"))) {
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
    const std::string fnv = hex16(fnv1a_ids(ids.data(), ids.size()));
    EXPECT_TRUE(std::to_string(ids.size()) == field(line, "tokens") && fnv == field(line, "ids_fnv"))
        << "code points " << first_hex << ".." << last_hex << ": got tokens=" << ids.size() << " ids_fnv=" << fnv
        << ", golden: " << line;
    ++blocks;
  }
  EXPECT_EQ(blocks, 0x110000 / 4096);
}

// Byte-fallback tokens split characters: the stream holds them back and still
// reproduces the text; special tokens drop out with render_special=false.
TEST(Gemma3Tokenizer, Streaming) {
  EMBER_REQUIRE_GEMMA3(tok);
  const std::string text =
      "Family: \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 ok "
      "\xF0\x9F\xAB\xA8\xF0\x9F\xAA\xB7 \xF0\xB1\x8D\x90 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E caf\xC3\xA9\n\n\tx";
  const auto ids = tok->encode(text, false, false);
  StreamingDetokenizer stream(*tok);
  std::string all;
  int held = 0;
  for (int32_t id : ids) {
    const std::string out = stream.feed(id);
    EXPECT_TRUE(is_valid_utf8(out)) << testing::PrintToString(out);
    if (!is_valid_utf8(tok->token_to_piece(id))) ++held;
    all += out;
  }
  all += stream.flush();
  EXPECT_EQ(all, text);
  EXPECT_GT(held, 3) << "expected byte tokens";
  const auto chat = tok->encode("<start_of_turn>user\nHi<end_of_turn>\n", true, true);
  StreamingDetokenizer plain(*tok, false);
  std::string shown;
  for (int32_t id : chat) shown += plain.feed(id);
  shown += plain.flush();
  EXPECT_EQ(shown, "user\nHi\n");
  EXPECT_EQ(tok->detokenize(chat.data(), chat.size()), "<bos><start_of_turn>user\nHi<end_of_turn>\n");
}

}  // namespace
}  // namespace ember
