// Tool calling (function calling): the tools a session offers the model, how
// its chat template is told about them, the constraint that holds a call to
// the tool's argument schema, and the parser that finds the calls in the
// reply.
//
// Tools come in OpenAI's Chat Completions shape, a JSON array of
//   {"type": "function", "function": {"name": ..., "description": ...,
//                                     "parameters": {JSON Schema}}}
// and reach the chat template as its `tools` variable (the list Hugging Face
// templates read). A model's calls are recognised by family, from its
// template:
//   kHermes  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
//            (Qwen2.5, Qwen3, Hermes; templates that mention <tool_call>)
//   kLlama3  `{"name": ..., "parameters": {...}}` (Llama 3.1/3.2/3.3;
//            templates with <|python_tag|> or the ipython role)
//   kGeneric every other template: the tools and the Hermes format are
//            described in a system message Ember adds, and tool results are
//            sent as user turns wrapped in <tool_response>.
// The constraint is lazy (XGrammar's structural tag, "triggered tags"): free
// text until the call's opening text, then the call's exact wrapper with the
// tool's name and its argument schema.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/chat/chat_template.h"

namespace ember::chat {

struct ToolSpec {
  std::string name;
  std::string description;
  std::string parameters;  // JSON Schema text; "" = any JSON object
};

struct ToolSet {
  std::string json;  // the array as given (what the template's `tools` holds)
  std::vector<ToolSpec> tools;
  // The limits a tool list is held to: kInvalidArgument past them.
  static constexpr size_t kMaxJsonBytes = 1 << 20;
  static constexpr size_t kMaxTools = 512;
  static constexpr size_t kMaxNameBytes = 256;
  const ToolSpec* find(const std::string& name) const;
};

// Parses and checks a tool list (UTF-8, at most 1 MiB, nesting at most 128,
// at most 512 tools, names of 1..256 bytes of [A-Za-z0-9_.-], unique, each
// "parameters" an object or absent). Throws ember::Error(kInvalidArgument)
// naming the problem.
std::shared_ptr<const ToolSet> parse_tools(const std::string& json);

enum class ToolFormat : int32_t { kGeneric = 0, kHermes = 1, kLlama3 = 2 };

// The family of a chat template (its source text), as above.
ToolFormat detect_tool_format(const std::string& template_source);

struct ToolChoice {
  enum class Mode : int32_t { kAuto = 0, kNone = 1, kRequired = 2, kFunction = 3 };
  Mode mode = Mode::kAuto;
  std::string name;       // kFunction: the tool that must be called
  bool parallel = true;   // more than one call per reply
};

// The structural tag (XGrammar JSON) for a reply under `choice`; "" for
// kNone. Throws kInvalidArgument for a kFunction name not in `tools`.
std::string tool_constraint(const ToolSet& tools, ToolFormat format, const ToolChoice& choice);

// The messages a template of `format` is given: kGeneric gets a system
// message describing the tools (merged into the first system message if
// there is one) and its tool results as user turns; other formats get the
// messages as they are.
std::vector<ChatMessage> messages_for(const std::vector<ChatMessage>& messages, const ToolSet& tools,
                                      ToolFormat format);

struct ToolCall {
  std::string id;         // "call_<n>", unique in the session
  std::string name;
  std::string arguments;  // compact JSON text
};

// Splits a reply's text, as it streams, into free text and tool calls.
// Text that could be the start of a call is held back until it is or is not
// one; a call's text comes out as one ToolCall once it is complete (its JSON
// parses). Text held when the reply ends (an unfinished call) comes out as
// text.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolFormat format);
  struct Piece {
    bool is_call = false;
    std::string text;  // !is_call
    ToolCall call;     // is_call (id left empty: the stream numbers calls)
  };
  // Appends what `text` completes to `out`; final = the reply has ended.
  void feed(const std::string& text, bool final, std::vector<Piece>& out);
  bool in_call() const { return in_call_; }
  static constexpr size_t kMaxCallBytes = 1 << 20;

 private:
  bool try_complete(Piece& call) const;
  ToolFormat format_;
  std::string trigger_;
  std::string held_;     // a call from its trigger on, or a tail that may start one
  bool in_call_ = false;
};

}  // namespace ember::chat
