// Every public function with NULL and invalid arguments: the right status, a
// message in ember_last_error(), and nothing crashes or breaks a handle.
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

// Byte strings that are not UTF-8: a bad continuation, an overlong "/", a
// surrogate, a code point above U+10FFFF, a truncated sequence, a stray 0xFF.
const char* const kInvalidUtf8[] = {
    "abc\xC3\x28", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "ok \xE2\x82", "\xFF",
};

}  // namespace

TEST(CapiBasics, VersionMatchesMacros) {
  const std::string expected = std::to_string(EMBER_VERSION_MAJOR) + "." + std::to_string(EMBER_VERSION_MINOR) + "." +
                               std::to_string(EMBER_VERSION_PATCH);
  ASSERT_NE(ember_version(), nullptr);
  EXPECT_EQ(std::string(ember_version()), expected);
}

TEST(CapiBasics, StatusStrings) {
  const std::pair<ember_status, const char*> known[] = {
      {EMBER_OK, "EMBER_OK"},
      {EMBER_ERR_INVALID_ARGUMENT, "EMBER_ERR_INVALID_ARGUMENT"},
      {EMBER_ERR_NOT_FOUND, "EMBER_ERR_NOT_FOUND"},
      {EMBER_ERR_BAD_FORMAT, "EMBER_ERR_BAD_FORMAT"},
      {EMBER_ERR_UNSUPPORTED, "EMBER_ERR_UNSUPPORTED"},
      {EMBER_ERR_OUT_OF_MEMORY, "EMBER_ERR_OUT_OF_MEMORY"},
      {EMBER_ERR_CONTEXT_FULL, "EMBER_ERR_CONTEXT_FULL"},
      {EMBER_ERR_BUSY, "EMBER_ERR_BUSY"},
      {EMBER_ERR_CANCELLED, "EMBER_ERR_CANCELLED"},
      {EMBER_ERR_TIMEOUT, "EMBER_ERR_TIMEOUT"},
      {EMBER_ERR_INTERNAL, "EMBER_ERR_INTERNAL"},
      {EMBER_ERR_END_OF_STREAM, "EMBER_ERR_END_OF_STREAM"},
  };
  for (const auto& [status, name] : known) EXPECT_STREQ(ember_status_string(status), name);
  for (ember_status bad : {-1, 12, 1000, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
    EXPECT_STREQ(ember_status_string(bad), "unknown status");
  }
}

TEST(CapiBasics, LastErrorIsThreadLocalAndClearedBySuccess) {
  EXPECT_STATUS(ember_model_load(nullptr, nullptr, nullptr), EMBER_ERR_INVALID_ARGUMENT);
  const std::string message = ember_last_error();
  std::string other_thread = "unset";
  std::thread([&] { other_thread = ember_last_error(); }).join();
  EXPECT_EQ(other_thread, "");
  EXPECT_EQ(std::string(ember_last_error()), message);  // still there after the other thread ran

  // Calls that cannot fail leave it alone; a successful fallible call clears it.
  EXPECT_STREQ(ember_status_string(EMBER_OK), "EMBER_OK");
  EXPECT_EQ(std::string(ember_last_error()), message);
  CAPI_REQUIRE_MODEL(model);
  ember_model_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  ASSERT_OK(ember_model_info(model, &info));
  EXPECT_STREQ(ember_last_error(), "");
}

TEST(CapiBasics, LogCallbackCanBeSetAndCleared) {
  ember_set_log_callback([](int32_t, const char*, void*) {}, nullptr);
  ember_model* m = nullptr;
  EXPECT_STATUS(ember_model_load("/nonexistent/ember/model.gguf", nullptr, &m), EMBER_ERR_NOT_FOUND);
  EXPECT_EQ(m, nullptr);
  ember_set_log_callback(nullptr, nullptr);
}

TEST(CapiNull, DestroyNullIsANoOp) {
  ember_model_destroy(nullptr);
  ember_engine_destroy(nullptr);
  ember_session_destroy(nullptr);
  ember_stream_destroy(nullptr);
  EXPECT_EQ(ember_engine_cache(nullptr), nullptr);
  EXPECT_EQ(ember_engine_scheduler(nullptr), nullptr);
}

TEST(CapiNull, ParamsInitIgnoresNull) {
  ember_model_params_init(nullptr);
  ember_engine_params_init(nullptr);
  ember_session_params_init(nullptr);
  ember_stream_params_init(nullptr);
}

TEST(CapiNull, NullHandlesAndPointersWithoutAModel) {
  const ember_status kInvalid = EMBER_ERR_INVALID_ARGUMENT;
  ember_model* model = reinterpret_cast<ember_model*>(0x1);  // must be reset to NULL on failure
  EXPECT_STATUS(ember_model_load(nullptr, nullptr, &model), kInvalid);
  EXPECT_EQ(model, nullptr);
  EXPECT_STATUS(ember_model_load("x.gguf", nullptr, nullptr), kInvalid);

  ember_model_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  EXPECT_STATUS(ember_model_info(nullptr, &info), kInvalid);

  int32_t tokens[4] = {1, 2, 3, 4};
  size_t count = 0;
  EXPECT_STATUS(ember_tokenize(nullptr, "hi", 0, 0, tokens, 4, &count), kInvalid);
  char text[16];
  EXPECT_STATUS(ember_detokenize(nullptr, tokens, 1, text, sizeof text, &count), kInvalid);

  ember_engine* engine = reinterpret_cast<ember_engine*>(0x1);
  EXPECT_STATUS(ember_engine_create(nullptr, nullptr, &engine), kInvalid);
  EXPECT_EQ(engine, nullptr);

  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  EXPECT_STATUS(ember_cache_stats(nullptr, &cs), kInvalid);
  ember_scheduler_stats_t ss;
  std::memset(&ss, 0, sizeof ss);
  ss.size = sizeof ss;
  EXPECT_STATUS(ember_scheduler_stats(nullptr, &ss), kInvalid);

  float logprobs[4];
  EXPECT_STATUS(ember_engine_score(nullptr, tokens, 4, logprobs, nullptr), kInvalid);

  ember_session* session = reinterpret_cast<ember_session*>(0x1);
  EXPECT_STATUS(ember_session_create(nullptr, nullptr, &session), kInvalid);
  EXPECT_EQ(session, nullptr);
  EXPECT_STATUS(ember_session_add_message(nullptr, "user", "hi"), kInvalid);
  EXPECT_STATUS(ember_session_add_text(nullptr, "hi", 0), kInvalid);
  EXPECT_STATUS(ember_session_add_tokens(nullptr, tokens, 4), kInvalid);
  EXPECT_STATUS(ember_session_reset(nullptr), kInvalid);
  EXPECT_STATUS(ember_session_token_count(nullptr, &count), kInvalid);

  ember_stream* stream = reinterpret_cast<ember_stream*>(0x1);
  EXPECT_STATUS(ember_stream_start(nullptr, nullptr, &stream), kInvalid);
  EXPECT_EQ(stream, nullptr);
  ember_event ev = new_event();
  EXPECT_STATUS(ember_stream_next(nullptr, &ev, 0), kInvalid);
  EXPECT_STATUS(ember_stream_set_callback(
                    nullptr, [](const ember_event*, void*) -> int32_t { return 0; }, nullptr),
                kInvalid);
  EXPECT_STATUS(ember_stream_cancel(nullptr), kInvalid);
  EXPECT_STATUS(ember_stream_wait(nullptr), kInvalid);
  ember_stream_stats_t st;
  std::memset(&st, 0, sizeof st);
  st.size = sizeof st;
  EXPECT_STATUS(ember_stream_stats(nullptr, &st), kInvalid);
}

TEST(CapiNull, NullPointersWithLiveHandles) {
  CAPI_REQUIRE_MODEL(model);
  const ember_status kInvalid = EMBER_ERR_INVALID_ARGUMENT;
  EXPECT_STATUS(ember_model_info(model, nullptr), kInvalid);
  size_t count = 0;
  int32_t tokens[8];
  EXPECT_STATUS(ember_tokenize(model, nullptr, 0, 0, tokens, 8, &count), kInvalid);
  EXPECT_STATUS(ember_tokenize(model, "hi", 0, 0, tokens, 8, nullptr), kInvalid);
  EXPECT_STATUS(ember_tokenize(model, "hi", 0, 0, nullptr, 8, &count), kInvalid);
  char text[8];
  tokens[0] = 42;
  EXPECT_STATUS(ember_detokenize(model, nullptr, 1, text, sizeof text, &count), kInvalid);
  EXPECT_STATUS(ember_detokenize(model, tokens, 1, nullptr, 8, &count), kInvalid);
  EXPECT_STATUS(ember_detokenize(model, tokens, 1, text, sizeof text, nullptr), kInvalid);
  EXPECT_STATUS(ember_engine_create(model, nullptr, nullptr), kInvalid);

  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  EXPECT_STATUS(ember_cache_stats(ember_engine_cache(engine.get()), nullptr), kInvalid);
  EXPECT_STATUS(ember_scheduler_stats(ember_engine_scheduler(engine.get()), nullptr), kInvalid);
  float logprobs[4];
  EXPECT_STATUS(ember_engine_score(engine.get(), nullptr, 4, logprobs, nullptr), kInvalid);
  EXPECT_STATUS(ember_engine_score(engine.get(), tokens, 0, logprobs, nullptr), kInvalid);
  EXPECT_STATUS(ember_session_create(engine.get(), nullptr, nullptr), kInvalid);

  SessionPtr session = make_session(engine.get());
  ASSERT_TRUE(session);
  EXPECT_STATUS(ember_session_add_message(session.get(), nullptr, "hi"), kInvalid);
  EXPECT_STATUS(ember_session_add_message(session.get(), "user", nullptr), kInvalid);
  EXPECT_STATUS(ember_session_add_message(session.get(), "", "hi"), kInvalid);
  EXPECT_STATUS(ember_session_add_text(session.get(), nullptr, 0), kInvalid);
  EXPECT_STATUS(ember_session_add_tokens(session.get(), nullptr, 3), kInvalid);
  EXPECT_STATUS(ember_session_token_count(session.get(), nullptr), kInvalid);
  EXPECT_STATUS(ember_stream_start(session.get(), nullptr, nullptr), kInvalid);
  // Nothing was added: starting an empty session is an error too.
  ember_stream* stream = nullptr;
  EXPECT_STATUS(ember_stream_start(session.get(), nullptr, &stream), kInvalid);
  EXPECT_EQ(stream, nullptr);

  ASSERT_OK(ember_session_add_message(session.get(), "user", "Say hi."));
  ember_stream_params sp = greedy_params(2);
  ASSERT_OK(ember_stream_start(session.get(), &sp, &stream));
  StreamPtr guard(stream);
  EXPECT_STATUS(ember_stream_next(stream, nullptr, 0), kInvalid);
  EXPECT_STATUS(ember_stream_set_callback(stream, nullptr, nullptr), kInvalid);
  EXPECT_STATUS(ember_stream_stats(stream, nullptr), kInvalid);
  // The stream is unharmed by all of that.
  const Collected c = drain(stream);
  EXPECT_TRUE(c.ended);
  EXPECT_EQ(c.error, EMBER_OK);
}

TEST(CapiUtf8, EveryTextArgumentRejectsInvalidUtf8) {
  for (const char* bad : kInvalidUtf8) {
    SCOPED_TRACE(::testing::PrintToString(std::string(bad)));
    ember_model* m = nullptr;
    EXPECT_STATUS(ember_model_load(bad, nullptr, &m), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(m, nullptr);
  }
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  SessionPtr chat = make_session(engine.get());
  SessionPtr text = make_session(engine.get());
  ASSERT_TRUE(chat && text);
  for (const char* bad : kInvalidUtf8) {
    SCOPED_TRACE(::testing::PrintToString(std::string(bad)));
    int32_t tokens[64];
    size_t n = 0;
    EXPECT_STATUS(ember_tokenize(model, bad, 1, 1, tokens, 64, &n), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ember_session_add_message(chat.get(), bad, "hello"), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ember_session_add_message(chat.get(), "user", bad), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(ember_session_add_text(text.get(), bad, 0), EMBER_ERR_INVALID_ARGUMENT);

    ember_session_params sp;
    ember_session_params_init(&sp);
    sp.system_prompt = bad;
    ember_session* s = nullptr;
    EXPECT_STATUS(ember_session_create(engine.get(), &sp, &s), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s, nullptr);
  }
  // Nothing was added by the failed calls.
  EXPECT_EQ(token_count(text.get()), 0u);

  // Stop strings: the invalid one may sit anywhere in the list.
  ASSERT_OK(ember_session_add_message(chat.get(), "user", "Hello"));
  for (const char* bad : kInvalidUtf8) {
    SCOPED_TRACE(::testing::PrintToString(std::string(bad)));
    const char* stops[] = {"fine", bad, nullptr};
    ember_stream_params p = greedy_params(2);
    p.stop = stops;
    ember_stream* st = nullptr;
    EXPECT_STATUS(ember_stream_start(chat.get(), &p, &st), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(st, nullptr);
  }
  // An empty stop string is rejected too.
  const char* empty_stop[] = {"", nullptr};
  ember_stream_params p = greedy_params(2);
  p.stop = empty_stop;
  ember_stream* st = nullptr;
  EXPECT_STATUS(ember_stream_start(chat.get(), &p, &st), EMBER_ERR_INVALID_ARGUMENT);
  // And the session still works afterwards.
  const Collected c = run(chat.get(), greedy_params(2));
  EXPECT_TRUE(c.ended);
}

TEST(CapiParams, AbsurdStreamParameters) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  SessionPtr session = make_session(engine.get());
  ASSERT_TRUE(session);
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Hello"));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* name;
    void (*apply)(ember_stream_params&, float, float);
  };
  const Case cases[] = {
      {"negative max_tokens", [](ember_stream_params& p, float, float) { p.max_tokens = -5; }},
      {"zero max_tokens", [](ember_stream_params& p, float, float) { p.max_tokens = 0; }},
      {"top_p 0", [](ember_stream_params& p, float, float) { p.top_p = 0.0f; }},
      {"top_p > 1", [](ember_stream_params& p, float, float) { p.top_p = 1.5f; }},
      {"top_p NaN", [](ember_stream_params& p, float nan_, float) { p.top_p = nan_; }},
      {"negative temperature", [](ember_stream_params& p, float, float) { p.temperature = -1.0f; }},
      {"NaN temperature", [](ember_stream_params& p, float nan_, float) { p.temperature = nan_; }},
      {"infinite temperature", [](ember_stream_params& p, float, float inf_) { p.temperature = inf_; }},
      {"negative top_k", [](ember_stream_params& p, float, float) { p.top_k = -1; }},
      {"min_p > 1", [](ember_stream_params& p, float, float) { p.min_p = 2.0f; }},
      {"zero repeat_penalty", [](ember_stream_params& p, float, float) { p.repeat_penalty = 0.0f; }},
      {"NaN presence_penalty", [](ember_stream_params& p, float nan_, float) { p.presence_penalty = nan_; }},
      {"huge frequency_penalty", [](ember_stream_params& p, float, float inf_) { p.frequency_penalty = inf_; }},
      {"penalty_last_n -2", [](ember_stream_params& p, float, float) { p.penalty_last_n = -2; }},
      {"size 0 (uninitialised struct)", [](ember_stream_params& p, float, float) { p.size = 0; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ember_stream_params p = greedy_params(2);
    c.apply(p, nan, inf);
    ember_stream* st = nullptr;
    EXPECT_STATUS(ember_stream_start(session.get(), &p, &st), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(st, nullptr);
  }
  // Too many stop strings.
  std::vector<const char*> stops(100, "zz");
  stops.push_back(nullptr);
  ember_stream_params p = greedy_params(2);
  p.stop = stops.data();
  ember_stream* st = nullptr;
  EXPECT_STATUS(ember_stream_start(session.get(), &p, &st), EMBER_ERR_INVALID_ARGUMENT);
  // Not busy after all those failures.
  const Collected c = run(session.get(), greedy_params(2));
  EXPECT_TRUE(c.ended);
}

TEST(CapiParams, AbsurdEngineAndSessionParameters) {
  CAPI_REQUIRE_MODEL(model);
  struct Case {
    const char* name;
    void (*apply)(ember_engine_params&);
    ember_status expected;
  };
  const Case cases[] = {
      {"unknown device", [](ember_engine_params& p) { p.device = 77; }, EMBER_ERR_INVALID_ARGUMENT},
      {"negative device", [](ember_engine_params& p) { p.device = -1; }, EMBER_ERR_INVALID_ARGUMENT},
      {"huge n_threads", [](ember_engine_params& p) { p.n_threads = 1 << 30; }, EMBER_ERR_INVALID_ARGUMENT},
      {"negative n_threads", [](ember_engine_params& p) { p.n_threads = -4; }, EMBER_ERR_INVALID_ARGUMENT},
      {"kv smaller than a block", [](ember_engine_params& p) { p.kv_memory_bytes = 100; }, EMBER_ERR_INVALID_ARGUMENT},
      {"kv absurdly large", [](ember_engine_params& p) { p.kv_memory_bytes = 1ull << 62; }, EMBER_ERR_INVALID_ARGUMENT},
      {"zero kv_block_size", [](ember_engine_params& p) { p.kv_block_size = 0; }, EMBER_ERR_INVALID_ARGUMENT},
      {"huge kv_block_size", [](ember_engine_params& p) { p.kv_block_size = 1 << 20; }, EMBER_ERR_INVALID_ARGUMENT},
      {"unknown kv_dtype", [](ember_engine_params& p) { p.kv_dtype = 9; }, EMBER_ERR_INVALID_ARGUMENT},
      {"zero max_batch_tokens", [](ember_engine_params& p) { p.max_batch_tokens = 0; }, EMBER_ERR_INVALID_ARGUMENT},
      {"negative max_running", [](ember_engine_params& p) { p.max_running = -1; }, EMBER_ERR_INVALID_ARGUMENT},
      {"size 0", [](ember_engine_params& p) { p.size = 0; }, EMBER_ERR_INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ember_engine_params p;
    ember_engine_params_init(&p);
    p.kv_memory_bytes = kTestKvBytes;
    c.apply(p);
    ember_engine* e = nullptr;
    EXPECT_STATUS(ember_engine_create(model, &p, &e), c.expected);
    EXPECT_EQ(e, nullptr);
  }
  {
    // CUDA: UNSUPPORTED (with the reason) where the plugin is absent or
    // broken, or finds no device; an engine on the GPU where it runs.
    ember_capabilities_t caps;
    caps.size = sizeof caps;
    ASSERT_OK(ember_capabilities(&caps));
    ember_engine_params p;
    ember_engine_params_init(&p);
    p.kv_memory_bytes = kTestKvBytes;
    p.device = EMBER_DEVICE_CUDA;
    ember_engine* e = nullptr;
    const ember_status st = ember_engine_create(model, &p, &e);
    EnginePtr cuda(e);
    if (caps.cuda_plugin != EMBER_PLUGIN_LOADABLE || st != EMBER_OK) {
      EXPECT_EQ(st, EMBER_ERR_UNSUPPORTED) << "plugin state " << caps.cuda_plugin;
      EXPECT_EQ(e, nullptr);
      EXPECT_STRNE(ember_last_error(), "");
    } else {
      ember_engine_info_t info;
      info.size = sizeof info;
      ASSERT_OK(ember_engine_info(e, &info));
      EXPECT_EQ(info.device, EMBER_DEVICE_CUDA);
    }
  }

  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.n_ctx = -1;
  ember_session* s = nullptr;
  EXPECT_STATUS(ember_session_create(engine.get(), &sp, &s), EMBER_ERR_INVALID_ARGUMENT);
  sp.n_ctx = 0;
  sp.size = 3;
  EXPECT_STATUS(ember_session_create(engine.get(), &sp, &s), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  ember_model_params mp;
  ember_model_params_init(&mp);
  mp.size = 0;
  ember_model* m = nullptr;
  EXPECT_STATUS(ember_model_load(ember::test::default_model_path().c_str(), &mp, &m), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);

  // A context larger than the model's is clamped, not rejected.
  sp.size = sizeof sp;
  sp.n_ctx = 1 << 30;
  SessionPtr big = make_session(engine.get(), 1 << 30);
  EXPECT_TRUE(big);
}

TEST(CapiParams, AutoDeviceAndNoMmapWork) {
  CAPI_REQUIRE_MODEL(model);
  ember_model_params mp;
  ember_model_params_init(&mp);
  EXPECT_EQ(mp.size, sizeof mp);
  EXPECT_EQ(mp.use_mmap, 1);
  mp.use_mmap = EMBER_MODEL_MAP_SHARED;  // the shared model is a private copy (the default)
  ember_model* copy = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), &mp, &copy));
  ModelPtr guard(copy);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.device = EMBER_DEVICE_AUTO;
  ep.kv_memory_bytes = kTestKvBytes;
  ep.n_threads = 1;
  ember_engine* engine = nullptr;
  ASSERT_OK(ember_engine_create(copy, &ep, &engine));
  EnginePtr eguard(engine);
  // The model read into memory, on an engine with the same parameters (so on
  // the same device, CPU or GPU, with the same arithmetic).
  ember_engine* other = nullptr;
  ASSERT_OK(ember_engine_create(model, &ep, &other));
  SessionPtr a = make_session(engine);
  SessionPtr b = make_session(EnginePtr(other).get());  // engine handle gone already: the session keeps it
  ASSERT_TRUE(a && b);
  ASSERT_OK(ember_session_add_message(a.get(), "user", "What is 2+2?"));
  ASSERT_OK(ember_session_add_message(b.get(), "user", "What is 2+2?"));
  const Collected ra = run(a.get(), greedy_params(6));
  const Collected rb = run(b.get(), greedy_params(6));
  EXPECT_FALSE(ra.tokens.empty());
  EXPECT_EQ(ra.tokens, rb.tokens) << "a mapped model must behave as one read into memory";
}

// "Old" parameter structs: a caller built against an earlier header passes a
// struct whose size covers only the first fields; the rest take defaults and
// whatever lies after the struct is never read.
TEST(CapiParams, ShortParamStructsGetDefaults) {
  CAPI_REQUIRE_MODEL(model);

  // Engine: only device and n_threads; garbage after them.
  struct {
    ember_engine_params p;
    unsigned char poison[64];
  } eng;
  std::memset(&eng, 0xFF, sizeof eng);
  eng.p.size = offsetof(ember_engine_params, kv_memory_bytes);
  eng.p.device = EMBER_DEVICE_CPU;
  eng.p.n_threads = 1;
  ember_engine* e = nullptr;
  ASSERT_OK(ember_engine_create(model, &eng.p, &e));
  EnginePtr engine(e);
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  ASSERT_OK(ember_cache_stats(ember_engine_cache(e), &cs));
  EXPECT_EQ(cs.block_size, 16);                                   // default kv_block_size
  EXPECT_LE(cs.blocks_total * cs.bytes_per_block, 512ull << 20);  // default budget
  EXPECT_GT((cs.blocks_total + 1) * cs.bytes_per_block, 512ull << 20);

  // Session: only n_ctx; a wild pointer where system_prompt would be.
  struct {
    ember_session_params p;
    unsigned char poison[64];
  } ses;
  std::memset(&ses, 0xFF, sizeof ses);
  ses.p.size = offsetof(ember_session_params, system_prompt);
  ses.p.n_ctx = 0;
  ember_session* s = nullptr;
  ASSERT_OK(ember_session_create(e, &ses.p, &s));
  SessionPtr session(s);
  ASSERT_OK(ember_session_add_message(s, "user", "Name a colour."));

  // Stream: only max_tokens and temperature (greedy); everything else,
  // including the stop pointer, is garbage beyond the size.
  struct {
    ember_stream_params p;
    unsigned char poison[64];
  } str;
  std::memset(&str, 0xFF, sizeof str);
  str.p.size = offsetof(ember_stream_params, top_k);
  str.p.max_tokens = 5;
  str.p.temperature = 0.0f;
  const Collected old_caller = run(s, str.p);
  EXPECT_TRUE(old_caller.ended);
  const size_t after_first = token_count(s);

  // Same request with a full, default-initialised struct, on an engine in
  // the same state (nothing cached).
  EnginePtr engine2 = make_engine(model);
  SessionPtr fresh = make_session(engine2.get());
  ASSERT_OK(ember_session_add_message(fresh.get(), "user", "Name a colour."));
  const Collected full = run(fresh.get(), greedy_params(5));
  EXPECT_EQ(old_caller.tokens, full.tokens);
  EXPECT_EQ(old_caller.end_reason, full.end_reason);
  EXPECT_EQ(token_count(fresh.get()), after_first);

  // Model params: only the size field.
  ember_model_params mp;
  std::memset(&mp, 0xFF, sizeof mp);
  mp.size = sizeof(size_t);
  ember_model* m = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), &mp, &m));
  ember_model_destroy(m);

  // A struct from a newer header (bigger size) is accepted; the library reads
  // what it knows.
  struct {
    ember_stream_params p;
    uint64_t future_field;
  } newer;
  std::memset(&newer, 0, sizeof newer);
  newer.p = greedy_params(5);
  newer.p.size = sizeof newer;
  newer.future_field = 12345;
  EnginePtr engine3 = make_engine(model);
  SessionPtr third = make_session(engine3.get());
  ASSERT_OK(ember_session_add_message(third.get(), "user", "Name a colour."));
  EXPECT_EQ(run(third.get(), newer.p).tokens, full.tokens);
}

namespace {

// Output struct in a buffer with guard bytes behind the caller's size.
template <typename T>
struct Guarded {
  static constexpr unsigned char kGuard = 0xA5;
  alignas(16) unsigned char bytes[sizeof(T) + 64];
  explicit Guarded(size_t size) {
    std::memset(bytes, kGuard, sizeof bytes);
    std::memcpy(bytes, &size, sizeof size);
  }
  T* get() { return reinterpret_cast<T*>(bytes); }
  size_t size() const {
    size_t s;
    std::memcpy(&s, bytes, sizeof s);
    return s;
  }
  // Bytes from `from` to the end are untouched.
  bool intact_from(size_t from) const {
    for (size_t i = from; i < sizeof bytes; ++i) {
      if (bytes[i] != kGuard) return false;
    }
    return true;
  }
};

}  // namespace

TEST(CapiOutputStructs, SmallerSizesAreWrittenOnlyUpToTheirSize) {
  CAPI_REQUIRE_MODEL(model);
  {
    Guarded<ember_model_info_t> g(offsetof(ember_model_info_t, name));
    ASSERT_OK(ember_model_info(model, g.get()));
    EXPECT_EQ(g.size(), offsetof(ember_model_info_t, name));
    EXPECT_STREQ(g.get()->architecture, "llama");
    EXPECT_TRUE(g.intact_from(offsetof(ember_model_info_t, name)));
  }
  {
    // A newer caller: its extra bytes after our struct stay as they were.
    Guarded<ember_model_info_t> g(sizeof(ember_model_info_t) + 32);
    ASSERT_OK(ember_model_info(model, g.get()));
    EXPECT_EQ(g.size(), sizeof(ember_model_info_t) + 32);
    EXPECT_TRUE(g.intact_from(sizeof(ember_model_info_t)));
    EXPECT_GT(g.get()->vocab_size, 0);
  }
  {
    Guarded<ember_model_info_t> g(4);  // not even the size field
    EXPECT_STATUS(ember_model_info(model, g.get()), EMBER_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(g.intact_from(sizeof(size_t)));
  }

  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  {
    Guarded<ember_cache_stats_t> g(offsetof(ember_cache_stats_t, blocks_used));
    ASSERT_OK(ember_cache_stats(ember_engine_cache(engine.get()), g.get()));
    EXPECT_EQ(g.get()->block_size, 16);
    EXPECT_GT(g.get()->blocks_total, 0u);
    EXPECT_TRUE(g.intact_from(offsetof(ember_cache_stats_t, blocks_used)));
  }
  {
    Guarded<ember_scheduler_stats_t> g(offsetof(ember_scheduler_stats_t, waiting));
    ASSERT_OK(ember_scheduler_stats(ember_engine_scheduler(engine.get()), g.get()));
    EXPECT_TRUE(g.intact_from(offsetof(ember_scheduler_stats_t, waiting)));
  }

  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Hi"));
  ember_stream_params p = greedy_params(3);
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &s));
  StreamPtr stream(s);
  {
    // An event struct too small for its size field: rejected, and the event
    // is not lost (see the comparison below).
    Guarded<ember_event> g(2);
    EXPECT_STATUS(ember_stream_next(s, g.get(), -1), EMBER_ERR_INVALID_ARGUMENT);
  }
  std::vector<int32_t> tokens;
  for (;;) {
    // Only size, type and text: the rest stays untouched.
    Guarded<ember_event> g(offsetof(ember_event, text_length));
    ASSERT_OK(ember_stream_next(s, g.get(), -1));
    EXPECT_TRUE(g.intact_from(offsetof(ember_event, text_length)));
    if (g.get()->type != EMBER_EVENT_TEXT) break;
    EXPECT_NE(g.get()->text, nullptr);
  }
  {
    Guarded<ember_stream_stats_t> g(offsetof(ember_stream_stats_t, time_to_first_token_ms));
    ASSERT_OK(ember_stream_stats(s, g.get()));
    EXPECT_GT(g.get()->prompt_tokens, 0u);
    EXPECT_TRUE(g.intact_from(offsetof(ember_stream_stats_t, time_to_first_token_ms)));
  }
  {
    Guarded<ember_stream_stats_t> g(sizeof(ember_stream_stats_t));
    ASSERT_OK(ember_stream_stats(s, g.get()));
    EXPECT_EQ(g.get()->finished, 1);
    EXPECT_EQ(g.get()->generated_tokens, 3u);
    EXPECT_EQ(g.get()->end_reason, EMBER_END_MAX_TOKENS);
    EXPECT_TRUE(g.intact_from(sizeof(ember_stream_stats_t)));
  }
}

