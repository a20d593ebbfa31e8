#include "apps/server/server.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apps/server/api.h"
#include "ember/ember.h"

namespace ember::server {

extern const char* const kChatPage;  // chat_page.cpp (generated from chat_page.html)

namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- handles

struct SessionDeleter {
  void operator()(ember_session* s) const { ember_session_destroy(s); }
};
struct StreamDeleter {
  void operator()(ember_stream* s) const { ember_stream_destroy(s); }
};
using SessionPtr = std::unique_ptr<ember_session, SessionDeleter>;
using StreamPtr = std::unique_ptr<ember_stream, StreamDeleter>;

// A failed C call as the API error it is for the client.
[[noreturn]] void fail(ember_status st, const std::string& param = "") {
  const std::string msg = ember_last_error();
  switch (st) {
    case EMBER_ERR_INVALID_ARGUMENT:
    case EMBER_ERR_UNSUPPORTED: throw ApiError(400, "invalid_request_error", msg, param);
    case EMBER_ERR_CONTEXT_FULL:
      throw ApiError(400, "invalid_request_error", msg, "messages", "context_length_exceeded");
    case EMBER_ERR_OUT_OF_MEMORY:
    case EMBER_ERR_BUSY: throw ApiError(503, "server_error", msg);
    default: throw ApiError(500, "server_error", msg);
  }
}
void check(ember_status st, const std::string& param = "") {
  if (st != EMBER_OK) fail(st, param);
}

// ---------------------------------------------------------------- admission

// At most `slots` requests run; `queue` more wait in arrival order; the rest
// are refused (503).
class Admission {
 public:
  Admission(int slots, int queue) : slots_(slots), queue_(queue) {}
  bool enter() {
    std::unique_lock<std::mutex> lock(mu_);
    if (running_ < slots_ && waiting_ == 0) {
      ++running_;
      return true;
    }
    if (waiting_ >= queue_) return false;
    const uint64_t ticket = next_ticket_++;
    ++waiting_;
    cv_.wait(lock, [&] { return running_ < slots_ && ticket == serving_; });
    ++serving_;
    --waiting_;
    ++running_;
    cv_.notify_all();
    return true;
  }
  void leave() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --running_;
    }
    cv_.notify_all();
  }
  int running() {
    std::lock_guard<std::mutex> lock(mu_);
    return running_;
  }
  int waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int slots_, queue_;
  int running_ = 0, waiting_ = 0;
  uint64_t next_ticket_ = 0, serving_ = 0;
};

class Slot {
 public:
  explicit Slot(Admission& a) : a_(&a) {
    if (!a.enter()) {
      a_ = nullptr;
      throw ApiError(503, "server_error", "the server is busy (every place and the queue are taken); retry later", "",
                     "server_busy");
    }
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  ~Slot() {
    if (a_) a_->leave();
  }

 private:
  Admission* a_;
};

// ---------------------------------------------------------------- metrics

struct Metrics {
  std::atomic<uint64_t> requests_ok{0}, requests_failed{0}, requests_rejected{0}, requests_cancelled{0};
  std::atomic<uint64_t> prompt_tokens{0}, generated_tokens{0}, embedded_inputs{0};
  // Generated tokens per second over the last kWindow seconds.
  static constexpr int kWindow = 10;
  std::mutex mu;
  int64_t bucket_second[kWindow] = {};
  uint64_t bucket_tokens[kWindow] = {};
  Clock::time_point start = Clock::now();

  int64_t now_second() const { return std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count(); }
  void add_generated(uint64_t n) {
    generated_tokens += n;
    const int64_t s = now_second();
    std::lock_guard<std::mutex> lock(mu);
    const int b = static_cast<int>(s % kWindow);
    if (bucket_second[b] != s) {
      bucket_second[b] = s;
      bucket_tokens[b] = 0;
    }
    bucket_tokens[b] += n;
  }
  double tokens_per_second() {
    const int64_t s = now_second();
    std::lock_guard<std::mutex> lock(mu);
    uint64_t total = 0;
    for (int b = 0; b < kWindow; ++b) {
      if (bucket_second[b] > s - kWindow && bucket_second[b] <= s) total += bucket_tokens[b];
    }
    const double span = std::min<double>(kWindow, std::max<double>(1.0, static_cast<double>(s + 1)));
    return static_cast<double>(total) / span;
  }
};

std::atomic<bool> g_stopping{false};

// ---------------------------------------------------------------- the server

struct Generation;

class Server {
 public:
  explicit Server(const ServeOptions& o) : opts_(o), admission_(o.parallel, o.queue) {}
  ~Server() {
    if (engine_) ember_engine_destroy(engine_);
    if (model_) ember_model_destroy(model_);
  }

