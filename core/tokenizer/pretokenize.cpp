#include "core/tokenizer/pretokenize.h"

#include "core/tokenizer/unicode.h"

namespace ember::pretok {

namespace {

using namespace ember::unicode::cp_flags;

enum class Stage : uint8_t {
  kDigit1,       // \p{N}
  kDigitRuns,    // \p{N}+
  kAsciiDigit3,  // [0-9][0-9][0-9]
  kPunctRuns,    // [\p{P}\$\+<=>\^~\|]+
  kGpt2,
  kLlama3,
  kQwen2,  // kLlama3 with \p{N} instead of \p{N}{1,3}
};

// One-character classes of the std::regex fallback in llama.cpp. It runs the
// regex on a "collapsed" copy of the text where every code point >= 128 is
// replaced by one byte for its category (whitespace first), so for those code
// points only the category counts; ASCII is matched as itself.
inline bool is_regex_number(uint32_t cp) {
  if (cp < 128) return cp >= '0' && cp <= '9';
  const uint16_t f = unicode::flags(cp);
  return !(f & kWhitespace) && (f & kNumber);
}

inline bool is_default_punct(uint32_t cp) {
  if (cp < 128) {
    // \p{P} in ASCII: !"#%&'()*,-./:;?@[\]_{}  plus $+<=>^~|
    switch (cp) {
      case '!':
      case '"':
      case '#':
      case '%':
      case '&':
      case '\'':
      case '(':
      case ')':
      case '*':
      case ',':
      case '-':
      case '.':
      case '/':
      case ':':
      case ';':
      case '?':
      case '@':
      case '[':
      case '\\':
      case ']':
      case '_':
      case '{':
      case '}':
      case '$':
      case '+':
      case '<':
      case '=':
      case '>':
      case '^':
      case '~':
      case '|': return true;
      default: return false;
    }
  }
  const uint16_t f = unicode::flags(cp);
  return !(f & kWhitespace) && (f & kPunctuation);
}

inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

class Splitter {
 public:
  Splitter(const uint32_t* cps, const Stage* stages, size_t n_stages, WordSink& sink)
      : cps_(cps), stages_(stages), n_stages_(n_stages), sink_(sink) {}

  void run(size_t begin, size_t end) { apply(0, begin, end); }

 private:
  const uint32_t* cps_;
  const Stage* stages_;
  size_t n_stages_;
  WordSink& sink_;

  void emit(size_t stage, size_t b, size_t e) {
    if (b >= e) return;
    if (stage + 1 < n_stages_) {
      apply(stage + 1, b, e);
    } else {
      sink_.word(b, e);
    }
  }

  void apply(size_t stage, size_t b, size_t e) {
    switch (stages_[stage]) {
      case Stage::kDigit1: split_class(stage, b, e, is_regex_number, 1, 1); break;
      case Stage::kDigitRuns: split_class(stage, b, e, is_regex_number, 1, SIZE_MAX); break;
      case Stage::kAsciiDigit3:
        split_class(
            stage, b, e, [](uint32_t c) { return c >= '0' && c <= '9'; }, 3, 3);
        break;
      case Stage::kPunctRuns: split_class(stage, b, e, is_default_punct, 1, SIZE_MAX); break;
      case Stage::kGpt2: split_gpt2(stage, b, e); break;
      case Stage::kLlama3: split_llama3(stage, b, e, 3); break;
      case Stage::kQwen2: split_llama3(stage, b, e, 1); break;
    }
  }

  // Regex "C{min,max}" (greedy, leftmost) over a one-character class C: the
  // matches and the gaps between them become the sub-ranges.
  template <typename Pred>
  void split_class(size_t stage, size_t b, size_t e, Pred pred, size_t min_len, size_t max_len) {
    size_t gap = b;
    size_t pos = b;
    while (pos < e) {
      size_t len = 0;
      while (pos + len < e && len < max_len && pred(cps_[pos + len])) ++len;
      if (len >= min_len) {
        emit(stage, gap, pos);
        emit(stage, pos, pos + len);
        pos += len;
        gap = pos;
      } else {
        ++pos;
      }
    }
    emit(stage, gap, e);
  }

  // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  void split_gpt2(size_t stage, size_t b, size_t e) {
    // Flags of position p; 0 outside [b, e) (llama.cpp's OUT_OF_RANGE).
    auto fl = [&](size_t p) -> uint16_t { return p < e ? unicode::flags(cps_[p]) : 0; };
    size_t pos = b;
    while (pos < e) {
      const size_t start = pos;
      const uint32_t c = cps_[pos];
      if (c == '\'' && pos + 1 < e) {
        const uint32_t n1 = cps_[pos + 1];
        if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
          emit(stage, start, pos + 2);
          pos += 2;
          continue;
        }
        if (pos + 2 < e) {
          const uint32_t n2 = cps_[pos + 2];
          if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
            emit(stage, start, pos + 3);
            pos += 3;
            continue;
          }
        }
      }
      const uint16_t f2 = (c == ' ') ? fl(pos + 1) : fl(pos);
      if (f2 & kLetter) {  // ' ?\p{L}+'
        pos += (c == ' ');
        while (fl(pos) & kLetter) ++pos;
        emit(stage, start, pos);
        continue;
      }
      if (f2 & kNumber) {  // ' ?\p{N}+'
        pos += (c == ' ');
        while (fl(pos) & kNumber) ++pos;
        emit(stage, start, pos);
        continue;
      }
      if (!(f2 & (kWhitespace | kLetter | kNumber)) && f2 != 0) {  // ' ?[^\s\p{L}\p{N}]+'
        pos += (c == ' ');
        for (uint16_t f = fl(pos); !(f & (kWhitespace | kLetter | kNumber)) && f != 0; f = fl(pos)) ++pos;
        emit(stage, start, pos);
        continue;
      }
      size_t n_ws = 0;
      while (fl(pos + n_ws) & kWhitespace) ++n_ws;
      if (n_ws > 1 && pos + n_ws < e) {  // '\s+(?!\S)': leave the last one for the next word
        pos += n_ws - 1;
        emit(stage, start, pos);
        continue;
      }
      if (n_ws > 0) {  // '\s+'
        pos += n_ws;
        emit(stage, start, pos);
        continue;
      }
      ++pos;  // no match: one code point on its own
      emit(stage, start, pos);
    }
  }

  // llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  // with max_digits = 3; qwen2 is the same regex with \p{N} (max_digits = 1).
  void split_llama3(size_t stage, size_t b, size_t e, size_t max_digits) {
    auto fl = [&](size_t p) -> uint16_t { return p < e ? unicode::flags(cps_[p]) : 0; };
    auto cp_at = [&](size_t p) -> uint32_t { return p < e ? cps_[p] : 0xFFFFFFFFu; };
    size_t pos = b;
    while (pos < e) {
      const size_t start = pos;
      const uint32_t c = cps_[pos];
      const uint16_t f = fl(pos);
      if (c == '\'' && pos + 1 < e) {
        // Only ASCII letters lower-case to s/t/m/d/r/e/v/l, so ASCII folding
        // equals llama.cpp's unicode_tolower here.
        const uint32_t n1 = ascii_lower(cps_[pos + 1]);
        if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
          emit(stage, start, pos + 2);
          pos += 2;
          continue;
        }
        if (pos + 2 < e) {
          const uint32_t n2 = ascii_lower(cps_[pos + 2]);
          if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
            emit(stage, start, pos + 3);
            pos += 3;
            continue;
          }
        }
      }
      if (!(c == '\r' || c == '\n' || (f & kNumber))) {  // [^\r\n\p{L}\p{N}]?\p{L}+
        if ((f & kLetter) || (fl(pos + 1) & kLetter)) {
          ++pos;
          while (fl(pos) & kLetter) ++pos;
          emit(stage, start, pos);
          continue;
        }
      }
      if (f & kNumber) {  // \p{N}{1,max_digits}
        size_t ini = pos;
        while (fl(pos) & kNumber) {
          if (++pos - ini >= max_digits) {
            emit(stage, ini, pos);
            ini = pos;
          }
        }
        emit(stage, ini, pos);
        continue;
      }
      const uint16_t f2 = (c == ' ') ? fl(pos + 1) : f;
      if (!(f2 & (kWhitespace | kLetter | kNumber)) && f != 0) {  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        pos += (c == ' ');
        for (uint16_t g = f2; !(g & (kWhitespace | kLetter | kNumber)) && g != 0; g = fl(pos)) ++pos;
        for (uint32_t c2 = cp_at(pos); c2 == '\r' || c2 == '\n'; c2 = cp_at(pos)) ++pos;
        emit(stage, start, pos);
        continue;
      }
      size_t n_ws = 0;
      size_t last_rn = 0;  // one past the last \r or \n in the whitespace run; 0 = none
      while (fl(pos + n_ws) & kWhitespace) {
        const uint32_t c2 = cps_[pos + n_ws];
        if (c2 == '\r' || c2 == '\n') last_rn = pos + n_ws + 1;
        ++n_ws;
      }
      if (last_rn > 0) {  // \s*[\r\n]+
        pos = last_rn;
        emit(stage, start, pos);
        continue;
      }
      if (n_ws > 1 && pos + n_ws < e) {  // \s+(?!\S)
        pos += n_ws - 1;
        emit(stage, start, pos);
        continue;
      }
      if (n_ws > 0) {  // \s+
        pos += n_ws;
        emit(stage, start, pos);
        continue;
      }
      ++pos;
      emit(stage, start, pos);
    }
  }
};

