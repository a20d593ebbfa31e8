// The C ABI: handles <-> core objects, status codes and the thread-local last
// error, parameter structs read by their size. No engine logic lives here.
#include "ember/ember.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "core/backend/plugin.h"
#include "core/backend/registry.h"
#include "core/engine/embed.h"
#include "core/engine/engine.h"
#include "core/model/lora.h"
#include "core/model/model.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/fault.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "core/util/utf8.h"

using ember::Error;
using ember::StatusCode;

struct ember_model {
  std::shared_ptr<ember::Model> model;
};
struct ember_lora {
  std::shared_ptr<const ember::LoraAdapter> adapter;
};
struct ember_cache {
  ember::Engine* engine;
};
struct ember_scheduler {
  ember::Engine* engine;
};
namespace {
// The places for session handles on one engine (EMBER_MAX_SESSIONS_PER_ENGINE).
// Shared with the sessions, which may outlive the engine handle.
struct SessionPlaces {
  std::atomic<int32_t> live{0};
};
// A session handle's place: taken at creation, given back when it is destroyed.
class SessionPlace {
 public:
  explicit SessionPlace(std::shared_ptr<SessionPlaces> places) : places_(std::move(places)) {
    if (places_->live.fetch_add(1) >= EMBER_MAX_SESSIONS_PER_ENGINE) {
      places_->live.fetch_sub(1);
      throw Error(StatusCode::kOutOfMemory, "session: the engine already has " +
                                                std::to_string(EMBER_MAX_SESSIONS_PER_ENGINE) +
                                                " sessions (EMBER_MAX_SESSIONS_PER_ENGINE); destroy one first");
    }
  }
  ~SessionPlace() { places_->live.fetch_sub(1); }
  SessionPlace(const SessionPlace&) = delete;
  SessionPlace& operator=(const SessionPlace&) = delete;

 private:
  std::shared_ptr<SessionPlaces> places_;
};
}  // namespace

struct ember_engine {
  std::shared_ptr<ember::EngineOwner> owner;
  std::shared_ptr<SessionPlaces> session_places = std::make_shared<SessionPlaces>();
  std::string backend_name;  // storage behind ember_engine_info_t.backend_name
  ember_cache cache_view;
  ember_scheduler scheduler_view;
};
struct ember_session {
  explicit ember_session(const ember_engine& engine) : place(engine.session_places) {}
  SessionPlace place;
  std::shared_ptr<ember::Session> session;
};
struct ember_stream {
  std::shared_ptr<ember::Stream> stream;
  ember::StreamEvent current;  // storage behind the last ember_event returned
};

