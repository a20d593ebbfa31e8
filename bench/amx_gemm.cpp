// AMX prompt rows against the AVX-512 kernels (a plain program, not a test):
//
//   amx_gemm [--n 2048] [--k 2048] [--m 1,16,128,512] [--threads 1] [--time S]
//
// cpu::matmul on prompt rows (RowKind::kPrompt, batch-invariant) of random
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q6_K weights (N x K, packed as the engine packs them) and f32
// activations (M x K), with AMX prompt rows off (the AVX-512 VNNI kernels)
// and on (cpu::set_amx_prompt_rows, matmul_amx_avx512.cpp). Prints both
// times, the rates in int8 multiply-accumulates per second, the ratio, and
// the largest difference between the two results over the largest output
// (the two orders round differently). On CPUs without AMX-INT8 (or whose OS
// does not grant it) it says so and stops.
#include <omp.h>

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

std::vector<int64_t> parse_list(const std::string& v) {
  std::vector<int64_t> out;
  for (size_t pos = 0; pos < v.size();) {
    out.push_back(std::atoll(v.c_str() + pos));
    const size_t c = v.find(',', pos);
    pos = c == std::string::npos ? v.size() : c + 1;
  }
  return out;
}

// Random GGUF rows with small finite f16 scales (and mins).
std::vector<uint8_t> make_weight(DType t, int64_t N, int64_t K, std::mt19937& rng) {
  const size_t rb = row_bytes(t, K);
  const size_t blk = t == DType::Q4_K ? 144 : t == DType::Q6_K ? 210 : rb / static_cast<size_t>(K / 32);
  const size_t d_at = t == DType::Q6_K ? 208 : 0;  // where the block's f16 scale sits
  const int n_f16 = t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K ? 2 : 1;
  std::vector<uint8_t> w(static_cast<size_t>(N) * rb);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < w.size(); i += blk) {
    for (int f = 0; f < n_f16; ++f) {
      const uint16_t h = fp32_to_fp16(0.002f + 0.001f * static_cast<float>(rng() % 8));
      std::memcpy(&w[i + d_at + 2 * static_cast<size_t>(f)], &h, 2);
    }
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 2048, K = 2048;
  int threads = 1;
  std::vector<int64_t> ms = {1, 16, 128, 512};
  double min_time = 0.5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: amx_gemm [--n N] [--k K] [--m M,...] [--threads T] [--time S]\n");
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--n")
      N = std::atoll(v.c_str());
    else if (a == "--k")
      K = std::atoll(v.c_str());
    else if (a == "--m")
      ms = parse_list(v);
    else if (a == "--threads")
      threads = std::atoi(v.c_str());
    else if (a == "--time")
      min_time = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (N <= 0 || K <= 0 || K % 256 || threads <= 0) {
    std::fprintf(stderr, "N and the threads must be positive and K a positive multiple of 256\n");
    return 2;
  }
  if (!cpu::set_amx_prompt_rows(true) || !cpu::amx_prompt_rows(DType::Q8_0)) {
    std::printf("AMX-INT8 absent on this CPU, not granted by the OS, or the AVX-512 variant not active\n");
    return 0;
  }
  omp_set_num_threads(threads);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::printf("cpu isa=%s, %d thread(s), weights %lldx%lld, prompt rows\n", cpu::isa_name(), threads,
              static_cast<long long>(N), static_cast<long long>(K));
  std::printf("%-5s %5s %12s %12s %8s %14s %14s %10s\n", "type", "M", "avx512 us", "amx us", "ratio", "avx512 GMAC/s",
              "amx GMAC/s", "max diff");
  cpu::MatmulScratch scratch;
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    const std::vector<uint8_t> w = make_weight(t, N, K, rng);
    const size_t pb = cpu::packed_bytes(t, N, K);
    void* packed = pb ? std::aligned_alloc(64, (pb + 63) / 64 * 64) : nullptr;
    if (packed) cpu::pack_weight(cpu::WeightView{t, N, K, w.data()}, packed);
    const cpu::WeightView view{t, N, K, w.data(), packed};
    for (int64_t M : ms) {
      if (M <= 0) continue;
      std::vector<float> x(static_cast<size_t>(M * K));
      for (auto& v : x) v = nd(rng);
      std::vector<float> y_vnni(static_cast<size_t>(M * N)), y_amx(y_vnni.size());
      double tv = 0, ta = 0;
      for (bool amx : {false, true}) {
        cpu::set_amx_prompt_rows(amx);
        float* y = amx ? y_amx.data() : y_vnni.data();
        (amx ? ta : tv) = time_call(
            [&] { cpu::matmul(view, x.data(), M, y, scratch, cpu::MatmulPath::kRowInvariant, cpu::RowKind::kPrompt); },
            min_time);
      }
      float maxd = 0.f, maxy = 0.f;
      for (size_t i = 0; i < y_vnni.size(); ++i) {
        maxd = std::max(maxd, std::fabs(y_amx[i] - y_vnni[i]));
        maxy = std::max(maxy, std::fabs(y_vnni[i]));
      }
      const double macs = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
      std::printf("%-5s %5lld %12.1f %12.1f %7.2fx %14.1f %14.1f %10.2e\n", type_name(static_cast<uint32_t>(t)),
                  static_cast<long long>(M), tv * 1e6, ta * 1e6, tv / ta, macs / tv / 1e9, macs / ta / 1e9,
                  maxd / (maxy > 0 ? maxy : 1));
    }
    std::free(packed);
  }
  cpu::set_amx_prompt_rows(false);
  return 0;
}
