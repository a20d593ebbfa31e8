// Ids to text: decode (the pieces as they are), detokenize_llama
// (llama.cpp's llama_detokenize) and the streaming detokenizer.
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

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  size_t total = 0;
  for (int32_t id : ids) {
    check_id(id, n_vocab());
    total += pieces_[id].size();
  }
  std::string out;
  out.reserve(total);
  for (int32_t id : ids) out += pieces_[id];
  return out;
}

// ---------------------------------------------------------------------------
// llama_detokenize

std::string Tokenizer::detokenize_llama(const int32_t* ids, size_t n, bool remove_special, bool unparse_special) const {
  for (size_t i = 0; i < n; ++i) check_id(ids[i], n_vocab());
  bool remove_space = add_space_prefix_;
  if (remove_special && add_bos_ && n > 0 && ids[0] == bos_) {
    remove_space = false;
    ++ids;
    --n;
  }
  if (remove_special && add_eos_ && n > 0 && ids[n - 1] == eos_) --n;
  std::string text;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    const bool strip = remove_space;
    remove_space = false;
    if (!unparse_special && (attrs_[id] & (kAttrUnknown | kAttrControl))) continue;
    const std::string_view piece = pieces_[static_cast<size_t>(id)];
    text.append(piece, strip && !piece.empty() && piece[0] == ' ' ? 1 : 0, std::string::npos);
  }
  if (!clean_spaces_ || text.empty()) return text;

  // llama.cpp's clean-up passes, done in place exactly as there.
  char* t = text.data();
  const int64_t total0 = static_cast<int64_t>(text.size());
  // first pass: " ?", " !", " .", " ," lose the space
  int64_t total = 1;
  for (int64_t i = 1; i < total0; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    t[total++] = x;
  }
  // second pass: a single apostrophe between spaces loses both spaces
  const int64_t total2 = total;
  total = total2 ? 1 : 0;
  for (int64_t i = 1; i < total2; ++i) {
    const char x = t[i];
    if (x == '\'' && i + 1 < total2 && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --total;
      t[++i] = '\0';
    }
    t[total++] = x;
  }
  // third pass: " 's", " 'm", " 're", " 've" lose the space
  const int64_t total3 = total;
  total = total3 ? 1 : 0;
  for (int64_t i = 1; i < total3; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    t[total++] = x;
  }
  text.resize(static_cast<size_t>(total));
  return text;
}

// ---------------------------------------------------------------------------
// Streaming detokenizer

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool render_special)
    : tok_(&tokenizer), render_special_(render_special) {}

namespace {

// Appends the longest prefix of `buf` that is whole UTF-8 (invalid sequences
// become U+FFFD) and returns the number of bytes consumed; an incomplete
// sequence at the end is left unless `final`.
size_t drain_utf8(const std::string& buf, std::string& out, bool final) {
  size_t pos = 0;
  while (pos < buf.size()) {
    uint32_t cp;
    size_t len;
    bool incomplete = false;
    if (unicode::decode_utf8(buf, pos, &cp, &len, &incomplete)) {
      out.append(buf, pos, len);
    } else {
      if (incomplete && !final) break;
      unicode::append_utf8(out, unicode::kReplacementChar);
    }
    pos += len;
  }
  return pos;
}

}  // namespace

std::string StreamingDetokenizer::feed(int32_t id) {
  std::string piece = tok_->token_to_piece(id);  // throws on a bad id before touching state
  if (!render_special_ && (tok_->is_control(id) || tok_->token_type(id) == Tokenizer::TokenType::kUnknown))
    piece.clear();
  pending_ += piece;
  std::string out;
  const size_t used = drain_utf8(pending_, out, false);
  pending_.erase(0, used);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  drain_utf8(pending_, out, true);
  pending_.clear();
  return out;
}

std::string Tokenizer::detokenize(const int32_t* ids, size_t n) const {
  StreamingDetokenizer detok(*this);
  std::string out;
  for (size_t i = 0; i < n; ++i) out += detok.feed(ids[i]);
  out += detok.flush();
  return out;
}

}  // namespace ember
