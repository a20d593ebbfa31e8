// Evaluator of the Jinja subset: scoping as compiled by jinja2 (a for-loop
// body gets a fresh scope per iteration, if/elif do not create one, macros
// close over their defining scope), Python operator semantics, the sandboxed
// attribute/item lookup of jinja2.sandbox.ImmutableSandboxedEnvironment, and
// the filters, tests, globals and str/dict/list methods chat templates use.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>

#include "core/chat/jinja.h"

namespace ember::jinja {

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  Value* find_local(const std::string& name) {
    for (auto& kv : vars)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    if (Value* p = find_local(name))
      *p = std::move(v);
    else
      vars.emplace_back(name, std::move(v));
  }
};

namespace {

enum class Flow { Normal, Break, Continue };

Value make_callable(CallableData::Type t, std::string name, Value self = {}) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<CallableData>();
  v.fn->type = t;
  v.fn->name = std::move(name);
  v.fn->self = std::move(self);
  return v;
}

[[noreturn]] void undefined_error(const Value& u) {
  if (u.s && !u.s->empty()) runtime_error(*u.s);
  runtime_error("value is undefined");
}

std::string undefined_name_hint(const std::string& name) { return "'" + name + "' is undefined"; }

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

bool is_cased(char32_t c) { return lower_cp(c) != c || upper_cp(c) != c || c == 0xDF; }

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

std::vector<std::string> str_splitlines(const std::string& s, bool keepends = false) {
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

// Python slice.indices
void slice_indices(int64_t len, std::optional<int64_t> start, std::optional<int64_t> stop, std::optional<int64_t> step,
                   int64_t& b, int64_t& e, int64_t& st) {
  st = step.value_or(1);
  if (st == 0) runtime_error("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> v, int64_t def_pos, int64_t def_neg) {
    if (!v) return st > 0 ? def_pos : def_neg;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= len) {
      x = st < 0 ? len - 1 : len;
    }
    return x;
  };
  b = adjust(start, 0, len - 1);
  e = adjust(stop, len, -1);
}

int compare_values(const Value& a, const Value& b, const char* op, int depth = 0);

}  // namespace

// ================================================================ Evaluator
struct Evaluator {
  const Program& prog;
  const Limits& lim;
  std::string* out = nullptr;
  std::shared_ptr<Frame> frame;
  std::shared_ptr<Frame> globals;
  uint64_t iterations = 0;
  int depth = 0;
  StackBudget stack{lim.max_stack_bytes};  // taken in render(): Depth bounds the stack used below it

  // Reference cycles a template can build (a macro closes over the frame
  // that holds it; a namespace can hold itself or such a macro) are broken
  // when the render ends, however it ends.
  std::vector<std::weak_ptr<Frame>> macro_frames;
  std::vector<std::weak_ptr<DictData>> namespaces;

  explicit Evaluator(const Program& p) : prog(p), lim(p.limits) {}
  ~Evaluator() {
    for (auto& w : namespaces)
      if (auto d = w.lock()) d->items.clear();
    for (auto& w : macro_frames)
      if (auto f = w.lock()) f->vars.clear();
  }
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  struct Depth {
    Evaluator& ev;
    explicit Depth(Evaluator& e) : ev(e) {
      if (++ev.depth > ev.lim.max_eval_depth || ev.stack.exceeded()) {
        --ev.depth;
        runtime_error("template recursion too deep");
      }
    }
    ~Depth() { --ev.depth; }
  };

  void write(const std::string& s) {
    if (out->size() + s.size() > lim.max_output_bytes)
      runtime_error("rendered output exceeds " + std::to_string(lim.max_output_bytes) + " bytes");
    out->append(s);
  }
  void check_string(const std::string& s) const {
    if (s.size() > lim.max_output_bytes) runtime_error("string value exceeds the output size limit");
  }
  void check_list(size_t n) const {
    if (n > lim.max_list_items) runtime_error("list exceeds " + std::to_string(lim.max_list_items) + " items");
  }
  void count_iteration() {
    if (++iterations > lim.max_loop_iterations)
      runtime_error("more than " + std::to_string(lim.max_loop_iterations) + " loop iterations");
  }

  // ---------------------------------------------------------- scopes
  Value lookup(const std::string& name) {
    for (Frame* f = frame.get(); f; f = f->parent.get())
      if (Value* v = f->find_local(name)) return *v;
    return Value::undefined(undefined_name_hint(name));
  }