  void load();
  int run();
  int32_t rank() const { return rank_; }
  // A rank > 0 of a split model: runs rank 0's forward passes until it ends.
  int follow() {
    if (ember_engine_follow(engine_) == EMBER_OK) return 0;
    std::fprintf(stderr, "ember serve: rank %d: %s\n", rank_, ember_last_error());
    return 1;
  }

 private:
  void routes();
  void handle_chat(const httplib::Request& req, httplib::Response& res);
  void handle_completion(const httplib::Request& req, httplib::Response& res);
  void handle_embeddings(const httplib::Request& req, httplib::Response& res);
  std::string metrics_text();
  bool stream_sse(httplib::DataSink& sink, Generation& gen, const Json& head, bool include_usage,
                  const std::function<bool(const ember_event&)>& on_event,
                  const std::function<bool(int32_t end_reason)>& finish);

  SessionPtr new_session();
  std::string token_text(int32_t token) const;
  Json chat_logprobs(const ember_event& ev) const;
  Json legacy_logprobs(const ember_event& ev, size_t text_offset) const;
  uint64_t fresh_seed();

  ServeOptions opts_;
  ember_model* model_ = nullptr;
  ember_engine* engine_ = nullptr;
  int32_t rank_ = 0;  // > 0: a follower of rank 0 (a model split across ranks)
  ModelFacts facts_;
  Admission admission_;
  Metrics metrics_;
  httplib::Server http_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex seed_mu_;
  std::mt19937_64 seed_rng_{std::random_device{}()};
  int64_t created_ = static_cast<int64_t>(std::time(nullptr));
};

void Server::load() {
  ember_model_params mp;
  ember_model_params_init(&mp);
  // Split across ranks: each maps the file and touches only its part.
  if (opts_.tp > 1 || opts_.pp > 1) mp.use_mmap = EMBER_MODEL_MAP_SHARED;
  if (ember_model_load(opts_.model_path.c_str(), &mp, &model_) != EMBER_OK) {
    throw std::runtime_error("cannot load " + opts_.model_path + ": " + ember_last_error());
  }
  ember_model_info_t info{};
  info.size = sizeof(info);
  ember_model_info(model_, &info);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.device = opts_.device;
  ep.n_threads = opts_.threads;
  ep.kv_memory_bytes = opts_.kv_memory_bytes;
  ep.max_running = std::max(64, opts_.parallel);
  ep.tp_size = opts_.tp;
  ep.pp_size = opts_.pp;
  ep.comm_timeout_ms = opts_.comm_timeout_ms;
  ep.comm = opts_.comm;
  ep.tp_exact = opts_.tp_exact;
  ep.kv_dtype = opts_.kv_dtype;
  if (ember_engine_create(model_, &ep, &engine_) != EMBER_OK) {
    throw std::runtime_error(std::string("cannot create the engine: ") + ember_last_error());
  }
  ember_engine_rank(engine_, &rank_, nullptr);
  facts_.vocab_size = info.vocab_size;
  facts_.n_embd = info.n_embd;
  facts_.context_length = opts_.ctx > 0 ? std::min(opts_.ctx, info.context_length) : info.context_length;
  if (!opts_.alias.empty()) {
    facts_.id = opts_.alias;
  } else {
    std::string base = opts_.model_path.substr(opts_.model_path.find_last_of('/') + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, ".gguf") == 0) base.resize(base.size() - 5);
    facts_.id = base;
  }
}

uint64_t Server::fresh_seed() {
  std::lock_guard<std::mutex> lock(seed_mu_);
  return seed_rng_();
}

SessionPtr Server::new_session() {
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.n_ctx = facts_.context_length;
  ember_session* s = nullptr;
  check(ember_session_create(engine_, &sp, &s));
  return SessionPtr(s);
}

