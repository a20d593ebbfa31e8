// Embeddings through the C ABI (ember_engine_embed, ember_engine_embed_tokens,
// ember.hpp's Engine::embed): vectors of n_embd floats, the same for texts
// and for their tokens, independent of what runs beside them (chat streams,
// other threads embedding, a KV pool small enough to make inputs wait or be
// preempted); every bad argument is INVALID_ARGUMENT (or CONTEXT_FULL) with
// a message, and the engine goes on serving.
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_test_util.h"
#include "ember/ember.hpp"

using namespace capi_test;

namespace {

const std::vector<std::string> kTexts = {
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Rome is the capital of Italy.",
    "A tavern keeper sells ale to the travellers who pass through the village, and listens to their stories of "
    "dragons, lost roads and the price of bread in the city beyond the hills, where the king's guards wait.",
    "Hi"};

int32_t n_embd() {
  auto info = ember_model_info_t{};
  info.size = sizeof info;
  EXPECT_EQ(ember_model_info(shared_model(), &info), EMBER_OK);
  return info.n_embd;
}

std::vector<std::vector<float>> embed(ember_engine* engine, const std::vector<std::string>& texts,
                                      int32_t pooling = EMBER_POOLING_MEAN, int32_t normalize = 0) {
  ember_embed_params p;
  ember_embed_params_init(&p);
  p.pooling = pooling;
  p.normalize = normalize;
  std::vector<const char*> ptrs;
  for (const auto& t : texts) ptrs.push_back(t.c_str());
  const size_t d = static_cast<size_t>(n_embd());
  std::vector<float> flat(texts.size() * d, NAN);
  EXPECT_EQ(ember_engine_embed(engine, ptrs.data(), ptrs.size(), &p, flat.data(), flat.size()), EMBER_OK)
      << ember_last_error();
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < texts.size(); ++i) out.emplace_back(flat.begin() + i * d, flat.begin() + (i + 1) * d);
  return out;
}

TEST(CapiEmbed, TextsAndTheirTokensGiveTheSameVectors) {
  if (!shared_model()) GTEST_SKIP() << "model not found";
  EnginePtr engine = make_engine(shared_model());
  const auto by_text = embed(engine.get(), kTexts);
  ASSERT_EQ(by_text.size(), kTexts.size());
  for (const auto& v : by_text) {
    ASSERT_EQ(v.size(), static_cast<size_t>(n_embd()));
    for (float x : v) ASSERT_TRUE(std::isfinite(x));
  }
  std::vector<std::vector<int32_t>> ids;
  std::vector<const int32_t*> ptrs;
  std::vector<size_t> lengths;
  for (const auto& t : kTexts) {
    std::vector<int32_t> buf(256);
    size_t n = 0;
    ASSERT_OK(ember_tokenize(shared_model(), t.c_str(), 1, 0, buf.data(), buf.size(), &n));
    buf.resize(n);
    ids.push_back(buf);
  }
  for (const auto& v : ids) {
    ptrs.push_back(v.data());
    lengths.push_back(v.size());
  }
  std::vector<float> flat(kTexts.size() * static_cast<size_t>(n_embd()));
  ASSERT_OK(ember_engine_embed_tokens(engine.get(), ptrs.data(), lengths.data(), ptrs.size(), nullptr, flat.data(),
                                      flat.size()));
  for (size_t i = 0; i < kTexts.size(); ++i) {
    EXPECT_EQ(std::vector<float>(flat.begin() + i * n_embd(), flat.begin() + (i + 1) * n_embd()), by_text[i]);
  }
  // The C++ header.
  ember::Model model(ember::test::default_model_path());
  ember_engine_params ep = ember::engine_params();
  ep.n_threads = 1;  // as make_engine: one thread (OpenMP's pool is not TSan-instrumented, tests/capi/tsan.supp)
  ep.kv_memory_bytes = kTestKvBytes;
  ember::Engine hpp(model, ep);
  EXPECT_EQ(hpp.embed(kTexts), by_text);
  EXPECT_EQ(hpp.embed_tokens(ids), by_text);
  const auto unit = hpp.embed(kTexts, ember::embed_params(EMBER_POOLING_LAST, true));
  for (const auto& v : unit) {
    double n = 0;
    for (float x : v) n += static_cast<double>(x) * x;
    EXPECT_NEAR(std::sqrt(n), 1.0, 1e-5);
  }
}