namespace {

thread_local std::string t_last_error;
// True while this thread runs the host's log callback: the core calls it with
// its log mutex held (and often with engine locks held), so a call back into
// the library could deadlock. Such calls fail with BUSY instead.
thread_local bool t_in_log_callback = false;
constexpr const char* kInLogCallback =
    "called from inside the log callback: the callback must not call ember_* functions "
    "(except ember_version, ember_version_number, ember_status_string, ember_last_error)";

ember_status set_error(StatusCode code, const std::string& message) {
  t_last_error = message;
  return static_cast<ember_status>(code);
}

// Runs `body` with every exception turned into a status + message.
template <typename F>
ember_status guarded(F&& body) {
  t_last_error.clear();
  if (t_in_log_callback) {
    t_last_error = kInLogCallback;
    return EMBER_ERR_BUSY;
  }
  try {
    body();
    return EMBER_OK;
  } catch (const Error& e) {
    return set_error(e.code(), e.message());
  } catch (const std::bad_alloc&) {
    return set_error(StatusCode::kOutOfMemory, "out of memory");
  } catch (const std::exception& e) {
    return set_error(StatusCode::kInternal, std::string("internal error: ") + e.what());
  } catch (...) {
    return set_error(StatusCode::kInternal, "internal error: unknown exception");
  }
}

void require(bool ok, const char* what) {
  if (!ok) throw Error(StatusCode::kInvalidArgument, what);
}

std::string checked_text(const char* text, const char* what) {
  require(text != nullptr, (std::string(what) + " is NULL").c_str());
  const size_t length = strnlen(text, size_t{EMBER_MAX_TEXT_BYTES} + 1);  // never scans past the limit
  if (length > EMBER_MAX_TEXT_BYTES) {
    throw Error(StatusCode::kInvalidArgument, std::string(what) + " is longer than EMBER_MAX_TEXT_BYTES (" +
                                                  std::to_string(EMBER_MAX_TEXT_BYTES) + " bytes)");
  }
  std::string_view v(text, length);
  size_t bad = 0;
  if (!ember::is_valid_utf8(v, &bad)) {
    throw Error(StatusCode::kInvalidArgument,
                std::string(what) + " is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  }
  return std::string(v);
}

void full_model_defaults(ember_model_params* params) {
  std::memset(params, 0, sizeof *params);
  params->size = sizeof *params;
  params->use_mmap = 1;
}

// The defaults live in the core (EngineParams, CachePolicy, StreamParams).
void full_engine_defaults(ember_engine_params* params) {
  const ember::EngineParams d;
  std::memset(params, 0, sizeof *params);
  params->size = sizeof *params;
  params->device = EMBER_DEVICE_CPU;
  params->n_threads = d.n_threads;
  params->kv_memory_bytes = 0;  // 0: the core's default (EngineParams::kv_memory_bytes)
  params->kv_block_size = d.kv_block_size;
  params->kv_dtype = EMBER_KV_F16;
  params->max_batch_tokens = d.max_batch_tokens;
  params->max_running = d.max_running;
  params->prefix_caching = d.prefix_caching ? 1 : 0;
  params->manual_step = d.manual ? 1 : 0;
  params->batch_invariant = d.batch_invariant ? 1 : 0;
  params->tp_size = d.tp;
  params->pp_size = d.pp;
  params->comm_timeout_ms = 0;  // 0: the core's default
  params->comm = EMBER_COMM_MPI;
  params->tp_exact = d.tp_exact ? 1 : 0;
}

void full_session_defaults(ember_session_params* params) {
  std::memset(params, 0, sizeof *params);
  params->size = sizeof *params;
  params->cache_policy = EMBER_CACHE_FULL;
  params->sink_tokens = ember::CachePolicy::kDefaultSinkTokens;
  params->window_tokens = 0;
}

void full_embed_defaults(ember_embed_params* params) {
  std::memset(params, 0, sizeof *params);
  params->size = sizeof *params;
  params->pooling = EMBER_POOLING_MEAN;
}

void full_stream_defaults(ember_stream_params* params) {
  const ember::StreamParams d;
  std::memset(params, 0, sizeof *params);
  params->size = sizeof *params;
  params->max_tokens = d.max_tokens;
  params->temperature = d.sampling.temperature;
  params->top_k = d.sampling.top_k;
  params->top_p = d.sampling.top_p;
  params->min_p = d.sampling.min_p;
  params->repeat_penalty = d.sampling.repeat_penalty;
  params->presence_penalty = d.sampling.presence_penalty;
  params->frequency_penalty = d.sampling.frequency_penalty;
  params->penalty_last_n = d.sampling.penalty_last_n;
  params->seed = d.sampling.seed;
  params->stop = nullptr;
  params->ignore_eos = d.ignore_eos ? 1 : 0;
  params->spec_drafter = EMBER_SPEC_NONE;
  params->spec_self_layers = d.spec.self_layers;
  params->spec_draft_model = nullptr;
  params->spec_threshold = d.spec.tree.threshold;
  params->spec_max_nodes = d.spec.tree.max_nodes;
  params->spec_max_depth = d.spec.tree.max_depth;
  params->spec_alpha = d.spec.tree.alpha;
  params->spec_lookup = d.spec.draft_lookup ? 1 : 0;
  params->json_schema = nullptr;
  params->grammar = nullptr;
  params->regex = nullptr;
  params->choices = nullptr;
  params->json_object = 0;
  params->tool_choice = EMBER_TOOL_CHOICE_AUTO;
  params->tool_name = nullptr;
  params->parallel_tool_calls = 1;
  params->logit_bias = nullptr;
  params->n_logit_bias = 0;
  params->logprobs = 0;
  params->top_logprobs = 0;
  params->logits_processor = nullptr;
  params->logits_processor_data = nullptr;
}

// 1.0 sizes of the parameter structs: what the 1.0 entry points
// (ember_*_params_init without _sized) may write. The struct as of 1.0 ends at
// its last 1.0 field, rounded up to the struct's alignment. Frozen: when a
// field is appended, the last 1.0 field named here stays.
template <typename T>
constexpr size_t v1_size(size_t end_of_last_field) {
  return (end_of_last_field + alignof(T) - 1) / alignof(T) * alignof(T);
}
constexpr size_t kV1_0_model_params =
    v1_size<ember_model_params>(offsetof(ember_model_params, use_mmap) + sizeof(int32_t));
constexpr size_t kV1_0_engine_params =
    v1_size<ember_engine_params>(offsetof(ember_engine_params, batch_invariant) + sizeof(int32_t));
constexpr size_t kV1_0_session_params =
    v1_size<ember_session_params>(offsetof(ember_session_params, window_tokens) + sizeof(int32_t));
constexpr size_t kV1_0_stream_params =
    v1_size<ember_stream_params>(offsetof(ember_stream_params, ignore_eos) + sizeof(int32_t));
// Today's model, engine and session structs are the 1.0 ones (this fails, as
// intended, once a field is appended: then check that the constants above
// still name the 1.0 fields). The stream params grew in 1.2 (speculation).
static_assert(kV1_0_model_params == sizeof(ember_model_params) && kV1_0_engine_params < sizeof(ember_engine_params) &&
              offsetof(ember_engine_params, tp_size) >= kV1_0_engine_params &&
              kV1_0_session_params == sizeof(ember_session_params) &&
              kV1_0_stream_params < sizeof(ember_stream_params));

// Writes the defaults into the first `size` bytes of *params (the caller's
// struct) and sets params->size = size. Bytes past the library's struct are
// zeroed. Never writes past `size`.
template <typename T>
void init_sized(T* params, size_t size, void (*defaults)(T*)) {
  if (!params || size < sizeof(size_t)) return;
  T full;
  defaults(&full);
  const size_t n = size < sizeof(T) ? size : sizeof(T);
  std::memcpy(static_cast<void*>(params), &full, n);
  if (size > n) std::memset(reinterpret_cast<unsigned char*>(params) + n, 0, size - n);
  std::memcpy(static_cast<void*>(params), &size, sizeof size);  // params->size, for any size >= sizeof(size_t)
}

// Copies the caller's struct over the defaults, reading only what its size covers.
template <typename T>
T read_params(const T* user, void (*init)(T*)) {
  T p;
  init(&p);
  if (!user) return p;
  if (user->size < sizeof(size_t)) throw Error(StatusCode::kInvalidArgument, "params: size field is too small");
  const size_t n = user->size < sizeof(T) ? user->size : sizeof(T);
  std::memcpy(static_cast<void*>(&p), user, n);
  p.size = sizeof(T);
  return p;
}

void require_sized(size_t size) { require(size >= sizeof(size_t), "output struct: size field not set"); }

// Writes an output struct the caller sized: only the bytes its size covers.
template <typename T>
void write_sized(T* user, const T& value) {
  require_sized(user->size);
  const size_t n = user->size < sizeof(T) ? user->size : sizeof(T);
  const size_t caller_size = user->size;
  std::memcpy(static_cast<void*>(user), &value, n);
  user->size = caller_size;
}

// The header's documented limits are the core's.
static_assert(EMBER_MAX_STOP_STRINGS == ember::StreamParams::kMaxStopStrings);
static_assert(EMBER_MAX_TOKENS_PER_STREAM == ember::StreamParams::kMaxTokensLimit);

static_assert(EMBER_MAX_CHOICES == ember::grammar::Constraint::kMaxChoices);
// Events hand out the core's logprob entries as they are.
static_assert(sizeof(ember_token_logprob) == sizeof(ember::TokenLogprob) &&
              offsetof(ember_token_logprob, token) == offsetof(ember::TokenLogprob, token) &&
              offsetof(ember_token_logprob, logprob) == offsetof(ember::TokenLogprob, logprob));

// Structured output: at most one constraint; strings bounded before they are copied.
ember::grammar::Constraint to_constraint(const ember_stream_params& p) {
  using Kind = ember::grammar::Constraint::Kind;
  ember::grammar::Constraint c;
  constexpr size_t kMax = ember::grammar::Constraint::kMaxTextBytes;
  int set = 0;
  auto text = [&](const char* v, Kind kind, const char* name) {
    if (!v) return;
    ++set;
    const size_t n = strnlen(v, kMax + 1);
    if (n > kMax)
      throw Error(StatusCode::kInvalidArgument, std::string("stream params: ") + name + " is larger than 1 MiB");
    c.kind = kind;
    c.text.assign(v, n);
  };
  text(p.json_schema, Kind::kJsonSchema, "json_schema");
  text(p.grammar, Kind::kGrammar, "grammar");
  text(p.regex, Kind::kRegex, "regex");
  if (p.json_object != 0 && p.json_object != 1) {
    throw Error(StatusCode::kInvalidArgument, "stream params: json_object must be 0 or 1");
  }
  if (p.json_object) {
    ++set;
    c.kind = Kind::kJsonObject;
  }
  if (p.choices) {
    ++set;
    c.kind = Kind::kChoices;
    for (size_t i = 0; p.choices[i]; ++i) {
      if (i >= ember::grammar::Constraint::kMaxChoices) {
        throw Error(StatusCode::kInvalidArgument, "stream params: more than EMBER_MAX_CHOICES choices");
      }
      const size_t n = strnlen(p.choices[i], 4097);
      if (n > 4096) throw Error(StatusCode::kInvalidArgument, "stream params: a choice is longer than 4096 bytes");
      c.choices.emplace_back(p.choices[i], n);
    }
  }
  if (set > 1) {
    throw Error(StatusCode::kInvalidArgument,
                "stream params: at most one of json_schema, grammar, regex, choices and json_object");
  }
  return c;
}

// Conversion only: the core validates (StreamParams::validate), except the
// length of stop strings, bounded here before they are copied.
ember::StreamParams to_stream_params(const ember_stream_params& p) {
  ember::StreamParams s;
  s.max_tokens = p.max_tokens;
  s.sampling.temperature = p.temperature;
  s.sampling.top_k = p.top_k;
  s.sampling.top_p = p.top_p;
  s.sampling.min_p = p.min_p;
  s.sampling.repeat_penalty = p.repeat_penalty;
  s.sampling.presence_penalty = p.presence_penalty;
  s.sampling.frequency_penalty = p.frequency_penalty;
  s.sampling.penalty_last_n = p.penalty_last_n;
  s.sampling.seed = p.seed;
  s.ignore_eos = p.ignore_eos != 0;
  s.spec.kind = static_cast<ember::SpecParams::Kind>(p.spec_drafter);
  if (p.spec_drafter < EMBER_SPEC_NONE || p.spec_drafter > EMBER_SPEC_DRAFT) {
    throw Error(StatusCode::kInvalidArgument, "stream params: unknown spec_drafter");
  }
  s.spec.self_layers = p.spec_self_layers;
  if (p.spec_draft_model) s.spec.draft_model = p.spec_draft_model->model;
  s.spec.tree.threshold = p.spec_threshold;
  s.spec.tree.max_nodes = p.spec_max_nodes;
  s.spec.tree.max_depth = p.spec_max_depth;
  s.spec.tree.alpha = p.spec_alpha;
  if (p.spec_lookup != 0 && p.spec_lookup != 1) {
    throw Error(StatusCode::kInvalidArgument, "stream params: spec_lookup must be 0 or 1");
  }
  s.spec.draft_lookup = p.spec_lookup != 0;
  s.constraint = to_constraint(p);
  if (p.tool_choice < EMBER_TOOL_CHOICE_AUTO || p.tool_choice > EMBER_TOOL_CHOICE_FUNCTION) {
    throw Error(StatusCode::kInvalidArgument, "stream params: unknown tool_choice");
  }
  if (p.parallel_tool_calls != 0 && p.parallel_tool_calls != 1) {
    throw Error(StatusCode::kInvalidArgument, "stream params: parallel_tool_calls must be 0 or 1");
  }
  s.tool_choice.mode = static_cast<ember::chat::ToolChoice::Mode>(p.tool_choice);
  s.tool_choice.parallel = p.parallel_tool_calls != 0;
  if (p.tool_choice == EMBER_TOOL_CHOICE_FUNCTION) {
    if (!p.tool_name) throw Error(StatusCode::kInvalidArgument, "stream params: tool_choice FUNCTION needs tool_name");
    const size_t n = strnlen(p.tool_name, ember::chat::ToolSet::kMaxNameBytes + 1);
    if (n > ember::chat::ToolSet::kMaxNameBytes) {
      throw Error(StatusCode::kInvalidArgument, "stream params: tool_name is longer than 256 bytes");
    }
    s.tool_choice.name.assign(p.tool_name, n);
  }
  if (p.n_logit_bias > EMBER_MAX_LOGIT_BIAS) {
    throw Error(StatusCode::kInvalidArgument, "stream params: more than EMBER_MAX_LOGIT_BIAS logit bias entries");
  }
  if (p.n_logit_bias > 0 && !p.logit_bias)
    throw Error(StatusCode::kInvalidArgument, "stream params: logit_bias is NULL");
  for (size_t i = 0; i < p.n_logit_bias; ++i) s.logit_bias.emplace_back(p.logit_bias[i].token, p.logit_bias[i].bias);
  if (p.logprobs != 0 && p.logprobs != 1)
    throw Error(StatusCode::kInvalidArgument, "stream params: logprobs must be 0 or 1");
  s.logprobs = p.logprobs != 0;
  s.top_logprobs = p.top_logprobs;
  if (p.logits_processor) {
    const ember_logits_processor fn = p.logits_processor;
    void* data = p.logits_processor_data;
    s.logits_processor = [fn, data](float* row, int32_t n_vocab, const std::vector<int32_t>& history) {
      return fn(row, n_vocab, history.data(), history.size(), data) == 0;
    };
  }
  if (p.stop) {
    // Bounded: one past the core's limit is enough for it to refuse.
    for (size_t i = 0; p.stop[i] && i <= ember::StreamParams::kMaxStopStrings; ++i) {
      if (strnlen(p.stop[i], EMBER_MAX_STOP_STRING_BYTES + 1) > EMBER_MAX_STOP_STRING_BYTES) {
        throw Error(StatusCode::kInvalidArgument, "stream params: stop string " + std::to_string(i) +
                                                      " is longer than EMBER_MAX_STOP_STRING_BYTES (" +
                                                      std::to_string(EMBER_MAX_STOP_STRING_BYTES) + " bytes)");
      }
      s.stop.push_back(checked_text(p.stop[i], "stop string"));
    }
  }
  return s;
}

ember_event to_event(const ember::StreamEvent& e) {
  ember_event out;
  std::memset(&out, 0, sizeof out);
  out.size = sizeof out;
  out.type = static_cast<int32_t>(e.type);
  out.text = e.text.c_str();
  out.text_length = e.text.size();
  out.tokens = e.tokens.empty() ? nullptr : e.tokens.data();
  out.n_tokens = e.tokens.size();
  out.end_reason = static_cast<int32_t>(e.end_reason);
  out.status = static_cast<ember_status>(e.status);
  if (!e.logprobs.empty()) {
    out.logprobs = e.logprobs.data();
    out.top_logprobs =
        e.top_logprobs.empty() ? nullptr : reinterpret_cast<const ember_token_logprob*>(e.top_logprobs.data());
    out.n_top_logprobs = e.n_top;
  }
  if (e.type == ember::StreamEvent::kToolCall) {
    out.tool_call_id = e.call.id.c_str();
    out.tool_name = e.call.name.c_str();
    out.tool_arguments = e.call.arguments.c_str();
  }
  return out;
}

// The CUDA plugin as ember_capabilities reports it (probed once per process).
struct PluginProbe {
  int32_t state = EMBER_PLUGIN_ABSENT;
  std::string path;
  std::string message;
};

PluginProbe probe_plugin() {
  const ember::PluginProbe p = ember::probe_backend_plugin();
  PluginProbe r;
  r.state = p.state == ember::PluginProbe::State::kLoadable ? EMBER_PLUGIN_LOADABLE
            : p.state == ember::PluginProbe::State::kBroken ? EMBER_PLUGIN_BROKEN
                                                            : EMBER_PLUGIN_ABSENT;
  r.path = p.path;
  r.message = p.message;
  return r;
}

const PluginProbe& plugin_probe() {
  static const PluginProbe probe = probe_plugin();  // thread-safe static init, once per process
  return probe;
}

}  // namespace

extern "C" {

#define EMBER_STRINGIFY_(x) #x
#define EMBER_STRINGIFY(x) EMBER_STRINGIFY_(x)
const char* ember_version(void) {
  return EMBER_STRINGIFY(EMBER_VERSION_MAJOR) "." EMBER_STRINGIFY(EMBER_VERSION_MINOR) "." EMBER_STRINGIFY(
      EMBER_VERSION_PATCH);
}

int32_t ember_version_number(void) { return EMBER_VERSION_NUMBER; }

const char* ember_last_error(void) { return t_last_error.c_str(); }

const char* ember_status_string(ember_status status) {
  switch (status) {
    case EMBER_OK: return "EMBER_OK";
    case EMBER_ERR_INVALID_ARGUMENT: return "EMBER_ERR_INVALID_ARGUMENT";
    case EMBER_ERR_NOT_FOUND: return "EMBER_ERR_NOT_FOUND";
    case EMBER_ERR_BAD_FORMAT: return "EMBER_ERR_BAD_FORMAT";
    case EMBER_ERR_UNSUPPORTED: return "EMBER_ERR_UNSUPPORTED";
    case EMBER_ERR_OUT_OF_MEMORY: return "EMBER_ERR_OUT_OF_MEMORY";
    case EMBER_ERR_CONTEXT_FULL: return "EMBER_ERR_CONTEXT_FULL";
    case EMBER_ERR_BUSY: return "EMBER_ERR_BUSY";
    case EMBER_ERR_CANCELLED: return "EMBER_ERR_CANCELLED";
    case EMBER_ERR_TIMEOUT: return "EMBER_ERR_TIMEOUT";
    case EMBER_ERR_INTERNAL: return "EMBER_ERR_INTERNAL";
    case EMBER_ERR_END_OF_STREAM: return "EMBER_ERR_END_OF_STREAM";
    default: return "unknown status";
  }
}

namespace {
struct LogHook {
  ember_log_callback callback;
  void* user_data;
};
std::mutex g_log_hook_mutex;  // serialises ember_set_log_callback (never held while logging)
LogHook* g_log_hook = nullptr;

void log_trampoline(int level, const char* message, void* hook) {
  const auto* h = static_cast<const LogHook*>(hook);
  const bool outer = t_in_log_callback;
  t_in_log_callback = true;
  try {
    h->callback(level, message, h->user_data);
  } catch (...) {}
  t_in_log_callback = outer;
}
}  // namespace

void ember_set_log_callback(ember_log_callback callback, void* user_data) {
  if (t_in_log_callback) return;  // documented: ignored from inside the callback
  std::lock_guard<std::mutex> lock(g_log_hook_mutex);
  LogHook* fresh = callback ? new (std::nothrow) LogHook{callback, user_data} : nullptr;
  if (callback && !fresh) return;  // out of memory: keep the current callback
  ember::set_log_callback(fresh ? log_trampoline : nullptr, fresh);
  // The core calls the callback with its log mutex held, which set_log_callback
  // also takes: no call with the old hook is running any more.
  delete g_log_hook;
  g_log_hook = fresh;
}

ember_status ember_capabilities(ember_capabilities_t* caps) {
  return guarded([&] {
    require(caps != nullptr, "caps is NULL");
    require_sized(caps->size);
    const PluginProbe& probe = plugin_probe();
    const ember::BackendInfo cpu = ember::backend_info("cpu");
    ember_capabilities_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.cpu_isa = cpu.isa;
    out.cpu_isa_name = cpu.isa_name;
    out.cuda_plugin = probe.state;
    out.cuda_plugin_path = probe.path.c_str();
    out.cuda_plugin_message = probe.message.c_str();
    out.structured_output = ember::grammar::available() ? 1 : 0;
    write_sized(caps, out);
  });
}

// ---------------------------------------------------------------- model

void ember_model_params_init_sized(ember_model_params* params, size_t size) {
  init_sized(params, size, full_model_defaults);
}

void(ember_model_params_init)(ember_model_params* params) {
  init_sized(params, kV1_0_model_params, full_model_defaults);
}

ember_status ember_model_load(const char* path, const ember_model_params* params, ember_model** out_model) {
  return guarded([&] {
    require(out_model != nullptr, "out_model is NULL");
    *out_model = nullptr;
    const std::string p = checked_text(path, "path");
    const ember_model_params mp = read_params(params, full_model_defaults);
    auto h = std::make_unique<ember_model>();
    h->model = ember::Model::load(p, mp.use_mmap == EMBER_MODEL_MAP_SHARED ? ember::Model::Weights::kSharedMapping
                                                                           : ember::Model::Weights::kPrivateCopy);
    *out_model = h.release();
  });
}

void ember_model_destroy(ember_model* model) {
  if (t_in_log_callback) return;  // documented: ignored from inside the log callback
  delete model;
}

ember_status ember_model_info(const ember_model* model, ember_model_info_t* info) {
  return guarded([&] {
    require(model != nullptr, "model is NULL");
    require(info != nullptr, "info is NULL");
    const auto& m = *model->model;
    const auto& c = m.config();
    ember_model_info_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.architecture = m.architecture().c_str();
    out.name = m.name().c_str();
    out.n_params = m.n_params();
    out.context_length = c.n_ctx_train;
    out.vocab_size = c.n_vocab;
    out.n_layers = c.n_layers;
    out.n_embd = c.n_embd;
    out.n_heads = c.n_heads;
    out.n_kv_heads = c.n_kv_heads;
    out.bos_token = m.tokenizer().bos();
    out.eos_token = m.tokenizer().eos();
    write_sized(info, out);
  });
}

ember_status ember_tokenize(const ember_model* model, const char* text, int32_t add_special, int32_t parse_special,
                            int32_t* tokens, size_t capacity, size_t* out_count) {
  return guarded([&] {
    require(model != nullptr, "model is NULL");
    require(out_count != nullptr, "out_count is NULL");
    require(tokens != nullptr || capacity == 0, "tokens is NULL but capacity > 0");
    *out_count = 0;
    const std::string t = checked_text(text, "text");
    const auto ids = model->model->tokenizer().encode(t, add_special != 0, parse_special != 0);
    *out_count = ids.size();
    if (ids.size() > capacity) {
      throw Error(StatusCode::kInvalidArgument,
                  "tokens buffer too small: need " + std::to_string(ids.size()) + ", have " + std::to_string(capacity));
    }
    std::copy(ids.begin(), ids.end(), tokens);
  });
}

ember_status ember_detokenize(const ember_model* model, const int32_t* tokens, size_t n_tokens, char* text,
                              size_t capacity, size_t* out_length) {
  return guarded([&] {
    require(model != nullptr, "model is NULL");
    require(out_length != nullptr, "out_length is NULL");
    require(tokens != nullptr || n_tokens == 0, "tokens is NULL");
    require(text != nullptr || capacity == 0, "text is NULL but capacity > 0");
    *out_length = 0;
    const std::string out = model->model->tokenizer().detokenize(tokens, n_tokens);
    *out_length = out.size();
    if (out.size() + 1 > capacity) {
      throw Error(StatusCode::kInvalidArgument,
                  "text buffer too small: need " + std::to_string(out.size() + 1) + " bytes");
    }
    std::memcpy(text, out.c_str(), out.size() + 1);
  });
}

// ---------------------------------------------------------------- engine

void ember_engine_params_init_sized(ember_engine_params* params, size_t size) {
  init_sized(params, size, full_engine_defaults);
}

void(ember_engine_params_init)(ember_engine_params* params) {
  init_sized(params, kV1_0_engine_params, full_engine_defaults);
}

ember_status ember_engine_create(ember_model* model, const ember_engine_params* params, ember_engine** out_engine) {
  return guarded([&] {
    require(out_engine != nullptr, "out_engine is NULL");
    *out_engine = nullptr;
    require(model != nullptr, "model is NULL");
    const ember_engine_params p = read_params(params, full_engine_defaults);
    require(p.device == EMBER_DEVICE_CPU || p.device == EMBER_DEVICE_CUDA || p.device == EMBER_DEVICE_AUTO,
            "engine params: unknown device");
    require(p.kv_dtype == EMBER_KV_F16 || p.kv_dtype == EMBER_KV_Q8_0, "engine params: unknown kv_dtype");
    ember::EngineParams ep;
    ep.device = p.device == EMBER_DEVICE_CUDA ? "cuda" : p.device == EMBER_DEVICE_AUTO ? "auto" : "cpu";
    ep.n_threads = p.n_threads;
    if (p.kv_memory_bytes != 0) ep.kv_memory_bytes = p.kv_memory_bytes;
    ep.kv_block_size = p.kv_block_size;
    ep.kv_dtype = p.kv_dtype == EMBER_KV_Q8_0 ? ember::DType::Q8_0 : ember::DType::F16;
    ep.max_batch_tokens = p.max_batch_tokens;
    ep.max_running = p.max_running;
    ep.prefix_caching = p.prefix_caching != 0;
    ep.manual = p.manual_step != 0;
    ep.batch_invariant = p.batch_invariant != 0;
    ep.tp = p.tp_size;
    ep.pp = p.pp_size;
    if (p.comm_timeout_ms != 0) ep.comm_timeout_ms = p.comm_timeout_ms;
    require(p.comm == EMBER_COMM_MPI || p.comm == EMBER_COMM_NCCL, "engine params: unknown comm");
    ep.comm = p.comm == EMBER_COMM_NCCL ? "nccl" : "mpi";
    ep.tp_exact = p.tp_exact != 0;
    auto h = std::make_unique<ember_engine>();
    h->owner = ember::Engine::create(model->model, ep);
    h->backend_name = (*h->owner)->kv().backend_name();
    h->cache_view.engine = &**h->owner;
    h->scheduler_view.engine = &**h->owner;
    *out_engine = h.release();
  });
}

ember_status ember_engine_rank(const ember_engine* engine, int32_t* out_rank, int32_t* out_size) {
  return guarded([&] {
    require(engine != nullptr, "engine is NULL");
    if (out_rank) *out_rank = (*engine->owner)->rank();
    if (out_size) *out_size = (*engine->owner)->world_size();
  });
}

ember_status ember_engine_follow(ember_engine* engine) {
  return guarded([&] {
    require(engine != nullptr, "engine is NULL");
    require((*engine->owner)->world_size() > 1, "the engine's model is not split across ranks");
    require((*engine->owner)->rank() > 0, "rank 0 runs the engine itself; ember_engine_follow is for ranks > 0");
    (*engine->owner)->follow();
  });
}

void ember_engine_destroy(ember_engine* engine) {
  if (t_in_log_callback) return;  // documented: ignored from inside the log callback
  try {
    delete engine;
  } catch (...) {}
}

ember_status ember_engine_info(const ember_engine* engine, ember_engine_info_t* info) {
  return guarded([&] {
    require(engine != nullptr, "engine is NULL");
    require(info != nullptr, "info is NULL");
    // What the engine chose: "cpu", "cuda" (GPU 0) or "cuda:N".
    const std::string& device = (*engine->owner)->device();
    const bool cuda = device.rfind("cuda", 0) == 0;
    ember_engine_info_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.device = cuda ? EMBER_DEVICE_CUDA : EMBER_DEVICE_CPU;
    out.gpu_index = !cuda ? -1 : device.size() > 5 ? std::atoi(device.c_str() + 5) : 0;
    out.backend_name = engine->backend_name.c_str();
    out.manual_step = (*engine->owner)->manual() ? 1 : 0;
    write_sized(info, out);
  });
}

ember_status ember_engine_step(ember_engine* engine, int32_t max_ms, int32_t max_tokens, size_t* out_tokens) {
  return guarded([&] {
    require(engine != nullptr, "engine is NULL");
    if (out_tokens) *out_tokens = 0;
    ember::Engine& e = **engine->owner;
    require(e.manual(), "ember_engine_step: the engine runs its own worker (create it with manual_step = 1)");
    const size_t n = e.run_steps(static_cast<double>(max_ms), max_tokens);
    if (out_tokens) *out_tokens = n;
  });
}

ember_cache* ember_engine_cache(ember_engine* engine) { return engine ? &engine->cache_view : nullptr; }
ember_scheduler* ember_engine_scheduler(ember_engine* engine) { return engine ? &engine->scheduler_view : nullptr; }

ember_status ember_cache_stats(const ember_cache* cache, ember_cache_stats_t* stats) {
  return guarded([&] {
    require(cache != nullptr && cache->engine != nullptr, "cache is NULL");
    require(stats != nullptr, "stats is NULL");
    const auto s = cache->engine->cache_stats();
    ember_cache_stats_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.block_size = s.block_size;
    out.blocks_total = s.blocks_total;
    out.blocks_used = s.blocks_used;
    out.blocks_cached = s.blocks_cached;
    out.blocks_free = s.blocks_free;
    out.prefix_hits = s.prefix_hits;
    out.prefix_misses = s.prefix_misses;
    out.bytes_per_block = s.bytes_per_block;
    write_sized(stats, out);
  });
}

ember_status ember_scheduler_stats(const ember_scheduler* scheduler, ember_scheduler_stats_t* stats) {
  return guarded([&] {
    require(scheduler != nullptr && scheduler->engine != nullptr, "scheduler is NULL");
    require(stats != nullptr, "stats is NULL");
    const auto s = scheduler->engine->scheduler_stats();
    ember_scheduler_stats_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.running = s.running;
    out.waiting = s.waiting;
    out.preempted = s.preempted;
    out.last_step_tokens = s.last_step_tokens;
    out.steps = s.steps;
    write_sized(stats, out);
  });
}

ember_status ember_engine_score(ember_engine* engine, const int32_t* tokens, size_t n_tokens, float* logprobs,
                                float* logits) {
  return guarded([&] {
    require(engine != nullptr, "engine is NULL");
    require(tokens != nullptr, "tokens is NULL");
    require(n_tokens > 0, "n_tokens is 0");
    (*engine->owner)->score(tokens, n_tokens, logprobs, logits);
  });
}

// ---------------------------------------------------------------- embeddings

void ember_embed_params_init_sized(ember_embed_params* params, size_t size) {
  init_sized(params, size, full_embed_defaults);
}

namespace {
ember::EmbedParams embed_params(const ember_embed_params* params) {
  const ember_embed_params p = read_params(params, full_embed_defaults);
  require(p.pooling == EMBER_POOLING_MEAN || p.pooling == EMBER_POOLING_LAST || p.pooling == EMBER_POOLING_CLS,
          "embed params: unknown pooling");
  require(p.normalize == 0 || p.normalize == 1, "embed params: normalize must be 0 or 1");
  require(p.parse_special == 0 || p.parse_special == 1, "embed params: parse_special must be 0 or 1");
  ember::EmbedParams e;
  e.pooling = static_cast<ember::Pooling>(p.pooling);
  e.normalize = p.normalize != 0;
  e.parse_special = p.parse_special != 0;
  return e;
}

// Checks `out` before anything runs, then copies the vectors into it.
void check_embed_out(ember_engine* engine, size_t n_inputs, const float* out, size_t out_capacity) {
  require(n_inputs > 0, "no inputs");
  require(n_inputs <= EMBER_MAX_EMBED_INPUTS, "more inputs than EMBER_MAX_EMBED_INPUTS");
  require(out != nullptr, "out is NULL");
  const size_t n_embd = static_cast<size_t>((*engine->owner)->model().config().n_embd);
  if (out_capacity / n_embd < n_inputs) {
    throw Error(StatusCode::kInvalidArgument, "out holds " + std::to_string(out_capacity) + " floats; " +
                                                  std::to_string(n_inputs) + " vectors of " + std::to_string(n_embd) +
                                                  " need " + std::to_string(n_inputs * n_embd));
  }
}

void write_vectors(const std::vector<std::vector<float>>& vectors, float* out) {
  for (const auto& v : vectors) out = std::copy(v.begin(), v.end(), out);
}
}  // namespace

ember_status ember_engine_embed(ember_engine* engine, const char* const* texts, size_t n_texts,
                                const ember_embed_params* params, float* out, size_t out_capacity) {
  return guarded([&] {
    require(engine != nullptr, "engine is NULL");
    require(texts != nullptr, "texts is NULL");
    const ember::EmbedParams p = embed_params(params);
    check_embed_out(engine, n_texts, out, out_capacity);
    std::vector<std::string> inputs;
    inputs.reserve(n_texts);
    for (size_t i = 0; i < n_texts; ++i) inputs.push_back(checked_text(texts[i], "text"));
    write_vectors(ember::embed_texts(engine->owner, inputs, p), out);
  });
}

ember_status ember_engine_embed_tokens(ember_engine* engine, const int32_t* const* tokens, const size_t* n_tokens,
                                       size_t n_inputs, const ember_embed_params* params, float* out,
                                       size_t out_capacity) {
  return guarded([&] {
    require(engine != nullptr, "engine is NULL");
    require(tokens != nullptr && n_tokens != nullptr, "tokens or n_tokens is NULL");
    const ember::EmbedParams p = embed_params(params);
    check_embed_out(engine, n_inputs, out, out_capacity);
    const size_t n_ctx = static_cast<size_t>((*engine->owner)->model().config().n_ctx_train);
    std::vector<std::vector<int32_t>> inputs(n_inputs);
    for (size_t i = 0; i < n_inputs; ++i) {
      require(tokens[i] != nullptr || n_tokens[i] == 0, "an input's tokens are NULL");
      if (n_tokens[i] > n_ctx) {  // refused before copying an absurd length
        throw Error(StatusCode::kContextFull, "embed: input " + std::to_string(i) + " has " +
                                                  std::to_string(n_tokens[i]) +
                                                  " tokens, more than the model's context of " + std::to_string(n_ctx));
      }
      inputs[i].assign(tokens[i], tokens[i] + n_tokens[i]);
    }
    write_vectors(ember::embed_tokens(engine->owner, inputs, p), out);
  });
}

// ---------------------------------------------------------------- session

void ember_session_params_init_sized(ember_session_params* params, size_t size) {
  init_sized(params, size, full_session_defaults);
}

void(ember_session_params_init)(ember_session_params* params) {
  init_sized(params, kV1_0_session_params, full_session_defaults);
}

ember_status ember_session_create(ember_engine* engine, const ember_session_params* params,
                                  ember_session** out_session) {
  return guarded([&] {
    require(out_session != nullptr, "out_session is NULL");
    *out_session = nullptr;
    require(engine != nullptr, "engine is NULL");
    const ember_session_params p = read_params(params, full_session_defaults);
    std::string system;
    if (p.system_prompt) system = checked_text(p.system_prompt, "system_prompt");
    require(p.priority == EMBER_PRIORITY_INTERACTIVE || p.priority == EMBER_PRIORITY_BACKGROUND,
            "session params: unknown priority");
    require(p.cache_policy == EMBER_CACHE_FULL || p.cache_policy == EMBER_CACHE_WINDOW ||
                p.cache_policy == EMBER_CACHE_SINK,
            "session params: unknown cache_policy");
    require(p.sink_tokens >= 0, "session params: sink_tokens must be >= 0");
    require(p.window_tokens >= 0, "session params: window_tokens must be >= 0");
    ember::CachePolicy policy;
    policy.kind = static_cast<ember::CachePolicyKind>(p.cache_policy);
    policy.sink_tokens = p.cache_policy == EMBER_CACHE_SINK ? p.sink_tokens : 0;
    policy.window_tokens = p.cache_policy == EMBER_CACHE_FULL ? 0 : p.window_tokens;
    auto h = std::make_unique<ember_session>(*engine);
    h->session = std::make_shared<ember::Session>(engine->owner, p.n_ctx, system, p.priority, policy);
    *out_session = h.release();
  });
}

void ember_session_destroy(ember_session* session) {
  if (!session || t_in_log_callback) return;
  try {
    session->session->cancel_active();
    delete session;
  } catch (...) {}
}

ember_status ember_session_add_message(ember_session* session, const char* role, const char* content) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    const std::string r = checked_text(role, "role");
    const std::string c = checked_text(content, "content");
    session->session->add_message(r, c);
  });
}

