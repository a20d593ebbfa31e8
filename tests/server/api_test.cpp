// The OpenAI requests `ember serve` accepts (apps/server/api.h), without an
// engine: what each field becomes, and the error (status, param) for each
// kind of bad input.
#include "apps/server/api.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace ember::server {
namespace {

ModelFacts facts() {
  ModelFacts f;
  f.id = "smol";
  f.vocab_size = 1000;
  f.context_length = 2048;
  f.n_embd = 64;
  return f;
}

// The ApiError a body gets from `parse` (status 0 when it is accepted).
template <typename Parse>
ApiError error_of(Parse parse, const std::string& body) {
  try {
    parse(body, facts());
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "", "accepted");
}

ApiError chat_error(const std::string& body) { return error_of(parse_chat_request, body); }

const std::string kUser = R"("messages": [{"role": "user", "content": "hi"}])";

TEST(ServerApi, ChatFieldsBecomeStreamParameters) {
  const ChatRequest r = parse_chat_request(
      R"({"model": "smol", "messages": [{"role": "developer", "content": "be brief"},
          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": -1, "stop": "END",
          "logit_bias": {"5": -100, "6": 2.5}, "logprobs": true, "top_logprobs": 3, "stream": true,
          "stream_options": {"include_usage": true}, "top_k": 20, "min_p": 0.1})",
      facts());
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.gen.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.gen.temperature, 0.5f);
  EXPECT_EQ(*r.gen.seed, ~uint64_t{0});
  ASSERT_EQ(r.gen.stop.size(), 1u);
  ASSERT_EQ(r.gen.logit_bias.size(), 2u);
  EXPECT_TRUE(std::isinf(r.gen.logit_bias[0].bias) && r.gen.logit_bias[0].bias < 0);  // -100 bans
  EXPECT_TRUE(r.gen.include_usage);

  ember_stream_params p;
  ember_stream_params_init(&p);
  std::vector<const char*> stops;
  fill_stream_params(r.gen, &p, stops);
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_STREQ(p.stop[0], "END");
  EXPECT_EQ(p.stop[1], nullptr);
  EXPECT_EQ(p.n_logit_bias, 2u);
  EXPECT_EQ(p.top_logprobs, 3);
}

TEST(ServerApi, OpenAIDefaultsNotTheEngines) {
  const ChatRequest r = parse_chat_request("{" + kUser + "}", facts());
  EXPECT_FLOAT_EQ(r.gen.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.gen.top_p, 1.0f);
  EXPECT_EQ(r.gen.top_k, 0);
  EXPECT_FLOAT_EQ(r.gen.min_p, 0.0f);
  EXPECT_FALSE(r.gen.seed.has_value());
}

TEST(ServerApi, AssistantToolCallsAreWrittenBackAsTheModelWritesThem) {
  const ChatRequest r = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "w?"}, {"role": "assistant", "content": null, "tool_calls":
          [{"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Paris\"}"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "21"}],
          "tools": [{"type": "function", "function": {"name": "get"}}], "tool_choice": {"type": "function",
          "function": {"name": "get"}}})",
      facts());
  EXPECT_EQ(r.messages[1].content,
            "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.tool_choice, EMBER_TOOL_CHOICE_FUNCTION);
  EXPECT_EQ(r.tool_name, "get");
}

TEST(ServerApi, BadChatRequestsName400AndTheField) {
  const struct {
    std::string body, param;
  } cases[] = {
      {"not json", ""},
      {"[1]", ""},
      {"{}", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "user"}]})", "messages"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages"},
      {R"({"messages": [{"role": 3, "content": "x"}]})", "role"},
      {"{" + kUser + R"(, "max_tokens": 0})", "max_tokens"},
      {"{" + kUser + R"(, "max_tokens": 99999999999999999999})", "max_tokens"},
      {"{" + kUser + R"(, "max_tokens": 2.5})", "max_tokens"},
      {"{" + kUser + R"(, "temperature": "hot"})", "temperature"},
      {"{" + kUser + R"(, "temperature": 2.5})", "temperature"},
      {"{" + kUser + R"(, "top_p": 0})", "top_p"},
      {"{" + kUser + R"(, "n": 3})", "n"},
      {"{" + kUser + R"(, "stop": [1]})", "stop"},
      {"{" + kUser + R"(, "stop": ""})", "stop"},
      {"{" + kUser + R"(, "logit_bias": {"1000": 1}})", "logit_bias"},
      {"{" + kUser + R"(, "logit_bias": {"7x": 1}})", "logit_bias"},
      {"{" + kUser + R"(, "logit_bias": {"7": 101}})", "logit_bias"},
      {"{" + kUser + R"(, "top_logprobs": 3})", "top_logprobs"},
      {"{" + kUser + R"(, "top_logprobs": 21, "logprobs": true})", "top_logprobs"},
      {"{" + kUser + R"(, "stream_options": {"include_usage": true}})", "stream_options"},
      {"{" + kUser + R"(, "response_format": {"type": "yaml"}})", "response_format"},
      {"{" + kUser + R"(, "response_format": {"type": "json_schema"}})", "response_format"},
      {"{" + kUser + R"(, "tool_choice": "required"})", "tool_choice"},
      {"{" + kUser + R"(, "tools": {}})", "tools"},
      {"{" + kUser +
           R"(, "tools": [{"type": "function", "function": {"name": "f"}}], "response_format": {"type": "json_object"}})",
       "response_format"},
  };
  for (const auto& c : cases) {
    const ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    if (c.param != "role") {
      EXPECT_EQ(e.param, c.param) << c.body;
    }
  }
}

