// The 1.1 additions to the C ABI: sized params init (an older caller's
// smaller struct is never overrun), the numeric version, the capability
// query, ember_engine_info and the non-blocking ember_stream_release.
#include <chrono>
#include <cstddef>
#include <string>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

constexpr unsigned char kGuard = 0xA5;

// An "older program": its struct is the first `caller_size` bytes of ours,
// followed by guard bytes that belong to something else.
template <typename T>
void expect_sized_init_stays_inside(void (*init_sized)(T*, size_t), size_t caller_size, const char* what) {
  alignas(T) unsigned char buf[sizeof(T) + 64];
  std::memset(buf, kGuard, sizeof buf);
  init_sized(reinterpret_cast<T*>(buf), caller_size);
  size_t written_size = 0;
  std::memcpy(&written_size, buf, sizeof written_size);
  EXPECT_EQ(written_size, caller_size) << what << ": size field";
  for (size_t i = caller_size; i < sizeof buf; ++i) {
    ASSERT_EQ(buf[i], kGuard) << what << ": byte " << i << " past the caller's " << caller_size << "-byte struct";
  }
}

// Every size from the bare size field up to the full struct.
template <typename T>
void expect_all_sizes(void (*init_sized)(T*, size_t), const char* what) {
  for (size_t n = sizeof(size_t); n <= sizeof(T); ++n) expect_sized_init_stays_inside(init_sized, n, what);
}

}  // namespace

TEST(CapiAbi11, SizedInitNeverWritesPastAnOlderCallersStruct) {
  expect_all_sizes(ember_model_params_init_sized, "model params");
  expect_all_sizes(ember_engine_params_init_sized, "engine params");
  expect_all_sizes(ember_session_params_init_sized, "session params");
  expect_all_sizes(ember_stream_params_init_sized, "stream params");
}

TEST(CapiAbi11, SizedInitFillsTheDefaultsItCovers) {
  // An older stream-params struct that ends right after max_tokens/temperature.
  const size_t older = offsetof(ember_stream_params, top_k);
  alignas(ember_stream_params) unsigned char buf[sizeof(ember_stream_params) + 16];
  std::memset(buf, kGuard, sizeof buf);
  ember_stream_params_init_sized(reinterpret_cast<ember_stream_params*>(buf), older);
  ember_stream_params full;
  ember_stream_params_init(&full);
  EXPECT_EQ(std::memcmp(buf + sizeof(size_t), reinterpret_cast<unsigned char*>(&full) + sizeof(size_t),
                        older - sizeof(size_t)),
            0);
  for (size_t i = older; i < sizeof buf; ++i) ASSERT_EQ(buf[i], kGuard) << "byte " << i;
  // The library reads only what that size covers: the rest take defaults.
  auto* p = reinterpret_cast<ember_stream_params*>(buf);
  p->temperature = 0.0f;
  EXPECT_EQ(p->size, older);
}

TEST(CapiAbi11, SizedInitZeroesWhatANewerCallerHasBeyondTheLibrary) {
  alignas(ember_engine_params) unsigned char buf[sizeof(ember_engine_params) + 32];
  std::memset(buf, kGuard, sizeof buf);
  const size_t newer = sizeof(ember_engine_params) + 16;
  ember_engine_params_init_sized(reinterpret_cast<ember_engine_params*>(buf), newer);
  const auto* p = reinterpret_cast<const ember_engine_params*>(buf);
  EXPECT_EQ(p->size, newer);
  EXPECT_EQ(p->kv_block_size, 16);
  for (size_t i = sizeof(ember_engine_params); i < newer; ++i) ASSERT_EQ(buf[i], 0) << "byte " << i;
  for (size_t i = newer; i < sizeof buf; ++i) ASSERT_EQ(buf[i], kGuard) << "byte " << i;
}

TEST(CapiAbi11, SizedInitIgnoresNullAndTinySizes) {
  ember_model_params_init_sized(nullptr, sizeof(ember_model_params));
  unsigned char buf[sizeof(size_t)];
  std::memset(buf, kGuard, sizeof buf);
  ember_model_params_init_sized(reinterpret_cast<ember_model_params*>(buf), sizeof(size_t) - 1);
  for (unsigned char b : buf) EXPECT_EQ(b, kGuard);
}