std::string Server::token_text(int32_t token) const {
  char buf[256];
  size_t len = 0;
  if (ember_detokenize(model_, &token, 1, buf, sizeof(buf), &len) == EMBER_OK) return std::string(buf, len);
  std::string big(len + 1, '\0');
  if (ember_detokenize(model_, &token, 1, big.data(), big.size(), &len) != EMBER_OK) return "";
  big.resize(len);
  return big;
}

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// A logprob for JSON: -inf (a masked token) becomes the most negative float,
// as JSON has no infinities.
double finite(float lp) { return std::isfinite(lp) ? lp : -std::numeric_limits<float>::max(); }

// OpenAI chat logprobs entries for the tokens of one event.
Json Server::chat_logprobs(const ember_event& ev) const {
  Json out = Json::array();
  if (!ev.logprobs) return out;
  for (size_t i = 0; i < ev.n_tokens; ++i) {
    const std::string t = token_text(ev.tokens[i]);
    Json top = Json::array();
    for (int32_t k = 0; k < ev.n_top_logprobs; ++k) {
      const ember_token_logprob& tl = ev.top_logprobs[i * static_cast<size_t>(ev.n_top_logprobs) + k];
      const std::string tt = token_text(tl.token);
      top.push_back({{"token", tt}, {"logprob", finite(tl.logprob)}, {"bytes", bytes_of(tt)}});
    }
    out.push_back({{"token", t}, {"logprob", finite(ev.logprobs[i])}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
  }
  return out;
}

// Legacy completions logprobs for one event (tokens, token_logprobs,
// top_logprobs as {token: logprob}, text_offset).
Json Server::legacy_logprobs(const ember_event& ev, size_t text_offset) const {
  Json out{{"tokens", Json::array()},
           {"token_logprobs", Json::array()},
           {"top_logprobs", Json::array()},
           {"text_offset", Json::array()}};
  if (!ev.logprobs) return out;
  for (size_t i = 0; i < ev.n_tokens; ++i) {
    const std::string t = token_text(ev.tokens[i]);
    out["tokens"].push_back(t);
    out["token_logprobs"].push_back(finite(ev.logprobs[i]));
    Json top = Json::object();
    for (int32_t k = 0; k < ev.n_top_logprobs; ++k) {
      const ember_token_logprob& tl = ev.top_logprobs[i * static_cast<size_t>(ev.n_top_logprobs) + k];
      top[token_text(tl.token)] = finite(tl.logprob);
    }
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(text_offset);
    text_offset += t.size();
  }
  return out;
}

const char* finish_reason(int32_t end_reason, bool tool_calls) {
  switch (end_reason) {
    case EMBER_END_MAX_TOKENS:
    case EMBER_END_CONTEXT_FULL: return "length";
    default: return tool_calls ? "tool_calls" : "stop";
  }
}

void send_json(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_json(e));
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  if (e.status == 503) res.set_header("Retry-After", "1");
}

std::string sse(const Json& j) { return "data: " + j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n"; }

// One request's generation: its place, session and stream, released together
// (when the handler returns, or when the streamed response is done with).
struct Generation {
  explicit Generation(Admission& a) : slot(a) {}
  Slot slot;
  SessionPtr session;
  StreamPtr stream;
  std::vector<const char*> stop_ptrs;
  size_t generated = 0;
  Clock::time_point t0 = Clock::now();
};

// Pulls the next event, waking every 100 ms when none comes; once the server
// is stopping, the stream is cancelled (tokens may keep coming meanwhile, so
// this is checked before every event, not only when none came).
ember_status next_event(ember_stream* stream, ember_event* ev) {
  for (;;) {
    if (g_stopping.load()) ember_stream_cancel(stream);  // a no-op once it ended
    ev->size = sizeof(*ev);
    const ember_status st = ember_stream_next(stream, ev, 100);
    if (st != EMBER_ERR_TIMEOUT) return st;
  }
}

// Usage counts once the stream ended: completion_tokens every token the model
// generated (an end-of-turn token and a stop string's tokens included), the
// prompt what the session holds besides them.
Json usage_json(ember_session* session, ember_stream* stream) {
  size_t total = 0;
  ember_session_token_count(session, &total);
  ember_stream_stats_t st{};
  st.size = sizeof(st);
  ember_stream_stats(stream, &st);
  const size_t generated = st.generated_tokens;
  const size_t prompt = total >= generated ? total - generated : 0;
  return Json{{"prompt_tokens", prompt}, {"completion_tokens", generated}, {"total_tokens", prompt + generated}};
}

void Server::handle_chat(const httplib::Request& req, httplib::Response& res) {
  ChatRequest r = parse_chat_request(req.body, facts_);
  auto gen = std::make_shared<Generation>(admission_);
  gen->session = new_session();
  for (const ChatMessage& m : r.messages) {
    check(ember_session_add_message(gen->session.get(), m.role.c_str(), m.content.c_str()), "messages");
  }
  if (!r.tools_json.empty()) check(ember_session_set_tools(gen->session.get(), r.tools_json.c_str()), "tools");
  ember_stream_params sp;
  ember_stream_params_init(&sp);
  if (!r.gen.seed) r.gen.seed = fresh_seed();
  fill_stream_params(r.gen, &sp, gen->stop_ptrs);
  if (sp.max_tokens <= 0) sp.max_tokens = facts_.context_length;
  if (!r.tools_json.empty()) {
    sp.tool_choice = r.tool_choice;
    sp.tool_name = r.tool_name.empty() ? nullptr : r.tool_name.c_str();
    sp.parallel_tool_calls = r.parallel_tool_calls ? 1 : 0;
  }
  ember_stream* stream = nullptr;
  check(ember_stream_start(gen->session.get(), &sp, &stream), r.tools_json.empty() ? "" : "tools");
  gen->stream.reset(stream);
  const std::string id = "chatcmpl-" + std::to_string(next_id_++);
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const bool want_logprobs = r.gen.logprobs;

  if (!r.gen.stream) {
    std::string text;
    Json tool_calls = Json::array();
    Json logprobs = Json::array();
    ember_event ev{};
    int32_t end = EMBER_END_NONE;
    for (;;) {
      const ember_status st = next_event(stream, &ev);
      if (st != EMBER_OK) fail(st);
      if (ev.type == EMBER_EVENT_TEXT) {
        text.append(ev.text, ev.text_length);
        gen->generated += ev.n_tokens;
        if (want_logprobs) {
          for (Json& e : chat_logprobs(ev)) logprobs.push_back(std::move(e));
        }
      } else if (ev.type == EMBER_EVENT_TOOL_CALL) {
        gen->generated += ev.n_tokens;
        tool_calls.push_back({{"id", ev.tool_call_id},
                              {"type", "function"},
                              {"function", {{"name", ev.tool_name}, {"arguments", ev.tool_arguments}}}});
      } else if (ev.type == EMBER_EVENT_END) {
        end = ev.end_reason;
        break;
      } else {
        fail(ev.status);
      }
    }
    metrics_.add_generated(gen->generated);
    Json message{{"role", "assistant"}, {"content", text}};
    if (!tool_calls.empty()) {
      message["tool_calls"] = tool_calls;
      if (text.empty()) message["content"] = nullptr;
    }
    Json choice{{"index", 0},
                {"message", message},
                {"logprobs", nullptr},
                {"finish_reason", finish_reason(end, !tool_calls.empty())}};
    if (want_logprobs) choice["logprobs"] = Json{{"content", logprobs}};
    Json usage = usage_json(gen->session.get(), gen->stream.get());
    metrics_.prompt_tokens += usage["prompt_tokens"].get<uint64_t>();
    send_json(res, 200,
              Json{{"id", id},
                   {"object", "chat.completion"},
                   {"created", created},
                   {"model", facts_.id},
                   {"system_fingerprint", std::string("ember-") + ember_version()},
                   {"choices", Json::array({choice})},
                   {"usage", usage}});
    return;
  }

  // Streaming: Server-Sent Events, one chunk per event; a client that goes
  // away fails the next write, which cancels the stream.
  const bool include_usage = r.gen.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [this, gen, id, created, want_logprobs, include_usage](size_t, httplib::DataSink& sink) {
        auto chunk = [&](Json delta, const Json& finish, const Json* logprobs) {
          Json choice{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr}, {"finish_reason", finish}};
          if (logprobs) choice["logprobs"] = Json{{"content", *logprobs}};
          Json c{{"id", id},
                 {"object", "chat.completion.chunk"},
                 {"created", created},
                 {"model", facts_.id},
                 {"system_fingerprint", std::string("ember-") + ember_version()},
                 {"choices", Json::array({std::move(choice)})}};
          const std::string s = sse(c);
          return sink.write(s.data(), s.size());
        };
        if (!chunk(Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)) return false;
        int n_calls = 0;
        return stream_sse(
            sink, *gen, Json{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}}, include_usage,
            [&](const ember_event& ev) {
              if (ev.type == EMBER_EVENT_TEXT) {
                const Json lp = want_logprobs ? chat_logprobs(ev) : Json();
                return chunk(Json{{"content", std::string(ev.text, ev.text_length)}}, nullptr,
                             want_logprobs ? &lp : nullptr);
              }
              Json call{{"index", n_calls++},
                        {"id", ev.tool_call_id},
                        {"type", "function"},
                        {"function", {{"name", ev.tool_name}, {"arguments", ev.tool_arguments}}}};
              return chunk(Json{{"tool_calls", Json::array({call})}}, nullptr, nullptr);
            },
            [&](int32_t end) { return chunk(Json::object(), finish_reason(end, n_calls > 0), nullptr); });
      });
}

