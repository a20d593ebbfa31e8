// The OpenAI HTTP API's requests, checked: what `ember serve` accepts on
// /v1/chat/completions, /v1/completions and /v1/embeddings, parsed from the
// request body (nlohmann-json) into plain structs, every field's type and
// range checked, each problem an ApiError naming the field, with the status
// and error type OpenAI's API gives for it. No engine is needed (the fuzz
// target tests/fuzz/fuzz_server.cpp drives these functions alone).
//
// Parameters follow OpenAI's meaning and defaults (temperature 1, top_p 1, no
// top-k or min-p, max_tokens up to the context); extensions that llama.cpp's
// server also takes: top_k, min_p, repeat_penalty, ignore_eos, grammar (GBNF).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ember/ember.h"

namespace ember::server {

using Json = nlohmann::json;

// An error as OpenAI's API reports it: HTTP status, then the body
// {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = "", std::string code = "")
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;   // invalid_request_error, authentication_error, server_error, ...
  std::string param;  // the request field at fault ("" = none)
  std::string code;   // e.g. model_not_found, context_length_exceeded ("" = none)
};

// {"error": {...}} for `e` (param and code null when empty).
Json error_json(const ApiError& e);
// 400 invalid_request_error about `param`.
[[noreturn]] void bad_request(const std::string& message, const std::string& param = "");

// What the checks need to know about the served model.
struct ModelFacts {
  std::string id;  // the name clients give as "model"
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  int32_t n_embd = 0;
};

// The limits a request is held to (beyond the C ABI's own).
inline constexpr int kMaxJsonDepth = 64;      // nesting of the request body
inline constexpr size_t kMaxMessages = 4096;  // chat messages per request
inline constexpr int kMaxTopLogprobs = 20;

// Sampling and output parameters shared by chat and completions.
struct GenParams {
  int32_t max_tokens = 0;  // 0 = until the context is full
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repeat_penalty = 1.0f;
  std::optional<uint64_t> seed;  // none: a fresh one per request
  std::vector<std::string> stop;
  std::vector<ember_logit_bias> logit_bias;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool ignore_eos = false;
  // Structured output (at most one).
  bool json_object = false;
  std::string json_schema;
  std::string grammar;
  // Streaming.
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

struct ChatMessage {
  std::string role;  // system, user, assistant, tool ("developer" becomes system)
  std::string content;
};

struct ChatRequest {
  GenParams gen;
  std::vector<ChatMessage> messages;
  std::string tools_json;  // the `tools` array as JSON text ("" = none)
  int32_t tool_choice = EMBER_TOOL_CHOICE_AUTO;
  std::string tool_name;  // tool_choice FUNCTION
  bool parallel_tool_calls = true;
};

struct CompletionRequest {
  GenParams gen;
  std::string prompt;           // text prompt, or
  std::vector<int32_t> tokens;  // a prompt of token ids (when prompt_is_tokens)
  bool prompt_is_tokens = false;
  bool echo = false;  // the prompt's text is prepended to the reply
};

struct EmbeddingRequest {
  std::vector<std::string> texts;            // inputs as text, or
  std::vector<std::vector<int32_t>> tokens;  // as token ids (inputs_are_tokens)
  bool inputs_are_tokens = false;
  bool base64 = false;  // encoding_format "base64": little-endian float32, base64
};

// Parses `body` (a JSON object) into a request; throws ApiError (400 for
// malformed JSON or a bad field, 404 for a model other than facts.id).
ChatRequest parse_chat_request(std::string_view body, const ModelFacts& facts);
CompletionRequest parse_completion_request(std::string_view body, const ModelFacts& facts);
EmbeddingRequest parse_embedding_request(std::string_view body, const ModelFacts& facts);

// The C ABI's stream parameters for `gen`; pointers in *out refer into `gen`
// and `stop_ptrs` (which must outlive the stream's start).
void fill_stream_params(const GenParams& gen, ember_stream_params* out, std::vector<const char*>& stop_ptrs);

// An assistant message's tool calls as the text a Hermes-format model writes
// for them (what Ember's tool prompt asks for), for history sent back by a
// client: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>.
std::string tool_calls_as_text(const Json& tool_calls);

// Base64 (RFC 4648, padded) of `n` bytes.
std::string base64(const void* data, size_t n);

}  // namespace ember::server
