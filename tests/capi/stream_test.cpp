// Sessions and streams from one thread: calls in the wrong order, handles
// destroyed in the "wrong" order, context limits, stop strings, callbacks,
// UTF-8 of streamed pieces and chat continuation.
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

// A stream that will not end on its own for a long time.
ember_stream_params endless_params() {
  ember_stream_params p = greedy_params(1 << 20);
  p.ignore_eos = 1;
  return p;
}

ember_stream_stats_t stream_stats(const ember_stream* s) {
  ember_stream_stats_t st;
  std::memset(&st, 0, sizeof st);
  st.size = sizeof st;
  EXPECT_EQ(ember_stream_stats(s, &st), EMBER_OK) << ember_last_error();
  return st;
}

std::string detokenize(ember_model* model, const std::vector<int32_t>& ids) {
  size_t len = 0;
  ember_detokenize(model, ids.data(), ids.size(), nullptr, 0, &len);
  std::string out(len + 1, '\0');
  EXPECT_EQ(ember_detokenize(model, ids.data(), ids.size(), out.data(), out.size(), &len), EMBER_OK);
  out.resize(len);
  return out;
}

}  // namespace

TEST(CapiStream, WrongOrderCalls) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Tell me a long story about a dragon."));

  ember_stream_params p = endless_params();
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &s));
  StreamPtr stream(s);

  // While it runs the session refuses everything that would change it.
  ember_stream* second = nullptr;
  EXPECT_STATUS(ember_stream_start(session.get(), &p, &second), EMBER_ERR_BUSY);
  EXPECT_EQ(second, nullptr);
  EXPECT_STATUS(ember_session_add_message(session.get(), "user", "more"), EMBER_ERR_BUSY);
  EXPECT_STATUS(ember_session_reset(session.get()), EMBER_ERR_BUSY);
  size_t n = 0;
  EXPECT_STATUS(ember_session_token_count(session.get(), &n), EMBER_OK);  // reading is fine

  ember_event ev = new_event();
  ASSERT_OK(ember_stream_next(s, &ev, -1));
  EXPECT_EQ(ev.type, EMBER_EVENT_TEXT);
  ASSERT_OK(ember_stream_cancel(s));
  ASSERT_OK(ember_stream_cancel(s));  // twice is fine
  const Collected rest = drain(s);
  EXPECT_EQ(rest.end_reason, EMBER_END_CANCELLED);

  // After END: END_OF_STREAM, again and again; cancel and wait are no-ops.
  for (int i = 0; i < 3; ++i) {
    ev = new_event();
    EXPECT_STATUS(ember_stream_next(s, &ev, 0), EMBER_ERR_END_OF_STREAM);
    EXPECT_STATUS(ember_stream_next(s, &ev, -1), EMBER_ERR_END_OF_STREAM);
  }
  EXPECT_STATUS(ember_stream_cancel(s), EMBER_OK);
  EXPECT_STATUS(ember_stream_wait(s), EMBER_OK);
  EXPECT_STATUS(ember_stream_set_callback(
                    s, [](const ember_event*, void*) -> int32_t { return 0; }, nullptr),
                EMBER_ERR_END_OF_STREAM);
  const ember_stream_stats_t st = stream_stats(s);
  EXPECT_EQ(st.finished, 1);
  EXPECT_EQ(st.end_reason, EMBER_END_CANCELLED);

  // The session is idle again, in chat mode: raw text and tokens are refused,
  // messages continue the conversation.
  EXPECT_STATUS(ember_session_add_text(session.get(), "raw", 0), EMBER_ERR_INVALID_ARGUMENT);
  int32_t tok = 42;
  EXPECT_STATUS(ember_session_add_tokens(session.get(), &tok, 1), EMBER_ERR_INVALID_ARGUMENT);
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Shorter, please."));
  EXPECT_TRUE(run(session.get(), greedy_params(3)).ended);

  // Reset brings it back to empty; then raw text is fine, and messages are not.
  ASSERT_OK(ember_session_reset(session.get()));
  EXPECT_EQ(token_count(session.get()), 0u);
  ASSERT_OK(ember_session_add_text(session.get(), "Once upon a time", 0));
  EXPECT_STATUS(ember_session_add_message(session.get(), "user", "hi"), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(run(session.get(), greedy_params(3)).ended);
}

