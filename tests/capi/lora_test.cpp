// LoRA adapters through the C ABI (1.6): ember_lora_load / _info / _destroy
// and ember_session_set_loras. Bad arguments are INVALID_ARGUMENT (or the
// file's own status) with a message; sessions with different adapters on
// many threads at once get what each gets alone; an adapter released while
// sessions use it keeps working for them.
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

// Writes a rank-`rank` adapter for the test model (tools/make_synthetic_model).
std::string write_adapter(int seed, int rank = 8) {
  const std::string out = ::testing::TempDir() + "/capi_lora_" + std::to_string(seed) + ".gguf";
  const std::string cmd = std::string("'") + EMBER_MAKE_SYNTHETIC_MODEL + "' --lora-for '" +
                          ember::test::default_model_path() + "' --rank " + std::to_string(rank) + " --seed " +
                          std::to_string(seed) + " --out '" + out + "' > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return out;
}

struct LoraDeleter {
  void operator()(ember_lora* l) const { ember_lora_destroy(l); }
};
using LoraPtr = std::unique_ptr<ember_lora, LoraDeleter>;

LoraPtr load(const std::string& path) {
  ember_lora* l = nullptr;
  EXPECT_EQ(ember_lora_load(shared_model(), path.c_str(), &l), EMBER_OK) << ember_last_error();
  return LoraPtr(l);
}

std::vector<int32_t> greedy(ember_engine* engine, const ember_lora* lora, float scale, const char* prompt, int n) {
  SessionPtr s = make_session(engine);
  if (lora) {
    EXPECT_EQ(ember_session_set_loras(s.get(), &lora, &scale, 1), EMBER_OK) << ember_last_error();
  }
  EXPECT_EQ(ember_session_add_text(s.get(), prompt, 0), EMBER_OK) << ember_last_error();
  ember_stream_params p = greedy_params(n);
  p.ignore_eos = 1;
  ember_stream* st = nullptr;
  EXPECT_EQ(ember_stream_start(s.get(), &p, &st), EMBER_OK) << ember_last_error();
  StreamPtr stream(st);
  return drain(st).tokens;
}

TEST(CapiLora, BadArgumentsAreRefusedWithAMessage) {
  if (!shared_model()) GTEST_SKIP() << "model not found";
  const std::string path = write_adapter(31);
  ember_lora* l = reinterpret_cast<ember_lora*>(0x1);
  EXPECT_STATUS(ember_lora_load(nullptr, path.c_str(), &l), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(l, nullptr);
  EXPECT_STATUS(ember_lora_load(shared_model(), nullptr, &l), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_lora_load(shared_model(), path.c_str(), nullptr), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_lora_load(shared_model(), "/nonexistent/adapter.gguf", &l), EMBER_ERR_NOT_FOUND);
  EXPECT_STATUS(ember_lora_load(shared_model(), ember::test::default_model_path().c_str(), &l),
                EMBER_ERR_BAD_FORMAT);  // a model, not an adapter
  EXPECT_NE(std::string(ember_last_error()).find("not an adapter"), std::string::npos) << ember_last_error();
  ember_lora_destroy(nullptr);  // no-op
  LoraPtr lora = load(path);
  ASSERT_NE(lora, nullptr);
  ember_lora_info_t info{};
  EXPECT_STATUS(ember_lora_info(nullptr, &info), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_lora_info(lora.get(), nullptr), EMBER_ERR_INVALID_ARGUMENT);
  info.size = sizeof info;
  ASSERT_OK(ember_lora_info(lora.get(), &info));
  EXPECT_EQ(info.size, sizeof info);
  EXPECT_EQ(info.max_rank, 8);
  EXPECT_GT(info.n_matrices, 0);
  EXPECT_GT(info.bytes, 0u);
  EnginePtr engine = make_engine(shared_model());
  SessionPtr s = make_session(engine.get());
  const ember_lora* one[] = {lora.get()};
  const ember_lora* with_null[] = {lora.get(), nullptr};
  const float nan_scale[] = {NAN};
  const float huge[] = {1e6f};
  EXPECT_STATUS(ember_session_set_loras(nullptr, one, nullptr, 1), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_set_loras(s.get(), nullptr, nullptr, 1), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_set_loras(s.get(), with_null, nullptr, 2), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_set_loras(s.get(), one, nan_scale, 1), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_session_set_loras(s.get(), one, huge, 1), EMBER_ERR_INVALID_ARGUMENT);
  std::vector<const ember_lora*> many(17, lora.get());
  EXPECT_STATUS(ember_session_set_loras(s.get(), many.data(), nullptr, many.size()), EMBER_ERR_INVALID_ARGUMENT);
  ASSERT_OK(ember_session_set_loras(s.get(), nullptr, nullptr, 0));  // none
  ASSERT_OK(ember_session_set_loras(s.get(), one, nullptr, 1));
  // The session still serves after every refusal.
  ASSERT_OK(ember_session_add_text(s.get(), "Hello", 0));
  ember_stream_params p = greedy_params(4);
  ember_stream* st = nullptr;
  ASSERT_OK(ember_stream_start(s.get(), &p, &st));
  StreamPtr stream(st);
  EXPECT_FALSE(drain(st).tokens.empty());
}

TEST(CapiLora, SessionsWithDifferentAdaptersOnManyThreads) {
  if (!shared_model()) GTEST_SKIP() << "model not found";
  LoraPtr a = load(write_adapter(32));
  LoraPtr b = load(write_adapter(33));
  ASSERT_TRUE(a && b);
  EnginePtr engine = make_engine(shared_model());
  const char* prompt = "The old knight said";
  const int n = 10;
  const std::vector<int32_t> none = greedy(engine.get(), nullptr, 1.0f, prompt, n);
  const std::vector<int32_t> with_a = greedy(engine.get(), a.get(), 1.0f, prompt, n);
  const std::vector<int32_t> with_b = greedy(engine.get(), b.get(), 1.0f, prompt, n);
  const std::vector<int32_t> zero = greedy(engine.get(), a.get(), 0.0f, prompt, n);
  EXPECT_NE(with_a, none);
  EXPECT_NE(with_b, with_a);
  EXPECT_EQ(zero, none);  // scale 0 adds nothing
  const ember_lora* a_raw = a.get();
  const ember_lora* b_raw = b.get();
  std::vector<std::thread> threads;
  std::vector<std::vector<int32_t>> got(6);
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const ember_lora* l = t % 3 == 0 ? nullptr : t % 3 == 1 ? a_raw : b_raw;
      got[static_cast<size_t>(t)] = greedy(engine.get(), l, 1.0f, prompt, n);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 6; ++t) {
    EXPECT_EQ(got[static_cast<size_t>(t)], t % 3 == 0 ? none : t % 3 == 1 ? with_a : with_b) << "thread " << t;
  }
  // Released by the host while a session holds it: the session goes on.
  SessionPtr s = make_session(engine.get());
  const ember_lora* one[] = {a.get()};
  ASSERT_OK(ember_session_set_loras(s.get(), one, nullptr, 1));
  a.reset();
  ASSERT_OK(ember_session_add_text(s.get(), prompt, 0));
  ember_stream_params p = greedy_params(n);
  p.ignore_eos = 1;
  ember_stream* st = nullptr;
  ASSERT_OK(ember_stream_start(s.get(), &p, &st));
  StreamPtr stream(st);
  EXPECT_EQ(drain(st).tokens, with_a);
}

}  // namespace
