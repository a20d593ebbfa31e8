// Tokenizer::encode: special-token partitioning (as llama.cpp), then each
// raw fragment through BPE (bpe.cpp) or SentencePiece (spm.cpp).
#include "core/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <unordered_map>

#include "core/gguf/gguf.h"
#include "core/tokenizer/pretokenize.h"
#include "core/tokenizer/tokenizer_impl.h"
#include "core/tokenizer/unicode.h"
#include "core/util/hash.h"
#include "core/util/status.h"

namespace ember {

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

// ---------------------------------------------------------------------------
// Encoding

namespace {

// One piece of the input after special-token partitioning.
struct Fragment {
  size_t begin, end;  // byte range of the raw text (unused for tokens)
  int32_t token;      // -1: raw text
};

bool c_isspace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  if (const size_t bad = vocab_type_ == VocabType::kBpe ? unicode::find_invalid_utf8(text) : std::string_view::npos;
      bad != std::string_view::npos)
    fail(StatusCode::kInvalidArgument,
         "tokenizer: input is not valid UTF-8: invalid UTF-8 at byte " + std::to_string(bad));

  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && add_bos_) out.push_back(bos_);

  // Special-token partitioning, as llama.cpp's tokenizer_st_partition: for
  // each special token, longest first, every non-overlapping occurrence inside
  // a still-raw fragment becomes a token fragment.
  std::vector<Fragment> frags;
  if (!text.empty()) {
    // All occurrences of eligible special tokens, grouped by token.
    std::vector<std::vector<size_t>> occ;
    bool any = false;
    if (!special_tokens_.empty()) {
      occ.resize(special_tokens_.size());
      for (size_t p = 0; p < text.size(); ++p) {
        for (uint32_t len : impl_->special_lengths_by_first_byte[static_cast<uint8_t>(text[p])]) {
          if (text.size() - p < len) continue;
          const auto it = impl_->special_index.find(text.substr(p, len));
          if (it == impl_->special_index.end()) continue;
          const int32_t k = it->second;
          if (!parse_special && (attrs_[special_tokens_[k]] & (kAttrControl | kAttrUnknown))) continue;
          occ[k].push_back(p);
          any = true;
        }
      }
    }
    if (!any) {
      frags.push_back(Fragment{0, text.size(), -1});
    } else {
      std::map<size_t, Fragment> parts;  // by begin
      parts.emplace(0, Fragment{0, text.size(), -1});
      for (size_t k = 0; k < occ.size(); ++k) {
        const int32_t id = special_tokens_[k];
        const size_t len = tokens_[id].size();
        for (size_t p : occ[k]) {
          auto it = parts.upper_bound(p);
          if (it == parts.begin()) continue;
          --it;
          const Fragment f = it->second;
          if (f.token >= 0 || p < f.begin || p + len > f.end) continue;  // claimed, or crosses a boundary
          parts.erase(it);
          size_t lb = f.begin, le = p;
          if (attrs_[id] & kAttrLstrip)
            while (le > lb && c_isspace(text[le - 1])) --le;
          if (le > lb) parts.emplace(lb, Fragment{lb, le, -1});
          parts.emplace(p, Fragment{p, p + len, id});
          size_t rb = p + len, re = f.end;
          if (attrs_[id] & kAttrRstrip)
            while (rb < re && c_isspace(text[rb])) ++rb;
          if (re > rb) parts.emplace(rb, Fragment{rb, re, -1});
        }
      }
      for (auto& [b, f] : parts) frags.push_back(f);
    }
  }

  // SPM: a space prefix at the start and after each special token.
  bool prev_special = true;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.begin, f.end - f.begin);
    switch (vocab_type_) {
      case VocabType::kBpe: encode_bpe_fragment(raw, out); break;
      case VocabType::kSpm: encode_spm_fragment(raw, add_space_prefix_ && prev_special, out); break;
    }
    prev_special = false;
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

}  // namespace ember
