// Structured output on the real model (core/grammar, XGrammar): replies that
// match a JSON schema, a GBNF grammar, a regex or a list of choices, greedy
// and sampled; the same tokens with and without speculative decoding and
// beside unconstrained streams in the same steps; hostile constraints fail
// with a clear error and leave the engine serving.
#include <gtest/gtest.h>

#include <picojson.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/engine.h"
#include "core/grammar/grammar.h"
#include "core/tokenizer/tokenizer.h"
#include "model_path.h"

namespace ember {
namespace {

using Kind = grammar::Constraint::Kind;

std::shared_ptr<Model> model() {
  static std::shared_ptr<Model> m = Model::load(test::default_model_path());
  return m;
}

struct Reply {
  std::string text;
  std::vector<int32_t> tokens;
  EndReason end = EndReason::kNone;
  StreamStats stats;
};

Reply drain(const std::shared_ptr<Stream>& s) {
  Reply r;
  for (;;) {
    StreamEvent ev;
    const StatusCode c = s->next(ev, 120000);
    EXPECT_EQ(c, StatusCode::kOk);
    if (c != StatusCode::kOk) break;
    if (ev.type == StreamEvent::kText) {
      r.text += ev.text;
      r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    } else {
      EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
      r.end = ev.end_reason;
      break;
    }
  }
  r.stats = s->stats();
  return r;
}

StreamParams params(Kind kind, std::string text, float temperature = 0.0f, int max_tokens = 96) {
  StreamParams p;
  p.max_tokens = max_tokens;
  p.sampling.temperature = temperature;
  p.constraint.kind = kind;
  p.constraint.text = std::move(text);
  return p;
}

Reply ask(const std::shared_ptr<EngineOwner>& engine, const std::string& user, const StreamParams& p) {
  auto s = std::make_shared<Session>(engine, 0, "");
  s->add_message("user", user);
  return drain(s->start(p));
}

const char* kPerson = R"({"type": "object",
  "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                 "likes": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3}},
  "required": ["name", "age", "likes"]})";

// Parses `text` as JSON and checks it against kPerson's schema.
void expect_person(const std::string& text) {
  picojson::value v;
  const std::string err = picojson::parse(v, text);
  ASSERT_TRUE(err.empty()) << err << " in: " << text;
  ASSERT_TRUE(v.is<picojson::object>()) << text;
  const auto& o = v.get<picojson::object>();
  ASSERT_EQ(o.size(), 3u) << text;
  ASSERT_TRUE(o.at("name").is<std::string>()) << text;
  EXPECT_LE(o.at("name").get<std::string>().size(), 24u * 4) << text;
  ASSERT_TRUE(o.at("age").is<double>()) << text;
  EXPECT_EQ(o.at("age").get<double>(), static_cast<double>(static_cast<int64_t>(o.at("age").get<double>())));
  ASSERT_TRUE(o.at("likes").is<picojson::array>()) << text;
  EXPECT_LE(o.at("likes").get<picojson::array>().size(), 3u) << text;
  for (const auto& e : o.at("likes").get<picojson::array>()) EXPECT_TRUE(e.is<std::string>()) << text;
}

TEST(Grammar, JsonSchemaRepliesParseAndValidate) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  auto engine = Engine::create(model(), EngineParams{});
  const Reply greedy = ask(engine, "Describe a fictional person as JSON.", params(Kind::kJsonSchema, kPerson, 0, 160));
  EXPECT_EQ(greedy.end, EndReason::kEos) << greedy.text;
  expect_person(greedy.text);
  // Sampled at a high temperature: still valid, every seed.
  for (uint64_t seed : {1u, 2u, 3u}) {
    StreamParams p = params(Kind::kJsonSchema, kPerson, 1.2f, 160);
    p.sampling.seed = seed;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    const Reply r = ask(engine, "Describe a fictional person as JSON.", p);
    EXPECT_EQ(r.end, EndReason::kEos) << "seed " << seed << ": " << r.text;
    expect_person(r.text);
  }
  // Any JSON object (OpenAI's json_object).
  const Reply obj = ask(engine, "Give me a JSON object about cats.", params(Kind::kJsonObject, "", 0, 64));
  if (obj.end == EndReason::kEos) {
    picojson::value v;
    EXPECT_TRUE(picojson::parse(v, obj.text).empty()) << obj.text;
    EXPECT_TRUE(v.is<picojson::object>()) << obj.text;
  } else {
    EXPECT_EQ(obj.text.front(), '{') << obj.text;
  }
}