ember_status ember_session_set_tools(ember_session* session, const char* tools_json) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    std::string json;
    if (tools_json) {
      // Bounded before it is copied: one byte past the core's limit is enough for it to refuse.
      const size_t n = strnlen(tools_json, ember::chat::ToolSet::kMaxJsonBytes + 1);
      json.assign(tools_json, n);
    }
    session->session->set_tools(json);
  });
}

ember_status ember_lora_load(const ember_model* model, const char* path, ember_lora** out_lora) {
  return guarded([&] {
    require(out_lora != nullptr, "out_lora is NULL");
    *out_lora = nullptr;
    require(model != nullptr, "model is NULL");
    const std::string p = checked_text(path, "path");
    auto h = std::make_unique<ember_lora>();
    h->adapter = ember::LoraAdapter::load(p, *model->model);
    *out_lora = h.release();
  });
}

void ember_lora_destroy(ember_lora* lora) {
  if (t_in_log_callback) return;  // as the other destroy functions
  delete lora;
}

ember_status ember_lora_info(const ember_lora* lora, ember_lora_info_t* info) {
  return guarded([&] {
    require(lora != nullptr, "lora is NULL");
    require(info != nullptr, "info is NULL");
    const auto& a = *lora->adapter;
    ember_lora_info_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.n_matrices = a.n_pairs();
    out.max_rank = a.max_rank();
    out.alpha = a.alpha();
    out.bytes = a.bytes();
    write_sized(info, out);
  });
}

