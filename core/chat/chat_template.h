// Chat templates: applies a GGUF model's `tokenizer.chat_template` (a Jinja2
// template in Hugging Face style) to a conversation.
//
// The output is byte-identical to rendering the same template with Python's
// jinja2 the way transformers does (ImmutableSandboxedEnvironment with
// trim_blocks=True, lstrip_blocks=True and the loopcontrols extension; HF's
// tojson; raise_exception) for the subset of Jinja this interpreter supports;
// see core/chat/jinja.h and tests/golden/chat/README.md.
//
// Render variables: messages (a list of {'role': ..., 'content': ...} dicts),
// add_generation_prompt, bos_token, eos_token, tools (None, as transformers
// passes it when no tools are given, or the tool list: parsed JSON, as
// transformers passes a list of dicts) and documents = None.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace ember {

namespace jinja {
struct Program;
}

struct ChatMessage {
  std::string role, content;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token, eos_token;
  // A JSON array (core/chat/tools.h checks it) for `tools`; "" = None.
  std::string tools_json;
};

class ChatTemplate {
 public:
  // Parses `source` (UTF-8). Throws ember::Error: kBadFormat for a syntax
  // error (or invalid UTF-8), kUnsupported for a construct this subset does
  // not implement (the message names it).
  static ChatTemplate parse(const std::string& source);

  // Renders the conversation. Thread-safe; cheap to copy (the parsed
  // template is shared and immutable). Throws ember::Error:
  // kInvalidArgument with the template's own message when it calls
  // raise_exception(msg), kInvalidArgument for other render-time errors
  // (undefined attribute, type error, invalid UTF-8 input, abuse limits),
  // kUnsupported for a construct reached at render time that the subset
  // does not implement.
  std::string apply(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) const;
  const std::string& source() const { return *source_; }

 private:
  std::shared_ptr<const jinja::Program> program_;
  std::shared_ptr<const std::string> source_;
};

}  // namespace ember
