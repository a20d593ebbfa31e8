// libFuzzer target: the HTTP server's request checks (apps/server/api.h), the
// code every body sent to `ember serve` goes through before the engine sees it.
//
// Input: byte 0 picks the endpoint (mod 3: chat, completions, embeddings);
// the rest is the request body.
//
// Promises checked: a body is either accepted or refused with an ApiError of
// status 400 or 404 (never another exception, a crash or a hang, whatever the
// nesting or the bytes); the error's JSON always serialises; an accepted chat
// or completion request gives stream parameters the C ABI's limits allow
// (stop list NULL-terminated and within EMBER_MAX_STOP_STRINGS, logit bias
// ids inside the vocabulary, top_logprobs 0..20, max_tokens within the
// context), and an accepted embedding request inputs inside the vocabulary.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "apps/server/api.h"
#include "fuzz_util.h"

namespace ember::fuzz {
namespace {

using namespace ember::server;

ModelFacts facts() {
  ModelFacts f;
  f.id = "smol";
  f.vocab_size = 49152;
  f.context_length = 8192;
  f.n_embd = 576;
  return f;
}

std::string input(char endpoint, std::string_view body) { return std::string(1, endpoint) + std::string(body); }

void write_seeds(const std::string& dir) {
  write_seed(dir, "chat", input(0, R"({"model": "smol", "messages": [{"role": "system", "content": "x"},
    {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 9, "temperature": 0.2,
    "top_p": 0.9, "stop": ["a", "b"], "seed": 3, "logit_bias": {"12": -100}, "logprobs": true, "top_logprobs": 2,
    "stream": true, "stream_options": {"include_usage": true}})"));
  write_seed(dir, "schema", input(0, R"({"messages": [{"role": "user", "content": "p"}], "response_format":
    {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}})"));
  write_seed(dir, "tools", input(0, R"({"messages": [{"role": "user", "content": "w"}, {"role": "assistant",
    "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments":
    "{\"a\": 1}"}}]}, {"role": "tool", "content": "2"}], "tools": [{"type": "function", "function": {"name": "f",
    "parameters": {"type": "object"}}}], "tool_choice": {"type": "function", "function": {"name": "f"}}})"));
  write_seed(dir, "completion", input(1, R"({"prompt": "The", "max_tokens": 4, "logprobs": 2, "echo": false})"));
  write_seed(dir, "completion_tokens", input(1, R"({"prompt": [[1, 2, 3]], "stream": true})"));
  write_seed(dir, "embeddings", input(2, R"({"input": ["a", "b"], "encoding_format": "base64"})"));
  write_seed(dir, "embedding_tokens", input(2, R"({"input": [[1, 2], [3]], "dimensions": 576})"));
}

void check_gen(const GenParams& g, const ModelFacts& f) {
  ember_stream_params p{};
  p.size = sizeof(p);
  std::vector<const char*> stops;
  fill_stream_params(g, &p, stops);
  EMBER_FUZZ_CHECK(p.max_tokens >= 0 && p.max_tokens <= f.context_length);
  size_t n_stop = 0;
  if (p.stop) {
    while (p.stop[n_stop]) ++n_stop;
  }
  EMBER_FUZZ_CHECK(n_stop == g.stop.size() && n_stop <= EMBER_MAX_STOP_STRINGS);
  EMBER_FUZZ_CHECK(p.n_logit_bias == g.logit_bias.size());
  for (size_t i = 0; i < p.n_logit_bias; ++i) {
    EMBER_FUZZ_CHECK(p.logit_bias[i].token >= 0 && p.logit_bias[i].token < f.vocab_size);
  }
  EMBER_FUZZ_CHECK(p.top_logprobs >= 0 && p.top_logprobs <= kMaxTopLogprobs);
  EMBER_FUZZ_CHECK((p.json_schema != nullptr) + (p.grammar != nullptr) + (p.json_object != 0) <= 1);
}

}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ember::fuzz::write_seeds_if_asked(ember::fuzz::write_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember::server;
  if (size < 1) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const ModelFacts f = ember::fuzz::facts();
  try {
    switch (data[0] % 3) {
      case 0: {
        const ChatRequest r = parse_chat_request(body, f);
        EMBER_FUZZ_CHECK(!r.messages.empty() && r.messages.size() <= kMaxMessages);
        ember::fuzz::check_gen(r.gen, f);
        break;
      }
      case 1: {
        const CompletionRequest r = parse_completion_request(body, f);
        EMBER_FUZZ_CHECK(r.prompt_is_tokens ? !r.tokens.empty() : !r.prompt.empty());
        for (int32_t t : r.tokens) EMBER_FUZZ_CHECK(t >= 0 && t < f.vocab_size);
        ember::fuzz::check_gen(r.gen, f);
        break;
      }
      default: {
        const EmbeddingRequest r = parse_embedding_request(body, f);
        EMBER_FUZZ_CHECK(r.inputs_are_tokens ? !r.tokens.empty() : !r.texts.empty());
        for (const auto& list : r.tokens) {
          EMBER_FUZZ_CHECK(!list.empty());
          for (int32_t t : list) EMBER_FUZZ_CHECK(t >= 0 && t < f.vocab_size);
        }
        break;
      }
    }
  } catch (const ApiError& e) {
    EMBER_FUZZ_CHECK(e.status == 400 || e.status == 404);
    EMBER_FUZZ_CHECK(!std::string(e.what()).empty());
    const std::string s = error_json(e).dump(-1, ' ', false, Json::error_handler_t::replace);
    EMBER_FUZZ_CHECK(!s.empty());
  }
  return 0;
}
