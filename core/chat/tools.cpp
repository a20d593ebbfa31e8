#include "core/chat/tools.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "core/util/nesting.h"
#include "core/util/status.h"
#include "core/util/utf8.h"

namespace ember::chat {

namespace {
using Json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& m) { fail(StatusCode::kInvalidArgument, "tools: " + m); }

constexpr size_t kMaxNesting = 128;

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > ToolSet::kMaxNameBytes) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

// Parses JSON text whose nesting was checked (nlohmann's parser and its
// destructor do not recurse; dump() does, hence the check first).
Json parse_checked(const std::string& text, const char* what) {
  if (nesting_depth(text) > kMaxNesting) {
    bad(std::string(what) + " nests brackets more than " + std::to_string(kMaxNesting) + " deep");
  }
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad(std::string(what) + " is not valid JSON");
  return j;
}

// The wrappers of one call in each format.
struct Wrapper {
  std::string trigger, name_open, args_open, end;
};
Wrapper wrapper(ToolFormat f) {
  if (f == ToolFormat::kLlama3) return {"{\"name\": ", "{\"name\": \"", "\", \"parameters\": ", "}"};
  return {"<tool_call>", "<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>"};
}

Json tag_for(const ToolSpec& t, const Wrapper& w) {
  Json schema = t.parameters.empty() ? Json{{"type", "object"}} : Json::parse(t.parameters);
  return Json{{"type", "tag"},
              {"begin", w.name_open + t.name + w.args_open},
              {"content", Json{{"type", "json_schema"}, {"json_schema", std::move(schema)}}},
              {"end", w.end}};
}
}  // namespace

const ToolSpec* ToolSet::find(const std::string& name) const {
  for (const auto& t : tools)
    if (t.name == name) return &t;
  return nullptr;
}

std::shared_ptr<const ToolSet> parse_tools(const std::string& json) {
  if (json.size() > ToolSet::kMaxJsonBytes) bad("the tool list is larger than 1 MiB");
  if (!is_valid_utf8(json)) bad("the tool list is not valid UTF-8");
  const Json j = parse_checked(json, "the tool list");
  if (!j.is_array()) bad("the tool list must be a JSON array");
  if (j.size() > ToolSet::kMaxTools) bad("more than 512 tools");
  auto set = std::make_shared<ToolSet>();
  set->json = json;
  std::set<std::string> names;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string at = "tool " + std::to_string(i);
    const Json& t = j[i];
    if (!t.is_object()) bad(at + " is not an object");
    auto type = t.find("type");
    if (type != t.end() && (!type->is_string() || type->get<std::string>() != "function")) {
      bad(at + ": only \"type\": \"function\" tools are supported");
    }
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) bad(at + " has no \"function\" object");
    ToolSpec spec;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) bad(at + " has no function name");
    spec.name = name->get<std::string>();
    if (!valid_name(spec.name)) bad(at + ": a name must be 1-256 characters of A-Z, a-z, 0-9, _, . or -");
    if (!names.insert(spec.name).second) bad("two tools are named \"" + spec.name + "\"");
    auto desc = fn->find("description");
    if (desc != fn->end()) {
      if (!desc->is_string()) bad(at + ": the description must be a string");
      spec.description = desc->get<std::string>();
    }
    auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_null()) {
      if (!params->is_object()) bad(at + ": \"parameters\" must be a JSON Schema object");
      spec.parameters = params->dump();
    }
    set->tools.push_back(std::move(spec));
  }
  return set;
}

ToolFormat detect_tool_format(const std::string& source) {
  if (source.find("<tool_call>") != std::string::npos) return ToolFormat::kHermes;
  if (source.find("<|python_tag|>") != std::string::npos || source.find("ipython") != std::string::npos)
    return ToolFormat::kLlama3;
  return ToolFormat::kGeneric;
}

std::string tool_constraint(const ToolSet& tools, ToolFormat format, const ToolChoice& choice) {
  if (choice.mode == ToolChoice::Mode::kNone || tools.tools.empty()) return {};
  const Wrapper w = wrapper(format);
  Json fmt;
  if (choice.mode == ToolChoice::Mode::kFunction) {
    const ToolSpec* t = tools.find(choice.name);
    if (!t) bad("tool_choice names \"" + choice.name + "\", which is not among the session's tools");
    fmt = tag_for(*t, w);
  } else {
    Json tags = Json::array();
    for (const auto& t : tools.tools) tags.push_back(tag_for(t, w));
    fmt = Json{{"type", "triggered_tags"},
               {"triggers", Json::array({w.trigger})},
               {"tags", std::move(tags)},
               {"at_least_one", choice.mode == ToolChoice::Mode::kRequired},
               {"stop_after_first", !choice.parallel}};
  }
  return Json{{"type", "structural_tag"}, {"format", std::move(fmt)}}.dump();
}

