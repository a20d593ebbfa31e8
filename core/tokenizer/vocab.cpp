// Loading a vocabulary (GGUF metadata, checks, special tokens, the pieces
// cache) and the token queries.
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

uint16_t attr_from_type(int32_t type) {
  switch (static_cast<Tokenizer::TokenType>(type)) {
    case Tokenizer::TokenType::kNormal: return kAttrNormal;
    case Tokenizer::TokenType::kUnknown: return kAttrUnknown;
    case Tokenizer::TokenType::kControl: return kAttrControl;
    case Tokenizer::TokenType::kUserDefined: return kAttrUserDefined;
    case Tokenizer::TokenType::kUnused: return kAttrUnused;
    case Tokenizer::TokenType::kByte: return kAttrByte;
    case Tokenizer::TokenType::kUndefined: return kAttrUndefined;
  }
  return kAttrUndefined;
}

[[noreturn]] void bad_format(const std::string& msg) { fail(StatusCode::kBadFormat, "tokenizer: " + msg); }

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 64)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7F) {
      out += c;
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

// Texts llama.cpp uses to find the EOT token when the metadata has none. The
// order here is our priority (llama.cpp takes whichever it meets first while
// iterating a hash map).
const char* const kEotTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",  // <｜end▁of▁sentence｜>
    "<end_of_utterance>",
    "<|endoftext|>",
    "<|end_of_text|>",
};
const char* const kEomTexts[] = {"<|eom_id|>"};
const char* const kFimPreTexts[] = {"<|fim_prefix|>",
                                    "<fim-prefix>",
                                    "<fim_prefix>",
                                    "<\xef\xbd\x9c"
                                    "fim\xe2\x96\x81"
                                    "begin\xef\xbd\x9c>",
                                    "<PRE>",
                                    "\xe2\x96\x81<PRE>",
                                    "<|code_prefix|>",
                                    "<|prefix|>"};
const char* const kFimSufTexts[] = {"<|fim_suffix|>",
                                    "<fim-suffix>",
                                    "<fim_suffix>",
                                    "<\xef\xbd\x9c"
                                    "fim\xe2\x96\x81hole\xef\xbd\x9c>",
                                    "<SUF>",
                                    "\xe2\x96\x81<SUF>",
                                    "<|code_suffix|>",
                                    "<|suffix|>"};
const char* const kFimMidTexts[] = {"<|fim_middle|>",
                                    "<fim-middle>",
                                    "<fim_middle>",
                                    "<\xef\xbd\x9c"
                                    "fim\xe2\x96\x81"
                                    "end\xef\xbd\x9c>",
                                    "<MID>",
                                    "\xe2\x96\x81<MID>",
                                    "<|code_middle|>",
                                    "<|middle|>"};
const char* const kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
const char* const kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
const char* const kFimSepTexts[] = {"<|file_sep|>"};

// Tokens that end generation by their text (llama.cpp's list).
const char* const kEogTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "[e~[",
};

}  // namespace

// ---------------------------------------------------------------------------
// Loading

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::GgufFile& f) { return from_vocab(vocab_from_gguf(f)); }

