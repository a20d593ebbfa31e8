// A packed weight's GGUF pages leave the process (issue 28 item 3): the
// model costs its file size once, engines of one model share one packed copy,
// every reader of the GGUF bytes gets them back first (an engine that needs
// them, a tied table's lookup), and a model file changed since it was loaded
// is an error on the stream that needed it, never other weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/engine.h"
#include "core/gguf/gguf.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"
#include "cpu/matmul.h"

namespace ember {
namespace {

#define REQUIRE_CPU_PACKING(w)                                                                          \
  do {                                                                                                  \
    const char* dev = std::getenv("EMBER_FORCE_DEVICE");                                                \
    if (dev && *dev && std::string(dev) != "cpu") GTEST_SKIP() << "the CPU backend's packing";          \
    if (cpu::packed_bytes((w).type, (w).rows, (w).cols) == 0) GTEST_SKIP() << "no packing on this CPU"; \
  } while (0)

const std::string kModel = std::string(EMBER_SYNTHETIC_DIR) + "/llama_q4_k_m_tied.gguf";

std::shared_ptr<EngineOwner> engine(const std::shared_ptr<Model>& m, bool batch_invariant = true) {
  EngineParams p;
  p.n_threads = 1;
  p.kv_memory_bytes = 8ull << 20;
  p.batch_invariant = batch_invariant;
  return Engine::create(m, p);
}

// Greedy tokens, or the stream's error message in `error`.
std::vector<int32_t> generate(const std::shared_ptr<EngineOwner>& e, std::string* error = nullptr) {
  auto s = std::make_shared<Session>(e, 0, "");
  s->add_tokens({1, 7, 42, 99, 3, 250, 17});
  StreamParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = 12;
  p.ignore_eos = true;
  auto st = s->start(p);
  std::vector<int32_t> out;
  for (;;) {
    StreamEvent ev;
    EXPECT_EQ(st->next(ev, 120000), StatusCode::kOk);
    if (ev.type == StreamEvent::kText) {
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
      continue;
    }
    if (ev.type == StreamEvent::kError && error) *error = ev.error;
    EXPECT_TRUE(error || ev.type == StreamEvent::kEnd) << ev.error;
    return out;
  }
}

size_t bytes_of(const WeightDesc& w) { return row_bytes(w.type, w.cols) * static_cast<size_t>(w.rows); }
size_t released(const WeightDesc& w) { return gguf::released_image_bytes(w.host_data, bytes_of(w)); }

TEST(WeightRelease, PackedWeightsLeaveTheImageAndEveryReaderGetsThemBack) {
  auto m = Model::load(kModel);
  const WeightDesc& wq = m->layers()[0].wq;  // Q4_K
  const WeightDesc& embd = m->token_embd();  // Q6_K, tied: the output head too
  ASSERT_EQ(wq.type, DType::Q4_K);
  ASSERT_EQ(m->output().host_data, embd.host_data) << "the test needs a tied table";
  REQUIRE_CPU_PACKING(wq);
  const std::vector<uint8_t> wq_bytes(static_cast<const uint8_t*>(wq.host_data),
                                      static_cast<const uint8_t*>(wq.host_data) + bytes_of(wq));
  EXPECT_EQ(released(wq), 0u);

  std::vector<int32_t> first;
  {
    auto a = engine(m);
    first = generate(a);
    ASSERT_EQ(first.size(), 12u);
    // Packed on the first step and released: all but the pages the weight
    // shares with its neighbours (and one per packed megabyte).
    EXPECT_GE(released(wq) + 3 * 4096, bytes_of(wq));
    if (cpu::packed_bytes(embd.type, embd.rows, embd.cols) > 0) {
      EXPECT_GT(released(embd) + 3 * 4096, bytes_of(embd));
    }
    // The tied table's lookups now read the packed copy: the same tokens.
    EXPECT_EQ(generate(a), first);
    // A second engine shares the packed copy (nothing brought back).
    auto b = engine(m);
    EXPECT_EQ(generate(b), first);
    EXPECT_GE(released(wq) + 3 * 4096, bytes_of(wq));
    // An engine whose prefill goes through oneDNN reads the GGUF bytes: they
    // come back, exactly, while it lives.
    auto c = engine(m, false);
    EXPECT_EQ(generate(c).size(), 12u);
    EXPECT_EQ(released(wq), 0u);
    EXPECT_EQ(std::memcmp(wq_bytes.data(), wq.host_data, wq_bytes.size()), 0);
    EXPECT_EQ(generate(a), first);
  }
  // Every engine gone: a new one packs again and releases again. (An engine's
  // last reference can be a finished stream its worker has not yet dropped;
  // the engine, its packed copies and its pins go with it, just after.)
  for (int i = 0; i < 1000 && m.use_count() > 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(m.use_count(), 1) << "an engine outlived its owner by 10 s";
  auto d = engine(m);
  EXPECT_EQ(generate(d), first);
  EXPECT_GE(released(wq) + 3 * 4096, bytes_of(wq));
}

TEST(WeightRelease, AFileChangedSinceLoadingIsAnErrorOnTheStreamThatNeedsIt) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ember_weight_release_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  std::filesystem::copy_file(kModel, path, std::filesystem::copy_options::overwrite_existing);
  auto m = Model::load(path);
  const WeightDesc& wq = m->layers()[0].wq;
  REQUIRE_CPU_PACKING(wq);
  auto a = engine(m);
  const auto tokens = generate(a);
  ASSERT_GT(released(wq), 0u);
  {                                       // a byte in the middle of the released weight, changed in place on disk
    auto f = gguf::GgufFile::open(path);  // (where the weight is in the file)
    const gguf::TensorInfo* t = f->find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(t, nullptr);
    const auto off = static_cast<std::streamoff>(f->data_offset() + t->offset + t->nbytes / 2);
    f.reset();
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(off);
    const char ch = static_cast<char>(io.get());
    io.seekp(off);
    io.put(static_cast<char>(ch ^ 0x10));
  }
  // An engine that needs the GGUF bytes: its stream ends with the error.
  auto c = engine(m, false);
  std::string error;
  generate(c, &error);
  EXPECT_NE(error.find("changed since it was loaded"), std::string::npos) << error;
  // The first engine, on its packed copy, is untouched.
  EXPECT_EQ(generate(a), tokens);
  c.reset();
  a.reset();
  m.reset();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ember
