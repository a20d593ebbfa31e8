// API, error-code and hostile-input tests of ChatTemplate (the byte-exact
// comparisons against Python jinja2 are in test_chat_golden.cpp).
#include <gtest/gtest.h>
#include <pthread.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/chat/chat_template.h"
#include "core/util/status.h"

namespace {

using ember::ChatMessage;
using ember::ChatTemplate;
using ember::ChatTemplateOptions;
using ember::StatusCode;

const std::string kSmol =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

std::string read_golden(const std::string& name) {
  std::ifstream f(std::string(EMBER_TEST_DATA_DIR) + "/chat/" + name, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string render(const std::string& src, const std::vector<ChatMessage>& msgs = {{"user", "hi"}}) {
  ChatTemplateOptions opt;
  opt.bos_token = "<s>";
  opt.eos_token = "</s>";
  return ChatTemplate::parse(src).apply(msgs, opt);
}

// Expects parse+apply of `src` to throw ember::Error with `code`; returns its message.
std::string error_of(const std::string& src, StatusCode code) {
  try {
    std::string out = render(src);
    ADD_FAILURE() << "expected an error, rendered " << out.size() << " bytes";
  } catch (const ember::Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
    return e.message();
  }
  return {};
}

TEST(ChatTemplate, SmolLM2HandWritten) {
  ChatTemplate t = ChatTemplate::parse(kSmol);
  ChatTemplateOptions opt;
  EXPECT_EQ(t.apply({{"user", "Hi"}}, opt),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  opt.add_generation_prompt = false;
  EXPECT_EQ(t.apply({{"system", "S"}, {"user", "U"}}, opt),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatTemplate, Llama3HandWritten) {
  ChatTemplate t = ChatTemplate::parse(read_golden("llama3.jinja"));
  ChatTemplateOptions opt;
  opt.bos_token = "<|begin_of_text|>";
  EXPECT_EQ(t.apply({{"user", "  Hi  "}}, opt),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, GemmaRaisesWithTemplateMessage) {
  for (const char* name : {"gemma2.jinja", "gemma3.jinja"}) {
    ChatTemplate t = ChatTemplate::parse(read_golden(name));
    try {
      t.apply({{"user", "a"}, {"user", "b"}}, {});
      ADD_FAILURE() << name << ": expected raise_exception";
    } catch (const ember::Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(e.message(), "Conversation roles must alternate user/assistant/user/assistant/...");
    }
  }
  ChatTemplate g2 = ChatTemplate::parse(read_golden("gemma2.jinja"));
  try {
    g2.apply({{"system", "s"}, {"user", "u"}}, {});
    ADD_FAILURE() << "gemma2 must reject a system turn";
  } catch (const ember::Error& e) {
    EXPECT_EQ(e.message(), "System role not supported");
  }
  // Gemma 3 merges the system prompt into the first user turn.
  ChatTemplateOptions opt;
  opt.bos_token = "<bos>";
  EXPECT_EQ(
      ChatTemplate::parse(read_golden("gemma3.jinja")).apply({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}, opt),
      "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, RaiseExceptionMessageIsExact) {
  std::string msg =
      error_of("{{ raise_exception('Bad \"input\": ' ~ messages[0].role) }}", StatusCode::kInvalidArgument);
  EXPECT_EQ(msg, "Bad \"input\": user");
}

TEST(ChatTemplate, CopiesShareTheParsedTemplateAndApplyIsThreadSafe) {
  ChatTemplate t = ChatTemplate::parse(read_golden("llama3_1.jinja"));
  std::vector<ChatMessage> msgs = {{"system", "sys"}, {"user", "hello"}, {"assistant", "hi"}, {"user", "bye"}};
  ChatTemplateOptions opt;
  opt.bos_token = "<|begin_of_text|>";
  const std::string expected = t.apply(msgs, opt);
  ASSERT_FALSE(expected.empty());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int k = 0; k < 8; ++k) {
    threads.emplace_back([&, k, copy = t] {
      for (int i = 0; i < 200; ++i)
        if (copy.apply(msgs, opt) != expected) ++mismatches[k];
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 8; ++k) EXPECT_EQ(mismatches[k], 0);
}

TEST(ChatTemplate, SelfReferencesDoNotLeak) {  // checked by the ASan build
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{% macro m() %}{{ ns.me is defined }}{% endmacro %}"
                   "{% set ns.m = m %}{{ ns.m() }}{% for i in [1] %}{% macro inner() %}x{% endmacro %}{{ inner() }}{% "
                   "endfor %}"),
            "Truex");
}

TEST(ChatTemplate, UnsupportedConstructsAreNamed) {
  struct C {
    const char* src;
    const char* names;
  };
  const C cases[] = {
      {"{% extends 'base.html' %}", "extends"},
      {"{% include 'x' %}", "include"},
      {"{% import 'x' as y %}", "import"},
      {"{% block b %}{% endblock %}", "block"},
      {"{% macro m() %}{{ caller() }}{% endmacro %}", "caller"},
      {"{% call m() %}x{% endcall %}", "call"},
      {"{% for x in y recursive %}{% endfor %}", "recursive"},
      {"{{ 'x' | safe }}", "safe"},
      {"{{ '%s' | format(1) }}", "format"},
      {"{{ 'a %s' % 1 }}", "string formatting"},
      {"{{ '{}'.format(1) }}", "format"},
      {"{{ cycler(1, 2) }}", "cycler"},
      {"{{ 99999999999999999999 }}", "64-bit"},
      {"{{ '\\N{BULLET}' }}", "\\N"},
      {"{{ caf\xc3\xa9 }}", "non-ASCII identifier"},
  };
  for (const auto& c : cases) {
    std::string msg = error_of(c.src, StatusCode::kUnsupported);
    EXPECT_NE(msg.find(c.names), std::string::npos) << c.src << " -> " << msg;
  }
}

TEST(ChatTemplate, SyntaxErrorsAreBadFormat) {
  const char* cases[] = {
      "{{",
      "{%",
      "{#",
      "{{ x",
      "{% if x %}",
      "{% if x %}{% endfor %}",
      "{% for %}",
      "{{ 'abc }}",
      "{{ (1 }}",
      "{{ [1, 2 }}",
      "{{ {'a': } }}",
      "{% set %}",
      "{% endif %}",
      "{{ 1 + }}",
      "{{ x | }}",
      "{{ x is }}",
      "{% frobnicate %}",
      "{% break %}",
      "{{ ) }}",
      "{{ 'a' if }}",
      "{% macro m(a=1, b) %}{% endmacro %}",
      "{% set 1 = 2 %}",
      "{{ '\\x4' }}",
      "{{ '\\u12' }}",
      "{{ x | no_such_filter }}",
      "{{ x is no_such_test }}",
      "{% raw %}unterminated",
      "{% for x in [1] %}{% else %}",
  };
  for (const char* src : cases) error_of(src, StatusCode::kBadFormat);
  // invalid UTF-8 in the template source
  error_of("abc\xff", StatusCode::kBadFormat);
}

TEST(ChatTemplate, InvalidUtf8InputIsRejected) {
  ChatTemplate t = ChatTemplate::parse(kSmol);
  EXPECT_THROW(t.apply({{"user", "bad \xc3"}}, {}), ember::Error);
  try {
    t.apply({{"user\xff", "x"}}, {});
  } catch (const ember::Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  }
}

TEST(ChatTemplate, HostileNestingIsAnErrorNotACrash) {
  const int n = 20000;
  EXPECT_EQ(render(std::string(n, '(') + "1" + std::string(n, ')')).size(), 2u * n + 1);  // plain text
  error_of("{{ " + std::string(n, '(') + "1" + std::string(n, ')') + " }}", StatusCode::kUnsupported);
  error_of("{{ " + std::string(n, '[') + std::string(n, ']') + " }}", StatusCode::kUnsupported);
  error_of("{{ " + std::string(n, '-') + "1 }}", StatusCode::kUnsupported);
  std::string nots = "{{ ";
  for (int i = 0; i < n; ++i) nots += "not ";
  error_of(nots + "x }}", StatusCode::kUnsupported);
  std::string ifs, endifs;
  for (int i = 0; i < 5000; ++i) {
    ifs += "{% if true %}";
    endifs += "{% endif %}";
  }
  error_of(ifs + "x" + endifs, StatusCode::kUnsupported);
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  error_of(chain + " }}", StatusCode::kUnsupported);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 100000; ++i) filters += "|upper";
  error_of(filters + " }}", StatusCode::kUnsupported);
  std::string attrs = "{{ x";
  for (int i = 0; i < 100000; ++i) attrs += ".a";
  error_of(attrs + " }}", StatusCode::kUnsupported);
  // A long but flat template is fine.
  std::string flat;
  for (int i = 0; i < 20000; ++i) flat += "{% if true %}x{% endif %}";
  EXPECT_EQ(render(flat).size(), 20000u);
  std::string elifs = "{% if false %}a";
  for (int i = 0; i < 20000; ++i) elifs += "{% elif false %}b";
  EXPECT_EQ(render(elifs + "{% else %}c{% endif %}"), "c");
}

TEST(ChatTemplate, HostileWorkloadsHitLimits) {
  // loop iterations
  error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
           StatusCode::kInvalidArgument);
  // output size
  error_of("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", StatusCode::kInvalidArgument);
  // one huge string / list
  error_of("{{ 'x' * 10000000000 }}", StatusCode::kInvalidArgument);
  error_of("{{ ([1] * 100000000) | length }}", StatusCode::kInvalidArgument);
  error_of("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
           StatusCode::kInvalidArgument);
  error_of("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
           StatusCode::kInvalidArgument);
  error_of(
      "{{ 'ab' | replace('', 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx') | replace('x', "
      "'yyyyyyyyyyyyyyyyyyyyyyyyyyy') "
      "| replace('y', 'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz') | replace('z', 'wwwwwwwwwwwwwwwwwwwwwwwwwwwwww') "
      "| replace('w', 'vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv') }}",
      StatusCode::kInvalidArgument);
  // unbounded recursion
  error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", StatusCode::kInvalidArgument);
  error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", StatusCode::kInvalidArgument);
  // integer overflow is reported, not wrapped
  error_of("{{ 9223372036854775807 + 1 }}", StatusCode::kUnsupported);
  error_of("{{ 2 ** 64 }}", StatusCode::kUnsupported);
  // a huge source
  error_of(std::string(2u << 20, 'x'), StatusCode::kBadFormat);
}

// Values a template nests far deeper than any printing could need: freeing
// them must not recurse (a 100,000-deep list used to overflow the stack when
// the render ended), and printing / comparing them is a clear error.
TEST(ChatTemplate, DeeplyNestedValuesAreFreedAndRefused) {
  EXPECT_EQ(render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}ok"),
            "ok");
  EXPECT_EQ(render("{% set ns = namespace(x={}) %}{% for i in range(100000) %}{% set ns.x = {'a': ns.x} %}"
                   "{% endfor %}ok"),
            "ok");
  EXPECT_EQ(render("{% set ns = namespace(x=none) %}{% for i in range(100000) %}{% set ns.x = namespace(up=ns.x) %}"
                   "{% endfor %}ok"),
            "ok");
  EXPECT_EQ(render("{% set ns = namespace(x='') %}{% for i in range(100000) %}{% set ns.x = [ns.x].copy %}"
                   "{% endfor %}ok"),
            "ok");
  const std::string deep =
      "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  EXPECT_NE(error_of(deep + "{{ ns.x }}", StatusCode::kInvalidArgument).find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of(deep + "{{ ns.x == [ns.x] }}", StatusCode::kInvalidArgument).find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of(deep + "{{ ns.x < [ns.x] }}", StatusCode::kInvalidArgument).find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of(deep + "{{ ns.x | tojson }}", StatusCode::kInvalidArgument).find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=none) %}{% for i in range(5000) %}{% set ns.x = namespace(up=ns.x) %}"
                     "{% endfor %}{{ ns }}",
                     StatusCode::kInvalidArgument)
                .find("nested too deeply"),
            std::string::npos);
  // Python's recursive repr for a namespace that holds itself (the golden
  // snippet ns_self_repr has jinja2's exact text).
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), "<Namespace {'me': <Namespace {...}>}>");
}