void Server::handle_completion(const httplib::Request& req, httplib::Response& res) {
  CompletionRequest r = parse_completion_request(req.body, facts_);
  auto gen = std::make_shared<Generation>(admission_);
  gen->session = new_session();
  std::string echo_text;
  if (r.prompt_is_tokens) {
    check(ember_session_add_tokens(gen->session.get(), r.tokens.data(), r.tokens.size()), "prompt");
    if (r.echo) {
      size_t len = 0;
      ember_detokenize(model_, r.tokens.data(), r.tokens.size(), nullptr, 0, &len);
      echo_text.resize(len + 1);
      if (ember_detokenize(model_, r.tokens.data(), r.tokens.size(), echo_text.data(), echo_text.size(), &len) !=
          EMBER_OK) {
        len = 0;
      }
      echo_text.resize(len);
    }
  } else {
    check(ember_session_add_text(gen->session.get(), r.prompt.c_str(), 1), "prompt");
    if (r.echo) echo_text = r.prompt;
  }
  ember_stream_params sp;
  ember_stream_params_init(&sp);
  if (!r.gen.seed) r.gen.seed = fresh_seed();
  fill_stream_params(r.gen, &sp, gen->stop_ptrs);
  if (sp.max_tokens <= 0) sp.max_tokens = 16;  // OpenAI's default for completions
  ember_stream* stream = nullptr;
  check(ember_stream_start(gen->session.get(), &sp, &stream), "prompt");
  gen->stream.reset(stream);
  const std::string id = "cmpl-" + std::to_string(next_id_++);
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const bool want_logprobs = r.gen.logprobs;
  auto merge = [](Json& into, const Json& more) {
    for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (const Json& v : more[k]) into[k].push_back(v);
    }
  };

  if (!r.gen.stream) {
    std::string text = echo_text;
    Json logprobs{{"tokens", Json::array()},
                  {"token_logprobs", Json::array()},
                  {"top_logprobs", Json::array()},
                  {"text_offset", Json::array()}};
    ember_event ev{};
    int32_t end = EMBER_END_NONE;
    for (;;) {
      const ember_status st = next_event(stream, &ev);
      if (st != EMBER_OK) fail(st);
      if (ev.type == EMBER_EVENT_TEXT) {
        if (want_logprobs) merge(logprobs, legacy_logprobs(ev, text.size()));
        text.append(ev.text, ev.text_length);
        gen->generated += ev.n_tokens;
      } else if (ev.type == EMBER_EVENT_END) {
        end = ev.end_reason;
        break;
      } else {
        fail(ev.status);
      }
    }
    metrics_.add_generated(gen->generated);
    Json usage = usage_json(gen->session.get(), gen->stream.get());
    metrics_.prompt_tokens += usage["prompt_tokens"].get<uint64_t>();
    Json choice{{"index", 0},
                {"text", text},
                {"logprobs", want_logprobs ? logprobs : Json()},
                {"finish_reason", finish_reason(end, false)}};
    send_json(res, 200,
              Json{{"id", id},
                   {"object", "text_completion"},
                   {"created", created},
                   {"model", facts_.id},
                   {"choices", Json::array({choice})},
                   {"usage", usage}});
    return;
  }

  const bool include_usage = r.gen.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [this, gen, id, created, want_logprobs, include_usage,
                                                         echo_text](size_t, httplib::DataSink& sink) {
    auto chunk = [&](const std::string& text, const Json& finish, const Json& logprobs) {
      Json c{{"id", id},
             {"object", "text_completion"},
             {"created", created},
             {"model", facts_.id},
             {"choices",
              Json::array({{{"index", 0}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish}}})}};
      const std::string s = sse(c);
      return sink.write(s.data(), s.size());
    };
    if (!echo_text.empty() && !chunk(echo_text, nullptr, nullptr)) return false;
    size_t offset = echo_text.size();
    return stream_sse(
        sink, *gen, Json{{"id", id}, {"object", "text_completion"}, {"created", created}}, include_usage,
        [&](const ember_event& ev) {
          const bool ok = chunk(std::string(ev.text, ev.text_length), nullptr,
                                want_logprobs ? legacy_logprobs(ev, offset) : Json());
          offset += ev.text_length;
          return ok;
        },
        [&](int32_t end) { return chunk("", finish_reason(end, false), nullptr); });
  });
}

