// Lexer and parser of the Jinja subset. The lexer transcribes jinja2.lexer
// (Jinja2 3.1) for the default delimiters with trim_blocks=True and
// lstrip_blocks=True: newline normalisation, the single trailing newline
// dropped, '-'/'+' whitespace control, brace balancing inside tags and
// Python unicode-escape decoding of string literals. The parser follows
// jinja2.parser's grammar and precedence.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "core/chat/jinja.h"

namespace ember::jinja {
namespace {

enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Op, Eof };

struct Token {
  Tok type;
  size_t pos = 0;
  std::string value;  // Data text, Name, decoded String, Op text
  int64_t ival = 0;
  double fval = 0;
};

[[noreturn]] void syntax_error(const std::string& src, size_t pos, const std::string& msg) {
  int line = 1 + static_cast<int>(std::count(src.begin(), src.begin() + std::min(pos, src.size()), '\n'));
  throw Error(StatusCode::kBadFormat, "chat template syntax error (line " + std::to_string(line) + "): " + msg);
}

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

// ------------------------------------------------------------------ parser
class Parser {
 public:
  Parser(std::string src, std::vector<Token> toks, const Limits& limits)
      : src_(std::move(src)), toks_(std::move(toks)), limits_(limits) {}

  Body parse() {
    Body body = subparse({});
    return body;
  }

 private:
  std::string src_;
  std::vector<Token> toks_;
  size_t cur_ = 0;
  const Limits& limits_;
  int depth_ = 0;
  int loop_depth_ = 0;
  StackBudget stack_{limits_.max_stack_bytes};  // taken in parse_template(): DepthGuard bounds the stack below it
  std::vector<std::string> names_seen_;         // names loaded inside the macro being parsed

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_parse_depth) {
        --p.depth_;
        unsupported("template nested deeper than " + std::to_string(p.limits_.max_parse_depth) + " levels");
      }
      if (p.stack_.exceeded()) {
        --p.depth_;
        unsupported("template nested too deeply for the " + std::to_string(p.stack_.budget() >> 10) +
                    " KiB of stack a parse may use");
      }
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& current() const { return toks_[cur_]; }
  const Token& look() const { return toks_[std::min(cur_ + 1, toks_.size() - 1)]; }
  void next() {
    if (cur_ + 1 < toks_.size()) ++cur_;
  }
  [[noreturn]] void fail(const std::string& msg) const { syntax_error(src_, current().pos, msg); }

  static bool is_op(const Token& t, const char* op) { return t.type == Tok::Op && t.value == op; }
  static bool is_name(const Token& t, const char* name) { return t.type == Tok::Name && t.value == name; }
  bool skip_op(const char* op) {
    if (is_op(current(), op)) {
      next();
      return true;
    }
    return false;
  }
  bool skip_name(const char* name) {
    if (is_name(current(), name)) {
      next();
      return true;
    }
    return false;
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::Eof: return "end of template";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::Data: return "template data";
      case Tok::Integer: return "integer";
      case Tok::Float: return "float";
      case Tok::String: return "string";
      default: return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected token '") + op + "', got " + describe(current()));
  }
  void expect_name_kw(const char* name) {
    if (!skip_name(name)) fail(std::string("expected token '") + name + "', got " + describe(current()));
  }
  std::string expect_name() {
    if (current().type != Tok::Name) fail("expected token 'name', got " + describe(current()));
    std::string v = current().value;
    next();
    return v;
  }
  void expect(Tok t, const char* what) {
    if (current().type != t) fail(std::string("expected token '") + what + "', got " + describe(current()));
    next();
  }

  ExprPtr make(ExprKind k) { return std::make_unique<Expr>(k, static_cast<int>(current().pos)); }
  void finish(Expr& e) {
    int d = 0;
    auto upd = [&](const ExprPtr& x) {
      if (x) d = std::max(d, x->depth);
    };
    upd(e.a), upd(e.b), upd(e.c), upd(e.dyn_args), upd(e.dyn_kwargs);
    for (const auto& x : e.args) upd(x);
    for (const auto& kv : e.kwargs) upd(kv.second);
    e.depth = d + 1;
    if (e.depth > limits_.max_expr_height)
      unsupported("expression nested deeper than " + std::to_string(limits_.max_expr_height) + " levels");
  }
  ExprPtr unary(ExprKind k, ExprPtr a) {
    ExprPtr e = make(k);
    e->a = std::move(a);
    finish(*e);
    return e;
  }
  ExprPtr binary(ExprKind k, ExprPtr a, ExprPtr b) {
    ExprPtr e = make(k);
    e->a = std::move(a);
    e->b = std::move(b);
    finish(*e);
    return e;
  }

