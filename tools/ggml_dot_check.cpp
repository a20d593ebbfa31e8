// ggml_dot_check: Ember's quantized decode kernels against llama.cpp's own
// CPU dot products, bit for bit.
//
// Loads libggml-cpu.so (the llama.cpp build of the reference venv,
// tools/setup_reference.sh) with dlopen, and for each weight type quantizes
// the same activations with ggml's from_float (its vec_dot_type: Q8_0, Q8_1,
// Q8_K) and calls ggml's vec_dot on the same weight rows. Ember computes the
// same outputs with cpu::matmul on the decode path, on every ISA variant
// this CPU can run. Prints per type and variant the number of outputs whose
// f32 bits differ; exit 0 when all are identical, 1 otherwise, 77 when the
// library cannot be loaded. The AVX-512 variant's dot products sum four
// blocks per register, another order than llama.cpp's (EMBER_CPU_ISA=avx2
// gives llama.cpp's): their differences are printed, not counted.
//
//   ggml_dot_check [--gguf MODEL.gguf] [path/to/libggml-cpu.so]
//   (default: $EMBER_GGML_CPU_LIB, else the reference venv's copy)
// --gguf: the same checks on every quantized 2-D tensor of a real file (up to
// 64 rows each, 3 random activation rows), e.g. the Gemma 3 270M Q4_K_M.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/gguf/gguf.h"
#include "core/tensor/types.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"

namespace {

using namespace ember;

// ggml-cpu.h's declarations (C ABI).
using ggml_from_float_t = void (*)(const float* x, void* y, int64_t k);
using ggml_vec_dot_t = void (*)(int n, float* s, size_t bs, const void* x, size_t bx, const void* y, size_t by,
                                int nrc);
struct ggml_type_traits_cpu {
  ggml_from_float_t from_float;
  ggml_vec_dot_t vec_dot;
  int vec_dot_type;
  int64_t nrows;
};
using get_traits_t = const ggml_type_traits_cpu* (*)(int type);
struct ggml_type_traits {  // ggml.h
  const char* type_name;
  int64_t blck_size;
  int64_t blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  void (*to_float)(const void* x, float* y, int64_t k);
  ggml_from_float_t from_float_ref;
};
using get_base_traits_t = const ggml_type_traits* (*)(int type);
using cpu_init_t = void (*)();

std::vector<uint8_t> make_weight(DType t, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0005f, 0.02f);
  const size_t bytes = row_bytes(t, K) * static_cast<size_t>(N);
  std::vector<uint8_t> w(bytes);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  const size_t bs = type_traits(t)->type_size;
  for (size_t off = 0; off < bytes; off += bs) {
    uint8_t* p = w.data() + off;
    auto put = [&](size_t at, float v) {
      const uint16_t h = fp32_to_fp16(v);
      std::memcpy(p + at, &h, 2);
    };
    switch (t) {
      case DType::Q4_0:
      case DType::Q5_0:
      case DType::Q8_0: put(0, scale(rng)); break;
      case DType::Q4_1:
      case DType::Q5_1:
        put(0, scale(rng));
        put(2, -16.f * scale(rng));
        break;
      case DType::Q4_K:
      case DType::Q5_K:
        put(0, scale(rng) / 8.f);
        put(2, scale(rng) / 8.f);
        break;
      case DType::Q6_K: put(offsetof(BlockQ6_K, d), scale(rng) / 16.f); break;
      default: break;
    }
  }
  return w;
}

// Whether a variant's dot products follow llama.cpp's summation order.
bool llama_order(cpu::Isa isa) { return isa != cpu::Isa::kAvx512Vnni; }
const char* order_note(cpu::Isa isa) { return llama_order(isa) ? "" : " [another summation order: not counted]"; }

}  // namespace

