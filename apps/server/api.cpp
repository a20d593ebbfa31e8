#include "apps/server/api.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <openssl/evp.h>

namespace ember::server {

Json error_json(const ApiError& e) {
  Json err{{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return Json{{"error", std::move(err)}};
}

void bad_request(const std::string& message, const std::string& param) {
  throw ApiError(400, "invalid_request_error", message, param);
}

namespace {

// Parses JSON text, refusing nesting deeper than kMaxJsonDepth before it is
// built (dump() and some accessors recurse) and every other error of the
// parser (syntax, invalid UTF-8, a number out of range) as a 400 naming `what`.
Json parse_limited(std::string_view text, const std::string& what) {
  try {
    return Json::parse(text.begin(), text.end(), [&](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxJsonDepth) {
        bad_request(what + " nests more than " + std::to_string(kMaxJsonDepth) + " levels deep");
      }
      return true;
    });
  } catch (const Json::exception& e) {
    bad_request(what + " is not valid JSON: " + e.what());
  }
}

Json parse_body(std::string_view body) {
  Json j = parse_limited(body, "the request body");
  if (!j.is_object()) bad_request("the request body must be a JSON object");
  return j;
}

// At most `n` bytes of `s`, not cutting a UTF-8 character (for messages that quote input).
std::string utf8_prefix(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "...";
}

const Json* field(const Json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const Json& j, const char* name, bool def) {
  const Json* v = field(j, name);
  if (!v) return def;
  if (!v->is_boolean()) bad_request(std::string("'") + name + "' must be a boolean", name);
  return v->get<bool>();
}

int64_t get_int(const Json& j, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const Json* v = field(j, name);
  if (!v) return def;
  if (!v->is_number_integer()) bad_request(std::string("'") + name + "' must be an integer", name);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    bad_request(std::string("'") + name + "' must be at most " + std::to_string(hi), name);
  }
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) {
    bad_request(std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                name);
  }
  return x;
}

float get_float(const Json& j, const char* name, float def, double lo, double hi) {
  const Json* v = field(j, name);
  if (!v) return def;
  if (!v->is_number()) bad_request(std::string("'") + name + "' must be a number", name);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    bad_request(std::string("'") + name + "' must be in [" + Json(lo).dump() + ", " + Json(hi).dump() + "]", name);
  }
  return static_cast<float>(x);
}

std::string get_string(const Json& j, const char* name, const std::string& def = "") {
  const Json* v = field(j, name);
  if (!v) return def;
  if (!v->is_string()) bad_request(std::string("'") + name + "' must be a string", name);
  return v->get<std::string>();
}

void check_model(const Json& j, const ModelFacts& facts) {
  const Json* v = field(j, "model");
  if (!v) return;  // optional here (OpenAI requires it; llama.cpp's server does not)
  if (!v->is_string()) bad_request("'model' must be a string", "model");
  const std::string& m = v->get_ref<const std::string&>();
  if (m != facts.id) {
    throw ApiError(404, "invalid_request_error",
                   "The model '" + m + "' does not exist (this server serves '" + facts.id + "')", "model",
                   "model_not_found");
  }
}

