// The C ABI of cache policies, session scoring, cache info and save/load:
// parameter defaults and validation (old struct sizes included), errors that
// leave handles usable, and the behaviour a host relies on.
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <unistd.h>

#include "capi_test_util.h"

namespace {

using namespace capi_test;

SessionPtr make_policy_session(ember_engine* engine, int32_t policy, int32_t sinks, int32_t window,
                               ember_status expect = EMBER_OK) {
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.cache_policy = policy;
  sp.sink_tokens = sinks;
  sp.window_tokens = window;
  ember_session* s = nullptr;
  EXPECT_STATUS(ember_session_create(engine, &sp, &s), expect);
  return SessionPtr(s);
}

ember_session_cache_info_t cache_info(const ember_session* s) {
  ember_session_cache_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  EXPECT_EQ(ember_session_cache_info(s, &info), EMBER_OK) << ember_last_error();
  return info;
}

std::vector<int32_t> text_tokens(ember_model* model, size_t n) {
  std::string text;
  const char* words[] = {"the",     "ship",     "sailed", "north", "while", "an",      "old",
                         "captain", "watched",  "stars",  "and",   "wrote", "letters", "to",
                         "his",     "daughter", "about",  "ice",   "wind",  "home"};
  for (size_t i = 0; text.size() < n * 8; ++i) {
    text += words[(i * 7 + i / 3) % 20];
    text += (i % 11 == 10) ? ". " : " ";
  }
  size_t count = 0;
  std::vector<int32_t> ids(n * 8);
  EXPECT_EQ(ember_tokenize(model, text.c_str(), 0, 0, ids.data(), ids.size(), &count), EMBER_OK);
  ids.resize(std::min(count, n));
  EXPECT_EQ(ids.size(), n);
  return ids;
}

std::string temp_file(const char* name) { return "/tmp/ember_capi_policy_" + std::to_string(::getpid()) + "_" + name; }

TEST(SessionPolicy, ParamsDefaults) {
  ember_session_params sp;
  std::memset(&sp, 0xAB, sizeof sp);
  ember_session_params_init(&sp);
  EXPECT_EQ(sp.size, sizeof sp);
  EXPECT_EQ(sp.cache_policy, EMBER_CACHE_FULL);
  EXPECT_EQ(sp.sink_tokens, 4);
  EXPECT_EQ(sp.window_tokens, 0);
  EXPECT_EQ(EMBER_CACHE_FULL, 0);
  EXPECT_EQ(EMBER_CACHE_WINDOW, 1);
  EXPECT_EQ(EMBER_CACHE_SINK, 2);
}

TEST(SessionPolicy, NullArguments) {
  float lp = 0;
  int32_t tok = 1;
  ember_session_cache_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  ember_session* out = reinterpret_cast<ember_session*>(1);
  EXPECT_STATUS(ember_session_score(nullptr, &tok, 1, &lp), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_cache_info(nullptr, &info), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_save(nullptr, "/tmp/x"), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_load(nullptr, "/tmp/x", nullptr, &out), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);  // cleared on failure
  EXPECT_STATUS(ember_session_load(nullptr, "/tmp/x", nullptr, nullptr), EMBER_ERR_INVALID_ARGUMENT);
}

TEST(SessionPolicy, CreationValidatesThePolicy) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  make_policy_session(engine.get(), 7, 4, 64, EMBER_ERR_INVALID_ARGUMENT);
  make_policy_session(engine.get(), EMBER_CACHE_SINK, -1, 64, EMBER_ERR_INVALID_ARGUMENT);
  make_policy_session(engine.get(), EMBER_CACHE_SINK, 4, -5, EMBER_ERR_INVALID_ARGUMENT);
  make_policy_session(engine.get(), EMBER_CACHE_SINK, 4, 8, EMBER_ERR_INVALID_ARGUMENT);     // < a block
  make_policy_session(engine.get(), EMBER_CACHE_SINK, 4, 8190, EMBER_ERR_INVALID_ARGUMENT);  // > the context
  EXPECT_NE(std::string(ember_last_error()).find("context"), std::string::npos) << ember_last_error();
  // A pool too small for the whole bounded cache: refused up front.
  EnginePtr tiny = make_engine(model, 4ull << 20);
  make_policy_session(tiny.get(), EMBER_CACHE_SINK, 4, 4000, EMBER_ERR_OUT_OF_MEMORY);
  // Good ones; sink_tokens is ignored by WINDOW, window 0 = n_ctx - sinks.
  SessionPtr w = make_policy_session(engine.get(), EMBER_CACHE_WINDOW, 4, 64);
  ember_session_cache_info_t info = cache_info(w.get());
  EXPECT_EQ(info.cache_policy, EMBER_CACHE_WINDOW);
  EXPECT_EQ(info.sink_tokens, 0);
  EXPECT_EQ(info.window_tokens, 64);
  EXPECT_EQ(info.max_blocks, 4u);
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.cache_policy = EMBER_CACHE_SINK;
  sp.n_ctx = 256;
  ember_session* s = nullptr;
  ASSERT_OK(ember_session_create(engine.get(), &sp, &s));
  SessionPtr sink(s);
  info = cache_info(sink.get());
  EXPECT_EQ(info.sink_tokens, 4);
  EXPECT_EQ(info.window_tokens, 252);
  EXPECT_EQ(info.max_position, -1);
  EXPECT_EQ(info.blocks, 0u);
}

