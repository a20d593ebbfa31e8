// libFuzzer target: structured output (core/grammar over XGrammar): a hostile
// JSON schema, grammar (GBNF / XGrammar EBNF), regex, list of choices or
// structural tag, compiled against a small synthetic byte-level BPE
// vocabulary (tests/fuzz/fuzz_vocab.h) and then walked token by token.
//
// Input: byte 0 picks the kind (byte 0 % 6: JSON schema, JSON object,
// grammar, regex, choices, structural tag); the rest (at most 8 KiB) is the
// text; for choices it is split at every '\n' and '\0'. The walk's choices
// come from a generator seeded with the input's hash.
//
// Promises checked: Constraint::validate and Compiler::compile either return
// or throw ember::Error kInvalidArgument (kUnsupported) with a message (never
// another exception, a crash or a hang); compiling the same constraint again
// gives the cached one. For a constraint that compiles, a Matcher walks up to
// 32 tokens: the mask never is empty and never allows a control or unused
// token that is not a stop token; every token it allows is allowed by
// allows() and accepted by accept(), except at a dead end (then the mask is
// the stop tokens, which the matcher refuses); a token it rejects is refused
// by allows() and accept() without changing the state; mask_after({t}) is
// the mask after accepting t and leaves the state as it was; mask_after of a
// path through a rejected token masks everything; rollback(k) gives back the
// mask of k tokens earlier; a fresh matcher fed the same tokens
// (accept_all) ends in the same mask. A list of choices accepts each choice
// (as the tokenizer encodes it) followed by a stop token.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/chat/tools.h"
#include "core/grammar/grammar.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/hash.h"
#include "core/util/status.h"
#include "fuzz_util.h"
#include "fuzz_vocab.h"

namespace ember::fuzz {
namespace {

using grammar::Constraint;
using Kind = Constraint::Kind;

constexpr size_t kMaxText = 8192;
constexpr int kMaxSteps = 32;
// The Compiler caches every constraint it compiled (per engine, by text):
// a fresh one every kCompilerInputs compiled constraints bounds the memory.
constexpr size_t kCompilerInputs = 256;

const Kind kKinds[6] = {Kind::kJsonSchema, Kind::kJsonObject, Kind::kGrammar,
                        Kind::kRegex,      Kind::kChoices,    Kind::kStructuralTag};

uint8_t kind_byte(Kind k) {
  for (uint8_t i = 0; i < 6; ++i)
    if (kKinds[i] == k) return i;
  return 0;
}

std::string input(Kind k, std::string_view text) {
  std::string s(1, static_cast<char>(kind_byte(k)));
  s += text;
  return s;
}

std::unique_ptr<Tokenizer> g_tok;
std::unique_ptr<grammar::Compiler> g_compiler;
std::vector<int32_t> g_stops;  // the end-of-generation tokens
std::vector<bool> g_never;     // control/unused tokens that are not stops: never allowed

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
};

bool bit(const std::vector<uint32_t>& bits, int32_t t) { return (bits[static_cast<size_t>(t) / 32] >> (t % 32)) & 1u; }

// The mask restricted to the vocabulary (bits past it are the engine's business).
std::vector<int32_t> allowed_tokens(const std::vector<uint32_t>& bits, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t t = 0; t < n; ++t)
    if (bit(bits, t)) out.push_back(t);
  return out;
}

bool is_stop(int32_t t) { return std::find(g_stops.begin(), g_stops.end(), t) != g_stops.end(); }

// The logits a mask leaves finite equal the mask.
void check_row(const std::vector<float>& row, const std::vector<uint32_t>& bits) {
  for (int32_t t = 0; t < static_cast<int32_t>(row.size()); ++t) {
    EMBER_FUZZ_CHECK(bit(bits, t) == std::isfinite(row[static_cast<size_t>(t)]));
  }
}