// The parameters chat and completions share.
GenParams parse_gen(const Json& j, const ModelFacts& facts, bool chat) {
  GenParams g;
  const int64_t max_ctx = std::max<int64_t>(1, facts.context_length);
  g.max_tokens = static_cast<int32_t>(get_int(j, "max_tokens", 0, 1, max_ctx));
  if (chat) {
    g.max_tokens = static_cast<int32_t>(get_int(j, "max_completion_tokens", g.max_tokens, 1, max_ctx));
  }
  g.temperature = get_float(j, "temperature", 1.0f, 0.0, 2.0);
  g.top_p = get_float(j, "top_p", 1.0f, 0.0, 1.0);
  if (g.top_p <= 0.0f) bad_request("'top_p' must be greater than 0", "top_p");
  g.top_k = static_cast<int32_t>(get_int(j, "top_k", 0, 0, facts.vocab_size));
  g.min_p = get_float(j, "min_p", 0.0f, 0.0, 1.0);
  g.presence_penalty = get_float(j, "presence_penalty", 0.0f, -2.0, 2.0);
  g.frequency_penalty = get_float(j, "frequency_penalty", 0.0f, -2.0, 2.0);
  g.repeat_penalty = get_float(j, "repeat_penalty", 1.0f, 0.0, 10.0);
  if (g.repeat_penalty <= 0.0f) bad_request("'repeat_penalty' must be greater than 0", "repeat_penalty");
  g.ignore_eos = get_bool(j, "ignore_eos", false);
  if (const Json* v = field(j, "seed")) {
    if (!v->is_number_integer()) bad_request("'seed' must be an integer", "seed");
    g.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (get_int(j, "n", 1, 1, 128) != 1) bad_request("only n = 1 is supported", "n");
  if (const Json* v = field(j, "stop")) {
    if (v->is_string()) {
      g.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const Json& s : *v) {
        if (!s.is_string()) bad_request("'stop' must be a string or an array of strings", "stop");
        g.stop.push_back(s.get<std::string>());
      }
    } else {
      bad_request("'stop' must be a string or an array of strings", "stop");
    }
    if (g.stop.size() > EMBER_MAX_STOP_STRINGS) {
      bad_request("at most " + std::to_string(EMBER_MAX_STOP_STRINGS) + " stop strings", "stop");
    }
    for (const std::string& s : g.stop) {
      if (s.empty() || s.size() > EMBER_MAX_STOP_STRING_BYTES) {
        bad_request("each stop string must have 1 to " + std::to_string(EMBER_MAX_STOP_STRING_BYTES) + " bytes",
                    "stop");
      }
    }
  }
  if (const Json* v = field(j, "logit_bias")) {
    if (!v->is_object()) bad_request("'logit_bias' must be an object of token ids to biases", "logit_bias");
    if (v->size() > EMBER_MAX_LOGIT_BIAS) bad_request("too many logit_bias entries", "logit_bias");
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string& key = it.key();
      char* end = nullptr;
      errno = 0;
      const long long id = key.empty() ? -1 : std::strtoll(key.c_str(), &end, 10);
      if (errno || key.empty() || *end || id < 0 || id >= facts.vocab_size) {
        bad_request("logit_bias: '" + utf8_prefix(key, 64) + "' is not a token id of this model (0 to " +
                        std::to_string(facts.vocab_size - 1) + ")",
                    "logit_bias");
      }
      if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < -100.0 ||
          it->get<double>() > 100.0) {
        bad_request("logit_bias: each bias must be a number in [-100, 100]", "logit_bias");
      }
      // OpenAI: -100 bans the token.
      const double b = it->get<double>();
      g.logit_bias.push_back({static_cast<int32_t>(id), b <= -100.0 ? -INFINITY : static_cast<float>(b)});
    }
  }
  g.stream = get_bool(j, "stream", false);
  if (const Json* v = field(j, "stream_options")) {
    if (!v->is_object()) bad_request("'stream_options' must be an object", "stream_options");
    if (!g.stream) bad_request("'stream_options' is only allowed with stream: true", "stream_options");
    g.include_usage = get_bool(*v, "include_usage", false);
  }
  // Structured output: response_format, or llama.cpp's grammar extension.
  if (const Json* v = field(j, "response_format")) {
    if (!v->is_object()) bad_request("'response_format' must be an object", "response_format");
    const std::string type = get_string(*v, "type");
    if (type == "json_object") {
      g.json_object = true;
    } else if (type == "json_schema") {
      const Json* js = field(*v, "json_schema");
      if (!js || !js->is_object()) {
        bad_request("response_format json_schema needs a 'json_schema' object", "response_format");
      }
      const Json* schema = field(*js, "schema");
      if (schema && !schema->is_object() && !schema->is_boolean()) {
        bad_request("response_format.json_schema.schema must be a JSON Schema object", "response_format");
      }
      g.json_schema = schema ? schema->dump() : std::string("{}");
    } else if (type != "text") {
      bad_request("response_format.type must be text, json_object or json_schema", "response_format");
    }
  }
  g.grammar = get_string(j, "grammar");
  if (!g.grammar.empty() && (g.json_object || !g.json_schema.empty())) {
    bad_request("give either 'grammar' or a JSON 'response_format', not both", "grammar");
  }
  return g;
}

