// Embeddings (core/engine/embed.h) on the real models: llama.cpp's pooled
// embeddings of the same texts (tests/golden/embeddings, written by
// tools/ref_embeddings.py) to cosine >= 0.9999 for mean, last and cls
// pooling (or within 1.5x of llama.cpp's own spread between its attention
// kernels where that is wider: Gemma 3); the same vectors, bit for bit, whether a text is embedded alone,
// with others, in small chunks or while chat streams decode; bad input fails
// with a clear error and leaves the engine serving.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "core/engine/embed.h"
#include "core/engine/engine.h"
#include "core/engine/session.h"
#include "core/tokenizer/tokenizer.h"
#include "cpu/matmul.h"
#include "model_path.h"

namespace ember {
namespace {

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

nlohmann::json golden(const std::string& name) {
  std::ifstream f(std::string(EMBER_TEST_DATA_DIR) + "/embeddings/" + name);
  EXPECT_TRUE(f.good()) << name;
  return nlohmann::json::parse(f);
}

void expect_goldens_once(const std::string& model_path, const std::string& golden_name, double slack, double cap) {
  auto model = Model::load(model_path);
  auto engine = Engine::create(model, EngineParams{});
  const nlohmann::json g = golden(golden_name);
  const auto texts = g.at("texts").get<std::vector<std::string>>();
  const auto tokens = g.at("tokens").get<std::vector<std::vector<int32_t>>>();
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(model->tokenizer().encode(texts[i], true, false), tokens[i]) << texts[i];
  }
  for (const char* pooling : {"mean", "last", "cls"}) {
    EmbedParams p;
    p.pooling = parse_pooling(pooling);
    const auto got = embed_texts(engine, texts, p);
    const auto want = g.at("vectors").at(pooling).get<std::vector<std::vector<float>>>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].size(), static_cast<size_t>(model->config().n_embd));
      ASSERT_EQ(got[i].size(), want[i].size());
      // Within 1e-4 of llama.cpp (cap), or within 1.5x (slack) of how far
      // llama.cpp is from itself with flash attention (Gemma 3's last token:
      // up to ~5e-3), whichever is looser.
      const double self = g.at("self_cosine").at(pooling).at(i).get<double>();
      const double floor = std::min(cap, 1.0 - slack * (1.0 - self));
      EXPECT_GE(cosine(got[i], want[i]), floor)
          << pooling << " pooling, text " << i << ": " << texts[i] << " (llama.cpp vs itself: " << self << ")";
    }
  }
}

// The prompt rows in llama.cpp's orders (AMX prompt rows off), then, where
// the CPU has AMX, in the AMX order (cpu/matmul.h): it sums each block
// exactly, so it is no further from the exact result, but it is not
// llama.cpp's: there within 3x of llama.cpp's distance from itself, at most
// 1e-3.
void expect_goldens(const std::string& model_path, const std::string& golden_name) {
  struct AmxReset {
    ~AmxReset() { cpu::reset_amx_prompt_rows(); }
  } amx_reset;
  for (const bool amx : {false, true}) {
    const bool usable = cpu::set_amx_prompt_rows(amx);
    if (amx && !usable) break;
    SCOPED_TRACE(amx ? "AMX prompt rows" : "llama.cpp's orders");
    expect_goldens_once(model_path, golden_name, amx ? 3.0 : 1.5, amx ? 0.999 : 0.9999);
  }
}

TEST(Embed, SmolLM2EqualsLlamaCpp) {
  EMBER_REQUIRE_MODEL();
  expect_goldens(test::default_model_path(), "smollm2.json");
}

TEST(Embed, Gemma3EqualsLlamaCpp) {
  EMBER_REQUIRE_GEMMA3();
  expect_goldens(test::gemma3_model_path(), "gemma3.json");
}

// Every architecture Ember runs (the synthetic files the build writes,
// tools/make_synthetic_model), the same token ids in both engines.
TEST(Embed, EveryArchitectureEqualsLlamaCpp) {
  const nlohmann::json g = golden("synthetic.json");
  const auto inputs = g.at("inputs").get<std::vector<std::vector<int32_t>>>();
  for (const auto& [arch, entry] : g.at("models").items()) {
    SCOPED_TRACE(arch);
    auto model = Model::load(std::string(EMBER_SYNTHETIC_DIR) + "/" + arch + ".gguf");
    auto engine = Engine::create(model, EngineParams{});
    for (const char* pooling : {"mean", "last", "cls"}) {
      EmbedParams p;
      p.pooling = parse_pooling(pooling);
      const auto got = embed_tokens(engine, inputs, p);
      const auto want = entry.at("vectors").at(pooling).get<std::vector<std::vector<float>>>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].size(), want[i].size());
        EXPECT_GE(cosine(got[i], want[i]), 0.9999) << pooling << " pooling, input " << i;
      }
    }
  }
}

const std::vector<std::string> kTexts = {
    "The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
    "A tavern keeper sells ale to the travellers who pass through the village, and listens to their stories "
    "of dragons, lost roads and the price of bread in the city beyond the hills.",
    "Hi"};

