// Helpers shared by the C ABI tests. These tests link only libember.so and
// include only the public headers, exactly as a host program would.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/model_path.h"
#include "ember/ember.h"

// Checks a status and, for failures, that a message was left behind.
#define EXPECT_STATUS(expr, expected)                                                                        \
  do {                                                                                                       \
    const ember_status st_ = (expr);                                                                         \
    EXPECT_EQ(st_, (expected)) << #expr << " -> " << ember_status_string(st_) << ": " << ember_last_error(); \
    if ((expected) != EMBER_OK) {                                                                            \
      EXPECT_STRNE(ember_last_error(), "") << #expr << " failed without a message";                          \
    }                                                                                                        \
  } while (0)

#define ASSERT_OK(expr)                                                                                    \
  do {                                                                                                     \
    const ember_status st_ = (expr);                                                                       \
    ASSERT_EQ(st_, EMBER_OK) << #expr << " -> " << ember_status_string(st_) << ": " << ember_last_error(); \
  } while (0)

namespace capi_test {

struct ModelDeleter {
  void operator()(ember_model* m) const { ember_model_destroy(m); }
};
struct EngineDeleter {
  void operator()(ember_engine* e) const { ember_engine_destroy(e); }
};
struct SessionDeleter {
  void operator()(ember_session* s) const { ember_session_destroy(s); }
};
struct StreamDeleter {
  void operator()(ember_stream* s) const { ember_stream_destroy(s); }
};
using ModelPtr = std::unique_ptr<ember_model, ModelDeleter>;
using EnginePtr = std::unique_ptr<ember_engine, EngineDeleter>;
using SessionPtr = std::unique_ptr<ember_session, SessionDeleter>;
using StreamPtr = std::unique_ptr<ember_stream, StreamDeleter>;

// KV pool for test engines: enough for a few short conversations, and much
// faster to create than the 512 MiB default.
constexpr uint64_t kTestKvBytes = 48ull << 20;

// RFC 3629 validation, written independently of the library's own.
// EMBER_TEST_REDUCED=1 (the sanitizer passes of tools/test.sh): the same
// checks on fewer threads, tokens and iterations.
inline bool reduced_size() {
  const char* e = std::getenv("EMBER_TEST_REDUCED");
  return e && *e && *e != '0';
}

// Whether the library has its grammar engine (structured output, tools).
inline bool structured_output() {
  ember_capabilities_t caps;
  std::memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  EXPECT_EQ(ember_capabilities(&caps), EMBER_OK);
  return caps.structured_output == 1;
}

inline bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    const unsigned char c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// The model shared by every test of the binary (loading copies the whole file
// into memory: no reason to do it 50 times). NULL when the model is absent.
inline ember_model* shared_model() {
  static ModelPtr model = [] {
    ember_model* m = nullptr;
    if (ember::test::model_available()) {
      ember_model_load(ember::test::default_model_path().c_str(), nullptr, &m);
    }
    return ModelPtr(m);
  }();
  return model.get();
}

// One thread per engine unless asked: these tests are about the API, and on a
// busy 2-core machine OpenMP's spin-waiting costs 10-20x in CPU time. Under
// TSan always one: see tests/capi/tsan.supp.
inline EnginePtr make_engine(ember_model* model, uint64_t kv_bytes = kTestKvBytes, int32_t n_threads = 1) {
#ifdef EMBER_TEST_TSAN
  n_threads = 1;
#endif
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.kv_memory_bytes = kv_bytes;
  ep.n_threads = n_threads;
  ember_engine* e = nullptr;
  const ember_status st = ember_engine_create(model, &ep, &e);
  EXPECT_EQ(st, EMBER_OK) << ember_last_error();
  return EnginePtr(e);
}

inline SessionPtr make_session(ember_engine* engine, int32_t n_ctx = 0, const char* system_prompt = nullptr) {
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.n_ctx = n_ctx;
  sp.system_prompt = system_prompt;
  ember_session* s = nullptr;
  const ember_status st = ember_session_create(engine, &sp, &s);
  EXPECT_EQ(st, EMBER_OK) << ember_last_error();
  return SessionPtr(s);
}

inline ember_stream_params greedy_params(int32_t max_tokens) {
  ember_stream_params p;
  ember_stream_params_init(&p);
  p.max_tokens = max_tokens;
  p.temperature = 0.0f;
  return p;
}

inline ember_stream_params sampled_params(int32_t max_tokens, uint64_t seed) {
  ember_stream_params p;
  ember_stream_params_init(&p);
  p.max_tokens = max_tokens;
  p.temperature = 0.9f;
  p.seed = seed;
  return p;
}

inline ember_event new_event() {
  ember_event ev;
  std::memset(&ev, 0, sizeof ev);
  ev.size = sizeof ev;
  return ev;
}

struct CollectedCall {
  std::string id, name, arguments;
};

// Everything a stream produced, event by event.
struct Collected {
  std::vector<std::string> pieces;
  std::vector<CollectedCall> calls;  // TOOL_CALL events (since 1.4)
  std::vector<int32_t> tokens;
  std::string text;
  int32_t end_reason = EMBER_END_NONE;
  ember_status error = EMBER_OK;  // status of an ERROR event
  bool ended = false;
};

// Pulls events until END/ERROR (waiting forever), checking the per-event
// invariants on the way.
inline Collected drain(ember_stream* stream) {
  Collected c;
  for (;;) {
    ember_event ev = new_event();
    const ember_status st = ember_stream_next(stream, &ev, -1);
    EXPECT_EQ(st, EMBER_OK) << ember_last_error();
    if (st != EMBER_OK) break;
    if (ev.type == EMBER_EVENT_TEXT) {
      std::string piece(ev.text, ev.text_length);
      EXPECT_EQ(std::strlen(ev.text), ev.text_length);
      EXPECT_TRUE(valid_utf8(piece)) << "invalid UTF-8 piece of " << piece.size() << " bytes";
      c.pieces.push_back(piece);
      c.text += piece;
      c.tokens.insert(c.tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
    } else if (ev.type == EMBER_EVENT_TOOL_CALL) {
      EXPECT_TRUE(ev.tool_call_id && ev.tool_name && ev.tool_arguments);
      if (!ev.tool_call_id || !ev.tool_name || !ev.tool_arguments) continue;
      c.calls.push_back({ev.tool_call_id, ev.tool_name, ev.tool_arguments});
      c.tokens.insert(c.tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
    } else if (ev.type == EMBER_EVENT_END) {
      c.end_reason = ev.end_reason;
      c.ended = true;
      break;
    } else {
      EXPECT_EQ(ev.type, EMBER_EVENT_ERROR);
      c.error = ev.status;
      c.ended = true;
      break;
    }
  }
  return c;
}

// Starts a stream on `session` with `params` and drains it.
inline Collected run(ember_session* session, const ember_stream_params& params) {
  ember_stream* s = nullptr;
  const ember_status st = ember_stream_start(session, &params, &s);
  EXPECT_EQ(st, EMBER_OK) << ember_last_error();
  if (st != EMBER_OK) return {};
  StreamPtr stream(s);
  return drain(stream.get());
}

inline size_t token_count(const ember_session* session) {
  size_t n = 0;
  EXPECT_EQ(ember_session_token_count(session, &n), EMBER_OK) << ember_last_error();
  return n;
}

}  // namespace capi_test

// Every test that needs the model starts with this: skip (or fail under CI)
// when it is absent, and make `model` point at the shared one.
#define CAPI_REQUIRE_MODEL(model)                   \
  EMBER_REQUIRE_MODEL();                            \
  ember_model* model = ::capi_test::shared_model(); \
  ASSERT_NE(model, nullptr) << "the model exists but did not load: " << ember_last_error()