std::string content_text(const Json& content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array()) bad_request(param + " must be a string or an array of text parts", "messages");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || get_string(part, "type") != "text" || !field(part, "text")) {
      bad_request(param + ": only text parts ({\"type\": \"text\", \"text\": ...}) are supported", "messages");
    }
    text += get_string(part, "text");
  }
  return text;
}

}  // namespace

std::string tool_calls_as_text(const Json& tool_calls) {
  std::string text;
  for (const Json& call : tool_calls) {
    const Json* fn = call.is_object() ? field(call, "function") : nullptr;
    if (!fn || !fn->is_object()) bad_request("each tool call needs a 'function' object", "messages");
    const std::string name = get_string(*fn, "name");
    if (name.empty()) bad_request("each tool call needs a function name", "messages");
    // Arguments come as JSON text (OpenAI); written back compact as the model emits them.
    Json args = Json::object();
    if (const Json* a = field(*fn, "arguments")) {
      if (a->is_string()) {
        args = parse_limited(a->get_ref<const std::string&>(), "a tool call's arguments");
        if (!args.is_object()) {
          bad_request("a tool call's arguments must be a JSON object (as text)", "messages");
        }
      } else if (a->is_object()) {
        args = *a;
      } else {
        bad_request("a tool call's arguments must be JSON text", "messages");
      }
    }
    if (!text.empty()) text += "\n";
    text += "<tool_call>\n{\"name\": " + Json(name).dump() + ", \"arguments\": " + args.dump() + "}\n</tool_call>";
  }
  return text;
}

ChatRequest parse_chat_request(std::string_view body, const ModelFacts& facts) {
  const Json j = parse_body(body);
  check_model(j, facts);
  ChatRequest r;
  const Json* msgs = field(j, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty()) bad_request("'messages' must be a non-empty array", "messages");
  if (msgs->size() > kMaxMessages) bad_request("too many messages", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const Json& m = (*msgs)[i];
    if (!m.is_object()) bad_request("each message must be an object", "messages");
    std::string role = get_string(m, "role");
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      bad_request("messages[" + std::to_string(i) + "].role must be system, developer, user, assistant or tool",
                  "messages");
    }
    const Json* content = field(m, "content");
    std::string text = content ? content_text(*content, i) : "";
    if (const Json* calls = field(m, "tool_calls")) {
      if (role != "assistant" || !calls->is_array()) {
        bad_request("'tool_calls' is an array on assistant messages", "messages");
      }
      const std::string calls_text = tool_calls_as_text(*calls);
      text = text.empty() ? calls_text : text + "\n" + calls_text;
    } else if (!content && role != "assistant") {
      bad_request("messages[" + std::to_string(i) + "] needs 'content'", "messages");
    }
    r.messages.push_back({std::move(role), std::move(text)});
  }
  r.gen = parse_gen(j, facts, true);
  if (const Json* lp = field(j, "logprobs")) {
    if (!lp->is_boolean()) bad_request("'logprobs' must be a boolean", "logprobs");
    r.gen.logprobs = lp->get<bool>();
  }
  r.gen.top_logprobs = static_cast<int32_t>(get_int(j, "top_logprobs", 0, 0, kMaxTopLogprobs));
  if (r.gen.top_logprobs > 0 && !r.gen.logprobs) bad_request("'top_logprobs' needs logprobs: true", "top_logprobs");
  if (const Json* tools = field(j, "tools")) {
    if (!tools->is_array()) bad_request("'tools' must be an array", "tools");
    if (!tools->empty()) r.tools_json = tools->dump();
  }
  if (const Json* tc = field(j, "tool_choice")) {
    if (tc->is_string()) {
      const std::string& s = tc->get_ref<const std::string&>();
      if (s == "auto") {
        r.tool_choice = EMBER_TOOL_CHOICE_AUTO;
      } else if (s == "none") {
        r.tool_choice = EMBER_TOOL_CHOICE_NONE;
      } else if (s == "required") {
        r.tool_choice = EMBER_TOOL_CHOICE_REQUIRED;
      } else {
        bad_request("'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}", "tool_choice");
      }
    } else if (tc->is_object()) {
      const Json* fn = field(*tc, "function");
      if (get_string(*tc, "type") != "function" || !fn || !fn->is_object() || get_string(*fn, "name").empty()) {
        bad_request("'tool_choice' object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    "tool_choice");
      }
      r.tool_choice = EMBER_TOOL_CHOICE_FUNCTION;
      r.tool_name = get_string(*fn, "name");
    } else {
      bad_request("'tool_choice' must be a string or an object", "tool_choice");
    }
    if (r.tools_json.empty() && r.tool_choice != EMBER_TOOL_CHOICE_NONE && r.tool_choice != EMBER_TOOL_CHOICE_AUTO) {
      bad_request("'tool_choice' needs 'tools'", "tool_choice");
    }
  }
  r.parallel_tool_calls = get_bool(j, "parallel_tool_calls", true);
  if (!r.tools_json.empty() && r.tool_choice != EMBER_TOOL_CHOICE_NONE &&
      (r.gen.json_object || !r.gen.json_schema.empty() || !r.gen.grammar.empty())) {
    bad_request("a request that may call tools takes no response_format or grammar (set tool_choice to none)",
                "response_format");
  }
  return r;
}

