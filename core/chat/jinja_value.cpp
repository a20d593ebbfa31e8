// Values of the Jinja subset with Python semantics: truthiness, equality,
// str()/repr(), json.dumps (as HF's tojson), float repr, UTF-8 helpers.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <pthread.h>

#include "core/chat/jinja.h"

namespace ember::jinja {

void runtime_error(const std::string& msg) { throw Error(StatusCode::kInvalidArgument, "chat template error: " + msg); }

void unsupported(const std::string& construct) {
  throw Error(StatusCode::kUnsupported, "chat template uses an unsupported Jinja construct: " + construct);
}

// ---------------------------------------------------------------- Value
Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  v.i = x ? 1 : 0;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::floating(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::String;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}
Value Value::make_list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<ListData>();
  v.list->items = std::move(items);
  v.list->tuple = tuple;
  return v;
}
Value Value::make_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<DictData>();
  return v;
}
Value Value::make_namespace() {
  Value v;
  v.kind = Kind::Namespace;
  v.dict = std::make_shared<DictData>();
  return v;
}
bool Value::is_tuple() const { return kind == Kind::List && list->tuple; }

const std::string& Value::str() const {
  static const std::string empty;
  return s ? *s : empty;
}

// ---------------------------------------------------------------- stack
StackBudget::StackBudget(size_t max_bytes)
    : base_(reinterpret_cast<uintptr_t>(__builtin_frame_address(0))), budget_(max_bytes) {
#if defined(__GLIBC__)
  // The room below this frame on the calling thread (a host's thread may have
  // far less than the 8 MiB of a main thread: musl's 128 KiB, a JVM's 1 MiB).
  // Asked once per thread: for the main thread glibc reads /proc/self/maps.
  struct Low {
    uintptr_t address = 0;
    bool asked = false;
  };
  thread_local Low low_end;  // (trivially destructible: nothing runs at thread exit)
  if (!low_end.asked) {
    low_end.asked = true;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* lo = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &lo, &size) == 0) low_end.address = reinterpret_cast<uintptr_t>(lo);
      pthread_attr_destroy(&attr);
    }
  }
  const uintptr_t low = low_end.address;
  if (low == 0 || base_ <= low) return;
  constexpr size_t kMargin = 64u << 10;  // what one unguarded step (a filter, a copy) may still need
  const size_t room = base_ - low;
  budget_ = std::min(budget_, room > 2 * kMargin ? room - kMargin : room / 2);
#endif
}

// ---------------------------------------------------------------- freeing
// A value held by nothing else owns its container outright: freeing it would
// free what the container holds, recursively. release_deep moves such values
// onto a heap stack first and frees them one by one, each container emptied of
// the values it alone owns before it dies, so the depth of the C++ stack stays
// constant however deeply the template nested its values.
namespace {

bool owns_container(const Value& v) {
  return (v.list && v.list.use_count() == 1) || (v.dict && v.dict.use_count() == 1) || (v.fn && v.fn.use_count() == 1);
}

void push_owned(std::vector<Value>& stack, Value& v) noexcept {
  if (!owns_container(v)) return;  // a scalar, or shared: freeing it frees nothing nested
  try {
    stack.push_back(std::move(v));
  } catch (...) {
    // Out of memory: v stays where it is and is freed by its holder, recursively.
  }
}

void drain(std::vector<Value>& stack) noexcept {
  while (!stack.empty()) {
    Value v = std::move(stack.back());
    stack.pop_back();
    if (v.list && v.list.use_count() == 1)
      for (Value& x : v.list->items) push_owned(stack, x);
    if (v.dict && v.dict.use_count() == 1)
      for (auto& kv : v.dict->items) {
        push_owned(stack, kv.first);
        push_owned(stack, kv.second);
      }
    if (v.fn && v.fn.use_count() == 1) push_owned(stack, v.fn->self);
  }  // v is freed here; its containers no longer own anything that nests
}

}  // namespace

void release_deep(Value& v) noexcept {
  if (!owns_container(v)) return;
  std::vector<Value> stack;
  push_owned(stack, v);
  drain(stack);
}

ListData::~ListData() {
  std::vector<Value> stack;
  for (Value& x : items) push_owned(stack, x);
  drain(stack);
}

CallableData::~CallableData() { release_deep(self); }

DictData::~DictData() {
  std::vector<Value> stack;
  for (auto& kv : items) {
    push_owned(stack, kv.first);
    push_owned(stack, kv.second);
  }
  drain(stack);
}

const Value* DictData::find(const Value& key) const {
  for (const auto& kv : items)
    if (py_equal(kv.first, key)) return &kv.second;
  return nullptr;
}
Value* DictData::find(const Value& key) {
  for (auto& kv : items)
    if (py_equal(kv.first, key)) return &kv.second;
  return nullptr;
}
void DictData::set(const Value& key, Value v) {
  if (Value* p = find(key)) {
    *p = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.list->tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0.0;
    case Kind::String: return !v.str().empty();
    case Kind::List: return !v.list->items.empty();
    case Kind::Dict: return !v.dict->items.empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

static bool equal_at(const Value& a, const Value& b, int depth);

bool py_equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }

static bool equal_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) runtime_error("comparison: value nested too deeply");
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.i == b.i;
    double x = a.kind == Kind::Float ? a.f : static_cast<double>(a.i);
    double y = b.kind == Kind::Float ? b.f : static_cast<double>(b.i);
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.str() == b.str();
    case Kind::List: {
      if (a.list->tuple != b.list->tuple) return false;
      const auto& x = a.list->items;
      const auto& y = b.list->items;
      if (x.size() != y.size()) return false;
      for (size_t k = 0; k < x.size(); ++k)
        if (!equal_at(x[k], y[k], depth + 1)) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = static_cast<const DictData&>(*b.dict).find(kv.first);
        if (!o || !equal_at(kv.second, *o, depth + 1)) return false;
      }
      return true;
    }
    case Kind::Namespace: return a.dict == b.dict;
    case Kind::Callable: return a.fn == b.fn;
    default: return false;
  }
}