TEST(ServerApi, DeepNestingIsRefusedBeforeItIsBuilt) {
  const std::string deep = "{\"messages\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const ApiError e = chat_error(deep);
  EXPECT_EQ(e.status, 400);
  EXPECT_NE(std::string(e.what()).find("nests"), std::string::npos);
}

TEST(ServerApi, InvalidUtf8IsRefused) {
  EXPECT_EQ(chat_error("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}").status, 400);
}

TEST(ServerApi, AnotherModelIs404) {
  const ApiError e = chat_error(R"({"model": "gpt-4", )" + kUser + "}");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  const Json body = error_json(e);
  EXPECT_EQ(body["error"]["param"], "model");
}

TEST(ServerApi, CompletionPrompts) {
  EXPECT_EQ(parse_completion_request(R"({"prompt": "abc"})", facts()).prompt, "abc");
  EXPECT_EQ(parse_completion_request(R"({"prompt": ["abc"]})", facts()).prompt, "abc");
  const CompletionRequest t = parse_completion_request(R"({"prompt": [1, 2, 3], "logprobs": 2})", facts());
  EXPECT_TRUE(t.prompt_is_tokens);
  EXPECT_EQ(t.tokens.size(), 3u);
  EXPECT_TRUE(t.gen.logprobs);
  EXPECT_EQ(t.gen.top_logprobs, 2);
  EXPECT_TRUE(parse_completion_request(R"({"prompt": [[4, 5]]})", facts()).prompt_is_tokens);
  for (const char* bad : {R"({})", R"({"prompt": ""})", R"({"prompt": ["a", "b"]})", R"({"prompt": [1000]})",
                          R"({"prompt": [-1]})", R"({"prompt": "a", "logprobs": 6})", R"({"prompt": 5})",
                          R"({"prompt": "a", "suffix": "b"})", R"({"prompt": "a", "best_of": 2})"}) {
    EXPECT_EQ(error_of(parse_completion_request, bad).status, 400) << bad;
  }
}

TEST(ServerApi, EmbeddingInputs) {
  EXPECT_EQ(parse_embedding_request(R"({"input": "a"})", facts()).texts.size(), 1u);
  EXPECT_EQ(parse_embedding_request(R"({"input": ["a", "b"]})", facts()).texts.size(), 2u);
  EXPECT_EQ(parse_embedding_request(R"({"input": [1, 2]})", facts()).tokens.size(), 1u);
  EXPECT_EQ(parse_embedding_request(R"({"input": [[1], [2, 3]]})", facts()).tokens.size(), 2u);
  EXPECT_TRUE(parse_embedding_request(R"({"input": "a", "encoding_format": "base64"})", facts()).base64);
  EXPECT_EQ(parse_embedding_request(R"({"input": "a", "dimensions": 64})", facts()).texts.size(), 1u);
  for (const char* bad : {R"({})", R"({"input": ""})", R"({"input": []})", R"({"input": ["a", 1]})",
                          R"({"input": [[]]})", R"({"input": [5000]})", R"({"input": "a", "dimensions": 32})",
                          R"({"input": "a", "encoding_format": "int8"})"}) {
    EXPECT_EQ(error_of(parse_embedding_request, bad).status, 400) << bad;
  }
}

TEST(ServerApi, Base64) {
  EXPECT_EQ(base64("", 0), "");
  EXPECT_EQ(base64("f", 1), "Zg==");
  EXPECT_EQ(base64("fo", 2), "Zm8=");
  EXPECT_EQ(base64("foobar", 6), "Zm9vYmFy");
}

}  // namespace
}  // namespace ember::server
