#include "core/chat/chat_template.h"

#include "core/chat/jinja.h"

namespace ember {

ChatTemplate ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.program_ = jinja::parse_template(source);
  return t;
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) const {
  if (!program_) throw Error(StatusCode::kInvalidArgument, "chat template not parsed");
  auto check = [](const std::string& s, const char* what) {
    if (!is_valid_utf8(s))
      throw Error(StatusCode::kInvalidArgument, std::string("chat ") + what + " is not valid UTF-8");
  };
  std::vector<jinja::Value> list;
  list.reserve(messages.size());
  for (const auto& m : messages) {
    check(m.role, "message role");
    check(m.content, "message content");
    jinja::Value d = jinja::Value::make_dict();
    d.dict->items.emplace_back(jinja::Value::string("role"), jinja::Value::string(m.role));
    d.dict->items.emplace_back(jinja::Value::string("content"), jinja::Value::string(m.content));
    list.push_back(std::move(d));
  }
  check(options.bos_token, "bos_token");
  check(options.eos_token, "eos_token");
  std::vector<std::pair<std::string, jinja::Value>> vars;
  vars.emplace_back("messages", jinja::Value::make_list(std::move(list)));
  vars.emplace_back("tools", jinja::Value::none());
  vars.emplace_back("documents", jinja::Value::none());
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(options.add_generation_prompt));
  vars.emplace_back("bos_token", jinja::Value::string(options.bos_token));
  vars.emplace_back("eos_token", jinja::Value::string(options.eos_token));
  return jinja::render(*program_, vars);
}

}  // namespace ember