// A program built against the header before the policy fields existed passes
// a smaller struct: it gets a FULL session, as before.
TEST(SessionPolicy, OldParamsSizeMeansFull) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.cache_policy = EMBER_CACHE_SINK;  // beyond the old size: must not be read
  sp.window_tokens = 3;
  sp.size = offsetof(ember_session_params, cache_policy);
  ember_session* s = nullptr;
  ASSERT_OK(ember_session_create(engine.get(), &sp, &s));
  SessionPtr session(s);
  EXPECT_EQ(cache_info(session.get()).cache_policy, EMBER_CACHE_FULL);
  // And an output struct from an older header is written only up to its size.
  ember_session_cache_info_t info;
  std::memset(&info, 0x5A, sizeof info);
  info.size = offsetof(ember_session_cache_info_t, n_tokens);
  ASSERT_OK(ember_session_cache_info(session.get(), &info));
  EXPECT_EQ(info.cache_policy, EMBER_CACHE_FULL);
  const unsigned char* tail =
      reinterpret_cast<const unsigned char*>(&info) + offsetof(ember_session_cache_info_t, n_tokens);
  EXPECT_EQ(tail[0], 0x5A);
  info.size = 0;
  EXPECT_STATUS(ember_session_cache_info(session.get(), &info), EMBER_ERR_INVALID_ARGUMENT);
}

TEST(SessionPolicy, ScoreMatchesEngineScoreAndValidates) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  const std::vector<int32_t> ids = text_tokens(model, 40);
  std::vector<float> ref(ids.size() - 1);
  ASSERT_OK(ember_engine_score(engine.get(), ids.data(), ids.size(), ref.data(), nullptr));
  SessionPtr s = make_session(engine.get());
  std::vector<float> lp(ids.size());
  ASSERT_OK(ember_session_score(s.get(), ids.data(), 25, lp.data()));
  ASSERT_OK(ember_session_score(s.get(), ids.data() + 25, ids.size() - 25, lp.data() + 25));
  EXPECT_TRUE(std::isnan(lp[0]));
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_NEAR(lp[i], ref[i - 1], 1e-4) << i;
  EXPECT_EQ(token_count(s.get()), ids.size());
  // Bad ids, NULL tokens, chat sessions: errors, and the session stays usable.
  const int32_t bad[2] = {1, 1 << 30};
  EXPECT_STATUS(ember_session_score(s.get(), bad, 2, lp.data()), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_score(s.get(), nullptr, 2, lp.data()), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(token_count(s.get()), ids.size());
  ASSERT_OK(ember_session_score(s.get(), ids.data(), 0, nullptr));  // nothing to do
  ASSERT_OK(ember_session_score(s.get(), ids.data(), 3, nullptr));  // feed only
  EXPECT_EQ(token_count(s.get()), ids.size() + 3);
  SessionPtr chat = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(chat.get(), "user", "hi"));
  EXPECT_STATUS(ember_session_score(chat.get(), ids.data(), 2, lp.data()), EMBER_ERR_INVALID_ARGUMENT);
  // FULL sessions still end at their context.
  SessionPtr small = make_session(engine.get(), 32);
  EXPECT_STATUS(ember_session_score(small.get(), ids.data(), 33, nullptr), EMBER_ERR_CONTEXT_FULL);
}

