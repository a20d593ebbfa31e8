// Internal Jinja2-subset interpreter behind ChatTemplate (chat_template.h).
//
// Pipeline: lex (jinja_lexer.cpp, a transcription of jinja2.lexer's rules,
// with trim_blocks and lstrip_blocks on, as Hugging Face renders chat
// templates) -> parse (jinja_parser.cpp, the grammar of jinja2.parser) -> an
// immutable AST -> evaluate (jinja_eval.cpp; filters and tests in
// jinja_filters.cpp, str/dict/list methods in jinja_methods.cpp) with Python
// semantics for the values (none, bool, int, float, str, list, tuple, dict)
// so that the output is byte-identical to Python's jinja2. Strings are UTF-8;
// anything Python counts in code points (len, slicing, iteration) is counted
// in code points.
//
// Errors: ember::Error. Syntax errors -> kBadFormat; constructs this subset
// does not implement -> kUnsupported (the message names the construct);
// errors raised while rendering (raise_exception, undefined attribute, type
// errors) -> kInvalidArgument; abuse limits -> kInvalidArgument.
#pragma once

#include "core/util/utf8.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/status.h"

namespace ember::jinja {

// ---------------------------------------------------------------- limits
struct Limits {
  size_t max_output_bytes = 64u << 20;       // rendered text, and any one string value
  size_t max_list_items = 1u << 20;          // any one list built while rendering
  uint64_t max_loop_iterations = 1'000'000;  // summed over one render
  int max_eval_depth = 1000;                 // nested expression/statement evaluation, macro calls
  int max_parse_depth = 120;                 // nested parentheses / blocks in the source
  int max_expr_height = 256;                 // height of one expression tree (e.g. a + b + c ...)
  size_t max_source_bytes = 1u << 20;
  // C++ stack one parse or render may use, whatever the depths above allow:
  // templates run on the host's thread, whose stack may be small (and a
  // sanitizer build's frames are several times larger).
  size_t max_stack_bytes = 256u << 10;
};

// Guards recursion by stack bytes: taken in the entry frame (parse or render),
// it allows Limits::max_stack_bytes below it, or less where the thread's own
// stack has less room left (kept 64 KiB short of its end).
class StackBudget {
 public:
  explicit StackBudget(size_t max_bytes);
  bool exceeded() const {
    const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    return (base_ > here ? base_ - here : here - base_) > budget_;
  }
  size_t budget() const { return budget_; }

 private:
  uintptr_t base_;
  size_t budget_;
};

// ---------------------------------------------------------------- values
enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

struct Value;
struct ListData;
struct DictData;
struct CallableData;

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::shared_ptr<const std::string> s;  // String payload; for Undefined: a hint (may be null)
  std::shared_ptr<ListData> list;        // List (also tuples)
  std::shared_ptr<DictData> dict;        // Dict and Namespace
  std::shared_ptr<CallableData> fn;      // Callable

  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value make_list(std::vector<Value> items, bool tuple = false);
  static Value make_dict();  // empty dict
  static Value make_namespace();

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_tuple() const;
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Bool || kind == Kind::Int || kind == Kind::Float; }
  bool is_integral() const { return kind == Kind::Bool || kind == Kind::Int; }  // Python int incl. bool
  const std::string& str() const;  // String payload (precondition: is_string)
};

// Containers free what they hold without recursing (release_deep): a value a
// template nested a million levels deep must not overflow the host's stack.
struct ListData {
  std::vector<Value> items;
  bool tuple = false;
  ~ListData();
};

struct DictData {
  std::vector<std::pair<Value, Value>> items;  // insertion order, as Python dicts
  ~DictData();
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value v);
};

struct Frame;  // a scope of the evaluator (jinja_eval.cpp)
struct MacroDef;

struct CallableData {
  enum class Type { Method, Macro, Global, LoopCycle };
  Type type;
  std::string name;
  Value self;  // the object a method is bound to; a loop.cycle's position
  const MacroDef* macro = nullptr;
  std::shared_ptr<Frame> closure;
  ~CallableData();
};

// Frees `v` and everything only it holds with a loop rather than recursion
// (the containers' destructors call it). Never throws.
void release_deep(Value& v) noexcept;

