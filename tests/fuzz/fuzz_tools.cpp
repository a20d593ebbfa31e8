// libFuzzer target: tool calling's text handling (core/chat/tools): a hostile
// tool list and a hostile model reply.
//
// Input: byte 0 = flags (bits 0-1 the tool choice, bits 2-7 the size of the
// chunks the reply is fed in, 1..64); the rest is split at the first NUL into
// the tool list (JSON text) and the reply.
//
// Promises checked: parse_tools either returns or throws ember::Error
// kInvalidArgument (never another exception, a crash or a hang); for a list
// it accepts, the constraint is valid JSON for every format and choice, the
// generic messages and a real template (Qwen2.5's, which reads `tools`)
// render or fail with ember::Error; the reply parser, in every format, gives
// the same calls and text whether the reply comes in one piece or in chunks,
// gives back every byte of the reply as text when it finds no call, and only
// calls whose arguments are JSON.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/chat/chat_template.h"
#include "core/chat/tools.h"
#include "core/util/status.h"
#include "fuzz_util.h"

namespace ember::fuzz {
namespace {

using chat::ToolCallParser;
using chat::ToolFormat;

std::string join_input(uint8_t flags, const std::string& tools, const std::string& reply) {
  std::string s(1, static_cast<char>(flags));
  s += tools;
  s.push_back('\0');
  s += reply;
  return s;
}

const char* kWeather = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";

void write_seeds(const std::string& dir) {
  write_seed(dir, "hermes", join_input(0x10, kWeather,
                                       "Let me check. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                       "{\"city\": \"Paris\"}}\n</tool_call> Done."));
  write_seed(dir, "llama3", join_input(0x05, kWeather, R"({"name": "get_weather", "parameters": {"city": "Rome"}})"));
  write_seed(dir, "two_calls",
             join_input(0x0e, R"([{"function": {"name": "a"}}, {"function": {"name": "b", "parameters": {}}}])",
                        "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", "
                        "\"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>"));
  write_seed(dir, "unfinished", join_input(0x03, kWeather, "<tool_call>\n{\"name\": \"get_weather\", \"argu"));
  write_seed(dir, "prefix", join_input(0x20, kWeather, "plain text ending in <tool_c"));
  write_seed(dir, "bad_list", join_input(0, R"([{"function": {"name": "a b"}}])", "hi"));
}

const ChatTemplate& qwen_template() {
  static const ChatTemplate t = [] {
    std::ifstream in(std::string(EMBER_CHAT_GOLDEN_DIR) + "/qwen2_5.jinja", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    EMBER_FUZZ_CHECK(!ss.str().empty());
    return ChatTemplate::parse(ss.str());
  }();
  return t;
}

struct Parsed {
  std::vector<std::string> items;  // "T:" text (adjacent pieces merged) or "C:" name + '\0' + arguments
  std::string text;                // all text pieces
  size_t calls = 0;
};

Parsed parse(ToolFormat f, std::string_view reply, size_t chunk) {
  ToolCallParser p(f);
  std::vector<ToolCallParser::Piece> out;
  if (reply.empty()) p.feed("", true, out);
  for (size_t at = 0; at < reply.size(); at += chunk) {
    const size_t n = std::min(chunk, reply.size() - at);
    p.feed(std::string(reply.substr(at, n)), at + n == reply.size(), out);
  }
  Parsed r;
  for (const auto& piece : out) {
    if (piece.is_call) {
      ++r.calls;
      EMBER_FUZZ_CHECK(nlohmann::json::accept(piece.call.arguments));
      r.items.push_back("C:" + piece.call.name + '\0' + piece.call.arguments);
    } else {
      r.text += piece.text;
      if (!r.items.empty() && r.items.back()[0] == 'T') {
        r.items.back() += piece.text;
      } else {
        r.items.push_back("T:" + piece.text);
      }
    }
  }
  return r;
}

}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ember::fuzz::write_seeds_if_asked(ember::fuzz::write_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember;
  using chat::ToolFormat;
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = rest.find('\0');
  const std::string tools_json(rest.substr(0, nul));
  const std::string_view reply = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  const size_t chunk = 1 + (flags >> 2);

  for (ToolFormat f : {ToolFormat::kGeneric, ToolFormat::kHermes, ToolFormat::kLlama3}) {
    const fuzz::Parsed whole = fuzz::parse(f, reply, reply.size() + 1);
    const fuzz::Parsed chunked = fuzz::parse(f, reply, chunk);
    EMBER_FUZZ_CHECK(whole.items == chunked.items);
    if (whole.calls == 0) EMBER_FUZZ_CHECK(whole.text == reply);
  }

  std::shared_ptr<const chat::ToolSet> tools;
  try {
    tools = chat::parse_tools(tools_json);
  } catch (const Error& e) {
    EMBER_FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument);
    return 0;
  }
  chat::ToolChoice choice;
  choice.mode = static_cast<chat::ToolChoice::Mode>(flags & 3);
  choice.parallel = (flags & 4) == 0;
  if (choice.mode == chat::ToolChoice::Mode::kFunction && !tools->tools.empty())
    choice.name = tools->tools[flags % tools->tools.size()].name;
  for (ToolFormat f : {ToolFormat::kGeneric, ToolFormat::kHermes, ToolFormat::kLlama3}) {
    try {
      const std::string c = chat::tool_constraint(*tools, f, choice);
      EMBER_FUZZ_CHECK(c.empty() || nlohmann::json::accept(c));
    } catch (const Error& e) {
      EMBER_FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument);
    }
  }
  const std::vector<ChatMessage> messages = {{"user", std::string(reply.substr(0, 256))}, {"tool", "ok"}};
  const auto generic = chat::messages_for(messages, *tools, ToolFormat::kGeneric);
  EMBER_FUZZ_CHECK(generic.size() == messages.size() + 1);
  ChatTemplateOptions opt;
  opt.tools_json = tools_json;
  try {
    fuzz::qwen_template().apply(messages, opt);
  } catch (const Error& e) {
    EMBER_FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument || e.code() == StatusCode::kUnsupported);
  }
  return 0;
}
