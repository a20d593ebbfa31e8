#include "core/grammar/grammar.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "core/tokenizer/tokenizer.h"
#include "core/util/nesting.h"
#include "core/util/utf8.h"

#if EMBER_WITH_XGRAMMAR
#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>
#endif

namespace ember::grammar {

void Constraint::validate() const {
  auto bad = [](const std::string& m) { fail(StatusCode::kInvalidArgument, "constraint: " + m); };
  if (text.size() > kMaxTextBytes) bad("the schema, grammar or regex is larger than 1 MiB");
  if (!is_valid_utf8(text)) bad("the schema, grammar or regex is not valid UTF-8");
  if (nesting_depth(text) > kMaxNesting) {
    bad("the schema, grammar or regex nests brackets more than " + std::to_string(kMaxNesting) + " deep");
  }
  switch (kind) {
    case Kind::kNone:
    case Kind::kJsonObject: return;
    case Kind::kJsonSchema:
    case Kind::kGrammar:
    case Kind::kRegex:
    case Kind::kStructuralTag:
      if (text.empty()) bad("empty schema, grammar or regex");
      return;
    case Kind::kChoices:
      if (choices.empty()) bad("an empty list of choices");
      if (choices.size() > kMaxChoices) bad("more than 4096 choices");
      for (const auto& c : choices) {
        if (c.empty()) bad("an empty choice");
        if (c.size() > 4096) bad("a choice longer than 4096 bytes");
        if (!is_valid_utf8(c)) bad("a choice is not valid UTF-8");
      }
      return;
  }
  bad("unknown constraint kind");
}

#if EMBER_WITH_XGRAMMAR

bool available() { return true; }

class Compiled {
 public:
  explicit Compiled(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

namespace {
// A choice as an EBNF string literal: quotes, backslashes and control
// characters escaped, other UTF-8 as it is. Control characters as \u00XX:
// the engine reads every hex digit after \x ("\x09" + "b" would be U+009B).
std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[ch >> 4];
      out += hex[ch & 15];
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

// The engine's exceptions as ember::Error (what it says is the message).
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(StatusCode::kOutOfMemory, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    // The engine's messages start "[hh:mm:ss] path/file.cc:line: ": the
    // reason is what follows.
    std::string m = e.what();
    if (!m.empty() && m[0] == '[') {
      const size_t cc = m.find(".cc:");
      const size_t colon = cc == std::string::npos ? cc : m.find(": ", cc);
      if (colon != std::string::npos) m.erase(0, colon + 2);
    }
    // Its internal-check prefix says nothing to a user.
    const std::string check = "Check failed: ";
    if (m.compare(0, check.size(), check) == 0) {
      const size_t end = m.find(" is false:");
      if (end != std::string::npos) m.erase(0, end + 10);
    }
    while (!m.empty() && (m.front() == ' ' || m.front() == '\n')) m.erase(0, 1);
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    // Some messages quote the whole input (up to 1 MiB): keep the start.
    constexpr size_t kMaxMessage = 1024;
    if (m.size() > kMaxMessage) {
      size_t cut = kMaxMessage;
      while (cut > 0 && (static_cast<unsigned char>(m[cut]) & 0xC0) == 0x80) --cut;  // whole UTF-8 characters
      m = m.substr(0, cut) + "... (" + std::to_string(m.size()) + " bytes)";
    }
    fail(StatusCode::kInvalidArgument, std::string(what) + ": " + m);
  }
}
}  // namespace

struct Compiler::Impl {
  std::unique_ptr<xgrammar::TokenizerInfo> info;
  std::unique_ptr<xgrammar::GrammarCompiler> compiler;
  mutable std::mutex mutex;
  // The most recently used constraints (a server taking its users' schemas
  // must not grow without bound); a stream keeps its own compiled
  // constraint alive, so dropping one here is always safe.
  struct Entry {
    std::shared_ptr<const Compiled> compiled;
    uint64_t last_use = 0;
  };
  std::map<std::pair<int32_t, std::string>, Entry> cache;
  uint64_t uses = 0;
};

Compiler::Compiler(const Tokenizer& tok) : impl_(std::make_unique<Impl>()) {
  // The vocabulary as stored in the file: byte-level BPE (GPT-2's
  // Ġ-encoded bytes) or SentencePiece with <0xXX> byte tokens. Control and
  // unused tokens are given as empty strings, which the engine treats as
  // special: never allowed, except the end-of-generation tokens, which end a
  // reply once the constraint is complete.
  const int32_t n = tok.n_vocab();
  std::vector<std::string> vocab(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const auto t = tok.token_type(i);
    const bool special = t == Tokenizer::TokenType::kControl || t == Tokenizer::TokenType::kUnused ||
                         t == Tokenizer::TokenType::kUndefined;
    if (!special || tok.is_eog(i)) vocab[static_cast<size_t>(i)] = tok.token_text(i);
  }
  const auto type = tok.vocab_type() == Tokenizer::VocabType::kSpm ? xgrammar::VocabType::BYTE_FALLBACK
                                                                   : xgrammar::VocabType::BYTE_LEVEL;
  std::vector<int32_t> stops(tok.eog_ids().begin(), tok.eog_ids().end());
  guarded("grammar engine", [&] {
    impl_->info = std::make_unique<xgrammar::TokenizerInfo>(vocab, type, n, stops);
    const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
    impl_->compiler = std::make_unique<xgrammar::GrammarCompiler>(*impl_->info, threads, /*cache_enabled=*/false);
    return 0;
  });
}

Compiler::~Compiler() = default;

size_t Compiler::cached() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->cache.size();
}

std::shared_ptr<const Compiled> Compiler::compile(const Constraint& c) {
  c.validate();
  if (!c.active()) fail(StatusCode::kInvalidArgument, "constraint: nothing to compile");
  std::string key_text = c.text;
  if (c.kind == Constraint::Kind::kChoices) {
    key_text.clear();
    for (const auto& s : c.choices) key_text += s + '\0';
  }
  const auto key = std::make_pair(static_cast<int32_t>(c.kind), key_text);
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    auto it = impl_->cache.find(key);
    if (it != impl_->cache.end()) {
      it->second.last_use = ++impl_->uses;
      return it->second.compiled;
    }
  }
  // Compiled outside the lock (two streams with a new schema at once may
  // both compile it; the first one cached wins).
  xgrammar::GrammarCompiler& x = *impl_->compiler;
  auto compiled = guarded("constraint", [&]() -> std::shared_ptr<const Compiled> {
    switch (c.kind) {
      case Constraint::Kind::kJsonSchema:
        return std::make_shared<Compiled>(x.CompileJSONSchema(c.text, /*any_whitespace=*/false));
      case Constraint::Kind::kJsonObject:
        return std::make_shared<Compiled>(x.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false));
      case Constraint::Kind::kGrammar:
        return std::make_shared<Compiled>(x.CompileGrammar(xgrammar::Grammar::FromEBNF(c.text, "root")));
      case Constraint::Kind::kRegex: return std::make_shared<Compiled>(x.CompileRegex(c.text));
      case Constraint::Kind::kChoices: {
        std::string ebnf = "root ::= ";
        for (size_t i = 0; i < c.choices.size(); ++i) ebnf += (i ? " | " : "") + ebnf_literal(c.choices[i]);
        return std::make_shared<Compiled>(x.CompileGrammar(xgrammar::Grammar::FromEBNF(ebnf, "root")));
      }
      case Constraint::Kind::kStructuralTag:
        return std::make_shared<Compiled>(x.CompileStructuralTag(c.text));
      case Constraint::Kind::kNone: break;
    }
    fail(StatusCode::kInvalidArgument, "constraint: unknown kind");
  });
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto& cache = impl_->cache;
  auto [it, inserted] = cache.emplace(key, Impl::Entry{std::move(compiled), 0});
  it->second.last_use = ++impl_->uses;
  if (inserted && cache.size() > kMaxCached) {
    auto oldest = cache.begin();
    for (auto e = cache.begin(); e != cache.end(); ++e) {
      if (e->second.last_use < oldest->second.last_use) oldest = e;
    }
    cache.erase(oldest);
  }
  return it->second.compiled;
}

