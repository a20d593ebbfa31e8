// Speculative decoding on the real model and on small synthetic ones: greedy
// output identical with and without speculation for every drafter (24
// prompts), with stop strings, max tokens, sink sessions, batching, session
// files; and sampled output distributed exactly as the target's (chi-square
// on 100,000 continuations of a 32-token model against a draft that differs
// on purpose), which a deliberately broken acceptance rule fails.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/engine/engine.h"
#include "core/speculative/tree.h"
#include "core/tokenizer/tokenizer.h"
#include "model_path.h"

namespace ember {
namespace {

std::shared_ptr<Model> model() {
  static std::shared_ptr<Model> m = Model::load(test::default_model_path());
  return m;
}

bool reduced() {
  const char* e = std::getenv("EMBER_TEST_REDUCED");
  return e && *e && *e != '0';
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  EndReason end = EndReason::kNone;
  StreamStats stats;
};

Outcome run(const std::shared_ptr<Stream>& s) {
  Outcome r;
  for (;;) {
    StreamEvent ev;
    const StatusCode c = s->next(ev, 120000);
    EXPECT_EQ(c, StatusCode::kOk);
    if (c != StatusCode::kOk) break;
    if (ev.type == StreamEvent::kText) {
      r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      r.text += ev.text;
    } else {
      EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
      r.end = ev.end_reason;
      break;
    }
  }
  r.stats = s->stats();
  return r;
}

StreamParams greedy(int n) {
  StreamParams p;
  p.max_tokens = n;
  p.sampling.temperature = 0.0f;
  return p;
}

StreamParams with_spec(StreamParams p, SpecParams::Kind kind, int32_t self_layers = 0,
                       std::shared_ptr<const Model> draft = nullptr) {
  p.spec.kind = kind;
  p.spec.self_layers = self_layers;
  p.spec.draft_model = std::move(draft);
  return p;
}

// Chat prompts (some ask the model to work from a given text, where the
// n-gram drafter finds its drafts) and completion prompts.
struct Prompt {
  bool chat;
  const char* text;
};
const Prompt kPrompts[] = {
    {true, "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog."},
    {true, "What is the capital of France?"},
    {true, "Write a haiku about the sea."},
    {true, "List three primary colours."},
    {true, "Summarise: The library opens at nine and closes at five. The library is closed on Sundays."},
    {true, "Translate 'good morning' into Spanish."},
    {true, "Give me a short tip for staying focused while studying."},
    {true, "Rewrite in the past tense: I walk to the market and I buy bread."},
    {true, "Explain what a prime number is in one sentence."},
    {true, "Name the planets of the solar system in order."},
    {true, "Write a Python function that returns the square of a number."},
    {true, "Complete the list: Monday, Tuesday, Wednesday,"},
    {false, "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"},
    {false, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"},
    {false, "The cat sat on the mat. The dog sat on the log. The bird sat on the"},
    {false, "Once upon a time, in a small village by the sea,"},
    {false, "To be, or not to be, that is the question:"},
    {false, "The history of science is"},
    {false, "Dear Sir or Madam, I am writing to"},
    {false, "<html>\n<body>\n<ul>\n<li>One</li>\n<li>Two</li>\n"},
    {false, "Alice: Hello Bob!\nBob: Hello Alice!\nAlice: How are you?\nBob:"},
    {false, "The recipe calls for two cups of flour, one cup of sugar, and"},
    {false, "for (int i = 0; i < n; ++i) {\n  sum += a[i];\n}\nfor (int i = 0; i < n; ++i) {\n"},
    {false, "In 1969, the first humans landed on"},
};
static_assert(sizeof(kPrompts) / sizeof(kPrompts[0]) == 24);

std::shared_ptr<Session> session_with(const std::shared_ptr<EngineOwner>& engine, const Prompt& p) {
  auto s = std::make_shared<Session>(engine, 0, "");
  if (p.chat) {
    s->add_message("user", p.text);
  } else {
    s->add_text(p.text, false);
  }
  return s;
}

// Every prompt: plain greedy decoding and speculative decoding give the same
// tokens, text and end; the drafter must actually have been accepted.
void expect_identical(SpecParams::Kind kind, int32_t self_layers, std::shared_ptr<const Model> draft,
                      bool lookup = true, bool gate = true) {
  auto engine = Engine::create(model(), EngineParams{});
  const int n_tokens = reduced() ? 16 : 40;
  const size_t n_prompts = reduced() ? 6 : std::size(kPrompts);
  uint64_t accepted = 0, passes = 0;
  for (size_t i = 0; i < n_prompts; ++i) {
    const Outcome plain = run(session_with(engine, kPrompts[i])->start(greedy(n_tokens)));
    StreamParams sp = with_spec(greedy(n_tokens), kind, self_layers, draft);
    // Without the lookup and the gate, a model drafter's model runs on every tree.
    sp.spec.draft_lookup = lookup;
    sp.spec.payoff_gate = gate;
    const Outcome spec = run(session_with(engine, kPrompts[i])->start(sp));
    EXPECT_EQ(spec.tokens, plain.tokens) << "prompt " << i << ": " << kPrompts[i].text;
    EXPECT_EQ(spec.text, plain.text) << "prompt " << i;
    EXPECT_EQ(spec.end, plain.end) << "prompt " << i;
    EXPECT_EQ(spec.stats.generated_tokens, plain.stats.generated_tokens);
    accepted += spec.stats.accepted_tokens;
    passes += spec.stats.verify_passes;
  }
  EXPECT_GT(passes, 0u);
  EXPECT_GT(accepted, 0u) << "no drafted token was ever accepted";
}

TEST(Speculative, NgramGreedyIdenticalOn24Prompts) {
  EMBER_REQUIRE_MODEL();
  expect_identical(SpecParams::Kind::kNgram, 0, nullptr);
}

TEST(Speculative, SelfGreedyIdenticalOn24Prompts) {
  EMBER_REQUIRE_MODEL();
  expect_identical(SpecParams::Kind::kSelf, 20, nullptr, /*lookup=*/false, /*gate=*/false);  // the early exit alone
  expect_identical(SpecParams::Kind::kSelf, 0, nullptr);                                     // as the C ABI runs it
}

// Self-speculation's early exit skips trees after trees whose drafts did not
// pay for its forward passes (SmolLM2 was not trained for early exit: at 20
// of 30 layers it rarely agrees with the whole model), so it drafts far less
// than without the gate; outputs are the same either way.
TEST(Speculative, SelfEarlyExitSkipsTreesWhereItDoesNotPay) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(model(), EngineParams{});
  const Prompt& chat = kPrompts[6];  // (nothing to copy: no lookup drafts)
  auto drafted = [&](bool gate, std::vector<int32_t>* tokens) {
    StreamParams sp = with_spec(greedy(32), SpecParams::Kind::kSelf, 20);
    sp.spec.draft_lookup = false;
    sp.spec.payoff_gate = gate;
    const Outcome r = run(session_with(engine, chat)->start(sp));
    *tokens = r.tokens;
    return r.stats.drafted_tokens;
  };
  std::vector<int32_t> gated, ungated;
  const uint64_t with_gate = drafted(true, &gated), without = drafted(false, &ungated);
  EXPECT_EQ(gated, ungated);
  EXPECT_GT(without, 8u);
  EXPECT_LT(with_gate * 3, without) << "with the gate " << with_gate << ", without " << without;
}

// The draft is the target's own file loaded a second time: it proves
// exactness (every mismatch would show), not speed (its payoff gate would
// never run it: it costs a whole decode step per drafted token).
TEST(Speculative, DraftModelGreedyIdenticalOn24Prompts) {
  EMBER_REQUIRE_MODEL();
  expect_identical(SpecParams::Kind::kDraft, 0, Model::load(test::default_model_path()), /*lookup=*/true,
                   /*gate=*/false);
}

// Stop strings, max tokens and EOS end a speculative stream exactly where a
// plain one ends, and the session's history (and so its next turn) is the
// same.
TEST(Speculative, StopStringsAndTheNextTurnMatchPlainDecoding) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(model(), EngineParams{});
  const char* kText = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";
  for (const char* stop : {"16", " 20,", "13, 14"}) {
    StreamParams p = greedy(64);
    p.stop = {stop};
    auto a = std::make_shared<Session>(engine, 0, "");
    a->add_text(kText, false);
    const Outcome plain = run(a->start(p));
    auto b = std::make_shared<Session>(engine, 0, "");
    b->add_text(kText, false);
    const Outcome spec = run(b->start(with_spec(p, SpecParams::Kind::kNgram)));
    EXPECT_EQ(plain.end, EndReason::kStopString) << stop;
    EXPECT_EQ(spec.end, plain.end) << stop;
    EXPECT_EQ(spec.text, plain.text) << stop;
    EXPECT_GT(spec.stats.accepted_tokens, 0u) << stop;
    EXPECT_EQ(b->token_count(), a->token_count()) << stop;
    // The next turn continues from the same history.
    a->add_text(" and then", false);
    b->add_text(" and then", false);
    EXPECT_EQ(run(b->start(with_spec(greedy(12), SpecParams::Kind::kNgram))).tokens, run(a->start(greedy(12))).tokens);
  }
  // max_tokens: never more than asked, even when a whole tree is accepted.
  for (int n : {1, 2, 5, 9}) {
    auto s = std::make_shared<Session>(engine, 0, "");
    s->add_text(kText, false);
    const Outcome r = run(s->start(with_spec(greedy(n), SpecParams::Kind::kNgram)));
    EXPECT_EQ(r.stats.generated_tokens, static_cast<size_t>(n));
    EXPECT_EQ(r.end, EndReason::kMaxTokens);
  }
}

// A stop string inside an accepted speculative run: the outcome phase cuts
// the run at the token that completes it, so the tokens after it never enter
// the session's history or KV. Watched from the stream's callback, which
// runs at every event on the engine's thread: the history never holds more
// than the prompt and the tokens the stream kept.
TEST(Speculative, StopStringInsideAnAcceptedRunNeverEntersTheKv) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(model(), EngineParams{});
  const char* kText = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";
  uint64_t accepted = 0;
  for (const char* stop : {"14", " 17,", "19, 20"}) {
    auto s = std::make_shared<Session>(engine, 0, "");
    s->add_text(kText, false);
    const size_t prompt = s->token_count();
    StreamParams p = with_spec(greedy(64), SpecParams::Kind::kNgram);
    p.stop = {stop};
    std::shared_ptr<Stream> stream = s->start(p);
    std::mutex m;
    size_t most = 0;
    EndReason end = EndReason::kNone;
    stream->set_callback([&](const StreamEvent& ev) {
      const size_t n = s->token_count();
      std::lock_guard<std::mutex> lock(m);
      most = std::max(most, n);
      if (ev.type == StreamEvent::kEnd) end = ev.end_reason;
      return false;
    });
    stream->wait();
    const StreamStats st = stream->stats();
    EXPECT_EQ(end, EndReason::kStopString) << stop;
    EXPECT_EQ(s->token_count(), prompt + st.generated_tokens) << stop;
    EXPECT_LE(most, prompt + st.generated_tokens) << stop << ": tokens past the stop entered the history";
    accepted += st.accepted_tokens;
  }
  EXPECT_GT(accepted, 0u);
}

