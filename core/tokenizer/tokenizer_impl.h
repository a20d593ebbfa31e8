// Internal to the tokenizer, shared by its files:
//   tokenizer.cpp    encode(): special tokens, then BPE or SentencePiece;
//   vocab.cpp        loading a vocabulary (GGUF metadata, checks, special
//                    tokens, pieces) and the token queries;
//   bpe.cpp          byte-level BPE (pre-tokenized words, merges);
//   spm.cpp          SentencePiece;
//   detokenizer.cpp  ids to text: decode, detokenize_llama, the streaming
//                    detokenizer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/util/hash.h"
#include "core/util/status.h"

namespace ember {

// Token attribute bits (same values as llama.cpp's llama_token_attr).
constexpr uint16_t kAttrUndefined = 0;
constexpr uint16_t kAttrUnknown = 1 << 0;
constexpr uint16_t kAttrUnused = 1 << 1;
constexpr uint16_t kAttrNormal = 1 << 2;
constexpr uint16_t kAttrControl = 1 << 3;
constexpr uint16_t kAttrUserDefined = 1 << 4;
constexpr uint16_t kAttrByte = 1 << 5;
constexpr uint16_t kAttrLstrip = 1 << 7;
constexpr uint16_t kAttrRstrip = 1 << 8;

// ---------------------------------------------------------------------------
// BPE merge table: (left id, right id) -> (rank, merged id), open addressing.

struct MergeTable {
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  std::vector<Slot> slots;
  uint64_t mask = 0;

  static uint64_t key_of(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  static uint64_t hash(uint64_t k) { return mix64(k); }
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap * 3 < n * 4) cap <<= 1;  // at most 3/4 full (48,900 merges: 1 MiB, not 2)
    slots.assign(cap, Slot{});
    mask = cap - 1;
  }
  // Keeps the first (lowest-rank) entry for a pair, like llama.cpp's emplace.
  void insert(int32_t l, int32_t r, int32_t rank, int32_t merged) {
    const uint64_t k = key_of(l, r);
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return;
      if (slots[i].key == kEmpty) {
        slots[i] = Slot{k, rank, merged};
        return;
      }
    }
  }
  const Slot* find(int32_t l, int32_t r) const {
    const uint64_t k = key_of(l, r);
    for (uint64_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

struct Tokenizer::Impl {
  MergeTable merges;
  // Id of the token for each byte, -1 if none: BPE the byte-level alphabet
  // symbol, SPM "<0xXX>" (else the one-byte text, as llama.cpp's byte_to_token).
  std::array<int32_t, 256> byte_token{};
  // Special-token matching: the distinct text lengths of the special tokens
  // starting with each byte (longest first), and text -> index into
  // special_tokens_.
  std::array<std::vector<uint32_t>, 256> special_lengths_by_first_byte;
  std::unordered_map<std::string_view, int32_t> special_index;
};

inline void check_id(int32_t id, int32_t n) {
  if (id < 0 || id >= n)
    fail(StatusCode::kInvalidArgument,
         "tokenizer: token id " + std::to_string(id) + " is out of range [0, " + std::to_string(n) + ")");
}

}  // namespace ember
