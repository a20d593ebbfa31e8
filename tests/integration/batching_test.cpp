// Continuous batching, prefix caching, preemption and manual stepping on the
// real model: a sequence's output never depends on what else the engine runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "core/engine/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "cpu/cpu_backend.h"
#include "model_path.h"

namespace ember {
namespace {

std::shared_ptr<Model> model() {
  static std::shared_ptr<Model> m = Model::load(test::default_model_path());
  return m;
}

std::vector<int32_t> run(const std::shared_ptr<Stream>& s, Engine* manual = nullptr) {
  std::vector<int32_t> out;
  for (;;) {
    StreamEvent ev;
    StatusCode c;
    if (manual) {
      manual->run_steps(0, 1);
      c = s->next(ev, 0);
      if (c == StatusCode::kTimeout) continue;
    } else {
      c = s->next(ev, 120000);
    }
    EXPECT_EQ(c, StatusCode::kOk);
    if (c != StatusCode::kOk) return out;
    if (ev.type == StreamEvent::kText) {
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    } else {
      EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
      return out;
    }
  }
}

StreamParams params(int n, float temp = 0.0f, uint64_t seed = 1) {
  StreamParams p;
  p.max_tokens = n;
  p.sampling.temperature = temp;
  p.sampling.seed = seed;
  p.ignore_eos = true;
  return p;
}

const char* kSystem =
    "You are a careful assistant for a role-playing game. You answer in character, briefly, and you never "
    "reveal that you are an AI. The world is a medieval kingdom with dragons, knights and a wizard tower.";

TEST(Batching, PrefixCacheHitGivesSameTokensAsMiss) {
  EMBER_REQUIRE_MODEL();
  EngineParams ep;
  auto engine = Engine::create(model(), ep);
  auto a = std::make_shared<Session>(engine, 0, kSystem);
  a->add_message("user", "Who guards the bridge?");
  auto out_a = run(a->start(params(24)));
  const auto before = (*engine)->cache_stats();
  auto b = std::make_shared<Session>(engine, 0, kSystem);
  b->add_message("user", "Who guards the bridge?");
  auto out_b = run(b->start(params(24)));
  const auto after = (*engine)->cache_stats();
  EXPECT_GT(after.prefix_hits, before.prefix_hits);
  EXPECT_EQ(out_a, out_b);
  // Same system prompt, different question: shares the prefix, then diverges.
  auto c = std::make_shared<Session>(engine, 0, kSystem);
  c->add_message("user", "Where is the wizard tower?");
  auto out_c = run(c->start(params(24)));
  EngineParams no_cache;
  no_cache.prefix_caching = false;
  auto engine2 = Engine::create(model(), no_cache);
  auto d = std::make_shared<Session>(engine2, 0, kSystem);
  d->add_message("user", "Where is the wizard tower?");
  EXPECT_EQ(out_c, run(d->start(params(24))));
}

TEST(Batching, PreemptedSequenceResumesWithSameOutput) {
  EMBER_REQUIRE_MODEL();
  const auto& c = model()->config();
  const size_t bytes_per_token = static_cast<size_t>(c.n_layers) * 2 * c.n_kv_heads * c.head_dim * 2;
  // Reference outputs, undisturbed.
  auto big = Engine::create(model(), EngineParams{});
  auto ref_bg = std::make_shared<Session>(big, 0, "");
  ref_bg->add_text("The history of the kingdom begins", false);
  auto want_bg = run(ref_bg->start(params(80, 0.7f, 5)));
  auto ref_fg = std::make_shared<Session>(big, 0, "");
  ref_fg->add_text("Knights of the round table, listen:", false);
  auto want_fg = run(ref_fg->start(params(60)));
  // A pool of 8 blocks of 16 tokens: the background stream (~90 tokens, 6
  // blocks) is preempted when the interactive one (~70 tokens) arrives.
  EngineParams ep;
  ep.kv_memory_bytes = 8 * 16 * bytes_per_token;
  ep.prefix_caching = false;
  auto small = Engine::create(model(), ep);
  auto bg = std::make_shared<Session>(small, 0, "", /*priority=*/1);
  bg->add_text("The history of the kingdom begins", false);
  auto bg_stream = bg->start(params(80, 0.7f, 5));
  // Let the background stream get going before the interactive one arrives.
  StreamEvent ev;
  ASSERT_EQ(bg_stream->next(ev, 60000), StatusCode::kOk);
  std::vector<int32_t> got_bg(ev.tokens.begin(), ev.tokens.end());
  auto fg = std::make_shared<Session>(small, 0, "", /*priority=*/0);
  fg->add_text("Knights of the round table, listen:", false);
  auto got_fg = run(fg->start(params(60)));
  auto rest = run(bg_stream);
  got_bg.insert(got_bg.end(), rest.begin(), rest.end());
  EXPECT_GT((*small)->scheduler_stats().preempted, 0u);
  EXPECT_EQ(got_fg, want_fg);
  EXPECT_EQ(got_bg, want_bg);
}

TEST(Batching, ManualSteppingOnTheCallersThread) {
  EMBER_REQUIRE_MODEL();
  EngineParams ep;
  ep.manual = true;
  auto engine = Engine::create(model(), ep);
  // (The same kernels: a manual engine keeps its prompt rows off AMX tiles.)
  EngineParams same;
  same.prompt_tiles = 0;
  auto auto_engine = Engine::create(model(), same);
  auto s = std::make_shared<Session>(engine, 0, "");
  s->add_text("Once upon a time", false);
  auto stream = s->start(params(12));
  StreamEvent ev;
  EXPECT_EQ(stream->next(ev, 0), StatusCode::kTimeout);  // nothing runs until we step
  auto got = run(stream, &**engine);
  auto r = std::make_shared<Session>(auto_engine, 0, "");
  r->add_text("Once upon a time", false);
  EXPECT_EQ(got, run(r->start(params(12))));
}

}  // namespace
}  // namespace ember

