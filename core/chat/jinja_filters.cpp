// The filters and tests of the Jinja subset (jinja2's names and semantics),
// found by name at parse time (find_filter, find_test).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>

#include "core/chat/jinja_internal.h"

namespace ember::jinja {

namespace {

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
}  // namespace

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

namespace {

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

}  // namespace

bool run_test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args) {
  TestFn t = find_test(name);
  if (!t) runtime_error("No test named '" + name + "'.");
  return t(ev, v, args);
}

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

}  // namespace ember::jinja