struct Pipeline {
  const Stage* stages;
  size_t n;
};

Pipeline pipeline(Tokenizer::PreType type) {
  static const Stage kGpt2[] = {Stage::kGpt2};
  static const Stage kSmol[] = {Stage::kDigit1, Stage::kGpt2};
  static const Stage kDefault[] = {Stage::kPunctRuns, Stage::kGpt2, Stage::kDigitRuns, Stage::kAsciiDigit3};
  static const Stage kLlama3[] = {Stage::kLlama3};
  static const Stage kQwen2[] = {Stage::kQwen2};
  switch (type) {
    case Tokenizer::PreType::kGpt2: return {kGpt2, 1};
    case Tokenizer::PreType::kSmolLM: return {kSmol, 2};
    case Tokenizer::PreType::kDefault: return {kDefault, 4};
    case Tokenizer::PreType::kLlama3: return {kLlama3, 1};
    case Tokenizer::PreType::kQwen2: return {kQwen2, 1};
  }
  return {kGpt2, 1};
}

}  // namespace

void split(Tokenizer::PreType type, const uint32_t* cps, size_t n, WordSink& sink) {
  if (n == 0) return;
  const Pipeline p = pipeline(type);
  Splitter(cps, p.stages, p.n, sink).run(0, n);
}

std::vector<std::string> split_words(Tokenizer::PreType type, std::string_view utf8) {
  std::vector<uint32_t> cps;
  size_t pos = 0;
  while (pos < utf8.size()) {
    uint32_t cp;
    size_t len;
    if (!unicode::decode_utf8(utf8, pos, &cp, &len)) cp = unicode::kReplacementChar;
    cps.push_back(cp);
    pos += len;
  }
  struct Collect : WordSink {
    const std::vector<uint32_t>* cps;
    std::vector<std::string> words;
    void word(size_t b, size_t e) override {
      std::string w;
      for (size_t i = b; i < e; ++i) unicode::append_utf8(w, (*cps)[i]);
      words.push_back(std::move(w));
    }
  } sink;
  sink.cps = &cps;
  split(type, cps.data(), cps.size(), sink);
  return std::move(sink.words);
}

}  // namespace ember::pretok