  // ---------------------------------------------------------- iteration
  std::vector<Value> iterate(const Value& v) {
    switch (v.kind) {
      case Kind::Undefined: return {};
      case Kind::List: return v.list->items;
      case Kind::String: {
        std::vector<Value> items;
        for (char32_t c : utf8_decode(v.str())) {
          std::string s;
          append_utf8(s, c);
          items.push_back(Value::string(std::move(s)));
        }
        return items;
      }
      case Kind::Dict: {
        std::vector<Value> keys;
        for (const auto& kv : v.dict->items) keys.push_back(kv.first);
        return keys;
      }
      default: runtime_error(std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  // ---------------------------------------------------------- attribute / item
  static bool is_str_method(const std::string& n) {
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
  static bool is_dict_method(const std::string& n) {
    static const char* const kNames[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                         "pop",   "popitem", "setdefault", "update", "values"};
    for (const char* k : kNames)
      if (n == k) return true;
    return false;
  }
  static bool is_list_method(const std::string& n) {
    static const char* const kNames[] = {"append", "clear", "copy",   "count",   "extend", "index",
                                         "insert", "pop",   "remove", "reverse", "sort"};
    for (const char* k : kNames)
      if (n == k) return true;
    return false;
  }

  // Python attribute of obj, if it has one (methods). nullopt if none.
  std::optional<Value> py_attribute(const Value& obj, const std::string& name) {
    switch (obj.kind) {
      case Kind::String:
        if (is_str_method(name)) return make_callable(CallableData::Type::Method, name, obj);
        break;
      case Kind::Dict:
        if (is_dict_method(name)) return make_callable(CallableData::Type::Method, name, obj);
        break;
      case Kind::List:
        if (obj.list->tuple ? (name == "count" || name == "index") : is_list_method(name))
          return make_callable(CallableData::Type::Method, name, obj);
        break;
      case Kind::Namespace:
        if (const Value* v = static_cast<const DictData&>(*obj.dict).find(Value::string(name))) return *v;
        break;
      case Kind::Int:
      case Kind::Bool:
      case Kind::Float:
        if (name == "real" || name == "imag" || name == "numerator" || name == "denominator" || name == "conjugate" ||
            name == "bit_length" || name == "is_integer" || name == "as_integer_ratio" || name == "hex" ||
            name == "to_bytes")
          unsupported("attribute '" + name + "' of a number");
        break;
      default: break;
    }
    return std::nullopt;
  }

  static std::string object_desc(const Value& obj) { return std::string("'") + type_name(obj) + " object'"; }

  Value getattr(const Value& obj, const std::string& name) {
    if (obj.is_undefined()) undefined_error(obj);
    if (auto a = py_attribute(obj, name)) return *a;
    if (obj.kind == Kind::Dict) {
      if (const Value* v = static_cast<const DictData&>(*obj.dict).find(Value::string(name))) return *v;
    }
    return Value::undefined(object_desc(obj) + " has no attribute '" + name + "'");
  }

  Value getitem(const Value& obj, const Value& key) {
    if (obj.is_undefined()) undefined_error(obj);
    switch (obj.kind) {
      case Kind::Dict:
        if (key.kind != Kind::List || key.list->tuple) {
          if (const Value* v = static_cast<const DictData&>(*obj.dict).find(key)) return *v;
        }
        break;
      case Kind::List:
        if (key.is_integral()) {
          int64_t n = static_cast<int64_t>(obj.list->items.size());
          int64_t i = key.i < 0 ? key.i + n : key.i;
          if (i >= 0 && i < n) return obj.list->items[static_cast<size_t>(i)];
        }
        break;
      case Kind::String:
        if (key.is_integral()) {
          std::u32string u = utf8_decode(obj.str());
          int64_t n = static_cast<int64_t>(u.size());
          int64_t i = key.i < 0 ? key.i + n : key.i;
          if (i >= 0 && i < n) {
            std::string s;
            append_utf8(s, u[static_cast<size_t>(i)]);
            return Value::string(std::move(s));
          }
        }
        break;
      default: break;
    }
    if (key.is_string()) {
      if (auto a = py_attribute(obj, key.str())) return *a;
    }
    return Value::undefined(object_desc(obj) + " has no attribute " + py_repr(key));
  }

  Value slice(const Value& obj, const Expr& s) {
    if (obj.is_undefined()) undefined_error(obj);
    auto bound = [&](const ExprPtr& e) -> std::optional<int64_t> {
      if (!e) return std::nullopt;
      Value v = eval(*e);
      if (v.is_none()) return std::nullopt;
      if (!v.is_integral()) runtime_error("slice indices must be integers or None");
      return v.i;
    };
    std::optional<int64_t> start = bound(s.a), stop = bound(s.b), step = bound(s.c);
    auto pick = [&](int64_t len, const std::function<void(int64_t)>& take) {
      int64_t b, e, st;
      slice_indices(len, start, stop, step, b, e, st);
      if (st > 0)
        for (int64_t k = b; k < e; k += st) take(k);
      else
        for (int64_t k = b; k > e; k += st) take(k);
    };
    if (obj.kind == Kind::List) {
      std::vector<Value> items;
      const auto& src = obj.list->items;
      pick(static_cast<int64_t>(src.size()), [&](int64_t k) { items.push_back(src[static_cast<size_t>(k)]); });
      return Value::make_list(std::move(items), obj.list->tuple);
    }
    if (obj.kind == Kind::String) {
      std::u32string u = utf8_decode(obj.str()), r;
      pick(static_cast<int64_t>(u.size()), [&](int64_t k) { r.push_back(u[static_cast<size_t>(k)]); });
      return Value::string(utf8_encode(r));
    }
    return Value::undefined(object_desc(obj) + " is not sliceable");
  }

  // ---------------------------------------------------------- operators
  static double as_double(const Value& v) { return v.kind == Kind::Float ? v.f : static_cast<double>(v.i); }

  Value arith(BinOp op, const Value& a, const Value& b) {
    if (a.is_undefined()) undefined_error(a);
    if (b.is_undefined()) undefined_error(b);
    auto type_err = [&](const char* sym) -> Value {
      runtime_error(std::string("unsupported operand type(s) for ") + sym + ": '" + type_name(a) + "' and '" +
                    type_name(b) + "'");
    };
    switch (op) {
      case BinOp::Add:
        if (a.is_string() && b.is_string()) {
          if (a.str().size() + b.str().size() > lim.max_output_bytes) runtime_error("string value too large");
          return Value::string(a.str() + b.str());
        }
        if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
          std::vector<Value> items = a.list->items;
          items.insert(items.end(), b.list->items.begin(), b.list->items.end());
          check_list(items.size());
          return Value::make_list(std::move(items), a.list->tuple);
        }
        if (a.is_number() && b.is_number()) {
          if (a.is_integral() && b.is_integral()) {
            int64_t r;
            if (__builtin_add_overflow(a.i, b.i, &r)) unsupported("integer arithmetic beyond 64 bits");
            return Value::integer(r);
          }
          return Value::floating(as_double(a) + as_double(b));
        }
        if (a.is_string() || b.is_string())
          runtime_error(std::string("can only concatenate str (not \"") + type_name(a.is_string() ? b : a) +
                        "\") to str");
        return type_err("+");
      case BinOp::Sub:
        if (a.is_number() && b.is_number()) {
          if (a.is_integral() && b.is_integral()) {
            int64_t r;
            if (__builtin_sub_overflow(a.i, b.i, &r)) unsupported("integer arithmetic beyond 64 bits");
            return Value::integer(r);
          }
          return Value::floating(as_double(a) - as_double(b));
        }
        return type_err("-");
      case BinOp::Mul: {
        if (a.is_number() && b.is_number()) {
          if (a.is_integral() && b.is_integral()) {
            int64_t r;
            if (__builtin_mul_overflow(a.i, b.i, &r)) unsupported("integer arithmetic beyond 64 bits");
            return Value::integer(r);
          }
          return Value::floating(as_double(a) * as_double(b));
        }
        const Value* seq = (a.is_string() || a.is_list()) ? &a : (b.is_string() || b.is_list()) ? &b : nullptr;
        const Value* cnt = seq == &a ? &b : &a;
        if (seq && cnt->is_integral()) {
          int64_t n = std::max<int64_t>(0, cnt->i);
          if (seq->is_string()) {
            if (n > 0 && seq->str().size() * static_cast<uint64_t>(n) > lim.max_output_bytes)
              runtime_error("string value too large");
            std::string r;
            for (int64_t k = 0; k < n; ++k) r += seq->str();
            return Value::string(std::move(r));
          }
          if (n > 0 && seq->list->items.size() * static_cast<uint64_t>(n) > lim.max_list_items)
            runtime_error("list too large");
          std::vector<Value> items;
          for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->items.begin(), seq->list->items.end());
          return Value::make_list(std::move(items), seq->list->tuple);
        }
        return type_err("*");
      }
      case BinOp::Div:
        if (a.is_number() && b.is_number()) {
          if (as_double(b) == 0.0) runtime_error("division by zero");
          return Value::floating(as_double(a) / as_double(b));
        }
        return type_err("/");
      case BinOp::FloorDiv:
      case BinOp::Mod:
        if (a.is_string() && op == BinOp::Mod) unsupported("'%' string formatting");
        if (a.is_number() && b.is_number()) {
          if (a.is_integral() && b.is_integral()) {
            if (b.i == 0) runtime_error("integer division or modulo by zero");
            if (a.i == INT64_MIN && b.i == -1) unsupported("integer arithmetic beyond 64 bits");
            int64_t q = a.i / b.i, r = a.i % b.i;
            if (r != 0 && ((r < 0) != (b.i < 0))) {
              q -= 1;
              r += b.i;
            }
            return Value::integer(op == BinOp::FloorDiv ? q : r);
          }
          double x = as_double(a), y = as_double(b);
          if (y == 0.0) runtime_error("float division by zero");
          double mod = std::fmod(x, y);
          double div = (x - mod) / y;
          if (mod != 0.0) {
            if ((y < 0) != (mod < 0)) {
              mod += y;
              div -= 1.0;
            }
          } else {
            mod = std::copysign(0.0, y);
          }
          double floordiv;
          if (div != 0.0) {
            floordiv = std::floor(div);
            if (div - floordiv > 0.5) floordiv += 1.0;
          } else {
            floordiv = std::copysign(0.0, x / y);
          }
          return Value::floating(op == BinOp::FloorDiv ? floordiv : mod);
        }
        return type_err(op == BinOp::Mod ? "%" : "//");
      case BinOp::Pow:
        if (a.is_number() && b.is_number()) {
          if (a.is_integral() && b.is_integral() && b.i >= 0) {
            int64_t r = 1, base = a.i, e = b.i;
            while (e > 0) {
              if (e & 1)
                if (__builtin_mul_overflow(r, base, &r)) unsupported("integer arithmetic beyond 64 bits");
              e >>= 1;
              if (e > 0 && __builtin_mul_overflow(base, base, &base)) unsupported("integer arithmetic beyond 64 bits");
            }
            return Value::integer(r);
          }
          double x = as_double(a), y = as_double(b);
          if (x == 0.0 && y < 0) runtime_error("0.0 cannot be raised to a negative power");
          double r = std::pow(x, y);
          if (std::isnan(r) && !std::isnan(x) && !std::isnan(y)) unsupported("complex result of '**'");
          return Value::floating(r);
        }
        return type_err("**");
    }
    return Value();
  }

  bool contains(const Value& container, const Value& item) {
    switch (container.kind) {
      case Kind::Undefined: return false;
      case Kind::String:
        if (!item.is_string())
          runtime_error(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
        return container.str().find(item.str()) != std::string::npos;
      case Kind::List:
        for (const auto& x : container.list->items)
          if (py_equal(x, item)) return true;
        return false;
      case Kind::Dict: return static_cast<const DictData&>(*container.dict).find(item) != nullptr;
      default: runtime_error(std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
  }

  bool compare(CmpOp op, const Value& a, const Value& b) {
    switch (op) {
      case CmpOp::Eq: return py_equal(a, b);
      case CmpOp::Ne: return !py_equal(a, b);
      case CmpOp::In: return contains(b, a);
      case CmpOp::NotIn: return !contains(b, a);
      case CmpOp::Lt: return compare_values(a, b, "<") < 0;
      case CmpOp::Le: return compare_values(a, b, "<=") <= 0;
      case CmpOp::Gt: return compare_values(a, b, ">") == 1;
      case CmpOp::Ge: {
        int c = compare_values(a, b, ">=");
        return c == 1 || c == 0;
      }
    }
    return false;
  }

  // ---------------------------------------------------------- expressions
  void eval_args(const Expr& e, CallArgs& args) {
    for (const auto& x : e.args) args.pos.push_back(eval(*x));
    for (const auto& kv : e.kwargs) args.kw.emplace_back(kv.first, eval(*kv.second));
    if (e.dyn_args) {
      Value v = eval(*e.dyn_args);
      for (auto& x : iterate(v)) args.pos.push_back(std::move(x));
    }
    if (e.dyn_kwargs) {
      Value v = eval(*e.dyn_kwargs);
      if (v.kind != Kind::Dict) runtime_error("argument after ** must be a mapping");
      for (const auto& kv : v.dict->items) {
        if (!kv.first.is_string()) runtime_error("keywords must be strings");
        args.kw.emplace_back(kv.first.str(), kv.second);
      }
    }
  }

  Value apply_filter(const Expr& e, Value subject) {
    CallArgs args;
    eval_args(e, args);
    return e.filter(*this, subject, args);
  }

  Value eval_filter_chain(const Expr& e, const Value& innermost) {
    Value subject = e.a ? eval_filter_chain(*e.a, innermost) : innermost;
    return apply_filter(e, std::move(subject));
  }

  Value eval(const Expr& e) {
    Depth guard(*this);
    switch (e.kind) {
      case ExprKind::Const: return e.value;
      case ExprKind::Name: return lookup(e.name);
      case ExprKind::NSRef: runtime_error("namespace reference outside an assignment");
      case ExprKind::List:
      case ExprKind::Tuple: {
        std::vector<Value> items;
        items.reserve(e.args.size());
        for (const auto& x : e.args) items.push_back(eval(*x));
        return Value::make_list(std::move(items), e.kind == ExprKind::Tuple);
      }
      case ExprKind::Dict: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          Value key = eval(*e.args[k]);
          if (key.kind == Kind::List && !key.list->tuple) runtime_error("unhashable type: 'list'");
          if (key.kind == Kind::Dict) runtime_error("unhashable type: 'dict'");
          d.dict->set(key, eval(*e.args[k + 1]));
        }
        return d;
      }
      case ExprKind::Getattr: return getattr(eval(*e.a), e.name);
      case ExprKind::Getitem: {
        Value obj = eval(*e.a);
        if (e.b->kind == ExprKind::Slice) return slice(obj, *e.b);
        return getitem(obj, eval(*e.b));
      }
      case ExprKind::Slice: runtime_error("slice outside a subscript");
      case ExprKind::Call: {
        Value callee = eval(*e.a);
        CallArgs args;
        eval_args(e, args);
        return call(callee, args);
      }
      case ExprKind::Filter: {
        if (!e.a) runtime_error("filter without a value");
        return apply_filter(e, eval(*e.a));
      }
      case ExprKind::Test: {
        Value subject = eval(*e.a);
        CallArgs args;
        eval_args(e, args);
        return Value::boolean(e.test(*this, subject, args));
      }
      case ExprKind::Neg:
      case ExprKind::Pos: {
        Value v = eval(*e.a);
        if (v.is_undefined()) undefined_error(v);
        if (v.kind == Kind::Float) return Value::floating(e.kind == ExprKind::Neg ? -v.f : v.f);
        if (v.is_integral()) {
          if (e.kind == ExprKind::Pos) return Value::integer(v.i);
          if (v.i == INT64_MIN) unsupported("integer arithmetic beyond 64 bits");
          return Value::integer(-v.i);
        }
        runtime_error(std::string("bad operand type for unary ") + (e.kind == ExprKind::Neg ? "-" : "+") + ": '" +
                      type_name(v) + "'");
      }
      case ExprKind::Not: return Value::boolean(!truthy(eval(*e.a)));
      case ExprKind::Binary: {
        Value a = eval(*e.a);
        Value b = eval(*e.b);
        return arith(e.op, a, b);
      }
      case ExprKind::Concat: {
        std::string s;
        for (const auto& x : e.args) {
          s += py_str(eval(*x));
          check_string(s);
        }
        return Value::string(std::move(s));
      }
      case ExprKind::Compare: {
        Value left = eval(*e.a);
        for (size_t k = 0; k < e.cmp_ops.size(); ++k) {
          Value right = eval(*e.args[k]);
          if (!compare(e.cmp_ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::And: {
        Value a = eval(*e.a);
        if (!truthy(a)) return a;
        return eval(*e.b);
      }
      case ExprKind::Or: {
        Value a = eval(*e.a);
        if (truthy(a)) return a;
        return eval(*e.b);
      }
      case ExprKind::CondExpr: {
        if (truthy(eval(*e.b))) return eval(*e.a);
        if (e.c) return eval(*e.c);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
      }
    }
    return Value();
  }

  // ---------------------------------------------------------- calls
  Value call(const Value& callee, CallArgs& args);
  Value call_method(const Value& self, const std::string& name, CallArgs& args);
  Value call_global(const std::string& name, CallArgs& args);
  Value call_macro(const CallableData& fn, CallArgs& args);

  // ---------------------------------------------------------- statements
  void assign(const Expr& target, const Value& v) {
    switch (target.kind) {
      case ExprKind::Name:
        if (target.name == "loop") {
          // jinja2 refuses to assign 'loop' only as a for target; plain set shadows it.
        }
        frame->set(target.name, v);
        return;
      case ExprKind::NSRef: {
        Value ns = lookup(target.name);
        if (ns.kind != Kind::Namespace) runtime_error("Cannot assign attribute on non-namespace object");
        ns.dict->set(Value::string(target.attr), v);
        return;
      }
      case ExprKind::Tuple: {
        std::vector<Value> items = iterate(v);
        if (items.size() != target.args.size())
          runtime_error(items.size() > target.args.size()
                            ? "too many values to unpack (expected " + std::to_string(target.args.size()) + ")"
                            : "not enough values to unpack (expected " + std::to_string(target.args.size()) + ", got " +
                                  std::to_string(items.size()) + ")");
        for (size_t k = 0; k < items.size(); ++k) assign(*target.args[k], items[k]);
        return;
      }
      default: runtime_error("can't assign to this expression");
    }
  }

  struct FramePush {
    Evaluator& ev;
    std::shared_ptr<Frame> saved;
    FramePush(Evaluator& e, std::shared_ptr<Frame> parent) : ev(e), saved(e.frame) {
      auto f = std::make_shared<Frame>();
      f->parent = std::move(parent);
      ev.frame = std::move(f);
    }
    ~FramePush() { ev.frame = std::move(saved); }
  };

  struct Capture {
    Evaluator& ev;
    std::string* saved;
    std::string buf;
    explicit Capture(Evaluator& e) : ev(e), saved(e.out) { ev.out = &buf; }
    ~Capture() { ev.out = saved; }
  };

  Flow exec_body(const Body& body) {
    for (const auto& s : body) {
      Flow f = exec(*s);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  // One `loop` object per for-loop, updated in place each iteration (as
  // jinja2's LoopContext is). previtem/nextitem hold Undefined when absent.
  static Value make_loop_object() {
    Value loop = Value::make_dict();
    for (const char* k : {"index0", "index", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                          "previtem", "nextitem", "cycle", "changed"})
      loop.dict->items.emplace_back(Value::string(k), Value());
    loop.dict->items[7].second = Value::integer(1);
    loop.dict->items[8].second = Value::integer(0);
    loop.dict->items[11].second = make_callable(CallableData::Type::LoopCycle, "cycle", Value::integer(0));
    loop.dict->items[12].second = make_callable(CallableData::Type::Global, "loop.changed");
    return loop;
  }
  static void update_loop_object(Value& loop, size_t idx, const std::vector<Value>& items) {
    auto& d = loop.dict->items;
    const int64_t i = static_cast<int64_t>(idx), n = static_cast<int64_t>(items.size());
    d[0].second = Value::integer(i);
    d[1].second = Value::integer(i + 1);
    d[2].second = Value::integer(n - i);
    d[3].second = Value::integer(n - i - 1);
    d[4].second = Value::boolean(i == 0);
    d[5].second = Value::boolean(i + 1 == n);
    d[6].second = Value::integer(n);
    d[9].second = idx > 0 ? items[idx - 1] : Value::undefined("there is no previous item");
    d[10].second = idx + 1 < items.size() ? items[idx + 1] : Value::undefined("there is no next item");
    d[11].second.fn->self = Value::integer(i);
  }

  Flow exec(const Stmt& s) {
    Depth guard(*this);
    switch (s.kind) {
      case StmtKind::Text: write(s.text); return Flow::Normal;
      case StmtKind::Emit: write(py_str(eval(*s.expr))); return Flow::Normal;
      case StmtKind::If:
        for (size_t k = 0; k < s.values.size(); ++k)
          if (truthy(eval(*s.values[k]))) return exec_body(s.bodies[k]);
        return exec_body(s.else_body);
      case StmtKind::For: {
        std::vector<Value> items = iterate(eval(*s.expr));
        if (s.cond) {
          std::vector<Value> kept;
          for (auto& item : items) {
            count_iteration();
            FramePush push(*this, frame);
            assign(*s.target, item);
            if (truthy(eval(*s.cond))) kept.push_back(std::move(item));
          }
          items = std::move(kept);
        }
        if (items.empty()) {
          FramePush push(*this, frame);
          return exec_body(s.else_body);  // break/continue here belong to an outer loop
        }
        Value loop = make_loop_object();
        for (size_t idx = 0; idx < items.size(); ++idx) {
          count_iteration();
          FramePush push(*this, frame);
          update_loop_object(loop, idx, items);
          frame->set("loop", loop);
          assign(*s.target, items[idx]);
          Flow f = exec_body(s.body);
          if (f == Flow::Break) break;
        }
        return Flow::Normal;
      }
      case StmtKind::Set: assign(*s.target, eval(*s.expr)); return Flow::Normal;
      case StmtKind::SetBlock: {
        std::string text;
        {
          Capture cap(*this);
          FramePush push(*this, frame);
          exec_body(s.body);
          text = std::move(cap.buf);
        }
        Value v = Value::string(std::move(text));
        if (s.expr) v = eval_filter_chain(*s.expr, v);
        assign(*s.target, v);
        return Flow::Normal;
      }
      case StmtKind::Macro: {
        Value fn = make_callable(CallableData::Type::Macro, s.macro->name);
        fn.fn->macro = s.macro.get();
        fn.fn->closure = frame;
        macro_frames.push_back(frame);
        frame->set(s.macro->name, fn);
        return Flow::Normal;
      }
      case StmtKind::FilterBlock: {
        std::string text;
        {
          Capture cap(*this);
          FramePush push(*this, frame);
          exec_body(s.body);
          text = std::move(cap.buf);
        }
        write(py_str(eval_filter_chain(*s.expr, Value::string(std::move(text)))));
        return Flow::Normal;
      }
      case StmtKind::With: {
        std::vector<Value> vals;
        for (const auto& v : s.values) vals.push_back(eval(*v));
        FramePush push(*this, frame);
        for (size_t k = 0; k < vals.size(); ++k) assign(*s.targets[k], vals[k]);
        return exec_body(s.body);
      }
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::Block: {  // HF renders {% generation %} bodies as a caller() macro: own scope
        FramePush push(*this, frame);
        return exec_body(s.body);
      }
    }
    return Flow::Normal;
  }
};

// ================================================================ helpers
namespace {

int compare_values(const Value& a, const Value& b, const char* op, int depth) {
  if (depth > kMaxValueDepth) runtime_error("comparison: value nested too deeply");
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
    double x = Evaluator::as_double(a), y = Evaluator::as_double(b);
    if (std::isnan(x) || std::isnan(y)) return 2;  // every ordering is false; callers treat 2 as "none"
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());  // UTF-8 byte order == code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (py_equal(x[k], y[k])) continue;
      return compare_values(x[k], y[k], op, depth + 1);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  runtime_error(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
                type_name(b) + "'");
}

// Argument binding for filters/methods/globals: names in order; positional
// first, then keywords. Unknown or duplicated arguments are errors.
class Bound {
 public:
  Bound(const CallArgs& a, std::initializer_list<const char*> names, const std::string& fn)
      : names_(names), vals_(names.size()) {
    if (a.pos.size() > names_.size())
      runtime_error(fn + "() takes at most " + std::to_string(names_.size()) + " argument(s)");
    for (size_t k = 0; k < a.pos.size(); ++k) vals_[k] = a.pos[k];
    for (const auto& kv : a.kw) {
      size_t k = 0;
      while (k < names_.size() && kv.first != names_[k]) ++k;
      if (k == names_.size()) runtime_error(fn + "() got an unexpected keyword argument '" + kv.first + "'");
      if (vals_[k]) runtime_error(fn + "() got multiple values for argument '" + kv.first + "'");
      vals_[k] = kv.second;
    }
  }
  bool has(size_t k) const { return vals_[k].has_value(); }
  Value get(size_t k, Value def = {}) const { return vals_[k] ? *vals_[k] : def; }

 private:
  std::vector<const char*> names_;
  std::vector<std::optional<Value>> vals_;
};

void no_args(const CallArgs& a, const std::string& fn) { Bound b(a, {}, fn); }

const std::string& need_string(const Value& v, const std::string& what) {
  if (!v.is_string()) runtime_error(what + " must be str, not " + type_name(v));
  return v.str();
}

int64_t need_int(const Value& v, const std::string& what) {
  if (!v.is_integral()) runtime_error(what + " must be an integer, not " + type_name(v));
  return v.i;
}

// Attribute getter of jinja2's make_attrgetter: dotted path, integer parts
// become indices, each step environment.getitem.
Value get_attr_path(Evaluator& ev, const Value& obj, const Value& attribute) {
  if (attribute.is_integral()) return ev.getitem(obj, attribute);
  std::string path = py_str(attribute);
  Value cur = obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = ev.getitem(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value lower_if_string(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(str_lower(v.str()));
  return v;
}

void sort_values(std::vector<Value>& items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t k = 0; k < items.size(); ++k) keyed.emplace_back(key(items[k]), k);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    int c = compare_values(x.first, y.first, "<");
    if (c == 2) return false;
    return reverse ? c > 0 : c < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(items[kv.second]);
  items = std::move(out);
}

// ------------------------------------------------------------------ filters
Value f_trim(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"chars"}, "trim");
  Value chars = b.get(0, Value::none());
  std::string s = py_str(v);
  if (chars.is_none()) return Value::string(str_strip(s, nullptr, true, true));
  return Value::string(str_strip(s, &need_string(chars, "trim chars"), true, true));
}
Value f_upper(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "upper");
  return Value::string(str_upper(py_str(v)));
}
Value f_lower(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "lower");
  return Value::string(str_lower(py_str(v)));
}
Value f_capitalize(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "capitalize");
  return Value::string(str_capitalize(py_str(v)));
}
Value f_title(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "title");
  // jinja2 do_title: split on ([-\s({\[<]+), upper the first char of each piece, lower the rest.
  std::u32string u = utf8_decode(py_str(v));
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  std::string out;
  size_t k = 0;
  while (k < u.size()) {
    size_t b = k;
    bool sep = is_sep(u[k]);
    while (k < u.size() && is_sep(u[k]) == sep) ++k;
    for (size_t j = b; j < k; ++j) {
      if (j == b)
        append_upper(out, u[j]);
      else
        append_utf8(out, lower_cp(u[j]));
    }
  }
  return Value::string(std::move(out));
}
Value f_length(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "length");
  switch (v.kind) {
    case Kind::Undefined: return Value::integer(0);
    case Kind::String: return Value::integer(static_cast<int64_t>(utf8_length(v.str())));
    case Kind::List: return Value::integer(static_cast<int64_t>(v.list->items.size()));
    case Kind::Dict: return Value::integer(static_cast<int64_t>(v.dict->items.size()));
    default: runtime_error(std::string("object of type '") + type_name(v) + "' has no len()");
  }
}
Value f_default(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"default_value", "boolean"}, "default");
  Value def = b.get(0, Value::string(""));
  bool boolean = truthy(b.get(1, Value::boolean(false)));
  if (v.is_undefined() || (boolean && !truthy(v))) return def;
  return v;
}
Value f_first(Evaluator& ev, const Value& v, CallArgs& a) {
  no_args(a, "first");
  std::vector<Value> items = ev.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}
Value f_last(Evaluator& ev, const Value& v, CallArgs& a) {
  no_args(a, "last");
  std::vector<Value> items = ev.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}
Value f_join(Evaluator& ev, const Value& v, CallArgs& a) {
  Bound b(a, {"d", "attribute"}, "join");
  std::string sep = py_str(b.get(0, Value::string("")));
  Value attribute = b.get(1, Value::none());
  std::string out;
  bool first = true;
  for (const auto& item : ev.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += py_str(attribute.is_none() ? item : get_attr_path(ev, item, attribute));
    ev.check_string(out);
  }
  return Value::string(std::move(out));
}
Value f_replace(Evaluator& ev, const Value& v, CallArgs& a) {
  Bound b(a, {"old", "new", "count"}, "replace");
  Value count = b.get(2, Value::none());
  int64_t n = count.is_none() ? -1 : need_int(count, "replace count");
  return Value::string(str_replace(py_str(v), py_str(b.get(0)), py_str(b.get(1)), n, ev.lim.max_output_bytes));
}
Value f_string(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "string");
  return Value::string(py_str(v));
}
Value f_list(Evaluator& ev, const Value& v, CallArgs& a) {
  no_args(a, "list");
  return Value::make_list(ev.iterate(v));
}
Value f_items(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "items");
  if (v.is_undefined()) return Value::make_list({});
  if (v.kind != Kind::Dict) runtime_error("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  for (const auto& kv : v.dict->items) items.push_back(Value::make_list({kv.first, kv.second}, true));
  return Value::make_list(std::move(items));
}
Value f_dictsort(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"case_sensitive", "by", "reverse"}, "dictsort");
  bool cs = truthy(b.get(0, Value::boolean(false)));
  std::string by = py_str(b.get(1, Value::string("key")));
  bool reverse = truthy(b.get(2, Value::boolean(false)));
  if (v.kind != Kind::Dict) runtime_error("dictsort: value must be a dict");
  int pos = by == "key" ? 0 : by == "value" ? 1 : -1;
  if (pos < 0) runtime_error("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> items;
  for (const auto& kv : v.dict->items) items.push_back(Value::make_list({kv.first, kv.second}, true));
  sort_values(
      items, [&](const Value& x) { return lower_if_string(x.list->items[pos], cs); }, reverse);
  return Value::make_list(std::move(items));
}
Value f_sort(Evaluator& ev, const Value& v, CallArgs& a) {
  Bound b(a, {"reverse", "case_sensitive", "attribute"}, "sort");
  bool reverse = truthy(b.get(0, Value::boolean(false)));
  bool cs = truthy(b.get(1, Value::boolean(false)));
  Value attribute = b.get(2, Value::none());
  std::vector<Value> items = ev.iterate(v);
  sort_values(
      items,
      [&](const Value& x) { return lower_if_string(attribute.is_none() ? x : get_attr_path(ev, x, attribute), cs); },
      reverse);
  return Value::make_list(std::move(items));
}
Value f_unique(Evaluator& ev, const Value& v, CallArgs& a) {
  Bound b(a, {"case_sensitive", "attribute"}, "unique");
  bool cs = truthy(b.get(0, Value::boolean(false)));
  Value attribute = b.get(1, Value::none());
  std::vector<Value> seen, out;
  for (const auto& item : ev.iterate(v)) {
    Value key = lower_if_string(attribute.is_none() ? item : get_attr_path(ev, item, attribute), cs);
    bool dup = false;
    for (const auto& s : seen)
      if (py_equal(s, key)) dup = true;
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::make_list(std::move(out));
}
Value f_reverse(Evaluator& ev, const Value& v, CallArgs& a) {
  no_args(a, "reverse");
  if (v.is_string()) {
    std::u32string u = utf8_decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value::string(utf8_encode(u));
  }
  std::vector<Value> items = ev.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::make_list(std::move(items));
}
Value f_tojson(Evaluator&, const Value& v, CallArgs& a) {
  // HF's override: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  Bound b(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  if (truthy(b.get(0, Value::boolean(false)))) unsupported("tojson(ensure_ascii=true)");
  JsonOptions opt;
  Value indent = b.get(1, Value::none());
  if (!indent.is_none()) {
    opt.pretty = true;
    opt.item_sep = ",";
    if (indent.is_string())
      opt.indent = indent.str();
    else
      opt.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, need_int(indent, "indent"))), ' ');
  }
  Value seps = b.get(2, Value::none());
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.list->items.size() != 2) runtime_error("tojson separators must be a pair");
    opt.item_sep = need_string(seps.list->items[0], "separator");
    opt.key_sep = need_string(seps.list->items[1], "separator");
  }
  opt.sort_keys = truthy(b.get(3, Value::boolean(false)));
  return Value::string(to_json(v, opt));
}

