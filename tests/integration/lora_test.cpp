// LoRA adapters (core/model/lora.h): loading and refusing files, sessions
// with different adapters decoding in the same steps without changing each
// other's tokens, the prefix cache keyed by the adapter set, adapters changed
// between turns and released while in use. The adapters are written by
// make_synthetic_model --lora-for (tests/CMakeLists.txt) for the synthetic
// bases; llama.cpp's greedy tokens with an adapter on the real model are in
// lora_reference_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/lora.h"
#include "model_path.h"

namespace ember {
namespace {

std::string synthetic(const std::string& name) { return std::string(EMBER_SYNTHETIC_DIR) + "/" + name; }

std::shared_ptr<Model> base(const std::string& arch) {
  static std::map<std::string, std::shared_ptr<Model>> cache;
  auto& m = cache[arch];
  if (!m) m = Model::load(synthetic(arch + ".gguf"));
  return m;
}

std::vector<int32_t> drain(const std::shared_ptr<Stream>& s) {
  std::vector<int32_t> out;
  for (;;) {
    StreamEvent ev;
    const StatusCode c = s->next(ev, 120000);
    EXPECT_EQ(c, StatusCode::kOk);
    if (c != StatusCode::kOk) return out;
    if (ev.type == StreamEvent::kText) {
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
    } else {
      EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
      return out;
    }
  }
}

StreamParams greedy(int n) {
  StreamParams p;
  p.max_tokens = n;
  p.sampling.temperature = 0.0f;
  p.ignore_eos = true;
  return p;
}

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(3 + (i * 37 + salt * 11) % 300);
  return ids;
}

StatusCode load_code(const std::string& path, const Model& m, std::string* msg = nullptr) {
  try {
    LoraAdapter::load(path, m);
    return StatusCode::kOk;
  } catch (const Error& e) {
    if (msg) *msg = e.message();
    return e.code();
  }
}

// A session's greedy reply under `set` on its own engine (nothing beside it).
std::vector<int32_t> alone(const std::shared_ptr<Model>& m, std::shared_ptr<const LoraSet> set,
                           const std::vector<int32_t>& ids, int n) {
  auto engine = Engine::create(m, EngineParams{});
  auto s = std::make_shared<Session>(engine, 0, "");
  s->set_loras(std::move(set));
  s->add_tokens(ids);
  return drain(s->start(greedy(n)));
}

TEST(Lora, LoadsAndDescribesAnAdapter) {
  auto a = LoraAdapter::load(synthetic("lora_llama3_a.gguf"), *base("llama3"));
  EXPECT_GT(a->n_pairs(), 0);
  EXPECT_EQ(a->max_rank(), 8);
  EXPECT_GT(a->bytes(), 0u);
  EXPECT_NE(a->key(), 0u);
  EXPECT_TRUE(a->fits(*base("llama3")));
  ASSERT_NE(a->find(0, LoraTarget::kQ), nullptr);
  EXPECT_EQ(a->find(0, LoraTarget::kQ)->rank, 8);
  // The same file twice: the same content key (prefix sharing across loads).
  auto again = LoraAdapter::load(synthetic("lora_llama3_a.gguf"), *base("llama3"));
  EXPECT_EQ(again->key(), a->key());
  auto b = LoraAdapter::load(synthetic("lora_llama3_b.gguf"), *base("llama3"));
  EXPECT_NE(b->key(), a->key());
}

TEST(Lora, RefusesBadFilesClearly) {
  const Model& llama = *base("llama3");
  std::string msg;
  // An adapter for another architecture / shape.
  EXPECT_EQ(load_code(synthetic("lora_gemma3_a.gguf"), llama, &msg), StatusCode::kInvalidArgument) << msg;
  EXPECT_NE(msg.find("gemma3"), std::string::npos) << msg;
  // A model is not an adapter.
  EXPECT_EQ(load_code(synthetic("llama3.gguf"), llama, &msg), StatusCode::kBadFormat) << msg;
  EXPECT_NE(msg.find("not an adapter"), std::string::npos) << msg;
  // Missing, truncated, garbage.
  EXPECT_EQ(load_code(synthetic("no_such_adapter.gguf"), llama, &msg), StatusCode::kNotFound) << msg;
  std::ifstream in(synthetic("lora_llama3_a.gguf"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 4096u);
  const std::string dir = ::testing::TempDir();
  for (size_t cut : {size_t{10}, size_t{200}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string path = dir + "/lora_truncated.gguf";
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(cut));
    EXPECT_EQ(load_code(path, llama, &msg), StatusCode::kBadFormat) << "cut at " << cut << ": " << msg;
  }
  // Flipped bytes anywhere: an error or a valid adapter, never a crash.
  for (size_t at = 0; at < bytes.size(); at += bytes.size() / 97 + 1) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    const std::string path = dir + "/lora_flipped.gguf";
    std::ofstream(path, std::ios::binary).write(bad.data(), static_cast<std::streamsize>(bad.size()));
    (void)load_code(path, llama);
  }
}

TEST(Lora, RefusesAbsurdSets) {
  auto a = LoraAdapter::load(synthetic("lora_llama3_a.gguf"), *base("llama3"));
  for (float s : {std::nanf(""), INFINITY, -INFINITY, 1e9f, -2000.0f}) {
    try {
      LoraSet::make({{a, s}});
      ADD_FAILURE() << "scale " << s << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument) << s;
    }
  }
  try {
    LoraSet::make({{nullptr, 1.0f}});
    ADD_FAILURE() << "null adapter accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  }
  std::vector<LoraUse> many(LoraSet::kMaxAdapters + 1, LoraUse{a, 1.0f});
  EXPECT_THROW(LoraSet::make(many), Error);
  EXPECT_EQ(LoraSet::make({}), nullptr);
  EXPECT_EQ(LoraSet::make({{a, 0.0f}}), nullptr);  // scale 0 adds nothing
  // An adapter of another model on a session: refused, the session still serves.
  auto engine = Engine::create(base("llama3"), EngineParams{});
  auto s = std::make_shared<Session>(engine, 0, "");
  auto g = LoraAdapter::load(synthetic("lora_gemma3_a.gguf"), *base("gemma3"));
  try {
    s->set_loras(LoraSet::make({{g, 1.0f}}));
    ADD_FAILURE() << "gemma3 adapter accepted on a llama3 session";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  }
  s->add_tokens(prompt(8, 1));
  EXPECT_EQ(drain(s->start(greedy(4))).size(), 4u);
}

// Sessions with different adapters (and none) decode in the same steps; each
// one's tokens equal what it computes alone, on every architecture tested.
class LoraArch : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraArch, TokensDoNotDependOnTheOtherSessionsAdapters) {
  const std::string arch = GetParam();
  auto m = base(arch);
  auto a = LoraAdapter::load(synthetic("lora_" + arch + "_a.gguf"), *m);
  auto b = LoraAdapter::load(synthetic("lora_" + arch + "_b.gguf"), *m);
  const std::vector<std::shared_ptr<const LoraSet>> sets = {
      LoraSet::make({{a, 1.0f}}), LoraSet::make({{b, 1.0f}}), nullptr,
      LoraSet::make({{a, 0.5f}, {b, -1.0f}}), LoraSet::make({{a, 1.0f}})};
  const int n = 12;
  std::vector<std::vector<int32_t>> prompts, solo;
  for (size_t i = 0; i < sets.size(); ++i) {
    prompts.push_back(prompt(5 + 9 * static_cast<int>(i), static_cast<int>(i)));
    solo.push_back(alone(m, sets[i], prompts[i], n));
  }
  // The adapters change the model's output.
  EXPECT_NE(solo[0], alone(m, nullptr, prompts[0], n)) << "adapter A changed nothing";
  EXPECT_NE(solo[1], alone(m, nullptr, prompts[1], n)) << "adapter B changed nothing";
  // All at once: prefill chunks and decodes of different sets in the same steps.
  auto engine = Engine::create(m, EngineParams{});
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::shared_ptr<Stream>> streams;
  for (size_t i = 0; i < sets.size(); ++i) {
    sessions.push_back(std::make_shared<Session>(engine, 0, ""));
    sessions.back()->set_loras(sets[i]);
    sessions.back()->add_tokens(prompts[i]);
    streams.push_back(sessions.back()->start(greedy(n)));
  }
  for (size_t i = 0; i < sets.size(); ++i) EXPECT_EQ(drain(streams[i]), solo[i]) << arch << " session " << i;
}

