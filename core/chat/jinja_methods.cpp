// The Python methods of str, dict and list values (Evaluator::call_method),
// and Python's str functions (case mapping, strip, split, splitlines, count)
// that the filters share.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>

#include "core/chat/jinja_internal.h"

namespace ember::jinja {

// ------------------------------------------------------------ case mapping
// ASCII, Latin-1, Latin Extended-A, basic Greek and Cyrillic (simple 1:1
// mappings; 'ß'.upper() == 'SS' as in Python). Other scripts pass through.
char32_t lower_cp(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c >= 0x100 && c <= 0x17F) {
    if ((c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c % 2 == 0) ? c + 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
    if (c == 0x178) return 0xFF;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

char32_t upper_cp(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x100 && c <= 0x17F) {
    if ((c <= 0x137) || (c >= 0x14A && c <= 0x177)) return (c % 2 == 1) ? c - 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

namespace {

bool is_cased(char32_t c) { return lower_cp(c) != c || upper_cp(c) != c || c == 0xDF; }

}  // namespace

void append_upper(std::string& out, char32_t c) {
  if (c == 0xDF)
    out += "SS";
  else
    append_utf8(out, upper_cp(c));
}

std::string str_lower(const std::string& s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) append_utf8(out, lower_cp(c));
  return out;
}

std::string str_upper(const std::string& s) {
  std::string out;
  for (char32_t c : utf8_decode(s)) append_upper(out, c);
  return out;
}

std::string str_capitalize(const std::string& s) {
  std::u32string u = utf8_decode(s);
  std::string out;
  for (size_t k = 0; k < u.size(); ++k) {
    if (k == 0)
      append_upper(out, u[k]);
    else
      append_utf8(out, lower_cp(u[k]));
  }
  return out;
}

namespace {

std::string str_title_py(const std::string& s) {  // str.title()
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (prev_cased)
      append_utf8(out, lower_cp(c));
    else
      append_upper(out, c);
    prev_cased = is_cased(c);
  }
  return out;
}

}  // namespace

// strip with Python semantics: chars == nullptr -> whitespace.
std::string str_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  if (!chars) {  // fast path: the text at both ends after ASCII whitespace is ASCII
    auto ascii_ws = [](unsigned char c) { return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F); };
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && ascii_ws(static_cast<unsigned char>(s[b]))) ++b;
    if (right)
      while (e > b && ascii_ws(static_cast<unsigned char>(s[e - 1]))) --e;
    bool edge_non_ascii = (left && b < e && static_cast<unsigned char>(s[b]) >= 0x80) ||
                          (right && e > b && static_cast<unsigned char>(s[e - 1]) >= 0x80);
    if (!edge_non_ascii) return s.substr(b, e - b);
  }
  std::u32string u = utf8_decode(s);
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

namespace {

std::vector<std::string> str_split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) runtime_error("empty separator");
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t p = s.find(*sep, start);
      if (p == std::string::npos) break;
      out.push_back(s.substr(start, p - start));
      start = p + sep->size();
    }
    out.push_back(s.substr(start));
    return out;
  }
  std::u32string u = utf8_decode(s);
  size_t k = 0, n = u.size();
  while (true) {
    while (k < n && py_isspace(u[k])) ++k;
    if (k >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(utf8_encode(std::u32string_view(u).substr(k)));  // remainder keeps trailing space
      break;
    }
    size_t b = k;
    while (k < n && !py_isspace(u[k])) ++k;
    out.push_back(utf8_encode(std::u32string_view(u).substr(b, k - b)));
  }
  return out;
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

}  // namespace

std::vector<std::string> str_splitlines(const std::string& s, bool keepends) {
  std::u32string u = utf8_decode(s);
  std::vector<std::string> out;
  size_t b = 0, k = 0, n = u.size();
  while (k < n) {
    if (is_line_break(u[k])) {
      size_t e = k + 1;
      if (u[k] == '\r' && e < n && u[e] == '\n') ++e;
      out.push_back(utf8_encode(std::u32string_view(u).substr(b, (keepends ? e : k) - b)));
      b = k = e;
    } else {
      ++k;
    }
  }
  if (b < n) out.push_back(utf8_encode(std::u32string_view(u).substr(b)));
  return out;
}

