// Many threads on one engine: each thread drives its own session; outputs do
// not depend on what else runs; cancellation and destruction from other
// threads leave sessions consistent.
//
// EMBER_TEST_REDUCED=1 runs every test at a reduced size (fewer threads,
// tokens and iterations; the same checks), for the sanitizer passes of
// tools/test.sh, where the full size takes many minutes on 2 cores.
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

#ifdef EMBER_TSAN_SUPPRESSIONS
// TSan builds (EMBER_TSAN=ON) read tests/capi/tsan.supp; see that file for why.
// (Default visibility: the TSan runtime looks the hook up dynamically.)
extern "C" __attribute__((visibility("default"))) const char* __tsan_default_options() {
  return "suppressions=" EMBER_TSAN_SUPPRESSIONS;
}
#endif

namespace {

constexpr int kMaxThreads = 8;

// Full size, or the reduced size under EMBER_TEST_REDUCED=1.
int sized(int full, int reduced) {
  return reduced_size() ? reduced : full;
}
const int kThreads = sized(kMaxThreads, 4);
const int32_t kMaxTokens = sized(12, 5);

struct Request {
  std::string prompt;
  ember_stream_params params;
};

std::vector<Request> requests() {
  const char* prompts[kMaxThreads] = {
      "What is the capital of Italy?",     "Write a haiku about rain.",      "Name three prime numbers.",
      "Explain gravity in one sentence.",  "What colour is the sky?",        "Give me a word that rhymes with cat.",
      "How many legs does a spider have?", "Say something nice about cats.",
  };
  std::vector<Request> out;
  for (int i = 0; i < kThreads; ++i) {
    // Even: greedy; odd: sampled with a fixed seed.
    out.push_back({prompts[i], i % 2 == 0 ? greedy_params(kMaxTokens) : sampled_params(kMaxTokens, 1000 + i)});
  }
  return out;
}

Collected run_request(ember_engine* engine, const Request& r) {
  SessionPtr session = make_session(engine);
  if (!session) return {};
  EXPECT_EQ(ember_session_add_message(session.get(), "user", r.prompt.c_str()), EMBER_OK) << ember_last_error();
  return run(session.get(), r.params);
}

void expect_same(const Collected& got, const Collected& want, int i) {
  EXPECT_TRUE(got.ended) << "request " << i;
  EXPECT_EQ(got.error, EMBER_OK) << "request " << i;
  EXPECT_EQ(got.tokens, want.tokens) << "request " << i;
  EXPECT_EQ(got.text, want.text) << "request " << i;
  EXPECT_EQ(got.end_reason, want.end_reason) << "request " << i;
}

}  // namespace

TEST(CapiConcurrency, EightSessionsMatchSoloRuns) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  ASSERT_TRUE(engine);
  const std::vector<Request> reqs = requests();
  std::vector<Collected> solo;
  for (const auto& r : reqs) solo.push_back(run_request(engine.get(), r));
  for (const auto& c : solo) ASSERT_FALSE(c.tokens.empty());

  // Round 0: all start together; round 1: staggered starts, so prefills and
  // decodes of different requests share steps in other combinations.
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<Collected> got(kThreads);
    std::barrier sync(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        sync.arrive_and_wait();
        if (round == 1) std::this_thread::sleep_for(std::chrono::milliseconds(15 * i));
        got[i] = run_request(engine.get(), reqs[i]);
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kThreads; ++i) expect_same(got[i], solo[i], i);
  }
  ember_scheduler_stats_t ss;
  std::memset(&ss, 0, sizeof ss);
  ss.size = sizeof ss;
  ASSERT_OK(ember_scheduler_stats(ember_engine_scheduler(engine.get()), &ss));
  EXPECT_GT(ss.steps, 0u);
}

TEST(CapiConcurrency, CancelFromAnotherThreadLeavesSessionConsistent) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  const std::vector<Request> reqs = requests();
  std::vector<Collected> solo;
  for (int i = 0; i < 3; ++i) solo.push_back(run_request(engine.get(), reqs[i]));

  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Tell me a very long story about a castle."));
  ember_stream_params p = greedy_params(1 << 20);
  p.ignore_eos = 1;
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &s));
  StreamPtr stream(s);

  // Three other sessions stream at the same time and must not notice.
  std::vector<Collected> others(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) threads.emplace_back([&, i] { others[i] = run_request(engine.get(), reqs[i]); });

  std::atomic<int> pieces{0};
  Collected c;
  std::thread reader([&] {
    for (;;) {
      ember_event ev = new_event();
      if (ember_stream_next(s, &ev, -1) != EMBER_OK) break;
      if (ev.type != EMBER_EVENT_TEXT) {
        c.end_reason = ev.end_reason;
        c.ended = true;
        break;
      }
      c.tokens.insert(c.tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
      c.text.append(ev.text, ev.text_length);
      ++pieces;
    }
  });
  while (pieces < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_OK(ember_stream_cancel(s));  // from this thread while the reader waits in next()
  reader.join();
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) expect_same(others[i], solo[i], i);

  EXPECT_TRUE(c.ended);
  EXPECT_EQ(c.end_reason, EMBER_END_CANCELLED);
  ember_stream_stats_t st;
  std::memset(&st, 0, sizeof st);
  st.size = sizeof st;
  ASSERT_OK(ember_stream_stats(s, &st));
  EXPECT_EQ(st.finished, 1);
  EXPECT_EQ(st.end_reason, EMBER_END_CANCELLED);
  EXPECT_EQ(st.generated_tokens, c.tokens.size()) << "every generated token was delivered";
  // The session holds the prompt plus exactly what was generated. (The
  // prompt's length: the same message on a session that generates one token.)
  SessionPtr probe = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(probe.get(), "user", "Tell me a very long story about a castle."));
  ember_stream_params one = greedy_params(1);
  one.ignore_eos = 1;
  ASSERT_TRUE(run(probe.get(), one).ended);
  const size_t prompt_tokens = token_count(probe.get()) - 1;
  EXPECT_LE(st.prompt_tokens, prompt_tokens) << "prefilled (not cached) part of the prompt";
  EXPECT_EQ(token_count(session.get()), prompt_tokens + st.generated_tokens);

  // Reusable: the conversation continues, and matches the same history run
  // from scratch (the cancelled reply counts as the assistant's turn).
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Stop. What is 1+1?"));
  const Collected cont = run(session.get(), greedy_params(6));
  EXPECT_TRUE(cont.ended);
  SessionPtr fresh = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(fresh.get(), "user", "Tell me a very long story about a castle."));
  ASSERT_OK(ember_session_add_message(fresh.get(), "assistant", c.text.c_str()));
  ASSERT_OK(ember_session_add_message(fresh.get(), "user", "Stop. What is 1+1?"));
  EXPECT_EQ(run(fresh.get(), greedy_params(6)).text, cont.text);
}

