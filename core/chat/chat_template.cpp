#include "core/chat/chat_template.h"

#include <nlohmann/json.hpp>

#include "core/chat/jinja.h"
#include "core/util/nesting.h"

namespace ember {

namespace {
using Json = nlohmann::ordered_json;

// JSON as the values Python's json.loads gives (dicts keep their order).
// The caller has bounded the nesting.
jinja::Value to_value(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return jinja::Value::none();
    case Json::value_t::boolean: return jinja::Value::boolean(j.get<bool>());
    case Json::value_t::number_integer: return jinja::Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return jinja::Value::floating(static_cast<double>(u));
      return jinja::Value::integer(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float: return jinja::Value::floating(j.get<double>());
    case Json::value_t::string: return jinja::Value::string(j.get<std::string>());
    case Json::value_t::array: {
      std::vector<jinja::Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(to_value(e));
      return jinja::Value::make_list(std::move(items));
    }
    case Json::value_t::object: {
      jinja::Value d = jinja::Value::make_dict();
      for (const auto& [k, v] : j.items()) d.dict->set(jinja::Value::string(k), to_value(v));
      return d;
    }
    default: return jinja::Value::none();
  }
}

jinja::Value tools_value(const std::string& json) {
  if (json.empty()) return jinja::Value::none();
  if (nesting_depth(json) > 128) throw Error(StatusCode::kInvalidArgument, "chat tools nest too deep");
  const Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(StatusCode::kInvalidArgument, "chat tools are not valid JSON");
  return to_value(j);
}
}  // namespace

ChatTemplate ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.program_ = jinja::parse_template(source);
  t.source_ = std::make_shared<const std::string>(source);
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
  check(options.tools_json, "tools");
  vars.emplace_back("tools", tools_value(options.tools_json));
  vars.emplace_back("documents", jinja::Value::none());
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(options.add_generation_prompt));
  vars.emplace_back("bos_token", jinja::Value::string(options.bos_token));
  vars.emplace_back("eos_token", jinja::Value::string(options.eos_token));
  return jinja::render(*program_, vars);
}

}  // namespace ember