ember_status ember_session_set_loras(ember_session* session, const ember_lora* const* loras, const float* scales,
                                     size_t n) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    require(n == 0 || loras != nullptr, "loras is NULL");
    require(n <= ember::LoraSet::kMaxAdapters, "at most 16 adapters per session");
    std::vector<ember::LoraUse> uses;
    for (size_t i = 0; i < n; ++i) {
      require(loras[i] != nullptr, "an adapter in loras is NULL");
      uses.push_back({loras[i]->adapter, scales ? scales[i] : 1.0f});
    }
    session->session->set_loras(ember::LoraSet::make(std::move(uses)));
  });
}

ember_status ember_session_add_text(ember_session* session, const char* text, int32_t parse_special) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    session->session->add_text(checked_text(text, "text"), parse_special != 0);
  });
}

ember_status ember_session_add_tokens(ember_session* session, const int32_t* tokens, size_t n_tokens) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    require(tokens != nullptr || n_tokens == 0, "tokens is NULL");
    session->session->add_tokens(std::vector<int32_t>(tokens, tokens + n_tokens));
  });
}

ember_status ember_session_reset(ember_session* session) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    session->session->reset();
  });
}

ember_status ember_session_token_count(const ember_session* session, size_t* out_count) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    require(out_count != nullptr, "out_count is NULL");
    *out_count = session->session->token_count();
  });
}

