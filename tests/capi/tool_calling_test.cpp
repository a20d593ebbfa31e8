// Tool calling through the C ABI (since 1.4): ember_session_set_tools, the
// stream's tool_choice, TOOL_CALL events whose arguments validate against the
// tool's schema, a tool's result sent back, and what bad input gets. The
// default model (SmolLM2) has a template without tools: the generic format.
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdio>
#include <string>

#include "capi/capi_test_util.h"

using namespace capi_test;
using Json = nlohmann::json;

namespace {

const char* kTools = R"([
 {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
  "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
   "required": ["city", "unit"]}}},
 {"type": "function", "function": {"name": "move_to", "description": "Walk to a point",
  "parameters": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -50, "maximum": 50},
   "y": {"type": "integer", "minimum": -50, "maximum": 50}}, "required": ["x", "y"]}}}
])";

// The checks the schemas above ask for.
void expect_valid_call(const CollectedCall& c) {
  const Json args = Json::parse(c.arguments, nullptr, false);
  ASSERT_FALSE(args.is_discarded()) << c.arguments;
  ASSERT_TRUE(args.is_object()) << c.arguments;
  if (c.name == "get_weather") {
    ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << c.arguments;
    EXPECT_LE(args["city"].get<std::string>().size(), 24u) << c.arguments;
    ASSERT_TRUE(args.contains("unit")) << c.arguments;
    EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << c.arguments;
  } else {
    ASSERT_EQ(c.name, "move_to");
    ASSERT_TRUE(args.contains("x") && args["x"].is_number_integer()) << c.arguments;
    ASSERT_TRUE(args.contains("y") && args["y"].is_number_integer()) << c.arguments;
    EXPECT_LE(std::abs(args["x"].get<int64_t>()), 50) << c.arguments;
  }
  EXPECT_EQ(c.id.rfind("call_", 0), 0u) << c.id;
}

SessionPtr tool_session(ember_engine* engine, const char* user) {
  SessionPtr s = make_session(engine);
  EXPECT_EQ(ember_session_set_tools(s.get(), kTools), EMBER_OK) << ember_last_error();
  EXPECT_EQ(ember_session_add_message(s.get(), "user", user), EMBER_OK) << ember_last_error();
  return s;
}

}  // namespace

TEST(CapiToolCalling, NamedToolGivesOneValidCallThenEnds) {
  CAPI_REQUIRE_MODEL(model);
  if (!structured_output()) GTEST_SKIP() << "built without the grammar engine";
  EnginePtr engine = make_engine(model);
  SessionPtr s = tool_session(engine.get(), "What is the weather like in Paris right now?");
  ember_stream_params p = greedy_params(96);
  p.tool_choice = EMBER_TOOL_CHOICE_FUNCTION;
  p.tool_name = "get_weather";
  const Collected c = run(s.get(), p);
  ASSERT_EQ(c.calls.size(), 1u) << c.text;
  EXPECT_EQ(c.calls[0].name, "get_weather");
  expect_valid_call(c.calls[0]);
  EXPECT_EQ(c.text, "");  // the call's text is not sent as text
  EXPECT_EQ(c.end_reason, EMBER_END_EOS);
  EXPECT_FALSE(c.tokens.empty());

  // The result goes back as a "tool" message; the next turn is free text.
  const size_t before = token_count(s.get());
  ASSERT_OK(ember_session_add_message(s.get(), "tool", R"({"temperature": 21, "sky": "clear"})"));
  ember_stream_params q = greedy_params(24);
  q.tool_choice = EMBER_TOOL_CHOICE_NONE;
  const Collected reply = run(s.get(), q);
  EXPECT_TRUE(reply.calls.empty());
  EXPECT_FALSE(reply.text.empty());
  EXPECT_GT(token_count(s.get()), before);
}

TEST(CapiToolCalling, RequiredGivesACallOfSomeToolSampledOrGreedy) {
  CAPI_REQUIRE_MODEL(model);
  if (!structured_output()) GTEST_SKIP() << "built without the grammar engine";
  EnginePtr engine = make_engine(model);
  const char* prompts[] = {"Go to the point (3, -4).", "Is it raining in Oslo?", "Walk north ten steps."};
  for (int k = 0; k < 6; ++k) {
    SessionPtr s = tool_session(engine.get(), prompts[k % 3]);
    ember_stream_params p = k < 3 ? greedy_params(128) : sampled_params(128, 100 + k);
    p.tool_choice = EMBER_TOOL_CHOICE_REQUIRED;
    p.parallel_tool_calls = 0;
    const Collected c = run(s.get(), p);
    ASSERT_EQ(c.calls.size(), 1u) << k << ": " << c.text;
    expect_valid_call(c.calls[0]);
    EXPECT_EQ(c.end_reason, EMBER_END_EOS) << k;
  }
}

TEST(CapiToolCalling, AutoReportsWhateverCallsTheModelMakes) {
  CAPI_REQUIRE_MODEL(model);
  if (!structured_output()) GTEST_SKIP() << "built without the grammar engine";
  EnginePtr engine = make_engine(model);
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    SessionPtr s = tool_session(engine.get(), "What is the weather in Rome? Use a tool if you need one.");
    const Collected c = run(s.get(), sampled_params(96, seed));
    EXPECT_TRUE(c.ended);
    for (const auto& call : c.calls) expect_valid_call(call);
    // A call's text never leaks into the text events.
    EXPECT_EQ(c.text.find("</tool_call>"), std::string::npos) << c.text;
  }
}

