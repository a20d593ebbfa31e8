// The header-only C++ layer (ember/ember.hpp): RAII, exceptions, iteration.
#include "ember/ember.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <type_traits>

#include "capi/capi_test_util.h"

namespace {

static_assert(!std::is_copy_constructible_v<ember::Model> && std::is_nothrow_move_constructible_v<ember::Model>);
static_assert(!std::is_copy_constructible_v<ember::Engine> && std::is_nothrow_move_constructible_v<ember::Engine>);
static_assert(!std::is_copy_constructible_v<ember::Session> && std::is_nothrow_move_constructible_v<ember::Session>);
static_assert(!std::is_copy_constructible_v<ember::Stream> && std::is_move_constructible_v<ember::Stream>);
static_assert(!std::is_copy_assignable_v<ember::Stream> && std::is_move_assignable_v<ember::Stream>);

ember_engine_params small_engine() {
  ember_engine_params p = ember::engine_params();
  p.kv_memory_bytes = capi_test::kTestKvBytes;
  p.n_threads = 1;
  return p;
}

ember_stream_params greedy(int32_t max_tokens) {
  ember_stream_params p = ember::stream_params();
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

}  // namespace

TEST(CapiHpp, ErrorsAreExceptionsWithStatusAndMessage) {
  try {
    ember::Model missing("/nonexistent/model.gguf");
    FAIL() << "no exception";
  } catch (const ember::Error& e) {
    EXPECT_EQ(e.status(), EMBER_ERR_NOT_FOUND);
    EXPECT_STREQ(e.status_name(), "EMBER_ERR_NOT_FOUND");
    EXPECT_STRNE(e.what(), "");
  }
  try {
    ember::Model bad(std::string("a\0b", 3));
    FAIL() << "no exception";
  } catch (const ember::Error& e) {
    EXPECT_EQ(e.status(), EMBER_ERR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(ember::version(), std::string(ember_version()));
}

TEST(CapiHpp, ModelTokenizeRoundTrip) {
  EMBER_REQUIRE_MODEL();
  ember::Model model(ember::test::default_model_path());
  const ember::ModelInfo info = model.info();
  EXPECT_EQ(info.architecture, "llama");
  EXPECT_GT(info.vocab_size, 0);
  const std::string text = "Hello, 世界! 😀";
  const std::vector<int32_t> ids = model.tokenize(text);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(model.detokenize(ids), text);
  // Long text takes the retry path of both buffer protocols.
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "🎉";
  EXPECT_EQ(model.detokenize(model.tokenize(long_text)), long_text);
  EXPECT_THROW(model.tokenize("\xFF"), ember::Error);
  EXPECT_THROW(model.detokenize({-1}), ember::Error);
}

TEST(CapiHpp, ChatStreamIterationAndContinuation) {
  EMBER_REQUIRE_MODEL();
  ember::Model model(ember::test::default_model_path());
  ember::Engine engine(model, small_engine());
  ember::Session session(engine, 0, "You are a helpful assistant.");
  session.add_message("user", "What is the capital of France?");

  std::string text;
  int32_t end = EMBER_END_NONE;
  size_t tokens = 0;
  ember::Stream stream = session.stream(greedy(8));
  for (const ember::Event& e : stream) {
    if (e.is_text()) {
      EXPECT_TRUE(capi_test::valid_utf8(e.text));
      text += e.text;
      tokens += e.tokens.size();
    } else {
      EXPECT_TRUE(e.is_end());
      end = e.end_reason;
    }
  }
  EXPECT_TRUE(stream.done());
  EXPECT_EQ(stream.end_reason(), end);
  EXPECT_FALSE(stream.next().has_value());
  EXPECT_EQ(stream.stats().generated_tokens, tokens + (end == EMBER_END_EOS ? 1 : 0));
  EXPECT_FALSE(text.empty());

  // Busy while a stream runs.
  ember_stream_params endless = greedy(1 << 20);
  endless.ignore_eos = 1;
  {
    ember::Session other(engine);
    other.add_text("Count: 1 2 3");
    ember::Stream running = other.stream(endless);
    try {
      other.add_text("more");
      FAIL() << "no exception";
    } catch (const ember::Error& e) {
      EXPECT_EQ(e.status(), EMBER_ERR_BUSY);
    }
    auto first = running.next(std::chrono::seconds(60));
    ASSERT_TRUE(first.has_value());
    running.cancel();
    while (running.next()) {}
    EXPECT_EQ(running.end_reason(), EMBER_END_CANCELLED);
  }

  const size_t before = session.token_count();
  session.add_message("user", "And Spain?");
  const std::string second = session.stream(greedy(6)).text();
  EXPECT_FALSE(second.empty());
  EXPECT_GT(session.token_count(), before);
}

TEST(CapiHpp, MovesStopStringsCallbacksAndOrder) {
  EMBER_REQUIRE_MODEL();
  std::optional<ember::Stream> stream;
  std::string reference;
  {
    ember::Model model(ember::test::default_model_path());
    ember::Engine engine(model, small_engine());
    ember::Session a(engine);
    a.add_text("The alphabet: A B C D E F G");
    reference = a.stream(greedy(6)).text();

    // Moves keep exactly one owner.
    ember::Session b(engine);
    ember::Session moved = std::move(b);
    moved.add_text("The alphabet: A B C D E F G");
    ember::Session assigned(engine);
    assigned = std::move(moved);
    stream.emplace(assigned.stream(greedy(6)));
    // Model and engine go out of scope before the stream is read; the
    // session too, which cancels the stream (what it produced stays readable).
  }
  const std::string partial = stream->text();
  EXPECT_EQ(reference.compare(0, partial.size(), partial), 0) << partial;
  EXPECT_TRUE(stream->end_reason() == EMBER_END_CANCELLED || stream->end_reason() == EMBER_END_MAX_TOKENS ||
              stream->end_reason() == EMBER_END_EOS);
  stream.reset();

  ember::Model model(ember::test::default_model_path());
  ember::Engine engine(model, small_engine());
  ember::Session session(engine);
  session.add_text("The alphabet: A B C D E F G");
  ASSERT_GT(reference.size(), 2u);
  const std::string stop = reference.substr(reference.size() / 2, 2);
  ember::Stream stopped = session.stream(greedy(6), {stop});
  const std::string cut = stopped.text();
  EXPECT_EQ(stopped.end_reason(), EMBER_END_STOP_STRING);
  EXPECT_EQ(cut, reference.substr(0, reference.find(stop)));

  // Callback that cancels after the first piece; destruction waits for END.
  session.reset();
  session.add_text("Tell me a story:");
  std::atomic<int> pieces{0}, ends{0};
  int32_t reason = EMBER_END_NONE;
  {
    ember_stream_params p = greedy(1 << 20);
    p.ignore_eos = 1;
    ember::Stream s = session.stream(p);
    s.set_callback([&](const ember::Event& e) {
      if (e.is_text()) return ++pieces >= 1;
      ++ends;
      reason = e.end_reason;
      return false;
    });
    s.wait();
  }
  EXPECT_EQ(ends.load(), 1);
  EXPECT_EQ(reason, EMBER_END_CANCELLED);
  EXPECT_GE(pieces.load(), 1);

  // Score: n-1 finite log-probabilities.
  const auto ids = model.tokenize("one two three four", true);
  const std::vector<float> lp = engine.score(ids);
  ASSERT_EQ(lp.size(), ids.size() - 1);
  for (float v : lp) EXPECT_LE(v, 0.0f);
  EXPECT_GT(engine.cache_stats().blocks_total, 0u);
  EXPECT_THROW(engine.step(1), ember::Error) << "not a manual-step engine";

  // Session scoring, cache info, save and load.
  ember::Session scored(engine);
  const std::vector<float> slp = scored.score(ids);
  ASSERT_EQ(slp.size(), ids.size());
  EXPECT_TRUE(std::isnan(slp[0]));
  for (size_t i = 1; i < slp.size(); ++i) EXPECT_NEAR(slp[i], lp[i - 1], 0.05f) << i;
  EXPECT_EQ(scored.cache_info().n_tokens, ids.size());
  const std::string path = ::testing::TempDir() + "ember_hpp_test.session";
  scored.save(path);
  ember::Session restored = ember::Session::load(engine, path);
  EXPECT_EQ(restored.token_count(), ids.size());
  std::remove(path.c_str());
  EXPECT_THROW(ember::Session::load(engine, path), ember::Error);
  EXPECT_GT(engine.scheduler_stats().steps, 0u);
}
