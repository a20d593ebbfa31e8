// Backends that live in run-time plugins (today: the CUDA backend,
// libember_cuda.so). libember links no device library: when an engine asks
// for a device, load_backend_plugin() dlopen()s the plugin, checks its ABI and
// asks its factory for a Backend. Every failure (plugin absent, not loadable
// because e.g. libcublas is missing, entry point missing, ABI mismatch, no
// device, no driver) is reported as ember::Error(kUnsupported) with a message
// that says what is missing and how to fix it.
//
// Plugin search order for "cuda" / "cuda:N":
//   1. the directory holding libember.so (found with dladdr), or the
//      executable when the core is linked statically (tests, tools);
//   2. every directory in $EMBER_PLUGIN_DIR (':'-separated);
//   3. the dynamic loader's default path (LD_LIBRARY_PATH, libember's
//      RUNPATH, ld.so.cache, /usr/lib...).
// A plugin that is found but cannot be loaded stops the search (its loader
// error is the message). A loaded plugin is never unloaded.
//
// The plugin ABI: the library exports one C function (kCudaPluginEntry) that
// returns a pointer to a static ember_backend_plugin_v1. The loader reads
// abi_version first and nothing else unless it equals kBackendPluginAbi; the
// fingerprint then guards against a plugin built from different headers or
// with a different C++ ABI. The Backend object itself is C++ (same compiler,
// same libstdc++: plugins are built in the same tree as libember), its
// methods throw ember::Error like the CPU backend's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"

namespace ember {

// ---------------------------------------------------------------------------
// Optional capabilities a plugin backend offers beyond Backend. The core may
// ignore them; they are reached through LoadedBackend::extras.

// One row of device sampling (same meaning as SamplingParams in
// core/sampling/sampler.h). `uniform` in [0, 1) is the draw: the caller
// takes it from its own RNG so that the device and the host sampler pick the
// same token from the same logits and draw.
struct DeviceSamplingParams {
  float temperature = 0.8f;  // <= 0: greedy (argmax; `uniform` unused)
  int32_t top_k = 40;        // 1..kMaxDeviceTopK; <= 0 or larger: kMaxDeviceTopK (see docs/CUDA.md)
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  double uniform = 0.0;
};

// Repetition penalties for one row, llama.cpp semantics (as Sampler): the
// distinct tokens of the penalty window and how often each occurs.
struct DevicePenalties {
  const int32_t* tokens = nullptr;  // host, n entries
  const int32_t* counts = nullptr;  // host, n entries (>= 1)
  int32_t n = 0;
  float repeat = 1.0f;
  float frequency = 0.0f;
  float presence = 0.0f;
};

struct GraphStats {
  uint64_t captures = 0;  // graphs captured and instantiated
  uint64_t updates = 0;   // captured again and updated in place (cudaGraphExecUpdate)
  uint64_t replays = 0;   // steps that replayed a graph unchanged
  uint64_t eager = 0;     // steps recorded but run without a graph (e.g. the arena overflowed)
};

class BackendExtras {
 public:
  static constexpr int32_t kMaxDeviceTopK = 1024;

  virtual ~BackendExtras() = default;
  virtual std::string device_description() const = 0;
  // The engine's batch_invariant (see make_cpu_backend), default true: every
  // matmul row is computed as for a single row (the GEMV path, also for
  // prefill) and attention splits a row's cache at fixed 512-slot
  // boundaries, so a sequence's output never depends on batching, chunking
  // or prefix-cache hits. false: cuBLAS for prefill and split-K sized to the
  // batch (faster prefill; decode rows stay row-invariant either way).
  virtual void set_batch_invariant(bool on) = 0;
  // Waits until every queued operation finished (timing, tests).
  virtual void synchronize() = 0;

  // Greedy: out_tokens[r] = argmax of row r (the first maximum, as
  // std::max_element). logits: a device buffer from alloc(), [rows][vocab].
  // out_tokens: host.
  virtual void sample_argmax(const float* logits, int32_t rows, int32_t vocab, int32_t* out_tokens) = 0;
  // Penalties (optional, `penalties` may be nullptr, else rows entries; the
  // logits are modified in place), then temperature / top-k / top-p / min-p
  // and the draw, one row per params entry. out_tokens: host.
  virtual void sample(float* logits, int32_t rows, int32_t vocab, const DeviceSamplingParams* params,
                      const DevicePenalties* penalties, int32_t* out_tokens) = 0;