// A mask shaped like a grammar's (the engine's test hook in the outcome
// phase) rejects a token on every row before sampling and before
// verification: neither plain nor speculative decoding emits it or lets it
// into the history, and greedy output is the same with and without
// speculation (drafts the mask rejects are cut before anything is
// committed).
int32_t g_banned = -1;
TEST(Speculative, OutcomeMaskCutsTokensBeforeCommit) {
  EMBER_REQUIRE_MODEL();
  const std::vector<int32_t> comma = model()->tokenizer().encode(",", false, false);
  ASSERT_EQ(comma.size(), 1u);
  g_banned = comma[0];
  auto engine = Engine::create(model(), EngineParams{});
  const char* kText = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";
  auto generate = [&](const StreamParams& p, std::vector<int32_t>* history) {
    auto s = std::make_shared<Session>(engine, 0, "");
    s->add_text(kText, false);
    const size_t prompt = s->token_count();
    const Outcome r = run(s->start(p));
    std::lock_guard<std::mutex> lock(s->kv().mutex());
    history->assign(s->kv().tokens().begin() + static_cast<std::ptrdiff_t>(prompt), s->kv().tokens().end());
    return r;
  };
  auto has_banned = [](const std::vector<int32_t>& t) { return std::count(t.begin(), t.end(), g_banned) > 0; };
  std::vector<int32_t> h_free, h_plain, h_spec;
  const Outcome free_run = generate(greedy(32), &h_free);
  ASSERT_TRUE(has_banned(free_run.tokens)) << "the model does not emit the token this test bans";
  testing::g_outcome_mask_hook = [](int32_t, float* row, int32_t) { row[g_banned] = -INFINITY; };
  struct Reset {
    ~Reset() { testing::g_outcome_mask_hook = nullptr; }
  } reset;
  const Outcome plain = generate(greedy(32), &h_plain);
  const Outcome spec = generate(with_spec(greedy(32), SpecParams::Kind::kNgram), &h_spec);
  EXPECT_FALSE(has_banned(plain.tokens));
  EXPECT_FALSE(has_banned(h_plain));
  EXPECT_FALSE(has_banned(h_spec));
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_EQ(h_spec, h_plain);
  EXPECT_GT(spec.stats.drafted_tokens, 0u) << "the n-gram drafter proposed nothing to reject";
}

