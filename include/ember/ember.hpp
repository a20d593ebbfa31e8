// ember.hpp — header-only C++17 RAII layer over the Ember C ABI (ember.h).
//
// Nothing here is part of the ABI: it is compiled into the caller and uses
// only the public C functions, so it works against any libember.so.1.
//
//   ember::Model model(path);
//   ember::Engine engine(model);
//   ember::Session session(engine);
//   session.add_message("user", "Hello!");
//   for (const ember::Event& e : session.stream()) std::cout << e.text;
//
// Errors become ember::Error exceptions carrying the status and the library's
// message. Classes are move-only and release their handle when destroyed;
// lifetimes follow the C rules (a Session keeps its Engine's state alive, a
// Stream its Session's, so destruction order does not matter). Thread-safety
// is that of the C functions: Model and Engine may be shared, a Session and
// its Stream are driven by one thread at a time (Stream::cancel from any).
#ifndef EMBER_EMBER_HPP
#define EMBER_EMBER_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ember/ember.h"

namespace ember {

// A failed call: status() is the ember_status, what() the library's message.
class Error : public std::runtime_error {
 public:
  Error(ember_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  ember_status status() const noexcept { return status_; }
  const char* status_name() const noexcept { return ember_status_string(status_); }

 private:
  ember_status status_;
};

namespace detail {

inline void check(ember_status status) {
  if (status != EMBER_OK) throw Error(status, ember_last_error());
}

// The C API takes NUL-terminated text; an embedded NUL would silently cut it.
inline const char* c_text(const std::string& s, const char* what) {
  if (s.find('\0') != std::string::npos) {
    throw Error(EMBER_ERR_INVALID_ARGUMENT, std::string(what) + " contains a NUL byte");
  }
  return s.c_str();
}

// Owns one C handle; move-only.
template <typename T, void (*Destroy)(T*)>
class Handle {
 public:
  Handle() noexcept = default;
  explicit Handle(T* p) noexcept : p_(p) {}
  Handle(Handle&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  void reset() noexcept {
    if (p_) Destroy(std::exchange(p_, nullptr));
  }
  T* get() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

template <typename T>
T sized() {
  T value;
  std::memset(&value, 0, sizeof value);
  value.size = sizeof value;
  return value;
}

}  // namespace detail

// ember_model_info_t with owned strings.
struct ModelInfo {
  std::string architecture;
  std::string name;
  uint64_t n_params = 0;
  int32_t context_length = 0;
  int32_t vocab_size = 0;
  int32_t n_layers = 0;
  int32_t n_embd = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t bos_token = -1;
  int32_t eos_token = -1;
};

inline ember_model_params model_params() {
  ember_model_params p;
  ember_model_params_init(&p);
  return p;
}
// Embedding parameters (EMBER_POOLING_*, L2 normalisation). Since 1.5.
inline ember_embed_params embed_params(int32_t pooling = EMBER_POOLING_MEAN, bool normalize = false) {
  ember_embed_params p;
  ember_embed_params_init(&p);
  p.pooling = pooling;
  p.normalize = normalize ? 1 : 0;
  return p;
}

inline ember_engine_params engine_params() {
  ember_engine_params p;
  ember_engine_params_init(&p);
  return p;
}
inline ember_session_params session_params() {
  ember_session_params p;
  ember_session_params_init(&p);
  return p;
}
inline ember_stream_params stream_params() {
  ember_stream_params p;
  ember_stream_params_init(&p);
  return p;
}

// Immutable weights, tokenizer and chat template.
class Model {
 public:
  explicit Model(const std::string& path, const ember_model_params& params = model_params()) {
    ember_model* m = nullptr;
    detail::check(ember_model_load(detail::c_text(path, "path"), &params, &m));
    handle_ = Handle(m);
  }

  ember_model* get() const noexcept { return handle_.get(); }

  ModelInfo info() const {
    auto raw = detail::sized<ember_model_info_t>();
    detail::check(ember_model_info(get(), &raw));
    ModelInfo out;
    out.architecture = raw.architecture ? raw.architecture : "";
    out.name = raw.name ? raw.name : "";
    out.n_params = raw.n_params;
    out.context_length = raw.context_length;
    out.vocab_size = raw.vocab_size;
    out.n_layers = raw.n_layers;
    out.n_embd = raw.n_embd;
    out.n_heads = raw.n_heads;
    out.n_kv_heads = raw.n_kv_heads;
    out.bos_token = raw.bos_token;
    out.eos_token = raw.eos_token;
    return out;
  }