struct Matcher::Impl {
  std::shared_ptr<const Compiled> compiled;
  std::unique_ptr<xgrammar::GrammarMatcher> m;
  std::vector<int32_t> stops;
  std::vector<bool> special;  // special tokens that are not stops: never accepted
  int32_t vocab = 0;
};

Matcher::Matcher(std::shared_ptr<const Compiled> compiled) : impl_(std::make_unique<Impl>()) {
  impl_->compiled = std::move(compiled);
  guarded("constraint", [&] {
    impl_->m = std::make_unique<xgrammar::GrammarMatcher>(impl_->compiled->grammar);
    const xgrammar::TokenizerInfo info = impl_->compiled->grammar.GetTokenizerInfo();
    impl_->stops = info.GetStopTokenIds();
    impl_->vocab = info.GetVocabSize();
    impl_->special.assign(static_cast<size_t>(impl_->vocab), false);
    for (int32_t t : info.GetSpecialTokenIds()) {
      if (t >= 0 && t < impl_->vocab) impl_->special[static_cast<size_t>(t)] = true;
    }
    for (int32_t t : impl_->stops) {
      if (t >= 0 && t < impl_->vocab) impl_->special[static_cast<size_t>(t)] = false;
    }
    return 0;
  });
}

Matcher::~Matcher() = default;

