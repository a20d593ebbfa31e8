// core::grammar — structured output: a stream's reply held to a JSON schema,
// a grammar (GBNF in llama.cpp's notation, XGrammar's EBNF), a regex or a
// list of choices, by a bitmask over the vocabulary applied to every row of
// logits a token is chosen from, before the sampler sees it (so a token the
// grammar rejects is never sampled, nor accepted by speculative
// verification). The engine is XGrammar (tools/fetch_xgrammar.sh; pinned,
// built from source by cmake/EmberXgrammar.cmake): its compiler turns a
// constraint and the model's vocabulary into a CompiledGrammar once (cached
// per engine by constraint), and a Matcher per stream follows the tokens the
// stream keeps, with rollback for the branches of a speculative tree.
//
// Threads: a Compiler is shared by the engine's streams (its cache locks);
// a Matcher belongs to one stream and is used by one thread at a time (the
// engine's step, or the worker that fills its mask during a forward pass).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/util/status.h"

namespace ember {
class Tokenizer;
}

namespace ember::grammar {

// What a stream's reply must match: at most one kind.
struct Constraint {
  // kStructuralTag: XGrammar's structural tag (JSON), which tool calling
  // builds (core/chat/tools.h): free text until a trigger, then a tool call
  // held to its argument schema.
  enum class Kind : int32_t { kNone = 0, kJsonSchema, kJsonObject, kGrammar, kRegex, kChoices, kStructuralTag };
  Kind kind = Kind::kNone;
  std::string text;                  // the schema, grammar or regex
  std::vector<std::string> choices;  // kChoices: the reply is exactly one of them
  bool active() const { return kind != Kind::kNone; }
  // The limits every constraint is held to (hostile input: huge or deeply
  // nested schemas and grammars fail with kInvalidArgument, never hang).
  static constexpr size_t kMaxTextBytes = 1 << 20;
  static constexpr size_t kMaxChoices = 4096;
  static constexpr size_t kMaxNesting = 128;  // brackets inside brackets
  // Throws ember::Error(kInvalidArgument) naming the problem.
  void validate() const;
};

// Whether this build has the structured-output engine (XGrammar).
bool available();

class Compiled;

// The model's vocabulary as the grammar engine sees it, and the compiled
// constraints (cached by kind and text, the kMaxCached most recently used: a
// stream with the same schema as a recent one starts without compiling).
class Compiler {
 public:
  // Throws ember::Error(kUnsupported) when the build has no grammar engine.
  explicit Compiler(const Tokenizer& tokenizer);
  ~Compiler();
  // Compiles (or finds) `c`. Throws ember::Error(kInvalidArgument) with the
  // engine's message for a schema, grammar or regex it cannot take.
  std::shared_ptr<const Compiled> compile(const Constraint& c);
  size_t cached() const;
  // The most constraints kept compiled (least recently used dropped first).
  static constexpr size_t kMaxCached = 64;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One stream's position in its constraint.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Compiled> compiled);
  ~Matcher();
  // The tokens allowed next, as a bitmask (bit t of word t / 32).
  void fill(std::vector<uint32_t>& bitmask);
  // Sets every logit the bitmask rejects to -inf.
  static void apply(const std::vector<uint32_t>& bitmask, float* logits, int32_t n_vocab);
  // fill() + apply() on one row.
  void mask(float* logits, int32_t n_vocab);
  // The mask of a row that follows `path` after the accepted tokens (a
  // speculative tree's node): nothing allowed when the path leaves the
  // constraint (such a node is never reached). The state is unchanged.
  void mask_after(const std::vector<int32_t>& path, float* logits, int32_t n_vocab);
  // Advances by one token; false (and no change) when the grammar rejects it.
  bool accept(int32_t token);
  // Whether `token` may come next (the state is unchanged).
  bool allows(int32_t token);
  // Accepts `tokens` in order up to the first the grammar rejects; returns
  // how many it accepted.
  size_t accept_all(const std::vector<int32_t>& tokens);
  // Takes back the last `n` accepted tokens.
  void rollback(int32_t n);
  // The constraint is complete and only a stop token may follow.
  bool terminated() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::grammar
