// Speculative decoding through the C ABI (1.2): the stream parameters and
// their defaults, a caller built against the 1.1 header, the stream stats,
// greedy output identical with each drafter, errors, cancellation, and a
// draft model handle released while its stream runs.
#include <atomic>
#include <cstddef>
#include <initializer_list>
#include <thread>

#include "capi/capi_test_util.h"

namespace {

using namespace capi_test;

bool reduced() { return reduced_size(); }

ember_stream_stats_t stats_of(const ember_stream* s) {
  ember_stream_stats_t st;
  std::memset(&st, 0, sizeof st);
  st.size = sizeof st;
  EXPECT_EQ(ember_stream_stats(s, &st), EMBER_OK) << ember_last_error();
  return st;
}

const char* kCounting = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,";

TEST(CapiSpeculative, DefaultsAndA11Caller) {
  ember_stream_params p;
  ember_stream_params_init(&p);
  EXPECT_EQ(p.spec_drafter, EMBER_SPEC_NONE);
  EXPECT_EQ(p.spec_draft_model, nullptr);
  EXPECT_EQ(p.spec_self_layers, 0);
  EXPECT_FLOAT_EQ(p.spec_threshold, 0.3f);
  EXPECT_EQ(p.spec_max_nodes, 12);
  EXPECT_EQ(p.spec_max_depth, 8);
  EXPECT_FLOAT_EQ(p.spec_alpha, 0.25f);
  EXPECT_EQ(p.spec_lookup, 1);
  EXPECT_GE(ember_version_number(), 10200);  // (1.2 brought speculation)

  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  // A program built against 1.1 passes a struct that ends at ignore_eos: the
  // bytes after it (garbage here) are never read, so it does not speculate.
  const size_t v11 = offsetof(ember_stream_params, spec_drafter);
  ember_stream_params old = greedy_params(8);
  std::memset(reinterpret_cast<unsigned char*>(&old) + v11, 0xA5, sizeof old - v11);
  old.size = v11;
  SessionPtr a = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(a.get(), kCounting, 0));
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(a.get(), &old, &s));
  StreamPtr stream(s);
  const Collected c = drain(s);
  EXPECT_EQ(c.tokens.size(), 8u);
  EXPECT_EQ(stats_of(s).verify_passes, 0u);
  // A 1.1 stats struct gets exactly its bytes.
  struct {
    ember_stream_stats_t stats;
    unsigned char guard[64];
  } small;
  std::memset(&small, 0x5A, sizeof small);
  const size_t stats_v11 = offsetof(ember_stream_stats_t, drafted_tokens);
  small.stats.size = stats_v11;
  ASSERT_OK(ember_stream_stats(s, &small.stats));
  const auto* bytes = reinterpret_cast<const unsigned char*>(&small);
  for (size_t i = stats_v11; i < sizeof small; ++i) ASSERT_EQ(bytes[i], 0x5A) << "byte " << i << " written";
}