// Templates run on the host's thread, whose stack may be small: recursion is
// bounded by stack bytes (Limits::max_stack_bytes, less where the thread has
// less room), not only by depth.
std::vector<std::string> outcomes_on_a_thread(size_t stack_bytes, const std::vector<std::string>& sources) {
  struct Job {
    const std::vector<std::string>* sources;
    std::vector<std::string> outcomes;
  } job{&sources, {}};
  auto body = [](void* arg) -> void* {
    auto* j = static_cast<Job*>(arg);
    for (const std::string& src : *j->sources) {
      try {
        ChatTemplateOptions opt;
        j->outcomes.push_back("rendered " + ChatTemplate::parse(src).apply({{"user", "hi"}}, opt));
      } catch (const ember::Error& e) {
        j->outcomes.push_back(e.message());
      }
    }
    return nullptr;
  };
  pthread_attr_t attr;
  EXPECT_EQ(pthread_attr_init(&attr), 0);
  EXPECT_EQ(pthread_attr_setstacksize(&attr, stack_bytes), 0);
  pthread_t th;
  EXPECT_EQ(pthread_create(&th, &attr, body, &job), 0);
  EXPECT_EQ(pthread_join(th, nullptr), 0);
  pthread_attr_destroy(&attr);
  return job.outcomes;
}