ember_status ember_session_score(ember_session* session, const int32_t* tokens, size_t n_tokens, float* logprobs) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    require(tokens != nullptr || n_tokens == 0, "tokens is NULL");
    session->session->score(std::vector<int32_t>(tokens, tokens + n_tokens), logprobs);
  });
}

ember_status ember_session_cache_info(const ember_session* session, ember_session_cache_info_t* info) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    require(info != nullptr, "info is NULL");
    const ember::SessionCacheInfo c = session->session->cache_info();
    ember_session_cache_info_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.cache_policy = static_cast<int32_t>(c.policy.kind);
    out.sink_tokens = c.policy.sink_tokens;
    out.window_tokens = c.policy.window_tokens;
    out.n_tokens = c.n_tokens;
    out.processed_tokens = c.n_processed;
    out.resident_tokens = c.resident;
    out.evicted_tokens = c.evicted;
    out.blocks = c.blocks;
    out.max_blocks = c.max_blocks;
    out.max_position = c.max_position;
    write_sized(info, out);
  });
}

ember_status ember_session_save(ember_session* session, const char* path) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    session->session->save(checked_text(path, "path"));
  });
}

ember_status ember_session_load(ember_engine* engine, const char* path, const ember_session_params* params,
                                ember_session** out_session) {
  return guarded([&] {
    require(out_session != nullptr, "out_session is NULL");
    *out_session = nullptr;
    require(engine != nullptr, "engine is NULL");
    const std::string p = checked_text(path, "path");
    int32_t priority = -1;  // the saved one
    if (params) {
      const ember_session_params sp = read_params(params, full_session_defaults);
      require(sp.priority == EMBER_PRIORITY_INTERACTIVE || sp.priority == EMBER_PRIORITY_BACKGROUND,
              "session params: unknown priority");
      priority = sp.priority;
    }
    auto h = std::make_unique<ember_session>(*engine);
    h->session = ember::Session::load(engine->owner, p, priority);
    *out_session = h.release();
  });
}