// Exactly the code points for which Python's str.isspace() is true (and
// which the regex \s matches), so strip()/split()/trim and the lexer's
// whitespace stripping agree with CPython.
bool py_isspace(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// ---------------------------------------------------------------- str / repr
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // [-]d[.ddd]e[+-]XX, shortest round-trip digits
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp10 = std::atoi(sci.c_str() + e + 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  int decpt = exp10 + 1;  // position of the decimal point relative to digits
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(decpt) - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, decpt);
      out += ".";
      out += digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return out;
}

// Approximation of Python's str.isprintable() for non-ASCII code points:
// control, format, separator (other than space) and private-use characters.
static bool py_isprintable_nonascii(char32_t c) {
  if (c >= 0x80 && c <= 0xA0) return false;
  if (c == 0xAD || c == 0x061C || c == 0x180E || c == 0x1680 || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F)) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || (c >= 0xFFF0 && c <= 0xFFFB) || c >= 0xE0000) return false;
  return true;
}

static std::string repr_string(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos;
  bool has_dq = s.find('"') != std::string::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : utf8_decode(s)) {
    char buf[16];
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x80 || py_isprintable_nonascii(c)) {
      append_utf8(out, c);
    } else if (c < 0x100) {
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x10000) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    }
  }
  out.push_back(q);
  return out;
}

// str() of v appended to out; repr() when `repr`. `open` holds the containers
// being printed: one met again prints as Python's recursive repr does ([...],
// {...}), e.g. a namespace holding itself.
static void str_into(std::string& out, const Value& v, bool repr, std::vector<const void*>& open) {
  switch (v.kind) {
    case Kind::Undefined: out += repr ? "Undefined" : ""; return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += v.b ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float: out += py_float_repr(v.f); return;
    case Kind::String: out += repr ? repr_string(v.str()) : v.str(); return;
    case Kind::Callable: unsupported("printing a function or method object");
    case Kind::List:
    case Kind::Dict:
    case Kind::Namespace: break;
  }
  const bool is_list = v.kind == Kind::List;
  const bool tuple = is_list && v.list->tuple;
  const void* self = is_list ? static_cast<const void*>(v.list.get()) : static_cast<const void*>(v.dict.get());
  if (v.kind == Kind::Namespace) out += "<Namespace ";
  if (std::find(open.begin(), open.end(), self) != open.end()) {
    out += tuple ? "(...)" : is_list ? "[...]" : "{...}";
  } else {
    if (open.size() >= static_cast<size_t>(kMaxValueDepth)) runtime_error("printing: value nested too deeply");
    open.push_back(self);
    if (is_list) {
      const auto& items = v.list->items;
      out += tuple ? "(" : "[";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += ", ";
        str_into(out, items[k], true, open);
      }
      if (tuple && items.size() == 1) out += ",";
      out += tuple ? ")" : "]";
    } else {
      out += "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        str_into(out, kv.first, true, open);
        out += ": ";
        str_into(out, kv.second, true, open);
      }
      out += "}";
    }
    open.pop_back();
  }
  if (v.kind == Kind::Namespace) out += ">";
}

std::string py_repr(const Value& v) {
  std::string out;
  std::vector<const void*> open;
  str_into(out, v, true, open);
  return out;
}

std::string py_str(const Value& v) {
  std::string out;
  std::vector<const void*> open;
  str_into(out, v, false, open);
  return out;
}

// ---------------------------------------------------------------- JSON
static void json_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));  // ensure_ascii=False: raw UTF-8
        }
    }
  }
  out.push_back('"');
}

static std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return py_float_repr(d);
}

static std::string json_key(const Value& k) {
  switch (k.kind) {
    case Kind::String: return k.str();
    case Kind::Bool: return k.b ? "true" : "false";
    case Kind::None: return "null";
    case Kind::Int: return std::to_string(k.i);
    case Kind::Float: return json_float(k.f);
    default: runtime_error(std::string("keys must be str, int, float, bool or None, not ") + type_name(k));
  }
}

static void json_value(std::string& out, const Value& v, const JsonOptions& opt, int level, int depth) {
  if (depth > kMaxValueDepth) runtime_error("tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int k = 0; k < lvl; ++k) out += opt.indent;
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float: out += json_float(v.f); return;
    case Kind::String: json_string(out, v.str()); return;
    case Kind::List: {
      const auto& items = v.list->items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.pretty) newline(level + 1);
        json_value(out, items[k], opt, level + 1, depth + 1);
      }
      if (opt.pretty) newline(level);
      out.push_back(']');
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (opt.sort_keys) {
        for (auto* kv : items)
          if (!kv->first.is_string()) unsupported("tojson(sort_keys=true) with non-string keys");
        std::stable_sort(items.begin(), items.end(), [](auto* x, auto* y) { return x->first.str() < y->first.str(); });
      }
      out.push_back('{');
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += opt.item_sep;
        first = false;
        if (opt.pretty) newline(level + 1);
        json_string(out, json_key(kv->first));
        out += opt.key_sep;
        json_value(out, kv->second, opt, level + 1, depth + 1);
      }
      if (opt.pretty) newline(level);
      out.push_back('}');
      return;
    }
    default: runtime_error(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
  }
}

std::string to_json(const Value& v, const JsonOptions& opt) {
  std::string out;
  json_value(out, v, opt, 0, 0);
  return out;
}

}  // namespace ember::jinja