TEST(Grammar, GbnfRegexAndChoices) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  auto engine = Engine::create(model(), EngineParams{});
  // A GBNF grammar in llama.cpp's notation.
  const char* gbnf = R"(root ::= answer " because " reason "."
answer ::= "Yes" | "No"
reason ::= [a-z ]+)";
  const Reply g = ask(engine, "Is the sky blue? Answer and give a reason.", params(Kind::kGrammar, gbnf, 0, 48));
  if (g.end == EndReason::kEos) {
    EXPECT_TRUE(std::regex_match(g.text, std::regex("(Yes|No) because [a-z ]+\\."))) << g.text;
  } else {
    EXPECT_TRUE(std::regex_match(g.text, std::regex("(Yes|No)( because [a-z ]*)?"))) << g.text;
  }
  // A regex.
  const Reply re = ask(engine, "What is the date of the first moon landing?",
                       params(Kind::kRegex, "[0-9]{4}-[0-9]{2}-[0-9]{2}", 0, 24));
  EXPECT_EQ(re.end, EndReason::kEos) << re.text;
  EXPECT_TRUE(std::regex_match(re.text, std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}"))) << re.text;
  // Choices (quotes and a non-ASCII one included).
  StreamParams c = params(Kind::kChoices, "", 0, 16);
  c.constraint.choices = {"red", "green", "blue \"sky\"", "rot grün"};
  const Reply ch = ask(engine, "Name a colour.", c);
  EXPECT_EQ(ch.end, EndReason::kEos) << ch.text;
  EXPECT_TRUE(std::set<std::string>(c.constraint.choices.begin(), c.constraint.choices.end()).count(ch.text))
      << ch.text;
}

// Greedy output is the same with and without speculation (drafted tokens the
// constraint rejects are cut before verification, and each tree node's row
// is masked after its own path), and the same beside unconstrained streams
// running in the same steps.
TEST(Grammar, SpeculationAndBatchingKeepTheTokens) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  auto engine = Engine::create(model(), EngineParams{});
  const std::string user = "Describe a fictional person as JSON. Name: Ada Lovelace, age 36, likes maths.";
  const StreamParams plain = params(Kind::kJsonSchema, kPerson, 0, 96);
  const Reply ref = ask(engine, user, plain);
  expect_person(ref.text);
  for (auto kind : {SpecParams::Kind::kNgram, SpecParams::Kind::kSelf}) {
    StreamParams p = plain;
    p.spec.kind = kind;
    p.spec.payoff_gate = false;
    const Reply r = ask(engine, user, p);
    EXPECT_EQ(r.tokens, ref.tokens) << "drafter " << static_cast<int>(kind) << ": " << r.text;
    EXPECT_GT(r.stats.drafted_tokens, 0u);
  }
  // One constrained and two unconstrained streams at once.
  StreamParams free_p;
  free_p.max_tokens = 48;
  free_p.sampling.temperature = 0.0f;
  const Reply free_ref = ask(engine, "Write a haiku about the sea.", free_p);
  auto a = std::make_shared<Session>(engine, 0, "");
  a->add_message("user", user);
  auto b = std::make_shared<Session>(engine, 0, "");
  b->add_message("user", "Write a haiku about the sea.");
  auto c = std::make_shared<Session>(engine, 0, "");
  c->add_message("user", "Write a haiku about the sea.");
  auto sa = a->start(plain);
  auto sb = b->start(free_p);
  auto sc = c->start(free_p);
  EXPECT_EQ(drain(sa).tokens, ref.tokens);
  EXPECT_EQ(drain(sb).tokens, free_ref.tokens);
  EXPECT_EQ(drain(sc).tokens, free_ref.tokens);
}