Tokenizer::Vocab Tokenizer::vocab_from_gguf(const gguf::GgufFile& f) {
  // The array under `key` (nullptr when absent) after checking its element type.
  auto array = [&](const char* key, std::initializer_list<gguf::ValueType> elems) -> const gguf::Value* {
    const gguf::Value* val = f.find(key);
    if (!val) return nullptr;
    if (val->type != gguf::ValueType::ARRAY) bad_format(std::string(key) + " is not an array");
    if (std::find(elems.begin(), elems.end(), val->array_type) == elems.end())
      bad_format(std::string(key) + " has elements of type " + gguf::value_type_name(val->array_type));
    return val;
  };

  Vocab v;
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) bad_format("missing tokenizer.ggml.model");
  v.model = *model;
  v.pre = f.get_string("tokenizer.ggml.pre");
  if (!array("tokenizer.ggml.tokens", {gguf::ValueType::STRING})) bad_format("missing tokenizer.ggml.tokens");
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (array("tokenizer.ggml.token_type", {gguf::ValueType::INT32, gguf::ValueType::UINT32}))
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) v.token_types.push_back(static_cast<int32_t>(t));
  if (array("tokenizer.ggml.scores", {gguf::ValueType::FLOAT32, gguf::ValueType::INT32}))
    v.scores = f.get_float_array("tokenizer.ggml.scores");
  if (array("tokenizer.ggml.merges", {gguf::ValueType::STRING})) v.merges = f.get_string_array("tokenizer.ggml.merges");
  v.bos = f.get_int("tokenizer.ggml.bos_token_id");
  v.eos = f.get_int("tokenizer.ggml.eos_token_id");
  v.eot = f.get_int("tokenizer.ggml.eot_token_id");
  v.eom = f.get_int("tokenizer.ggml.eom_token_id");
  v.unk = f.get_int("tokenizer.ggml.unknown_token_id");
  v.sep = f.get_int("tokenizer.ggml.seperator_token_id");  // sic: the GGUF key is misspelled
  v.pad = f.get_int("tokenizer.ggml.padding_token_id");
  v.fim_pre = f.get_int("tokenizer.ggml.fim_pre_token_id");
  if (!v.fim_pre) v.fim_pre = f.get_int("tokenizer.ggml.prefix_token_id");  // deprecated names
  v.fim_suf = f.get_int("tokenizer.ggml.fim_suf_token_id");
  if (!v.fim_suf) v.fim_suf = f.get_int("tokenizer.ggml.suffix_token_id");
  v.fim_mid = f.get_int("tokenizer.ggml.fim_mid_token_id");
  if (!v.fim_mid) v.fim_mid = f.get_int("tokenizer.ggml.middle_token_id");
  v.fim_pad = f.get_int("tokenizer.ggml.fim_pad_token_id");
  v.fim_rep = f.get_int("tokenizer.ggml.fim_rep_token_id");
  v.fim_sep = f.get_int("tokenizer.ggml.fim_sep_token_id");
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token");
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix");
  return v;
}

