// Window/sink sessions (StreamingLLM) and session save/restore on the real
// model: streaming past the model's context in constant memory, scoring,
// generation, prefix-cache safety, and files that must be rejected.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <chrono>
#include <thread>

#include "core/engine/engine.h"
#include "core/gguf/gguf.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"
#include "model_path.h"

namespace ember {
namespace {

std::shared_ptr<Model> shared_model() {
  static std::shared_ptr<Model> m = Model::load(test::default_model_path());
  return m;
}

// One thread: these tests run next to others on a small machine, where
// OpenMP's spinning costs far more than it gains.
std::shared_ptr<EngineOwner> small_engine(int32_t block_size = 16) {
  EngineParams p;
  p.n_threads = 1;
  p.kv_memory_bytes = 48ull << 20;
  p.kv_block_size = block_size;
  return Engine::create(shared_model(), p);
}

CachePolicy sink(int32_t s, int32_t w) {
  CachePolicy p;
  p.kind = CachePolicyKind::kSink;
  p.sink_tokens = s;
  p.window_tokens = w;
  return p;
}

// Book text ($EMBER_DATA_DIR or ../shared/data), or generated prose when absent.
const std::vector<int32_t>& book_tokens() {
  static std::vector<int32_t> ids = [] {
    std::string dir = std::string(EMBER_SOURCE_DIR) + "/../shared/data";
    if (const char* e = std::getenv("EMBER_DATA_DIR"); e && *e) dir = e;
    std::ifstream in(dir + "/pride_and_prejudice.txt", std::ios::binary);
    std::string text;
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str().substr(0, 60000);
    } else {
      const char* words[] = {"the",   "house", "was",    "quiet",   "when",   "she", "returned",
                             "from",  "a",     "long",   "walk",    "and",    "her", "sister",
                             "asked", "about", "letter", "evening", "garden", "rain"};
      uint32_t x = 12345;
      for (int i = 0; i < 12000; ++i) {
        x = x * 1103515245u + 12345u;
        text += words[(x >> 16) % 20];
        text += (i % 13 == 12) ? ". " : " ";
      }
    }
    return shared_model()->tokenizer().encode(text, false, false);
  }();
  return ids;
}

std::vector<int32_t> slice(size_t from, size_t n) {
  const auto& b = book_tokens();
  return std::vector<int32_t>(b.begin() + static_cast<long>(from), b.begin() + static_cast<long>(from + n));
}

std::vector<int32_t> drain_tokens(const std::shared_ptr<Stream>& s, EndReason* reason = nullptr) {
  std::vector<int32_t> out;
  for (;;) {
    StreamEvent ev;
    EXPECT_EQ(s->next(ev, 120000), StatusCode::kOk);
    if (ev.type == StreamEvent::kText) {
      out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
      continue;
    }
    EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
    if (reason) *reason = ev.end_reason;
    return out;
  }
}

StreamParams greedy(int n) {
  StreamParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/ember_streaming_" + std::to_string(::getpid()) + "_" + name;
}

// The CI check: a sink session streams far past its cache (and, in
// the long variant, past the model's context of 8192): its cache never holds
// more than S + W tokens, never gives a position >= S + W, and never grows in
// blocks; its log-probs stay sane; generation works on it afterwards.
void stream_far(size_t total, size_t chunk) {
  const int32_t S = 4, W = 60;
  ASSERT_GT(book_tokens().size(), total);
  auto engine = small_engine();
  auto session = std::make_shared<Session>(engine, 0, "", 0, sink(S, W));
  std::vector<float> lp(chunk);
  size_t max_blocks_seen = 0;
  for (size_t at = 0; at < total; at += chunk) {
    session->score(slice(at, chunk), lp.data());
    double nll = 0;
    size_t n = 0;
    for (size_t i = 0; i < chunk; ++i) {
      if (at == 0 && i == 0) {
        EXPECT_TRUE(std::isnan(lp[i]));
        continue;
      }
      ASSERT_TRUE(std::isfinite(lp[i])) << "token " << at + i;
      ASSERT_LE(lp[i], 0.0f);
      nll -= lp[i];
      ++n;
    }
    const double ppl = std::exp(nll / static_cast<double>(n));
    EXPECT_LT(ppl, 300.0) << "tokens " << at << ".." << at + chunk;
    const SessionCacheInfo info = session->cache_info();
    EXPECT_LE(info.resident, static_cast<size_t>(S + W));
    EXPECT_LT(info.max_position, S + W);
    EXPECT_LE(info.blocks, info.max_blocks);
    EXPECT_EQ(info.max_blocks, 5u);  // (16 + 60) slots
    EXPECT_EQ((*engine)->cache_stats().blocks_used, info.blocks);
    max_blocks_seen = std::max(max_blocks_seen, info.blocks);
  }
  const SessionCacheInfo info = session->cache_info();
  EXPECT_EQ(info.n_tokens, total);
  EXPECT_EQ(info.n_processed, total - 1);  // the last token waits for the next call
  EXPECT_GT(info.evicted, total - 100);
  EXPECT_EQ(max_blocks_seen, 5u);
  // Generation continues on the same bounded cache, without "context full".
  EndReason reason = EndReason::kNone;
  const auto gen = drain_tokens(session->start(greedy(80)), &reason);
  EXPECT_EQ(gen.size(), 80u);
  EXPECT_EQ(reason, EndReason::kMaxTokens);
  EXPECT_LT(session->cache_info().max_position, S + W);
  EXPECT_LE(session->cache_info().resident, static_cast<size_t>(S + W));
}

TEST(Streaming, SinkSessionStreamsFarPastItsCache) {
  EMBER_REQUIRE_MODEL();
  stream_far(700, 70);  // 11x the cache of 64 tokens
}

// 8,600 tokens through a 64-token cache: a minute or more of CPU, so only with
// EMBER_LONG_TESTS=1.
TEST(Streaming, SinkSessionStreamsPastTheModelContext) {
  EMBER_REQUIRE_MODEL();
  if (!std::getenv("EMBER_LONG_TESTS")) GTEST_SKIP() << "set EMBER_LONG_TESTS=1 to run";
  ASSERT_GT(8600, shared_model()->config().n_ctx_train);
  stream_far(8600, 430);
}

// Before anything is evicted a sink session computes exactly what a full one
// does (same positions, same slots); afterwards it keeps going where a full
// session of the same size stops.
TEST(Streaming, SinkEqualsFullUntilTheFirstEviction) {
  EMBER_REQUIRE_MODEL();
  auto engine = small_engine();
  auto full = std::make_shared<Session>(engine, 64, "");
  auto snk = std::make_shared<Session>(engine, 0, "", 0, sink(4, 60));
  const auto ids = slice(100, 64);
  std::vector<float> a(64), b(64);
  full->score(ids, a.data());
  snk->score(ids, b.data());
  for (size_t i = 1; i < 64; ++i) EXPECT_EQ(a[i], b[i]) << i;
  EXPECT_EQ(snk->cache_info().evicted, 0u);
  std::vector<float> more(20);
  EXPECT_THROW(full->score(slice(164, 20), more.data()), Error);  // context full
  snk->score(slice(164, 20), more.data());
  EXPECT_GT(snk->cache_info().evicted, 0u);
  for (float x : more) EXPECT_TRUE(std::isfinite(x));
}

// A bounded session's results do not depend on how its tokens were split:
// one call, token at a time, or after a prefix-cache hit.
TEST(Streaming, ScoresDoNotDependOnChunking) {
  EMBER_REQUIRE_MODEL();
  auto engine = small_engine();
  const auto ids = slice(4000, 160);
  auto one = std::make_shared<Session>(engine, 0, "", 0, sink(4, 60));
  std::vector<float> a(ids.size()), b(ids.size());
  one->score(ids, a.data());
  auto each = std::make_shared<Session>(engine, 0, "", 0, sink(4, 60));
  for (size_t i = 0; i < ids.size(); ++i) each->score({ids[i]}, &b[i]);
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
}

// Token-at-a-time scoring (what `ember perplexity --stream` does) keeps the
// bound too, one decode step per token.
TEST(Streaming, TokenByTokenWindowAndSink) {
  EMBER_REQUIRE_MODEL();
  auto engine = small_engine();
  CachePolicy win;
  win.kind = CachePolicyKind::kWindow;
  win.window_tokens = 32;
  auto w = std::make_shared<Session>(engine, 0, "", 0, win);
  auto s = std::make_shared<Session>(engine, 0, "", 0, sink(4, 28));
  const auto ids = slice(0, 150);
  double nll_w = 0, nll_s = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    float lw = 0, ls = 0;
    w->score({ids[i]}, &lw);
    s->score({ids[i]}, &ls);
    if (i == 0) continue;
    ASSERT_TRUE(std::isfinite(lw) && std::isfinite(ls));
    nll_w -= lw;
    nll_s -= ls;
    EXPECT_LE(w->cache_info().resident, 32u);
    EXPECT_LE(s->cache_info().resident, 32u);
  }
  EXPECT_LT(w->cache_info().max_position, 32);
  EXPECT_LT(s->cache_info().max_position, 32);
  EXPECT_EQ(w->cache_info().max_blocks, 2u);
  EXPECT_EQ(s->cache_info().max_blocks, 3u);  // the sinks' block + 28 window slots
  RecordProperty("window_nll", std::to_string(nll_w));
  RecordProperty("sink_nll", std::to_string(nll_s));
}

