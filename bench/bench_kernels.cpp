// Kernel benchmark for cpu::matmul (a plain program, not a test).
//
//   bench_kernels [--threads N] [--isa scalar|avx2|avx512_vnni] [--hot]
//                 [--types q4_0,q8_0,...] [--gemm-m 512] [--no-gemm]
//                 [--sweep] [--sweep-m 1,2,4,...] [--sweep-shape NxK]
//                 [--sweep-rows prompt|decode]
//                 [--time S] [--cpu-time]
//
// For each weight type and SmolLM2-like shapes (NxK) it prints the M=1 GEMV
// (decode: a generated token's row, RowKind::kDecode) time, weight bandwidth (GB/s) and GFLOP/s, and the M=512 GEMM
// (prefill, oneDNN) GFLOP/s, on weights packed as the engine packs them
// (cpu::pack_weight, where the active variant reads packed rows). By default
// weights are "cold": enough copies are cycled through that they come from
// DRAM, not L3 (as in real decoding of a model larger than the cache); --hot
// reuses one copy.
// --sweep times decode vs prefill for M = 1..128 (used to pick decode_max_m);
// --sweep-rows decode times the rows as many sessions' decode rows
// (RowKind::kDecode: the K-quants' decode orders), not as a prompt's.
// --cpu-time measures process CPU time (all threads summed), which ignores
// time stolen by other processes on a shared machine; with --threads 1 it is
// the single-core kernel speed.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/types.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"

using namespace ember;
using namespace ember::cpu;