TEST(CapiStream, PollAndTimeout) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(session.get(), "The sky is", 0));
  ember_stream_params p = greedy_params(4);
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &s));
  StreamPtr stream(s);
  // Poll until the end: TIMEOUT (with a message) or an event, nothing else.
  int events = 0, timeouts = 0;
  for (;;) {
    ember_event ev = new_event();
    const ember_status st = ember_stream_next(s, &ev, 0);
    if (st == EMBER_ERR_TIMEOUT) {
      EXPECT_STRNE(ember_last_error(), "");
      ++timeouts;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    ASSERT_OK(st);
    ++events;
    if (ev.type != EMBER_EVENT_TEXT) {
      EXPECT_EQ(ev.end_reason, EMBER_END_MAX_TOKENS);
      break;
    }
  }
  EXPECT_GE(events, 2);
  ember_event ev = new_event();
  EXPECT_STATUS(ember_stream_next(s, &ev, 10), EMBER_ERR_END_OF_STREAM);
}

TEST(CapiStream, EndReasonsAndStats) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(session.get(), "One, two, three, four,", 0));
  const size_t prompt = token_count(session.get());
  ember_stream_params p = greedy_params(6);
  p.ignore_eos = 1;
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &s));
  StreamPtr stream(s);
  const Collected c = drain(s);
  EXPECT_EQ(c.end_reason, EMBER_END_MAX_TOKENS);
  EXPECT_EQ(c.tokens.size(), 6u);
  EXPECT_EQ(c.text, detokenize(model, c.tokens));
  const ember_stream_stats_t st = stream_stats(s);
  EXPECT_EQ(st.finished, 1);
  EXPECT_EQ(st.prompt_tokens, prompt);
  EXPECT_EQ(st.generated_tokens, 6u);
  EXPECT_EQ(st.end_reason, EMBER_END_MAX_TOKENS);
  EXPECT_GT(st.time_to_first_token_ms, 0.0);
  EXPECT_EQ(token_count(session.get()), prompt + 6);

  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  ASSERT_OK(ember_cache_stats(ember_engine_cache(engine.get()), &cs));
  EXPECT_EQ(cs.blocks_used + cs.blocks_cached + cs.blocks_free, cs.blocks_total);
  // An idle session pins nothing; its full blocks stay cached for the next turn.
  EXPECT_GE((cs.blocks_used + cs.blocks_cached) * static_cast<size_t>(cs.block_size) + cs.block_size, prompt + 6);
  ember_scheduler_stats_t ss;
  std::memset(&ss, 0, sizeof ss);
  ss.size = sizeof ss;
  ASSERT_OK(ember_scheduler_stats(ember_engine_scheduler(engine.get()), &ss));
  // One step per token; the step that delivered END may not be counted yet.
  EXPECT_GE(ss.steps, 5u);
}

// "same seed + same input = same text" (ember_stream_params.seed), also when
// the engine already holds the prompt's prefix in its cache from an earlier
// request.
TEST(CapiStream, SameRequestSameOutput) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  std::string base;
  for (int i = 0; i < 6; ++i) base += "The history of the Roman Empire is long and complicated. ";
  size_t n = 0;
  std::vector<int32_t> ids(256);
  ASSERT_OK(ember_tokenize(model, base.c_str(), 0, 0, ids.data(), ids.size(), &n));
  ASSERT_GE(n, 40u);
  // Lengths just over and under a multiple of the KV block size (16).
  for (size_t len : {33u, 40u}) {
    for (int sampled = 0; sampled < 2; ++sampled) {
      SCOPED_TRACE("prompt of " + std::to_string(len) + (sampled ? " tokens, sampled" : " tokens, greedy"));
      ember_stream_params p = sampled ? sampled_params(12, 7) : greedy_params(12);
      p.ignore_eos = 1;
      std::vector<int32_t> first;
      for (int i = 0; i < 2; ++i) {
        SessionPtr session = make_session(engine.get());
        ASSERT_OK(ember_session_add_tokens(session.get(), ids.data(), len));
        const Collected c = run(session.get(), p);
        if (i == 0) {
          first = c.tokens;
        } else {
          EXPECT_EQ(c.tokens, first);
        }
      }
    }
  }
  std::vector<int32_t> first_chat;
  for (int i = 0; i < 2; ++i) {
    SessionPtr session = make_session(engine.get());
    ASSERT_OK(ember_session_add_message(session.get(), "user", "What is the capital of Italy?"));
    const Collected c = run(session.get(), greedy_params(8));
    if (i == 0) {
      first_chat = c.tokens;
    } else {
      EXPECT_EQ(c.tokens, first_chat) << "chat prompt";
    }
  }
}