INSTANTIATE_TEST_SUITE_P(Archs, LoraArch, ::testing::Values("llama3", "qwen2", "gemma3"));

TEST(Lora, PrefixCacheIsKeyedByTheAdapterSet) {
  auto m = base("llama3");
  auto a = LoraAdapter::load(synthetic("lora_llama3_a.gguf"), *m);
  const auto ids = prompt(70, 3);  // several full blocks
  const auto with_a = alone(m, LoraSet::make({{a, 1.0f}}), ids, 8);
  const auto without = alone(m, nullptr, ids, 8);
  auto engine = Engine::create(m, EngineParams{});
  auto run = [&](std::shared_ptr<const LoraSet> set) {
    auto s = std::make_shared<Session>(engine, 0, "");
    s->set_loras(std::move(set));
    s->add_tokens(ids);
    return drain(s->start(greedy(8)));
  };
  EXPECT_EQ(run(LoraSet::make({{a, 1.0f}})), with_a);
  const uint64_t hits0 = (*engine)->cache_stats().prefix_hits;
  EXPECT_EQ(run(nullptr), without);  // the same tokens, another set: no block of A's
  EXPECT_EQ((*engine)->cache_stats().prefix_hits, hits0);
  EXPECT_EQ(run(LoraSet::make({{a, 1.0f}})), with_a);  // A again: its blocks
  EXPECT_GT((*engine)->cache_stats().prefix_hits, hits0);
  // The same adapter loaded again: the same key, the same blocks.
  auto a2 = LoraAdapter::load(synthetic("lora_llama3_a.gguf"), *m);
  const uint64_t hits1 = (*engine)->cache_stats().prefix_hits;
  EXPECT_EQ(run(LoraSet::make({{a2, 1.0f}})), with_a);
  EXPECT_GT((*engine)->cache_stats().prefix_hits, hits1);
  // Another scale is another set.
  const uint64_t hits2 = (*engine)->cache_stats().prefix_hits;
  run(LoraSet::make({{a, 0.5f}}));
  EXPECT_EQ((*engine)->cache_stats().prefix_hits, hits2);
}

