// libFuzzer target: the tokenizer's encode and decode and the streaming
// detokenizer, on synthetic byte-level BPE vocabularies (tests/fuzz/fuzz_vocab.h)
// with each pre-tokenizer rule set. No model file is needed.
//
// Input: byte 0 selects the vocabulary (bits 0-1: gpt-2, smollm, llama3,
// default) and the flags (bit 2 add_special, bit 3 parse_special, bit 4
// render_special); the rest is the text to encode, and is also read as
// little-endian 16-bit token ids (some out of range) for decoding.
//
// Promises checked: encode accepts valid UTF-8 and rejects anything else with
// kInvalidArgument; ids are in range; decode(encode(text)) == text; the
// streaming detokenizer always emits valid UTF-8, rejects out-of-range ids
// without changing its state, and emits exactly decode(ids) when that is
// valid UTF-8.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"
#include "core/util/utf8.h"
#include "fuzz_util.h"
#include "fuzz_vocab.h"

namespace ember::fuzz {
namespace {

const char* const kPres[4] = {"gpt-2", "smollm", "llama3", "default"};
std::unique_ptr<Tokenizer> g_tok[4];

void check_roundtrip(const Tokenizer& tok, std::string_view text, bool add_special, bool parse_special) {
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, add_special, parse_special);
  } catch (const Error& e) {
    EMBER_FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument);
    EMBER_FUZZ_CHECK(!is_valid_utf8(text));
    return;
  }
  EMBER_FUZZ_CHECK(is_valid_utf8(text));
  for (int32_t id : ids) EMBER_FUZZ_CHECK(id >= 0 && id < tok.n_vocab());
  std::string expect(text);
  if (add_special) {
    if (tok.add_bos() && tok.bos() >= 0) expect = tok.token_to_piece(tok.bos()) + expect;
    if (tok.add_eos() && tok.eos() >= 0) expect += tok.token_to_piece(tok.eos());
  }
  EMBER_FUZZ_CHECK(tok.decode(ids) == expect);
}

void check_detokenizer(const Tokenizer& tok, const std::vector<int32_t>& ids, bool render_special) {
  StreamingDetokenizer detok(tok, render_special);
  std::string streamed;
  std::vector<int32_t> valid;
  for (int32_t id : ids) {
    const size_t pending = detok.pending_bytes();
    try {
      const std::string piece = detok.feed(id);
      EMBER_FUZZ_CHECK(is_valid_utf8(piece));
      streamed += piece;
      valid.push_back(id);
    } catch (const Error& e) {
      EMBER_FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument);
      EMBER_FUZZ_CHECK(id < 0 || id >= tok.n_vocab());
      EMBER_FUZZ_CHECK(detok.pending_bytes() == pending);
    }
  }
  const std::string tail = detok.flush();
  EMBER_FUZZ_CHECK(is_valid_utf8(tail));
  EMBER_FUZZ_CHECK(detok.pending_bytes() == 0);
  streamed += tail;
  if (render_special) {
    const std::string whole = tok.decode(valid);
    if (is_valid_utf8(whole)) EMBER_FUZZ_CHECK(streamed == whole);
  }
  // decode rejects out-of-range ids.
  if (valid.size() != ids.size()) {
    try {
      (void)tok.decode(ids);
      EMBER_FUZZ_CHECK(false && "decode accepted an out-of-range id");
    } catch (const Error& e) {
      EMBER_FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument);
    }
  }
}

void write_seeds(const std::string& dir) {
  const char* const texts[] = {
      "Hello world",
      "The quick brown fox's 12345 jumps\n\nover  the lazy dog.",
      "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
      "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 emoji",
      "  leading spaces\ttabs\r\nand\xC2\xA0nbsp",
      "<tool_call>{\"name\": \"x\"}</tool_call><unk><|endoftext|>",
      "I'm you're we'll they've 3.14159 1,000,000",
      "\xE2\x96\x81user \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7",
      "bad utf8 \xC3\x28 and \xED\xA0\x80 surrogate",
  };
  int i = 0;
  for (const char* t : texts) {
    for (uint8_t flags : {uint8_t(0x00), uint8_t(0x1D), uint8_t(0x0E), uint8_t(0x13)}) {
      std::string s(1, static_cast<char>((flags & ~3) | (i & 3)));
      s += t;
      write_seed(dir, "text" + std::to_string(i), s);
      ++i;
    }
  }
}

}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace ember::fuzz;
  write_seeds_if_asked(write_seeds);
  for (int i = 0; i < 4; ++i) g_tok[i] = ember::Tokenizer::from_vocab(synthetic_vocab(kPres[i]));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember::fuzz;
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const ember::Tokenizer& tok = *g_tok[flags & 3];
  const bool add_special = flags & 4, parse_special = flags & 8, render_special = flags & 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  check_roundtrip(tok, text, add_special, parse_special);

  std::vector<int32_t> ids;
  for (size_t i = 1; i + 1 < size; i += 2) {
    uint16_t v;
    std::memcpy(&v, data + i, 2);
    // Mostly in range, some just past the end, some negative.
    const int32_t range = tok.n_vocab() + 8;
    ids.push_back(v & 0x8000 ? static_cast<int32_t>(v % range) - 4 : static_cast<int32_t>(v % tok.n_vocab()));
  }
  check_detokenizer(tok, ids, render_special);
  return 0;
}