// ---------------------------------------------------------------- stream

void ember_stream_params_init_sized(ember_stream_params* params, size_t size) {
  init_sized(params, size, full_stream_defaults);
}

void(ember_stream_params_init)(ember_stream_params* params) {
  init_sized(params, kV1_0_stream_params, full_stream_defaults);
}

ember_status ember_stream_start(ember_session* session, const ember_stream_params* params, ember_stream** out_stream) {
  return guarded([&] {
    require(out_stream != nullptr, "out_stream is NULL");
    *out_stream = nullptr;
    require(session != nullptr, "session is NULL");
    const ember_stream_params p = read_params(params, full_stream_defaults);
    const ember::StreamParams sp = to_stream_params(p);
    auto h = std::make_unique<ember_stream>();
    h->stream = session->session->start(sp);
    *out_stream = h.release();
  });
}

ember_status ember_stream_next(ember_stream* stream, ember_event* event, int32_t timeout_ms) {
  return guarded([&] {
    require(stream != nullptr, "stream is NULL");
    require(event != nullptr, "event is NULL");
    require_sized(event->size);  // before taking the event off the queue, so it is not lost
    ember::StreamEvent ev;
    const StatusCode code = stream->stream->next(ev, timeout_ms);
    if (code == StatusCode::kTimeout) throw Error(code, "no event within the timeout");
    if (code == StatusCode::kEndOfStream) throw Error(code, "the stream has ended");
    if (code == StatusCode::kBusy) throw Error(code, "the stream delivers its events to a callback");
    stream->current = std::move(ev);
    if (stream->current.type == ember::StreamEvent::kError) t_last_error = stream->current.error;
    write_sized(event, to_event(stream->current));
  });
}