namespace ember {
namespace {

// Rows by kind, whatever the chunking (core/model/arch/decoder.cpp
// Decoder::decode_row): a prompt row is computed as a prompt row even in a
// one-row chunk, a generated token fed back as a decode even when recomputed
// after a preemption. The CPU sums the two kinds in different orders for
// K-quant weights (llama.cpp's batched and one-row kernels) and for Q4_0 /
// Q8_0 on AMX, so these files see any mix-up: a synthetic Q8_0 model and a
// synthetic Q4_K_M one.
class RowKinds : public ::testing::TestWithParam<const char*> {
 protected:
  static std::shared_ptr<Model> load(const std::string& name) {
    static std::map<std::string, std::shared_ptr<Model>> models;
    auto& m = models[name];
    if (!m) m = Model::load(std::string(EMBER_SYNTHETIC_DIR) + "/" + name + ".gguf");
    return m;
  }
  std::shared_ptr<Model> model() const { return load(GetParam()); }
  static std::vector<int32_t> prompt(int32_t n, int32_t vocab) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) ids[i] = 1 + (i * 37 + 11) % (vocab - 1);
    return ids;
  }
  // Greedy tokens and their log-probabilities.
  static std::pair<std::vector<int32_t>, std::vector<float>> generate(const std::shared_ptr<EngineOwner>& engine,
                                                                      const std::vector<int32_t>& ids, int n) {
    auto s = std::make_shared<Session>(engine, 0, "");
    s->add_tokens(ids);
    StreamParams p = params(n);
    p.logprobs = true;
    auto stream = s->start(p);
    std::pair<std::vector<int32_t>, std::vector<float>> out;
    for (;;) {
      StreamEvent ev;
      const StatusCode c = stream->next(ev, 120000);
      EXPECT_EQ(c, StatusCode::kOk);
      if (c != StatusCode::kOk || ev.type != StreamEvent::kText) return out;
      out.first.insert(out.first.end(), ev.tokens.begin(), ev.tokens.end());
      out.second.insert(out.second.end(), ev.logprobs.begin(), ev.logprobs.end());
    }
  }
};

TEST_P(RowKinds, ScoresDoNotDependOnChunkingWithOneRowChunks) {
  auto engine = Engine::create(model(), EngineParams{});
  const auto ids = prompt(40, model()->config().n_vocab);
  std::vector<float> whole(ids.size()), parts(ids.size());
  std::make_shared<Session>(engine, 0, "")->score(ids, whole.data());
  auto s = std::make_shared<Session>(engine, 0, "");
  size_t at = 0;
  for (size_t len : {17, 1, 1, 5, 1, 15}) {
    s->score(std::vector<int32_t>(ids.begin() + at, ids.begin() + at + len), parts.data() + at);
    at += len;
  }
  ASSERT_EQ(at, ids.size());
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(whole[i], parts[i]) << GetParam() << " token " << i;
}

