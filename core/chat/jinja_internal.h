// Internal to the Jinja evaluator, shared by its three files:
//   jinja_eval.cpp     the Evaluator: scopes, operators, expressions,
//                      statements, calls (macros, globals) and render();
//   jinja_filters.cpp  the filters and tests;
//   jinja_methods.cpp  the Python str/dict/list methods, and the string
//                      functions (case mapping, strip, splitlines) the
//                      filters share with them.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

enum class Flow { Normal, Break, Continue };

// ---- jinja_eval.cpp

[[noreturn]] void undefined_error(const Value& u);

// Python ordering of a and b: -1, 0 or 1, 2 when unordered (NaN); errors name `op`.
int compare_values(const Value& a, const Value& b, const char* op, int depth = 0);

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

void no_args(const CallArgs& a, const std::string& fn);
const std::string& need_string(const Value& v, const std::string& what);
int64_t need_int(const Value& v, const std::string& what);

// ---- jinja_methods.cpp: case mapping (ASCII, Latin-1, Latin Extended-A, basic
// Greek and Cyrillic; simple 1:1 mappings) and Python's str functions.

char32_t lower_cp(char32_t c);
char32_t upper_cp(char32_t c);
void append_upper(std::string& out, char32_t c);
std::string str_lower(const std::string& s);
std::string str_upper(const std::string& s);
std::string str_capitalize(const std::string& s);
std::string str_strip(const std::string& s, const std::string* chars, bool left, bool right);
std::vector<std::string> str_splitlines(const std::string& s, bool keepends = false);
// Python str.replace; fails past `limit` bytes.
std::string str_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count,
                        size_t limit);

// ---- jinja_filters.cpp: the tests the str methods islower/isupper reuse.

bool run_test(Evaluator& ev, const std::string& name, const Value& v, CallArgs& args);
bool t_lower(Evaluator&, const Value& v, CallArgs& a);
bool t_upper(Evaluator&, const Value& v, CallArgs& a);

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
  Value lookup(const std::string& name);

  // ---------------------------------------------------------- iteration
  std::vector<Value> iterate(const Value& v);

  // ---------------------------------------------------------- attribute / item
  static bool is_str_method(const std::string& n);
  static bool is_dict_method(const std::string& n);
  static bool is_list_method(const std::string& n);

  // Python attribute of obj, if it has one (methods). nullopt if none.
  std::optional<Value> py_attribute(const Value& obj, const std::string& name);

  static std::string object_desc(const Value& obj) { return std::string("'") + type_name(obj) + " object'"; }

  Value getattr(const Value& obj, const std::string& name);

  Value getitem(const Value& obj, const Value& key);

  Value slice(const Value& obj, const Expr& s);

  // ---------------------------------------------------------- operators
  static double as_double(const Value& v) { return v.kind == Kind::Float ? v.f : static_cast<double>(v.i); }

  Value arith(BinOp op, const Value& a, const Value& b);

  bool contains(const Value& container, const Value& item);

  bool compare(CmpOp op, const Value& a, const Value& b);

  // ---------------------------------------------------------- expressions
  void eval_args(const Expr& e, CallArgs& args);

  Value apply_filter(const Expr& e, Value subject);

  Value eval_filter_chain(const Expr& e, const Value& innermost);

  Value eval(const Expr& e);

  // ---------------------------------------------------------- calls
  Value call(const Value& callee, CallArgs& args);
  Value call_method(const Value& self, const std::string& name, CallArgs& args);
  Value call_global(const std::string& name, CallArgs& args);
  Value call_macro(const CallableData& fn, CallArgs& args);

  // ---------------------------------------------------------- statements
  void assign(const Expr& target, const Value& v);

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

  Flow exec_body(const Body& body);

  // One `loop` object per for-loop, updated in place each iteration (as
  // jinja2's LoopContext is). previtem/nextitem hold Undefined when absent.
  static Value make_loop_object();
  static void update_loop_object(Value& loop, size_t idx, const std::vector<Value>& items);

  Flow exec(const Stmt& s);
};

}  // namespace ember::jinja
