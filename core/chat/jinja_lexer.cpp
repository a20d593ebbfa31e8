// Lexer of the Jinja subset: it transcribes jinja2.lexer (Jinja2 3.1) for
// the default delimiters with trim_blocks=True and lstrip_blocks=True:
// newline normalisation, the single trailing newline dropped, '-'/'+'
// whitespace control, brace balancing inside tags and Python
// unicode-escape decoding of string literals. The parser is
// jinja_parser.cpp.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "core/chat/jinja_lexer.h"

namespace ember::jinja {

[[noreturn]] void syntax_error(const std::string& src, size_t pos, const std::string& msg) {
  int line = 1 + static_cast<int>(std::count(src.begin(), src.begin() + std::min(pos, src.size()), '\n'));
  throw Error(StatusCode::kBadFormat, "chat template syntax error (line " + std::to_string(line) + "): " + msg);
}

namespace {

const char* const kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                  "]",  "(",  ")",  "{",  "}",  "=",  ".", ":", "|", ",", ";", ">", "<"};

class Lexer {
 public:
  explicit Lexer(const std::string& source) {
    // Newline normalisation: \r\n, \r and \n all become \n, and one trailing
    // newline is dropped (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t k = 0; k < source.size(); ++k) {
      char c = source[k];
      if (c == '\r') {
        if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
        src_.push_back('\n');
      } else {
        src_.push_back(c);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  const std::string& source() const { return src_; }

  std::vector<Token> run() {
    size_t n = src_.size();
    while (pos_ < n) {
      size_t q = find_tag(pos_);
      if (q == std::string::npos) {
        emit_data(src_.substr(pos_));
        pos_ = n;
        break;
      }
      char kind = src_[q + 1];
      char sign = (q + 2 < n && (src_[q + 2] == '-' || src_[q + 2] == '+')) ? src_[q + 2] : 0;
      std::string text = src_.substr(pos_, q - pos_);
      size_t raw_end = kind == '%' ? match_raw_begin(q) : 0;
      // Whitespace control before the tag (OptionalLStrip in jinja2.lexer).
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks: blocks, comments, raw
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_ws(text, l_pos)) text.resize(l_pos);
      }
      emit_data(std::move(text));
      if (raw_end) {
        line_starting_ = src_[raw_end - 1] == '\n';
        pos_ = raw_end;
        lex_raw();
        continue;
      }
      size_t after = q + 2 + (sign ? 1 : 0);
      line_starting_ = false;
      pos_ = after;
      if (kind == '#') {
        lex_comment();
      } else {
        push(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, q);
        lex_tag(kind == '{');
      }
    }
    push(Tok::Eof, n);
    return std::move(toks_);
  }

 private:
  std::string src_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> toks_;
  std::vector<char> balance_;

  void push(Tok t, size_t pos, std::string value = {}) {
    Token tok;
    tok.type = t;
    tok.pos = pos;
    tok.value = std::move(value);
    toks_.push_back(std::move(tok));
  }
  void emit_data(std::string text) {
    if (!text.empty()) push(Tok::Data, pos_, std::move(text));
  }

  // Length in bytes of a Python-whitespace code point at p, or 0.
  size_t ws_at(size_t p) const {
    unsigned char c = static_cast<unsigned char>(src_[p]);
    if (c < 0x80) return py_isspace(c) ? 1 : 0;
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    if (p + len > src_.size()) return 0;
    std::u32string cp = utf8_decode(std::string_view(src_).substr(p, len));
    return (!cp.empty() && py_isspace(cp[0])) ? len : 0;
  }
  size_t skip_ws(size_t p) const {
    while (p < src_.size()) {
      size_t w = ws_at(p);
      if (!w) break;
      p += w;
    }
    return p;
  }
  static bool all_ws(const std::string& s, size_t from) {
    for (char32_t c : utf8_decode(std::string_view(s).substr(from)))
      if (!py_isspace(c)) return false;
    return true;
  }
  static std::string rstrip_ws(const std::string& s) {
    std::u32string u = utf8_decode(s);
    size_t e = u.size();
    while (e > 0 && py_isspace(u[e - 1])) --e;
    return utf8_encode(std::u32string_view(u).substr(0, e));
  }

  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return std::string::npos;
  }

  // {%(-|+|)\s*raw\s*(?:-%}\s*|%}) at q; returns the end of the match or 0.
  size_t match_raw_begin(size_t q) const {
    size_t p = q + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_ws(p);
    if (src_.compare(p, 3, "raw") != 0) return 0;
    p = skip_ws(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) return skip_ws(p + 3);
    if (src_.compare(p, 2, "%}") == 0) return p + 2;
    return 0;
  }

  // Block-end rule: \+%} | \-%}\s* | %}\n?  (trim_blocks). Returns match end or 0.
  size_t match_block_end(size_t p, const char* end) const {
    if (src_.compare(p, 3, std::string("+") + end) == 0) return p + 3;
    if (src_.compare(p, 3, std::string("-") + end) == 0) return skip_ws(p + 3);
    if (src_.compare(p, 2, end) == 0) return (p + 2 < src_.size() && src_[p + 2] == '\n') ? p + 3 : p + 2;
    return 0;
  }

