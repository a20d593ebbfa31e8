// core/chat/tools: the tool list's checks, the family of a template, the
// constraint a reply is held to, the messages a generic template gets, and
// the parser that finds calls in a streamed reply.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/chat/tools.h"
#include "core/util/status.h"

namespace ember::chat {
namespace {

const char* kTools = R"([
 {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
 {"type": "function", "function": {"name": "wave"}}
])";

StatusCode code_of(const std::string& json) {
  try {
    parse_tools(json);
  } catch (const Error& e) {
    return e.code();
  }
  return StatusCode::kOk;
}

TEST(Tools, ParsesAnOpenAiToolList) {
  auto set = parse_tools(kTools);
  ASSERT_EQ(set->tools.size(), 2u);
  EXPECT_EQ(set->tools[0].name, "get_weather");
  EXPECT_EQ(set->tools[0].description, "Weather in a city");
  EXPECT_NE(set->tools[0].parameters.find("\"city\""), std::string::npos);
  EXPECT_EQ(set->tools[1].name, "wave");
  EXPECT_EQ(set->tools[1].parameters, "");
  EXPECT_EQ(set->json, kTools);
  EXPECT_NE(set->find("wave"), nullptr);
  EXPECT_EQ(set->find("nope"), nullptr);
}

TEST(Tools, RefusesBadListsWithInvalidArgument) {
  for (const std::string& bad : {
           std::string("not json"), std::string("{}"), std::string("[1]"), std::string("[{}]"),
           std::string(R"([{"type": "retrieval", "function": {"name": "a"}}])"),
           std::string(R"([{"function": {"name": ""}}])"), std::string(R"([{"function": {"name": "a b"}}])"),
           std::string(R"([{"function": {"name": "a"}}, {"function": {"name": "a"}}])"),
           std::string(R"([{"function": {"name": "a", "parameters": 3}}])"),
           std::string(R"([{"function": {"name": "a", "description": 3}}])"), std::string("[\"\xff\"]"),
           std::string(200, '[') + std::string(200, ']'), std::string(ToolSet::kMaxJsonBytes + 1, ' ')}) {
    EXPECT_EQ(code_of(bad), StatusCode::kInvalidArgument) << bad.substr(0, 80);
  }
  std::string many = "[";
  for (size_t i = 0; i <= ToolSet::kMaxTools; ++i)
    many += (i ? "," : "") + std::string(R"({"function": {"name": "t)") + std::to_string(i) + "\"}}";
  EXPECT_EQ(code_of(many + "]"), StatusCode::kInvalidArgument);
  try {
    parse_tools(R"([{"function": {"name": "a"}}, {"function": {"name": "a"}}])");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two tools are named \"a\""), std::string::npos) << e.what();
  }
}

TEST(Tools, DetectsTheFamilyFromTheTemplate) {
  EXPECT_EQ(detect_tool_format("{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>"), ToolFormat::kHermes);
  EXPECT_EQ(detect_tool_format("<|start_header_id|>ipython<|end_header_id|>"), ToolFormat::kLlama3);
  EXPECT_EQ(detect_tool_format("{{ '<|python_tag|>' }}"), ToolFormat::kLlama3);
  EXPECT_EQ(detect_tool_format("<|im_start|>{{ message.role }}"), ToolFormat::kGeneric);
}

TEST(Tools, ConstraintIsATriggeredStructuralTag) {
  auto set = parse_tools(kTools);
  ToolChoice auto_choice;
  const std::string c = tool_constraint(*set, ToolFormat::kHermes, auto_choice);
  EXPECT_NE(c.find("\"type\":\"structural_tag\""), std::string::npos) << c;
  EXPECT_NE(c.find("\"triggered_tags\""), std::string::npos) << c;
  EXPECT_NE(c.find("\"triggers\":[\"<tool_call>\"]"), std::string::npos) << c;
  EXPECT_NE(c.find(R"(<tool_call>\n{\"name\": \"get_weather\", \"arguments\": )"), std::string::npos) << c;
  EXPECT_NE(c.find("\"at_least_one\":false"), std::string::npos) << c;
  EXPECT_NE(c.find("\"stop_after_first\":false"), std::string::npos) << c;

  ToolChoice required;
  required.mode = ToolChoice::Mode::kRequired;
  required.parallel = false;
  const std::string r = tool_constraint(*set, ToolFormat::kLlama3, required);
  EXPECT_NE(r.find("\"at_least_one\":true"), std::string::npos) << r;
  EXPECT_NE(r.find("\"stop_after_first\":true"), std::string::npos) << r;
  EXPECT_NE(r.find(R"({\"name\": \"wave\", \"parameters\": )"), std::string::npos) << r;

  ToolChoice named;
  named.mode = ToolChoice::Mode::kFunction;
  named.name = "wave";
  const std::string n = tool_constraint(*set, ToolFormat::kGeneric, named);
  EXPECT_EQ(n.find("triggered_tags"), std::string::npos) << n;
  EXPECT_NE(n.find("\"type\":\"tag\""), std::string::npos) << n;
  named.name = "missing";
  EXPECT_THROW(tool_constraint(*set, ToolFormat::kGeneric, named), Error);

  ToolChoice none;
  none.mode = ToolChoice::Mode::kNone;
  EXPECT_EQ(tool_constraint(*set, ToolFormat::kHermes, none), "");
}

