// Manual mode keeps a game's frame budget: ember_engine_step(engine, max_ms)
// returns within about max_ms plus one decode step, also while a long prompt
// waits to be prefilled (it is cut into what fits each frame).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

// Sanitizer builds are many times slower and their timing is not the
// product's: they check the frame loop's correctness only.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(EMBER_TEST_TSAN)
constexpr bool kTimed = false;
#else
constexpr bool kTimed = true;
#endif

// EMBER_TEST_REDUCED=1 or a sanitizer build: 3 turns and a short prompt.
bool reduced() { return !kTimed || reduced_size(); }
int turns() { return reduced() ? 3 : 30; }

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

}  // namespace

TEST(CapiFrameBudget, ManualStepsKeepTheFrameBudgetWithALongPromptWaiting) {
  CAPI_REQUIRE_MODEL(model);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.kv_memory_bytes = kTestKvBytes;
  ep.n_threads = 1;
  ep.manual_step = 1;
  ember_engine* e = nullptr;
  ASSERT_OK(ember_engine_create(model, &ep, &e));
  EnginePtr engine(e);
  constexpr int32_t kFrameMs = 16;

  // One decode step's cost on this machine now: a one-token stream.
  SessionPtr probe = make_session(e);
  ASSERT_OK(ember_session_add_text(probe.get(), "Hello", 0));
  std::vector<double> decode_ms;
  for (int i = 0; i < 5; ++i) {
    ember_stream_params p = greedy_params(1);
    ember_stream* st = nullptr;
    ASSERT_OK(ember_session_add_text(probe.get(), " and", 0));
    ASSERT_OK(ember_stream_start(probe.get(), &p, &st));
    StreamPtr stream(st);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_OK(ember_engine_step(e, 0, 1, nullptr));
    decode_ms.push_back(ms_since(t0));
    ASSERT_OK(ember_stream_wait(st));
  }
  const double decode_step = percentile(decode_ms, 0.5);

  // A ~1,500-token prompt, then 30 short turns, driven by 16 ms frames.
  std::string prompt;
  while (prompt.size() < (reduced() ? 800u : 8400u))
    prompt += "The old lighthouse keeper counted the ships that passed each night. ";
  SessionPtr npc = make_session(e);
  ASSERT_OK(ember_session_add_text(npc.get(), prompt.c_str(), 0));
  size_t prompt_tokens = token_count(npc.get());
  ASSERT_GT(prompt_tokens, reduced() ? 100u : 1400u);
  std::vector<double> frames;
  size_t most_tokens_in_a_frame = 0;
  for (int turn = 0; turn < turns(); ++turn) {
    if (turn > 0) ASSERT_OK(ember_session_add_text(npc.get(), " Then", 0));
    ember_stream_params p = greedy_params(4);
    ember_stream* st = nullptr;
    ASSERT_OK(ember_stream_start(npc.get(), &p, &st));
    StreamPtr stream(st);
    bool ended = false;
    for (int frame = 0; frame < 20000 && !ended; ++frame) {
      const auto t0 = std::chrono::steady_clock::now();
      size_t processed = 0;
      ASSERT_OK(ember_engine_step(e, kFrameMs, 0, &processed));
      frames.push_back(ms_since(t0));
      most_tokens_in_a_frame = std::max(most_tokens_in_a_frame, processed);
      for (;;) {
        ember_event ev = new_event();
        const ember_status s = ember_stream_next(st, &ev, 0);
        if (s == EMBER_ERR_TIMEOUT) break;
        ASSERT_OK(s);
        if (ev.type != EMBER_EVENT_TEXT) {
          ASSERT_EQ(ev.type, EMBER_EVENT_END);
          ended = true;
          break;
        }
      }
    }
    ASSERT_TRUE(ended) << "turn " << turn;
  }
  const double worst = *std::max_element(frames.begin(), frames.end());
  std::printf(
      "frame budget %d ms: %zu frames over %d turns (first prompt %zu tokens); frame p50 %.1f ms, p99 %.1f ms, "
      "worst %.1f ms; one decode step %.1f ms; at most %zu tokens in a frame\n",
      kFrameMs, frames.size(), turns(), prompt_tokens, percentile(frames, 0.5), percentile(frames, 0.99), worst,
      decode_step, most_tokens_in_a_frame);
  // The prompt is cut into what fits a frame (before frame budgets, the
  // whole prompt ran in one frame of seconds).
  EXPECT_LT(most_tokens_in_a_frame, 64u);
  if (!kTimed) return;
  // About the budget plus one decode step. The slack absorbs this machine's
  // noise (a VM on 2 cores whose step times vary 2x while ctest runs two
  // tests at once).
  EXPECT_LT(percentile(frames, 0.99), kFrameMs + 3 * decode_step + 15);
  EXPECT_LT(worst, kFrameMs + 6 * decode_step + 60);
}