  std::vector<int32_t> tokenize(const std::string& text, bool add_special = false, bool parse_special = false) const {
    const char* t = detail::c_text(text, "text");
    // Byte-level vocabularies give at most one token per byte, plus BOS/EOS.
    std::vector<int32_t> ids(text.size() + 8);
    size_t n = 0;
    ember_status st = ember_tokenize(get(), t, add_special, parse_special, ids.data(), ids.size(), &n);
    if (st == EMBER_ERR_INVALID_ARGUMENT && n > ids.size()) {
      ids.resize(n);
      st = ember_tokenize(get(), t, add_special, parse_special, ids.data(), ids.size(), &n);
    }
    detail::check(st);
    ids.resize(n);
    return ids;
  }

  std::string detokenize(const std::vector<int32_t>& tokens) const {
    std::string text(tokens.size() * 8 + 16, '\0');
    size_t len = 0;
    ember_status st = ember_detokenize(get(), tokens.data(), tokens.size(), &text[0], text.size(), &len);
    if (st == EMBER_ERR_INVALID_ARGUMENT && len + 1 > text.size()) {
      text.resize(len + 1);
      st = ember_detokenize(get(), tokens.data(), tokens.size(), &text[0], text.size(), &len);
    }
    detail::check(st);
    text.resize(len);
    return text;
  }

 private:
  using Handle = detail::Handle<ember_model, ember_model_destroy>;
  Handle handle_;
};

// A model bound to a device, with its KV pool and worker thread.
class Engine {
 public:
  explicit Engine(const Model& model, const ember_engine_params& params = engine_params()) {
    ember_engine* e = nullptr;
    detail::check(ember_engine_create(model.get(), &params, &e));
    handle_ = Handle(e);
    n_embd_ = static_cast<size_t>(model.info().n_embd);
  }

  ember_engine* get() const noexcept { return handle_.get(); }

  ember_cache_stats_t cache_stats() const {
    auto s = detail::sized<ember_cache_stats_t>();
    detail::check(ember_cache_stats(ember_engine_cache(get()), &s));
    return s;
  }
  ember_scheduler_stats_t scheduler_stats() const {
    auto s = detail::sized<ember_scheduler_stats_t>();
    detail::check(ember_scheduler_stats(ember_engine_scheduler(get()), &s));
    return s;
  }

  // Manual-step engines (manual_step = 1): runs steps on this thread; returns
  // the number of tokens processed (see ember_engine_step).
  size_t step(int32_t max_ms, int32_t max_tokens = 0) {
    size_t n = 0;
    detail::check(ember_engine_step(get(), max_ms, max_tokens, &n));
    return n;
  }

  // log p(tokens[i+1] | tokens[0..i]) for each i: tokens.size() - 1 values.
  std::vector<float> score(const std::vector<int32_t>& tokens) const {
    std::vector<float> logprobs(tokens.size() + 1);  // n - 1 values are written
    detail::check(ember_engine_score(get(), tokens.data(), tokens.size(), logprobs.data(), nullptr));
    logprobs.resize(tokens.empty() ? 0 : tokens.size() - 1);
    return logprobs;
  }

  // One vector of n_embd floats per text (ember_engine_embed). Since 1.5.
  std::vector<std::vector<float>> embed(const std::vector<std::string>& texts,
                                        const ember_embed_params& params = embed_params()) const {
    std::vector<const char*> ptrs;
    ptrs.reserve(texts.size());
    for (const auto& t : texts) ptrs.push_back(detail::c_text(t, "text"));
    std::vector<float> flat(texts.size() * n_embd_);
    detail::check(ember_engine_embed(get(), ptrs.data(), ptrs.size(), &params, flat.data(), flat.size()));
    return split(flat, texts.size());
  }
  // The same for inputs given as token ids (ember_engine_embed_tokens).
  std::vector<std::vector<float>> embed_tokens(const std::vector<std::vector<int32_t>>& inputs,
                                               const ember_embed_params& params = embed_params()) const {
    std::vector<const int32_t*> ptrs;
    std::vector<size_t> lengths;
    for (const auto& in : inputs) {
      ptrs.push_back(in.data());
      lengths.push_back(in.size());
    }
    std::vector<float> flat(inputs.size() * n_embd_);
    detail::check(ember_engine_embed_tokens(get(), ptrs.data(), lengths.data(), inputs.size(), &params, flat.data(),
                                            flat.size()));
    return split(flat, inputs.size());
  }