// Streams a generation as Server-Sent Events after its first chunk:
// `on_event` writes a TEXT or TOOL_CALL event's chunk, `finish` the chunk with
// the finish reason; then the usage chunk (`head` + usage, when asked) and
// [DONE]. Each returns false once the client is gone, which cancels the
// stream; an engine failure goes out as an error line. Returns whether the
// response was complete.
bool Server::stream_sse(httplib::DataSink& sink, Generation& gen, const Json& head, bool include_usage,
                        const std::function<bool(const ember_event&)>& on_event,
                        const std::function<bool(int32_t end_reason)>& finish) {
  int32_t end = EMBER_END_NONE;
  ember_event ev{};
  for (;;) {
    const ember_status st = next_event(gen.stream.get(), &ev);
    if (st != EMBER_OK || ev.type == EMBER_EVENT_ERROR) {
      try {
        fail(st != EMBER_OK ? st : ev.status);
      } catch (const ApiError& e) {
        const std::string s = sse(error_json(e));
        sink.write(s.data(), s.size());
      }
      metrics_.requests_failed++;
      return false;
    }
    if (ev.type == EMBER_EVENT_END) {
      end = ev.end_reason;
      break;
    }
    gen.generated += ev.n_tokens;
    metrics_.add_generated(ev.n_tokens);
    if (!on_event(ev)) {  // the client went away
      ember_stream_cancel(gen.stream.get());
      metrics_.requests_cancelled++;
      return false;
    }
  }
  if (end == EMBER_END_CANCELLED) metrics_.requests_cancelled++;
  bool ok = finish(end);
  const Json usage = usage_json(gen.session.get(), gen.stream.get());
  metrics_.prompt_tokens += usage["prompt_tokens"].get<uint64_t>();
  if (ok && include_usage) {
    Json c = head;
    c["model"] = facts_.id;
    c["choices"] = Json::array();
    c["usage"] = usage;
    const std::string s = sse(c);
    ok = sink.write(s.data(), s.size());
  }
  if (ok) ok = sink.write("data: [DONE]\n\n", 14);
  if (ok) {
    metrics_.requests_ok++;
    sink.done();
  }
  return ok;
}