// Several sessions speculating (and one not) in the same steps compute what
// each computes alone; a sink session streams past its cache with
// speculation; a saved speculative session continues exactly.
TEST(Speculative, BatchedSinkSessionAndSessionFile) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(model(), EngineParams{});
  const int n = reduced() ? 16 : 32;
  std::vector<Outcome> solo;
  for (int i = 0; i < 4; ++i) {
    solo.push_back(run(session_with(engine, kPrompts[12 + i])->start(greedy(n))));
  }
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::shared_ptr<Stream>> streams;
  for (int i = 0; i < 4; ++i) {
    sessions.push_back(session_with(engine, kPrompts[12 + i]));
    const auto kind = i == 3 ? SpecParams::Kind::kNone : (i == 2 ? SpecParams::Kind::kSelf : SpecParams::Kind::kNgram);
    streams.push_back(sessions.back()->start(with_spec(greedy(n), kind, 20)));
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(run(streams[i]).tokens, solo[i].tokens) << i;

  // Sink: 4 sinks + a 60-token window, 120 tokens generated: evictions
  // happen between trees (a tree never crosses one).
  CachePolicy sink;
  sink.kind = CachePolicyKind::kSink;
  sink.sink_tokens = 4;
  sink.window_tokens = 60;
  auto plain_sink = std::make_shared<Session>(engine, 0, "", 0, sink);
  plain_sink->add_text(kPrompts[13].text, false);
  const Outcome want = run(plain_sink->start(greedy(120)));
  auto spec_sink = std::make_shared<Session>(engine, 0, "", 0, sink);
  spec_sink->add_text(kPrompts[13].text, false);
  const Outcome got = run(spec_sink->start(with_spec(greedy(120), SpecParams::Kind::kNgram)));
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.stats.accepted_tokens, 0u);
  EXPECT_GT(spec_sink->cache_info().evicted, 0u);

  // Session file: save after a speculative turn, load, continue both ways.
  const std::string path = (std::filesystem::temp_directory_path() / "ember_spec_session.bin").string();
  auto a = session_with(engine, kPrompts[0]);
  run(a->start(with_spec(greedy(n), SpecParams::Kind::kNgram)));
  a->save(path);
  auto b = Session::load(engine, path);
  a->add_message("user", "Again, please.");
  b->add_message("user", "Again, please.");
  EXPECT_EQ(run(b->start(with_spec(greedy(n), SpecParams::Kind::kNgram))).tokens, run(a->start(greedy(n))).tokens);
  std::filesystem::remove(path);
}