TEST(CapiStream, StopStrings) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr a = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(a.get(), "The days of the week are Monday, Tuesday,", 0));
  ember_stream_params p = greedy_params(12);
  p.ignore_eos = 1;
  const Collected plain = run(a.get(), p);
  ASSERT_GT(plain.text.size(), 8u);
  // Stop on a piece of the middle of the greedy text: the output is the text
  // before it, and the stop string itself is not emitted.
  const std::string stop = plain.text.substr(plain.text.size() / 2, 3);
  const size_t at = plain.text.find(stop);
  SessionPtr b = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(b.get(), "The days of the week are Monday, Tuesday,", 0));
  const char* stops[] = {"never appears \xF0\x9F\x98\x80", stop.c_str(), nullptr};
  p.stop = stops;
  const Collected cut = run(b.get(), p);
  EXPECT_EQ(cut.end_reason, EMBER_END_STOP_STRING) << "stop '" << stop << "' in '" << plain.text << "'";
  EXPECT_EQ(cut.text, plain.text.substr(0, at));
}

TEST(CapiStream, PromptOverTheContextIsContextFull) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "word" + std::to_string(i) + " ";

  // Chat: the rendered prompt does not fit a 24-token session.
  SessionPtr chat = make_session(engine.get(), 24);
  ASSERT_TRUE(chat);
  const ember_status added = ember_session_add_message(chat.get(), "user", long_text.c_str());
  ember_stream* s = nullptr;
  ember_stream_params p = greedy_params(4);
  if (added == EMBER_OK) {
    EXPECT_STATUS(ember_stream_start(chat.get(), &p, &s), EMBER_ERR_CONTEXT_FULL);
  } else {
    EXPECT_STATUS(added, EMBER_ERR_CONTEXT_FULL);
  }
  EXPECT_EQ(s, nullptr);
  // Still usable: reset, then something that fits.
  ASSERT_OK(ember_session_reset(chat.get()));
  ASSERT_OK(ember_session_add_text(chat.get(), "Hi", 0));
  EXPECT_TRUE(run(chat.get(), greedy_params(2)).ended);

  // Raw text: refused when added, nothing kept.
  SessionPtr text = make_session(engine.get(), 24);
  EXPECT_STATUS(ember_session_add_text(text.get(), long_text.c_str(), 0), EMBER_ERR_CONTEXT_FULL);
  EXPECT_EQ(token_count(text.get()), 0u);
  std::vector<int32_t> ids(30, 42);
  EXPECT_STATUS(ember_session_add_tokens(text.get(), ids.data(), ids.size()), EMBER_ERR_CONTEXT_FULL);
  EXPECT_EQ(token_count(text.get()), 0u);

  // Generation that reaches the context ends with END_CONTEXT_FULL; a
  // further start is CONTEXT_FULL.
  ASSERT_OK(ember_session_add_tokens(text.get(), ids.data(), 20));
  ember_stream_params q = greedy_params(100);
  q.ignore_eos = 1;
  const Collected c = run(text.get(), q);
  EXPECT_EQ(c.end_reason, EMBER_END_CONTEXT_FULL);
  EXPECT_EQ(c.tokens.size(), 4u);
  EXPECT_EQ(token_count(text.get()), 24u);
  EXPECT_STATUS(ember_stream_start(text.get(), &q, &s), EMBER_ERR_CONTEXT_FULL);
  EXPECT_STATUS(ember_session_add_tokens(text.get(), ids.data(), 1), EMBER_ERR_CONTEXT_FULL);
}