TEST(CapiAbi11, TheOneZeroEntryPointsWriteTheOneZeroStruct) {
  // The exported 1.0 symbol (the parenthesised name bypasses the macro), as a
  // program built against 1.0 calls it: today's struct is the 1.0 struct.
  alignas(ember_session_params) unsigned char buf[sizeof(ember_session_params) + 32];
  std::memset(buf, kGuard, sizeof buf);
  (ember_session_params_init)(reinterpret_cast<ember_session_params*>(buf));
  const auto* p = reinterpret_cast<const ember_session_params*>(buf);
  EXPECT_EQ(p->size, sizeof(ember_session_params));
  EXPECT_EQ(p->sink_tokens, 4);
  for (size_t i = sizeof(ember_session_params); i < sizeof buf; ++i) ASSERT_EQ(buf[i], kGuard) << "byte " << i;
  // The macro passes the caller's sizeof.
  ember_stream_params sp;
  std::memset(&sp, 0, sizeof sp);
  ember_stream_params_init(&sp);
  EXPECT_EQ(sp.size, sizeof(ember_stream_params));
  EXPECT_EQ(sp.max_tokens, 256);
}

TEST(CapiAbi11, VersionNumber) {
  EXPECT_EQ(ember_version_number(), EMBER_VERSION_NUMBER);
  EXPECT_EQ(ember_version_number(), EMBER_VERSION_MAJOR * 10000 + EMBER_VERSION_MINOR * 100 + EMBER_VERSION_PATCH);
  const std::string v = std::to_string(ember_version_number() / 10000) + "." +
                        std::to_string(ember_version_number() / 100 % 100) + "." +
                        std::to_string(ember_version_number() % 100);
  EXPECT_EQ(v, ember_version());
}

TEST(CapiAbi11, Capabilities) {
  EXPECT_STATUS(ember_capabilities(nullptr), EMBER_ERR_INVALID_ARGUMENT);
  ember_capabilities_t caps;
  std::memset(&caps, 0, sizeof caps);
  EXPECT_STATUS(ember_capabilities(&caps), EMBER_ERR_INVALID_ARGUMENT);  // size not set
  caps.size = sizeof caps;
  ASSERT_OK(ember_capabilities(&caps));
  EXPECT_EQ(caps.size, sizeof caps);
  ASSERT_NE(caps.cpu_isa_name, nullptr);
  const std::string isa = caps.cpu_isa_name;
  EXPECT_TRUE((caps.cpu_isa == EMBER_ISA_SCALAR && isa == "scalar") ||
              (caps.cpu_isa == EMBER_ISA_AVX2 && isa == "avx2") ||
              (caps.cpu_isa == EMBER_ISA_AVX512_VNNI && isa == "avx512_vnni"))
      << caps.cpu_isa << " " << isa;
  ASSERT_NE(caps.cuda_plugin_path, nullptr);
  ASSERT_NE(caps.cuda_plugin_message, nullptr);
  EXPECT_TRUE(caps.cuda_plugin == EMBER_PLUGIN_ABSENT || caps.cuda_plugin == EMBER_PLUGIN_LOADABLE ||
              caps.cuda_plugin == EMBER_PLUGIN_BROKEN);
  if (caps.cuda_plugin == EMBER_PLUGIN_LOADABLE) {
    EXPECT_STREQ(caps.cuda_plugin_message, "");
  } else {
    EXPECT_STRNE(caps.cuda_plugin_message, "");
  }
  if (caps.cuda_plugin == EMBER_PLUGIN_ABSENT) {
    EXPECT_STREQ(caps.cuda_plugin_path, "");
  }
#ifdef EMBER_TEST_NO_CUDA_PLUGIN
  EXPECT_EQ(caps.cuda_plugin, EMBER_PLUGIN_ABSENT) << caps.cuda_plugin_path;
#endif
}

TEST(CapiAbi11, EngineInfoSaysWhereAnAutoEngineRuns) {
  EMBER_REQUIRE_MODEL();
  ember_model* m = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), nullptr, &m));
  ModelPtr model(m);
  ember_capabilities_t caps;
  caps.size = sizeof caps;
  ASSERT_OK(ember_capabilities(&caps));
  for (int32_t device : {EMBER_DEVICE_CPU, EMBER_DEVICE_AUTO}) {
    ember_engine_params ep;
    ember_engine_params_init(&ep);
    ep.device = device;
    ep.kv_memory_bytes = kTestKvBytes;
    ember_engine* e = nullptr;
    ASSERT_OK(ember_engine_create(model.get(), &ep, &e));
    EnginePtr engine(e);
    ember_engine_info_t info;
    info.size = sizeof info;
    ASSERT_OK(ember_engine_info(engine.get(), &info));
    ASSERT_NE(info.backend_name, nullptr);
    const std::string name = info.backend_name;
    if (device == EMBER_DEVICE_CPU || caps.cuda_plugin != EMBER_PLUGIN_LOADABLE) {
      EXPECT_EQ(info.device, EMBER_DEVICE_CPU);
      EXPECT_EQ(info.gpu_index, -1);
      EXPECT_EQ(name, std::string("cpu/") + caps.cpu_isa_name);
    } else {
      EXPECT_TRUE(info.device == EMBER_DEVICE_CPU || info.device == EMBER_DEVICE_CUDA);
      if (info.device == EMBER_DEVICE_CUDA) {
        EXPECT_EQ(info.gpu_index, 0);
        EXPECT_EQ(name.rfind("cuda/", 0), 0u) << name;
      }
    }
    EXPECT_EQ(info.manual_step, 0);
  }
  ember_engine_info_t info;
  info.size = sizeof info;
  EXPECT_STATUS(ember_engine_info(nullptr, &info), EMBER_ERR_INVALID_ARGUMENT);
}