TEST(Lora, ChangedBetweenTurnsAndReleasedWhileInUse) {
  auto m = base("llama3");
  auto a = LoraAdapter::load(synthetic("lora_llama3_a.gguf"), *m);
  auto b = LoraAdapter::load(synthetic("lora_llama3_b.gguf"), *m);
  auto engine = Engine::create(m, EngineParams{});
  auto s = std::make_shared<Session>(engine, 0, "");
  s->set_loras(LoraSet::make({{a, 1.0f}}));
  const auto first = prompt(20, 5);
  s->add_tokens(first);
  const auto reply1 = drain(s->start(greedy(6)));
  // Turn 2 under B: the whole history is computed with B, as a fresh session would.
  s->set_loras(LoraSet::make({{b, 1.0f}}));
  const auto more = prompt(7, 6);
  s->add_tokens(more);
  std::vector<int32_t> history = first;
  history.insert(history.end(), reply1.begin(), reply1.end());
  history.insert(history.end(), more.begin(), more.end());
  EXPECT_EQ(drain(s->start(greedy(6))), alone(m, LoraSet::make({{b, 1.0f}}), history, 6));
  // The host lets go of B while the session still uses it: nothing changes.
  const auto expected = alone(m, LoraSet::make({{b, 1.0f}}), prompt(9, 8), 10);
  auto s2 = std::make_shared<Session>(engine, 0, "");
  s2->set_loras(LoraSet::make({{b, 1.0f}}));
  b.reset();
  s2->add_tokens(prompt(9, 8));
  EXPECT_EQ(drain(s2->start(greedy(10))), expected);
  // Busy: no change while a stream runs.
  auto s3 = std::make_shared<Session>(engine, 0, "");
  s3->add_tokens(prompt(9, 9));
  auto st = s3->start(greedy(64));
  try {
    s3->set_loras(LoraSet::make({{a, 1.0f}}));
    EXPECT_TRUE(st->finished()) << "set_loras during a stream was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kBusy);
  }
  drain(st);
  // A session with adapters is not saved (yet): a clear error.
  try {
    s->save(::testing::TempDir() + "/lora_session.bin");
    ADD_FAILURE() << "saved";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kUnsupported);
  }
}

}  // namespace
}  // namespace ember
