// The C ABI: handles <-> core objects, status codes and the thread-local last
// error, parameter structs read by their size. No engine logic lives here.
#include "ember/ember.h"

#include <dlfcn.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "core/backend/plugin.h"
#include "core/engine/engine.h"
#include "core/model/model.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "core/util/utf8.h"
#include "cpu/matmul.h"

using ember::Error;
using ember::StatusCode;

struct ember_model {
  std::shared_ptr<ember::Model> model;
};
struct ember_cache {
  ember::Engine* engine;
};
struct ember_scheduler {
  ember::Engine* engine;
};
struct ember_engine {
  std::shared_ptr<ember::EngineOwner> owner;
  std::string backend_name;  // storage behind ember_engine_info_t.backend_name
  ember_cache cache_view;
  ember_scheduler scheduler_view;
};
struct ember_session {
  std::shared_ptr<ember::Session> session;
};
// Push mode: the core marks a stream finished before it hands the END event to
// the callback, so waiting for the stream alone could return (and let the host
// free user_data) while that last callback still runs. This tracks it.
struct CallbackState {
  std::mutex mutex;
  std::condition_variable cv;
  bool armed = false;  // a callback is set
  bool done = false;   // the END/ERROR callback has returned
};
struct ember_stream {
  std::shared_ptr<ember::Stream> stream;
  ember::StreamEvent current;  // storage behind the last ember_event returned
  std::shared_ptr<CallbackState> callback = std::make_shared<CallbackState>();
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
  std::string_view v(text);
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

void full_engine_defaults(ember_engine_params* params) {
  std::memset(params, 0, sizeof *params);
  params->size = sizeof *params;
  params->device = EMBER_DEVICE_CPU;
  params->n_threads = 0;
  params->kv_memory_bytes = 0;
  params->kv_block_size = 16;
  params->kv_dtype = EMBER_KV_F16;
  params->max_batch_tokens = 512;
  params->max_running = 64;
  params->prefix_caching = 1;
  params->manual_step = 0;
  params->batch_invariant = 1;
}

void full_session_defaults(ember_session_params* params) {
  std::memset(params, 0, sizeof *params);
  params->size = sizeof *params;
  params->cache_policy = EMBER_CACHE_FULL;
  params->sink_tokens = 4;
  params->window_tokens = 0;
}

void full_stream_defaults(ember_stream_params* params) {
  std::memset(params, 0, sizeof *params);
  params->size = sizeof *params;
  params->max_tokens = 256;
  params->temperature = 0.8f;
  params->top_k = 40;
  params->top_p = 0.95f;
  params->min_p = 0.05f;
  params->repeat_penalty = 1.0f;
  params->presence_penalty = 0.0f;
  params->frequency_penalty = 0.0f;
  params->penalty_last_n = 64;
  params->seed = 0xEEEE;
  params->stop = nullptr;
  params->ignore_eos = 0;
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
// Today's structs are the 1.0 ones (this fails, as intended, once a field is
// appended: then check that the constants above still name the 1.0 fields).
static_assert(kV1_0_model_params == sizeof(ember_model_params) && kV1_0_engine_params == sizeof(ember_engine_params) &&
              kV1_0_session_params == sizeof(ember_session_params) && kV1_0_stream_params == sizeof(ember_stream_params));

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

ember::StreamParams to_stream_params(const ember_stream_params& p) {
  ember::StreamParams s;
  require(p.max_tokens > 0 && p.max_tokens <= (1 << 24), "stream params: max_tokens must be in [1, 16777216]");
  require(p.temperature >= 0.0f && p.temperature <= 100.0f, "stream params: temperature must be in [0, 100]");
  require(p.top_k >= 0, "stream params: top_k must be >= 0");
  require(p.top_p > 0.0f && p.top_p <= 1.0f, "stream params: top_p must be in (0, 1]");
  require(p.min_p >= 0.0f && p.min_p <= 1.0f, "stream params: min_p must be in [0, 1]");
  require(p.repeat_penalty > 0.0f && p.repeat_penalty <= 100.0f, "stream params: repeat_penalty must be in (0, 100]");
  require(p.presence_penalty >= -100.0f && p.presence_penalty <= 100.0f, "stream params: presence_penalty out of range");
  require(p.frequency_penalty >= -100.0f && p.frequency_penalty <= 100.0f, "stream params: frequency_penalty out of range");
  require(p.penalty_last_n >= -1, "stream params: penalty_last_n must be >= -1");
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
  if (p.stop) {
    for (size_t i = 0; p.stop[i]; ++i) {
      require(i < 64, "stream params: at most 64 stop strings");
      std::string stop = checked_text(p.stop[i], "stop string");
      require(!stop.empty(), "stream params: empty stop string");
      s.stop.push_back(std::move(stop));
    }
  }
  return s;
}

void fill_event(ember_stream* h, ember_event* event) {
  const auto& e = h->current;
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
  write_sized(event, out);
}

// The CUDA plugin as ember_capabilities reports it: searched in the order of
// core/backend/plugin.h (next to libember.so, $EMBER_PLUGIN_DIR, the loader's
// path), loaded like the engine loads it (and, like there, never unloaded),
// its entry point and ABI checked; no backend is created (no GPU opened).
struct PluginProbe {
  int32_t state = EMBER_PLUGIN_ABSENT;
  std::string path;
  std::string message;
};

PluginProbe probe_plugin() {
  PluginProbe r;
  std::vector<std::string> candidates;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&ember_capabilities), &info) && info.dli_fname) {
    std::string self = info.dli_fname;
    const size_t slash = self.rfind('/');
    candidates.push_back((slash == std::string::npos ? std::string(".") : self.substr(0, slash)) + "/" +
                         ember::kCudaPluginFile);
  }
  if (const char* dirs = std::getenv("EMBER_PLUGIN_DIR"); dirs && *dirs) {
    std::string list = dirs;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t end = std::min(list.find(':', start), list.size());
      if (end > start) candidates.push_back(list.substr(start, end - start) + "/" + ember::kCudaPluginFile);
      start = end + 1;
    }
  }
  std::string found;
  for (const std::string& c : candidates) {
    if (FILE* f = std::fopen(c.c_str(), "rb")) {
      std::fclose(f);
      found = c;
      break;
    }
  }
  void* handle = nullptr;
  if (found.empty()) {
    // The loader's default path: only a library that loads counts as found.
    handle = dlopen(ember::kCudaPluginFile, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      r.message = std::string(ember::kCudaPluginFile) +
                  " not found next to libember.so, in $EMBER_PLUGIN_DIR or on the loader's path";
      return r;
    }
    found = ember::kCudaPluginFile;
  } else {
    handle = dlopen(found.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  r.path = found;
  r.state = EMBER_PLUGIN_BROKEN;
  if (!handle) {
    const char* e = dlerror();
    r.message = std::string("cannot load ") + found + ": " + (e ? e : "unknown dlopen error");
    return r;
  }
  auto entry = reinterpret_cast<ember_backend_plugin_entry_fn>(dlsym(handle, ember::kCudaPluginEntry));
  if (!entry) {
    r.message = found + " has no entry point " + ember::kCudaPluginEntry;
    return r;
  }
  const ember_backend_plugin_v1* plugin = entry();
  if (!plugin || plugin->abi_version != ember::kBackendPluginAbi) {
    r.message = found + ": plugin ABI " + std::to_string(plugin ? plugin->abi_version : 0) + ", libember expects " +
                std::to_string(ember::kBackendPluginAbi);
    return r;
  }
  if (plugin->fingerprint != ember::backend_interface_fingerprint()) {
    r.message = found + ": built from other headers or another C++ ABI (fingerprint mismatch)";
    return r;
  }
  r.state = EMBER_PLUGIN_LOADABLE;
  return r;
}

const PluginProbe& plugin_probe() {
  static const PluginProbe probe = probe_plugin();  // thread-safe static init, once per process
  return probe;
}

// Waits for the stream to end and, in push mode, for its last callback.
void wait_for_end(ember_stream* stream) {
  stream->stream->wait();
  CallbackState& state = *stream->callback;
  std::unique_lock<std::mutex> lock(state.mutex);
  state.cv.wait(lock, [&] { return !state.armed || state.done; });
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
  } catch (...) {
  }
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
    const ember::cpu::Isa isa = ember::cpu::active_isa();
    ember_capabilities_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.cpu_isa = static_cast<int32_t>(isa);
    out.cpu_isa_name = ember::cpu::isa_to_string(isa);
    out.cuda_plugin = probe.state;
    out.cuda_plugin_path = probe.path.c_str();
    out.cuda_plugin_message = probe.message.c_str();
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
    h->model = ember::Model::load(p, mp.use_mmap != 0);
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
    const auto& tok = model->model->tokenizer();
    ember::StreamingDetokenizer detok(tok);
    std::string out;
    for (size_t i = 0; i < n_tokens; ++i) {
      require(tokens[i] >= 0 && tokens[i] < tok.n_vocab(), "token id out of range");
      out += detok.feed(tokens[i]);
    }
    out += detok.flush();
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
    require(p.kv_dtype == EMBER_KV_F16, "engine params: unknown kv_dtype");
    ember::EngineParams ep;
    ep.device = p.device == EMBER_DEVICE_CUDA ? "cuda" : p.device == EMBER_DEVICE_AUTO ? "auto" : "cpu";
    ep.n_threads = p.n_threads;
    ep.kv_memory_bytes = p.kv_memory_bytes == 0 ? (512ull << 20) : p.kv_memory_bytes;
    ep.kv_block_size = p.kv_block_size;
    ep.max_batch_tokens = p.max_batch_tokens;
    ep.max_running = p.max_running;
    ep.prefix_caching = p.prefix_caching != 0;
    ep.manual = p.manual_step != 0;
    ep.batch_invariant = p.batch_invariant != 0;
    auto h = std::make_unique<ember_engine>();
    h->owner = ember::Engine::create(model->model, ep);
    h->backend_name = (*h->owner)->cache().backend_name();
    h->cache_view.engine = &**h->owner;
    h->scheduler_view.engine = &**h->owner;
    *out_engine = h.release();
  });
}

