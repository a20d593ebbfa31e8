// Backend registry: how the core gets a Backend without linking any device
// library. In-process backends register a factory by name: the CPU backend
// registers itself as "cpu" when the program or library that links it loads
// (cpu/cpu_backend.h), so libember, the tools and the tests all find it here;
// "cuda" and "cuda:N" are loaded from the plugin (core/backend/plugin.h);
// "auto" takes CUDA when its plugin loads and a device answers, else "cpu".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/backend/backend.h"

namespace ember {

class BackendExtras;

struct BackendOptions {
  int32_t n_threads = 0;        // 0: every core
  bool batch_invariant = true;  // see EngineParams::batch_invariant
  bool prompt_tiles = true;     // CPU: AMX prompt rows where the CPU has them (cpu::RowKind)
};

using BackendFactory = std::unique_ptr<Backend> (*)(const BackendOptions& options);

// What an in-process backend says about itself without being created
// (ember_capabilities): the kernel variant it runs now.
struct BackendInfo {
  int32_t isa = 0;            // the CPU backend: EMBER_ISA_* (cpu::Isa)
  const char* isa_name = "";  // "scalar", "avx2", "avx512_vnni"; static
};
using BackendInfoFn = BackendInfo (*)();

// Registers (or replaces) an in-process backend. Thread-safe.
void register_backend(const std::string& name, BackendFactory factory, BackendInfoFn info = nullptr);

// The registered backend's info, asked now; throws ember::Error
// (kUnsupported) when `name` is not registered in this build. A backend
// registered without an info function gives BackendInfo{}.
BackendInfo backend_info(const std::string& name);

struct CreatedBackend {
  std::unique_ptr<Backend> backend;
  BackendExtras* extras = nullptr;  // plugin capabilities (same object), or nullptr
  std::string device;               // what was chosen: "cpu", "cuda", "cuda:1", ...
};

// Throws ember::Error: kUnsupported when the device is not available (the
// message says what is missing), kInvalidArgument for an unknown name.
// The environment variable EMBER_FORCE_DEVICE (cpu, cuda, cuda:N, auto), when
// set, replaces `device` for every backend the process creates: it runs an
// existing program or test suite on another device (tools/gpu_check.sh).
CreatedBackend create_backend(const std::string& device, const BackendOptions& options);

// Throws ember::Error(kUnsupported) when a model of this shape exceeds what
// the backend's kernels support (BackendLimits).
void check_backend_limits(const Backend& backend, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads);

}  // namespace ember