TEST(CapiStream, PromptOverTheKvPoolIsOutOfMemory) {
  CAPI_REQUIRE_MODEL(model);
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  uint64_t bytes_per_block = 0;
  {
    EnginePtr probe = make_engine(model);
    ASSERT_OK(ember_cache_stats(ember_engine_cache(probe.get()), &cs));
    bytes_per_block = cs.bytes_per_block;
  }
  EnginePtr engine = make_engine(model, 4 * bytes_per_block);  // 64 tokens
  SessionPtr session = make_session(engine.get());
  std::vector<int32_t> ids(100, 42);
  ASSERT_OK(ember_session_add_tokens(session.get(), ids.data(), ids.size()));
  ember_stream_params p = greedy_params(2);
  ember_stream* s = nullptr;
  EXPECT_STATUS(ember_stream_start(session.get(), &p, &s), EMBER_ERR_OUT_OF_MEMORY);
  ASSERT_OK(ember_session_reset(session.get()));
  ASSERT_OK(ember_session_add_tokens(session.get(), ids.data(), 10));
  EXPECT_EQ(run(session.get(), p).tokens.size(), 2u);
}

// Model, then engine, then session, then stream: each keeps what it needs
// alive, and everything works until the last handle is gone.
TEST(CapiLifetime, DestroyInTheWrongOrder) {
  EMBER_REQUIRE_MODEL();
  ember_model* model = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), nullptr, &model));
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.kv_memory_bytes = kTestKvBytes;
  ep.n_threads = 1;
  ember_engine* engine = nullptr;
  ASSERT_OK(ember_engine_create(model, &ep, &engine));
  ember_session* session = nullptr;
  ASSERT_OK(ember_session_create(engine, nullptr, &session));
  ember_session* second = nullptr;
  ASSERT_OK(ember_session_create(engine, nullptr, &second));
  ASSERT_OK(ember_session_add_message(session, "user", "Write a poem about the sea."));
  ASSERT_OK(ember_session_add_message(second, "user", "Write a poem about the sea."));
  ember_stream_params p = greedy_params(6);
  const Collected reference = run(second, p);

  ember_stream* stream = nullptr;
  ASSERT_OK(ember_stream_start(session, &p, &stream));
  ember_model_destroy(model);
  ember_engine_destroy(engine);
  // The second session still runs on the engine whose handle is gone.
  ASSERT_OK(ember_session_add_message(second, "user", "Again."));
  EXPECT_TRUE(run(second, greedy_params(2)).ended);
  ember_session_destroy(second);
  // Destroying the session cancels its stream, which stays readable.
  ember_session_destroy(session);
  const Collected c = drain(stream);
  EXPECT_TRUE(c.ended);
  EXPECT_EQ(c.error, EMBER_OK);
  // What it produced before the cancel is a prefix of the full answer.
  ASSERT_LE(c.tokens.size(), reference.tokens.size());
  EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), reference.tokens.begin()));
  const ember_stream_stats_t st = stream_stats(stream);
  EXPECT_EQ(st.finished, 1);
  ember_stream_destroy(stream);
}

TEST(CapiLifetime, StreamOutlivesEverythingWhileRunning) {
  EMBER_REQUIRE_MODEL();
  ember_model* model = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), nullptr, &model));
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(session.get(), "Lorem ipsum", 0));
  ember_stream_params p = greedy_params(5);
  p.ignore_eos = 1;
  ember_stream* stream = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &stream));
  // Everything but the stream goes before it produced anything...
  ember_model_destroy(model);
  engine.reset();
  // ... but the session is not destroyed, so the stream runs to its end.
  const Collected c = drain(stream);
  EXPECT_EQ(c.end_reason, EMBER_END_MAX_TOKENS);
  EXPECT_EQ(c.tokens.size(), 5u);
  session.reset();
  ember_stream_destroy(stream);
}

#if defined(__linux__)
namespace {
size_t thread_count() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}
}  // namespace

