// Thin wrapper over oneDNN's matmul primitive for the prefill path:
//   y[M, N] (row stride ldy) = x[M, K] (row stride ldx) · W[N, K]^T (W row-major)
// in f32 or bf16 (inputs), always with f32 output. oneDNN itself lives in the
// plugin libember_dnnl.so (cpu/dnnl/), opened on the first call that asks for
// it: libember links no oneDNN. Where the plugin is missing (a build with
// EMBER_WITH_ONEDNN=OFF, or the file not beside libember.so nor in
// $EMBER_PLUGIN_DIR) available() is false and the matmuls never come here:
// every chunk runs on Ember's own kernels. Internal to ember::cpu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ember::cpu::dnnl_mm {

enum class Precision { kF32, kBf16 };

// Whether the oneDNN plugin is loaded (the first call looks for it, once).
bool available();
// Also look in dir for the plugin (tests linking the core statically; call
// before the first available()).
void add_plugin_dir(const std::string& dir);

// Per-caller oneDNN stream (streams are not thread-safe). Lives in MatmulScratch.
struct StreamState;
struct StreamHolder {
  StreamHolder();
  ~StreamHolder();
  StreamHolder(StreamHolder&&) noexcept;
  StreamHolder& operator=(StreamHolder&&) noexcept;
  std::unique_ptr<StreamState> state;
};

// Throws ember::Error(kInternal / kUnsupported) on oneDNN failures.
void matmul(Precision p, int64_t M, int64_t N, int64_t K, const void* x, int64_t ldx, const void* w, float* y,
            int64_t ldy, StreamHolder& stream);

// Can oneDNN build a bf16 matmul on this CPU at all? (probed once; oneDNN 2.6
// refuses bf16 on CPUs without AVX-512)
bool bf16_supported();
// Does the CPU have native bf16 dot products (AVX512_BF16 or AMX-BF16), i.e.
// is oneDNN's bf16 path expected to beat f32?
bool bf16_native();

size_t cache_entries();
void clear_cache();

}  // namespace ember::cpu::dnnl_mm