TEST(CapiToolCalling, SpeculativeGreedyEqualsPlainGreedy) {
  CAPI_REQUIRE_MODEL(model);
  if (!structured_output()) GTEST_SKIP() << "built without the grammar engine";
  EnginePtr engine = make_engine(model);
  ember_stream_params p = greedy_params(96);
  p.tool_choice = EMBER_TOOL_CHOICE_FUNCTION;
  p.tool_name = "move_to";
  SessionPtr a = tool_session(engine.get(), "Walk to x 7, y 9.");
  const Collected plain = run(a.get(), p);
  p.spec_drafter = EMBER_SPEC_NGRAM;
  SessionPtr b = tool_session(engine.get(), "Walk to x 7, y 9.");
  const Collected spec = run(b.get(), p);
  ASSERT_EQ(plain.calls.size(), 1u);
  ASSERT_EQ(spec.calls.size(), 1u);
  EXPECT_EQ(spec.calls[0].arguments, plain.calls[0].arguments);
  EXPECT_EQ(spec.tokens, plain.tokens);
}

TEST(CapiToolCalling, BadToolsAndChoicesAreClearErrors) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  EXPECT_EQ(ember_session_set_tools(nullptr, kTools), EMBER_ERR_INVALID_ARGUMENT);
  SessionPtr s = make_session(engine.get());
  for (const char* bad : {"nope", "{}", R"([{"function": {"name": "a b"}}])", "[\"\xff\"]",
                          R"([{"function": {"name": "a"}}, {"function": {"name": "a"}}])"}) {
    EXPECT_EQ(ember_session_set_tools(s.get(), bad), EMBER_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_STRNE(ember_last_error(), "");
  }
  std::string deep(300, '[');
  EXPECT_STATUS(ember_session_set_tools(s.get(), deep.c_str()), EMBER_ERR_INVALID_ARGUMENT);
  ASSERT_OK(ember_session_add_message(s.get(), "user", "Hi"));
  auto start_fails = [&](const ember_stream_params& p, ember_status want) {
    ember_stream* stream = nullptr;
    EXPECT_STATUS(ember_stream_start(s.get(), &p, &stream), want);
    EXPECT_EQ(stream, nullptr);
  };
  ember_stream_params p = greedy_params(8);
  p.tool_choice = EMBER_TOOL_CHOICE_REQUIRED;  // no tools yet
  start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
  p.tool_choice = 9;
  start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
  p = greedy_params(8);
  p.parallel_tool_calls = 2;
  start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
  p = greedy_params(8);
  p.tool_choice = EMBER_TOOL_CHOICE_FUNCTION;  // no tool_name
  start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
  ASSERT_OK(ember_session_set_tools(s.get(), kTools));
  if (structured_output()) {
    p.tool_name = "launch_rockets";
    start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
    p = greedy_params(8);
    p.json_schema = R"({"type": "object"})";  // tools and a response constraint at once
    start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
  }
  // The session is still usable; NONE lifts the tool constraint.
  p = greedy_params(4);
  p.tool_choice = EMBER_TOOL_CHOICE_NONE;
  const Collected c = run(s.get(), p);
  EXPECT_TRUE(c.ended);
  EXPECT_EQ(c.error, EMBER_OK);
  // Clearing the tools; raw-text sessions take none.
  ASSERT_OK(ember_session_set_tools(s.get(), nullptr));
  SessionPtr text = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(text.get(), "Once upon a time", 0));
  EXPECT_STATUS(ember_session_set_tools(text.get(), kTools), EMBER_ERR_INVALID_ARGUMENT);
}

TEST(CapiToolCalling, SessionFileKeepsToolsAndCallNumbers) {
  CAPI_REQUIRE_MODEL(model);
  if (!structured_output()) GTEST_SKIP() << "built without the grammar engine";
  EnginePtr engine = make_engine(model);
  SessionPtr s = tool_session(engine.get(), "Walk to x 1, y 2.");
  ember_stream_params p = greedy_params(96);
  p.tool_choice = EMBER_TOOL_CHOICE_FUNCTION;
  p.tool_name = "move_to";
  const Collected first = run(s.get(), p);
  ASSERT_EQ(first.calls.size(), 1u);
  EXPECT_EQ(first.calls[0].id, "call_1");
  ASSERT_OK(ember_session_add_message(s.get(), "tool", "arrived"));
  const std::string path = ::testing::TempDir() + "/ember_tools_session_" + std::to_string(::getpid()) + ".ems";
  ASSERT_OK(ember_session_save(s.get(), path.c_str()));
  ember_session* raw = nullptr;
  ASSERT_OK(ember_session_load(engine.get(), path.c_str(), nullptr, &raw));
  SessionPtr loaded(raw);
  std::remove(path.c_str());
  // The loaded session has the tools (a named call works) and numbers on.
  ASSERT_OK(ember_session_add_message(loaded.get(), "user", "Now walk to x 5, y 6."));
  const Collected second = run(loaded.get(), p);
  ASSERT_EQ(second.calls.size(), 1u);
  EXPECT_EQ(second.calls[0].id, "call_2");
  expect_valid_call(second.calls[0]);
  // And a schema-constrained turn after the restore.
  ASSERT_OK(ember_session_add_message(loaded.get(), "user", "Where are you now? Answer in JSON."));
  ember_stream_params j = greedy_params(48);
  j.tool_choice = EMBER_TOOL_CHOICE_NONE;
  j.json_schema = R"({"type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99}}, "required": ["x"]})";
  const Collected third = run(loaded.get(), j);
  const Json v = Json::parse(third.text, nullptr, false);
  ASSERT_TRUE(v.is_object() && v.contains("x") && v["x"].is_number_integer()) << third.text;
}