// A constrained row is sampled by checking the tokens the sampler looks at
// (Engine::checks_first) unless the stream asks for logprobs, which need the
// masked row: both ways give the same tokens, greedy and sampled, with a
// penalty, under a schema (bounded strings: a dear mask) and a regex (few
// tokens allowed: the check falls back to the mask).
TEST(Grammar, CheckingTokensFirstGivesTheMaskedRowsTokens) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  auto engine = Engine::create(model(), EngineParams{});
  struct Case {
    Kind kind;
    const char* text;
    const char* user;
  };
  const Case cases[] = {{Kind::kJsonSchema, kPerson, "Describe a fictional person as JSON."},
                        {Kind::kRegex, "[0-9]{3}-[0-9]{4}( ext [0-9]{1,3})?", "Give me a phone number."}};
  for (const Case& c : cases) {
    for (float temperature : {0.0f, 0.9f, 1.3f}) {
      StreamParams p = params(c.kind, c.text, temperature, 64);
      p.sampling.seed = 7;
      p.sampling.repeat_penalty = 1.2f;
      const Reply checked = ask(engine, c.user, p);
      p.logprobs = true;
      const Reply masked = ask(engine, c.user, p);
      EXPECT_EQ(checked.tokens, masked.tokens) << "temperature " << temperature << ": " << checked.text << " / "
                                               << masked.text;
      EXPECT_FALSE(checked.tokens.empty());
    }
  }
}

// Bad constraints fail at stream start with kInvalidArgument and a message;
// the session stays usable and the engine serves the next stream.
TEST(Grammar, HostileConstraintsFailCleanly) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  auto engine = Engine::create(model(), EngineParams{});
  auto s = std::make_shared<Session>(engine, 0, "");
  s->add_message("user", "Hello");
  std::string deep;  // a schema nested 5000 arrays deep
  for (int i = 0; i < 5000; ++i) deep += R"({"type": "array", "items": )";
  deep += R"({"type": "string"})";
  for (int i = 0; i < 5000; ++i) deep += "}";
  std::string wide = R"({"type": "object", "properties": {)";  // 200 properties
  for (int i = 0; i < 200; ++i) {
    if (i) wide += ",";
    wide += "\"p";
    wide += std::to_string(i);
    wide += R"(": {"type": "integer"})";
  }
  wide += "}}";
  struct Bad {
    Kind kind;
    std::string text;
  };
  const std::vector<Bad> bad = {
      {Kind::kJsonSchema, "{not json"},
      {Kind::kJsonSchema, R"({"type": "no-such-type"})"},
      {Kind::kJsonSchema, deep},
      {Kind::kGrammar, "root ::= missing_rule"},
      {Kind::kGrammar, "this is not a grammar"},
      {Kind::kRegex, "(unclosed"},
      {Kind::kRegex, std::string(20000, '(') + "a" + std::string(20000, ')')},
      {Kind::kRegex, std::string("\xff\xfe", 2)},
      {Kind::kJsonSchema, ""},
      {Kind::kChoices, ""},
  };
  for (const Bad& b : bad) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      s->start(params(b.kind, b.text));
      ADD_FAILURE() << "accepted: " << b.text.substr(0, 80);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << e.what();
      EXPECT_FALSE(std::string(e.what()).empty());
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0)
        << b.text.substr(0, 80);
  }
  // A large but valid schema compiles (or is refused) without hanging, and
  // the session still serves.
  try {
    StreamParams p = params(Kind::kJsonSchema, wide, 0, 4);
    drain(s->start(p));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << e.what();
  }
  StreamParams ok;
  ok.max_tokens = 4;
  ok.sampling.temperature = 0.0f;
  const Reply after = drain(s->start(ok));
  EXPECT_TRUE(after.end == EndReason::kMaxTokens || after.end == EndReason::kEos);
  EXPECT_GT(after.stats.generated_tokens, 0u);
}