std::string synthetic(const char* name) { return std::string(EMBER_SYNTHETIC_DIR) + "/" + name; }

// The draft model's KV lives in the engine's pool: its 3 layers of 16-wide
// K/V rows as a KvView in the target's 2-layer blocks of 32-wide rows. The
// greedy output is the plain one (the draft is random: few tokens accepted,
// many drafted); while the stream runs the pool holds the draft's blocks
// beside the target's (two groups of its layers: twice the target's count),
// and gives them back at the end of the step that finishes the stream. With
// too small a pool for both, the stream still decodes exactly, drafting less.
TEST(Speculative, DraftModelKvLivesInTheEnginesPool) {
  auto target = Model::load(synthetic("spec_target.gguf"));
  auto draft = Model::load(synthetic("spec_draft.gguf"));
  ASSERT_NE(draft->config().n_layers, target->config().n_layers);
  ASSERT_LT(draft->config().head_dim, target->config().head_dim);
  const uint64_t block_bytes = 2 * 2 * 16 * 32 * 2;  // the target's: layers x K/V x slots x row x f16
  for (uint64_t blocks : {uint64_t{16384}, uint64_t{40}}) {
    EngineParams ep;
    ep.n_threads = 1;
    ep.kv_memory_bytes = blocks * block_bytes;
    ep.manual = true;  // steps run here, so the pool can be read between them
    auto engine = Engine::create(target, ep);
    auto drive = [&](const std::shared_ptr<Stream>& stream, size_t* peak) {
      while (!stream->finished()) {
        (*engine)->run_steps(0, 64);
        if (peak) *peak = std::max<size_t>(*peak, (*engine)->cache_stats().blocks_used);
      }
      return run(stream);
    };
    uint64_t drafted = 0;
    for (const std::vector<int32_t>& prompt :
         {std::vector<int32_t>{5, 9, 14, 7}, std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>(300, 11)}) {
      auto a = std::make_shared<Session>(engine, 0, "");
      a->add_tokens(prompt);
      size_t plain_peak = 0, spec_peak = 0;
      const Outcome plain = drive(a->start(greedy(40)), &plain_peak);
      auto b = std::make_shared<Session>(engine, 0, "");
      b->add_tokens(prompt);
      StreamParams sp = with_spec(greedy(40), SpecParams::Kind::kDraft, 0, draft);
      sp.spec.draft_lookup = false;        // (the draft model itself, on every tree)
      sp.spec.tree.min_confidence = 0.0f;  // (the random draft's distributions are flat)
      std::shared_ptr<Stream> stream = b->start(sp);
      const Outcome spec = drive(stream, &spec_peak);
      EXPECT_EQ(spec.tokens, plain.tokens) << prompt.size() << " tokens, pool " << blocks;
      drafted += spec.stats.drafted_tokens;
      if (blocks > 1000 && prompt.size() == 300) {
        EXPECT_GE(spec_peak, 3 * (prompt.size() + 40) / 16) << "the draft's blocks are not in the engine's pool";
        EXPECT_LE(plain_peak, (prompt.size() + 40) / 16 + 2);
      }
      EXPECT_EQ((*engine)->cache_stats().blocks_used, 0u) << "a finished stream still holds blocks";
    }
    EXPECT_GT(drafted, 0u) << "pool of " << blocks << " blocks";
    if (blocks < 1000) continue;
    // A sink session evicts and K-shifts the draft's view rows too.
    CachePolicy sink;
    sink.kind = CachePolicyKind::kSink;
    sink.sink_tokens = 4;
    sink.window_tokens = 60;
    std::vector<int32_t> prompt(100);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7 + 3) % 32);
    auto a = std::make_shared<Session>(engine, 0, "", 0, sink);
    a->add_tokens(prompt);
    const Outcome plain = drive(a->start(greedy(120)), nullptr);
    auto b = std::make_shared<Session>(engine, 0, "", 0, sink);
    b->add_tokens(prompt);
    StreamParams sp = with_spec(greedy(120), SpecParams::Kind::kDraft, 0, draft);
    sp.spec.draft_lookup = false;  // (the draft model itself, on every tree)
    sp.spec.tree.min_confidence = 0.0f;
    const Outcome spec = drive(b->start(sp), nullptr);
    EXPECT_EQ(spec.tokens, plain.tokens) << "sink session";
    EXPECT_GT(spec.stats.drafted_tokens, 0u);
  }
}

