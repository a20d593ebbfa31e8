// LoRA adapters (core/model/lora.h): loading and refusing files, sessions
// with different adapters decoding in the same steps without changing each
// other's tokens, the prefix cache keyed by the adapter set, adapters changed
// between turns and released while in use. The adapters are written by
// make_synthetic_model --lora-for (tests/CMakeLists.txt) for the synthetic
// bases. On the real model, greedy decoding with an adapter equals llama.cpp's
// with the same file (tests/golden/lora: tools/ref_lora.py's goldens, the
// adapter written again here from tests/golden/lora/adapters.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <picojson.h>

#include <cstdlib>
#include <sstream>

#include "core/engine/engine.h"
#include "core/model/lora.h"
#include "cpu/matmul.h"
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
  const std::vector<std::shared_ptr<const LoraSet>> sets = {LoraSet::make({{a, 1.0f}}), LoraSet::make({{b, 1.0f}}),
                                                            nullptr, LoraSet::make({{a, 0.5f}, {b, -1.0f}}),
                                                            LoraSet::make({{a, 1.0f}})};
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

// ---- llama.cpp's greedy tokens with the adapter (tests/golden/lora)

picojson::value read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  picojson::value v;
  const std::string err = picojson::parse(v, ss.str());
  EXPECT_TRUE(err.empty()) << path << ": " << err;
  return v;
}

std::vector<int32_t> ints(const picojson::value& v) {
  std::vector<int32_t> out;
  for (const auto& e : v.get<picojson::array>()) out.push_back(static_cast<int32_t>(e.get<double>()));
  return out;
}

// Writes the adapter `file` of tests/golden/lora/adapters.txt (its recipe,
// make_synthetic_model on the model in $EMBER_HOME) into the test's temp dir.
std::string write_golden_adapter(const std::string& file) {
  std::ifstream recipes(std::string(EMBER_SOURCE_DIR) + "/tests/golden/lora/adapters.txt");
  std::string line;
  while (std::getline(recipes, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string name, base_file;
    in >> name >> base_file;
    if (name != file) continue;
    std::string args;
    std::getline(in, args);
    const std::string home = test::default_model_path().substr(0, test::default_model_path().rfind('/') + 1);
    const std::string out = ::testing::TempDir() + "/" + file;
    const std::string cmd = std::string("'") + EMBER_MAKE_SYNTHETIC_MODEL + "' --lora-for '" + home + base_file + "'" +
                            args + " --out '" + out + "' > /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return out;
  }
  ADD_FAILURE() << "no recipe for " << file;
  return "";
}

TEST(LoraReference, GreedyWithAnAdapterEqualsLlamaCpp) {
  EMBER_REQUIRE_MODEL();
  // The goldens are llama.cpp's AVX2 order (as in reference_test.cpp): the
  // kernels that follow it (the AVX2 ones, the tile layout off), for the
  // test's duration (before the weights are packed).
  struct Avx2Kernels {
    Avx2Kernels() {
      cpu::force_isa(cpu::Isa::kAvx2);
      cpu::set_amx_prompt_rows(false);
    }
    ~Avx2Kernels() {
      cpu::reset_isa();
      cpu::reset_amx_prompt_rows();
    }
  } avx2;
  auto m = Model::load(test::default_model_path());
  std::map<std::string, std::shared_ptr<const LoraAdapter>> adapters;
  for (const char* golden : {"smollm2_r16_s1.json", "smollm2_r16_s1_scale0.5.json"}) {
    const picojson::value g = read_json(std::string(EMBER_SOURCE_DIR) + "/tests/golden/lora/" + golden);
    std::vector<LoraUse> uses;
    for (const auto& l : g.get("lora").get<picojson::array>()) {
      const std::string file = l.get("file").get<std::string>();
      if (!adapters.count(file)) adapters[file] = LoraAdapter::load(write_golden_adapter(file), *m);
      uses.push_back({adapters[file], static_cast<float>(l.get("scale").get<double>())});
    }
    const auto set = LoraSet::make(uses);
    const int n = static_cast<int>(g.get("n").get<double>());
    // Every prompt at once (different sets beside each other are covered above),
    // with the adapter and without.
    auto engine = Engine::create(m, EngineParams{});
    struct Run {
      std::string prompt;
      std::vector<int32_t> expected, expected_base;
      std::shared_ptr<Session> with, without;
      std::shared_ptr<Stream> s_with, s_without;
    };
    std::vector<Run> runs;
    for (const auto& p : g.get("prompts").get<picojson::array>()) {
      Run r;
      r.prompt = p.get("prompt").get<std::string>();
      r.expected = ints(p.get("tokens"));
      r.expected_base = ints(p.get("base_tokens"));
      const auto ids = ints(p.get("prompt_tokens"));
      StreamParams sp = greedy(n);
      r.with = std::make_shared<Session>(engine, 0, "");
      r.with->set_loras(set);
      r.with->add_tokens(ids);
      r.s_with = r.with->start(sp);
      r.without = std::make_shared<Session>(engine, 0, "");
      r.without->add_tokens(ids);
      r.s_without = r.without->start(sp);
      runs.push_back(std::move(r));
    }
    for (auto& r : runs) {
      const auto got = drain(r.s_with);
      EXPECT_EQ(got, r.expected) << golden << ": '" << r.prompt << "' with the adapter";
      EXPECT_EQ(drain(r.s_without), r.expected_base) << golden << ": '" << r.prompt << "' without";
      EXPECT_NE(r.expected, r.expected_base) << "the golden adapter changes nothing";
    }
  }
}

}  // namespace
}  // namespace ember
