// SentencePiece (tokenizer.ggml.model = "llama").
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

// SentencePiece, as llama.cpp's llm_tokenizer_spm_session: the text (spaces
// escaped to U+2581) starts as one symbol per UTF-8 character (by lead byte,
// so invalid bytes form symbols too); adjacent symbols whose concatenation is
// a token are merged, highest token score first, ties to the leftmost pair;
// each final symbol is its token, or byte tokens when it is none. (llama.cpp's
// resegment() recursion through its rev_merge map never applies: every merged
// symbol is a token, and rev_merge only holds token texts.)
void Tokenizer::encode_spm_fragment(std::string_view raw, bool space_prefix, std::vector<int32_t>& out) const {
  static constexpr char kEscapedSpace[] = "\xE2\x96\x81";
  std::string text;
  text.reserve(raw.size() + raw.size() / 4 + 3);
  if (space_prefix) text += kEscapedSpace;
  for (char c : raw) {
    if (c == ' ') {
      text += kEscapedSpace;
    } else {
      text.push_back(c);
    }
  }
  if (text.empty()) return;

  struct Symbol {
    uint32_t off, n;  // byte range in text; n == 0 once merged into its left neighbour
    int32_t prev, next;
  };
  struct Bigram {
    int32_t left, right;
    float score;
    uint32_t size;
  };
  // llama.cpp's priority_queue comparator (the same heap operations, so even
  // equal keys pop in the same order).
  struct Comp {
    bool operator()(const Bigram& l, const Bigram& r) const {
      return (l.score < r.score) || (l.score == r.score && l.left > r.left);
    }
  };
  static const uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};

  std::vector<Symbol> syms;
  syms.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min<size_t>(kLen[static_cast<uint8_t>(text[off]) >> 4], text.size() - off);
    const int32_t idx = static_cast<int32_t>(syms.size());
    off += len;
    syms.push_back(Symbol{static_cast<uint32_t>(off - len), static_cast<uint32_t>(len), idx - 1,
                          off == text.size() ? -1 : idx + 1});
  }

  std::vector<Bigram> heap;
  heap.reserve(syms.size());
  const std::string_view tv(text);
  auto try_add = [&](int32_t l, int32_t r) {
    if (l == -1 || r == -1) return;
    const uint32_t size = syms[l].n + syms[r].n;
    const int32_t id = find_token(tv.substr(syms[l].off, size));
    if (id < 0) return;
    heap.push_back(Bigram{l, r, scores_[id], size});
    std::push_heap(heap.begin(), heap.end(), Comp{});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), Comp{});
    const Bigram bg = heap.back();
    heap.pop_back();
    Symbol& l = syms[bg.left];
    Symbol& r = syms[bg.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;  // outdated
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }

  for (int32_t i = 0; i != -1; i = syms[i].next) {
    const Symbol& s = syms[i];
    const int32_t id = find_token(tv.substr(s.off, s.n));
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (uint32_t j = 0; j < s.n; ++j) {
      // Byte fallback. A vocabulary without the byte token (llama.cpp throws
      // std::out_of_range there) gets the unknown token, or nothing.
      const int32_t b = impl_->byte_token[static_cast<uint8_t>(text[s.off + j])];
      if (b >= 0) {
        out.push_back(b);
      } else if (unk_ >= 0) {
        out.push_back(unk_);
      }
    }
  }
}

}  // namespace ember