// Chat streams decoding, other threads embedding at once, and a KV pool that
// holds only some of the inputs at a time: the same vectors.
TEST(CapiEmbed, IndependentOfWhatRunsBeside) {
  if (!shared_model()) GTEST_SKIP() << "model not found";
  EnginePtr engine = make_engine(shared_model());
  const auto alone = embed(engine.get(), kTexts);

  SessionPtr chat = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(chat.get(), "user", "Write a long story about a dragon."));
  ember_stream_params sp = greedy_params(reduced_size() ? 24 : 64);
  ember_stream* raw = nullptr;
  ASSERT_OK(ember_stream_start(chat.get(), &sp, &raw));
  StreamPtr stream(raw);
  const int n_threads = reduced_size() ? 2 : 3;
  std::vector<std::vector<std::vector<float>>> got(n_threads);
  std::vector<std::thread> threads;
  for (int t = 0; t < n_threads; ++t) threads.emplace_back([&, t] { got[t] = embed(engine.get(), kTexts); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, alone);
  int32_t last = -1;
  for (;;) {
    ember_event ev = new_event();
    if (ember_stream_next(stream.get(), &ev, -1) != EMBER_OK) break;
    last = ev.type;
    if (ev.type != EMBER_EVENT_TEXT) break;
  }
  EXPECT_EQ(last, EMBER_EVENT_END);

  // 3 MiB of KV (~130 tokens of this model): the inputs wait for each other.
  EnginePtr small = make_engine(shared_model(), 3ull << 20);
  std::vector<std::string> many;
  for (int i = 0; i < 3; ++i) many.insert(many.end(), kTexts.begin(), kTexts.end());
  const auto squeezed = embed(small.get(), many);
  for (size_t i = 0; i < many.size(); ++i) EXPECT_EQ(squeezed[i], alone[i % kTexts.size()]) << i;
  ember_scheduler_stats_t st{};
  st.size = sizeof st;
  ASSERT_OK(ember_scheduler_stats(ember_engine_scheduler(small.get()), &st));
  EXPECT_GE(st.steps, 3u);  // not all at once
}

TEST(CapiEmbed, BadArgumentsFailWithAMessage) {
  if (!shared_model()) GTEST_SKIP() << "model not found";
  EnginePtr engine = make_engine(shared_model());
  const size_t d = static_cast<size_t>(n_embd());
  std::vector<float> out(4 * d);
  const char* one[] = {"hello"};
  const char* empty[] = {"hello", ""};
  const char* bad_utf8[] = {"\xC3\x28"};
  const char* null_text[] = {nullptr};
  EXPECT_STATUS(ember_engine_embed(nullptr, one, 1, nullptr, out.data(), out.size()), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed(engine.get(), nullptr, 1, nullptr, out.data(), out.size()),
                EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed(engine.get(), one, 0, nullptr, out.data(), out.size()), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed(engine.get(), one, 1, nullptr, nullptr, 0), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed(engine.get(), one, 1, nullptr, out.data(), d - 1), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed(engine.get(), empty, 2, nullptr, out.data(), out.size()),
                EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed(engine.get(), bad_utf8, 1, nullptr, out.data(), out.size()),
                EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed(engine.get(), null_text, 1, nullptr, out.data(), out.size()),
                EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed(engine.get(), one, EMBER_MAX_EMBED_INPUTS + 1, nullptr, out.data(), SIZE_MAX),
                EMBER_ERR_INVALID_ARGUMENT);
  ember_embed_params p;
  ember_embed_params_init(&p);
  p.pooling = 9;
  EXPECT_STATUS(ember_engine_embed(engine.get(), one, 1, &p, out.data(), out.size()), EMBER_ERR_INVALID_ARGUMENT);
  ember_embed_params_init(&p);
  p.normalize = -1;
  EXPECT_STATUS(ember_engine_embed(engine.get(), one, 1, &p, out.data(), out.size()), EMBER_ERR_INVALID_ARGUMENT);
  ember_embed_params_init(&p);
  p.size = 1;
  EXPECT_STATUS(ember_engine_embed(engine.get(), one, 1, &p, out.data(), out.size()), EMBER_ERR_INVALID_ARGUMENT);

  const int32_t ok_ids[] = {1, 2, 3};
  const int32_t bad_ids[] = {1, -4};
  const int32_t* ids[] = {ok_ids, bad_ids};
  const size_t lengths[] = {3, 2};
  EXPECT_STATUS(ember_engine_embed_tokens(engine.get(), ids, lengths, 2, nullptr, out.data(), out.size()),
                EMBER_ERR_INVALID_ARGUMENT);
  const size_t zero[] = {3, 0};
  EXPECT_STATUS(ember_engine_embed_tokens(engine.get(), ids, zero, 2, nullptr, out.data(), out.size()),
                EMBER_ERR_INVALID_ARGUMENT);
  const size_t absurd[] = {3, SIZE_MAX / 2};
  EXPECT_STATUS(ember_engine_embed_tokens(engine.get(), ids, absurd, 2, nullptr, out.data(), out.size()),
                EMBER_ERR_CONTEXT_FULL);
  const int32_t* null_ids[] = {ok_ids, nullptr};
  EXPECT_STATUS(ember_engine_embed_tokens(engine.get(), null_ids, lengths, 2, nullptr, out.data(), out.size()),
                EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_engine_embed_tokens(engine.get(), nullptr, lengths, 1, nullptr, out.data(), out.size()),
                EMBER_ERR_INVALID_ARGUMENT);
  // Still serving; the defaults are mean pooling, unnormalised.
  ember_embed_params_init(&p);
  EXPECT_EQ(p.pooling, EMBER_POOLING_MEAN);
  EXPECT_EQ(p.normalize, 0);
  EXPECT_EQ(embed(engine.get(), {"still here"}).size(), 1u);
}

}  // namespace
