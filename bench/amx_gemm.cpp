// An AMX int8 GEMM with per-block scales, against the engine's kernel (a
// plain program, not a test):
//
//   amx_gemm [--n 2048] [--k 2048] [--m 16,128] [--time S]
//
// What a Q8_0 matmul could run at on CPUs with AMX (Sapphire Rapids and
// later). Both sides get the same random Q8_0 weights (N x K) and f32
// activations (M x K) on one thread:
//   * engine: cpu::matmul (prompt rows, batch-invariant, on the packed copy
//     where the active kernels read one);
//   * amx: activations quantized per 32-value block (the engine's formula),
//     then per 16 x 16 output tile and block one tdpbssd into an int32 tile
//     (the exact block sums) and one float step per output
//     (acc = fma(float(sum), dw * dx, acc), blocks in order), two tiles in
//     flight. Weights are laid out once as AMX B tiles (8 x 64 bytes per
//     block and 16 rows) with their scales as f32.
// It prints both times (amx: quantizing the activations, in plain scalar
// code here, and the kernel), the ratio, the kernel's rate alone, whether the AMX result equals a scalar
// reference of the same summation order to the bit, and its largest
// difference from the engine's result (another order: rounding only).
// N and M must be multiples of 16, K of 32.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/types.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"

// GCC 12's AVX-512 headers start some conversions from an undefined vector,
// which -Wmaybe-uninitialized reports inside functions with a target
// attribute (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

using namespace ember;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <typename F>
double time_call(F f, double min_time) {
  f();  // warm-up
  int reps = 0;
  const double t0 = now_s();
  double t = 0;
  do {
    f();
    ++reps;
    t = now_s() - t0;
  } while (t < min_time);
  return t / reps;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The weights as AMX B tiles: for n-tile t and block b, 8 rows of 64 bytes,
// byte 4n + i of row r = w[16t + n][32b + 4r + i]; scales dw[t][b][n].
struct AmxWeights {
  int64_t N = 0, K = 0;
  std::vector<int8_t> tiles;
  std::vector<float> dw;
};

AmxWeights amx_layout(const std::vector<uint8_t>& q8, int64_t N, int64_t K) {
  const int64_t nb = K / 32, nt = N / 16;
  AmxWeights a{N, K, std::vector<int8_t>(static_cast<size_t>(nt * nb * 512)),
               std::vector<float>(static_cast<size_t>(nt * nb * 16))};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = q8.data() + static_cast<size_t>(n * nb + b) * 34;
      uint16_t h;
      std::memcpy(&h, blk, 2);
      const int64_t t = n / 16, c = n % 16;
      a.dw[static_cast<size_t>((t * nb + b) * 16 + c)] = fp16_to_fp32(h);
      for (int r = 0; r < 8; ++r)
        for (int i = 0; i < 4; ++i)
          a.tiles[static_cast<size_t>(((t * nb + b) * 8 + r) * 64 + 4 * c + i)] =
              static_cast<int8_t>(blk[2 + 4 * r + i]);
    }
  return a;
}

// Per 32-value block: q = round(x * 127 / amax), d = amax / 127 (the engine's activation formula).
void quantize_acts(const float* x, int64_t M, int64_t K, int8_t* q, float* d) {
  const int64_t nb = K / 32;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + 32 * b;
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float id = amax != 0.f ? 127.f / amax : 0.f;
      for (int i = 0; i < 32; ++i) q[m * K + 32 * b + i] = static_cast<int8_t>(std::nearbyint(xb[i] * id));
      d[m * nb + b] = amax / 127.f;
    }
}

// One block's float step for a 16 x 16 tile: acc[m] += float(c[m]) * (dw * dx[m]).
__attribute__((target("avx512f,avx512dq"))) inline void step(__m512* acc, const float* dw, const float* dx,
                                                             int64_t dx_stride, const int32_t* c) {
  const __m512 dwv = _mm512_loadu_ps(dw);
  for (int m = 0; m < 16; ++m) {
    const __m512 s = _mm512_mul_ps(dwv, _mm512_set1_ps(dx[m * dx_stride]));
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * m)), s, acc[m]);
  }
}

