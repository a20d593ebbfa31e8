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
#include "core/tokenizer/unicode.h"
#include "core/util/hash.h"
#include "core/util/status.h"

namespace ember {

namespace {

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
    while (cap < n * 2) cap <<= 1;
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

}  // namespace

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

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

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
  t->tokens_ = std::move(v.tokens);
  if (is_spm) {
    t->scores_ = std::move(v.scores);
    t->scores_.resize(n, 0.0f);  // no scores: all 0, as llama.cpp
  }
  t->attrs_.resize(n, kAttrNormal);
  for (size_t i = 0; i < n; ++i) {
    if (t->tokens_[i].empty()) t->tokens_[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
    if (!v.token_types.empty()) t->attrs_[i] = attr_from_type(v.token_types[i]);
  }
  t->token_ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = t->token_ids_.emplace(std::string_view(t->tokens_[i]), static_cast<int32_t>(i));
    if (!inserted)
      bad_format("duplicate token '" + printable(t->tokens_[i]) + "' has ids " + std::to_string(it->second) + " and " +
                 std::to_string(i));
  }

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
    if ((t->attrs_[i] & kAttrControl) && t->tokens_[i].find("unused") != std::string::npos)
      t->attrs_[i] |= kAttrUnused;

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
    const std::string& text = t->tokens_[t->special_tokens_[k]];
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
  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t a = attrs_[i];
    const std::string& text = tokens_[i];
    std::string& out = pieces_[i];
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
          const std::string digits = text.substr(3, 2);
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
        out.push_back(static_cast<char>(std::strtol(text.substr(3, 2).c_str(), nullptr, 16)));
      }
    }
    // Unused / undefined tokens render as nothing (as in llama.cpp).
  }
}

// ---------------------------------------------------------------------------
// Queries

int32_t Tokenizer::find_token(std::string_view text) const {
  auto it = token_ids_.find(text);
  return it == token_ids_.end() ? -1 : it->second;
}

static void check_id(int32_t id, int32_t n) {
  if (id < 0 || id >= n)
    fail(StatusCode::kInvalidArgument,
         "tokenizer: token id " + std::to_string(id) + " is out of range [0, " + std::to_string(n) + ")");
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  check_id(id, n_vocab());
  return pieces_[id];
}

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

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id, n_vocab());
  return tokens_[id];
}

// ---------------------------------------------------------------------------
// Encoding

namespace {

// One piece of the input after special-token partitioning.
struct Fragment {
  size_t begin, end;  // byte range of the raw text (unused for tokens)
  int32_t token;      // -1: raw text
};

bool c_isspace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

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
    const std::string& piece = pieces_[id];
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