bool parse_py_int(const std::string& text, int64_t base, int64_t& out) {
  std::string s = str_strip(text, nullptr, true, true);
  bool neg = false;
  size_t k = 0;
  if (k < s.size() && (s[k] == '+' || s[k] == '-')) neg = s[k++] == '-';
  if (base == 0) unsupported("int(base=0)");
  if (base == 16 && s.compare(k, 2, "0x") == 0) k += 2;
  if (base == 8 && s.compare(k, 2, "0o") == 0) k += 2;
  if (base == 2 && s.compare(k, 2, "0b") == 0) k += 2;
  if (k >= s.size()) return false;
  int64_t v = 0;
  bool prev_us = true;
  for (; k < s.size(); ++k) {
    char c = s[k];
    if (c == '_') {
      if (prev_us) return false;
      prev_us = true;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(c))   ? c - '0'
            : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10
                                                          : 99;
    if (d >= base) return false;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) unsupported("integer beyond 64 bits");
    prev_us = false;
  }
  if (prev_us) return false;
  out = neg ? -v : v;
  return true;
}

bool parse_py_float(const std::string& text, double& out) {
  std::string s = str_strip(text, nullptr, true, true);
  std::string t;
  for (char c : s) t.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  std::string body = t;
  bool neg = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    neg = body[0] == '-';
    body.erase(0, 1);
  }
  if (body == "inf" || body == "infinity") {
    out = neg ? -INFINITY : INFINITY;
    return true;
  }
  if (body == "nan") {
    out = NAN;
    return true;
  }
  if (body.empty()) return false;
  for (size_t k = 0; k < body.size(); ++k) {
    char c = body[k];
    if (c == '_') {
      if (k == 0 || k + 1 >= body.size() || !std::isdigit(static_cast<unsigned char>(body[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(body[k + 1])))
        return false;
    } else if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != '+' && c != '-') {
      return false;
    }
  }
  body.erase(std::remove(body.begin(), body.end(), '_'), body.end());
  char* end = nullptr;
  out = std::strtod(body.c_str(), &end);
  if (!end || *end != '\0') return false;
  if (neg) out = -out;
  return true;
}