TEST(CapiConcurrency, CancelRacesWithStartAndEnd) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(session.get(), "Hello there", 0));
  const int iterations = sized(12, 6);
  for (int i = 0; i < iterations; ++i) {
    ember_stream_params p = greedy_params(1 + i % 3);
    p.ignore_eos = 1;
    ember_stream* s = nullptr;
    ASSERT_OK(ember_stream_start(session.get(), &p, &s));
    std::thread canceller([s, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(500 * (i % 4)));
      ember_stream_cancel(s);
    });
    const Collected c = drain(s);
    canceller.join();
    EXPECT_TRUE(c.end_reason == EMBER_END_CANCELLED || c.end_reason == EMBER_END_MAX_TOKENS) << c.end_reason;
    ember_stream_destroy(s);
  }
  // Never left busy.
  EXPECT_TRUE(run(session.get(), greedy_params(1)).ended);
}

TEST(CapiConcurrency, DestroyWhileRunningFromManyThreads) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  const int n_threads = sized(4, 2);
  std::latch sessions_created(n_threads);
  for (int t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      SessionPtr session = make_session(engine.get());
      sessions_created.count_down();
      if (ember_session_add_text(session.get(), "Numbers: 1 2 3", 0) != EMBER_OK) ++failures;
      for (int i = 0; i < 4; ++i) {  // (i = 0..3: every combination of the two branches below)
        ember_stream_params p = greedy_params(1 << 20);
        p.ignore_eos = 1;
        ember_stream* s = nullptr;
        if (ember_stream_start(session.get(), &p, &s) != EMBER_OK) {
          ++failures;
          continue;
        }
        if ((t + i) % 2 == 1) {
          ember_event ev = new_event();
          if (ember_stream_next(s, &ev, -1) != EMBER_OK) ++failures;
        }
        if ((t + i) % 3 == 0) {
          ember_stream_set_callback(
              s, [](const ember_event*, void*) -> int32_t { return 0; }, nullptr);
        }
        ember_stream_destroy(s);
      }
    });
  }
  // Meanwhile the engine handle goes away; the sessions keep it running.
  sessions_created.wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  engine.reset();
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(CapiConcurrency, ScoreAndTokenizeBesideStreams) {
  CAPI_REQUIRE_MODEL(model);
  // All cores: OpenMP teams on the worker and on the scoring threads.
  EnginePtr engine = make_engine(model, kTestKvBytes, 0);
  const char* text = "The cat sat on the mat.";
  int32_t ids[32];
  size_t n = 0;
  ASSERT_OK(ember_tokenize(model, text, 1, 0, ids, 32, &n));
  std::vector<float> solo(n);
  ASSERT_OK(ember_engine_score(engine.get(), ids, n, solo.data(), nullptr));
  Request req = requests()[0];
  req.params.max_tokens = 6;
  const Collected reference = run_request(engine.get(), req);

  constexpr int kScorers = 2, kTokenizers = 3;
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> scores(kScorers, std::vector<float>(n));
  std::vector<std::vector<int32_t>> tokenized(kTokenizers, std::vector<int32_t>(32));
  Collected streamed;
  threads.emplace_back([&] { streamed = run_request(engine.get(), req); });
  for (int i = 0; i < kScorers; ++i) {
    threads.emplace_back([&, i] {
      EXPECT_EQ(ember_engine_score(engine.get(), ids, n, scores[i].data(), nullptr), EMBER_OK) << ember_last_error();
    });
  }
  for (int i = 0; i < kTokenizers; ++i) {
    threads.emplace_back([&, i] {
      size_t m = 0;
      EXPECT_EQ(ember_tokenize(model, text, 1, 0, tokenized[i].data(), 32, &m), EMBER_OK);
      tokenized[i].resize(m);
    });
  }
  for (auto& t : threads) t.join();
  expect_same(streamed, reference, 0);
  for (int i = 0; i < kTokenizers; ++i) EXPECT_EQ(tokenized[i], std::vector<int32_t>(ids, ids + n));
  for (int i = 0; i < kScorers; ++i) {
    for (size_t k = 0; k + 1 < n; ++k) EXPECT_FLOAT_EQ(scores[i][k], solo[k]) << "position " << k;
  }
}