ember_status ember_stream_set_callback(ember_stream* stream, ember_stream_callback callback, void* user_data) {
  return guarded([&] {
    require(stream != nullptr, "stream is NULL");
    require(callback != nullptr, "callback is NULL");
    auto deliver = [callback, user_data](const ember::StreamEvent& e) {
      ember_event out = to_event(e);
      if (e.type == ember::StreamEvent::kError) t_last_error = e.error;
      return callback(&out, user_data) != 0;
    };
    stream->stream->set_callback(deliver);
  });
}

ember_status ember_stream_cancel(ember_stream* stream) {
  return guarded([&] {
    require(stream != nullptr, "stream is NULL");
    stream->stream->cancel();
  });
}

ember_status ember_stream_wait(ember_stream* stream) {
  return guarded([&] {
    require(stream != nullptr, "stream is NULL");
    stream->stream->wait();
  });
}

ember_status ember_stream_stats(const ember_stream* stream, ember_stream_stats_t* stats) {
  return guarded([&] {
    require(stream != nullptr, "stream is NULL");
    require(stats != nullptr, "stats is NULL");
    const auto s = stream->stream->stats();
    ember_stream_stats_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.prompt_tokens = s.prompt_tokens;
    out.generated_tokens = s.generated_tokens;
    out.time_to_first_token_ms = s.ttft_ms;
    out.tokens_per_second = s.tokens_per_second;
    out.prefill_tokens_per_second = s.prefill_tokens_per_second;
    out.finished = s.finished ? 1 : 0;
    out.end_reason = static_cast<int32_t>(s.end_reason);
    out.drafted_tokens = s.drafted_tokens;
    out.accepted_tokens = s.accepted_tokens;
    out.verify_passes = s.verify_passes;
    out.mean_accepted_length =
        s.verify_passes ? static_cast<double>(s.accepted_tokens) / static_cast<double>(s.verify_passes) : 0.0;
    write_sized(stats, out);
  });
}