Value f_int(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"default", "base"}, "int");
  Value def = b.get(0, Value::integer(0));
  int64_t base = need_int(b.get(1, Value::integer(10)), "base");
  if (v.is_integral()) return Value::integer(v.i);
  if (v.kind == Kind::Float) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return def;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.is_string()) {
    int64_t out;
    if (parse_py_int(v.str(), base, out)) return Value::integer(out);
    double d;
    if (parse_py_float(v.str(), d) && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value::integer(static_cast<int64_t>(d));
  }
  return def;
}
Value f_float(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"default"}, "float");
  Value def = b.get(0, Value::floating(0.0));
  if (v.is_number()) return Value::floating(Evaluator::as_double(v));
  double d;
  if (v.is_string() && parse_py_float(v.str(), d)) return Value::floating(d);
  return def;
}
Value f_abs(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "abs");
  if (v.is_integral()) {
    if (v.i == INT64_MIN) unsupported("integer arithmetic beyond 64 bits");
    return Value::integer(v.i < 0 ? -v.i : v.i);
  }
  if (v.kind == Kind::Float) return Value::floating(std::fabs(v.f));
  runtime_error(std::string("bad operand type for abs(): '") + type_name(v) + "'");
}
Value f_round(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"precision", "method"}, "round");
  int64_t prec = need_int(b.get(0, Value::integer(0)), "precision");
  std::string method = py_str(b.get(1, Value::string("common")));
  if (!v.is_number()) runtime_error("round: value must be a number");
  double x = Evaluator::as_double(v);
  if (prec < 0 || prec > 30) unsupported("round() precision outside 0..30");
  if (method == "common") {
    if (!std::isfinite(x)) return Value::floating(x);
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(prec), x);  // exact, ties to even
    return Value::floating(std::strtod(buf, nullptr));
  }
  if (method != "ceil" && method != "floor") runtime_error("method must be 'common', 'ceil' or 'floor'");
  double m = std::pow(10.0, static_cast<double>(prec));
  double r = method == "ceil" ? std::ceil(x * m) : std::floor(x * m);
  return Value::floating(r / m);
}
Value f_indent(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"width", "first", "blank"}, "indent");
  Value width = b.get(0, Value::integer(4));
  std::string ind = width.is_string()
                        ? width.str()
                        : std::string(static_cast<size_t>(std::max<int64_t>(0, need_int(width, "width"))), ' ');
  bool first = truthy(b.get(1, Value::boolean(false)));
  bool blank = truthy(b.get(2, Value::boolean(false)));
  std::string s = py_str(v) + "\n";
  std::vector<std::string> lines = str_splitlines(s);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + ind;
      rv += lines[k];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t k = 1; k < lines.size(); ++k) {
        if (k > 1) rv += "\n";
        if (!lines[k].empty()) rv += ind;
        rv += lines[k];
      }
    }
  }
  if (first) rv = ind + rv;
  return Value::string(std::move(rv));
}
Value f_sum(Evaluator& ev, const Value& v, CallArgs& a) {
  Bound b(a, {"attribute", "start"}, "sum");
  Value attribute = b.get(0, Value::none());
  Value acc = b.get(1, Value::integer(0));
  if (acc.is_string()) runtime_error("sum() can't sum strings [use ''.join(seq) instead]");
  for (const auto& item : ev.iterate(v))
    acc = ev.arith(BinOp::Add, acc, attribute.is_none() ? item : get_attr_path(ev, item, attribute));
  return acc;
}
Value min_max(Evaluator& ev, const Value& v, CallArgs& a, bool want_max) {
  Bound b(a, {"case_sensitive", "attribute"}, want_max ? "max" : "min");
  bool cs = truthy(b.get(0, Value::boolean(false)));
  Value attribute = b.get(1, Value::none());
  std::vector<Value> items = ev.iterate(v);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  auto key = [&](const Value& x) {
    return lower_if_string(attribute.is_none() ? x : get_attr_path(ev, x, attribute), cs);
  };
  Value best_key = key(items[0]);
  for (size_t k = 1; k < items.size(); ++k) {
    Value kk = key(items[k]);
    int c = compare_values(kk, best_key, want_max ? ">" : "<");
    if (c != 2 && (want_max ? c > 0 : c < 0)) {
      best = k;
      best_key = kk;
    }
  }
  return items[best];
}
Value f_max(Evaluator& ev, const Value& v, CallArgs& a) { return min_max(ev, v, a, true); }
Value f_min(Evaluator& ev, const Value& v, CallArgs& a) { return min_max(ev, v, a, false); }
Value f_attr(Evaluator& ev, const Value& v, CallArgs& a) {
  // jinja2 do_attr: Python getattr only (no item lookup).
  Bound b(a, {"name"}, "attr");
  std::string name = py_str(b.get(0));
  if (v.is_undefined()) undefined_error(v);
  if (auto x = ev.py_attribute(v, name)) return *x;
  return Value::undefined(Evaluator::object_desc(v) + " has no attribute '" + name + "'");
}
Value f_center(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"width"}, "center");
  int64_t width = need_int(b.get(0, Value::integer(80)), "width");
  std::string s = py_str(v);
  int64_t len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return Value::string(s);
  if (width > (1 << 20)) runtime_error("center width too large");
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                       std::string(static_cast<size_t>(marg - left), ' '));
}