std::vector<ChatMessage> messages_for(const std::vector<ChatMessage>& messages, const ToolSet& tools,
                                      ToolFormat format) {
  if (format != ToolFormat::kGeneric) return messages;
  std::string prompt =
      "You can call functions. These are available, as JSON Schema signatures:\n<tools>\n";
  for (const auto& t : tools.tools) {
    Json sig{{"name", t.name}};
    if (!t.description.empty()) sig["description"] = t.description;
    sig["parameters"] = t.parameters.empty() ? Json{{"type", "object"}} : Json::parse(t.parameters);
    prompt += sig.dump() + "\n";
  }
  prompt +=
      "</tools>\nTo call a function, reply with a JSON object with the function's name and arguments inside "
      "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
      "\n</tool_call>\nThe function's result comes back inside <tool_response></tool_response> tags.";
  std::vector<ChatMessage> out;
  out.reserve(messages.size() + 1);
  size_t i = 0;
  if (!messages.empty() && messages[0].role == "system") {
    out.push_back({"system", messages[0].content + "\n\n" + prompt});
    i = 1;
  } else {
    out.push_back({"system", prompt});
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      out.push_back({"user", "<tool_response>\n" + m.content + "\n</tool_response>"});
    } else {
      out.push_back(m);
    }
  }
  return out;
}

// ---------------------------------------------------------------- parser

ToolCallParser::ToolCallParser(ToolFormat format) : format_(format), trigger_(wrapper(format).trigger) {}

bool ToolCallParser::try_complete(Piece& call) const {
  // held_ starts with the trigger. Hermes/generic: the call ends with
  // </tool_call>; Llama 3: it is one JSON object.
  std::string body;
  if (format_ == ToolFormat::kLlama3) {
    if (held_.back() != '}') return false;
    body = held_;
  } else {
    static const std::string kClose = "</tool_call>";
    if (held_.size() < trigger_.size() + kClose.size() ||
        held_.compare(held_.size() - kClose.size(), kClose.size(), kClose) != 0)
      return false;
    body = held_.substr(trigger_.size(), held_.size() - trigger_.size() - kClose.size());
  }
  if (nesting_depth(body) > kMaxNesting) return false;
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return false;
  auto args = j.find(format_ == ToolFormat::kLlama3 ? "parameters" : "arguments");
  if (args == j.end()) args = j.find(format_ == ToolFormat::kLlama3 ? "arguments" : "parameters");
  call.is_call = true;
  call.call.name = name->get<std::string>();
  call.call.arguments = args == j.end() ? "{}" : args->dump();
  return true;
}

void ToolCallParser::feed(const std::string& text, bool final, std::vector<Piece>& out) {
  const size_t first = out.size();  // pieces of this call only are merged
  auto emit_text = [&out, first](std::string t) {
    if (t.empty()) return;
    if (out.size() > first && !out.back().is_call) {
      out.back().text += t;
    } else {
      Piece p;
      p.text = std::move(t);
      out.push_back(std::move(p));
    }
  };
  std::string pending;
  if (!in_call_) {
    pending = std::move(held_);  // a tail that may have been a trigger's start
    held_.clear();
  }
  pending += text;
  size_t pos = 0;
  while (pos < pending.size()) {
    if (in_call_) {
      // One character at a time until the call completes (each candidate
      // end is tried once); a "call" past 1 MiB is given up as text.
      held_ += pending[pos++];
      Piece call;
      if (try_complete(call)) {
        out.push_back(std::move(call));
        held_.clear();
        in_call_ = false;
      } else if (held_.size() > kMaxCallBytes) {
        emit_text(std::move(held_));
        held_.clear();
        in_call_ = false;
      }
      continue;
    }
    const size_t at = pending.find(trigger_, pos);
    if (at == std::string::npos) {
      // Free text; hold back a tail that may grow into the trigger.
      size_t keep = 0;
      const size_t max_len = std::min(trigger_.size() - 1, pending.size() - pos);
      for (size_t len = max_len; len > 0; --len) {
        if (pending.compare(pending.size() - len, len, trigger_, 0, len) == 0) {
          keep = len;
          break;
        }
      }
      emit_text(pending.substr(pos, pending.size() - pos - keep));
      held_ = pending.substr(pending.size() - keep);
      break;
    }
    emit_text(pending.substr(pos, at - pos));
    held_ = trigger_;
    in_call_ = true;
    pos = at + trigger_.size();
  }
  if (final && !held_.empty()) {
    emit_text(std::move(held_));
    held_.clear();
    in_call_ = false;
  }
}

}  // namespace ember::chat
