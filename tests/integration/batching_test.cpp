// Continuous batching, prefix caching, preemption and manual stepping on the
// real model: a sequence's output never depends on what else the engine runs.
#include <gtest/gtest.h>

#include "core/engine/engine.h"
#include "core/tokenizer/tokenizer.h"
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
  auto auto_engine = Engine::create(model(), EngineParams{});
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