bool run_test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args);

Value select_impl(Evaluator& ev, const Value& v, CallArgs& a, bool with_attr, bool select, const char* fn) {
  if (!a.kw.empty()) unsupported(std::string("keyword arguments to ") + fn);
  size_t k = 0;
  Value attribute;
  if (with_attr) {
    if (a.pos.empty()) runtime_error(std::string(fn) + "() missing the attribute argument");
    attribute = a.pos[k++];
  }
  std::optional<std::string> test;
  if (k < a.pos.size()) test = py_str(a.pos[k++]);
  CallArgs test_args;
  test_args.pos.assign(a.pos.begin() + static_cast<ptrdiff_t>(k), a.pos.end());
  std::vector<Value> out;
  for (const auto& item : ev.iterate(v)) {
    Value x = with_attr ? get_attr_path(ev, item, attribute) : item;
    bool ok;
    if (test) {
      CallArgs copy = test_args;
      ok = run_test(ev, *test, x, copy);
    } else {
      ok = truthy(x);
    }
    if (ok == select) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}
Value f_select(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, true, "select"); }
Value f_reject(Evaluator& ev, const Value& v, CallArgs& a) { return select_impl(ev, v, a, false, false, "reject"); }
Value f_selectattr(Evaluator& ev, const Value& v, CallArgs& a) {
  return select_impl(ev, v, a, true, true, "selectattr");
}
Value f_rejectattr(Evaluator& ev, const Value& v, CallArgs& a) {
  return select_impl(ev, v, a, true, false, "rejectattr");
}