// y[M x N] = the block-scaled product, blocks summed in order per output.
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq"))) void amx_matmul(const AmxWeights& w,
                                                                                                const int8_t* xq,
                                                                                                const float* dx,
                                                                                                int64_t M, float* y) {
  const int64_t K = w.K, nb = K / 32, nt = w.N / 16;
  TileConfig cfg;
  for (int c : {0, 3}) {  // C tiles: 16 x 16 int32
    cfg.rows[c] = 16;
    cfg.colsb[c] = 64;
  }
  for (int a : {1, 4}) {  // A tiles: 16 activation rows x one block
    cfg.rows[a] = 16;
    cfg.colsb[a] = 32;
  }
  for (int b : {2, 5}) {  // B tiles: a block of 16 weight rows
    cfg.rows[b] = 8;
    cfg.colsb[b] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) int32_t cbuf[2][256];
  for (int64_t t = 0; t < nt; ++t)
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
      __m512 acc[16];
      for (auto& v : acc) v = _mm512_setzero_ps();
      int64_t b = 0;
      for (; b + 2 <= nb; b += 2) {
        _tile_zero(0);
        _tile_loadd(1, xq + m0 * K + 32 * b, K);
        _tile_loadd(2, w.tiles.data() + (t * nb + b) * 512, 64);
        _tile_dpbssd(0, 1, 2);
        _tile_zero(3);
        _tile_loadd(4, xq + m0 * K + 32 * (b + 1), K);
        _tile_loadd(5, w.tiles.data() + (t * nb + b + 1) * 512, 64);
        _tile_dpbssd(3, 4, 5);
        _tile_stored(0, cbuf[0], 64);
        step(acc, w.dw.data() + (t * nb + b) * 16, dx + m0 * nb + b, nb, cbuf[0]);
        _tile_stored(3, cbuf[1], 64);
        step(acc, w.dw.data() + (t * nb + b + 1) * 16, dx + m0 * nb + b + 1, nb, cbuf[1]);
      }
      if (b < nb) {
        _tile_zero(0);
        _tile_loadd(1, xq + m0 * K + 32 * b, K);
        _tile_loadd(2, w.tiles.data() + (t * nb + b) * 512, 64);
        _tile_dpbssd(0, 1, 2);
        _tile_stored(0, cbuf[0], 64);
        step(acc, w.dw.data() + (t * nb + b) * 16, dx + m0 * nb + b, nb, cbuf[0]);
      }
      for (int m = 0; m < 16; ++m) _mm512_storeu_ps(y + (m0 + m) * w.N + 16 * t, acc[m]);
    }
  _tile_release();
}

// The same order in scalar code.
void reference(const std::vector<uint8_t>& q8, int64_t N, int64_t K, const int8_t* xq, const float* dx, int64_t M,
               float* y) {
  const int64_t nb = K / 32;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = q8.data() + static_cast<size_t>(n * nb + b) * 34;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        int32_t s = 0;
        for (int i = 0; i < 32; ++i)
          s += static_cast<int32_t>(static_cast<int8_t>(blk[2 + i])) * xq[m * K + 32 * b + i];
        acc = std::fma(static_cast<float>(s), fp16_to_fp32(h) * dx[m * nb + b], acc);
      }
      y[m * N + n] = acc;
    }
}