// A compiled constraint is cached: the second stream with the same schema
// starts without compiling (much faster than the first), and a cancelled
// constrained stream ends like any other.
TEST(Grammar, CompiledOnceAndCancellable) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  auto engine = Engine::create(model(), EngineParams{});
  auto start_ms = [&] {
    auto s = std::make_shared<Session>(engine, 0, "");
    s->add_message("user", "Describe a person as JSON.");
    const auto t0 = std::chrono::steady_clock::now();
    auto stream = s->start(params(Kind::kJsonSchema, kPerson, 0, 200));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    stream->cancel();
    EXPECT_EQ(drain(stream).end, EndReason::kCancelled);
    return ms;
  };
  const double first = start_ms(), second = start_ms();
  EXPECT_LT(second * 5, first + 5) << "first " << first << " ms, second " << second << " ms";
}

// The compiled-constraint cache keeps the kMaxCached most recently used; a
// dropped one compiles again, and a matcher outlives its cache entry.
TEST(Grammar, CacheIsBounded) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  grammar::Compiler compiler(model()->tokenizer());
  grammar::Constraint first;
  first.kind = Kind::kChoices;
  first.choices = {"choice 0"};
  grammar::Matcher held(compiler.compile(first));
  for (size_t i = 1; i < grammar::Compiler::kMaxCached + 10; ++i) {
    grammar::Constraint c;
    c.kind = Kind::kChoices;
    c.choices = {"choice " + std::to_string(i)};
    compiler.compile(c);
    EXPECT_LE(compiler.cached(), grammar::Compiler::kMaxCached);
  }
  EXPECT_EQ(compiler.cached(), grammar::Compiler::kMaxCached);
  const auto ids = model()->tokenizer().encode("choice 0", false, false);
  EXPECT_EQ(held.accept_all(ids), ids.size());  // its entry was dropped, the matcher still works
  grammar::Matcher again(compiler.compile(first));
  EXPECT_EQ(again.accept_all(ids), ids.size());
}

// A choice with a control character before a hex digit is that text exactly
// (it was once written as "\x09" + "b", which the engine read as U+009B).
TEST(Grammar, ChoicesWithControlCharactersAreExact) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  grammar::Compiler compiler(model()->tokenizer());
  grammar::Constraint c;
  c.kind = Kind::kChoices;
  c.choices = {"a\tb", "x\n1f"};
  for (const auto& choice : c.choices) {
    grammar::Matcher m(compiler.compile(c));
    const auto ids = model()->tokenizer().encode(choice, false, false);
    EXPECT_EQ(m.accept_all(ids), ids.size()) << choice;
    EXPECT_TRUE(m.allows(model()->tokenizer().eos())) << choice << ": complete, only the end may follow";
  }
}