Value f_map(Evaluator& ev, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  Value def;
  bool has_default = false;
  for (const auto& kv : a.kw) {
    if (kv.first == "attribute")
      attribute = &kv.second;
    else if (kv.first == "default") {
      def = kv.second;
      has_default = true;
    } else {
      runtime_error("map() got an unexpected keyword argument '" + kv.first + "'");
    }
  }
  if (attribute) {
    if (!a.pos.empty()) runtime_error("map() with attribute= takes no positional arguments");
    for (const auto& item : ev.iterate(v)) {
      Value x = get_attr_path(ev, item, *attribute);
      if (x.is_undefined() && has_default) x = def;
      out.push_back(std::move(x));
    }
    return Value::make_list(std::move(out));
  }
  if (a.pos.empty()) runtime_error("map requires a filter argument");
  std::string name = py_str(a.pos[0]);
  FilterFn f = find_filter(name);
  if (!f) {
    if (is_known_unsupported_filter(name)) unsupported("filter '" + name + "'");
    runtime_error("No filter named '" + name + "'.");
  }
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  for (const auto& item : ev.iterate(v)) {
    CallArgs copy = rest;
    out.push_back(f(ev, item, copy));
  }
  return Value::make_list(std::move(out));
}

Value f_batch(Evaluator& ev, const Value& v, CallArgs& a) {
  Bound b(a, {"linecount", "fill_with"}, "batch");
  int64_t n = need_int(b.get(0), "linecount");
  if (n <= 0) runtime_error("batch linecount must be positive");
  bool fill = b.has(1);
  std::vector<Value> out, cur;
  for (const auto& item : ev.iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::make_list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill)
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(b.get(1));
    out.push_back(Value::make_list(std::move(cur)));
  }
  return Value::make_list(std::move(out));
}