void Server::handle_embeddings(const httplib::Request& req, httplib::Response& res) {
  const EmbeddingRequest r = parse_embedding_request(req.body, facts_);
  Slot slot(admission_);
  const size_t n = r.inputs_are_tokens ? r.tokens.size() : r.texts.size();
  std::vector<float> out(n * static_cast<size_t>(facts_.n_embd));
  ember_embed_params ep;
  ember_embed_params_init(&ep);
  ep.pooling = opts_.pooling;
  ep.normalize = 1;  // OpenAI's embeddings have length 1
  size_t prompt_tokens = 0;
  if (r.inputs_are_tokens) {
    std::vector<const int32_t*> ptrs;
    std::vector<size_t> lens;
    for (const auto& t : r.tokens) {
      ptrs.push_back(t.data());
      lens.push_back(t.size());
      prompt_tokens += t.size();
    }
    check(ember_engine_embed_tokens(engine_, ptrs.data(), lens.data(), n, &ep, out.data(), out.size()), "input");
  } else {
    std::vector<const char*> ptrs;
    for (const std::string& t : r.texts) {
      ptrs.push_back(t.c_str());
      size_t count = 0;
      ember_tokenize(model_, t.c_str(), 1, 0, nullptr, 0, &count);
      prompt_tokens += count;
    }
    check(ember_engine_embed(engine_, ptrs.data(), n, &ep, out.data(), out.size()), "input");
  }
  metrics_.embedded_inputs += n;
  metrics_.prompt_tokens += prompt_tokens;
  Json data = Json::array();
  const size_t d = static_cast<size_t>(facts_.n_embd);
  for (size_t i = 0; i < n; ++i) {
    Json item{{"object", "embedding"}, {"index", i}};
    if (r.base64) {
      item["embedding"] = base64(out.data() + i * d, d * sizeof(float));
    } else {
      item["embedding"] = std::vector<float>(out.begin() + static_cast<ptrdiff_t>(i * d),
                                             out.begin() + static_cast<ptrdiff_t>((i + 1) * d));
    }
    data.push_back(std::move(item));
  }
  send_json(res, 200,
            Json{{"object", "list"},
                 {"data", std::move(data)},
                 {"model", facts_.id},
                 {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}});
}