std::shared_ptr<Model> smollm2() {
  static std::shared_ptr<Model> m = Model::load(test::default_model_path());
  return m;
}

// A text's vector does not depend on what else the engine runs or on how its
// rows were chunked: alone, all at once, in 8-token chunks, and while two
// chat streams decode, bit for bit.
TEST(Embed, IndependentOfBatchingAndChunking) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(smollm2(), EngineParams{});
  for (Pooling pooling : {Pooling::kMean, Pooling::kLast}) {
    EmbedParams p;
    p.pooling = pooling;
    std::vector<std::vector<float>> alone;
    for (const auto& t : kTexts) alone.push_back(embed_texts(engine, {t}, p)[0]);
    EXPECT_EQ(embed_texts(engine, kTexts, p), alone) << pooling_name(pooling);

    EngineParams small;
    small.max_batch_tokens = 8;
    auto chunked = Engine::create(smollm2(), small);
    EXPECT_EQ(embed_texts(chunked, kTexts, p), alone) << pooling_name(pooling);

    std::vector<std::shared_ptr<Session>> chats;
    std::vector<std::shared_ptr<Stream>> streams;
    for (const char* q : {"Write a poem about the sea.", "Count from one to twenty."}) {
      auto s = std::make_shared<Session>(engine, 0, "");
      s->add_message("user", q);
      StreamParams sp;
      sp.max_tokens = 64;
      sp.sampling.temperature = 0;
      streams.push_back(s->start(sp));
      chats.push_back(s);
    }
    EXPECT_EQ(embed_texts(engine, kTexts, p), alone) << pooling_name(pooling) << " beside chat streams";
    for (auto& s : streams) s->wait();
  }
}

TEST(Embed, NormalizedVectorsHaveUnitLength) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(smollm2(), EngineParams{});
  EmbedParams p;
  const auto raw = embed_texts(engine, kTexts, p);
  p.normalize = true;
  const auto unit = embed_texts(engine, kTexts, p);
  for (size_t i = 0; i < raw.size(); ++i) {
    double n = 0;
    for (float x : unit[i]) n += static_cast<double>(x) * x;
    EXPECT_NEAR(std::sqrt(n), 1.0, 1e-5);
    EXPECT_GT(cosine(raw[i], unit[i]), 0.999999);
  }
  // Different texts, different directions; the same text, the same vector.
  EXPECT_LT(cosine(raw[0], raw[1]), 0.999);
  EXPECT_EQ(embed_texts(engine, {kTexts[0]}, EmbedParams{})[0], raw[0]);
}

TEST(Embed, ManualStepEngine) {
  EMBER_REQUIRE_MODEL();
  // Each stepping with the same kernels (a manual engine's default keeps its
  // prompt rows off AMX tiles: EngineParams::prompt_tiles).
  for (const int32_t tiles : {0, 1}) {
    EngineParams ep;
    ep.manual = true;
    ep.prompt_tiles = tiles;
    auto manual = Engine::create(smollm2(), ep);
    EngineParams wp;
    wp.prompt_tiles = tiles;
    auto worker = Engine::create(smollm2(), wp);
    EXPECT_EQ(embed_texts(manual, kTexts, EmbedParams{}), embed_texts(worker, kTexts, EmbedParams{})) << tiles;
  }
}

TEST(Embed, BadInputFailsCleanly) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(smollm2(), EngineParams{});
  auto code_of = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_FALSE(e.message().empty());
      return e.code();
    }
    return StatusCode::kOk;
  };
  EXPECT_EQ(code_of([&] { embed_texts(engine, {}, EmbedParams{}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { embed_texts(engine, {"fine", ""}, EmbedParams{}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { embed_tokens(engine, {{1, 2}, {}}, EmbedParams{}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { embed_tokens(engine, {{1, -5}}, EmbedParams{}); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { embed_tokens(engine, {{1, 1 << 30}}, EmbedParams{}); }), StatusCode::kInvalidArgument);
  EmbedParams bad;
  bad.pooling = static_cast<Pooling>(17);
  EXPECT_EQ(code_of([&] { embed_texts(engine, {"x"}, bad); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { parse_pooling("max"); }), StatusCode::kInvalidArgument);
  const size_t too_long = static_cast<size_t>(smollm2()->config().n_ctx_train) + 1;
  EXPECT_EQ(code_of([&] { embed_tokens(engine, {std::vector<int32_t>(too_long, 1)}, EmbedParams{}); }),
            StatusCode::kContextFull);
  EXPECT_EQ(code_of([&] { embed_texts(engine, std::vector<std::string>(EmbedParams::kMaxInputs + 1, "x"), {}); }),
            StatusCode::kInvalidArgument);
  // Still serving.
  EXPECT_EQ(embed_texts(engine, {"still here"}, EmbedParams{}).size(), 1u);
}

}  // namespace
}  // namespace ember