TEST_P(RowKinds, GenerationDoesNotDependOnAOneRowPromptChunk) {
  const auto ids = prompt(33, model()->config().n_vocab);
  const auto want = generate(Engine::create(model(), EngineParams{}), ids, 12);
  EngineParams small;
  small.max_batch_tokens = 16;  // the prompt in chunks of 16, 16 and 1
  const auto got = generate(Engine::create(model(), small), ids, 12);
  ASSERT_EQ(want.first.size(), 12u);
  EXPECT_EQ(got.first, want.first);
  ASSERT_EQ(got.second.size(), want.second.size());
  for (size_t i = 0; i < got.second.size(); ++i) EXPECT_EQ(got.second[i], want.second[i]) << GetParam() << " " << i;
}

TEST_P(RowKinds, PreemptedSequenceRecomputesItsTokensAsTheyWere) {
  const auto& c = model()->config();
  const size_t bytes_per_token = static_cast<size_t>(c.n_layers) * 2 * c.n_kv_heads * c.head_dim * 2;
  const auto bg_ids = prompt(20, c.n_vocab), fg_ids = prompt(24, c.n_vocab - 7);
  auto big = Engine::create(model(), EngineParams{});
  const auto want_bg = generate(big, bg_ids, 100);
  // A pool of 8 blocks of 16: the background sequence (120 tokens, 8 blocks)
  // is preempted when the interactive one (64 tokens) arrives, and later
  // recomputes its prompt and the tokens it had generated.
  EngineParams ep;
  ep.kv_memory_bytes = 8 * 16 * bytes_per_token;
  ep.prefix_caching = false;
  ep.manual = true;     // the steps on this thread: the preemption happens where the test says
  ep.prompt_tiles = 1;  // (AMX prompt rows, where the CPU has them, as the worker-thread engine's)
  auto small = Engine::create(model(), ep);
  auto bg = std::make_shared<Session>(small, 0, "", /*priority=*/1);
  bg->add_tokens(bg_ids);
  StreamParams p = params(100);
  p.logprobs = true;
  auto bg_stream = bg->start(p);
  struct Out {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    bool done = false;
  } got_bg, got_fg;
  auto drain = [](const std::shared_ptr<Stream>& stream, Out& out) {
    StreamEvent ev;
    while (!out.done && stream->next(ev, 0) == StatusCode::kOk) {
      if (ev.type != StreamEvent::kText) {
        EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
        out.done = true;
        break;
      }
      out.tokens.insert(out.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      out.logprobs.insert(out.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    }
  };
  for (int i = 0; i < 10000 && got_bg.tokens.size() < 40 && !got_bg.done; ++i) {
    (*small)->run_steps(0, 1);
    drain(bg_stream, got_bg);
  }
  ASSERT_FALSE(got_bg.done);
  auto fg = std::make_shared<Session>(small, 0, "", /*priority=*/0);
  fg->add_tokens(fg_ids);
  auto fg_stream = fg->start(params(40));
  // (Steps of up to 32 tokens: the interactive prompt's chunk fits in one.)
  for (int i = 0; i < 10000 && !(got_bg.done && got_fg.done); ++i) {
    (*small)->run_steps(0, 32);
    drain(bg_stream, got_bg);
    drain(fg_stream, got_fg);
  }
  EXPECT_EQ(got_fg.tokens.size(), 40u);
  EXPECT_GT((*small)->scheduler_stats().preempted, 0u);
  EXPECT_EQ(got_bg.tokens, want_bg.first);
  ASSERT_EQ(got_bg.logprobs.size(), want_bg.second.size());
  for (size_t i = 0; i < want_bg.second.size(); ++i) {
    EXPECT_EQ(got_bg.logprobs[i], want_bg.second[i]) << GetParam() << " " << i;
  }
}

// Seventeen sequences decoding together (their decode rows on AMX tiles,
// where the CPU has them and the weights are packed for them) get each one's
// tokens and log-probabilities alone (one decode row: VNNI registers).
TEST_P(RowKinds, SeventeenSequencesTogetherDecodeAsEachAlone) {
  const auto& c = model()->config();
  constexpr int kSeqs = 17, kTokens = 8;
  EngineParams ep;
  ep.manual = true;     // (every sequence prefilled in the first step, then decoded together)
  ep.prompt_tiles = 1;  // (prompt rows as the worker-thread engine's)
  auto together = Engine::create(model(), ep);
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::shared_ptr<Stream>> streams;
  for (int i = 0; i < kSeqs; ++i) {
    ids.push_back(prompt(5 + i, c.n_vocab - 3 * i));
    sessions.push_back(std::make_shared<Session>(together, 0, ""));
    sessions.back()->add_tokens(ids.back());
    StreamParams p = params(kTokens);
    p.logprobs = true;
    streams.push_back(sessions.back()->start(p));
  }
  std::vector<std::vector<int32_t>> tokens(kSeqs);
  std::vector<std::vector<float>> logprobs(kSeqs);
  std::vector<bool> done(kSeqs, false);
  for (int step = 0; step < 1000 && std::count(done.begin(), done.end(), true) < kSeqs; ++step) {
    (*together)->run_steps(0, 512);
    for (int i = 0; i < kSeqs; ++i) {
      StreamEvent ev;
      while (!done[i] && streams[i]->next(ev, 0) == StatusCode::kOk) {
        if (ev.type != StreamEvent::kText) {
          EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
          done[i] = true;
          break;
        }
        tokens[i].insert(tokens[i].end(), ev.tokens.begin(), ev.tokens.end());
        logprobs[i].insert(logprobs[i].end(), ev.logprobs.begin(), ev.logprobs.end());
      }
    }
  }
  auto alone = Engine::create(model(), EngineParams{});
  for (int i = 0; i < kSeqs; ++i) {
    const auto want = generate(alone, ids[i], kTokens);
    ASSERT_EQ(want.first.size(), static_cast<size_t>(kTokens));
    EXPECT_EQ(tokens[i], want.first) << GetParam() << " sequence " << i;
    ASSERT_EQ(logprobs[i].size(), want.second.size());
    for (size_t j = 0; j < want.second.size(); ++j)
      EXPECT_EQ(logprobs[i][j], want.second[j]) << GetParam() << " sequence " << i << " token " << j;
  }
}

// The decoder's activation buffers, sized for a prompt chunk, go back to the
// system once the steps after it are small (Decoder::ensure_capacity): a
// 300-token prompt's buffers are held through the first decode steps and
// given back after eight, down to 16 rows; the tokens do not change.
TEST_P(RowKinds, PromptBuffersGoBackAfterTheDecodeStepsWithTheSameTokens) {
  const auto& c = model()->config();
  const size_t q_dim = static_cast<size_t>(c.n_heads) * c.head_dim;
  const size_t kv_dim = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  const size_t row_bytes = 4 * (static_cast<size_t>(c.n_embd) + std::max<size_t>(c.n_embd, q_dim) + 2 * q_dim +
                                2 * kv_dim + 2 * static_cast<size_t>(c.n_ff));
  const size_t head_bytes = 4 * (static_cast<size_t>(c.n_embd) + static_cast<size_t>(c.n_vocab));
  const auto ids = prompt(300, c.n_vocab);
  // (Earlier tests' engines may still be going away: their buffers first.)
  size_t before = cpu_buffer_bytes();
  for (int i = 0; i < 250 && before != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    before = cpu_buffer_bytes();
  }
  std::pair<std::vector<int32_t>, std::vector<float>> two, twelve;
  {
    auto engine = Engine::create(model(), EngineParams{});
    two = generate(engine, ids, 3);
    EXPECT_GE(cpu_buffer_bytes(), before + 300 * row_bytes) << GetParam() << ": held through 2 decode steps";
  }
  {
    auto engine = Engine::create(model(), EngineParams{});
    twelve = generate(engine, ids, 12);
    EXPECT_LE(cpu_buffer_bytes(), before + 16 * row_bytes + 2 * head_bytes + 64 * 1024)
        << GetParam() << ": after 11 decode steps";
  }
  ASSERT_EQ(twelve.first.size(), 12u);
  EXPECT_EQ(std::vector<int32_t>(twelve.first.begin(), twelve.first.begin() + 3), two.first);
  for (size_t i = 0; i < two.second.size(); ++i) EXPECT_EQ(twelve.second[i], two.second[i]) << GetParam() << " " << i;
}

INSTANTIATE_TEST_SUITE_P(Synthetic, RowKinds, ::testing::Values("llama3", "llama_q4_k_m"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace ember