std::string Server::metrics_text() {
  ember_cache_stats_t cs{};
  cs.size = sizeof(cs);
  ember_cache_stats(ember_engine_cache(engine_), &cs);
  ember_scheduler_stats_t ss{};
  ss.size = sizeof(ss);
  ember_scheduler_stats(ember_engine_scheduler(engine_), &ss);
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " ";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", value);
    out += buf;
    out += "\n";
  };
  metric("ember_requests_succeeded_total", "counter", "Requests answered in full.",
         static_cast<double>(metrics_.requests_ok.load()));
  metric("ember_requests_failed_total", "counter", "Requests that failed (4xx/5xx, errors mid-stream).",
         static_cast<double>(metrics_.requests_failed.load()));
  metric("ember_requests_rejected_total", "counter", "Requests refused with 503 (server busy).",
         static_cast<double>(metrics_.requests_rejected.load()));
  metric("ember_requests_cancelled_total", "counter", "Streams cancelled (client gone or shutdown).",
         static_cast<double>(metrics_.requests_cancelled.load()));
  metric("ember_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         static_cast<double>(metrics_.prompt_tokens.load()));
  metric("ember_generated_tokens_total", "counter", "Tokens generated.",
         static_cast<double>(metrics_.generated_tokens.load()));
  metric("ember_embedded_inputs_total", "counter", "Inputs embedded.",
         static_cast<double>(metrics_.embedded_inputs.load()));
  metric("ember_generated_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.",
         metrics_.tokens_per_second());
  metric("ember_requests_running", "gauge", "Requests holding a place.", admission_.running());
  metric("ember_requests_waiting", "gauge", "Requests queued for a place.", admission_.waiting());
  metric("ember_scheduler_running", "gauge", "Sequences in the engine's last step.", static_cast<double>(ss.running));
  metric("ember_scheduler_waiting", "gauge", "Streams waiting in the engine.", static_cast<double>(ss.waiting));
  metric("ember_scheduler_preempted_total", "counter", "Preemptions (KV pool full).",
         static_cast<double>(ss.preempted));
  metric("ember_kv_blocks_total", "gauge", "KV blocks in the pool.", static_cast<double>(cs.blocks_total));
  metric("ember_kv_blocks_used", "gauge", "KV blocks held by sequences.", static_cast<double>(cs.blocks_used));
  metric("ember_kv_usage_ratio", "gauge", "Fraction of the KV pool in use.",
         cs.blocks_total ? static_cast<double>(cs.blocks_used) / static_cast<double>(cs.blocks_total) : 0.0);
  metric("ember_prefix_cache_hits_total", "counter", "KV blocks reused from the prefix cache.",
         static_cast<double>(cs.prefix_hits));
  return out;
}