// A block whose positions changed is never found again at its old positions:
// a sink session that shared a full session's cached prefix and then evicted
// (K-shift) leaves that prefix intact for the next full session.
TEST(Streaming, PrefixCacheSurvivesASinkSessionsShift) {
  EMBER_REQUIRE_MODEL();
  auto engine = small_engine();
  const auto prompt = slice(2000, 96);
  auto a = std::make_shared<Session>(engine, 0, "");
  a->add_tokens(prompt);
  const auto first = drain_tokens(a->start(greedy(12)));
  const uint64_t hits_before = (*engine)->cache_stats().prefix_hits;
  auto s = std::make_shared<Session>(engine, 0, "", 0, sink(4, 60));
  std::vector<float> lp(prompt.size());
  s->score(prompt, nullptr);  // takes the cached prefix (64 tokens), then evicts and shifts
  EXPECT_GT((*engine)->cache_stats().prefix_hits, hits_before);
  EXPECT_GT(s->cache_info().evicted, 0u);
  s->score(slice(2096, 40), nullptr);
  auto c = std::make_shared<Session>(engine, 0, "");
  c->add_tokens(prompt);
  EXPECT_EQ(drain_tokens(c->start(greedy(12))), first);
}

// Chat on a sink session keeps working turn after turn once the window has
// moved past the first messages.
TEST(Streaming, ChatTurnsOnASinkSession) {
  EMBER_REQUIRE_MODEL();
  auto engine = small_engine();
  auto s = std::make_shared<Session>(engine, 0, "", 0, sink(4, 96));
  const char* questions[] = {"Name three colours.", "Name three animals.", "Name three cities."};
  for (const char* q : questions) {
    s->add_message("user", q);
    StreamParams p = greedy(40);
    p.ignore_eos = false;
    const auto reply = drain_tokens(s->start(p));
    EXPECT_FALSE(reply.empty());
  }
  EXPECT_GT(s->cache_info().evicted, 0u);
  EXPECT_LE(s->cache_info().resident, 100u);
}