void Matcher::fill(std::vector<uint32_t>& bits) {
  const size_t words = static_cast<size_t>(xgrammar::GetBitmaskSize(impl_->vocab));
  bits.assign(words, 0u);
  auto only_stops = [&] {
    std::fill(bits.begin(), bits.end(), 0u);
    for (int32_t t : impl_->stops) bits[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
  };
  // Complete: only a stop token may follow (so a stream that ignores EOS
  // still ends its constrained reply there).
  if (impl_->m->IsTerminated()) return only_stops();
  int64_t shape = static_cast<int64_t>(words);
  DLTensor t{};
  t.data = bits.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = &shape;
  const bool restricted = guarded("constraint", [&] { return impl_->m->FillNextTokenBitmask(&t); });
  if (!restricted) std::fill(bits.begin(), bits.end(), ~0u);
  // A dead end (nothing allowed) ends the reply rather than sampling from nothing.
  if (std::all_of(bits.begin(), bits.end(), [](uint32_t w) { return w == 0; })) only_stops();
}

void Matcher::apply(const std::vector<uint32_t>& bits, float* logits, int32_t n_vocab) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int32_t covered = std::min<int32_t>(n_vocab, static_cast<int32_t>(bits.size() * 32));
  // A word at a time: most words of a constraint's mask are all-rejected or
  // all-allowed, handled without looking at their bits one by one.
  const int32_t full_words = covered / 32;
  for (int32_t w = 0; w < full_words; ++w) {
    const uint32_t word = bits[static_cast<size_t>(w)];
    float* row = logits + static_cast<ptrdiff_t>(w) * 32;
    if (word == ~0u) continue;
    if (word == 0u) {
      std::fill(row, row + 32, ninf);
      continue;
    }
    for (int b = 0; b < 32; ++b) {
      if (!(word >> b & 1u)) row[b] = ninf;
    }
  }
  for (int32_t t = full_words * 32; t < covered; ++t) {
    if (!(bits[static_cast<size_t>(t) / 32] >> (t % 32) & 1u)) logits[t] = ninf;
  }
  for (int32_t t = covered; t < n_vocab; ++t) logits[t] = ninf;
}

void Matcher::mask(float* logits, int32_t n_vocab) {
  std::vector<uint32_t> bits;
  fill(bits);
  apply(bits, logits, n_vocab);
}

void Matcher::mask_after(const std::vector<int32_t>& path, float* logits, int32_t n_vocab) {
  const size_t n = accept_all(path);
  if (n == path.size()) {
    mask(logits, n_vocab);
  } else {
    std::fill(logits, logits + n_vocab, -std::numeric_limits<float>::infinity());
  }
  rollback(static_cast<int32_t>(n));
}

bool Matcher::accept(int32_t token) {
  // Special tokens are refused here: XGrammar refuses them too, but writes a
  // warning line to stderr for each (and sample_allowed and the drafts'
  // filter ask about them often).
  if (token < 0 || token >= impl_->vocab || impl_->m->IsTerminated() || impl_->special[static_cast<size_t>(token)]) {
    return false;
  }
  return guarded("constraint", [&] { return impl_->m->AcceptToken(token); });
}

bool Matcher::allows(int32_t token) {
  if (!accept(token)) return false;
  rollback(1);
  return true;
}

size_t Matcher::accept_all(const std::vector<int32_t>& tokens) {
  size_t n = 0;
  while (n < tokens.size() && accept(tokens[n])) ++n;
  return n;
}

void Matcher::rollback(int32_t n) {
  if (n > 0) guarded("constraint", [&] { return impl_->m->Rollback(n), 0; });
}

bool Matcher::terminated() const { return impl_->m->IsTerminated(); }

#else  // !EMBER_WITH_XGRAMMAR

bool available() { return false; }

class Compiled {};

namespace {
[[noreturn]] void unavailable() {
  fail(StatusCode::kUnsupported,
       "structured output is not built in: run tools/fetch_xgrammar.sh (tools/setup.sh does) and rebuild");
}
}  // namespace

struct Compiler::Impl {};
Compiler::Compiler(const Tokenizer&) { unavailable(); }
Compiler::~Compiler() = default;
size_t Compiler::cached() const { return 0; }
std::shared_ptr<const Compiled> Compiler::compile(const Constraint&) { unavailable(); }

struct Matcher::Impl {};
Matcher::Matcher(std::shared_ptr<const Compiled>) { unavailable(); }
Matcher::~Matcher() = default;
void Matcher::fill(std::vector<uint32_t>&) { unavailable(); }
void Matcher::apply(const std::vector<uint32_t>&, float*, int32_t) { unavailable(); }
void Matcher::mask(float*, int32_t) { unavailable(); }
void Matcher::mask_after(const std::vector<int32_t>&, float*, int32_t) { unavailable(); }
bool Matcher::accept(int32_t) { unavailable(); }
bool Matcher::allows(int32_t) { unavailable(); }
size_t Matcher::accept_all(const std::vector<int32_t>&) { unavailable(); }
void Matcher::rollback(int32_t) { unavailable(); }
bool Matcher::terminated() const { return false; }

#endif

}  // namespace ember::grammar
