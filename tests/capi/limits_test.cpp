// The documented maximums of include/ember/ember.h ("limits"), each hit and
// answered with its documented error (issue 14, item 6); the value at the
// limit itself is accepted where that is cheap to show.
#include <cstdint>
#include <string>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

ember_stream* start(ember_session* session, const ember_stream_params& p, ember_status expected) {
  ember_stream* s = nullptr;
  EXPECT_STATUS(ember_stream_start(session, &p, &s), expected);
  if (expected != EMBER_OK) {
    EXPECT_EQ(s, nullptr);
  }
  return s;
}

}  // namespace

TEST(CapiLimits, TextBytes) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  const std::string too_long(size_t{EMBER_MAX_TEXT_BYTES} + 1, 'a');
  SessionPtr raw = make_session(engine.get());
  SessionPtr chat = make_session(engine.get());
  ASSERT_TRUE(raw && chat);
  EXPECT_STATUS(ember_session_add_text(raw.get(), too_long.c_str(), 0), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ember_last_error()).find("EMBER_MAX_TEXT_BYTES"), std::string::npos) << ember_last_error();
  EXPECT_STATUS(ember_session_add_message(chat.get(), "user", too_long.c_str()), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_add_message(chat.get(), too_long.c_str(), "hi"), EMBER_ERR_INVALID_ARGUMENT);
  size_t count = 0;
  EXPECT_STATUS(ember_tokenize(model, too_long.c_str(), 0, 0, nullptr, 0, &count), EMBER_ERR_INVALID_ARGUMENT);
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.system_prompt = too_long.c_str();
  ember_session* s = nullptr;
  EXPECT_STATUS(ember_session_create(engine.get(), &sp, &s), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  ember_model* m = nullptr;
  EXPECT_STATUS(ember_model_load(too_long.c_str(), nullptr, &m), EMBER_ERR_INVALID_ARGUMENT);
  // Nothing was added; the sessions work.
  size_t n = 1;
  ASSERT_OK(ember_session_token_count(raw.get(), &n));
  EXPECT_EQ(n, 0u);
  ASSERT_OK(ember_session_add_text(raw.get(), "Hello", 0));
  EXPECT_TRUE(run(raw.get(), greedy_params(2)).ended);
}

TEST(CapiLimits, StopStrings) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_TRUE(session);
  ASSERT_OK(ember_session_add_text(session.get(), "Once upon a time", 0));
  std::vector<std::string> texts;
  for (int i = 0; i <= EMBER_MAX_STOP_STRINGS; ++i) texts.push_back("stop" + std::to_string(i));
  std::vector<const char*> stops;
  for (int i = 0; i < EMBER_MAX_STOP_STRINGS; ++i) stops.push_back(texts[static_cast<size_t>(i)].c_str());
  stops.push_back(nullptr);
  ember_stream_params p = greedy_params(2);
  p.stop = stops.data();
  ember_stream_destroy(start(session.get(), p, EMBER_OK));  // exactly the maximum
  stops.back() = texts.back().c_str();
  stops.push_back(nullptr);
  p.stop = stops.data();
  start(session.get(), p, EMBER_ERR_INVALID_ARGUMENT);  // one more

  const std::string longest(EMBER_MAX_STOP_STRING_BYTES, 'z');
  const std::string too_long(EMBER_MAX_STOP_STRING_BYTES + 1, 'z');
  const char* one[] = {longest.c_str(), nullptr};
  p.stop = one;
  ember_stream_destroy(start(session.get(), p, EMBER_OK));
  one[0] = too_long.c_str();
  start(session.get(), p, EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ember_last_error()).find("EMBER_MAX_STOP_STRING_BYTES"), std::string::npos);
  one[0] = "";
  start(session.get(), p, EMBER_ERR_INVALID_ARGUMENT);  // empty
}

TEST(CapiLimits, MaxTokensPerStream) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_TRUE(session);
  ASSERT_OK(ember_session_add_text(session.get(), "Once upon a time", 0));
  start(session.get(), greedy_params(EMBER_MAX_TOKENS_PER_STREAM + 1), EMBER_ERR_INVALID_ARGUMENT);
  start(session.get(), greedy_params(0), EMBER_ERR_INVALID_ARGUMENT);
  ember_stream* s = start(session.get(), greedy_params(EMBER_MAX_TOKENS_PER_STREAM), EMBER_OK);
  ASSERT_OK(ember_stream_cancel(s));
  ember_stream_destroy(s);
}