// ---------------------------------------------------------------- save / restore

TEST(SessionFile, RestoredSinkSessionContinuesExactly) {
  EMBER_REQUIRE_MODEL();
  auto engine = small_engine();
  const std::string path = temp_path("sink.ems");
  const auto history = slice(500, 300);
  const auto next = slice(800, 40);
  // Uninterrupted.
  auto a = std::make_shared<Session>(engine, 0, "", 0, sink(4, 60));
  a->score(history, nullptr);
  ASSERT_GT(a->cache_info().evicted, 0u);
  std::vector<float> lp_a(next.size());
  a->score(next, lp_a.data());
  const auto gen_a = drain_tokens(a->start(greedy(24)));
  // Saved after the history, restored into a new session.
  {
    auto b = std::make_shared<Session>(engine, 0, "", 0, sink(4, 60));
    b->score(history, nullptr);
    b->save(path);
  }
  // b's blocks go back once the engine has dropped its finished stream.
  for (int i = 0; i < 200 && (*engine)->cache_stats().blocks_used != a->cache_info().blocks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*engine)->cache_stats().blocks_used, a->cache_info().blocks);
  auto c = Session::load(engine, path);
  const SessionCacheInfo info = c->cache_info();
  EXPECT_EQ(info.policy.kind, CachePolicyKind::kSink);
  EXPECT_EQ(info.policy.sink_tokens, 4);
  EXPECT_EQ(info.policy.window_tokens, 60);
  EXPECT_EQ(info.n_tokens, history.size());
  EXPECT_GT(info.evicted, 0u);
  std::vector<float> lp_c(next.size());
  c->score(next, lp_c.data());
  for (size_t i = 0; i < next.size(); ++i) EXPECT_EQ(lp_a[i], lp_c[i]) << i;
  EXPECT_EQ(drain_tokens(c->start(greedy(24))), gen_a);
  std::remove(path.c_str());
}