void ember_engine_destroy(ember_engine* engine) {
  if (t_in_log_callback) return;  // documented: ignored from inside the log callback
  try {
    delete engine;
  } catch (...) {
  }
}

ember_status ember_engine_info(const ember_engine* engine, ember_engine_info_t* info) {
  return guarded([&] {
    require(engine != nullptr, "engine is NULL");
    require(info != nullptr, "info is NULL");
    const bool cuda = engine->backend_name.rfind("cuda", 0) == 0;
    ember_engine_info_t out;
    std::memset(&out, 0, sizeof out);
    out.size = sizeof out;
    out.device = cuda ? EMBER_DEVICE_CUDA : EMBER_DEVICE_CPU;
    // ember_engine_params has no GPU index: the plugin opens "cuda", GPU 0.
    out.gpu_index = cuda ? 0 : -1;
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
    const auto s = cache->engine->cache().stats();
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
    auto h = std::make_unique<ember_session>();
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
    h->session = std::make_shared<ember::Session>(engine->owner, p.n_ctx, system, p.priority, policy);
    *out_session = h.release();
  });
}

void ember_session_destroy(ember_session* session) {
  if (!session || t_in_log_callback) return;
  try {
    session->session->cancel_active();
    delete session;
  } catch (...) {
  }
}