TEST(CapiSpeculative, EveryDrafterGivesThePlainGreedyOutputAndReportsIt) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model, kTestKvBytes, 2);
  const int32_t n = reduced() ? 12 : 32;
  SessionPtr plain_s = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(plain_s.get(), kCounting, 0));
  const Collected plain = run(plain_s.get(), greedy_params(n));
  ember_model* draft = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), nullptr, &draft));
  // (the model drafters with the lookup beside them, then alone)
  for (int32_t kind : std::initializer_list<int32_t>{EMBER_SPEC_NGRAM, EMBER_SPEC_SELF, -EMBER_SPEC_SELF,
                                                     -EMBER_SPEC_DRAFT, EMBER_SPEC_DRAFT}) {
    SessionPtr s = make_session(engine.get());
    ASSERT_OK(ember_session_add_text(s.get(), kCounting, 0));
    ember_stream_params p = greedy_params(n);
    p.spec_lookup = kind > 0 ? 1 : 0;
    kind = kind > 0 ? kind : -kind;
    p.spec_drafter = kind;
    p.spec_self_layers = 20;
    p.spec_draft_model = kind == EMBER_SPEC_DRAFT ? draft : nullptr;
    ember_stream* st = nullptr;
    ASSERT_OK(ember_stream_start(s.get(), &p, &st));
    StreamPtr stream(st);
    if (kind == EMBER_SPEC_DRAFT && p.spec_lookup) {
      // The stream keeps its draft model loaded: the handle may go at once.
      ember_model_destroy(draft);
      draft = nullptr;
    }
    const Collected c = drain(st);
    EXPECT_EQ(c.tokens, plain.tokens) << "drafter " << kind;
    EXPECT_EQ(c.text, plain.text) << "drafter " << kind;
    const ember_stream_stats_t stats = stats_of(st);
    EXPECT_EQ(stats.generated_tokens, static_cast<size_t>(n));
    EXPECT_LE(stats.accepted_tokens, stats.drafted_tokens);
    if (p.spec_lookup || kind == EMBER_SPEC_NGRAM) {
      // Prompt lookup on a counting sequence: the separators it has seen.
      EXPECT_GT(stats.verify_passes, 0u) << "drafter " << kind;
      EXPECT_GT(stats.drafted_tokens, 0u) << "drafter " << kind;
      EXPECT_GT(stats.accepted_tokens, 0u) << "drafter " << kind;
      EXPECT_DOUBLE_EQ(stats.mean_accepted_length,
                       static_cast<double>(stats.accepted_tokens) / static_cast<double>(stats.verify_passes));
    } else if (kind == EMBER_SPEC_DRAFT) {
      // Alone, a draft as costly as the model itself is never run (a drafted
      // token would cost more than the decode step it could save).
      EXPECT_EQ(stats.drafted_tokens, 0u);
    }
  }
}

TEST(CapiSpeculative, BadParametersAreRefused) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr s = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(s.get(), "Hello", 0));
  auto start = [&](const ember_stream_params& p) {
    ember_stream* st = nullptr;
    const ember_status r = ember_stream_start(s.get(), &p, &st);
    ember_stream_destroy(st);
    return r;
  };
  ember_stream_params p = greedy_params(4);
  p.spec_drafter = 99;
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  p.spec_drafter = EMBER_SPEC_DRAFT;  // no draft model
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  p.spec_drafter = EMBER_SPEC_NGRAM;
  p.spec_max_nodes = 0;
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  p.spec_max_nodes = 65;
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  p.spec_max_nodes = 8;
  p.spec_max_depth = -1;
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  p.spec_max_depth = 8;
  p.spec_threshold = 0.0f / 0.0f;  // NaN
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  p.spec_threshold = 0.3f;
  p.spec_alpha = 2.0f;
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  p.spec_alpha = 0.25f;
  p.spec_lookup = 2;
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  p.spec_lookup = 1;
  p.spec_drafter = EMBER_SPEC_SELF;
  p.spec_self_layers = 1000;  // more than the model has
  EXPECT_STATUS(start(p), EMBER_ERR_INVALID_ARGUMENT);
  // Nothing above left the session busy.
  p.spec_self_layers = 0;
  EXPECT_STATUS(start(p), EMBER_OK);
}

TEST(CapiSpeculative, CancelFromAnotherThread) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr s = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(s.get(), kCounting, 0));
  const size_t prompt = token_count(s.get());
  ember_stream_params p = greedy_params(2000);
  p.ignore_eos = 1;
  p.spec_drafter = EMBER_SPEC_NGRAM;
  ember_stream* st = nullptr;
  ASSERT_OK(ember_stream_start(s.get(), &p, &st));
  StreamPtr stream(st);
  ember_event ev = new_event();
  ASSERT_OK(ember_stream_next(st, &ev, -1));  // it runs
  const size_t first = ev.n_tokens;
  std::thread canceller([&] { EXPECT_EQ(ember_stream_cancel(st), EMBER_OK); });
  canceller.join();
  const Collected c = drain(st);
  EXPECT_EQ(c.end_reason, EMBER_END_CANCELLED);
  stream.reset();
  // The session's history holds exactly what was emitted (accepted tokens
  // beyond a cancel never linger), and it is usable.
  const size_t before = token_count(s.get());
  EXPECT_EQ(before, prompt + first + c.tokens.size());
  const Collected next = run(s.get(), greedy_params(3));
  EXPECT_EQ(next.tokens.size(), 3u);
  EXPECT_EQ(token_count(s.get()), before + 3);
}

}  // namespace
