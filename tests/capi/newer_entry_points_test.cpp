// Argument checking of the entry points added after the first v1 draft:
// ember_engine_step, ember_session_score, ember_session_cache_info,
// ember_session_save and ember_session_load. (Their behaviour is tested with
// the features themselves; here: NULL, invalid values, invalid UTF-8, bad
// files, and that nothing crashes or breaks a handle.)
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

std::string temp_path(const char* name) {
  const char* base = std::getenv("TMPDIR");
  return std::string(base && *base ? base : "/tmp") + "/ember_capi_" + std::to_string(getpid()) + "_" + name;
}

}  // namespace

TEST(CapiNewer, NullArguments) {
  const ember_status kInvalid = EMBER_ERR_INVALID_ARGUMENT;
  size_t n = 0;
  EXPECT_STATUS(ember_engine_step(nullptr, 10, 10, &n), kInvalid);
  int32_t tokens[2] = {1, 2};
  float logprobs[2];
  EXPECT_STATUS(ember_session_score(nullptr, tokens, 2, logprobs), kInvalid);
  ember_session_cache_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  EXPECT_STATUS(ember_session_cache_info(nullptr, &info), kInvalid);
  EXPECT_STATUS(ember_session_save(nullptr, "/tmp/x.session"), kInvalid);
  ember_session* s = reinterpret_cast<ember_session*>(0x1);
  EXPECT_STATUS(ember_session_load(nullptr, "/tmp/x.session", nullptr, &s), kInvalid);
  EXPECT_EQ(s, nullptr);

  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_TRUE(engine && session);
  // Not a manual-step engine.
  EXPECT_STATUS(ember_engine_step(engine.get(), 10, 10, &n), kInvalid);
  EXPECT_STATUS(ember_engine_step(engine.get(), 10, 10, nullptr), kInvalid);
  EXPECT_STATUS(ember_session_score(session.get(), nullptr, 2, logprobs), kInvalid);
  EXPECT_STATUS(ember_session_cache_info(session.get(), nullptr), kInvalid);
  EXPECT_STATUS(ember_session_save(session.get(), nullptr), kInvalid);
  EXPECT_STATUS(ember_session_load(engine.get(), nullptr, nullptr, &s), kInvalid);
  EXPECT_STATUS(ember_session_load(engine.get(), "/tmp/x.session", nullptr, nullptr), kInvalid);
  // The session is unharmed.
  ASSERT_OK(ember_session_add_text(session.get(), "Hello", 0));
  EXPECT_TRUE(run(session.get(), greedy_params(2)).ended);
}

TEST(CapiNewer, InvalidValues) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  ember_model_info_t mi;
  std::memset(&mi, 0, sizeof mi);
  mi.size = sizeof mi;
  ASSERT_OK(ember_model_info(model, &mi));

  SessionPtr chat = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(chat.get(), "user", "Hi"));
  int32_t tokens[3] = {1, 2, 3};
  std::vector<float> logprobs(3);
  EXPECT_STATUS(ember_session_score(chat.get(), tokens, 3, logprobs.data()), EMBER_ERR_INVALID_ARGUMENT);

  SessionPtr text = make_session(engine.get());
  int32_t bad[2] = {1, mi.vocab_size};
  EXPECT_STATUS(ember_session_score(text.get(), bad, 2, logprobs.data()), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(token_count(text.get()), 0u) << "a rejected call adds nothing";

  // Unknown cache policy, window smaller than a block.
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.cache_policy = 42;
  ember_session* s = nullptr;
  EXPECT_STATUS(ember_session_create(engine.get(), &sp, &s), EMBER_ERR_INVALID_ARGUMENT);
  ember_session_params_init(&sp);
  sp.cache_policy = EMBER_CACHE_WINDOW;
  sp.window_tokens = 1;
  EXPECT_STATUS(ember_session_create(engine.get(), &sp, &s), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);

  // Output struct too small for its own size field.
  ember_session_cache_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = 2;
  EXPECT_STATUS(ember_session_cache_info(text.get(), &info), EMBER_ERR_INVALID_ARGUMENT);
}

