// Parser of the Jinja subset: it follows jinja2.parser's grammar and
// precedence over the tokens of jinja_lexer.cpp.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "core/chat/jinja_lexer.h"

namespace ember::jinja {
namespace {

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
  std::string normalized;
  std::vector<Token> toks = lex(source, &normalized);
  Parser parser(std::move(normalized), std::move(toks), limits);
  auto program = std::make_shared<Program>();
  program->body = parser.parse();
  program->limits = limits;
  return program;
}

}  // namespace ember::jinja