namespace {

// A list of token ids, each in the vocabulary.
std::vector<int32_t> token_list(const Json& a, const ModelFacts& facts, const char* param) {
  std::vector<int32_t> ids;
  ids.reserve(a.size());
  for (const Json& t : a) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= facts.vocab_size) {
      bad_request(
          std::string("'") + param + "' token ids must be integers in [0, " + std::to_string(facts.vocab_size) + ")",
          param);
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view body, const ModelFacts& facts) {
  const Json j = parse_body(body);
  check_model(j, facts);
  CompletionRequest r;
  const Json* p = field(j, "prompt");
  if (!p) bad_request("'prompt' is required", "prompt");
  // A string, [string], [int...] or [[int...]]: one prompt per request.
  const Json* one = p;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) one = &(*p)[0];
  if (one->is_string()) {
    r.prompt = one->get<std::string>();
  } else if (one->is_array() && !one->empty() && (*one)[0].is_number()) {
    r.tokens = token_list(*one, facts, "prompt");
    r.prompt_is_tokens = true;
  } else {
    bad_request("'prompt' must be a string, a token list, or an array of one of them (one prompt per request)",
                "prompt");
  }
  if (!r.prompt_is_tokens && r.prompt.empty()) bad_request("'prompt' is empty", "prompt");
  if (!get_string(j, "suffix").empty()) bad_request("'suffix' (insertion) is not supported", "suffix");
  if (get_int(j, "best_of", 1, 1, 128) != 1) bad_request("only best_of = 1 is supported", "best_of");
  r.echo = get_bool(j, "echo", false);
  r.gen = parse_gen(j, facts, false);
  // Legacy logprobs: an integer, the number of most likely tokens per position (0-5).
  if (const Json* lp = field(j, "logprobs")) {
    if (!lp->is_number_integer() || lp->get<int64_t>() < 0 || lp->get<int64_t>() > 5) {
      bad_request("'logprobs' must be an integer in [0, 5]", "logprobs");
    }
    r.gen.logprobs = true;
    r.gen.top_logprobs = static_cast<int32_t>(lp->get<int64_t>());
  }
  if (r.echo && r.gen.logprobs) bad_request("echo with logprobs is not supported", "echo");
  return r;
}