TEST(CapiOutputStructs, RejectedEventStructDoesNotConsumeTheEvent) {
  CAPI_REQUIRE_MODEL(model);
  // Two engines in the same state (nothing cached) give the same reply.
  EnginePtr reference_engine = make_engine(model);
  EnginePtr engine = make_engine(model);
  SessionPtr a = make_session(reference_engine.get());
  SessionPtr b = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(a.get(), "user", "Count to five."));
  ASSERT_OK(ember_session_add_message(b.get(), "user", "Count to five."));
  const Collected reference = run(a.get(), greedy_params(4));

  ember_stream_params p = greedy_params(4);
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(b.get(), &p, &s));
  StreamPtr stream(s);
  ember_event tiny;
  std::memset(&tiny, 0, sizeof tiny);
  tiny.size = 1;
  EXPECT_STATUS(ember_stream_next(s, &tiny, -1), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_stream_next(s, &tiny, -1), EMBER_ERR_INVALID_ARGUMENT);
  const Collected c = drain(s);
  EXPECT_EQ(c.tokens, reference.tokens);
  EXPECT_EQ(c.text, reference.text);
}

TEST(CapiTokenize, BufferSizeProtocol) {
  CAPI_REQUIRE_MODEL(model);
  const char* text = "Hello, world! 你好世界 😀🎉 The quick brown fox.";
  size_t n = 0;
  // Ask for the size first.
  EXPECT_STATUS(ember_tokenize(model, text, 0, 0, nullptr, 0, &n), EMBER_ERR_INVALID_ARGUMENT);
  ASSERT_GT(n, 3u);
  const size_t needed = n;

  // One too small: error, count set, nothing written past the buffer.
  std::vector<int32_t> buf(needed + 4, -7);
  size_t m = 0;
  EXPECT_STATUS(ember_tokenize(model, text, 0, 0, buf.data(), needed - 1, &m), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, needed);
  for (size_t i = needed - 1; i < buf.size(); ++i) EXPECT_EQ(buf[i], -7) << i;

  // Exact size works and writes exactly `needed` ids.
  std::fill(buf.begin(), buf.end(), -7);
  ASSERT_OK(ember_tokenize(model, text, 0, 0, buf.data(), needed, &m));
  EXPECT_EQ(m, needed);
  for (size_t i = needed; i < buf.size(); ++i) EXPECT_EQ(buf[i], -7);

  // Round trip through detokenize with its own protocol.
  size_t len = 0;
  EXPECT_STATUS(ember_detokenize(model, buf.data(), needed, nullptr, 0, &len), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(len, std::strlen(text));
  std::vector<char> out(len + 8, 'Z');
  EXPECT_STATUS(ember_detokenize(model, buf.data(), needed, out.data(), len, &len), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(len, std::strlen(text)) << "no room for the NUL is an error";
  for (size_t i = len; i < out.size(); ++i) EXPECT_EQ(out[i], 'Z');
  ASSERT_OK(ember_detokenize(model, buf.data(), needed, out.data(), len + 1, &len));
  EXPECT_STREQ(out.data(), text);
  for (size_t i = len + 1; i < out.size(); ++i) EXPECT_EQ(out[i], 'Z');

  // Empty text: zero tokens fits in a zero-sized buffer.
  ASSERT_OK(ember_tokenize(model, "", 0, 0, nullptr, 0, &m));
  EXPECT_EQ(m, 0u);
  char one[1] = {'Z'};
  ASSERT_OK(ember_detokenize(model, nullptr, 0, one, 1, &len));
  EXPECT_EQ(len, 0u);
  EXPECT_EQ(one[0], '\0');
}

TEST(CapiTokenize, SpecialTokensAndBadIds) {
  CAPI_REQUIRE_MODEL(model);
  ember_model_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  ASSERT_OK(ember_model_info(model, &info));
  EXPECT_GT(info.vocab_size, 1000);
  EXPECT_GT(info.n_layers, 0);
  EXPECT_GT(info.context_length, 0);
  EXPECT_GT(info.n_params, 1000000u);
  ASSERT_NE(info.name, nullptr);

  int32_t ids[32];
  size_t n = 0;
  ASSERT_OK(ember_tokenize(model, "<|im_start|>", 0, 1, ids, 32, &n));
  EXPECT_EQ(n, 1u) << "a special token is one id when parse_special is set";
  ASSERT_OK(ember_tokenize(model, "<|im_start|>", 0, 0, ids, 32, &n));
  EXPECT_GT(n, 1u) << "and plain text otherwise";

  char text[64];
  size_t len = 0;
  for (int32_t bad : {-1, info.vocab_size, info.vocab_size + 1000, std::numeric_limits<int32_t>::min()}) {
    int32_t seq[3] = {ids[0], bad, ids[0]};
    EXPECT_STATUS(ember_detokenize(model, seq, 3, text, sizeof text, &len), EMBER_ERR_INVALID_ARGUMENT);
  }

  // A byte token that cannot form a character on its own becomes U+FFFD.
  ASSERT_OK(ember_tokenize(model, "😀", 0, 0, ids, 32, &n));
  if (n > 1) {
    ASSERT_OK(ember_detokenize(model, ids, 1, text, sizeof text, &len));
    const std::string s(text, len);
    EXPECT_TRUE(valid_utf8(s));
    EXPECT_NE(s.find("\xEF\xBF\xBD"), std::string::npos);
  }
}

TEST(CapiScore, ArgumentChecksAndResult) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  ember_model_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  ASSERT_OK(ember_model_info(model, &info));

  int32_t ids[16];
  size_t n = 0;
  ASSERT_OK(ember_tokenize(model, "The capital of France is Paris.", 1, 0, ids, 16, &n));
  ASSERT_GE(n, 4u);
  std::vector<float> logprobs(n, 1.0f);
  std::vector<float> logits(n * static_cast<size_t>(info.vocab_size));
  ASSERT_OK(ember_engine_score(engine.get(), ids, n, logprobs.data(), logits.data()));
  for (size_t i = 0; i + 1 < n; ++i) {
    EXPECT_TRUE(std::isfinite(logprobs[i]));
    EXPECT_LE(logprobs[i], 0.0f);
  }
  EXPECT_EQ(logprobs[n - 1], 1.0f) << "only n-1 values are written";

  int32_t bad[3] = {ids[0], info.vocab_size, ids[1]};
  EXPECT_STATUS(ember_engine_score(engine.get(), bad, 3, logprobs.data(), nullptr), EMBER_ERR_INVALID_ARGUMENT);
  bad[1] = -3;
  EXPECT_STATUS(ember_engine_score(engine.get(), bad, 3, logprobs.data(), nullptr), EMBER_ERR_INVALID_ARGUMENT);
  std::vector<int32_t> too_long(static_cast<size_t>(info.context_length) + 1, ids[1]);
  EXPECT_STATUS(ember_engine_score(engine.get(), too_long.data(), too_long.size(), nullptr, nullptr),
                EMBER_ERR_CONTEXT_FULL);
}