  void lex_comment() {
    for (size_t p = pos_; p < src_.size(); ++p) {
      if (size_t e = match_block_end(p, "#}")) {
        line_starting_ = src_[e - 1] == '\n';
        pos_ = e;
        return;
      }
    }
    syntax_error(src_, pos_, "Missing end of comment tag");
  }

  void lex_raw() {
    // (.*?)({%(-|+|)\s*endraw\s*(?:\+%}|\-%}\s*|%}\n?))
    for (size_t p = pos_; p + 1 < src_.size(); ++p) {
      if (src_[p] != '{' || src_[p + 1] != '%') continue;
      size_t r = p + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      r = skip_ws(r);
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r = skip_ws(r + 6);
      size_t e = match_block_end(r, "%}");
      if (!e) continue;
      std::string text = src_.substr(pos_, p - pos_);
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+') {
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting_) && l_pos < text.size() && all_ws(text, l_pos)) text.resize(l_pos);
      }
      emit_data(std::move(text));
      line_starting_ = src_[e - 1] == '\n';
      pos_ = e;
      return;
    }
    syntax_error(src_, pos_, "Missing end of raw directive");
  }

  // (\d+_)*\d+ at p: length or 0.
  size_t digit_group(size_t p, int base = 10) const {
    auto is_digit = [&](char c) {
      if (base == 16) return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      if (base == 8) return c >= '0' && c <= '7';
      if (base == 2) return c == '0' || c == '1';
      return c >= '0' && c <= '9';
    };
    size_t k = p;
    if (k >= src_.size() || !is_digit(src_[k])) return 0;
    while (k < src_.size()) {
      if (is_digit(src_[k])) {
        ++k;
      } else if (src_[k] == '_' && k + 1 < src_.size() && is_digit(src_[k + 1])) {
        k += 2;
      } else {
        break;
      }
    }
    return k - p;
  }

  size_t match_float(size_t p) const {
    if (p > 0 && src_[p - 1] == '.') return 0;  // (?<!\.)
    size_t d = digit_group(p);
    if (!d) return 0;
    size_t q = p + d;
    size_t frac_end = 0;
    if (q < src_.size() && src_[q] == '.') {
      size_t f = digit_group(q + 1);
      if (f) frac_end = q + 1 + f;
    }
    size_t e = frac_end ? frac_end : q;
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      size_t g = digit_group(x);
      if (g) return x + g - p;
    }
    return frac_end ? frac_end - p : 0;
  }

  size_t match_integer(size_t p, int64_t& value) {
    auto lower = [&](size_t k) {
      return k < src_.size() ? static_cast<char>(std::tolower(static_cast<unsigned char>(src_[k]))) : '\0';
    };
    int base = 10;
    size_t start = p, len = 0;
    auto prefixed = [&](int b) -> size_t {  // 0x(_?[digits])+
      size_t k = p + 2;
      size_t n = 0;
      while (true) {
        size_t j = k;
        if (j < src_.size() && src_[j] == '_') ++j;
        size_t g = digit_group(j, b);
        if (!g) break;
        // one digit per repetition, but (_?d)+ accepts the same strings as this
        k = j + g;
        n = k - p;
      }
      return n;
    };
    if (src_[p] == '0' && (lower(p + 1) == 'b' || lower(p + 1) == 'o' || lower(p + 1) == 'x')) {
      base = lower(p + 1) == 'b' ? 2 : lower(p + 1) == 'o' ? 8 : 16;
      len = prefixed(base);
      if (len) start = p + 2;
    }
    if (!len) {
      base = 10;
      start = p;
      if (src_[p] >= '1' && src_[p] <= '9') {
        len = digit_group(p);
      } else if (src_[p] == '0') {
        size_t k = p + 1;
        while (k < src_.size()) {
          if (src_[k] == '0')
            ++k;
          else if (src_[k] == '_' && k + 1 < src_.size() && src_[k + 1] == '0')
            k += 2;
          else
            break;
        }
        len = k - p;
      }
    }
    if (!len) return 0;
    std::string digits;
    for (size_t k = start; k < p + len; ++k)
      if (src_[k] != '_') digits.push_back(src_[k]);
    auto res = std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
    if (res.ec != std::errc()) unsupported("integer literal outside the 64-bit range");
    return len;
  }

  // Python: value[1:-1].encode('ascii', 'backslashreplace').decode('unicode-escape')
  std::string unescape(size_t begin, size_t end) const {
    std::u32string in = utf8_decode(std::string_view(src_).substr(begin, end - begin));
    // backslashreplace turns non-ASCII characters into \xhh / \uhhhh / \Uhhhhhhhh text
    // first; only matters right after a backslash (otherwise it decodes back).
    std::string out;
    size_t n = in.size();
    auto hexval = [](char32_t c) -> int {
      if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
      if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
      if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
      return -1;
    };
    for (size_t k = 0; k < n; ++k) {
      char32_t c = in[k];
      if (c != '\\') {
        append_utf8(out, c);
        continue;
      }
      if (k + 1 >= n) syntax_error(src_, begin, "\\ at end of string");
      char32_t e = in[++k];
      if (e >= 0x80) {  // backslash followed by the backslashreplace text of e
        char buf[16];
        if (e < 0x100)
          std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(e));
        else if (e < 0x10000)
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(e));
        else
          std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(e));
        out += buf;  // "\\" decodes to '\' and the hex text stays literal
        continue;
      }
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int d = 0; d < digits; ++d) {
            int h = (k + 1 < n) ? hexval(in[k + 1]) : -1;
            if (h < 0) syntax_error(src_, begin, std::string("truncated \\") + static_cast<char>(e) + " escape");
            v = v * 16 + static_cast<uint32_t>(h);
            ++k;
          }
          if (v > 0x10FFFF) syntax_error(src_, begin, "illegal Unicode character");
          if (v >= 0xD800 && v <= 0xDFFF) unsupported("surrogate escape in a string literal");
          append_utf8(out, v);
          break;
        }
        case 'N': unsupported("\\N{...} escape in a string literal");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int d = 0; d < 2 && k + 1 < n && in[k + 1] >= '0' && in[k + 1] <= '7'; ++d)
              v = v * 8 + static_cast<uint32_t>(in[++k] - '0');
            append_utf8(out, v);
          } else {
            out.push_back('\\');
            append_utf8(out, e);
          }
      }
    }
    return out;
  }

  void lex_tag(bool variable) {
    size_t n = src_.size();
    while (pos_ < n) {
      size_t p = pos_;
      if (balance_.empty()) {
        size_t e = 0;
        if (variable) {
          if (src_.compare(p, 3, "-}}") == 0)
            e = skip_ws(p + 3);
          else if (src_.compare(p, 2, "}}") == 0)
            e = p + 2;
        } else {
          e = match_block_end(p, "%}");
        }
        if (e) {
          push(variable ? Tok::VarEnd : Tok::BlockEnd, p);
          line_starting_ = src_[e - 1] == '\n';
          pos_ = e;
          return;
        }
      }
      if (size_t w = ws_at(p)) {
        pos_ = skip_ws(p + w);
        continue;
      }
      unsigned char c = static_cast<unsigned char>(src_[p]);
      if (std::isdigit(c)) {
        if (size_t len = match_float(p)) {
          std::string digits;
          for (size_t k = p; k < p + len; ++k)
            if (src_[k] != '_') digits.push_back(src_[k]);
          Token t;
          t.type = Tok::Float;
          t.pos = p;
          auto res = std::from_chars(digits.data(), digits.data() + digits.size(), t.fval);
          if (res.ec == std::errc::result_out_of_range) unsupported("float literal out of range");
          toks_.push_back(t);
          pos_ = p + len;
          continue;
        }
        int64_t iv = 0;
        if (size_t len = match_integer(p, iv)) {
          Token t;
          t.type = Tok::Integer;
          t.pos = p;
          t.ival = iv;
          toks_.push_back(t);
          pos_ = p + len;
          continue;
        }
      }
      if (std::isalpha(c) || c == '_') {
        size_t k = p;
        while (k < n && (std::isalnum(static_cast<unsigned char>(src_[k])) || src_[k] == '_')) ++k;
        if (k < n && static_cast<unsigned char>(src_[k]) >= 0x80 && !ws_at(k)) unsupported("non-ASCII identifier");
        push(Tok::Name, p, src_.substr(p, k - p));
        pos_ = k;
        continue;
      }
      if (c >= 0x80) unsupported("non-ASCII identifier");
      if (c == '\'' || c == '"') {
        size_t k = p + 1;
        while (k < n && src_[k] != static_cast<char>(c)) k += src_[k] == '\\' ? 2 : 1;
        if (k >= n) syntax_error(src_, p, std::string("unexpected char '") + static_cast<char>(c) + "'");
        Token t;
        t.type = Tok::String;
        t.pos = p;
        t.value = unescape(p + 1, k);
        toks_.push_back(std::move(t));
        pos_ = k + 1;
        continue;
      }
      const char* op = nullptr;
      for (const char* o : kOperators)
        if (src_.compare(p, std::strlen(o), o) == 0) {
          op = o;
          break;
        }
      if (!op) syntax_error(src_, p, std::string("unexpected char '") + static_cast<char>(c) + "'");
      std::string ops(op);
      if (ops == "{" || ops == "(" || ops == "[") {
        balance_.push_back(ops == "{" ? '}' : ops == "(" ? ')' : ']');
      } else if (ops == "}" || ops == ")" || ops == "]") {
        if (balance_.empty()) syntax_error(src_, p, "unexpected '" + ops + "'");
        char expected = balance_.back();
        balance_.pop_back();
        if (expected != ops[0])
          syntax_error(src_, p, "unexpected '" + ops + "', expected '" + std::string(1, expected) + "'");
      }
      push(Tok::Op, p, ops);
      pos_ = p + ops.size();
    }
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source, std::string* normalized) {
  Lexer lexer(source);
  std::vector<Token> toks = lexer.run();
  *normalized = lexer.source();
  return toks;
}

}  // namespace ember::jinja