// The stream handle is the last one, destroyed right after END: whoever
// drops the last internal reference (this thread or the engine's worker)
// must tear the engine down, so its worker thread (and KV pool) goes away.
TEST(CapiLifetime, NothingLeaksWhenTheStreamIsTheLastHandle) {
  CAPI_REQUIRE_MODEL(model);
  // ThreadSanitizer starts a background thread of its own when the process
  // creates its first thread; create (and join) one before counting, so the
  // baseline includes it when this test runs alone under TSan.
  std::thread([] {}).join();
  const size_t baseline = thread_count();
  for (int i = 0; i < 20; ++i) {
    EnginePtr engine = make_engine(model, 4u << 20);
    ember_session* session = nullptr;
    ASSERT_OK(ember_session_create(engine.get(), nullptr, &session));
    const int32_t tokens[4] = {1, 2, 3, 4};
    ASSERT_OK(ember_session_add_tokens(session, tokens, 4));
    ember_stream_params p = greedy_params(1);
    p.ignore_eos = 1;
    ember_stream* stream = nullptr;
    ASSERT_OK(ember_stream_start(session, &p, &stream));
    engine.reset();
    ember_session_destroy(session);
    EXPECT_TRUE(drain(stream).ended);
    ember_stream_destroy(stream);
  }
  // A worker that tore its engine down itself exits asynchronously.
  for (int wait = 0; wait < 200 && thread_count() > baseline; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(thread_count(), baseline) << "engine worker threads were left behind (deadlocked or leaked)";
}
#endif

TEST(CapiLifetime, DestroyRunningStreamThenReuseSession) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Tell me a story."));
  for (int i = 0; i < 3; ++i) {
    ember_stream_params p = endless_params();
    ember_stream* s = nullptr;
    ASSERT_OK(ember_stream_start(session.get(), &p, &s));
    if (i == 1) {
      ember_event ev = new_event();
      ASSERT_OK(ember_stream_next(s, &ev, -1));
    }
    ember_stream_destroy(s);  // running: cancelled, waited for, released
    const size_t n = token_count(session.get());
    EXPECT_GT(n, 0u);
    ASSERT_OK(ember_session_add_message(session.get(), "user", "Go on."));
  }
  // Default params (NULL) start fine and are destroyed while running too.
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), nullptr, &s));
  ember_stream_destroy(s);
  ASSERT_OK(ember_session_add_message(session.get(), "user", "The end."));
  EXPECT_TRUE(run(session.get(), greedy_params(2)).ended);
}

namespace {

struct CallbackLog {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::string> pieces;
  std::vector<int32_t> tokens;
  int ends = 0, errors = 0, after_end = 0;
  int32_t end_reason = EMBER_END_NONE;
  int cancel_after = -1;  // return nonzero after this many TEXT events
  int delay_end_ms = 0;   // sleep in the END callback (checks destroy waits for it)
  bool all_valid_utf8 = true;
};

int32_t record(const ember_event* ev, void* user) {
  auto* log = static_cast<CallbackLog*>(user);
  if (ev->type != EMBER_EVENT_TEXT && log->delay_end_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(log->delay_end_ms));
  }
  std::lock_guard<std::mutex> lock(log->mutex);
  if (log->ends + log->errors > 0) ++log->after_end;
  if (ev->type == EMBER_EVENT_TEXT) {
    std::string piece(ev->text, ev->text_length);
    log->all_valid_utf8 = log->all_valid_utf8 && valid_utf8(piece);
    log->pieces.push_back(piece);
    log->tokens.insert(log->tokens.end(), ev->tokens, ev->tokens + ev->n_tokens);
  } else if (ev->type == EMBER_EVENT_END) {
    ++log->ends;
    log->end_reason = ev->end_reason;
  } else {
    ++log->errors;
  }
  log->cv.notify_all();
  return log->cancel_after >= 0 && static_cast<int>(log->pieces.size()) >= log->cancel_after ? 1 : 0;
}

}  // namespace