void ember_stream_release(ember_stream* stream) {
  if (!stream || t_in_log_callback) return;
  try {
    stream->stream->cancel();  // an atomic flag: never blocks
    delete stream;             // the engine holds its own reference until the stream ends
  } catch (...) {}
}

// ---------------------------------------------------------------- testing

ember_status ember_test_inject_alloc_failures(int32_t site, int64_t skip, int64_t count, uint64_t* out_injected) {
  return guarded([&] {
    require(site >= 0 && site < ember::testing::kAllocSiteCount, "unknown allocation site");
    static_assert(EMBER_ALLOC_KV_BLOCK == static_cast<int32_t>(ember::testing::AllocSite::kKvBlock) &&
                  EMBER_ALLOC_BACKEND_BUFFER == static_cast<int32_t>(ember::testing::AllocSite::kBackendBuffer) &&
                  EMBER_ALLOC_BACKEND_WEIGHT == static_cast<int32_t>(ember::testing::AllocSite::kBackendWeight) &&
                  EMBER_ALLOC_KV_POOL == static_cast<int32_t>(ember::testing::AllocSite::kKvPool) &&
                  EMBER_ALLOC_MODEL_FILE == static_cast<int32_t>(ember::testing::AllocSite::kModelFile));
    const uint64_t n = ember::testing::arm_alloc_failures(static_cast<ember::testing::AllocSite>(site), skip, count);
    if (out_injected) *out_injected = n;
  });
}

void ember_stream_destroy(ember_stream* stream) {
  if (!stream || t_in_log_callback) return;
  try {
    stream->stream->cancel();
    stream->stream->wait();
    delete stream;
  } catch (...) {}
}

}  // extern "C"
