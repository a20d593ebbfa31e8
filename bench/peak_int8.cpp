// Peak int8 dot-product rates of one core (a plain program, not a test):
//
//   peak_int8 [--seconds S]
//
// What bounds the quantized kernels' compute (prompt rows, batched decode,
// verification rows): u8 x s8 multiply-accumulates per second of
//   * AVX-512 VNNI vpdpbusd on zmm (what the avx512_vnni kernels use),
//   * VNNI vpdpbusd on ymm,
//   * AMX tdpbusd on full 16 x 64-byte tiles (Sapphire Rapids and later),
// and f32 FMA on zmm for scale. Each loop keeps 8 (VNNI) or 4 (AMX)
// independent accumulators so that throughput, not latency, is measured;
// units the CPU lacks (or that the OS does not grant: AMX needs
// arch_prctl(ARCH_REQ_XCOMP_PERM)) are reported as absent. One thread.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu/cpu_features.h"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

volatile int g_seed = 3;  // keeps the inputs opaque to the compiler

// Runs body(iters) with growing iteration counts until it takes `seconds`;
// returns operations per second (ops_per_iter each).
template <typename F>
double rate(F body, double ops_per_iter, double seconds) {
  for (long iters = 1 << 16;; iters *= 2) {
    const double t0 = now_s();
    body(iters);
    const double t = now_s() - t0;
    if (t >= seconds) return ops_per_iter * static_cast<double>(iters) / t;
  }
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) int vnni_zmm(long iters) {
  const __m512i x = _mm512_set1_epi8(static_cast<char>(g_seed)), y = _mm512_set1_epi8(static_cast<char>(g_seed + 2));
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (long i = 0; i < iters; ++i) {
    a0 = _mm512_dpbusd_epi32(a0, x, y);
    a1 = _mm512_dpbusd_epi32(a1, x, y);
    a2 = _mm512_dpbusd_epi32(a2, x, y);
    a3 = _mm512_dpbusd_epi32(a3, x, y);
    a4 = _mm512_dpbusd_epi32(a4, x, y);
    a5 = _mm512_dpbusd_epi32(a5, x, y);
    a6 = _mm512_dpbusd_epi32(a6, x, y);
    a7 = _mm512_dpbusd_epi32(a7, x, y);
  }
  const __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                     _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
  alignas(64) int32_t v[16];
  _mm512_store_si512(v, s);
  return v[0];
}

__attribute__((target("avx512f,avx512vl,avx512vnni"))) int vnni_ymm(long iters) {
  const __m256i x = _mm256_set1_epi8(static_cast<char>(g_seed)), y = _mm256_set1_epi8(static_cast<char>(g_seed + 2));
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (long i = 0; i < iters; ++i) {
    a0 = _mm256_dpbusd_epi32(a0, x, y);
    a1 = _mm256_dpbusd_epi32(a1, x, y);
    a2 = _mm256_dpbusd_epi32(a2, x, y);
    a3 = _mm256_dpbusd_epi32(a3, x, y);
    a4 = _mm256_dpbusd_epi32(a4, x, y);
    a5 = _mm256_dpbusd_epi32(a5, x, y);
    a6 = _mm256_dpbusd_epi32(a6, x, y);
    a7 = _mm256_dpbusd_epi32(a7, x, y);
  }
  alignas(32) int32_t v[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v),
                     _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                      _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7))));
  return v[0];
}

__attribute__((target("avx512f"))) float fma_zmm(long iters) {
  const __m512 x = _mm512_set1_ps(0.999f + 1e-6f * static_cast<float>(g_seed)), y = _mm512_set1_ps(1e-3f);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (long i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, x, y);
    a1 = _mm512_fmadd_ps(a1, x, y);
    a2 = _mm512_fmadd_ps(a2, x, y);
    a3 = _mm512_fmadd_ps(a3, x, y);
    a4 = _mm512_fmadd_ps(a4, x, y);
    a5 = _mm512_fmadd_ps(a5, x, y);
    a6 = _mm512_fmadd_ps(a6, x, y);
    a7 = _mm512_fmadd_ps(a7, x, y);
  }
  alignas(64) float v[16];
  _mm512_store_ps(v, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                   _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))));
  return v[0];
}

bool amx_granted() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Four accumulators (tiles 0..3), two A and two B operands (tiles 4..7): 16 x 16 x 64 MACs per tdpbusd.
__attribute__((target("amx-tile,amx-int8"))) int amx(long iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  alignas(64) static int8_t a[16 * 64], b[16 * 64];
  alignas(64) static int32_t c[16 * 16];
  std::memset(a, g_seed, sizeof a);
  std::memset(b, 1, sizeof b);
  _tile_loadconfig(&cfg);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_loadd(6, a, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 4, 5);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 6, 5);
    _tile_dpbusd(3, 6, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: peak_int8 [--seconds S]\n");
      return 2;
    }
  }
  const ember::cpu::CpuFeatures& f = ember::cpu::cpu_features();
  std::printf("cpu: %s avx512f=%d avx512vnni=%d amx_tile=%d amx_int8=%d (one core)\n", f.vendor, f.avx512f,
              f.avx512vnni, f.amx_tile, f.amx_int8);
  volatile long sink = 0;
  if (f.avx512f) {
    const double r = rate([&](long n) { sink = sink + static_cast<long>(fma_zmm(n)); }, 8.0, seconds);
    std::printf("f32 fma zmm        %8.2f G instr/s  %8.1f GFLOP/s\n", r / 1e9, r * 32 / 1e9);
  }
  double vnni = 0;
  if (f.avx512vnni) {
    vnni = rate([&](long n) { sink = sink + vnni_zmm(n); }, 8.0, seconds);
    std::printf("vpdpbusd zmm       %8.2f G instr/s  %8.1f G int8 MAC/s\n", vnni / 1e9, vnni * 64 / 1e9);
    const double r = rate([&](long n) { sink = sink + vnni_ymm(n); }, 8.0, seconds);
    std::printf("vpdpbusd ymm       %8.2f G instr/s  %8.1f G int8 MAC/s\n", r / 1e9, r * 32 / 1e9);
  } else {
    std::printf("vpdpbusd           absent\n");
  }
  if (f.amx_tile && f.amx_int8 && amx_granted()) {
    const double r = rate([&](long n) { sink = sink + amx(n); }, 4.0, seconds);
    std::printf("tdpbusd 16x16x64   %8.3f G instr/s  %8.1f G int8 MAC/s", r / 1e9, r * 16384 / 1e9);
    if (vnni > 0) std::printf("  (%.1fx vpdpbusd zmm)", r * 16384 / (vnni * 64));
    std::printf("\n");
  } else {
    std::printf("tdpbusd            absent%s\n", f.amx_tile && f.amx_int8 ? " (not granted by the OS)" : "");
  }
  return 0;
}