TEST(CapiCallback, DeliversEveryEventIncludingEnd) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  EnginePtr reference_engine = make_engine(model);  // same state as `engine`: nothing cached
  SessionPtr pull = make_session(reference_engine.get());
  SessionPtr push = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(pull.get(), "user", "List three fruits."));
  ASSERT_OK(ember_session_add_message(push.get(), "user", "List three fruits."));
  ember_stream_params p = greedy_params(8);
  const Collected reference = run(pull.get(), p);

  CallbackLog log;
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(push.get(), &p, &s));
  StreamPtr stream(s);
  ASSERT_OK(ember_stream_set_callback(s, record, &log));
  EXPECT_STATUS(ember_stream_set_callback(s, record, &log), EMBER_ERR_BUSY);
  ember_event ev = new_event();
  EXPECT_STATUS(ember_stream_next(s, &ev, 0), EMBER_ERR_BUSY);
  {
    std::unique_lock<std::mutex> lock(log.mutex);
    ASSERT_TRUE(log.cv.wait_for(lock, std::chrono::seconds(60), [&] { return log.ends + log.errors > 0; }));
  }
  ASSERT_OK(ember_stream_wait(s));
  EXPECT_EQ(log.ends, 1);
  EXPECT_EQ(log.errors, 0);
  EXPECT_EQ(log.after_end, 0);
  EXPECT_EQ(log.end_reason, reference.end_reason);
  EXPECT_EQ(log.tokens, reference.tokens);
  EXPECT_EQ(log.pieces, reference.pieces);
  EXPECT_TRUE(log.all_valid_utf8);
}

TEST(CapiCallback, NonzeroReturnCancels) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Tell me a long story."));
  CallbackLog log;
  log.cancel_after = 2;
  ember_stream_params p = endless_params();
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &s));
  StreamPtr stream(s);
  ASSERT_OK(ember_stream_set_callback(s, record, &log));
  ASSERT_OK(ember_stream_wait(s));
  stream.reset();  // returns only once the END callback has run
  EXPECT_EQ(log.ends, 1);
  EXPECT_EQ(log.end_reason, EMBER_END_CANCELLED);
  EXPECT_GE(log.pieces.size(), 2u);
  EXPECT_LE(log.pieces.size(), 4u) << "cancellation took effect late";
  // The session is idle and continues.
  ASSERT_OK(ember_session_add_message(session.get(), "user", "Thanks."));
  EXPECT_TRUE(run(session.get(), greedy_params(2)).ended);
}

TEST(CapiCallback, DestroyWaitsForTheEndCallback) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(session.get(), "Hello", 0));
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "wait" : "destroy");
    auto log = std::make_unique<CallbackLog>();
    log->delay_end_ms = 100;
    ember_stream_params p = greedy_params(variant == 0 ? 2 : 1 << 20);
    p.ignore_eos = 1;
    ember_stream* s = nullptr;
    ASSERT_OK(ember_stream_start(session.get(), &p, &s));
    ASSERT_OK(ember_stream_set_callback(s, record, log.get()));
    if (variant == 0) ASSERT_OK(ember_stream_wait(s));
    ember_stream_destroy(s);
    // No callback may run after destroy returned: the END one has been
    // delivered (and the log may now be freed).
    EXPECT_EQ(log->ends, 1);
    log.reset();
  }
}

TEST(CapiCallback, SetAfterTheStreamFinished) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get());
  ASSERT_OK(ember_session_add_text(session.get(), "Hello", 0));
  ember_stream_params p = greedy_params(3);
  p.ignore_eos = 1;
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &s));
  StreamPtr stream(s);
  ASSERT_OK(ember_stream_wait(s));
  CallbackLog log;
  ASSERT_OK(ember_stream_set_callback(s, record, &log));  // queued events are delivered
  stream.reset();
  EXPECT_EQ(log.ends, 1);
  EXPECT_EQ(log.tokens.size(), 3u);
}

