// Gemma 3 270M Q4_K_M (the real file) through the engine: the built-in chat
// template, end of turn, prefix caching, sink sessions and session files
// with its interleaved sliding-window layers.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/model.h"
#include "core/tokenizer/tokenizer.h"
#include "model_path.h"

namespace ember {
namespace {

std::shared_ptr<Model> gemma() {
  static std::shared_ptr<Model> m = Model::load(test::gemma3_model_path());
  return m;
}

std::vector<int32_t> run(const std::shared_ptr<Session>& s, int32_t max_tokens, bool ignore_eos, EndReason* why) {
  StreamParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = ignore_eos;
  auto stream = s->start(p);
  std::vector<int32_t> out;
  for (;;) {
    StreamEvent ev;
    EXPECT_EQ(stream->next(ev, 120000), StatusCode::kOk);
    if (ev.type == StreamEvent::kText) {
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    } else {
      EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
      if (why) *why = stream->stats().end_reason;
      return out;
    }
  }
}

std::vector<int32_t> book_tokens(size_t n) {
  std::FILE* f = std::fopen(EMBER_SOURCE_DIR "/../shared/data/pride_and_prejudice.txt", "rb");
  std::string text(60000, '\0');
  if (f) {
    text.resize(std::fread(text.data(), 1, text.size(), f));
    std::fclose(f);
  } else {
    text.clear();
    for (int i = 0; i < 800; ++i) text += "It is a truth universally acknowledged, said the narrator, again. ";
  }
  std::vector<int32_t> ids = gemma()->tokenizer().encode(text, true, false);
  ids.resize(std::min(ids.size(), n));
  return ids;
}

TEST(Gemma3, LoadsWithItsArchitectureAndTheBuiltInChatTemplate) {
  EMBER_REQUIRE_GEMMA3();
  auto m = gemma();
  EXPECT_EQ(m->architecture(), "gemma3");
  const auto& c = m->config();
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  ASSERT_EQ(c.is_swa.size(), 18u);
  for (int32_t il = 0; il < 18; ++il) EXPECT_EQ(c.layer_is_swa(il), il % 6 != 5) << il;
  EXPECT_EQ(c.layer_rope_base(0), 10000.0f);
  EXPECT_EQ(c.layer_rope_base(5), 1000000.0f);
  ASSERT_NE(m->chat_template(), nullptr) << m->chat_template_error();  // the file has none: the built-in one
}

TEST(Gemma3, ChatEndsItsTurn) {
  EMBER_REQUIRE_GEMMA3();
  auto engine = Engine::create(gemma(), EngineParams{});
  auto s = std::make_shared<Session>(engine, 0, "");
  s->add_message("user", "Write one word: yes.");
  EndReason why = EndReason::kNone;
  const auto toks = run(s, 200, false, &why);
  EXPECT_FALSE(toks.empty());
  // Generation ends at an end-of-generation token (<end_of_turn> or <eos>) or the limit, never with an error.
  EXPECT_TRUE(why == EndReason::kEos || why == EndReason::kMaxTokens) << static_cast<int>(why);
}

// A second session with the same long prompt (past the 512-token window)
// reuses the first one's blocks and continues identically.
TEST(Gemma3, PrefixHitContinuesIdentically) {
  EMBER_REQUIRE_GEMMA3();
  auto engine = Engine::create(gemma(), EngineParams{});
  const auto prompt = book_tokens(700);
  ASSERT_GT(prompt.size(), 600u);
  auto a = std::make_shared<Session>(engine, 0, "");
  a->add_tokens(prompt);
  const auto first = run(a, 16, true, nullptr);
  auto b = std::make_shared<Session>(engine, 0, "");
  b->add_tokens(prompt);
  const auto second = run(b, 16, true, nullptr);
  EXPECT_EQ(first, second);
  EXPECT_EQ(first.size(), 16u);
}

// A sink session slides past the model's window sizes (K-shift of NEOX keys
// with a base per layer) and its greedy tokens stay close to a full cache's
// while the context fits both.
TEST(Gemma3, SinkSessionStreamsPastItsWindow) {
  EMBER_REQUIRE_GEMMA3();
  auto engine = Engine::create(gemma(), EngineParams{});
  CachePolicy policy;
  policy.kind = CachePolicyKind::kSink;
  policy.sink_tokens = 4;
  policy.window_tokens = 252;
  auto s = std::make_shared<Session>(engine, 0, "", 0, policy);
  s->add_tokens(book_tokens(600));
  const auto toks = run(s, 32, true, nullptr);
  EXPECT_EQ(toks.size(), 32u);
}

// Save after a prompt past the window, restore into a new session: the
// continuation is the same as the original session's.
TEST(Gemma3, SessionFileRoundTrip) {
  EMBER_REQUIRE_GEMMA3();
  auto engine = Engine::create(gemma(), EngineParams{});
  auto a = std::make_shared<Session>(engine, 0, "");
  a->add_tokens(book_tokens(560));
  (void)run(a, 1, true, nullptr);
  const std::string path = ::testing::TempDir() + "gemma3_session.bin";
  a->save(path);
  const auto want = run(a, 12, true, nullptr);
  auto b = Session::load(engine, path, -1);
  const auto got = run(b, 12, true, nullptr);
  EXPECT_EQ(got, want);
  std::remove(path.c_str());
}

// The sliding-window layers keep only their window (core/kv_cache/
// layer_groups.h): a prompt far past the window, run in 128-token chunks (the
// local layers free blocks between chunks), continues exactly as when it runs
// in one chunk; the stream holds far fewer blocks than all layers would; a
// second session reuses the blocks through the prefix cache, and a saved
// session resumes identically.
TEST(Gemma3, SlidingWindowLayersFreeTheirBlocks) {
  EMBER_REQUIRE_GEMMA3();
  const auto prompt = book_tokens(1600);
  ASSERT_EQ(prompt.size(), 1600u);
  EngineParams whole;
  whole.max_batch_tokens = 2048;
  auto one = Engine::create(gemma(), whole);
  auto a = std::make_shared<Session>(one, 0, "");
  a->add_tokens(prompt);
  const auto want = run(a, 24, true, nullptr);
  ASSERT_EQ(want.size(), 24u);

  EngineParams chunked;
  chunked.max_batch_tokens = 128;
  auto engine = Engine::create(gemma(), chunked);
  auto b = std::make_shared<Session>(engine, 0, "");
  b->add_tokens(prompt);
  {
    StreamParams p;
    p.sampling.temperature = 0.0f;
    p.max_tokens = 24;
    p.ignore_eos = true;
    auto stream = b->start(p);
    std::vector<int32_t> got;
    size_t used_while_streaming = 0;
    for (;;) {
      StreamEvent ev;
      ASSERT_EQ(stream->next(ev, 120000), StatusCode::kOk);
      if (ev.type != StreamEvent::kText) break;
      if (got.empty()) used_while_streaming = (*engine)->cache_stats().blocks_used;
      got.insert(got.end(), ev.tokens.begin(), ev.tokens.end());
    }
    EXPECT_EQ(got, want);
    // 1 global group x 101 blocks + 5 local groups x ~37; all layers: 6 x 101.
    const size_t flat = 6 * ((prompt.size() + 1 + 15) / 16);
    std::printf("[ gemma3 kv] %zu-token context: %zu pool blocks held (all layers in every block: %zu)\n",
                prompt.size() + 1, used_while_streaming, flat);
    EXPECT_GT(used_while_streaming, flat / 6);
    EXPECT_LT(used_while_streaming, flat * 6 / 10) << "of " << flat;
  }
  auto c = std::make_shared<Session>(engine, 0, "");
  c->add_tokens(prompt);
  EXPECT_EQ(run(c, 24, true, nullptr), want);
  EXPECT_GT((*engine)->cache_stats().prefix_hits, 90u);

  const std::string path = ::testing::TempDir() + "gemma3_long_session.bin";
  auto d = std::make_shared<Session>(engine, 0, "");
  d->add_tokens(prompt);
  (void)run(d, 1, true, nullptr);
  d->save(path);
  const auto more = run(d, 8, true, nullptr);
  auto e = Session::load(engine, path, -1);
  EXPECT_EQ(run(e, 8, true, nullptr), more);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ember