void walk(const std::shared_ptr<const grammar::Compiled>& compiled, Rng& rng) {
  const int32_t n = g_tok->n_vocab();
  grammar::Matcher m(compiled);
  std::vector<std::vector<uint32_t>> masks;  // masks[i]: the mask after path[0..i)
  std::vector<int32_t> path;
  std::vector<uint32_t> bits, again;
  std::vector<float> row(static_cast<size_t>(n)), zeros(static_cast<size_t>(n), 0.0f);
  // mask_after({t}) taken before accepting t: the mask expected next.
  std::vector<float> expect_next;
  for (int step = 0; step < kMaxSteps; ++step) {
    m.fill(bits);
    EMBER_FUZZ_CHECK(bits.size() * 32 >= static_cast<size_t>(n));
    if (!expect_next.empty()) check_row(expect_next, bits);
    masks.resize(path.size());
    masks.push_back(bits);
    const std::vector<int32_t> allowed = allowed_tokens(bits, n);
    EMBER_FUZZ_CHECK(!allowed.empty());
    for (int32_t t : allowed) EMBER_FUZZ_CHECK(!g_never[static_cast<size_t>(t)]);
    // apply() leaves finite exactly what the mask allows.
    row = zeros;
    grammar::Matcher::apply(bits, row.data(), n);
    check_row(row, bits);
    if (m.terminated()) {
      // Complete: only stop tokens, which the matcher no longer takes.
      for (int32_t t : allowed) EMBER_FUZZ_CHECK(is_stop(t));
      for (int32_t t : allowed) EMBER_FUZZ_CHECK(!m.allows(t));
      break;
    }
    // A token the mask rejects is refused, and the state is unchanged.
    if (allowed.size() < static_cast<size_t>(n)) {
      int32_t r = static_cast<int32_t>(rng.below(static_cast<size_t>(n)));
      while (bit(bits, r)) r = (r + 1) % n;
      EMBER_FUZZ_CHECK(!m.allows(r));
      EMBER_FUZZ_CHECK(!m.accept(r));
      row = zeros;
      m.mask_after({r}, row.data(), n);
      for (float x : row) EMBER_FUZZ_CHECK(std::isinf(x) && x < 0);
    }
    EMBER_FUZZ_CHECK(!m.accept(-1) && !m.accept(n) && !m.allows(n + 7));
    const int32_t t = allowed[rng.below(allowed.size())];
    if (!m.allows(t)) {
      // A dead end: fill() gave the stop tokens, which the matcher refuses.
      for (int32_t a : allowed) EMBER_FUZZ_CHECK(is_stop(a) && !m.allows(a));
      EMBER_FUZZ_CHECK(!m.accept(t));
      break;
    }
    // mask_after({t}) now is the mask after accepting t; the state stays.
    expect_next.assign(static_cast<size_t>(n), 0.0f);
    m.mask_after({t}, expect_next.data(), n);
    // mask_after({t, u}): nothing when u may not follow t, else something.
    int32_t u = -1;
    std::vector<float> two;
    if (rng.below(4) == 0) {
      u = static_cast<int32_t>(rng.below(static_cast<size_t>(n)));
      two.assign(static_cast<size_t>(n), 0.0f);
      m.mask_after({t, u}, two.data(), n);
    }
    m.fill(again);
    EMBER_FUZZ_CHECK(again == bits);
    EMBER_FUZZ_CHECK(m.accept(t));
    path.push_back(t);
    if (u >= 0) {
      const bool any = std::any_of(two.begin(), two.end(), [](float x) { return std::isfinite(x); });
      EMBER_FUZZ_CHECK(any == m.allows(u));
    }
    if (path.size() >= 2 && rng.below(5) == 0) {
      const size_t k = 1 + rng.below(std::min<size_t>(path.size(), 6));
      m.rollback(static_cast<int32_t>(k));
      path.resize(path.size() - k);
      m.fill(again);
      EMBER_FUZZ_CHECK(again == masks[path.size()]);
      expect_next.clear();
      EMBER_FUZZ_CHECK(!m.terminated());
    }
  }
  // Taking back the last token (the stop token, when it ended) gives back
  // the mask before it.
  if (!path.empty()) {
    m.rollback(1);
    path.pop_back();
    m.fill(again);
    EMBER_FUZZ_CHECK(again == masks[path.size()]);
  }
  // A fresh matcher fed the same tokens ends in the same state.
  grammar::Matcher fresh(compiled);
  EMBER_FUZZ_CHECK(fresh.accept_all(path) == path.size());
  std::vector<uint32_t> fresh_bits;
  fresh.fill(fresh_bits);
  m.fill(again);
  EMBER_FUZZ_CHECK(fresh_bits == again);
  EMBER_FUZZ_CHECK(fresh.terminated() == m.terminated());
}