TEST(SessionPolicy, SinkSessionIsBoundedForScoringAndGeneration) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr s = make_policy_session(engine.get(), EMBER_CACHE_SINK, 4, 60);
  // Reduced: 150 tokens scored and 100 generated, still well past the 64-token cache.
  const size_t n_score = reduced_size() ? 150 : 300;
  const std::vector<int32_t> ids = text_tokens(model, n_score);
  std::vector<float> lp(ids.size());
  ASSERT_OK(ember_session_score(s.get(), ids.data(), ids.size(), lp.data()));
  for (size_t i = 1; i < ids.size(); ++i) ASSERT_TRUE(std::isfinite(lp[i]) && lp[i] <= 0.0f) << i;
  ember_session_cache_info_t info = cache_info(s.get());
  EXPECT_EQ(info.n_tokens, n_score);
  EXPECT_EQ(info.processed_tokens, n_score - 1);
  EXPECT_LE(info.resident_tokens, 64u);
  EXPECT_GT(info.evicted_tokens, n_score - 100);
  EXPECT_LT(info.max_position, 64);
  EXPECT_LE(info.blocks, info.max_blocks);
  // Generation far beyond the cache: ends by max_tokens, never context full.
  ember_stream_params gp = greedy_params(reduced_size() ? 100 : 150);
  gp.ignore_eos = 1;
  Collected c = run(s.get(), gp);
  EXPECT_EQ(c.end_reason, EMBER_END_MAX_TOKENS);
  info = cache_info(s.get());
  EXPECT_LE(info.resident_tokens, 64u);
  EXPECT_LT(info.max_position, 64);
  // Held between turns (the pool shows it), released by reset.
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  ASSERT_OK(ember_cache_stats(ember_engine_cache(engine.get()), &cs));
  EXPECT_EQ(cs.blocks_used, info.blocks);
  ASSERT_OK(ember_session_reset(s.get()));
  EXPECT_EQ(cache_info(s.get()).blocks, 0u);
  EXPECT_EQ(cache_info(s.get()).evicted_tokens, 0u);
}

TEST(SessionPolicy, SaveLoadRoundTripAndErrors) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  const std::string path = temp_file("a.ems");
  const std::vector<int32_t> ids = text_tokens(model, 200);
  SessionPtr a = make_policy_session(engine.get(), EMBER_CACHE_SINK, 4, 60);
  ASSERT_OK(ember_session_score(a.get(), ids.data(), ids.size(), nullptr));
  ASSERT_OK(ember_session_save(a.get(), path.c_str()));
  const Collected want = run(a.get(), greedy_params(20));

  ember_session* s = nullptr;
  ASSERT_OK(ember_session_load(engine.get(), path.c_str(), nullptr, &s));
  SessionPtr b(s);
  const ember_session_cache_info_t info = cache_info(b.get());
  EXPECT_EQ(info.cache_policy, EMBER_CACHE_SINK);
  EXPECT_EQ(info.n_tokens, 200u);
  EXPECT_GT(info.evicted_tokens, 0u);
  EXPECT_EQ(run(b.get(), greedy_params(20)).tokens, want.tokens);

  // Params: only the priority is read; a bad one is refused.
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.cache_policy = EMBER_CACHE_FULL;  // ignored: the file decides
  sp.priority = EMBER_PRIORITY_BACKGROUND;
  ASSERT_OK(ember_session_load(engine.get(), path.c_str(), &sp, &s));
  SessionPtr c(s);
  EXPECT_EQ(cache_info(c.get()).cache_policy, EMBER_CACHE_SINK);
  sp.priority = 9;
  EXPECT_STATUS(ember_session_load(engine.get(), path.c_str(), &sp, &s), EMBER_ERR_INVALID_ARGUMENT);

  // Errors with clear statuses.
  EXPECT_STATUS(ember_session_load(engine.get(), temp_file("none.ems").c_str(), nullptr, &s), EMBER_ERR_NOT_FOUND);
  EXPECT_EQ(s, nullptr);
  const std::string bad = temp_file("bad.ems");
  {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream out(bad, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 10));
  }
  EXPECT_STATUS(ember_session_load(engine.get(), bad.c_str(), nullptr, &s), EMBER_ERR_BAD_FORMAT);
  EXPECT_NE(std::string(ember_last_error()).find("truncated"), std::string::npos) << ember_last_error();
  {
    std::ofstream out(bad, std::ios::binary | std::ios::trunc);
    out << "hello, not a session";
  }
  EXPECT_STATUS(ember_session_load(engine.get(), bad.c_str(), nullptr, &s), EMBER_ERR_BAD_FORMAT);
  EXPECT_STATUS(ember_session_save(a.get(), "/nonexistent-dir/x.ems"), EMBER_ERR_NOT_FOUND);
  EXPECT_STATUS(ember_session_save(a.get(), nullptr), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_load(engine.get(), "\xff\xfe", nullptr, &s), EMBER_ERR_INVALID_ARGUMENT);

  // Saving while a stream runs: BUSY, and the session keeps working.
  ember_stream* st = nullptr;
  ember_stream_params gp = greedy_params(200);
  ASSERT_OK(ember_stream_start(a.get(), &gp, &st));
  StreamPtr stream(st);
  const ember_status busy = ember_session_save(a.get(), path.c_str());
  EXPECT_TRUE(busy == EMBER_ERR_BUSY || busy == EMBER_OK) << ember_status_string(busy);
  ASSERT_OK(ember_stream_cancel(stream.get()));
  drain(stream.get());
  ASSERT_OK(ember_session_save(a.get(), path.c_str()));
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

}  // namespace