  // CUDA graphs for decode steps. From graph_begin on, the backend records
  // the ops (host metadata is staged, nothing is launched) until graph_end or
  // until an op that cannot be recorded (download, upload, upload_weight,
  // kv_init, synchronize, sampling, free_buffer after recorded ops) ends the
  // region implicitly, so a caller may simply call graph_begin at the start of
  // a step and let the logits download end it. Ending a region uploads the
  // staged metadata in one copy and replays the graph cached under `key` when
  // the recorded ops are identical to the captured ones (pointers and launch
  // shapes included), else captures (or updates) it. Results are always those
  // of eager execution: `key` only picks the cache slot, so a wrong key costs
  // a capture, never a wrong result. graph_abort ends a region without a
  // graph (the recorded ops still run); an exception inside a region does
  // the same before it propagates. Worth it for decode steps (same shapes
  // step after step); prefill shapes rarely repeat.
  virtual void graph_begin(uint64_t key) = 0;
  virtual void graph_end() = 0;
  virtual void graph_abort() = 0;
  virtual void graph_clear() = 0;  // drops every cached graph
  virtual GraphStats graph_stats() const = 0;
};

// ---------------------------------------------------------------------------
// The plugin ABI.

// Bump on any change to Backend, BackendExtras or the structs they take.
inline constexpr uint32_t kBackendPluginAbi =
    8;  // 2: kv_rope_shift, kv_read/write_block, AttentionSeq holes; 3: Backend::limits;
        // 4: rope_ext, geglu, scale, add_bias, AttentionParams::window, kv_rope_shift_layers;
        // 5: AttentionParams::tree_from/tree_begin/tree_slots (token trees);
        // 6: supports_kv_views, kv_store_view, kv_rope_shift_view; 7: lora (LoraTerm);
        // 8: KvGeometry::dtype, supports_kv_dtype

// A hash of what both sides must agree on: the sizes of the interface
// structs and the C++ library ABI. Computed from the headers each side was
// built with.
constexpr uint32_t backend_interface_fingerprint() {
  uint32_t h = 2166136261u;
  const uint32_t parts[] = {
      static_cast<uint32_t>(sizeof(WeightDesc)),
      static_cast<uint32_t>(sizeof(KvGeometry)),
      static_cast<uint32_t>(sizeof(AttentionSeq)),
      static_cast<uint32_t>(sizeof(AttentionParams)),
      static_cast<uint32_t>(sizeof(DeviceSamplingParams)),
      static_cast<uint32_t>(sizeof(DevicePenalties)),
      static_cast<uint32_t>(sizeof(GraphStats)),
      static_cast<uint32_t>(sizeof(LoraTerm)),
      static_cast<uint32_t>(sizeof(std::string)),
      static_cast<uint32_t>(sizeof(void*)),
#ifdef _GLIBCXX_USE_CXX11_ABI
      static_cast<uint32_t>(_GLIBCXX_USE_CXX11_ABI) + 100u,
#endif
#ifdef __GLIBCXX__
      static_cast<uint32_t>(_GLIBCXX_RELEASE),
#endif
  };
  for (uint32_t p : parts) h = (h ^ p) * 16777619u;
  return h;
}

}  // namespace ember

extern "C" {

// What the plugin's entry point returns (a pointer to static storage).
typedef struct ember_backend_plugin_v1 {
  uint32_t abi_version;    // must be the first field: ember::kBackendPluginAbi
  uint32_t fingerprint;    // ember::backend_interface_fingerprint()
  const char* name;        // "cuda"
  const char* build_info;  // e.g. "CUDA 13.0, sm_80 sm_89 sm_90 + compute_90 PTX"
  // Creates a backend for `device` ("cuda", "cuda:N"). Returns 0 and sets
  // *out_backend (owned by the caller, deleted through its virtual
  // destructor) and *out_extras (same object, or nullptr); otherwise returns
  // an ember::StatusCode value and writes a NUL-terminated message into
  // err[0, err_size). Never throws.
  int32_t (*create)(const char* device, int32_t n_threads, ember::Backend** out_backend,
                    ember::BackendExtras** out_extras, char* err, size_t err_size);
} ember_backend_plugin_v1;

typedef const ember_backend_plugin_v1* (*ember_backend_plugin_entry_fn)(void);

}  // extern "C"

namespace ember {

inline constexpr const char* kCudaPluginEntry = "ember_cuda_plugin_v1";
inline constexpr const char* kCudaPluginFile = "libember_cuda.so";

struct LoadedBackend {
  std::unique_ptr<Backend> backend;
  BackendExtras* extras = nullptr;  // the same object as backend, or nullptr
  std::string library;              // path (or name) the plugin was loaded from
  std::string build_info;
};

// Where to look for a plugin file (the defaults are the search order above).
struct PluginSearch {
  std::string file_name = kCudaPluginFile;
  std::string entry_point = kCudaPluginEntry;
  std::vector<std::string> dirs;  // searched first, in order (tests)
  bool next_to_libember = true;
  bool env_dir = true;       // $EMBER_PLUGIN_DIR
  bool default_path = true;  // dlopen(file_name) through the loader's search path
};

// The files to try for a plugin, in search order (dirs, libember's
// directory, $EMBER_PLUGIN_DIR: those that exist; then the bare file name
// for the loader's path when default_path); *searched says where it looked.
std::vector<std::string> plugin_candidates(const PluginSearch& search, std::string* searched);

// What probe_backend_plugin found. No backend is created, no device opened.
struct PluginProbe {
  enum class State { kAbsent, kLoadable, kBroken } state = State::kAbsent;
  std::string path;     // the library found ("" when absent)
  std::string message;  // why it is absent or broken ("" when loadable)
};
// Searches like open_backend_plugin, loads the library the way it would
// (never unloaded) and checks its entry point, ABI and fingerprint.
PluginProbe probe_backend_plugin(const PluginSearch& search = {});

// The device names a plugin serves: "cuda" or "cuda:N". Throws
// kUnsupported for other names, kInvalidArgument for a malformed index.
void check_plugin_device_name(const std::string& device);

// Loads the plugin for `device` and creates a backend. Throws ember::Error.
std::unique_ptr<Backend> load_backend_plugin(const std::string& device, int n_threads);
LoadedBackend open_backend_plugin(const std::string& device, int n_threads, const PluginSearch& search = {});
// Loads exactly the library at `path` (no search).
LoadedBackend open_backend_plugin_file(const std::string& path, const std::string& device, int n_threads,
                                       const std::string& entry_point = kCudaPluginEntry);

}  // namespace ember