// ---------------------------------------------------------------- seeds

void write_seeds(const std::string& dir) {
  int i = 0;
  const auto seed = [&](const char* name, Kind k, std::string_view text) {
    write_seed(dir, std::string(name) + std::to_string(i++), input(k, text));
  };
  // Real schemas: tests/structured/schemas.json (the structured-output eval's).
  {
    std::ifstream in(std::string(EMBER_STRUCTURED_DIR) + "/schemas.json", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const auto all = nlohmann::json::parse(ss.str());
    EMBER_FUZZ_CHECK(all.is_array() && !all.empty());
    for (const auto& e : all) seed("schema_", Kind::kJsonSchema, e.at("schema").dump());
  }
  // Schema features the eval's do not have.
  seed("schema_", Kind::kJsonSchema,
       R"({"type":"object","properties":{"id":{"type":"string","minLength":3,"maxLength":8,)"
       R"("pattern":"^[a-z]+[0-9]*$"},)"
       R"("n":{"type":"integer","exclusiveMinimum":-5,"exclusiveMaximum":1000},"f":{"type":"number"},)"
       R"("d":{"type":"string","format":"date"},"u":{"type":"string","format":"uuid"}},)"
       R"("required":["id"],"additionalProperties":false})");
  seed("schema_", Kind::kJsonSchema,
       R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":)"
       R"([{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})");
  seed("schema_", Kind::kJsonSchema,
       R"({"type":"array","prefixItems":[{"const":"head"},{"type":"boolean"}],"items":{"type":"number"},)"
       R"("minItems":2,"maxItems":4})");
  seed("schema_", Kind::kJsonSchema,
       R"({"oneOf":[{"type":"string","enum":["a","b\"c","\u00e9"]},{"type":"integer","minimum":10,"maximum":12},)"
       R"({"type":"array","items":{"type":"string"},"maxItems":0}]})");
  seed("schema_", Kind::kJsonSchema,
       R"({"type":"object","patternProperties":{"^x_":{"type":"string"}},"minProperties":1})");
  seed("schema_", Kind::kJsonSchema, "true");
  seed("schema_", Kind::kJsonSchema, R"({"type":"string","minLength":200,"maxLength":300})");
  seed("json_object", Kind::kJsonObject, "");
  // Grammars: GBNF (llama.cpp's notation) and XGrammar's EBNF.
  seed("grammar_", Kind::kGrammar, "root ::= \"yes\" | \"no\"\n");
  seed("grammar_", Kind::kGrammar, "root ::= answer \".\"\nanswer ::= [A-Z] [a-z]* (\" \" [a-z]+){0,3}\n");
  seed(
      "grammar_", Kind::kGrammar,
      "root ::= object\nvalue ::= object | array | string | number | (\"true\" | \"false\" | \"null\")\n"
      "object ::= \"{\" ( string \":\" value (\",\" string \":\" value)* )? \"}\"\n"
      "array ::= \"[\" ( value (\",\" value)* )? \"]\"\n"
      "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\"\n"
      "number ::= \"-\"? ([0-9] | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n");
  seed("grammar_", Kind::kGrammar, "root ::= \"(\" root \")\" | \"x\"\n");
  seed("grammar_", Kind::kGrammar, "root ::= [^\\n]+ \"\\n\" list\nlist ::= (\"- \" [a-z\\u00e9\\u4e2d]+ \"\\n\")+\n");
  seed("grammar_", Kind::kGrammar, "root ::= \"caf\\u00e9 \" [0-9]? \" \\U0001F600\" [\\t ]*\n");
  seed("grammar_", Kind::kGrammar, "root ::= TagDispatch((\"<a>\", inner))\ninner ::= \"x\"\n");
  // Regexes.
  seed("regex_", Kind::kRegex, R"([0-9]{3}-[0-9]{4})");
  seed("regex_", Kind::kRegex, R"((cat|dog)s?( and (cat|dog)s?)*\.)");
  seed("regex_", Kind::kRegex, R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?Z)");
  seed("regex_", Kind::kRegex, R"([^\s@]+@[a-z]+\.(com|org))");
  seed("regex_", Kind::kRegex, "(\\w+ ){1,5}\\u00e9?[\\x41-\\x5a]+");
  // Choices.
  seed("choices_", Kind::kChoices, "yes\nno\nmaybe");
  static const char kChoiceList[] = "Paris\0Rome\0Caf\xC3\xA9 \"quoted\" \\ back\0tab\tbefore a hex digit";
  seed("choices_", Kind::kChoices, std::string_view(kChoiceList, sizeof kChoiceList - 1));
  seed("choices_", Kind::kChoices, "a\nab\nabc\n<|endoftext|>");
  // Structural tags, as tool calling builds them (core/chat/tools.cpp).
  {
    const auto tools = chat::parse_tools(
        R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
        R"("properties":{"city":{"type":"string","maxLength":20},"days":{"type":"integer","minimum":1,"maximum":7}},)"
        R"("required":["city"]}}},{"type":"function","function":{"name":"ping"}}])");
    chat::ToolChoice auto_choice, required, one;
    required.mode = chat::ToolChoice::Mode::kRequired;
    required.parallel = false;
    one.mode = chat::ToolChoice::Mode::kFunction;
    one.name = "get_weather";
    seed("tag_", Kind::kStructuralTag, chat::tool_constraint(*tools, chat::ToolFormat::kHermes, auto_choice));
    seed("tag_", Kind::kStructuralTag, chat::tool_constraint(*tools, chat::ToolFormat::kLlama3, required));
    seed("tag_", Kind::kStructuralTag, chat::tool_constraint(*tools, chat::ToolFormat::kGeneric, one));
  }
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"sequence","elements":[{"type":"const_string","value":"A: "},)"
       R"({"type":"regex","pattern":"[a-z]{1,4}"},{"type":"or","elements":[{"type":"const_string","value":"!"},)"
       R"({"type":"grammar","grammar":"root ::= \"?\""}]}]}})");
  // XGrammar's other structural-tag formats, token-level ones included.
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"token_triggered_tags","trigger_tokens":["<tool_call>"],)"
       R"("tags":[{"begin":{"type":"token","token":"<tool_call>"},"content":{"type":"json_schema","json_schema":)"
       R"({"type":"object","properties":{"a":{"type":"integer"}}}},"end":"</tool_call>"}],"at_least_one":true}})");
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"sequence","elements":[{"type":"token","token":"<tool_call>"},)"
       R"({"type":"json_schema","json_schema":{"type":"object"}},{"type":"token","token":"<|im_end|>"}]}})");
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"any_tokens","exclude_tokens":[0,"<tool_call>"],"max_tokens":5}})");
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"sequence","elements":[{"type":"any_text","max_chars":12},)"
       R"({"type":"const_string","value":"END"}]}})");
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"repeat","min":1,"max":3,"content":)"
       R"({"type":"regex","pattern":"[0-9]+,"}}})");
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"dispatch","rules":[["<a>",)"
       R"({"type":"const_string","value":"x</a>"}],)"
       R"(["<b>",{"type":"json_schema","json_schema":{"enum":[1,2]}}]],"loop":true,"excludes":["<|"]}})");
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"tags_with_separator","tags":[{"begin":"<a>","content":)"
       R"({"type":"any_text"},"end":"</a>"}],"separator":",","at_least_one":true,"stop_after_first":false}})");
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"tag","begin":"<tool_call>","content":)"
       R"({"type":"qwen_xml_parameter",)"
       R"("json_schema":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}},)"
       R"("end":"</tool_call>"}})");
  seed("tag_", Kind::kStructuralTag,
       R"({"type":"structural_tag","format":{"type":"sequence","elements":[{"type":"optional","content":)"
       R"({"type":"const_string",)"
       R"("value":"a"}},{"type":"star","content":{"type":"const_string","value":"b"}},{"type":"plus","content":)"
       R"({"type":"const_string","value":"c"}}]}})");
  // Invalid ones: each must fail with kInvalidArgument.
  seed("bad_", Kind::kJsonSchema, R"({"type":"object","properties":{"a":{"type":"string"})");
  seed("bad_", Kind::kJsonSchema, R"({"$ref":"#/$defs/missing"})");
  seed("bad_", Kind::kJsonSchema, R"({"type":"integer","minimum":5,"maximum":1})");
  seed("bad_", Kind::kJsonSchema, std::string(200, '[') + std::string(200, ']'));
  seed("bad_", Kind::kGrammar, "root ::= \"unclosed\n");
  seed("bad_", Kind::kGrammar, "root ::= ( \"a\" | \"b\"\n");
  seed("bad_", Kind::kGrammar, "start ::= undefined_rule\n");
  seed("bad_", Kind::kRegex, "[a-z");
  seed("bad_", Kind::kRegex, "(ab|c");
  seed("bad_", Kind::kChoices, "a\n\nb");
  seed("bad_", Kind::kStructuralTag, R"({"type":"structural_tag","format":{"type":"tag","begin":"<a>"}})");
}

}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace ember::fuzz;
  write_seeds_if_asked(write_seeds);
  g_tok = ember::Tokenizer::from_vocab(synthetic_vocab("gpt-2"));
  g_stops = g_tok->eog_ids();
  EMBER_FUZZ_CHECK(!g_stops.empty());
  g_never.assign(static_cast<size_t>(g_tok->n_vocab()), false);
  for (int32_t t = 0; t < g_tok->n_vocab(); ++t) {
    const auto type = g_tok->token_type(t);
    g_never[static_cast<size_t>(t)] = !g_tok->is_eog(t) && (type == ember::Tokenizer::TokenType::kControl ||
                                                            type == ember::Tokenizer::TokenType::kUnused);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember;
  using namespace ember::fuzz;
  if (size == 0 || size - 1 > kMaxText) return 0;
  Constraint c;
  c.kind = kKinds[data[0] % 6];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (c.kind == Kind::kChoices) {
    std::string s(rest);
    std::replace(s.begin(), s.end(), '\0', '\n');
    c.choices = split(s, '\n');
  } else {
    c.text = std::string(rest);
  }
  const auto expected = [](const Error& e) {
    EMBER_FUZZ_CHECK(e.code() == StatusCode::kInvalidArgument || e.code() == StatusCode::kUnsupported);
    EMBER_FUZZ_CHECK(e.message().size() > std::string_view("constraint: ").size());
  };
  bool valid = true;
  try {
    c.validate();
  } catch (const Error& e) {
    expected(e);
    valid = false;
  }
  if (!g_compiler || g_compiler->cached() >= kCompilerInputs) {
    g_compiler.reset();
    g_compiler = std::make_unique<grammar::Compiler>(*g_tok);
  }
  std::shared_ptr<const grammar::Compiled> compiled;
  try {
    compiled = g_compiler->compile(c);
  } catch (const Error& e) {
    expected(e);
    return 0;
  }
  // compile() validates first: what validate() refuses never compiles.
  EMBER_FUZZ_CHECK(valid);
  EMBER_FUZZ_CHECK(g_compiler->compile(c) == compiled);
  Rng rng{fnv1a(std::string_view(reinterpret_cast<const char*>(data), size))};
  if (c.kind == Kind::kChoices) {
    // Each choice, as the tokenizer encodes it, is a complete reply.
    const std::string& choice = c.choices[rng.below(c.choices.size())];
    grammar::Matcher m(compiled);
    const std::vector<int32_t> ids = g_tok->encode(choice, /*add_special=*/false, /*parse_special=*/false);
    EMBER_FUZZ_CHECK(m.accept_all(ids) == ids.size());
    EMBER_FUZZ_CHECK(m.allows(g_stops[0]));
  }
  walk(compiled, rng);
  return 0;
}