TEST(CapiNewer, SaveAndLoadPathsAndBadFiles) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(session.get(), "Saved text", 0));
  ember_session* s = nullptr;
  for (const char* bad : {"abc\xC3\x28", "\xFF.session"}) {
    EXPECT_STATUS(ember_session_save(session.get(), bad), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ember_session_load(engine.get(), bad, nullptr, &s), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
  }
  EXPECT_STATUS(ember_session_save(session.get(), "/nonexistent/dir/x.session"), EMBER_ERR_NOT_FOUND);
  EXPECT_STATUS(ember_session_load(engine.get(), "/nonexistent/dir/x.session", nullptr, &s), EMBER_ERR_NOT_FOUND);

  // Garbage and a truncated real session file are BAD_FORMAT.
  const std::string garbage = temp_path("garbage.session");
  {
    std::ofstream out(garbage, std::ios::binary);
    out << "this is not a session file, not even close";
  }
  EXPECT_STATUS(ember_session_load(engine.get(), garbage.c_str(), nullptr, &s), EMBER_ERR_BAD_FORMAT);
  const std::string good = temp_path("good.session");
  ASSERT_OK(ember_session_save(session.get(), good.c_str()));
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 16u);
  for (size_t len : {size_t{0}, size_t{8}, bytes.size() / 2, bytes.size() - 1}) {
    SCOPED_TRACE("truncated to " + std::to_string(len));
    {
      std::ofstream out(garbage, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(len));
    }
    EXPECT_STATUS(ember_session_load(engine.get(), garbage.c_str(), nullptr, &s), EMBER_ERR_BAD_FORMAT);
    EXPECT_EQ(s, nullptr);
  }
  // The good one loads and continues.
  ASSERT_OK(ember_session_load(engine.get(), good.c_str(), nullptr, &s));
  SessionPtr restored(s);
  EXPECT_EQ(token_count(restored.get()), token_count(session.get()));
  EXPECT_TRUE(run(restored.get(), greedy_params(2)).ended);
  std::remove(garbage.c_str());
  std::remove(good.c_str());
}

TEST(CapiNewer, ManualStepEngine) {
  CAPI_REQUIRE_MODEL(model);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.kv_memory_bytes = kTestKvBytes;
  ep.n_threads = 1;
  ep.manual_step = 1;
  ember_engine* e = nullptr;
  ASSERT_OK(ember_engine_create(model, &ep, &e));
  EnginePtr engine(e);
  EnginePtr worker_engine = make_engine(model);

  SessionPtr manual = make_session(e);
  SessionPtr worker = make_session(worker_engine.get());
  ASSERT_OK(ember_session_add_message(manual.get(), "user", "Name a fruit."));
  ASSERT_OK(ember_session_add_message(worker.get(), "user", "Name a fruit."));
  const Collected reference = run(worker.get(), greedy_params(5));

  ember_stream_params p = greedy_params(5);
  ember_stream* st = nullptr;
  ASSERT_OK(ember_stream_start(manual.get(), &p, &st));
  StreamPtr stream(st);
  std::vector<int32_t> tokens;
  bool ended = false;
  for (int i = 0; i < 1000 && !ended; ++i) {
    size_t processed = 0;
    ASSERT_OK(ember_engine_step(e, 50, 0, &processed));
    for (;;) {
      ember_event ev = new_event();
      const ember_status s = ember_stream_next(st, &ev, 0);
      if (s == EMBER_ERR_TIMEOUT) break;
      ASSERT_OK(s);
      if (ev.type != EMBER_EVENT_TEXT) {
        ended = true;
        break;
      }
      tokens.insert(tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
    }
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(tokens, reference.tokens);

  // Destroying a running stream of a manual engine does not hang (nothing
  // else steps the engine).
  ASSERT_OK(ember_session_add_message(manual.get(), "user", "Again."));
  ember_stream_params endless = greedy_params(1 << 20);
  endless.ignore_eos = 1;
  ASSERT_OK(ember_stream_start(manual.get(), &endless, &st));
  ember_stream_destroy(st);
  ASSERT_OK(ember_stream_start(manual.get(), &endless, &st));
  ASSERT_OK(ember_stream_cancel(st));
  ASSERT_OK(ember_stream_wait(st));
  ember_stream_destroy(st);
}