EmbeddingRequest parse_embedding_request(std::string_view body, const ModelFacts& facts) {
  const Json j = parse_body(body);
  check_model(j, facts);
  EmbeddingRequest r;
  const Json* in = field(j, "input");
  if (!in) bad_request("'input' is required", "input");
  if (in->is_string()) {
    r.texts.push_back(in->get<std::string>());
  } else if (in->is_array() && !in->empty()) {
    if (in->size() > EMBER_MAX_EMBED_INPUTS) {
      bad_request("at most " + std::to_string(EMBER_MAX_EMBED_INPUTS) + " inputs per request", "input");
    }
    const Json& first = (*in)[0];
    if (first.is_string()) {
      for (const Json& s : *in) {
        if (!s.is_string()) bad_request("'input' must not mix strings and token lists", "input");
        r.texts.push_back(s.get<std::string>());
      }
    } else if (first.is_number()) {
      r.tokens.push_back(token_list(*in, facts, "input"));
    } else if (first.is_array()) {
      for (const Json& t : *in) {
        if (!t.is_array() || t.empty()) bad_request("'input' token lists must be non-empty arrays", "input");
        r.tokens.push_back(token_list(t, facts, "input"));
      }
    } else {
      bad_request("'input' must be a string, an array of strings, or token lists", "input");
    }
    r.inputs_are_tokens = !r.tokens.empty();
  } else {
    bad_request("'input' must be a string, an array of strings, or token lists", "input");
  }
  for (const std::string& t : r.texts) {
    if (t.empty()) bad_request("'input' must not contain empty strings", "input");
  }
  const std::string fmt = get_string(j, "encoding_format", "float");
  if (fmt != "float" && fmt != "base64") bad_request("'encoding_format' must be float or base64", "encoding_format");
  r.base64 = fmt == "base64";
  const int64_t dims = get_int(j, "dimensions", facts.n_embd, 1, std::numeric_limits<int32_t>::max());
  if (dims != facts.n_embd) {
    bad_request("this model's embeddings have " + std::to_string(facts.n_embd) + " dimensions", "dimensions");
  }
  return r;
}

void fill_stream_params(const GenParams& g, ember_stream_params* p, std::vector<const char*>& stop_ptrs) {
  p->max_tokens = g.max_tokens;
  p->temperature = g.temperature;
  p->top_p = g.top_p;
  p->top_k = g.top_k;
  p->min_p = g.min_p;
  p->presence_penalty = g.presence_penalty;
  p->frequency_penalty = g.frequency_penalty;
  p->repeat_penalty = g.repeat_penalty;
  p->ignore_eos = g.ignore_eos ? 1 : 0;
  if (g.seed) p->seed = *g.seed;
  stop_ptrs.clear();
  for (const std::string& s : g.stop) stop_ptrs.push_back(s.c_str());
  stop_ptrs.push_back(nullptr);
  p->stop = g.stop.empty() ? nullptr : stop_ptrs.data();
  p->logit_bias = g.logit_bias.empty() ? nullptr : g.logit_bias.data();
  p->n_logit_bias = g.logit_bias.size();
  p->logprobs = g.logprobs ? 1 : 0;
  p->top_logprobs = g.top_logprobs;
  p->json_object = g.json_object ? 1 : 0;
  p->json_schema = g.json_schema.empty() ? nullptr : g.json_schema.c_str();
  p->grammar = g.grammar.empty() ? nullptr : g.grammar.c_str();
}

std::string base64(const void* data, size_t n) {
  // OpenSSL's encoder (libcrypto, which cpp-httplib links already): 4 chars per 3 bytes, padded, NUL-terminated.
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  const int len = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), static_cast<const unsigned char*>(data),
                                  static_cast<int>(n));
  out.resize(static_cast<size_t>(len));
  return out;
}

}  // namespace ember::server