// Every TEXT piece is whole UTF-8, also when the model writes emoji and CJK
// (greedy, continuing a list of emoji) and when it samples wildly at a high
// temperature, where byte-level tokens split characters all the time.
TEST(CapiUtf8, StreamedPiecesAreValidUtf8) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  {
    // A completion prompt the model continues in 4-byte emoji (greedy; a
    // chat request to repeat them depends too much on the model's whims).
    SessionPtr session = make_session(engine.get());
    ASSERT_OK(ember_session_add_text(session.get(), "Emoji list: 😀 😁 😂 🤣 😃 😄 😅", 0));
    const Collected c = run(session.get(), greedy_params(16));
    EXPECT_TRUE(c.ended);
    for (const auto& piece : c.pieces) EXPECT_TRUE(valid_utf8(piece)) << ::testing::PrintToString(piece);
    EXPECT_EQ(c.text, detokenize(model, c.tokens));
    bool non_ascii = false;
    for (unsigned char ch : c.text) non_ascii = non_ascii || ch >= 0x80;
    EXPECT_TRUE(non_ascii) << "the reply has no multi-byte character: " << c.text;
  }
  int split_characters = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    SessionPtr session = make_session(engine.get());
    ASSERT_OK(ember_session_add_message(session.get(), "user", "请用中文写一首关于月亮的诗，加上表情符号 🌙✨"));
    ember_stream_params p = sampled_params(32, seed);
    p.temperature = 2.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.ignore_eos = 1;
    const Collected c = run(session.get(), p);
    EXPECT_EQ(c.tokens.size(), 32u);
    for (const auto& piece : c.pieces) EXPECT_TRUE(valid_utf8(piece)) << ::testing::PrintToString(piece);
    EXPECT_EQ(c.text, detokenize(model, c.tokens));
    // Count tokens whose own bytes are not whole UTF-8: those are the ones
    // the stream had to hold back.
    for (int32_t t : c.tokens) {
      size_t len = 0;
      char buf[64];
      if (ember_detokenize(model, &t, 1, buf, sizeof buf, &len) == EMBER_OK &&
          std::string(buf, len).find("\xEF\xBF\xBD") != std::string::npos) {
        ++split_characters;
      }
    }
  }
  std::printf("[ info ] %d sampled tokens carried part of a character\n", split_characters);
}

TEST(CapiChat, ContinuationKeepsThePrefix) {
  CAPI_REQUIRE_MODEL(model);
  EnginePtr engine = make_engine(model);
  SessionPtr session = make_session(engine.get(), 0, "You are a terse assistant.");
  ASSERT_OK(ember_session_add_message(session.get(), "user", "What is the capital of France?"));
  const Collected first = run(session.get(), greedy_params(8));
  ASSERT_TRUE(first.ended);
  const size_t after_first = token_count(session.get());

  ASSERT_OK(ember_session_add_message(session.get(), "user", "And of Germany?"));
  ember_stream_params p = greedy_params(8);
  ember_stream* s = nullptr;
  ASSERT_OK(ember_stream_start(session.get(), &p, &s));
  StreamPtr stream(s);
  const Collected second = drain(s);
  ASSERT_TRUE(second.ended);
  const ember_stream_stats_t st = stream_stats(s);
  const size_t after_second = token_count(session.get());
  EXPECT_GT(after_second, after_first + second.tokens.size());
  // Only the new turn was prefilled: the conversation so far came from the cache.
  EXPECT_LT(st.prompt_tokens, after_second - after_first + 8) << "prompt " << st.prompt_tokens;
  EXPECT_GT(st.prompt_tokens, 0u);

  // The same conversation from scratch: its reply
  // can differ from the continued one where the model nearly ties: there the
  // first reply's tokens are prompt rows, computed in llama.cpp's batched
  // order, not as the decodes they were (AttentionParams::decode_rows). Two
  // fresh sessions agree exactly.
  auto fresh_reply = [&]() {
    SessionPtr fresh = make_session(engine.get(), 0, "You are a terse assistant.");
    EXPECT_EQ(ember_session_add_message(fresh.get(), "user", "What is the capital of France?"), EMBER_OK);
    EXPECT_EQ(ember_session_add_message(fresh.get(), "assistant", first.text.c_str()), EMBER_OK);
    EXPECT_EQ(ember_session_add_message(fresh.get(), "user", "And of Germany?"), EMBER_OK);
    const Collected c = run(fresh.get(), greedy_params(8));
    return c.text;
  };
  const std::string a = fresh_reply(), b = fresh_reply();
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a.empty());
  std::printf("[ info ] continued reply %s; from scratch %s\n", ::testing::PrintToString(second.text).c_str(),
              ::testing::PrintToString(a).c_str());
}