namespace {

bool g_cpu_time = false;  // --cpu-time: process CPU time instead of wall time

double now_s() {
  if (g_cpu_time) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Weights {
  DType type;
  int64_t N, K;
  size_t bytes;
  std::vector<std::vector<uint8_t>> copies;
  // Each copy packed for the kernels, as the engine packs its weights
  // (cpu::packed_bytes; empty where the active variant reads GGUF rows).
  std::vector<std::vector<uint8_t>> packed;
  size_t calls = 0;
  // The next copy, round robin (cold weights come from DRAM).
  WeightView next() {
    const size_t i = calls++ % copies.size();
    if (packed.empty()) return WeightView{type, N, K, copies[i].data()};
    uint8_t* p = packed[i].data();
    p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
    return WeightView{type, N, K, copies[i].data(), p, tiles};
  }
  bool tiles = false;  // packed in the tile layout (cpu::tile_layout), as the engine does
};

Weights make_weights(DType t, int64_t N, int64_t K, bool hot) {
  Weights w{t, N, K, row_bytes(t, K) * static_cast<size_t>(N), {}, {}, 0};
  const size_t target = size_t{160} << 20;  // well past the L3 (32 MiB here)
  size_t n = hot ? 1 : std::clamp<size_t>((target + w.bytes - 1) / w.bytes, 2, 512);
  std::mt19937 rng(1234);
  std::vector<uint8_t> base(w.bytes);
  // Random bytes, then make every f16/bf16 scale or value finite and small.
  for (auto& b : base) b = static_cast<uint8_t>(rng());
  const int64_t nb = K / 32;
  auto fix16 = [&](uint8_t* p, float v, bool bf) {
    const uint16_t h = bf ? fp32_to_bf16(v) : fp32_to_fp16(v);
    std::memcpy(p, &h, 2);
  };
  std::normal_distribution<float> nd(0.f, 0.02f);
  for (int64_t r = 0; r < N; ++r) {
    uint8_t* row = base.data() + row_bytes(t, K) * r;
    switch (t) {
      case DType::Q4_0:
        for (int64_t b = 0; b < nb; ++b) fix16(row + b * 18, 0.01f, false);
        break;
      case DType::Q4_1:
        for (int64_t b = 0; b < nb; ++b) {
          fix16(row + b * 20, 0.01f, false);
          fix16(row + b * 20 + 2, -0.08f, false);
        }
        break;
      case DType::Q8_0:
        for (int64_t b = 0; b < nb; ++b) fix16(row + b * 34, 0.001f, false);
        break;
      case DType::Q5_0:
      case DType::Q5_1:
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q6_K: {  // finite f16 scales (and mins) in every block
        const size_t bs = type_traits(t)->type_size;
        for (size_t o = 0; o + bs <= row_bytes(t, K); o += bs) {
          if (t == DType::Q6_K) {
            fix16(row + o + 208, 0.0005f, false);
          } else {
            fix16(row + o, t == DType::Q5_0 || t == DType::Q5_1 ? 0.005f : 0.001f, false);
            if (t != DType::Q5_0) fix16(row + o + 2, t == DType::Q5_1 ? -0.08f : 0.001f, false);
          }
        }
        break;
      }
      case DType::F16:
      case DType::BF16:
        for (int64_t k = 0; k < K; ++k) fix16(row + 2 * k, nd(rng), t == DType::BF16);
        break;
      case DType::F32:
        for (int64_t k = 0; k < K; ++k) {
          const float f = nd(rng);
          std::memcpy(row + 4 * k, &f, 4);
        }
        break;
      default: break;
    }
  }
  w.copies.assign(n, base);
  w.tiles = tile_layout(t) && packed_bytes(t, N, K, true) > 0;
  if (const size_t pb = packed_bytes(t, N, K, w.tiles); pb > 0) {
    for (auto& c : w.copies) {
      w.packed.emplace_back(pb + 64);
      uint8_t* p = w.packed.back().data();
      pack_weight(WeightView{t, N, K, c.data(), nullptr, w.tiles}, p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64);
    }
  }
  return w;
}

// Median time of one call over repeated batches (at least `min_time` s total).
template <typename F>
double time_call(F&& f, double min_time) {
  f();  // warm up (allocations, primitive creation)
  std::vector<double> samples;
  const double start = now_s();
  int iters = 1;
  while (true) {
    const double t0 = now_s();
    for (int i = 0; i < iters; ++i) f();
    const double dt = (now_s() - t0) / iters;
    samples.push_back(dt);
    if (dt * iters < 0.01) iters *= 2;
    if (now_s() - start > min_time && samples.size() >= 5) break;
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

const char* tname(DType t) { return type_name(static_cast<uint32_t>(t)); }

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  bool hot = false, gemm = true, sweep = false;
  RowKind sweep_rows = RowKind::kPrompt;
  int64_t gemm_m = 512;
  std::vector<int64_t> sweep_ms = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128};
  std::vector<std::pair<int64_t, int64_t>> sweep_shapes = {{1536, 576}, {4096, 4096}};
  double min_time = 0.3;
  std::vector<DType> types = {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::F16, DType::BF16, DType::F32};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      threads = std::atoi(next().c_str());
    else if (a == "--hot")
      hot = true;
    else if (a == "--cpu-time")
      g_cpu_time = true;
    else if (a == "--no-gemm")
      gemm = false;
    else if (a == "--gemm-m")
      gemm_m = std::atoll(next().c_str());
    else if (a == "--sweep")
      sweep = true;
    else if (a == "--sweep-m") {
      sweep_ms.clear();
      std::string v = next();
      for (size_t pos = 0; pos < v.size();) {
        sweep_ms.push_back(std::atoll(v.c_str() + pos));
        const size_t c = v.find(',', pos);
        pos = c == std::string::npos ? v.size() : c + 1;
      }
    } else if (a == "--sweep-shape") {
      const std::string v = next();
      const size_t xpos = v.find('x');
      if (xpos == std::string::npos) {
        std::fprintf(stderr, "--sweep-shape wants NxK\n");
        return 2;
      }
      sweep_shapes = {{std::atoll(v.c_str()), std::atoll(v.c_str() + xpos + 1)}};
    } else if (a == "--sweep-rows") {
      sweep_rows = next() == "decode" ? RowKind::kDecode : RowKind::kPrompt;
    } else if (a == "--time")
      min_time = std::atof(next().c_str());
    else if (a == "--isa") {
      const std::string v = next();
      force_isa(v == "scalar" ? Isa::kScalar : v == "avx2" ? Isa::kAvx2 : Isa::kAvx512Vnni);
    } else if (a == "--types") {
      types.clear();
      std::string v = next();
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t end = std::min(v.find(',', pos), v.size());
        const std::string n = v.substr(pos, end - pos);
        for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K,
                        DType::Q6_K, DType::F16, DType::BF16, DType::F32})
          if (n == tname(t)) types.push_back(t);
        pos = end + 1;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s (see the comment at the top of bench_kernels.cpp)\n", a.c_str());
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const CpuFeatures& f = cpu_features();
  std::printf(
      "cpu: %s avx2=%d avx512f=%d avx512vnni=%d avx512bf16=%d | isa=%s threads=%d weights=%s "
      "prefill=%s decode_max_m=%lld(quant)/%lld(float)\n",
      f.vendor, f.avx2, f.avx512f, f.avx512vnni, f.avx512bf16, isa_name(), threads, hot ? "hot" : "cold",
      prefill_precision_name(), static_cast<long long>(decode_max_m(DType::Q4_0)),
      static_cast<long long>(decode_max_m(DType::F32)));

  const std::pair<int64_t, int64_t> shapes[] = {{576, 576},   {1536, 576},  {576, 1536}, {49152, 576},
                                                {4096, 4096}, {8192, 2048}, {2048, 8192}};
  MatmulScratch scratch;

  if (sweep) {
    std::printf("\n%-5s %-11s %4s %12s %12s %s\n", "type", "NxK", "M", "decode us", "oneDNN us", "faster");
    for (DType t : types)
      for (const auto& shape : sweep_shapes) {
        const int64_t N = shape.first, K = shape.second;    // (clang 14: lambdas cannot capture structured bindings)
        if (K % type_traits(t)->block_size != 0) continue;  // K-quants: K % 256
        Weights w = make_weights(t, N, K, hot);
        for (int64_t M : sweep_ms) {
          std::vector<float> x(static_cast<size_t>(M * K), 0.5f), y(static_cast<size_t>(M * N));
          auto call = [&] {
            const WeightView v = w.next();
            matmul(v, x.data(), M, y.data(), scratch, MatmulPath::kAuto, sweep_rows);
          };
          set_decode_max_m(M);
          const double td = time_call(call, min_time);
          set_decode_max_m(0);
          const double tp = time_call(call, min_time);
          std::printf("%-5s %5lldx%-5lld %4lld %12.1f %12.1f %s\n", tname(t), (long long)N, (long long)K, (long long)M,
                      td * 1e6, tp * 1e6, td <= tp ? "decode" : "oneDNN");
        }
      }
    reset_decode_max_m();
    return 0;
  }

  std::printf("\n%-5s %-11s %10s %9s %9s", "type", "NxK", "M=1 us", "GB/s", "GFLOP/s");
  if (gemm) std::printf(" %12s %9s", ("M=" + std::to_string(gemm_m) + " ms").c_str(), "GFLOP/s");
  std::printf("\n");
  for (DType t : types) {
    for (const auto& shape : shapes) {
      const int64_t N = shape.first, K = shape.second;
      if (K % type_traits(t)->block_size != 0) continue;  // K-quants: K % 256
      Weights w = make_weights(t, N, K, hot);
      std::vector<float> x(static_cast<size_t>(K), 0.25f), y(static_cast<size_t>(N));
      const double t1 = time_call(
          [&] {
            const WeightView v = w.next();
            matmul(v, x.data(), 1, y.data(), scratch, MatmulPath::kAuto, RowKind::kDecode);
          },
          min_time);
      std::printf("%-5s %5lldx%-5lld %10.1f %9.1f %9.1f", tname(t), (long long)N, (long long)K, t1 * 1e6,
                  w.bytes / t1 / 1e9, 2.0 * N * K / t1 / 1e9);
      if (gemm) {
        std::vector<float> xm(static_cast<size_t>(gemm_m * K), 0.25f), ym(static_cast<size_t>(gemm_m * N));
        const double tm = time_call(
            [&] {
              const WeightView v = w.next();
              matmul(v, xm.data(), gemm_m, ym.data(), scratch);
            },
            min_time);
        std::printf(" %12.2f %9.1f", tm * 1e3, 2.0 * gemm_m * N * K / tm / 1e9);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}