// A string with minLength/maxLength is valid JSON: no raw control character
// (XGrammar 0.2.8 let tab and NUL through there; tools/patches), and the
// bounds count code points. (Such strings take no escapes, as before: the
// unescaped characters keep XGrammar's fast character-class path.)
TEST(Grammar, BoundedStringsRefuseControlCharacters) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  grammar::Compiler compiler(model()->tokenizer());
  grammar::Constraint c;
  c.kind = Kind::kJsonSchema;
  c.text = R"({"type": "string", "minLength": 1, "maxLength": 3})";
  const auto& tok = model()->tokenizer();
  struct Case {
    std::string text;
    bool valid;
  };
  const std::vector<Case> cases = {
      {"\"a\tb\"", false},          // raw tab
      {std::string("\"a") + '\0' + "\"", false},  // raw NUL
      {"\"a\x1f" "b\"", false},     // raw unit separator
      {"\"a b\"", true},
      {"\"abc\"", true},
      {"\"abcd\"", false},           // four characters
      {"\"\"", false},               // minLength 1
      {"\"caf\u00e9\"", false},     // four code points (UTF-8)
      {"\"\u00e9t\u00e9\"", true},  // three code points, five bytes
  };
  for (const auto& k : cases) {
    grammar::Matcher m(compiler.compile(c));
    const auto ids = tok.encode(k.text, false, false);
    const bool all = m.accept_all(ids) == ids.size();
    const bool complete = all && m.allows(tok.eos());
    EXPECT_EQ(complete, k.valid) << picojson::value(k.text).serialize();
  }
  // Sampled hot under the bound: every reply parses as JSON, no raw control byte.
  auto engine = Engine::create(model(), EngineParams{});
  const char* schema = R"({"type": "object", "properties": {"line": {"type": "string", "maxLength": 40}},
                           "required": ["line"]})";
  for (uint64_t seed : {1u, 2u, 3u, 4u}) {
    StreamParams p = params(Kind::kJsonSchema, schema, 1.5f, 80);
    p.sampling.seed = seed;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    const Reply r = ask(engine, "Write a line of a poem with a tab in it, as JSON.", p);
    if (r.end != EndReason::kEos) continue;  // cut by max_tokens: nothing to parse
    picojson::value v;
    EXPECT_TRUE(picojson::parse(v, r.text).empty()) << r.text;
    bool in_string = false, escaped = false;  // JSON forbids raw U+0000-U+001F inside strings
    for (unsigned char ch : r.text) {
      if (in_string) {
        EXPECT_GE(ch, 0x20u) << r.text;
      }
      if (escaped) escaped = false;
      else if (in_string && ch == '\\') escaped = true;
      else if (ch == '"') in_string = !in_string;
    }
  }
}

// Messages name the problem without XGrammar's internal-check prefix, and a
// schema quoted in one is cut.
TEST(Grammar, ErrorMessagesAreShort) {
  EMBER_REQUIRE_MODEL();
  if (!grammar::available()) GTEST_SKIP() << "built without XGrammar";
  grammar::Compiler compiler(model()->tokenizer());
  grammar::Constraint c;
  c.kind = Kind::kJsonSchema;
  c.text = "{\"type\": \"object\", \"description\": \"" + std::string(200000, 'x') + "\", \"properties\": 5}";
  try {
    compiler.compile(c);
    ADD_FAILURE() << "compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_LT(e.message().size(), 1200u) << e.message().substr(0, 300);
    EXPECT_EQ(e.message().find("Check failed"), std::string::npos) << e.message().substr(0, 300);
  }
}

}  // namespace
}  // namespace ember

namespace ember {
namespace {

// Matcher::apply works a 32-bit word at a time: it must equal the per-token
// rule (bit t clear -> logit t is -inf; tokens past the mask are -inf) for
// any mask, all-zero and all-one words included, and a vocabulary that is
// not a multiple of 32.
TEST(Grammar, ApplyingABitmaskEqualsThePerTokenRule) {
  if (!grammar::available()) GTEST_SKIP() << "built without the grammar engine";
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int32_t n_vocab : {1, 31, 32, 33, 1000, 49152, 49171}) {
    for (int pattern = 0; pattern < 4; ++pattern) {
      std::vector<uint32_t> bits(static_cast<size_t>((n_vocab + 31) / 32) - (pattern == 3 && n_vocab > 64 ? 1 : 0));
      for (auto& w : bits) {
        const uint64_t r = next();
        w = pattern == 0 ? static_cast<uint32_t>(r) : (r % 3 == 0 ? 0u : r % 3 == 1 ? ~0u : static_cast<uint32_t>(r));
      }
      std::vector<float> row(static_cast<size_t>(n_vocab)), want;
      for (int32_t t = 0; t < n_vocab; ++t) row[static_cast<size_t>(t)] = static_cast<float>(t % 97) - 40.0f;
      want = row;
      for (int32_t t = 0; t < n_vocab; ++t) {
        const size_t w = static_cast<size_t>(t) / 32;
        if (w >= bits.size() || !(bits[w] >> (t % 32) & 1u)) want[static_cast<size_t>(t)] = -INFINITY;
      }
      grammar::Matcher::apply(bits, row.data(), n_vocab);
      ASSERT_EQ(row, want) << n_vocab << " pattern " << pattern;
    }
  }
}

}  // namespace
}  // namespace ember