 private:
  std::vector<std::vector<float>> split(const std::vector<float>& flat, size_t n) const {
    std::vector<std::vector<float>> out(n);
    for (size_t i = 0; i < n; ++i) {
      out[i].assign(flat.begin() + static_cast<std::ptrdiff_t>(i * n_embd_),
                    flat.begin() + static_cast<std::ptrdiff_t>((i + 1) * n_embd_));
    }
    return out;
  }
  using Handle = detail::Handle<ember_engine, ember_engine_destroy>;
  Handle handle_;
  size_t n_embd_ = 0;
};

// One stream event with owned text and tokens.
struct Event {
  int32_t type = EMBER_EVENT_TEXT;      // EMBER_EVENT_*
  std::string text;                     // TEXT: whole UTF-8 characters
  std::vector<int32_t> tokens;          // TEXT: the ids this piece covers
  int32_t end_reason = EMBER_END_NONE;  // END: EMBER_END_*
  ember_status status = EMBER_OK;       // ERROR: the failure
  // TOOL_CALL (since 1.4): the call's id, tool and JSON arguments.
  std::string tool_call_id, tool_name, tool_arguments;
  // With ember_stream_params.logprobs (since 1.4): one per token, and
  // n_top_logprobs alternatives per token (token-major).
  std::vector<float> logprobs;
  std::vector<ember_token_logprob> top_logprobs;
  int32_t n_top_logprobs = 0;

  bool is_text() const noexcept { return type == EMBER_EVENT_TEXT; }
  bool is_end() const noexcept { return type == EMBER_EVENT_END; }
  bool is_tool_call() const noexcept { return type == EMBER_EVENT_TOOL_CALL; }

  static Event from(const ember_event& e) {
    Event out;
    out.type = e.type;
    if (e.text) out.text.assign(e.text, e.text_length);
    if (e.tokens) out.tokens.assign(e.tokens, e.tokens + e.n_tokens);
    out.end_reason = e.end_reason;
    out.status = e.status;
    if (e.logprobs) {
      out.logprobs.assign(e.logprobs, e.logprobs + e.n_tokens);
      out.n_top_logprobs = e.n_top_logprobs;
      if (e.top_logprobs && e.n_top_logprobs > 0)
        out.top_logprobs.assign(e.top_logprobs, e.top_logprobs + e.n_tokens * static_cast<size_t>(e.n_top_logprobs));
    }
    if (e.type == EMBER_EVENT_TOOL_CALL) {
      if (e.tool_call_id) out.tool_call_id = e.tool_call_id;
      if (e.tool_name) out.tool_name = e.tool_name;
      if (e.tool_arguments) out.tool_arguments = e.tool_arguments;
    }
    return out;
  }
};

// One generation. Pull events with next(), iterate it, or set a callback.
// An ERROR event is thrown as ember::Error.
class Stream {
 public:
  // Called on the engine's worker thread for every event (END included);
  // return true to cancel. Exceptions it throws cancel the stream.
  using Callback = std::function<bool(const Event&)>;

  explicit Stream(ember_stream* stream) noexcept : handle_(stream) {}

  ember_stream* get() const noexcept { return handle_.get(); }

  // The next event, waiting as long as it takes; TEXT events, then the END
  // event, then std::nullopt.
  std::optional<Event> next() { return pull(-1); }

  // As next(), but std::nullopt also when nothing came within `timeout`
  // (done() tells the two apart).
  std::optional<Event> next(std::chrono::milliseconds timeout) {
    const auto ms = timeout.count() < 0 ? 0 : (timeout.count() > INT32_MAX ? INT32_MAX : timeout.count());
    return pull(static_cast<int32_t>(ms));
  }

  // True once the END (or ERROR) event has been returned.
  bool done() const noexcept { return done_; }
  int32_t end_reason() const noexcept { return end_reason_; }

  // Reads the remaining events and returns their text.
  std::string text() {
    std::string out;
    while (auto e = next()) out += e->text;
    return out;
  }

  void cancel() { detail::check(ember_stream_cancel(get())); }
  void wait() { detail::check(ember_stream_wait(get())); }

  ember_stream_stats_t stats() const {
    auto s = detail::sized<ember_stream_stats_t>();
    detail::check(ember_stream_stats(get(), &s));
    return s;
  }

  // Switches the stream to push mode (see ember_stream_set_callback).
  void set_callback(Callback callback) {
    auto holder = std::make_unique<Callback>(std::move(callback));
    detail::check(ember_stream_set_callback(get(), &Stream::trampoline, holder.get()));
    callback_ = std::move(holder);
  }

  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Event;
    using difference_type = std::ptrdiff_t;
    using pointer = const Event*;
    using reference = const Event&;

    iterator() = default;
    explicit iterator(Stream* stream) : stream_(stream) { ++*this; }
    reference operator*() const { return *current_; }
    pointer operator->() const { return &*current_; }
    iterator& operator++() {
      current_ = stream_->next();
      if (!current_) stream_ = nullptr;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(const iterator& other) const { return stream_ == other.stream_; }
    bool operator!=(const iterator& other) const { return stream_ != other.stream_; }

   private:
    Stream* stream_ = nullptr;
    std::optional<Event> current_;
  };
  iterator begin() { return iterator(this); }
  iterator end() { return iterator(); }