std::string str_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count,
                        size_t limit) {
  std::string out;
  if (old.empty()) {  // Python inserts rep between every code point
    std::u32string u = utf8_decode(s);
    int64_t done = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || done < count) {
        out += rep;
        ++done;
      }
      if (k < u.size()) append_utf8(out, u[k]);
      if (out.size() > limit) runtime_error("string result too large");
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += rep;
    if (out.size() > limit) runtime_error("string result too large");
    start = p + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

namespace {

int64_t str_count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_length(s)) + 1;
  int64_t n = 0;
  for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
  return n;
}

// Python str.find result in code points.
int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, byte_pos)));
}

}  // namespace

// ================================================================ methods

bool Evaluator::is_str_method(const std::string& n) {
  static const char* const kNames[] = {
      "capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
      "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
      "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
      "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
      "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
      "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
      "swapcase",   "title",        "translate",    "upper",   "zfill"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

bool Evaluator::is_dict_method(const std::string& n) {
  static const char* const kNames[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                       "pop",   "popitem", "setdefault", "update", "values"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

bool Evaluator::is_list_method(const std::string& n) {
  static const char* const kNames[] = {"append", "clear", "copy",   "count",   "extend", "index",
                                       "insert", "pop",   "remove", "reverse", "sort"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

Value Evaluator::call_method(const Value& self, const std::string& name, CallArgs& args) {
  const std::string where = std::string(type_name(self)) + "." + name;
  if (self.is_string()) {
    const std::string& s = self.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      Bound b(args, {"chars"}, where);
      Value chars = b.get(0, Value::none());
      bool l = name != "rstrip", r = name != "lstrip";
      if (chars.is_none()) return Value::string(str_strip(s, nullptr, l, r));
      return Value::string(str_strip(s, &need_string(chars, where + " chars"), l, r));
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "casefold" ||
        name == "swapcase") {
      no_args(args, where);
      if (name == "upper") return Value::string(str_upper(s));
      if (name == "lower" || name == "casefold") {
        if (name == "casefold" && s.find("\xc3\x9f") != std::string::npos) unsupported("str.casefold of 'ß'");
        return Value::string(str_lower(s));
      }
      if (name == "title") return Value::string(str_title_py(s));
      if (name == "capitalize") return Value::string(str_capitalize(s));
      std::string out;
      for (char32_t c : utf8_decode(s)) {
        if (lower_cp(c) != c)
          append_utf8(out, lower_cp(c));
        else
          append_upper(out, c);
      }
      return Value::string(std::move(out));
    }
    if (name == "split" || name == "rsplit") {
      Bound b(args, {"sep", "maxsplit"}, where);
      Value sep = b.get(0, Value::none());
      int64_t maxsplit = need_int(b.get(1, Value::integer(-1)), "maxsplit");
      if (name == "rsplit" && maxsplit >= 0) unsupported("str.rsplit with maxsplit");
      std::vector<std::string> parts =
          sep.is_none() ? str_split(s, nullptr, maxsplit) : str_split(s, &need_string(sep, "sep"), maxsplit);
      std::vector<Value> items;
      for (auto& p : parts) items.push_back(Value::string(std::move(p)));
      check_list(items.size());
      return Value::make_list(std::move(items));
    }
    if (name == "splitlines") {
      Bound b(args, {"keepends"}, where);
      std::vector<Value> items;
      for (auto& p : str_splitlines(s, truthy(b.get(0, Value::boolean(false)))))
        items.push_back(Value::string(std::move(p)));
      return Value::make_list(std::move(items));
    }
    if (name == "startswith" || name == "endswith") {
      Bound b(args, {"prefix", "start", "end"}, where);
      if (b.has(1) || b.has(2)) unsupported(where + " with start/end");
      Value p = b.get(0);
      std::vector<Value> cands = p.is_tuple() ? p.list->items : std::vector<Value>{p};
      for (const auto& c : cands) {
        const std::string& x = need_string(c, where + " argument");
        if (x.size() > s.size()) continue;
        if (name == "startswith" ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "replace") {
      Bound b(args, {"old", "new", "count"}, where);
      int64_t count = need_int(b.get(2, Value::integer(-1)), "count");
      return Value::string(
          str_replace(s, need_string(b.get(0), "old"), need_string(b.get(1), "new"), count, lim.max_output_bytes));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
      Bound b(args, {"sub", "start", "end"}, where);
      if (b.has(1) || b.has(2)) unsupported(where + " with start/end");
      const std::string& sub = need_string(b.get(0), "sub");
      if (name == "count") return Value::integer(str_count(s, sub));
      size_t p = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
      if (p == std::string::npos) {
        if (name == "index" || name == "rindex") runtime_error("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(cp_index(s, p));
    }
    if (name == "join") {
      Bound b(args, {"iterable"}, where);
      std::string out;
      bool first = true;
      for (const auto& item : iterate(b.get(0))) {
        if (!first) out += s;
        first = false;
        out += need_string(item, "sequence item");
        check_string(out);
      }
      return Value::string(std::move(out));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      Bound b(args, {"affix"}, where);
      const std::string& x = need_string(b.get(0), where + " argument");
      if (x.size() <= s.size()) {
        if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
        if (name == "removesuffix" && !x.empty() && s.compare(s.size() - x.size(), x.size(), x) == 0)
          return Value::string(s.substr(0, s.size() - x.size()));
      }
      return self;
    }
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric" || name == "isalpha" || name == "isalnum" ||
        name == "isspace" || name == "islower" || name == "isupper" || name == "isascii") {
      no_args(args, where);
      std::u32string u = utf8_decode(s);
      if (name == "isascii")
        return Value::boolean(std::all_of(u.begin(), u.end(), [](char32_t c) { return c < 0x80; }));
      if (name == "islower" || name == "isupper") {
        CallArgs none;
        Evaluator& ev = *this;
        return Value::boolean(name == "islower" ? t_lower(ev, self, none) : t_upper(ev, self, none));
      }
      if (u.empty()) return Value::boolean(false);
      for (char32_t c : u) {
        if (name == "isspace") {
          if (!py_isspace(c)) return Value::boolean(false);
          continue;
        }
        if (c >= 0x80) unsupported(where + " on non-ASCII text");
        bool digit = c >= '0' && c <= '9';
        bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        bool ok = (name == "isalpha") ? alpha : (name == "isalnum") ? (alpha || digit) : digit;
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    }
    unsupported("method " + where + "()");
  }
  if (self.kind == Kind::Dict) {
    if (name == "get") {
      Bound b(args, {"key", "default"}, where);
      if (const Value* v = static_cast<const DictData&>(*self.dict).find(b.get(0))) return *v;
      return b.get(1, Value::none());
    }
    if (name == "items" || name == "keys" || name == "values") {
      no_args(args, where);
      std::vector<Value> items;
      for (const auto& kv : self.dict->items) {
        if (name == "items")
          items.push_back(Value::make_list({kv.first, kv.second}, true));
        else
          items.push_back(name == "keys" ? kv.first : kv.second);
      }
      return Value::make_list(std::move(items));
    }
    if (name == "copy") {
      no_args(args, where);
      Value d = Value::make_dict();
      d.dict->items = self.dict->items;
      return d;
    }
    if (name == "fromkeys") unsupported("method " + where + "()");
    runtime_error("access to attribute '" + name + "' of 'dict' object is unsafe.");
  }
  if (self.kind == Kind::List) {
    if (name == "count" || name == "index") {
      Bound b(args, {"value"}, where);
      int64_t n = 0;
      for (size_t k = 0; k < self.list->items.size(); ++k) {
        if (py_equal(self.list->items[k], b.get(0))) {
          if (name == "index") return Value::integer(static_cast<int64_t>(k));
          ++n;
        }
      }
      if (name == "index") runtime_error("value is not in list");
      return Value::integer(n);
    }
    if (name == "copy") {
      no_args(args, where);
      return Value::make_list(self.list->items);
    }
    runtime_error("access to attribute '" + name + "' of 'list' object is unsafe.");
  }
  unsupported("method " + where + "()");
}

}  // namespace ember::jinja