// Where an early exit agrees with the model (a synthetic model whose layers
// from 2 on add nothing), the payoff gate lets it draft: whole chains are
// accepted, with the plain output. (SmolLM2's exits do not agree: the test
// above.)
TEST(Speculative, SelfEarlyExitDraftsWhereItAgrees) {
  auto target = Model::load(synthetic("exit_agrees.gguf"));
  auto engine = Engine::create(target, EngineParams{});
  const std::vector<int32_t> prompt = {5, 9, 14, 7, 21, 3};
  auto a = std::make_shared<Session>(engine, 0, "");
  a->add_tokens(prompt);
  StreamParams p = greedy(64);
  p.ignore_eos = true;  // (a random model's text may reach its end-of-text token)
  const Outcome plain = run(a->start(p));
  auto b = std::make_shared<Session>(engine, 0, "");
  b->add_tokens(prompt);
  StreamParams sp = with_spec(p, SpecParams::Kind::kSelf, 2);
  sp.spec.draft_lookup = false;  // (the exit alone; the gate on)
  const Outcome spec = run(b->start(sp));
  ASSERT_EQ(plain.tokens.size(), 64u);
  EXPECT_EQ(spec.tokens, plain.tokens);
  EXPECT_GE(spec.stats.drafted_tokens, 24u);
  EXPECT_GE(spec.stats.accepted_tokens * 10, spec.stats.drafted_tokens * 9)
      << spec.stats.accepted_tokens << " of " << spec.stats.drafted_tokens;
  EXPECT_GE(spec.stats.accepted_tokens, 24u);
}