 private:
  std::optional<Event> pull(int32_t timeout_ms) {
    if (done_) return std::nullopt;
    auto raw = detail::sized<ember_event>();
    const ember_status st = ember_stream_next(get(), &raw, timeout_ms);
    if (st == EMBER_ERR_TIMEOUT) return std::nullopt;
    if (st == EMBER_ERR_END_OF_STREAM) {
      done_ = true;
      return std::nullopt;
    }
    detail::check(st);
    Event e = Event::from(raw);
    if (e.type == EMBER_EVENT_ERROR) {
      done_ = true;
      throw Error(e.status, ember_last_error());
    }
    if (e.type == EMBER_EVENT_END) {
      done_ = true;
      end_reason_ = e.end_reason;
    }
    return e;
  }

  static int32_t trampoline(const ember_event* event, void* user_data) {
    try {
      return (*static_cast<Callback*>(user_data))(Event::from(*event)) ? 1 : 0;
    } catch (...) {
      return 1;
    }
  }

  // Declared before the handle so that it outlives it: destroying the C
  // stream waits for the last callback.
  std::unique_ptr<Callback> callback_;
  detail::Handle<ember_stream, ember_stream_destroy> handle_;
  bool done_ = false;
  int32_t end_reason_ = EMBER_END_NONE;
};

// One conversation on an engine.
class Session {
 public:
  explicit Session(const Engine& engine, const ember_session_params& params = session_params()) {
    ember_session* s = nullptr;
    detail::check(ember_session_create(engine.get(), &params, &s));
    handle_ = Handle(s);
  }
  Session(const Engine& engine, int32_t n_ctx, const std::string& system_prompt = std::string()) {
    ember_session_params p = session_params();
    p.n_ctx = n_ctx;
    p.system_prompt = system_prompt.empty() ? nullptr : detail::c_text(system_prompt, "system_prompt");
    ember_session* s = nullptr;
    detail::check(ember_session_create(engine.get(), &p, &s));
    handle_ = Handle(s);
  }

  // Restores a session saved with save() (see ember_session_load).
  static Session load(const Engine& engine, const std::string& path) {
    ember_session* s = nullptr;
    detail::check(ember_session_load(engine.get(), detail::c_text(path, "path"), nullptr, &s));
    return Session(s);
  }

  ember_session* get() const noexcept { return handle_.get(); }

  void add_message(const std::string& role, const std::string& content) {
    detail::check(ember_session_add_message(get(), detail::c_text(role, "role"), detail::c_text(content, "content")));
  }
  // Tools as an OpenAI tool list in JSON ("" = none); see ember_session_set_tools.
  void set_tools(const std::string& tools_json) {
    detail::check(ember_session_set_tools(get(), tools_json.empty() ? nullptr : detail::c_text(tools_json, "tools")));
  }
  void add_text(const std::string& text, bool parse_special = false) {
    detail::check(ember_session_add_text(get(), detail::c_text(text, "text"), parse_special));
  }
  void add_tokens(const std::vector<int32_t>& tokens) {
    detail::check(ember_session_add_tokens(get(), tokens.data(), tokens.size()));
  }
  void reset() { detail::check(ember_session_reset(get())); }
  size_t token_count() const {
    size_t n = 0;
    detail::check(ember_session_token_count(get(), &n));
    return n;
  }
  // Appends `tokens` and returns log p(token | everything before it) for each
  // (NaN for the very first token of an empty session); ember_session_score.
  std::vector<float> score(const std::vector<int32_t>& tokens) {
    std::vector<float> logprobs(tokens.size());
    detail::check(ember_session_score(get(), tokens.data(), tokens.size(), logprobs.data()));
    return logprobs;
  }
  ember_session_cache_info_t cache_info() const {
    auto info = detail::sized<ember_session_cache_info_t>();
    detail::check(ember_session_cache_info(get(), &info));
    return info;
  }
  void save(const std::string& path) { detail::check(ember_session_save(get(), detail::c_text(path, "path"))); }

  Stream stream(const ember_stream_params& params = stream_params()) {
    ember_stream* s = nullptr;
    detail::check(ember_stream_start(get(), &params, &s));
    return Stream(s);
  }
  // With stop strings (copied by the library; params.stop is ignored).
  Stream stream(ember_stream_params params, const std::vector<std::string>& stop) {
    std::vector<const char*> list;
    for (const auto& s : stop) list.push_back(detail::c_text(s, "stop string"));
    list.push_back(nullptr);
    params.stop = list.data();
    return stream(params);
  }

 private:
  explicit Session(ember_session* session) noexcept : handle_(session) {}

  using Handle = detail::Handle<ember_session, ember_session_destroy>;
  Handle handle_;
};

inline std::string version() { return ember_version(); }

}  // namespace ember

#endif  // EMBER_EMBER_HPP