ember_status ember_session_add_message(ember_session* session, const char* role, const char* content) {
  return guarded([&] {
    require(session != nullptr, "session is NULL");
    const std::string r = checked_text(role, "role");
    const std::string c = checked_text(content, "content");
    session->session->add_message(r, c);
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
    auto h = std::make_unique<ember_session>();
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
    fill_event(stream, event);
  });
}

ember_status ember_stream_set_callback(ember_stream* stream, ember_stream_callback callback, void* user_data) {
  return guarded([&] {
    require(stream != nullptr, "stream is NULL");
    require(callback != nullptr, "callback is NULL");
    std::shared_ptr<CallbackState> state = stream->callback;
    bool armed_here = false;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (!state->armed) state->armed = armed_here = true;
    }
    auto deliver = [callback, user_data, state](const ember::StreamEvent& e) {
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
      if (e.type == ember::StreamEvent::kError) t_last_error = e.error;
      const bool cancel = callback(&out, user_data) != 0;
      if (e.type != ember::StreamEvent::kText) {
        std::lock_guard<std::mutex> lock(state->mutex);
        state->done = true;
        state->cv.notify_all();
      }
      return cancel;
    };
    try {
      stream->stream->set_callback(deliver);
    } catch (...) {
      if (armed_here) {
        std::lock_guard<std::mutex> lock(state->mutex);
        state->armed = false;
        state->cv.notify_all();  // a concurrent ember_stream_wait may be waiting on it
      }
      throw;
    }
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
    wait_for_end(stream);
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
    write_sized(stats, out);
  });
}

void ember_stream_release(ember_stream* stream) {
  if (!stream || t_in_log_callback) return;
  try {
    stream->stream->cancel();  // an atomic flag: never blocks
    delete stream;             // the engine holds its own reference until the stream ends
  } catch (...) {
  }
}

void ember_stream_destroy(ember_stream* stream) {
  if (!stream || t_in_log_callback) return;
  try {
    stream->stream->cancel();
    wait_for_end(stream);
    delete stream;
  } catch (...) {
  }
}

}  // extern "C"