TEST(CapiLimits, SessionsPerEngine) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  const char* base = std::getenv("TMPDIR");
  const std::string path =
      std::string(base && *base ? base : "/tmp") + "/ember_limits_session_" + std::to_string(getpid()) + ".bin";
  std::vector<SessionPtr> sessions;
  sessions.push_back(make_session(engine.get()));
  ASSERT_OK(ember_session_add_text(sessions[0].get(), "Hello", 0));
  ASSERT_OK(ember_session_save(sessions[0].get(), path.c_str()));
  while (sessions.size() < EMBER_MAX_SESSIONS_PER_ENGINE) {
    ember_session* s = nullptr;
    ASSERT_OK(ember_session_create(engine.get(), nullptr, &s));
    sessions.emplace_back(s);
  }
  ember_session* s = nullptr;
  EXPECT_STATUS(ember_session_create(engine.get(), nullptr, &s), EMBER_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(ember_last_error()).find("EMBER_MAX_SESSIONS_PER_ENGINE"), std::string::npos);
  EXPECT_EQ(s, nullptr);
  EXPECT_STATUS(ember_session_load(engine.get(), path.c_str(), nullptr, &s), EMBER_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(s, nullptr);
  // The limit is per engine...
  EnginePtr other = make_engine(model);
  SessionPtr elsewhere = make_session(other.get());
  EXPECT_TRUE(elsewhere);
  // ...and destroying a session frees its place.
  sessions.pop_back();
  ASSERT_OK(ember_session_load(engine.get(), path.c_str(), nullptr, &s));
  sessions.emplace_back(s);
  EXPECT_STATUS(ember_session_create(engine.get(), nullptr, &s), EMBER_ERR_OUT_OF_MEMORY);
  // A session at the limit generates; places outlive the engine handle.
  ASSERT_OK(ember_session_add_text(sessions.back().get(), " world", 0));
  engine.reset();
  EXPECT_TRUE(run(sessions.back().get(), greedy_params(2)).ended);
  sessions.clear();
  std::remove(path.c_str());
}

TEST(CapiLimits, TokensPerSession) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get(), 16);
  ASSERT_TRUE(session);
  std::string text;
  for (int i = 0; i < 40; ++i) text += " word";
  EXPECT_STATUS(ember_session_add_text(session.get(), text.c_str(), 0), EMBER_ERR_CONTEXT_FULL);
  const std::vector<int32_t> ids(17, 100);
  EXPECT_STATUS(ember_session_add_tokens(session.get(), ids.data(), ids.size()), EMBER_ERR_CONTEXT_FULL);
  ASSERT_OK(ember_session_add_tokens(session.get(), ids.data(), 15));
  const Collected c = run(session.get(), greedy_params(8));
  EXPECT_EQ(c.end_reason, EMBER_END_CONTEXT_FULL);
}

TEST(CapiLimits, KvPool) {
  CAPI_REQUIRE_MODEL(model);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.n_threads = 1;
  ember_engine* e = nullptr;
  ep.kv_memory_bytes = 1;  // less than one block
  EXPECT_STATUS(ember_engine_create(model, &ep, &e), EMBER_ERR_INVALID_ARGUMENT);
  ep.kv_memory_bytes = UINT64_MAX;  // more than EMBER_MAX_KV_BLOCKS blocks
  EXPECT_STATUS(ember_engine_create(model, &ep, &e), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(e, nullptr);

  // A pool of 4 blocks (64 tokens).
  EnginePtr probe = make_engine(model);
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  ASSERT_OK(ember_cache_stats(ember_engine_cache(probe.get()), &cs));
  EnginePtr small = make_engine(model, 4 * cs.bytes_per_block);
  ASSERT_TRUE(small);
  SessionPtr session = make_session(small.get());
  const std::vector<int32_t> ids(100, 100);
  ASSERT_OK(ember_session_add_tokens(session.get(), ids.data(), ids.size()));
  start(session.get(), greedy_params(4), EMBER_ERR_OUT_OF_MEMORY);  // needs more blocks than the pool
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.cache_policy = EMBER_CACHE_WINDOW;
  sp.window_tokens = 256;
  ember_session* s = nullptr;
  EXPECT_STATUS(ember_session_create(small.get(), &sp, &s), EMBER_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(s, nullptr);
  sp.window_tokens = 48;  // fits
  ASSERT_OK(ember_session_create(small.get(), &sp, &s));
  ember_session_destroy(s);
}

TEST(CapiLimits, EngineParameters) {
  CAPI_REQUIRE_MODEL(model);
  struct Case {
    const char* name;
    void (*apply)(ember_engine_params&);
    ember_status expected;
  };
  const Case cases[] = {
      {"kv_block_size 64", [](ember_engine_params& p) { p.kv_block_size = 64; }, EMBER_OK},
      {"kv_block_size 65", [](ember_engine_params& p) { p.kv_block_size = 65; }, EMBER_ERR_INVALID_ARGUMENT},
      {"max_batch_tokens 65536", [](ember_engine_params& p) { p.max_batch_tokens = 65536; }, EMBER_OK},
      {"max_batch_tokens 65537", [](ember_engine_params& p) { p.max_batch_tokens = 65537; },
       EMBER_ERR_INVALID_ARGUMENT},
      {"max_running 4096", [](ember_engine_params& p) { p.max_running = 4096; }, EMBER_OK},
      {"max_running 4097", [](ember_engine_params& p) { p.max_running = 4097; }, EMBER_ERR_INVALID_ARGUMENT},
      {"n_threads 1025", [](ember_engine_params& p) { p.n_threads = 1025; }, EMBER_ERR_INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ember_engine_params p;
    ember_engine_params_init(&p);
    p.kv_memory_bytes = kTestKvBytes;
    p.n_threads = 1;
    c.apply(p);
    ember_engine* e = nullptr;
    EXPECT_STATUS(ember_engine_create(model, &p, &e), c.expected);
    ember_engine_destroy(e);
  }
}
