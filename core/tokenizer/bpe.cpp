// Byte-level BPE (tokenizer.ggml.model = "gpt2"): the pre-tokenizer's words
// (pretokenize.cpp), each merged from its bytes by merge rank (BpeSession).
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

namespace {

// Per-call BPE state: symbol list, merge queue and a cache of encoded words.
class BpeSession {
 public:
  BpeSession(const MergeTable& merges, const std::array<int32_t, 256>& byte_token, bool ignore_merges,
             const std::function<int32_t(std::string_view)>& find_token)
      : merges_(merges), byte_token_(byte_token), ignore_merges_(ignore_merges), find_token_(find_token) {}

  void encode_word(std::string_view word, std::vector<int32_t>& out) {
    if (word.size() == 1) {
      const int32_t id = byte_token_[static_cast<uint8_t>(word[0])];
      if (id >= 0) out.push_back(id);
      return;
    }
    const bool cacheable = word.size() <= kMaxCachedWordBytes;
    if (cacheable) {
      auto it = cache_.find(word);
      if (it != cache_.end()) {
        out.insert(out.end(), cache_ids_.begin() + it->second.first,
                   cache_ids_.begin() + it->second.first + it->second.second);
        return;
      }
    }
    const size_t before = out.size();
    bpe(word, out);
    if (cacheable && cache_.size() < kMaxCacheEntries) {
      const uint32_t off = static_cast<uint32_t>(cache_ids_.size());
      cache_ids_.insert(cache_ids_.end(), out.begin() + before, out.end());
      cache_.emplace(word, std::make_pair(off, static_cast<uint32_t>(out.size() - before)));
    }
  }

 private:
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 20;

  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  struct Bigram {
    int32_t rank;
    int32_t left, right;        // symbol indices
    int32_t left_id, right_id;  // ids when queued; stale if either changed
    int32_t merged;             // id of the merged token
  };
  // Min-heap order: lower rank first, then the leftmost pair (as llama.cpp).
  struct Later {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };

  void add_bigram(int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const int32_t lid = syms_[l].id, rid = syms_[r].id;
    if (lid < 0 || rid < 0) return;
    const MergeTable::Slot* s = merges_.find(lid, rid);
    if (!s) return;
    heap_.push_back(Bigram{s->rank, l, r, lid, rid, s->merged});
    std::push_heap(heap_.begin(), heap_.end(), Later{});
  }

  void bpe(std::string_view word, std::vector<int32_t>& out) {
    if (ignore_merges_) {
      encoded_.clear();
      for (char c : word) encoded_ += unicode::byte_to_utf8(static_cast<uint8_t>(c));
      const int32_t id = find_token_(encoded_);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    const int32_t n = static_cast<int32_t>(word.size());
    syms_.resize(n);
    for (int32_t i = 0; i < n; ++i)
      syms_[i] = Symbol{byte_token_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true};
    heap_.clear();
    for (int32_t i = 1; i < n; ++i) add_bigram(i - 1, i);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), Later{});
      const Bigram bg = heap_.back();
      heap_.pop_back();
      Symbol& l = syms_[bg.left];
      Symbol& r = syms_[bg.right];
      if (!l.alive || !r.alive || l.id != bg.left_id || r.id != bg.right_id) continue;  // outdated
      l.id = bg.merged;
      r.alive = false;
      l.next = r.next;
      if (r.next >= 0) syms_[r.next].prev = bg.left;
      add_bigram(l.prev, bg.left);
      add_bigram(bg.left, l.next);
    }
    for (int32_t i = 0; i != -1; i = syms_[i].next)
      if (syms_[i].id >= 0) out.push_back(syms_[i].id);  // a byte with no token is dropped, as in llama.cpp
  }

  const MergeTable& merges_;
  const std::array<int32_t, 256>& byte_token_;
  bool ignore_merges_;
  const std::function<int32_t(std::string_view)>& find_token_;
  std::vector<Symbol> syms_;
  std::vector<Bigram> heap_;
  std::string encoded_;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache_;
  std::vector<int32_t> cache_ids_;
};

}  // namespace

void Tokenizer::encode_bpe_fragment(std::string_view text, std::vector<int32_t>& out) const {
  // Code points (the input is valid UTF-8: encode() checked it).
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp;
    size_t len;
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      cp = static_cast<uint8_t>(text[pos]);
      len = 1;
    } else if (!unicode::decode_utf8(text, pos, &cp, &len)) {
      cp = unicode::kReplacementChar;  // unreachable
    }
    cps.push_back(cp);
    pos += len;
  }

  const std::function<int32_t(std::string_view)> find = [this](std::string_view s) { return find_token(s); };
  BpeSession session(impl_->merges, impl_->byte_token, ignore_merges_, find);
  // The pre-tokenizer reports consecutive words that cover all code points in
  // order, so a running byte cursor maps code point ranges to bytes.
  struct Sink : pretok::WordSink {
    std::string_view text;
    const uint32_t* cps = nullptr;
    size_t byte_pos = 0;
    BpeSession* session = nullptr;
    std::vector<int32_t>* out = nullptr;
    void word(size_t b, size_t e) override {
      size_t len = 0;
      for (size_t i = b; i < e; ++i) len += cps[i] < 0x80 ? 1 : cps[i] < 0x800 ? 2 : cps[i] < 0x10000 ? 3 : 4;
      session->encode_word(text.substr(byte_pos, len), *out);
      byte_pos += len;
    }
  } sink;
  sink.text = text;
  sink.cps = cps.data();
  sink.session = &session;
  sink.out = &out;
  pretok::split(pre_type_, cps.data(), cps.size(), sink);
}

}  // namespace ember