namespace {

// Reads every event a stream has ready; true once it has ended.
bool poll_ended(ember_stream* st, size_t* pieces = nullptr) {
  for (;;) {
    ember_event ev = new_event();
    const ember_status s = ember_stream_next(st, &ev, 0);
    if (s == EMBER_ERR_TIMEOUT) return false;
    EXPECT_EQ(s, EMBER_OK) << ember_last_error();
    if (s != EMBER_OK) return true;
    if (ev.type != EMBER_EVENT_TEXT) {
      EXPECT_EQ(ev.type, EMBER_EVENT_END);
      return true;
    }
    if (pieces) ++*pieces;
  }
}

size_t prompt_tokens(const ember_stream* st) {
  ember_stream_stats_t s;
  s.size = sizeof s;
  EXPECT_EQ(ember_stream_stats(st, &s), EMBER_OK) << ember_last_error();
  return s.prompt_tokens;
}

}  // namespace

// A game's three NPCs: one talks (decodes) while two long prompts wait. Every
// frame stays within the budget plus one decode step of the three (before,
// a cost model fitted on steps of 1 to 4 rows sized one step at 89 rows:
// a 16 ms frame took 138 ms), and the prompts advance every frame.
TEST(CapiFrameBudget, ThreeSessionsTwoLongPromptsWaitingWhileOneDecodes) {
  CAPI_REQUIRE_MODEL(model);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.kv_memory_bytes = 160ull << 20;  // the three histories never preempt one another
  ep.n_threads = 1;
  ep.manual_step = 1;
  ember_engine* e = nullptr;
  ASSERT_OK(ember_engine_create(model, &ep, &e));
  EnginePtr engine(e);
  constexpr int32_t kFrameMs = 16;
  SessionPtr npc[3] = {make_session(e), make_session(e), make_session(e)};

  // NPC 0 talks at length; once it decodes, NPCs 1 and 2 get long prompts.
  ASSERT_OK(ember_session_add_text(npc[0].get(), "Hello. Tell me a long story about the sea.", 0));
  ember_stream_params talk = greedy_params(100000);
  talk.ignore_eos = 1;
  ember_stream* st0 = nullptr;
  ASSERT_OK(ember_stream_start(npc[0].get(), &talk, &st0));
  StreamPtr talking(st0);
  size_t pieces = 0;
  for (int frame = 0; frame < 1000 && pieces == 0; ++frame) {
    ASSERT_OK(ember_engine_step(e, kFrameMs, 0, nullptr));
    ASSERT_FALSE(poll_ended(st0, &pieces));
  }
  ASSERT_GT(pieces, 0u);
  std::string prompt[2] = {" The old lighthouse keeper counted the ships that passed each night.",
                           " A caravan of silver left the northern mines before the first snow."};
  const size_t target_chars = reduced() ? 600u : 3000u;
  StreamPtr waiting[2];
  size_t prompt_size[2];
  for (int i = 0; i < 2; ++i) {
    while (prompt[i].size() < target_chars) prompt[i] += prompt[i].substr(0, 70);
    const size_t before = token_count(npc[i + 1].get());
    ASSERT_OK(ember_session_add_text(npc[i + 1].get(), prompt[i].c_str(), 0));
    prompt_size[i] = token_count(npc[i + 1].get()) - before;
    ember_stream_params p = greedy_params(4);
    ember_stream* st = nullptr;
    ASSERT_OK(ember_stream_start(npc[i + 1].get(), &p, &st));
    waiting[i].reset(st);
  }
  ASSERT_GT(prompt_size[0] + prompt_size[1], reduced() ? 150u : 900u);

  std::vector<double> frames;
  size_t most_tokens = 0, starved = 0, prefill_frames = 0;
  bool ended[2] = {false, false};
  for (int frame = 0; frame < 20000 && !(ended[0] && ended[1]); ++frame) {
    const size_t prefilled_before = prompt_tokens(waiting[0].get()) + prompt_tokens(waiting[1].get());
    const bool prefilling =
        prompt_tokens(waiting[0].get()) < prompt_size[0] || prompt_tokens(waiting[1].get()) < prompt_size[1];
    const auto t0 = std::chrono::steady_clock::now();
    size_t processed = 0;
    ASSERT_OK(ember_engine_step(e, kFrameMs, 0, &processed));
    frames.push_back(ms_since(t0));
    most_tokens = std::max(most_tokens, processed);
    if (prefilling) {
      ++prefill_frames;
      if (prompt_tokens(waiting[0].get()) + prompt_tokens(waiting[1].get()) == prefilled_before) ++starved;
    }
    ASSERT_FALSE(poll_ended(st0)) << "the talking NPC ended";
    for (int i = 0; i < 2; ++i) ended[i] = ended[i] || poll_ended(waiting[i].get());
  }

  // One decode step of the three on this machine now (after the frames, so
  // that the frame budget starts from nothing measured, as in a game): the
  // three decoding, one token each per step (a budget of one token still
  // runs every decode).
  StreamPtr more[2];
  for (int i = 0; i < 2; ++i) {
    ember_stream_params p = greedy_params(100000);
    p.ignore_eos = 1;
    ember_stream* st = nullptr;
    ASSERT_OK(ember_stream_start(npc[i + 1].get(), &p, &st));
    more[i].reset(st);
  }
  // Each one's pending tokens first (a history's last partial KV block is
  // recomputed when a new stream starts on it): then a step runs three rows.
  size_t n = 0;
  ASSERT_OK(ember_engine_step(e, 0, 64, nullptr));
  std::vector<double> decode_ms;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_OK(ember_engine_step(e, 0, 1, &n));
    decode_ms.push_back(ms_since(t0));
    ASSERT_EQ(n, 3u);
  }
  const double decode_step = percentile(decode_ms, 0.5);
  const double decode_step_max = *std::max_element(decode_ms.begin(), decode_ms.end());
  for (ember_stream* st : {st0, more[0].get(), more[1].get()}) ASSERT_OK(ember_stream_cancel(st));
  ASSERT_OK(ember_engine_step(e, 0, 0, nullptr));
  for (ember_stream* st : {st0, more[0].get(), more[1].get()}) ASSERT_OK(ember_stream_wait(st));

  const double worst = *std::max_element(frames.begin(), frames.end());
  std::printf(
      "three sessions, frame budget %d ms: prompts of %zu and %zu tokens prefilled in %zu frames (%zu without "
      "progress) beside a decoding session; %zu frames, p50 %.1f ms, p99 %.1f ms, worst %.1f ms; one decode "
      "step of three %.1f ms; at most %zu tokens in a frame\n",
      kFrameMs, prompt_size[0], prompt_size[1], prefill_frames, starved, frames.size(), percentile(frames, 0.5),
      percentile(frames, 0.99), worst, decode_step, most_tokens);
  // Every prompt finishes, and advances in every frame until it has.
  EXPECT_TRUE(ended[0] && ended[1]);
  EXPECT_EQ(starved, 0u);
  if (!kTimed) return;
  // The budget plus one decode step; the slack (8 ms) absorbs this
  // machine's noise: 2 shared cores whose step times vary 2x while ctest
  // runs two tests at once. (The old cost model failed this test in six
  // runs of six: worst frames of 29 to 171 ms, five over this bound of
  // 37-41 ms, and frames without prompt progress in three; after the fix,
  // worst frames of 18-21 ms.) Single frames still go over when the OS
  // takes the core away (2026-11-26, ctest -j2 on a 2-core AVX2 VM: worst
  // frames of 78.5 ms with a 52 ms median step, and 55.7 with a 30 ms one,
  // each against a bound ~1 ms lower): at most 2 of the ~620 frames may pass
  // the budget plus the slowest measured decode step, and none may hold two
  // decode steps beyond the budget.
  EXPECT_LT(percentile(frames, 0.99), kFrameMs + decode_step + 5);
  const double bound = kFrameMs + decode_step_max + 8;
  const auto over = std::count_if(frames.begin(), frames.end(), [&](double f) { return f >= bound; });
  EXPECT_LE(over, 2) << "frames over " << bound << " ms";
  EXPECT_LT(worst, kFrameMs + 2 * decode_step_max + 8);
}