bool amx_usable() {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return f.amx_tile && f.amx_int8 && f.avx512f && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

std::vector<int64_t> parse_list(const std::string& v) {
  std::vector<int64_t> out;
  for (size_t pos = 0; pos < v.size();) {
    out.push_back(std::atoll(v.c_str() + pos));
    const size_t c = v.find(',', pos);
    pos = c == std::string::npos ? v.size() : c + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 2048, K = 2048;
  std::vector<int64_t> ms = {16, 128};
  double min_time = 0.5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: amx_gemm [--n N] [--k K] [--m M,...] [--time S]\n");
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--n")
      N = std::atoll(v.c_str());
    else if (a == "--k")
      K = std::atoll(v.c_str());
    else if (a == "--m")
      ms = parse_list(v);
    else if (a == "--time")
      min_time = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (N <= 0 || N % 16 || K <= 0 || K % 32) {
    std::fprintf(stderr, "N must be a multiple of 16 and K of 32\n");
    return 2;
  }
  if (!amx_usable()) {
    std::printf("AMX int8 absent on this CPU or not granted by the OS: nothing to compare\n");
    return 0;
  }
  omp_set_num_threads(1);
  std::mt19937 rng(7);
  const int64_t nb = K / 32;
  std::vector<uint8_t> q8(static_cast<size_t>(N * nb * 34));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t i = 0; i < N * nb; ++i) {
    uint8_t* blk = q8.data() + i * 34;
    const uint16_t h = fp32_to_fp16(0.002f + 0.001f * static_cast<float>(rng() % 8));
    std::memcpy(blk, &h, 2);
    for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(int(rng() % 255) - 127));
  }
  const AmxWeights aw = amx_layout(q8, N, K);
  const size_t pb = cpu::packed_bytes(DType::Q8_0, N, K);
  void* packed = pb ? std::aligned_alloc(64, (pb + 63) / 64 * 64) : nullptr;
  if (packed) cpu::pack_weight(cpu::WeightView{DType::Q8_0, N, K, q8.data()}, packed);
  const cpu::WeightView view{DType::Q8_0, N, K, q8.data(), packed};
  std::printf("cpu isa=%s, one thread, Q8_0 weights %lldx%lld\n", cpu::isa_name(), static_cast<long long>(N),
              static_cast<long long>(K));
  std::printf("%5s %12s %12s %8s %14s %14s %14s %10s %10s\n", "M", "engine us", "amx us", "ratio", "engine GMAC/s",
              "amx GMAC/s", "kernel GMAC/s", "same bits", "max diff");
  cpu::MatmulScratch scratch;
  for (int64_t M : ms) {
    if (M <= 0 || M % 16) {
      std::fprintf(stderr, "M=%lld: must be a multiple of 16\n", static_cast<long long>(M));
      return 2;
    }
    std::vector<float> x(static_cast<size_t>(M * K));
    for (auto& v : x) v = nd(rng);
    std::vector<float> ye(static_cast<size_t>(M * N)), ya(ye.size()), yr(ye.size());
    std::vector<int8_t> xq(static_cast<size_t>(M * K));
    std::vector<float> dx(static_cast<size_t>(M * nb));
    const double te = time_call(
        [&] {
          cpu::matmul(view, x.data(), M, ye.data(), scratch, cpu::MatmulPath::kRowInvariant, cpu::RowKind::kPrompt);
        },
        min_time);
    const double ta = time_call(
        [&] {
          quantize_acts(x.data(), M, K, xq.data(), dx.data());
          amx_matmul(aw, xq.data(), dx.data(), M, ya.data());
        },
        min_time);
    // The AMX kernel alone (this program's scalar quantizer is not the engine's vectorized one).
    const double tk = time_call([&] { amx_matmul(aw, xq.data(), dx.data(), M, ya.data()); }, min_time);
    reference(q8, N, K, xq.data(), dx.data(), M, yr.data());
    float maxd = 0.f, maxy = 0.f;
    for (size_t i = 0; i < ye.size(); ++i) {
      maxd = std::max(maxd, std::fabs(ya[i] - ye[i]));
      maxy = std::max(maxy, std::fabs(ye[i]));
    }
    const double macs = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    std::printf("%5lld %12.1f %12.1f %7.2fx %14.1f %14.1f %14.1f %10s %10.2e\n", static_cast<long long>(M), te * 1e6,
                ta * 1e6, te / ta, macs / te / 1e9, macs / ta / 1e9, macs / tk / 1e9,
                std::memcmp(ya.data(), yr.data(), ya.size() * 4) == 0 ? "yes" : "NO", maxd / (maxy > 0 ? maxy : 1));
  }
  std::free(packed);
  return 0;
}
