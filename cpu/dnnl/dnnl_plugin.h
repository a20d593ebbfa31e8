// The interface between libember and libember_dnnl.so, the plugin that links
// oneDNN (cpu/dnnl_matmul.h loads it on first use). libember itself links no
// oneDNN: a host that never turns batch invariance off never maps libdnnl
// (~2.3 MB resident, and a dependency every host would otherwise need).
// A C table, versioned: the plugin and libember are built from one tree.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct ember_dnnl_table_v1 {
  uint32_t abi_version;  // kDnnlPluginAbi
  // y[M, N] (row stride ldy) = x[M, K] (row stride ldx) · W[N, K]^T, inputs
  // f32 (bf16 = 0) or bf16 (bf16 = 1). *stream: the caller's oneDNN stream,
  // created on first use (free it with free_stream). 0, or an
  // ember::StatusCode with a message in err (NUL-terminated, err_size bytes).
  int32_t (*matmul)(int32_t bf16, int64_t M, int64_t N, int64_t K, const void* x, int64_t ldx, const void* w, float* y,
                    int64_t ldy, void** stream, char* err, size_t err_size);
  void (*free_stream)(void* stream);
  int32_t (*bf16_supported)(void);  // can oneDNN build a bf16 matmul on this CPU (1 / 0)
  size_t (*cache_entries)(void);    // primitives cached by shape
  void (*clear_cache)(void);
};

typedef const ember_dnnl_table_v1* (*ember_dnnl_plugin_entry_fn)(void);

}  // extern "C"

namespace ember::cpu::dnnl_mm {

inline constexpr uint32_t kDnnlPluginAbi = 1;
inline constexpr const char* kDnnlPluginFile = "libember_dnnl.so";
inline constexpr const char* kDnnlPluginEntry = "ember_dnnl_plugin_v1";

}  // namespace ember::cpu::dnnl_mm