// ember_stream_release on a manual-step engine that nobody steps: it must
// return at once (ember_stream_destroy would run the engine's steps itself
// until the stream ends), and the next step frees the stream so the session
// can run again.
TEST(CapiAbi11, StreamReleaseNeverBlocksNorRunsSteps) {
  EMBER_REQUIRE_MODEL();
  ember_model* m = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), nullptr, &m));
  ModelPtr model(m);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.kv_memory_bytes = kTestKvBytes;
  ep.manual_step = 1;
  ember_engine* e = nullptr;
  ASSERT_OK(ember_engine_create(model.get(), &ep, &e));
  EnginePtr engine(e);
  ember_session* s = nullptr;
  ASSERT_OK(ember_session_create(engine.get(), nullptr, &s));
  SessionPtr session(s);
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Tell me a long story about a dragon."));
  ember_stream_params sp;
  ember_stream_params_init(&sp);
  sp.max_tokens = 64;
  ember_stream* st = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &sp, &st));
  ember_scheduler_stats_t before;
  before.size = sizeof before;
  ASSERT_OK(ember_scheduler_stats(ember_engine_scheduler(engine.get()), &before));
  const auto t0 = std::chrono::steady_clock::now();
  ember_stream_release(st);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 50.0);
  ember_scheduler_stats_t after;
  after.size = sizeof after;
  ASSERT_OK(ember_scheduler_stats(ember_engine_scheduler(engine.get()), &after));
  EXPECT_EQ(after.steps, before.steps) << "ember_stream_release ran engine steps";
  // Until the engine steps, the cancelled stream still owns the session.
  ember_stream* busy = nullptr;
  EXPECT_STATUS(ember_stream_start(session.get(), &sp, &busy), EMBER_ERR_BUSY);
  for (int i = 0; i < 100; ++i) {
    size_t n = 0;
    ASSERT_OK(ember_engine_step(engine.get(), 50, 0, &n));
    ember_stream* again = nullptr;
    const ember_status status = ember_stream_start(session.get(), &sp, &again);
    if (status == EMBER_OK) {
      ember_stream_destroy(again);  // cancels and steps the engine until it ends: no leak
      return;
    }
    ASSERT_EQ(status, EMBER_ERR_BUSY) << ember_last_error();
  }
  FAIL() << "the released stream never ended";
}

TEST(CapiAbi11, StreamReleaseNull) { ember_stream_release(nullptr); }

// The log callback runs under the library's log lock (and engine locks): calls
// back into the library from it must fail with BUSY, not deadlock.
namespace {
struct LogProbe {
  int calls = 0;
  ember_status reentrant_load = EMBER_OK;
  std::string reentrant_message;
  std::string version;
};
}  // namespace

TEST(CapiAbi11, LogCallbackMayNotReenterButNeverDeadlocks) {
  EMBER_REQUIRE_MODEL();
  ember_model* m = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), nullptr, &m));
  ModelPtr model(m);
  LogProbe probe;
  ember_set_log_callback(
      [](int32_t, const char*, void* ud) {
        auto* p = static_cast<LogProbe*>(ud);
        ++p->calls;
        p->version = ember_version();  // allowed
        ember_model* inner = nullptr;
        p->reentrant_load = ember_model_load("/nonexistent.gguf", nullptr, &inner);
        p->reentrant_message = ember_last_error();
        ember_set_log_callback(nullptr, nullptr);  // ignored in here
      },
      &probe);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.device = EMBER_DEVICE_AUTO;  // logs where it runs (the CPU and why, or the GPU)
  ep.kv_memory_bytes = kTestKvBytes;
  ember_engine* e = nullptr;
  const ember_status st = ember_engine_create(model.get(), &ep, &e);
  EnginePtr engine(e);
  ember_set_log_callback(nullptr, nullptr);
  ASSERT_EQ(st, EMBER_OK) << ember_last_error();
  ASSERT_GE(probe.calls, 1);
  EXPECT_EQ(probe.version, ember_version());
  EXPECT_EQ(probe.reentrant_load, EMBER_ERR_BUSY);
  EXPECT_NE(probe.reentrant_message.find("log callback"), std::string::npos) << probe.reentrant_message;
  // Outside the callback everything works again.
  ember_model* again = nullptr;
  EXPECT_STATUS(ember_model_load("/nonexistent.gguf", nullptr, &again), EMBER_ERR_NOT_FOUND);
}