// The draft model's KV is a cache of the target's history: when a target
// sequence lacks blocks it goes first (KvBudget::reclaim), so a stream that
// arrives while a draft holds much of the pool starts at once instead of
// waiting for the speculating stream to end. Outputs stay the references'.
TEST(Speculative, DraftKvGivesWayToTheTargetsSequences) {
  auto target = Model::load(synthetic("spec_target.gguf"));
  auto draft = Model::load(synthetic("spec_draft.gguf"));
  const uint64_t block_bytes = 2 * 2 * 16 * 32 * 2;  // the target's (see above)
  const int n_gen = 60;
  const std::vector<int32_t> prompt_s(300, 11);
  std::vector<int32_t> prompt_p(300);
  for (size_t i = 0; i < prompt_p.size(); ++i) prompt_p[i] = static_cast<int32_t>((i * 5 + 1) % 32);
  auto spec_params = [&] {
    StreamParams sp = with_spec(greedy(n_gen), SpecParams::Kind::kDraft, 0, draft);
    sp.spec.draft_lookup = false;        // (the draft model itself, on every tree)
    sp.spec.tree.min_confidence = 0.0f;  // (the random draft's distributions are flat)
    return sp;
  };
  auto make_engine = [&](uint64_t blocks) {
    EngineParams ep;
    ep.n_threads = 1;
    ep.kv_memory_bytes = blocks * block_bytes;
    ep.manual = true;
    return Engine::create(target, ep);
  };
  // References and the blocks each needs, alone in a large pool.
  size_t peak_spec = 0, peak_p = 0;
  Outcome ref_s, ref_p;
  {
    auto engine = make_engine(16384);
    auto drive = [&](const std::shared_ptr<Stream>& stream, size_t* peak) {
      while (!stream->finished()) {
        (*engine)->run_steps(0, 64);
        *peak = std::max<size_t>(*peak, (*engine)->cache_stats().blocks_used);
      }
      return run(stream);
    };
    size_t unused = 0;
    auto a = std::make_shared<Session>(engine, 0, "");
    a->add_tokens(prompt_s);
    ref_s = drive(a->start(greedy(n_gen)), &unused);
    auto b = std::make_shared<Session>(engine, 0, "");
    b->add_tokens(prompt_p);
    ref_p = drive(b->start(greedy(n_gen)), &peak_p);
    auto c = std::make_shared<Session>(engine, 0, "");
    c->add_tokens(prompt_s);
    const Outcome spec = drive(c->start(spec_params()), &peak_spec);
    ASSERT_EQ(spec.tokens, ref_s.tokens);
  }
  // The speculating stream and its draft fit; a second stream's prompt does
  // not fit beside them, but does beside the first stream alone.
  auto engine = make_engine(peak_spec + 2);
  auto s = std::make_shared<Session>(engine, 0, "");
  s->add_tokens(prompt_s);
  std::shared_ptr<Stream> stream_s = s->start(spec_params());
  // (steps of up to 16 tokens: room for trees)
  while (!stream_s->finished() && stream_s->stats().generated_tokens < 4) (*engine)->run_steps(0, 16);
  ASSERT_FALSE(stream_s->finished());
  const size_t used = (*engine)->cache_stats().blocks_used;
  ASSERT_GT(used + (prompt_p.size() + 15) / 16, peak_spec + 2) << "the test's pool is too large";
  ASSERT_LE(peak_p + (prompt_s.size() + n_gen) / 16 + 2, peak_spec + 2) << "the test's pool is too small";
  auto p = std::make_shared<Session>(engine, 0, "");
  p->add_tokens(prompt_p);
  std::shared_ptr<Stream> stream_p = p->start(greedy(n_gen));
  // The first step takes the whole prompt as one chunk (19 blocks), which
  // fits only once the draft gave its blocks back.
  (*engine)->run_steps(0, 300);
  EXPECT_GT(p->kv().n_computed(), 0u);
  EXPECT_GE((*engine)->scheduler_stats().reclaimed, 1u) << "the draft's blocks were not taken back";
  while (!stream_s->finished() || !stream_p->finished()) (*engine)->run_steps(0, 64);
  const Outcome out_s = run(stream_s), out_p = run(stream_p);
  EXPECT_EQ(out_s.tokens, ref_s.tokens);
  EXPECT_EQ(out_p.tokens, ref_p.tokens);
  EXPECT_GT(out_s.stats.drafted_tokens, 0u);
  EXPECT_EQ((*engine)->scheduler_stats().preempted, 0u);
  EXPECT_EQ((*engine)->cache_stats().blocks_used, 0u);
}

