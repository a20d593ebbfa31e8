// Structured output through the C ABI (ember_stream_params since 1.3): each
// constraint kind, the capability flag, and what bad input gets.
#include <regex>
#include <string>

#include "capi/capi_test_util.h"

using namespace capi_test;

TEST(CapiStructuredOutput, EveryKindThroughTheCAbi) {
  CAPI_REQUIRE_MODEL(model);
  if (!structured_output()) GTEST_SKIP() << "built without the grammar engine";
  EnginePtr engine = make_engine(model);
  auto ask = [&](const char* user, const ember_stream_params& p) {
    SessionPtr s = make_session(engine.get());
    EXPECT_EQ(ember_session_add_message(s.get(), "user", user), EMBER_OK) << ember_last_error();
    return run(s.get(), p);
  };
  ember_stream_params p = greedy_params(64);
  p.json_schema = R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                      "required": ["city"]})";
  const Collected j = ask("Which city is the capital of France? Answer in JSON.", p);
  EXPECT_EQ(j.end_reason, EMBER_END_EOS) << j.text;
  EXPECT_TRUE(std::regex_match(j.text, std::regex(R"(\{"city": "[^"]*"\})"))) << j.text;

  p = greedy_params(16);
  p.regex = "(yes|no)";
  const Collected r = ask("Is water wet?", p);
  EXPECT_TRUE(r.text == "yes" || r.text == "no") << r.text;
  EXPECT_EQ(r.end_reason, EMBER_END_EOS);

  p = greedy_params(16);
  p.grammar = "root ::= [0-9] [0-9]?";
  const Collected g = ask("How many legs does a spider have?", p);
  EXPECT_TRUE(std::regex_match(g.text, std::regex("[0-9]{1,2}"))) << g.text;

  p = greedy_params(16);
  const char* choices[] = {"north", "south", "east", "west", nullptr};
  p.choices = choices;
  const Collected c = ask("Where does the sun rise?", p);
  EXPECT_TRUE(c.text == "north" || c.text == "south" || c.text == "east" || c.text == "west") << c.text;

  p = greedy_params(48);
  p.json_object = 1;
  const Collected o = ask("Give a JSON object with one key.", p);
  ASSERT_FALSE(o.text.empty());
  EXPECT_EQ(o.text[0], '{') << o.text;
}

TEST(CapiStructuredOutput, BadConstraintsAreInvalidArgument) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr s = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(s.get(), "user", "Hi"));
  const bool have = structured_output();
  auto start_fails = [&](const ember_stream_params& p, ember_status want) {
    ember_stream* stream = nullptr;
    EXPECT_STATUS(ember_stream_start(s.get(), &p, &stream), want);
    EXPECT_EQ(stream, nullptr);
    EXPECT_STRNE(ember_last_error(), "");
  };
  ember_stream_params p = greedy_params(8);
  p.json_schema = "{}";
  p.regex = "a";
  start_fails(p, EMBER_ERR_INVALID_ARGUMENT);  // two at once
  p = greedy_params(8);
  p.json_object = 2;
  start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
  p = greedy_params(8);
  const char* empty[] = {nullptr};
  p.choices = empty;
  start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
  p = greedy_params(8);
  p.grammar = "root ::= (";
  start_fails(p, have ? EMBER_ERR_INVALID_ARGUMENT : EMBER_ERR_UNSUPPORTED);
  p = greedy_params(8);
  p.json_schema = "\xff not UTF-8";
  start_fails(p, EMBER_ERR_INVALID_ARGUMENT);
  // The session is untouched: a plain stream runs.
  const Collected ok = run(s.get(), greedy_params(4));
  EXPECT_FALSE(ok.tokens.empty());
}

// A caller built against 1.2 (a smaller struct) gets no constraint.
TEST(CapiStructuredOutput, OlderStructsHaveNoConstraint) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr s = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(s.get(), "Once upon a time", 0));
  ember_stream_params p = greedy_params(8);
  p.regex = "(";  // past the 1.2 size: never read
  p.size = offsetof(ember_stream_params, json_schema);
  const Collected r = run(s.get(), p);
  EXPECT_EQ(r.end_reason, EMBER_END_MAX_TOKENS);
}