  // ---------------------------------------------------------- statements
  Body subparse(const std::vector<const char*>& end_tokens) {
    Body body;
    while (current().type != Tok::Eof) {
      const Token& t = current();
      if (t.type == Tok::Data) {
        auto s = std::make_unique<Stmt>(StmtKind::Text, static_cast<int>(t.pos));
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>(StmtKind::Emit, static_cast<int>(t.pos));
        s->expr = parse_tuple(false, true, {}, false);
        expect(Tok::VarEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        next();
        for (const char* e : end_tokens)
          if (is_name(current(), e)) return body;
        parse_statement(body);
        expect(Tok::BlockEnd, "end of statement block");
      } else {
        fail("unexpected " + describe(t));
      }
    }
    return body;
  }

  Body parse_statements(const std::vector<const char*>& end_tokens, bool drop_needle, const char* block) {
    skip_op(":");
    expect(Tok::BlockEnd, "end of statement block");
    Body body = subparse(end_tokens);
    if (current().type == Tok::Eof) {
      std::string want;
      for (const char* e : end_tokens) want += std::string(want.empty() ? "'" : " or '") + e + "'";
      fail("Unexpected end of template. Jinja was looking for the following tags: " + want +
           ". The innermost block that needs to be closed is '" + block + "'.");
    }
    if (drop_needle) next();
    return body;
  }

  void parse_statement(Body& out) {
    DepthGuard guard(*this);
    const Token& t = current();
    if (t.type != Tok::Name) fail("tag name expected");
    const std::string tag = t.value;
    int line = static_cast<int>(t.pos);
    if (tag == "for") return out.push_back(parse_for());
    if (tag == "if") return out.push_back(parse_if());
    if (tag == "set") return out.push_back(parse_set());
    if (tag == "macro") return out.push_back(parse_macro());
    if (tag == "with") return out.push_back(parse_with());
    if (tag == "filter") {
      next();
      auto s = std::make_unique<Stmt>(StmtKind::FilterBlock, line);
      s->expr = parse_filter(nullptr, true);
      s->body = parse_statements({"endfilter"}, true, "filter");
      return out.push_back(std::move(s));
    }
    if (tag == "print") {
      next();
      bool first = true;
      while (current().type != Tok::BlockEnd) {
        if (!first) expect_op(",");
        first = false;
        auto s = std::make_unique<Stmt>(StmtKind::Emit, line);
        s->expr = parse_expression(true);
        out.push_back(std::move(s));
      }
      return;
    }
    if (tag == "break" || tag == "continue") {  // jinja2.ext.loopcontrols (enabled by HF)
      if (loop_depth_ == 0) fail("'" + tag + "' outside loop");
      next();
      return out.push_back(std::make_unique<Stmt>(tag == "break" ? StmtKind::Break : StmtKind::Continue, line));
    }
    if (tag == "generation") {  // HF's AssistantTracker extension: renders its body
      next();
      auto s = std::make_unique<Stmt>(StmtKind::Block, line);
      s->body = parse_statements({"endgeneration"}, true, "generation");
      return out.push_back(std::move(s));
    }
    if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from" || tag == "call" ||
        tag == "autoescape")
      unsupported("{% " + tag + " %} statement");
    if (tag == "raw") fail("malformed raw block");
    fail("Encountered unknown tag '" + tag + "'.");
  }