TEST(Speculative, DraftWithAnotherVocabularyIsRefused) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(model(), EngineParams{});
  auto s = std::make_shared<Session>(engine, 0, "");
  s->add_text("Hello", false);
  try {
    s->start(with_spec(greedy(4), SpecParams::Kind::kDraft, 0, Model::load(synthetic("llama3.gguf"))));
    FAIL() << "a draft with another vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.message().find("vocabulary"), std::string::npos) << e.message();
  }
  // The session is not left busy.
  EXPECT_EQ(run(s->start(greedy(2))).stats.generated_tokens, 2u);
  // Self-speculation needs fewer layers than the model has.
  EXPECT_THROW(s->start(with_spec(greedy(4), SpecParams::Kind::kSelf, 1000)), Error);
}

// ---------------------------------------------------------------- distribution

// Upper tail of the chi-square distribution with k degrees of freedom:
// Q(k/2, x/2), the regularised upper incomplete gamma function (series below
// a + 1, Lentz's continued fraction above).
double chi2_p_value(double x, int k) {
  const double a = k / 2.0, z = x / 2.0;
  if (z <= 0) return 1.0;
  const double log_pre = a * std::log(z) - z - std::lgamma(a);
  if (z < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000; ++n) {
      term *= z / (a + n);
      sum += term;
      if (term < sum * 1e-15) break;
    }
    return 1.0 - sum * std::exp(log_pre);
  }
  const double tiny = 1e-300;
  double b = z + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(log_pre) * h;
}

// Pearson's test of observed counts against expected probabilities (bins
// expected below 5 are pooled). Returns the p-value.
double chi2_test(const std::vector<uint64_t>& observed, const std::vector<double>& expected_p, uint64_t n) {
  double stat = 0, pool_o = 0, pool_e = 0;
  int bins = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double e = expected_p[i] * static_cast<double>(n);
    if (e < 5) {
      pool_o += static_cast<double>(observed[i]);
      pool_e += e;
      continue;
    }
    stat += (static_cast<double>(observed[i]) - e) * (static_cast<double>(observed[i]) - e) / e;
    ++bins;
  }
  if (pool_e > 0) {
    stat += (pool_o - pool_e) * (pool_o - pool_e) / std::max(pool_e, 1e-9);
    ++bins;
  }
  return chi2_p_value(stat, std::max(bins - 1, 1));
}

// The sampler's temperature softmax (no truncation).
std::vector<double> softmax(const float* logits, int n, double temperature) {
  std::vector<double> p(static_cast<size_t>(n));
  const float mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += p[i] = std::exp(static_cast<double>(logits[i] - mx) / temperature);
  for (auto& x : p) x /= sum;
  return p;
}

struct DistributionRun {
  std::vector<double> p_value;  // per position
  uint64_t accepted = 0, drafted = 0;
};

// `n` continuations sampled at temperature kTemperature (no truncation)
// from the 32-token target with the draft model drafting trees; per position
// the marginal frequencies against the target's exact marginals.
constexpr double kTemperature = 0.5;  // (the random model's logits are flat: sharpen them)