struct FilterEntry {
  const char* name;
  FilterFn fn;
};
const FilterEntry kFilters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"first", f_first},
    {"float", f_float},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
};

// ------------------------------------------------------------------ tests
bool t_defined(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "defined");
  return !v.is_undefined();
}
bool t_undefined(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "undefined");
  return v.is_undefined();
}
bool t_none(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "none");
  return v.is_none();
}
bool t_boolean(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "boolean");
  return v.kind == Kind::Bool;
}
bool t_true(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "true");
  return v.kind == Kind::Bool && v.b;
}
bool t_false(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "false");
  return v.kind == Kind::Bool && !v.b;
}
bool t_integer(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "integer");
  return v.kind == Kind::Int;
}
bool t_float(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "float");
  return v.kind == Kind::Float;
}
bool t_number(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "number");
  return v.is_number();
}
bool t_string(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "string");
  return v.is_string();
}
bool t_mapping(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "mapping");
  return v.kind == Kind::Dict;
}
bool t_iterable(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "iterable");
  return v.is_undefined() || v.is_string() || v.is_list() || v.kind == Kind::Dict;
}
bool t_sequence(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "sequence");
  return v.is_undefined() || v.is_string() || v.is_list() || v.kind == Kind::Dict;
}
bool t_callable(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "callable");
  return v.kind == Kind::Callable;
}
bool t_escaped(Evaluator&, const Value&, CallArgs& a) {
  no_args(a, "escaped");
  return false;
}
bool t_filter(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "filter");
  return v.is_string() && (find_filter(v.str()) || is_known_unsupported_filter(v.str()));
}
bool t_test(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "test");
  return v.is_string() && find_test(v.str());
}
bool t_sameas(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"other"}, "sameas");
  Value o = b.get(0);
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::None:
    case Kind::Undefined: return v.kind == Kind::None;
    case Kind::Bool: return v.b == o.b;
    case Kind::List: return v.list == o.list;
    case Kind::Dict:
    case Kind::Namespace: return v.dict == o.dict;
    case Kind::Callable: return v.fn == o.fn;
    default: unsupported("'sameas' on numbers or strings (identity is a CPython detail)");
  }
}
bool t_in(Evaluator& ev, const Value& v, CallArgs& a) {
  Bound b(a, {"seq"}, "in");
  return ev.contains(b.get(0), v);
}
bool t_eq(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"other"}, "eq");
  return py_equal(v, b.get(0));
}
bool t_ne(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"other"}, "ne");
  return !py_equal(v, b.get(0));
}
bool t_lt(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"other"}, "lt");
  return compare_values(v, b.get(0), "<") == -1;
}
bool t_le(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"other"}, "le");
  int c = compare_values(v, b.get(0), "<=");
  return c == -1 || c == 0;
}
bool t_gt(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"other"}, "gt");
  return compare_values(v, b.get(0), ">") == 1;
}
bool t_ge(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"other"}, "ge");
  int c = compare_values(v, b.get(0), ">=");
  return c == 1 || c == 0;
}
bool t_odd(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "odd");
  if (!v.is_integral()) runtime_error("odd: value must be an integer");
  return ((v.i % 2) + 2) % 2 == 1;
}
bool t_even(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "even");
  if (!v.is_integral()) runtime_error("even: value must be an integer");
  return v.i % 2 == 0;
}
bool t_divisibleby(Evaluator&, const Value& v, CallArgs& a) {
  Bound b(a, {"num"}, "divisibleby");
  int64_t n = need_int(b.get(0), "num");
  if (!v.is_integral()) runtime_error("divisibleby: value must be an integer");
  if (n == 0) runtime_error("integer division or modulo by zero");
  return v.i % n == 0;
}
bool t_lower(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "lower");
  std::string s = py_str(v);
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (upper_cp(c) != c || c == 0xDF)
      cased = true;
    else if (lower_cp(c) != c)
      return false;
  }
  return cased;
}
bool t_upper(Evaluator&, const Value& v, CallArgs& a) {
  no_args(a, "upper");
  std::string s = py_str(v);
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (lower_cp(c) != c)
      cased = true;
    else if (upper_cp(c) != c || c == 0xDF)
      return false;
  }
  return cased;
}

