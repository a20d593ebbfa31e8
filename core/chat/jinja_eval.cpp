// Evaluator of the Jinja subset: scoping as compiled by jinja2 (a for-loop
// body gets a fresh scope per iteration, if/elif do not create one, macros
// close over their defining scope), Python operator semantics, the sandboxed
// attribute/item lookup of jinja2.sandbox.ImmutableSandboxedEnvironment, and
// the globals. The filters and tests are in jinja_filters.cpp, the str, dict
// and list methods in jinja_methods.cpp (jinja_internal.h joins them).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>

#include "core/chat/jinja_internal.h"

namespace ember::jinja {

namespace {

Value make_callable(CallableData::Type t, std::string name, Value self = {}) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<CallableData>();
  v.fn->type = t;
  v.fn->name = std::move(name);
  v.fn->self = std::move(self);
  return v;
}

std::string undefined_name_hint(const std::string& name) { return "'" + name + "' is undefined"; }

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

}  // namespace

[[noreturn]] void undefined_error(const Value& u) {
  if (u.s && !u.s->empty()) runtime_error(*u.s);
  runtime_error("value is undefined");
}

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

void no_args(const CallArgs& a, const std::string& fn) { Bound b(a, {}, fn); }

const std::string& need_string(const Value& v, const std::string& what) {
  if (!v.is_string()) runtime_error(what + " must be str, not " + type_name(v));
  return v.str();
}

int64_t need_int(const Value& v, const std::string& what) {
  if (!v.is_integral()) runtime_error(what + " must be an integer, not " + type_name(v));
  return v.i;
}

// ================================================================ Evaluator

Value Evaluator::lookup(const std::string& name) {
  for (Frame* f = frame.get(); f; f = f->parent.get())
    if (Value* v = f->find_local(name)) return *v;
  return Value::undefined(undefined_name_hint(name));
}

std::vector<Value> Evaluator::iterate(const Value& v) {
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

std::optional<Value> Evaluator::py_attribute(const Value& obj, const std::string& name) {
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

Value Evaluator::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (auto a = py_attribute(obj, name)) return *a;
  if (obj.kind == Kind::Dict) {
    if (const Value* v = static_cast<const DictData&>(*obj.dict).find(Value::string(name))) return *v;
  }
  return Value::undefined(object_desc(obj) + " has no attribute '" + name + "'");
}

Value Evaluator::getitem(const Value& obj, const Value& key) {
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

Value Evaluator::slice(const Value& obj, const Expr& s) {
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

Value Evaluator::arith(BinOp op, const Value& a, const Value& b) {
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

bool Evaluator::contains(const Value& container, const Value& item) {
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

bool Evaluator::compare(CmpOp op, const Value& a, const Value& b) {
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

void Evaluator::eval_args(const Expr& e, CallArgs& args) {
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

Value Evaluator::apply_filter(const Expr& e, Value subject) {
  CallArgs args;
  eval_args(e, args);
  return e.filter(*this, subject, args);
}

Value Evaluator::eval_filter_chain(const Expr& e, const Value& innermost) {
  Value subject = e.a ? eval_filter_chain(*e.a, innermost) : innermost;
  return apply_filter(e, std::move(subject));
}

Value Evaluator::eval(const Expr& e) {
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

void Evaluator::assign(const Expr& target, const Value& v) {
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

Flow Evaluator::exec_body(const Body& body) {
  for (const auto& s : body) {
    Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Value Evaluator::make_loop_object() {
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

void Evaluator::update_loop_object(Value& loop, size_t idx, const std::vector<Value>& items) {
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

Flow Evaluator::exec(const Stmt& s) {
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