TEST(ChatTemplate, DeepRecursionIsAnErrorOnASmallThreadStack) {
  const std::vector<std::string> sources = {
      "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
      "{% macro f(n) %}{% for i in [n] %}{% if true %}{{ [f(i + 1)] | map('string') | join }}{% endif %}{% endfor %}"
      "{% endmacro %}{{ f(0) }}",
      "{{ " + std::string(59, '(') + "1" + std::string(59, ')') + " }}",  // the parse depth limit's worth
      "{% macro f(n) %}{% if n < 8 %}{{ f(n + 1) }}{% endif %}{{ n }}{% endmacro %}{{ f(0) }}",
      "{{ " + std::string(8, '(') + "1" + std::string(8, ')') + " }}",
  };
  for (size_t stack : {size_t{512} << 10, size_t{160} << 10}) {
    SCOPED_TRACE("thread stack " + std::to_string(stack >> 10) + " KiB");
    std::vector<std::string> out = outcomes_on_a_thread(stack, sources);
    ASSERT_EQ(out.size(), sources.size());
    EXPECT_NE(out[0].find("recursion too deep"), std::string::npos) << out[0];
    EXPECT_NE(out[1].find("recursion too deep"), std::string::npos) << out[1];
    // Deep but legal: rendered, or refused for the stack it would need.
    EXPECT_TRUE(out[2] == "rendered 1" || out[2].find("KiB of stack") != std::string::npos) << out[2];
    EXPECT_EQ(out[3], "rendered 876543210");  // ordinary depths render on any of these threads
    EXPECT_EQ(out[4], "rendered 1");
  }
}

// Random mutations of real templates must only ever produce output or an
// ember::Error (never a crash, hang or another exception type).
TEST(ChatTemplate, MutatedTemplatesNeverCrash) {
  std::vector<std::string> seeds = {kSmol, read_golden("llama3.jinja"), read_golden("llama3_1.jinja"),
                                    read_golden("gemma2.jinja"), read_golden("gemma3.jinja")};
  const std::string alphabet = "{}%#-+()[]'\"|.,:~*/=<>!\\ \nabcdefijnorstuxyz0123456789_";
  std::mt19937 rng(12345);
  std::vector<ChatMessage> msgs = {{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}};
  int rendered = 0, errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = seeds[rng() % seeds.size()];
    int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: s.erase(pos, 1 + rng() % 8); break;
        default: s.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    try {
      ChatTemplateOptions opt;
      opt.add_generation_prompt = (iter & 1) != 0;
      (void)ChatTemplate::parse(s).apply(msgs, opt);
      ++rendered;
    } catch (const ember::Error&) {
      ++errors;
    }
  }
  EXPECT_GT(rendered, 0);
  EXPECT_GT(errors, 0);
}

}  // namespace