DistributionRun sample_distribution(uint64_t n) {
  auto target = Model::load(synthetic("spec_target.gguf"));
  auto draft = Model::load(synthetic("spec_draft.gguf"));
  const int V = target->config().n_vocab;
  const std::vector<int32_t> prompt = {5, 9, 14, 7};
  constexpr int kPositions = 3;
  EngineParams ep;
  ep.n_threads = 1;
  ep.prefix_caching = false;
  ep.kv_memory_bytes = 64 << 20;
  auto engine = Engine::create(target, ep);

  // Exact marginals: p1(a), p2(b) = sum_a p1(a) p(b|a), p3(c) = sum_ab ...
  auto next_dist = [&](const std::vector<int32_t>& ctx) {
    std::vector<float> logits(ctx.size() * static_cast<size_t>(V));
    (*engine)->score(ctx.data(), ctx.size(), nullptr, logits.data());
    return softmax(logits.data() + (ctx.size() - 1) * static_cast<size_t>(V), V, kTemperature);
  };
  std::vector<std::vector<double>> marg(kPositions, std::vector<double>(static_cast<size_t>(V), 0.0));
  const std::vector<double> p1 = next_dist(prompt);
  marg[0] = p1;
  for (int a = 0; a < V; ++a) {
    std::vector<int32_t> ca = prompt;
    ca.push_back(a);
    const std::vector<double> p2 = next_dist(ca);
    for (int b = 0; b < V; ++b) {
      marg[1][static_cast<size_t>(b)] += p1[static_cast<size_t>(a)] * p2[static_cast<size_t>(b)];
      std::vector<int32_t> cb = ca;
      cb.push_back(b);
      const std::vector<double> p3 = next_dist(cb);
      const double w = p1[static_cast<size_t>(a)] * p2[static_cast<size_t>(b)];
      for (int c = 0; c < V; ++c) marg[2][static_cast<size_t>(c)] += w * p3[static_cast<size_t>(c)];
    }
  }

  std::vector<std::vector<uint64_t>> counts(kPositions, std::vector<uint64_t>(static_cast<size_t>(V), 0));
  DistributionRun out;
  constexpr int kParallel = 32;
  std::vector<std::shared_ptr<Session>> sessions;
  for (int i = 0; i < kParallel; ++i) sessions.push_back(std::make_shared<Session>(engine, 0, ""));
  for (uint64_t done = 0; done < n;) {
    std::vector<std::shared_ptr<Stream>> streams;
    for (int i = 0; i < kParallel && done + streams.size() < n; ++i) {
      sessions[i]->reset();
      sessions[i]->add_tokens(prompt);
      StreamParams p;
      p.max_tokens = kPositions + 5;  // trees of up to 7 nodes follow the first token
      p.ignore_eos = true;
      p.sampling.temperature = static_cast<float>(kTemperature);
      p.sampling.top_k = 0;
      p.sampling.top_p = 1.0f;
      p.sampling.min_p = 0.0f;
      p.sampling.seed = 1000003ull * (done + streams.size()) + 17;
      p.spec.kind = SpecParams::Kind::kDraft;
      p.spec.draft_model = draft;
      p.spec.tree.threshold = 0.1f;  // several branches per node
      p.spec.tree.max_nodes = 8;
      p.spec.tree.alpha = 0.0f;           // always the full node budget
      p.spec.tree.min_confidence = 0.0f;  // (the random draft's distributions are flat)
      streams.push_back(sessions[i]->start(p));
    }
    for (auto& s : streams) {
      const Outcome r = run(s);
      EXPECT_EQ(r.tokens.size(), static_cast<size_t>(kPositions + 5));
      for (size_t k = 0; k < r.tokens.size() && k < kPositions; ++k) counts[k][static_cast<size_t>(r.tokens[k])]++;
      out.accepted += r.stats.accepted_tokens;
      out.drafted += r.stats.drafted_tokens;
    }
    done += streams.size();
  }
  for (int k = 0; k < kPositions; ++k) out.p_value.push_back(chi2_test(counts[k], marg[k], n));
  return out;
}

uint64_t distribution_samples() {
  if (const char* e = std::getenv("EMBER_SPEC_CHI2_SAMPLES"); e && *e) return std::strtoull(e, nullptr, 10);
  return reduced() ? 20000 : 100000;
}

TEST(SpeculativeDistribution, SampledTokensFollowTheTarget) {
  const uint64_t n = distribution_samples();
  const DistributionRun r = sample_distribution(n);
  std::printf("chi-square over %llu continuations: p = %.4f, %.4f, %.4f; drafted %llu, accepted %llu\n",
              static_cast<unsigned long long>(n), r.p_value[0], r.p_value[1], r.p_value[2],
              static_cast<unsigned long long>(r.drafted), static_cast<unsigned long long>(r.accepted));
  for (double p : r.p_value) EXPECT_GT(p, 0.01);
  // The draft differs from the target on purpose (other random weights):
  // both acceptance and rejection are exercised many times.
  EXPECT_GT(r.accepted, n / 100);
  EXPECT_LT(r.accepted, r.drafted / 2);
}

TEST(SpeculativeDistribution, BrokenAcceptanceRuleIsCaught) {
  speculative::testing::g_broken_acceptance = true;
  const DistributionRun r = sample_distribution(distribution_samples());
  speculative::testing::g_broken_acceptance = false;
  std::printf("broken rule: p = %.3g, %.3g, %.3g\n", r.p_value[0], r.p_value[1], r.p_value[2]);
  EXPECT_LT(*std::min_element(r.p_value.begin(), r.p_value.end()), 0.01);
}

}  // namespace
}  // namespace ember