void Server::routes() {
  // Every handler's errors become OpenAI error objects.
  auto guarded = [this](void (Server::*fn)(const httplib::Request&, httplib::Response&)) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        (this->*fn)(req, res);
        if (!res.is_chunked_content_provider_) metrics_.requests_ok++;
      } catch (const ApiError& e) {
        if (e.status == 503) {
          metrics_.requests_rejected++;
        } else {
          metrics_.requests_failed++;
        }
        send_error(res, e);
      }
    };
  };
  http_.Post("/v1/chat/completions", guarded(&Server::handle_chat));
  http_.Post("/v1/completions", guarded(&Server::handle_completion));
  http_.Post("/v1/embeddings", guarded(&Server::handle_embeddings));
  http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              Json{{"object", "list"},
                   {"data", Json::array({{{"id", facts_.id},
                                          {"object", "model"},
                                          {"created", created_},
                                          {"owned_by", "ember"},
                                          {"meta",
                                           {{"n_ctx", facts_.context_length},
                                            {"n_vocab", facts_.vocab_size},
                                            {"n_embd", facts_.n_embd}}}}})}});
  });
  http_.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (req.matches[1] != facts_.id) {
      send_error(
          res, ApiError(404, "invalid_request_error", "The model '" + std::string(req.matches[1]) + "' does not exist",
                        "model", "model_not_found"));
      return;
    }
    send_json(res, 200, Json{{"id", facts_.id}, {"object", "model"}, {"created", created_}, {"owned_by", "ember"}});
  });
  http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, Json{{"status", "ok"}});
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  http_.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kChatPage, "text/html; charset=utf-8");
  });

  // The API key, when set, guards the API and the metrics (not / and /health).
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (req.path.rfind("/v1/", 0) != 0 && req.path != "/metrics") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + opts_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "invalid_request_error", "Incorrect API key provided", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib makes itself (unknown route, body too large, bad request
  // line) get an OpenAI error body too.
  http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = "request failed";
    std::string type = "invalid_request_error";
    if (res.status == 404) msg = "Unknown route: " + req.method + " " + req.path.substr(0, 256);
    if (res.status == 413) msg = "The request body is too large";
    if (res.status == 405) msg = "Method not allowed";
    if (res.status >= 500) type = "server_error";
    send_json(res, res.status, error_json(ApiError(res.status, type, msg)));
  });
  http_.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {}
    metrics_.requests_failed++;
    send_json(res, 500, error_json(ApiError(500, "server_error", msg)));
  });
  if (!opts_.quiet) {
    http_.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      std::fprintf(stderr, "%s %s %d\n", req.method.c_str(), req.path.substr(0, 256).c_str(), res.status);
    });
  }
}

int Server::run() {
  routes();
  const size_t threads = static_cast<size_t>(opts_.parallel + opts_.queue + 8);
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_.set_read_timeout(opts_.read_timeout_s, 0);
  http_.set_write_timeout(opts_.write_timeout_s, 0);
  http_.set_keep_alive_timeout(5);
  http_.set_keep_alive_max_count(1000);
  http_.set_payload_max_length(opts_.max_body_bytes);
  int port = opts_.port;
  if (port == 0) {
    port = http_.bind_to_any_port(opts_.host);
    if (port < 0) {
      std::fprintf(stderr, "ember serve: cannot listen on %s\n", opts_.host.c_str());
      return 1;
    }
  } else if (!http_.bind_to_port(opts_.host, port)) {
    std::fprintf(stderr, "ember serve: cannot listen on %s:%d\n", opts_.host.c_str(), port);
    return 1;
  }
  // SIGINT/SIGTERM end the server from a thread of their own (blocked in
  // every other thread, which inherit this mask).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  std::thread waiter([this, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (!g_stopping) std::fprintf(stderr, "ember serve: shutting down\n");
    g_stopping = true;
    http_.stop();
  });
  std::fprintf(stderr, "ember serve: model '%s', listening on http://%s:%d\n", facts_.id.c_str(), opts_.host.c_str(),
               port);
  std::fflush(stderr);
  const bool ok = http_.listen_after_bind();
  g_stopping = true;
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return ok ? 0 : 1;
}

}  // namespace

int serve(const ServeOptions& options) {
  if (options.parallel < 1 || options.queue < 0) {
    std::fprintf(stderr, "ember serve: --parallel must be at least 1 and --queue at least 0\n");
    return 2;
  }
  // Block the stop signals before any thread starts (the engine's worker and
  // the HTTP threads inherit the mask); a peer that closes its socket must
  // not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  g_stopping = false;
  try {
    Server server(options);
    server.load();
    if (server.rank() > 0) return server.follow();
    return server.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ember serve: %s\n", e.what());
    return 1;
  }
}

}  // namespace ember::server
