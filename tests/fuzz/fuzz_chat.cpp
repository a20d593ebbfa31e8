// libFuzzer target: the chat-template renderer (core/chat): template text AND
// the conversation come from the input.
//
// Input: byte 0 holds the flags (bit 0 add_generation_prompt); the rest is
// split at NUL bytes into: template source, bos_token, eos_token, then
// role/content pairs (at most 16 messages).
//
// Promise checked: parse and apply either succeed or throw ember::Error
// (kBadFormat / kUnsupported from parse; kInvalidArgument / kUnsupported
// from apply) - never a crash, hang or other exception; rendering is
// deterministic (a second apply gives the same bytes).
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/chat/chat_template.h"
#include "core/util/status.h"
#include "fuzz_util.h"

namespace ember::fuzz {
namespace {

std::string join_input(uint8_t flags, const std::string& tmpl, const std::vector<std::string>& rest) {
  std::string s(1, static_cast<char>(flags));
  s += tmpl;
  for (const auto& r : rest) {
    s.push_back('\0');
    s += r;
  }
  return s;
}

void write_seeds(const std::string& dir) {
  const std::vector<std::string> conv = {"<s>", "</s>", "system", "You are terse.", "user", "Hi \xC3\xA9!",
                                         "assistant", "Hello.", "user", "What is 2+2?"};
  const std::vector<std::string> conv_short = {"<s>", "</s>", "user", "hi"};
  for (const char* name : {"smollm2", "llama3", "gemma2", "gemma3", "qwen2_5", "llama3_1", "deepseek_r1"}) {
    std::ifstream in(std::string(EMBER_CHAT_GOLDEN_DIR) + "/" + name + ".jinja", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().empty()) {
      std::fprintf(stderr, "missing golden template %s\n", name);
      std::exit(1);
    }
    write_seed(dir, name, join_input(1, ss.str(), conv));
  }
  // Small templates reaching the interpreter's other constructs.
  const char* const small[] = {
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ loop.index }}:{{ m.role|upper }}"
      "{% if not loop.last %}, {% endif %}{% endfor %}{{ ns.n }}",
      "{% macro say(x, y='!') %}{{ x|trim }}{{ y }}{% endmacro %}{% for m in messages|reverse %}{{ say(m['content']) }}"
      "{% endfor %}",
      "{{ messages|tojson }}{{ messages[0]['content'][1:3] }}{{ messages|length }}{{ 'a,b'.split(',')|join('-') }}",
      "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content|replace('i', 'I') }}"
      "{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}",
      "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}{{ bos_token }}",
      "{%- for m in messages -%}\n  {{- m.content.strip() ~ (eos_token if m.role == 'assistant' else '') -}}\n"
      "{%- endfor -%}{{ range(3)|list }}{{ 7 // 2 }}{{ 2 ** 3 }}{{ 'x' * 3 }}{{ {'a': 1}.items()|list }}",
      "{# comment #}{% raw %}{{ not rendered }}{% endraw %}{{ tools is none }}{{ documents is defined }}",
  };
  int i = 0;
  for (const char* t : small) write_seed(dir, "small" + std::to_string(i++), join_input(1, t, conv));
  write_seed(dir, "short", join_input(0, "{{ messages[0].content }}", conv_short));
}

}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ember::fuzz::write_seeds_if_asked(ember::fuzz::write_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember;
  if (size == 0) return 0;
  const std::vector<std::string> parts =
      fuzz::split(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), '\0');
  ChatTemplateOptions opt;
  opt.add_generation_prompt = data[0] & 1;
  if (parts.size() > 1) opt.bos_token = parts[1];
  if (parts.size() > 2) opt.eos_token = parts[2];
  std::vector<ChatMessage> messages;
  for (size_t i = 3; i + 1 < parts.size() && messages.size() < 16; i += 2) messages.push_back({parts[i], parts[i + 1]});

  std::optional<ChatTemplate> t;
  try {
    t = ChatTemplate::parse(parts[0]);
  } catch (const Error& e) {
    EMBER_FUZZ_CHECK(e.code() == StatusCode::kBadFormat || e.code() == StatusCode::kUnsupported);
    return 0;
  }
  std::string first;
  try {
    first = t->apply(messages, opt);
  } catch (const Error& e) {
    EMBER_FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument || e.code() == StatusCode::kUnsupported);
    return 0;
  }
  EMBER_FUZZ_CHECK(t->apply(messages, opt) == first);
  return 0;
}