std::unique_ptr<Tokenizer> Tokenizer::from_vocab(Vocab v) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());

  // Vocabulary type and pre-tokenizer.
  bool default_add_bos = false;
  bool is_spm = false;
  if (v.model == "gpt2") {
    t->vocab_type_ = VocabType::kBpe;
    t->clean_spaces_ = true;  // llama.cpp's default for BPE; some pre-tokenizers turn it off below
  } else if (v.model == "llama") {
    // SentencePiece (llama.cpp LLAMA_VOCAB_TYPE_SPM): no pre-tokenizer, BOS
    // and a space prefix by default, default special ids bos=1 eos=2 unk=0.
    t->vocab_type_ = VocabType::kSpm;
    is_spm = true;
    default_add_bos = true;
  } else {
    fail(StatusCode::kUnsupported, "tokenizer: unsupported tokenizer.ggml.model '" + printable(v.model) + "'");
  }
  t->pre_name_ = v.pre.value_or("");
  if (!is_spm) {
    const std::string& p = t->pre_name_;
    if (!v.pre || p == "default") {
      t->pre_type_ = PreType::kDefault;
    } else if (p == "smollm" || p == "starcoder" || p == "refact" || p == "command-r" || p == "codeshell" ||
               p == "exaone" || p == "minerva-7b") {
      t->pre_type_ = PreType::kSmolLM;
      if (p == "smollm" || p == "command-r") t->clean_spaces_ = false;
    } else if (p == "gpt-2" || p == "gpt2" || p == "phi-2" || p == "mpt" || p == "olmo") {
      t->pre_type_ = PreType::kGpt2;
    } else if (p == "llama3" || p == "llama-v3" || p == "llama-bpe" || p == "falcon3" || p == "pixtral") {
      t->pre_type_ = PreType::kLlama3;
      t->ignore_merges_ = true;
      default_add_bos = true;
    } else if (p == "dbrx" || p == "smaug-bpe") {
      t->pre_type_ = PreType::kLlama3;
    } else if (p == "qwen2" || p == "deepseek-r1-qwen") {
      t->pre_type_ = PreType::kQwen2;
      t->clean_spaces_ = false;
    } else {
      fail(StatusCode::kUnsupported, "tokenizer: unsupported tokenizer.ggml.pre '" + printable(p) + "'");
    }
  }

  // Tokens and their types.
  const size_t n = v.tokens.size();
  if (n == 0) bad_format("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) bad_format("too many tokens");
  if (!v.token_types.empty() && v.token_types.size() != n)
    bad_format("tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) + " entries for " +
               std::to_string(n) + " tokens");
  if (!v.scores.empty() && v.scores.size() != n)
    bad_format("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) + " entries for " + std::to_string(n) +
               " tokens");
  if (is_spm) {
    t->scores_ = std::move(v.scores);
    t->scores_.resize(n, 0.0f);  // no scores: all 0, as llama.cpp
  }
  t->attrs_.resize(n, kAttrNormal);
  for (size_t i = 0; i < n; ++i) {
    std::string& text = v.tokens[i];
    if (text.empty()) text = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
    if (!t->tokens_.push_back(text)) bad_format("the vocabulary's texts pass 4 GiB");
    std::string().swap(text);  // freed as it goes: the vocabulary is not held twice
    if (!v.token_types.empty()) t->attrs_[i] = attr_from_type(v.token_types[i]);
  }
  t->tokens_.shrink_to_fit();
  int64_t first = -1;
  if (const int64_t dup = t->tokens_.build_index(&first); dup >= 0)
    bad_format("duplicate token '" + printable(t->tokens_[static_cast<size_t>(dup)]) + "' has ids " +
               std::to_string(first) + " and " + std::to_string(dup));

  // Special ids.
  auto special = [&](const std::optional<int64_t>& id, const char* key) -> int32_t {
    if (!id || *id == -1) return -1;
    if (*id < 0 || *id >= static_cast<int64_t>(n))
      bad_format(std::string("tokenizer.ggml.") + key + " = " + std::to_string(*id) + " is out of range (" +
                 std::to_string(n) + " tokens)");
    return static_cast<int32_t>(*id);
  };
  if (is_spm) {
    // llama.cpp's SPM defaults, used when the metadata names none (and
    // dropped when the vocabulary is too small for them).
    auto dflt = [&](std::optional<int64_t>& id, int64_t d) {
      if (!id && d < static_cast<int64_t>(n)) id = d;
    };
    dflt(v.bos, 1);
    dflt(v.eos, 2);
    dflt(v.unk, 0);
  }
  t->bos_ = special(v.bos, "bos_token_id");
  t->eos_ = special(v.eos, "eos_token_id");
  t->eot_ = special(v.eot, "eot_token_id");
  t->eom_ = special(v.eom, "eom_token_id");
  t->unk_ = special(v.unk, "unknown_token_id");
  t->pad_ = special(v.pad, "padding_token_id");
  special(v.sep, "seperator_token_id");
  int32_t fim_pre = special(v.fim_pre, "fim_pre_token_id");
  int32_t fim_suf = special(v.fim_suf, "fim_suf_token_id");
  int32_t fim_mid = special(v.fim_mid, "fim_mid_token_id");
  int32_t fim_pad = special(v.fim_pad, "fim_pad_token_id");
  int32_t fim_rep = special(v.fim_rep, "fim_rep_token_id");
  int32_t fim_sep = special(v.fim_sep, "fim_sep_token_id");
  t->add_bos_ = v.add_bos.value_or(default_add_bos && t->bos_ >= 0);
  t->add_eos_ = v.add_eos.value_or(false);
  // llama.cpp reads tokenizer.ggml.add_space_prefix for every vocabulary type;
  // only SPM encoding uses it, detokenize_llama uses it for all.
  t->add_space_prefix_ = v.add_space_prefix.value_or(is_spm);
  if (t->add_bos_ && t->bos_ < 0) bad_format("tokenizer.ggml.add_bos_token is true but there is no bos_token_id");
  if (t->add_eos_ && t->eos_ < 0) bad_format("tokenizer.ggml.add_eos_token is true but there is no eos_token_id");

  // llama.cpp's text heuristics: find EOT/EOM/FIM tokens the metadata did not
  // name, and make sure such tokens are control tokens.
  auto detect = [&](int32_t& id, const auto& texts) {
    if (id >= 0) return;
    for (const char* text : texts) {
      const int32_t found = t->find_token(text);
      if (found >= 0) {
        id = found;
        t->attrs_[found] |= kAttrControl;
        return;
      }
    }
  };
  detect(t->eot_, kEotTexts);
  detect(t->eom_, kEomTexts);
  detect(fim_pre, kFimPreTexts);
  detect(fim_suf, kFimSufTexts);
  detect(fim_mid, kFimMidTexts);
  detect(fim_pad, kFimPadTexts);
  detect(fim_rep, kFimRepTexts);
  detect(fim_sep, kFimSepTexts);

  std::set<int32_t> eog;
  for (int32_t id : {fim_pad, fim_rep, fim_sep})
    if (id >= 0) eog.insert(id);
  for (const char* text : kEogTexts) {
    const int32_t id = t->find_token(text);
    if (id >= 0) {
      eog.insert(id);
      t->attrs_[id] |= kAttrControl;
    }
  }
  // gpt-oss: these must always render, so they are user-defined.
  for (const char* text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    const int32_t id = t->find_token(text);
    if (id >= 0) t->attrs_[id] = kAttrUserDefined;
  }
  for (int32_t id : {t->eos_, t->eot_, t->eom_})
    if (id >= 0) eog.insert(id);
  {
    // o200k_harmony / solar-open: "<|end|>" is not end-of-generation there.
    auto has = [&](const char* text) {
      const int32_t id = t->find_token(text);
      return id >= 0 && eog.count(id) > 0;
    };
    if (has("<|end|>") && ((has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")))) {
      const int32_t end_id = t->find_token("<|end|>");
      eog.erase(end_id);
      t->attrs_[end_id] = kAttrUserDefined;
    }
    // gemma4 / paddleocr: "</s>" is not end-of-generation when "<|tool_response>" is.
    if (has("<|tool_response>") && has("</s>")) {
      const int32_t s_id = t->find_token("</s>");
      eog.erase(s_id);
      t->attrs_[s_id] = kAttrNormal;
    }
  }
  t->eog_ids_.assign(eog.begin(), eog.end());

  // llama.cpp marks control tokens whose text contains "unused" as unused
  // (Gemma's <unused0>..<unused6241>); they stay control tokens.
  for (size_t i = 0; i < n; ++i)
    if ((t->attrs_[i] & kAttrControl) && t->tokens_[i].find("unused") != std::string::npos) t->attrs_[i] |= kAttrUnused;

  // Special tokens matched in text: control, user-defined and unknown tokens,
  // longest text first. std::sort on ascending ids with llama.cpp's
  // comparator, so that equal lengths come in the same order as in llama.cpp
  // (built against the same standard library).
  for (size_t i = 0; i < n; ++i)
    if (t->attrs_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
      t->special_tokens_.push_back(static_cast<int32_t>(i));
  std::sort(t->special_tokens_.begin(), t->special_tokens_.end(),
            [&](int32_t a, int32_t b) { return t->tokens_[a].size() > t->tokens_[b].size(); });
  Impl& im = *t->impl_;
  im.special_index.reserve(t->special_tokens_.size());
  for (size_t k = 0; k < t->special_tokens_.size(); ++k) {
    const std::string_view text = t->tokens_[static_cast<size_t>(t->special_tokens_[k])];
    im.special_index.emplace(std::string_view(text), static_cast<int32_t>(k));
    auto& lengths = im.special_lengths_by_first_byte[static_cast<uint8_t>(text[0])];
    if (std::find(lengths.begin(), lengths.end(), static_cast<uint32_t>(text.size())) == lengths.end())
      lengths.push_back(static_cast<uint32_t>(text.size()));
  }

  if (is_spm) {
    static const char* hex = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
      int32_t id = t->find_token(std::string_view(buf, 6));
      if (id < 0) id = t->find_token(std::string(1, static_cast<char>(b)));
      im.byte_token[b] = id;
    }
    t->build_pieces();
    return t;
  }

  // Byte-level alphabet tokens and merges.
  for (int b = 0; b < 256; ++b) im.byte_token[b] = t->find_token(unicode::byte_to_utf8(static_cast<uint8_t>(b)));
  if (v.merges.empty()) bad_format("missing tokenizer.ggml.merges (required for a BPE vocabulary)");
  if (v.merges.size() > static_cast<size_t>(INT32_MAX)) bad_format("too many merges");
  im.merges.reserve(v.merges.size());
  std::string joined;
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (sp == std::string::npos)
      bad_format("merge " + std::to_string(r) + " '" + printable(m) + "' has no separating space");
    const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
    const int32_t l = t->find_token(left), rr = t->find_token(right);
    joined.assign(left);
    joined.append(right);
    const int32_t merged = t->find_token(joined);
    if (l < 0 || rr < 0 || merged < 0)
      bad_format("merge " + std::to_string(r) + " '" + printable(m) + "' names a token that is not in the vocabulary");
    im.merges.insert(l, rr, static_cast<int32_t>(r), merged);
  }

  t->build_pieces();
  return t;
}

// The token_to_piece cache (llama.cpp's token_to_piece with special=true).
void Tokenizer::build_pieces() {
  const size_t n = tokens_.size();
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t a = attrs_[i];
    const std::string_view text = tokens_[i];
    out.clear();
    if (a & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      out = text;
    } else if (vocab_type_ == VocabType::kSpm) {
      if (a & kAttrNormal) {
        // U+2581 -> ' '
        out.reserve(text.size());
        for (size_t p = 0; p < text.size();) {
          if (text.compare(p, 3, "\xE2\x96\x81") == 0) {
            out.push_back(' ');
            p += 3;
          } else {
            out.push_back(text[p++]);
          }
        }
      } else if (a & kAttrByte) {
        // llama.cpp: strtol(text.substr(3, 2), 16), low byte.
        if (text.size() >= 3) {
          const std::string digits(text.substr(3, 2));
          out.push_back(static_cast<char>(std::strtol(digits.c_str(), nullptr, 16)));
        }
      }
    } else if (a & kAttrNormal) {
      // Undo the byte-level mapping. A code point outside the 256-symbol
      // alphabet is kept as its UTF-8 (llama.cpp renders "[UNK_BYTE_0x...]").
      size_t pos = 0;
      while (pos < text.size()) {
        uint32_t cp;
        size_t len;
        if (!unicode::decode_utf8(text, pos, &cp, &len)) {
          out.append(text, pos, len);
          pos += len;
          continue;
        }
        const int byte = unicode::cp_to_byte(cp);
        if (byte >= 0) {
          out.push_back(static_cast<char>(byte));
        } else {
          out.append(text, pos, len);
        }
        pos += len;
      }
    } else if (a & kAttrByte) {
      // "<0xAB>"
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
        out.push_back(static_cast<char>(std::strtol(std::string(text.substr(3, 2)).c_str(), nullptr, 16)));
      }
    }
    // Unused / undefined tokens render as nothing (as in llama.cpp).
    if (!pieces_.push_back(out)) bad_format("the vocabulary's pieces pass 4 GiB");
  }
  pieces_.shrink_to_fit();
}

// ---------------------------------------------------------------------------
// Queries

int32_t Tokenizer::find_token(std::string_view text) const { return static_cast<int32_t>(tokens_.find(text)); }

std::string Tokenizer::token_to_piece(int32_t id) const {
  check_id(id, n_vocab());
  return std::string(pieces_[static_cast<size_t>(id)]);
}

bool Tokenizer::is_eog(int32_t id) const { return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id); }

bool Tokenizer::is_control(int32_t id) const { return id >= 0 && id < n_vocab() && (attrs_[id] & kAttrControl); }

Tokenizer::TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id, n_vocab());
  const uint16_t a = attrs_[id];
  if (a & kAttrControl) return TokenType::kControl;
  if (a & kAttrUserDefined) return TokenType::kUserDefined;
  if (a & kAttrUnknown) return TokenType::kUnknown;
  if (a & kAttrByte) return TokenType::kByte;
  if (a & kAttrUnused) return TokenType::kUnused;
  if (a & kAttrNormal) return TokenType::kNormal;
  return TokenType::kUndefined;
}

std::string_view Tokenizer::token_text(int32_t id) const {
  check_id(id, n_vocab());
  return tokens_[static_cast<size_t>(id)];
}

}  // namespace ember