// Values nested deeper than this (lists in lists, namespaces in namespaces)
// cannot be printed, compared or serialised: a clear error rather than deep
// recursion (Python stops at about 1000 with a RecursionError).
inline constexpr int kMaxValueDepth = 200;

// Python semantics helpers (jinja_value.cpp).
bool truthy(const Value& v);
bool py_equal(const Value& a, const Value& b);
// Python's str() / repr() / json.dumps (HF's tojson). Throw on values Python
// would render non-deterministically (callables) or cannot serialise.
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
std::string py_float_repr(double d);
struct JsonOptions {
  bool pretty = false;  // indent given
  std::string indent;   // indent unit when pretty
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& opt);
const char* type_name(const Value& v);  // Python type name for messages

// Python str.isspace for one code point (jinja_value.cpp).
bool py_isspace(char32_t c);

[[noreturn]] void runtime_error(const std::string& msg);      // kInvalidArgument
[[noreturn]] void unsupported(const std::string& construct);  // kUnsupported

// ---------------------------------------------------------------- AST
struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind : uint8_t {
  Const,    // value
  Name,     // name
  NSRef,    // name.attr as an assignment target
  List,     // args
  Tuple,    // args
  Dict,     // args: key, value, key, value...
  Getattr,  // a.name
  Getitem,  // a[b]
  Slice,    // args: start/stop/step (null = omitted)
  Call,     // a(args, kwargs)
  Filter,   // a|name(args, kwargs); a null inside {% filter %} / {% set %} blocks
  Test,     // a is name(args)
  Neg,
  Pos,
  Not,      // a
  Binary,   // a op b (op: + - * / // % **)
  Concat,   // args joined with ~
  Compare,  // a, then cmp_ops[i] with args[i]
  And,
  Or,        // a, b
  CondExpr,  // a if b else c (c may be null)
};

enum class BinOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };
enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

struct Evaluator;
struct CallArgs;
using FilterFn = Value (*)(struct Evaluator&, const Value& subject, struct CallArgs& args);
using TestFn = bool (*)(struct Evaluator&, const Value& subject, struct CallArgs& args);

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;       // Const
  std::string name;  // Name, NSRef (namespace), Getattr, Filter, Test
  std::string attr;  // NSRef attribute
  BinOp op = BinOp::Add;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args, dyn_kwargs;  // *args / **kwargs in calls
  std::vector<CmpOp> cmp_ops;
  FilterFn filter = nullptr;  // resolved at parse time
  TestFn test = nullptr;
  int depth = 1;  // height of this subtree (bounded at parse time)
  Expr(ExprKind k, int l) : kind(k), line(l) {}
};

enum class StmtKind : uint8_t {
  Text,         // text
  Emit,         // {{ expr }}
  If,           // values[i] guards bodies[i] (if + elifs), else_body
  For,          // target, expr (iterable), cond (filter), body, else_body
  Set,          // target = expr
  SetBlock,     // target, filter (Filter chain with null innermost subject or null), body
  Macro,        // macro
  FilterBlock,  // filter chain, body
  With,         // targets/values, body
  Break,
  Continue,
  Block,  // plain body (HF's {% generation %})
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last params
  bool uses_varargs = false, uses_kwargs = false;
  Body body;
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;
  ExprPtr target, expr, cond;
  std::vector<ExprPtr> targets, values;  // With; If conditions in values
  Body body, else_body;
  std::vector<Body> bodies;  // If branches
  std::shared_ptr<MacroDef> macro;
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
};

struct Program {
  Body body;
  Limits limits;
};

// Lexer + parser (jinja_lexer.cpp, jinja_parser.cpp). Throws kBadFormat / kUnsupported.
std::shared_ptr<const Program> parse_template(const std::string& source, const Limits& limits = {});

// Evaluation (jinja_eval.cpp). `vars` are the render variables (name, value).
std::string render(const Program& program, const std::vector<std::pair<std::string, Value>>& vars);

// Filter / test lookup (jinja_filters.cpp); null if not implemented.
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// True for names Jinja2 (or HF's environment) defines but this subset does not.
bool is_known_unsupported_filter(const std::string& name);

}  // namespace ember::jinja