int main(int argc, char** argv) {
  std::string lib, gguf_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--gguf" && i + 1 < argc)
      gguf_path = argv[++i];
    else
      lib = a;
  }
  if (lib.empty() && std::getenv("EMBER_GGML_CPU_LIB")) lib = std::getenv("EMBER_GGML_CPU_LIB");
  if (lib.empty()) lib = "/root/.cache/ember/refvenv/lib/python3.11/site-packages/llama_cpp/lib/libggml-cpu.so";
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    std::fprintf(stderr, "ggml_dot_check: cannot load %s: %s\n", lib.c_str(), dlerror());
    return 77;
  }
  auto get_traits = reinterpret_cast<get_traits_t>(dlsym(h, "ggml_get_type_traits_cpu"));
  auto cpu_init = reinterpret_cast<cpu_init_t>(dlsym(h, "ggml_cpu_init"));
  if (!get_traits || !cpu_init) {
    std::fprintf(stderr, "ggml_dot_check: %s lacks ggml_get_type_traits_cpu\n", lib.c_str());
    return 77;
  }
  cpu_init();
  auto get_base_traits = reinterpret_cast<get_base_traits_t>(dlsym(RTLD_DEFAULT, "ggml_get_type_traits"));
  int total_bad = 0;
  if (!gguf_path.empty()) {
    try {
      auto f = gguf::GgufFile::open(gguf_path);
      auto get_base = reinterpret_cast<get_base_traits_t>(dlsym(RTLD_DEFAULT, "ggml_get_type_traits"));
      cpu::set_decode_max_m(std::numeric_limits<int64_t>::max());
      int n_checked = 0;
      for (const gguf::TensorInfo& t : f->tensors()) {
        if (t.n_dims != 2 || !cpu::matmul_supports(t.type) || t.type == DType::F32 || t.type == DType::F16 ||
            t.type == DType::BF16)
          continue;
        const int64_t K = t.ne[0], N = t.ne[1] < 64 ? t.ne[1] : 64, M = 3;
        const auto* w = static_cast<const uint8_t*>(t.data);
        std::mt19937 rng(static_cast<uint32_t>(K + N));
        std::normal_distribution<float> normal(0.f, 1.f);
        std::vector<float> x(static_cast<size_t>(M * K)), yg(static_cast<size_t>(M * N)), ye(yg.size());
        for (auto& v : x) v = normal(rng);
        const ggml_type_traits_cpu* tr = get_traits(static_cast<int>(t.type));
        const ggml_type_traits_cpu* vtr = get_traits(tr->vec_dot_type);
        std::vector<uint8_t> xq(row_bytes(static_cast<DType>(tr->vec_dot_type), K) + 64);
        for (int64_t m = 0; m < M; ++m) {
          vtr->from_float(x.data() + m * K, xq.data(), K);
          for (int64_t n = 0; n < N; ++n)
            tr->vec_dot(static_cast<int>(K), &yg[static_cast<size_t>(m * N + n)], 0,
                        w + static_cast<size_t>(n) * row_bytes(t.type, K), 0, xq.data(), 0, 1);
        }
        std::vector<float> dg(static_cast<size_t>(N * K)), de(dg.size());
        get_base(static_cast<int>(t.type))->to_float(w, dg.data(), N * K);
        for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512Vnni}) {
          if (!cpu::isa_supported(isa)) continue;
          cpu::force_isa(isa);
          cpu::MatmulScratch scratch;
          cpu::matmul({t.type, N, K, w}, x.data(), M, ye.data(), scratch);
          cpu::dequantize_rows({t.type, N, K, w}, 0, N, de.data());
          int bad = 0, badd = 0;
          for (size_t i = 0; i < ye.size(); ++i) bad += std::memcmp(&ye[i], &yg[i], 4) != 0;
          for (size_t i = 0; i < de.size(); ++i) badd += std::memcmp(&de[i], &dg[i], 4) != 0;
          if (bad || badd)
            std::printf("%s (%s, %lld x %lld) %s: %d outputs, %d dequantized values differ%s\n", t.name.c_str(),
                        type_name(static_cast<uint32_t>(t.type)), static_cast<long long>(t.ne[1]),
                        static_cast<long long>(K), cpu::isa_to_string(isa), bad, badd, order_note(isa));
          total_bad += (llama_order(isa) ? bad : 0) + badd;
        }
        cpu::reset_isa();
        ++n_checked;
      }
      std::printf("%s: %d quantized tensors checked (first 64 rows each), %d values differ from llama.cpp\n",
                  gguf_path.c_str(), n_checked, total_bad);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ggml_dot_check: %s\n", e.what());
      return 2;
    }
    return total_bad == 0 ? 0 : 1;
  }
  const DType types[] = {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_0,
                         DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  const int64_t N = 67, M = 5;
  cpu::set_decode_max_m(std::numeric_limits<int64_t>::max());
  for (DType t : types) {
    const bool kq = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
    for (int64_t K : {kq ? int64_t{512} : int64_t{640}, int64_t{2048}}) {  // 640: Gemma 3 270M's width
      const auto w = make_weight(t, N, K, static_cast<uint32_t>(K + static_cast<int>(t)));
      std::mt19937 rng(static_cast<uint32_t>(K * 3 + static_cast<int>(t)));
      std::normal_distribution<float> normal(0.f, 1.f);
      std::vector<float> x(static_cast<size_t>(M * K));
      for (auto& v : x) v = normal(rng);
      for (int k = 0; k < 32; ++k) x[static_cast<size_t>(K + k)] = 0.f;  // an all-zero block in row 1
      // llama.cpp
      const ggml_type_traits_cpu* tr = get_traits(static_cast<int>(t));
      const TypeTraits* vt = type_traits(static_cast<uint32_t>(tr->vec_dot_type));
      std::vector<float> yg(static_cast<size_t>(M * N));
      std::vector<uint8_t> xq(row_bytes(vt->type, K) + 64);
      const ggml_type_traits_cpu* vtr = get_traits(tr->vec_dot_type);
      for (int64_t m = 0; m < M; ++m) {
        vtr->from_float(x.data() + m * K, xq.data(), K);
        for (int64_t n = 0; n < N; ++n)
          tr->vec_dot(static_cast<int>(K), &yg[static_cast<size_t>(m * N + n)], 0,
                      w.data() + static_cast<size_t>(n) * row_bytes(t, K), 0, xq.data(), 0, 1);
      }
      // Dequantization (embedding lookup) against ggml's to_float.
      if (get_base_traits) {
        std::vector<float> dg(static_cast<size_t>(N * K));
        get_base_traits(static_cast<int>(t))->to_float(w.data(), dg.data(), N * K);
        for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512Vnni}) {
          if (!cpu::isa_supported(isa)) continue;
          cpu::force_isa(isa);
          std::vector<float> de(dg.size());
          cpu::dequantize_rows({t, N, K, w.data()}, 0, N, de.data());
          int bad = 0;
          for (size_t i = 0; i < de.size(); ++i) bad += std::memcmp(&de[i], &dg[i], 4) != 0;
          std::printf("%-5s K=%-5lld %-12s %4d of %zu dequantized values differ from llama.cpp's to_float\n",
                      type_name(static_cast<uint32_t>(t)), static_cast<long long>(K), cpu::isa_to_string(isa), bad,
                      de.size());
          total_bad += bad;
        }
      }
      // Ember
      for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512Vnni}) {
        if (!cpu::isa_supported(isa)) continue;
        cpu::force_isa(isa);
        std::vector<float> ye(static_cast<size_t>(M * N));
        cpu::MatmulScratch scratch;
        cpu::matmul({t, N, K, w.data()}, x.data(), M, ye.data(), scratch);
        int bad = 0;
        double maxrel = 0;
        for (size_t i = 0; i < ye.size(); ++i)
          if (std::memcmp(&ye[i], &yg[i], 4) != 0) {
            ++bad;
            const double rel = std::abs(static_cast<double>(ye[i]) - yg[i]) / (std::abs(yg[i]) + 1e-30);
            maxrel = rel > maxrel ? rel : maxrel;
          }
        std::printf("%-5s K=%-5lld %-12s %4d of %zu outputs differ from llama.cpp%s%s\n",
                    type_name(static_cast<uint32_t>(t)), static_cast<long long>(K), cpu::isa_to_string(isa), bad,
                    ye.size(), bad ? (" (max rel " + std::to_string(maxrel) + ")").c_str() : "",
                    bad ? order_note(isa) : "");
        if (llama_order(isa)) total_bad += bad;
      }
      cpu::reset_isa();
    }
  }
  return total_bad == 0 ? 0 : 1;
}