struct TestEntry {
  const char* name;
  TestFn fn;
};
const TestEntry kTests[] = {
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"none", t_none},
    {"boolean", t_boolean},
    {"true", t_true},
    {"false", t_false},
    {"integer", t_integer},
    {"float", t_float},
    {"number", t_number},
    {"string", t_string},
    {"mapping", t_mapping},
    {"iterable", t_iterable},
    {"sequence", t_sequence},
    {"callable", t_callable},
    {"escaped", t_escaped},
    {"filter", t_filter},
    {"test", t_test},
    {"sameas", t_sameas},
    {"in", t_in},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"ne", t_ne},
    {"!=", t_ne},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"le", t_le},
    {"<=", t_le},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"ge", t_ge},
    {">=", t_ge},
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"lower", t_lower},
    {"upper", t_upper},
};

bool run_test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) runtime_error("No test named '" + name + "'.");
  return t(ev, v, args);
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  for (const auto& f : kFilters)
    if (name == f.name) return f.fn;
  return nullptr;
}

TestFn find_test(const std::string& name) {
  for (const auto& t : kTests)
    if (name == t.name) return t.fn;
  return nullptr;
}

bool is_known_unsupported_filter(const std::string& name) {
  static const char* const kNames[] = {"e",         "escape", "forceescape", "safe",     "format",    "filesizeformat",
                                       "groupby",   "pprint", "random",      "slice",    "striptags", "truncate",
                                       "urlencode", "urlize", "wordcount",   "wordwrap", "xmlattr"};
  for (const char* k : kNames)
    if (name == k) return true;
  return false;
}

// ================================================================ calls
Value Evaluator::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  if (callee.kind != Kind::Callable) runtime_error(std::string("'") + type_name(callee) + "' object is not callable");
  const CallableData& fn = *callee.fn;
  switch (fn.type) {
    case CallableData::Type::Method: return call_method(fn.self, fn.name, args);
    case CallableData::Type::Macro: return call_macro(fn, args);
    case CallableData::Type::Global: return call_global(fn.name, args);
    case CallableData::Type::LoopCycle: {
      if (!args.kw.empty()) runtime_error("cycle() takes no keyword arguments");
      if (args.pos.empty()) runtime_error("no items for cycling given");
      return args.pos[static_cast<size_t>(fn.self.i) % args.pos.size()];
    }
  }
  return Value();
}

Value Evaluator::call_macro(const CallableData& fn, CallArgs& args) {
  const MacroDef& m = *fn.macro;
  FramePush push(*this, fn.closure);
  size_t np = m.params.size();
  std::vector<std::optional<Value>> vals(np);
  std::vector<Value> extra;
  for (size_t k = 0; k < args.pos.size(); ++k) {
    if (k < np)
      vals[k] = args.pos[k];
    else
      extra.push_back(args.pos[k]);
  }
  if (!extra.empty() && !m.uses_varargs)
    runtime_error("macro '" + m.name + "' takes not more than " + std::to_string(np) + " argument(s)");
  Value kwargs = Value::make_dict();
  for (const auto& kv : args.kw) {
    auto it = std::find(m.params.begin(), m.params.end(), kv.first);
    if (it != m.params.end()) {
      size_t k = static_cast<size_t>(it - m.params.begin());
      if (vals[k]) runtime_error("macro '" + m.name + "' got multiple values for argument '" + kv.first + "'");
      vals[k] = kv.second;
    } else if (m.uses_kwargs) {
      kwargs.dict->set(Value::string(kv.first), kv.second);
    } else {
      runtime_error("macro '" + m.name + "' takes no keyword argument '" + kv.first + "'");
    }
  }
  size_t first_default = np - m.defaults.size();
  for (size_t k = 0; k < np; ++k) {
    Value v;
    if (vals[k])
      v = *vals[k];
    else if (k >= first_default)
      v = eval(*m.defaults[k - first_default]);
    else
      v = Value::undefined("parameter '" + m.params[k] + "' was not provided");
    frame->set(m.params[k], v);
  }
  if (m.uses_varargs) frame->set("varargs", Value::make_list(std::move(extra), true));
  if (m.uses_kwargs) frame->set("kwargs", kwargs);
  Capture cap(*this);
  exec_body(m.body);
  return Value::string(std::move(cap.buf));
}

Value Evaluator::call_global(const std::string& name, CallArgs& args) {
  if (name == "raise_exception") {
    Bound b(args, {"message"}, "raise_exception");
    throw Error(StatusCode::kInvalidArgument, py_str(b.get(0)));
  }
  if (name == "range") {
    if (!args.kw.empty()) runtime_error("range() takes no keyword arguments");
    if (args.pos.empty() || args.pos.size() > 3) runtime_error("range expected 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (args.pos.size() == 1) {
      stop = need_int(args.pos[0], "range()");
    } else {
      start = need_int(args.pos[0], "range()");
      stop = need_int(args.pos[1], "range()");
      if (args.pos.size() == 3) step = need_int(args.pos[2], "range()");
    }
    if (step == 0) runtime_error("range() arg 3 must not be zero");
    long double n = step > 0 ? std::ceil(static_cast<long double>(stop - static_cast<long double>(start)) / step)
                             : std::ceil(static_cast<long double>(start - static_cast<long double>(stop)) / -step);
    if (n > 100000)  // jinja2.sandbox.MAX_RANGE
      runtime_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    std::vector<Value> items;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) items.push_back(Value::integer(k));
    return Value::make_list(std::move(items));
  }
  if (name == "namespace" || name == "dict") {
    Value d = name == "namespace" ? Value::make_namespace() : Value::make_dict();
    if (d.kind == Kind::Namespace) namespaces.push_back(d.dict);
    if (args.pos.size() > 1) runtime_error(name + "() expected at most 1 positional argument");
    if (!args.pos.empty()) {
      const Value& init = args.pos[0];
      if (init.kind == Kind::Dict || init.kind == Kind::Namespace) {
        for (const auto& kv : init.dict->items) d.dict->set(kv.first, kv.second);
      } else {
        for (const auto& pair : iterate(init)) {
          std::vector<Value> kv = iterate(pair);
          if (kv.size() != 2) runtime_error(name + "() sequence elements must have length 2");
          d.dict->set(kv[0], kv[1]);
        }
      }
    }
    for (const auto& kv : args.kw) d.dict->set(Value::string(kv.first), kv.second);
    return d;
  }
  unsupported(name + "()");
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

// ================================================================ render
std::string render(const Program& program, const std::vector<std::pair<std::string, Value>>& vars) {
  Evaluator ev(program);
  ev.globals = std::make_shared<Frame>();
  for (const char* g : {"range", "dict", "namespace", "lipsum", "cycler", "joiner", "raise_exception"})
    ev.globals->set(g, make_callable(CallableData::Type::Global, g));
  auto context = std::make_shared<Frame>();
  context->parent = ev.globals;
  for (const auto& kv : vars) context->set(kv.first, kv.second);
  ev.frame = std::make_shared<Frame>();
  ev.frame->parent = context;
  std::string out;
  ev.out = &out;
  ev.exec_body(program.body);
  return out;
}

}  // namespace ember::jinja