TEST(Tools, GenericTemplatesGetASystemMessageAndUserTurnsForResults) {
  auto set = parse_tools(kTools);
  const std::vector<ChatMessage> in = {{"system", "Be brief."}, {"user", "Weather?"}, {"assistant", "<tool_call>x"},
                                       {"tool", "sunny"}};
  const auto out = messages_for(in, *set, ToolFormat::kGeneric);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].role, "system");
  EXPECT_EQ(out[0].content.rfind("Be brief.\n\n", 0), 0u);
  EXPECT_NE(out[0].content.find(R"({"name":"get_weather","description":"Weather in a city","parameters":)"),
            std::string::npos)
      << out[0].content;
  EXPECT_NE(out[0].content.find("<tool_call>"), std::string::npos);
  EXPECT_EQ(out[3].role, "user");
  EXPECT_EQ(out[3].content, "<tool_response>\nsunny\n</tool_response>");
  const auto no_system = messages_for({{"user", "hi"}}, *set, ToolFormat::kGeneric);
  ASSERT_EQ(no_system.size(), 2u);
  EXPECT_EQ(no_system[0].role, "system");
  // Templates that know tools get the messages as they are.
  const auto hermes = messages_for(in, *set, ToolFormat::kHermes);
  ASSERT_EQ(hermes.size(), in.size());
  EXPECT_EQ(hermes[3].role, "tool");
}

// Feeds `pieces` one by one and returns what came out, calls as
// "CALL(name,args)".
std::string parse(ToolFormat f, const std::vector<std::string>& pieces) {
  ToolCallParser p(f);
  std::vector<ToolCallParser::Piece> out;
  for (size_t i = 0; i < pieces.size(); ++i) p.feed(pieces[i], i + 1 == pieces.size(), out);
  std::string s;
  for (const auto& piece : out)
    s += piece.is_call ? "CALL(" + piece.call.name + "," + piece.call.arguments + ")" : "[" + piece.text + "]";
  return s;
}

TEST(ToolCallParser, FindsHermesCallsAcrossPieces) {
  EXPECT_EQ(parse(ToolFormat::kHermes, {"Sure. <tool", "_call>\n{\"name\": \"get_weather\", \"argu",
                                        "ments\": {\"city\": \"Paris\"}}\n</tool_call>", " Done."}),
            "[Sure. ]CALL(get_weather,{\"city\":\"Paris\"})[ Done.]");
  // Two calls back to back, one token at a time.
  const std::string two = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                          "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"s\": \"</tool_call>\"}}\n</tool_call>";
  std::vector<std::string> chars;
  for (char c : two) chars.emplace_back(1, c);
  EXPECT_EQ(parse(ToolFormat::kHermes, chars), "CALL(a,{})[\n]CALL(b,{\"s\":\"</tool_call>\"})");
}

TEST(ToolCallParser, HoldsATriggerPrefixAndReleasesIt) {
  ToolCallParser p(ToolFormat::kHermes);
  std::vector<ToolCallParser::Piece> out;
  p.feed("a <tool", false, out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].text, "a ");
  p.feed("box", false, out);  // not a call after all
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].text, "<toolbox");
  EXPECT_EQ(parse(ToolFormat::kHermes, {"ends with <tool_c"}), "[ends with <tool_c]");
}

TEST(ToolCallParser, AnUnfinishedCallComesOutAsText) {
  EXPECT_EQ(parse(ToolFormat::kHermes, {"<tool_call>\n{\"name\": \"a\", \"argum"}),
            "[<tool_call>\n{\"name\": \"a\", \"argum]");
  // Not JSON inside the tags: text.
  EXPECT_EQ(parse(ToolFormat::kHermes, {"<tool_call>oops</tool_call>"}), "[<tool_call>oops</tool_call>]");
}

TEST(ToolCallParser, FindsLlama3Calls) {
  EXPECT_EQ(parse(ToolFormat::kLlama3, {"{\"name\": \"move_to\", \"parameters\": {\"x\": 1, \"y\": {\"z\": 2}}}"}),
            "CALL(move_to,{\"x\":1,\"y\":{\"z\":2}})");
  EXPECT_EQ(parse(ToolFormat::kLlama3, {"plain {text}"}), "[plain {text}]");
}

}  // namespace
}  // namespace ember::chat