  StmtPtr parse_for() {
    auto s = std::make_unique<Stmt>(StmtKind::For, static_cast<int>(current().pos));
    next();
    s->target = parse_assign_target(true, false, {"in"}, false);
    expect_name_kw("in");
    s->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name(current(), "recursive")) unsupported("recursive for loop");
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false, "for");
    --loop_depth_;
    bool is_end = is_name(current(), "endfor");
    next();
    if (!is_end) s->else_body = parse_statements({"endfor"}, true, "for");
    return s;
  }

  StmtPtr parse_if() {
    auto s = std::make_unique<Stmt>(StmtKind::If, static_cast<int>(current().pos));
    next();
    while (true) {
      s->values.push_back(parse_tuple(false, false, {}, false));
      s->bodies.push_back(parse_statements({"elif", "else", "endif"}, false, "if"));
      std::string tok = current().value;
      next();
      if (tok == "elif") continue;
      if (tok == "else") s->else_body = parse_statements({"endif"}, true, "if");
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    int line = static_cast<int>(current().pos);
    next();
    ExprPtr target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto s = std::make_unique<Stmt>(StmtKind::Set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {}, false);
      return s;
    }
    auto s = std::make_unique<Stmt>(StmtKind::SetBlock, line);
    s->target = std::move(target);
    if (is_op(current(), "|")) s->expr = parse_filter(nullptr, false);
    s->body = parse_statements({"endset"}, true, "set");
    return s;
  }

  StmtPtr parse_with() {
    auto s = std::make_unique<Stmt>(StmtKind::With, static_cast<int>(current().pos));
    next();
    while (current().type != Tok::BlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(parse_assign_target(true, false, {}, false));
      expect_op("=");
      s->values.push_back(parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true, "with");
    return s;
  }

  StmtPtr parse_macro() {
    auto s = std::make_unique<Stmt>(StmtKind::Macro, static_cast<int>(current().pos));
    next();
    auto m = std::make_shared<MacroDef>();
    m->name = expect_name();
    expect_op("(");
    while (!is_op(current(), ")")) {
      if (!m->params.empty()) expect_op(",");
      m->params.push_back(expect_name());
      if (skip_op("=")) {
        m->defaults.push_back(parse_expression(true));
      } else if (!m->defaults.empty()) {
        fail("non-default argument follows default argument");
      }
    }
    expect_op(")");
    std::vector<std::string> saved;
    saved.swap(names_seen_);
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    m->body = parse_statements({"endmacro"}, true, "macro");
    loop_depth_ = saved_loops;
    for (const auto& nm : names_seen_) {
      if (nm == "varargs") m->uses_varargs = true;
      if (nm == "kwargs") m->uses_kwargs = true;
      if (nm == "caller") unsupported("caller() in a macro");
    }
    names_seen_.swap(saved);
    names_seen_.insert(names_seen_.end(), saved.begin(), saved.end());
    s->macro = std::move(m);
    return s;
  }

  ExprPtr parse_assign_target(bool with_tuple, bool name_only, const std::vector<const char*>& extra_end,
                              bool with_namespace) {
    ExprPtr target;
    if (name_only) {
      target = make(ExprKind::Name);
      target->name = expect_name();
      return target;
    }
    if (with_namespace && current().type == Tok::Name && is_op(look(), ".")) {
      target = make(ExprKind::NSRef);
      target->name = expect_name();
      next();  // dot
      target->attr = expect_name();
      return target;
    }
    target = with_tuple ? parse_tuple(true, true, extra_end, false, with_namespace) : parse_primary(with_namespace);
    check_assignable(*target);
    return target;
  }

  void check_assignable(const Expr& e) const {
    if (e.kind == ExprKind::Name || e.kind == ExprKind::NSRef) return;
    if (e.kind == ExprKind::Tuple) {
      for (const auto& x : e.args) check_assignable(*x);
      return;
    }
    fail("can't assign to " + std::string(e.kind == ExprKind::Const ? "a constant" : "an expression"));
  }

  // ---------------------------------------------------------- expressions
  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this);
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      ExprPtr e = make(ExprKind::CondExpr);
      e->a = std::move(expr1);  // value if true
      e->b = std::move(expr2);  // condition
      e->c = std::move(expr3);  // value if false (may be null -> undefined)
      finish(*e);
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary(ExprKind::Or, std::move(left), parse_and());
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary(ExprKind::And, std::move(left), parse_not());
    return left;
  }
  ExprPtr parse_not() {
    if (is_name(current(), "not")) {
      DepthGuard guard(*this);
      next();
      return unary(ExprKind::Not, parse_not());
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr expr = parse_math1();
    ExprPtr cmp;
    while (true) {
      CmpOp op;
      const Token& t = current();
      if (t.type == Tok::Op && (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" ||
                                t.value == ">" || t.value == ">=")) {
        op = t.value == "=="   ? CmpOp::Eq
             : t.value == "!=" ? CmpOp::Ne
             : t.value == "<"  ? CmpOp::Lt
             : t.value == "<=" ? CmpOp::Le
             : t.value == ">"  ? CmpOp::Gt
                               : CmpOp::Ge;
        next();
      } else if (is_name(t, "in")) {
        op = CmpOp::In;
        next();
      } else if (is_name(t, "not") && is_name(look(), "in")) {
        op = CmpOp::NotIn;
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare);
        cmp->a = std::move(expr);
      }
      cmp->cmp_ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    if (!cmp) return expr;
    finish(*cmp);
    return cmp;
  }
  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op(current(), "+") || is_op(current(), "-")) {
      BinOp op = current().value == "+" ? BinOp::Add : BinOp::Sub;
      next();
      ExprPtr e = binary(ExprKind::Binary, std::move(left), parse_concat());
      e->op = op;
      left = std::move(e);
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr first = parse_math2();
    if (!is_op(current(), "~")) return first;
    ExprPtr e = make(ExprKind::Concat);
    e->args.push_back(std::move(first));
    while (skip_op("~")) e->args.push_back(parse_math2());
    finish(*e);
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (true) {
      const Token& t = current();
      BinOp op;
      if (is_op(t, "*"))
        op = BinOp::Mul;
      else if (is_op(t, "/"))
        op = BinOp::Div;
      else if (is_op(t, "//"))
        op = BinOp::FloorDiv;
      else if (is_op(t, "%"))
        op = BinOp::Mod;
      else
        break;
      next();
      ExprPtr e = binary(ExprKind::Binary, std::move(left), parse_pow());
      e->op = op;
      left = std::move(e);
    }
    return left;
  }
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) {
      ExprPtr e = binary(ExprKind::Binary, std::move(left), parse_unary(true));
      e->op = BinOp::Pow;
      left = std::move(e);
    }
    return left;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op(current(), "-")) {
      next();
      node = unary(ExprKind::Neg, parse_unary(false));
    } else if (is_op(current(), "+")) {
      next();
      node = unary(ExprKind::Pos, parse_unary(false));
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    const Token& t = current();
    ExprPtr node;
    if (t.type == Tok::Name) {
      const std::string v = t.value;
      if (v == "true" || v == "True" || v == "false" || v == "False") {
        node = make(ExprKind::Const);
        node->value = Value::boolean(v == "true" || v == "True");
        next();
      } else if (v == "none" || v == "None") {
        node = make(ExprKind::Const);
        node->value = Value::none();
        next();
      } else if (with_namespace && is_op(look(), ".")) {
        node = make(ExprKind::NSRef);
        node->name = v;
        next();
        next();
        node->attr = expect_name();
      } else {
        node = make(ExprKind::Name);
        node->name = v;
        names_seen_.push_back(v);
        next();
      }
    } else if (t.type == Tok::String) {
      node = make(ExprKind::Const);
      std::string buf;
      while (current().type == Tok::String) {  // adjacent literals concatenate
        buf += current().value;
        next();
      }
      node->value = Value::string(std::move(buf));
    } else if (t.type == Tok::Integer || t.type == Tok::Float) {
      node = make(ExprKind::Const);
      node->value = t.type == Tok::Integer ? Value::integer(t.ival) : Value::floating(t.fval);
      next();
    } else if (is_op(t, "(")) {
      next();
      node = parse_tuple(false, true, {}, true);
      expect_op(")");
    } else if (is_op(t, "[")) {
      next();
      node = make(ExprKind::List);
      while (!is_op(current(), "]")) {
        if (!node->args.empty()) expect_op(",");
        if (is_op(current(), "]")) break;
        node->args.push_back(parse_expression(true));
      }
      expect_op("]");
    } else if (is_op(t, "{")) {
      next();
      node = make(ExprKind::Dict);
      while (!is_op(current(), "}")) {
        if (!node->args.empty()) expect_op(",");
        if (is_op(current(), "}")) break;
        node->args.push_back(parse_expression(true));
        expect_op(":");
        node->args.push_back(parse_expression(true));
      }
      expect_op("}");
    } else {
      fail("unexpected " + describe(t));
    }
    finish(*node);
    return node;
  }

  bool is_tuple_end(const std::vector<const char*>& extra_end) const {
    const Token& t = current();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || is_op(t, ")")) return true;
    for (const char* e : extra_end)
      if (is_name(t, e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<const char*>& extra_end,
                      bool explicit_parens, bool with_namespace = false) {
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    int line = static_cast<int>(current().pos);
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (is_op(current(), ","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail("Expected an expression, got " + describe(current()));
    }
    auto e = std::make_unique<Expr>(ExprKind::Tuple, line);
    e->args = std::move(args);
    finish(*e);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(current(), ".") || is_op(current(), "[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op(current(), "(")) {
        node = parse_call(std::move(node));
      } else {
        break;
      }
    }
    return node;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op(current(), "|")) {
        node = parse_filter(std::move(node), false);
      } else if (is_name(current(), "is")) {
        node = parse_test(std::move(node));
      } else if (is_op(current(), "(")) {
        node = parse_call(std::move(node));
      } else {
        break;
      }
    }
    return node;
  }

  ExprPtr parse_subscript(ExprPtr node) {
    if (skip_op(".")) {
      const Token& t = current();
      if (t.type == Tok::Name) {
        ExprPtr e = make(ExprKind::Getattr);
        e->name = t.value;
        next();
        e->a = std::move(node);
        finish(*e);
        return e;
      }
      if (t.type != Tok::Integer) fail("expected name or number");
      ExprPtr idx = make(ExprKind::Const);
      idx->value = Value::integer(t.ival);
      next();
      return binary(ExprKind::Getitem, std::move(node), std::move(idx));
    }
    expect_op("[");
    std::vector<ExprPtr> args;
    int line = static_cast<int>(current().pos);
    while (!is_op(current(), "]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    ExprPtr arg;
    if (args.size() == 1) {
      arg = std::move(args[0]);
    } else {
      arg = std::make_unique<Expr>(ExprKind::Tuple, line);
      arg->args = std::move(args);
      finish(*arg);
    }
    return binary(ExprKind::Getitem, std::move(node), std::move(arg));
  }

  ExprPtr parse_subscribed() {
    ExprPtr start;
    if (!skip_op(":")) {
      ExprPtr node = parse_expression(true);
      if (!is_op(current(), ":")) return node;
      next();
      start = std::move(node);
    }
    ExprPtr e = make(ExprKind::Slice);
    ExprPtr stop, step;
    if (!is_op(current(), ":") && !is_op(current(), "]") && !is_op(current(), ",")) stop = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op(current(), "]") && !is_op(current(), ",")) step = parse_expression(true);
    }
    e->a = std::move(start);
    e->b = std::move(stop);
    e->c = std::move(step);
    finish(*e);
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool require_comma = false;
    while (!is_op(current(), ")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(current(), ")")) break;
      }
      if (is_op(current(), "*")) {
        if (e.dyn_args || e.dyn_kwargs) fail("invalid syntax for function call expression");
        next();
        e.dyn_args = parse_expression(true);
      } else if (is_op(current(), "**")) {
        if (e.dyn_kwargs) fail("invalid syntax for function call expression");
        next();
        e.dyn_kwargs = parse_expression(true);
      } else if (current().type == Tok::Name && is_op(look(), "=")) {
        if (e.dyn_kwargs) fail("invalid syntax for function call expression");
        std::string key = current().value;
        next();
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (e.dyn_args || e.dyn_kwargs || !e.kwargs.empty()) fail("invalid syntax for function call expression");
        e.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    ExprPtr e = make(ExprKind::Call);
    parse_call_args(*e);
    e->a = std::move(node);
    finish(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op(current(), "|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      ExprPtr e = make(ExprKind::Filter);
      e->name = expect_name();
      while (skip_op(".")) {
        e->name += '.';
        e->name += expect_name();
      }
      if (is_op(current(), "(")) parse_call_args(*e);
      e->filter = find_filter(e->name);
      if (!e->filter) {
        if (is_known_unsupported_filter(e->name)) unsupported("filter '" + e->name + "'");
        fail("No filter named '" + e->name + "'.");
      }
      e->a = std::move(node);
      finish(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    next();  // 'is'
    bool negated = skip_name("not");
    ExprPtr e = make(ExprKind::Test);
    e->name = expect_name();
    while (skip_op(".")) {
      e->name += '.';
      e->name += expect_name();
    }
    const Token& t = current();
    if (is_op(t, "(")) {
      parse_call_args(*e);
    } else if ((t.type == Tok::Name || t.type == Tok::String || t.type == Tok::Integer || t.type == Tok::Float ||
                is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
      if (is_name(t, "is")) fail("You cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary(false)));
    }
    e->test = find_test(e->name);
    if (!e->test) {
      static const char* const kKnown[] = {"escaped", "filter", "test", "callable"};
      for (const char* k : kKnown)
        if (e->name == k) unsupported("test '" + e->name + "'");
      fail("No test named '" + e->name + "'.");
    }
    e->a = std::move(node);
    finish(*e);
    if (negated) return unary(ExprKind::Not, std::move(e));
    return e;
  }
};

}  // namespace

std::shared_ptr<const Program> parse_template(const std::string& source, const Limits& limits) {
  if (source.size() > limits.max_source_bytes)
    throw Error(StatusCode::kBadFormat,
                "chat template larger than " + std::to_string(limits.max_source_bytes) + " bytes");
  if (!is_valid_utf8(source)) throw Error(StatusCode::kBadFormat, "chat template is not valid UTF-8");
  Lexer lexer(source);
  std::vector<Token> toks = lexer.run();
  Parser parser(lexer.source(), std::move(toks), limits);
  auto program = std::make_shared<Program>();
  program->body = parser.parse();
  program->limits = limits;
  return program;
}

}  // namespace ember::jinja