TEST(SessionFile, RestoredChatAndFullSessionsContinueExactly) {
  EMBER_REQUIRE_MODEL();
  auto engine = small_engine();
  const std::string path = temp_path("chat.ems");
  auto turn = [](const std::shared_ptr<Session>& s, const char* q) {
    s->add_message("user", q);
    StreamParams p = greedy(24);
    p.ignore_eos = false;
    return drain_tokens(s->start(p));
  };
  // A chat on a sink session that has evicted, and a full text session.
  auto a = std::make_shared<Session>(engine, 0, "You are terse.", 0, sink(4, 48));
  turn(a, "Say hello.");
  turn(a, "Now say goodbye.");
  ASSERT_GT(a->cache_info().evicted, 0u);
  a->save(path);
  const auto want = turn(a, "And thank you?");
  auto b = Session::load(engine, path);
  EXPECT_EQ(turn(b, "And thank you?"), want);

  auto f = std::make_shared<Session>(engine, 0, "");
  f->add_tokens(slice(3000, 70));
  drain_tokens(f->start(greedy(10)));
  f->save(path);
  f->add_tokens(slice(3100, 5));
  const auto want_f = drain_tokens(f->start(greedy(16)));
  // Restored on another engine: its pool holds nothing but the file's KV.
  auto engine2 = small_engine();
  auto g = Session::load(engine2, path);
  EXPECT_EQ((*engine2)->cache_stats().blocks_cached, 4u);  // the 64 saved prefix tokens, parked
  g->add_tokens(slice(3100, 5));
  EXPECT_EQ(drain_tokens(g->start(greedy(16))), want_f);
  std::remove(path.c_str());
}

StatusCode load_error(const std::shared_ptr<EngineOwner>& engine, const std::string& path, std::string* msg) {
  try {
    Session::load(engine, path);
  } catch (const Error& e) {
    *msg = e.message();
    return e.code();
  }
  return StatusCode::kOk;
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(SessionFile, RejectsCorruptTruncatedForeignAndOtherModelFiles) {
  EMBER_REQUIRE_MODEL();
  auto engine = small_engine();
  const std::string path = temp_path("good.ems"), bad = temp_path("bad.ems");
  auto s = std::make_shared<Session>(engine, 0, "", 0, sink(4, 60));
  s->score(slice(0, 200), nullptr);
  s->save(path);
  const std::vector<char> good = read_all(path);
  ASSERT_GT(good.size(), 1000u);
  std::string msg;

  std::vector<char> flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;  // inside the KV data
  write_all(bad, flipped);
  EXPECT_EQ(load_error(engine, bad, &msg), StatusCode::kBadFormat);
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;

  flipped = good;
  flipped[60] ^= 0x01;  // inside the payload's header fields
  write_all(bad, flipped);
  EXPECT_EQ(load_error(engine, bad, &msg), StatusCode::kBadFormat);

  for (size_t keep : {good.size() - 1, good.size() / 2, size_t{40}}) {
    write_all(bad, std::vector<char>(good.begin(), good.begin() + static_cast<long>(keep)));
    EXPECT_EQ(load_error(engine, bad, &msg), StatusCode::kBadFormat) << keep;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  }
  write_all(bad, std::vector<char>(good.begin(), good.end()));
  {
    std::ofstream app(bad, std::ios::binary | std::ios::app);
    app << "extra";
  }
  EXPECT_EQ(load_error(engine, bad, &msg), StatusCode::kBadFormat);

  write_all(bad, std::vector<char>(2000, 'x'));
  EXPECT_EQ(load_error(engine, bad, &msg), StatusCode::kBadFormat);
  EXPECT_NE(msg.find("not an Ember session file"), std::string::npos) << msg;

  EXPECT_EQ(load_error(engine, temp_path("missing.ems"), &msg), StatusCode::kNotFound);

  // Another KV block size.
  auto engine32 = small_engine(32);
  EXPECT_EQ(load_error(engine32, path, &msg), StatusCode::kUnsupported);
  EXPECT_NE(msg.find("kv_block_size"), std::string::npos) << msg;

  // Another model with the very same shapes (one weight byte differs, as in
  // a fine-tune): a copy of the GGUF with a byte of blk.0.attn_q changed.
  const std::string model_copy = temp_path("model.gguf");
  {
    auto gguf = gguf::GgufFile::open(test::default_model_path());
    size_t offset = 0;
    for (const auto& t : gguf->tensors()) {
      if (t.name == "blk.0.attn_q.weight") offset = gguf->data_offset() + t.offset + 100;
    }
    ASSERT_GT(offset, 0u);
    std::vector<char> bytes = read_all(test::default_model_path());
    bytes[offset] ^= 0x11;
    write_all(model_copy, bytes);
  }
  {
    EngineParams p;
    p.n_threads = 1;
    p.kv_memory_bytes = 16ull << 20;
    auto other = Engine::create(Model::load(model_copy), p);
    EXPECT_EQ(load_error(other, path, &msg), StatusCode::kUnsupported);
    EXPECT_NE(msg.find("different model"), std::string::npos) << msg;
  }
  // The original still loads.
  EXPECT_EQ(load_error(engine, path, &msg), StatusCode::kOk) << msg;
  std::remove(model_copy.c_str());
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

}  // namespace
}  // namespace ember
