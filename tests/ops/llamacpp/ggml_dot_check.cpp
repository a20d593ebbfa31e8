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
// library cannot be loaded. The AVX-512 variant's Q4_0 / Q4_1 / Q8_0 dot
// products sum four blocks per register, another order than llama.cpp's
// (EMBER_CPU_ISA=avx2 gives llama.cpp's): their differences are printed, not
// counted. K-quant weights are also checked in llama.cpp's batched paths:
// decode rows (cpu::RowKind::kDecode) of a Q4_K weight with N % 8 == 0
// against its q4_K_8x8 GEMV, prompt rows against its GEMM (16 rows, the
// activations through ggml_quantize_mat_q8_K_4x8), and prompt rows of the
// other K-quant weights against its tiled kernels (a ggml graph, 16 rows;
// Q2_K included: the graph's weight is not in a repack buffer, so an AVX-512
// build, which would repack Q2_K into q2_K_8x8, takes its tiled kernels too).
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
#include <type_traits>
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
      case DType::Q2_K:
        put(offsetof(BlockQ2_K, d), scale(rng) / 4.f);
        put(offsetof(BlockQ2_K, dmin), scale(rng) / 4.f);
        break;
      case DType::Q3_K: put(offsetof(BlockQ3_K, d), scale(rng) / 8.f); break;
      default: break;
    }
  }
  return w;
}

// Whether a variant's dot products follow llama.cpp's summation order (the
// AVX-512 variant: for K-quants yes, for Q4_0 / Q4_1 / Q8_0 no).
bool is_kquant(DType t) {
  return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}
bool llama_order(cpu::Isa isa, DType t) { return isa != cpu::Isa::kAvx512Vnni || is_kquant(t); }
const char* order_note(cpu::Isa isa, DType t) {
  return llama_order(isa, t) ? "" : " [another summation order: not counted]";
}

// llama.cpp's batched K-quant paths on x86 (ggml-cpu/repack.cpp,
// ggml-cpu/tiled): the q4_K_8x8 GEMV / GEMM (exported, called on weights
// interleaved here as its repack does) and the tiled kernels (through a
// ggml graph: a weight outside a repack buffer with 8+ activation rows).
struct BlockQ4Kx8 {
  uint16_t d[8], dmin[8];
  uint8_t scales[96];
  uint8_t qs[1024];
};
struct ggml_init_params {
  size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
struct LlamaBatched {
  using gemx_t = void (*)(int n, float* s, size_t bs, const void* vx, const void* vy, int nr, int nc);
  using qmat_t = void (*)(const float* x, void* vy, int64_t k);
  gemx_t gemv = nullptr, gemm = nullptr;
  qmat_t quantize_mat = nullptr;  // 4 rows -> block_q8_Kx4
  ggml_from_float_t q8k = nullptr;
  void* (*init)(ggml_init_params) = nullptr;
  void (*free)(void*) = nullptr;
  void* (*new_tensor_2d)(void*, int, int64_t, int64_t) = nullptr;
  void* (*mul_mat)(void*, void*, void*) = nullptr;
  void* (*new_graph)(void*) = nullptr;
  void (*build)(void*, void*) = nullptr;
  void* (*get_data)(const void*) = nullptr;
  int (*compute)(void*, void*, int) = nullptr;
  bool ok() const {
    return gemv && gemm && quantize_mat && q8k && init && free && new_tensor_2d && mul_mat && new_graph && build &&
           get_data && compute;
  }
};

// make_block_q4_Kx8 (interleave 8): rows r..r+7 of each super-block.
std::vector<BlockQ4Kx8> repack_q4k_8x8(const uint8_t* w, int64_t N, int64_t K) {
  const int64_t nb = K / 256;
  std::vector<BlockQ4Kx8> out(static_cast<size_t>(N / 8 * nb));
  for (int64_t g = 0; g < N / 8; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      BlockQ4_K in[8];
      for (int i = 0; i < 8; ++i)
        std::memcpy(&in[i], w + static_cast<size_t>(g * 8 + i) * row_bytes(DType::Q4_K, K) + b * sizeof(BlockQ4_K),
                    sizeof(BlockQ4_K));
      BlockQ4Kx8& o = out[static_cast<size_t>(g * nb + b)];
      for (int i = 0; i < 8; ++i) o.d[i] = in[i].d, o.dmin[i] = in[i].dmin;
      for (int i = 0; i < 128; ++i) std::memcpy(o.qs + 8 * i, in[i % 8].qs + (i / 8) * 8, 8);
      uint8_t sc[8], mn[8];
      for (int half = 0; half < 2; ++half)
        for (int i = 0; i < 4; ++i) {
          for (int j = 0; j < 8; ++j) {
            if (half == 0) {
              sc[j] = in[j].scales[i] & 63;
              mn[j] = in[j].scales[i + 4] & 63;
            } else {
              sc[j] = static_cast<uint8_t>(((in[j].scales[i] & 192) >> 2) | (in[j].scales[i + 8] & 15));
              mn[j] = static_cast<uint8_t>(((in[j].scales[i + 4] & 192) >> 2) | ((in[j].scales[i + 8] & 240) >> 4));
            }
          }
          uint8_t* q = o.scales + 48 * half + 12 * i;
          for (int j = 0; j < 4; ++j) {
            q[j] = static_cast<uint8_t>((sc[j] & 63) + ((sc[j + 4] & 48) << 2));
            q[4 + j] = static_cast<uint8_t>((mn[j] & 63) + ((mn[j + 4] & 48) << 2));
            q[8 + j] = static_cast<uint8_t>((sc[j + 4] & 15) + ((mn[j + 4] & 15) << 4));
          }
        }
    }
  return out;
}

// y[M][N] as llama.cpp computes a weight that takes its batched path
// (decode: the one-row kernels), or an empty vector when it cannot.
std::vector<float> llama_batched(const LlamaBatched& L, DType t, const uint8_t* w, int64_t N, int64_t K,
                                 const std::vector<float>& x, int64_t M, bool decode) {
  std::vector<float> y(static_cast<size_t>(M * N));
  if (t == DType::Q4_K && N % 8 == 0) {
    const auto packed = repack_q4k_8x8(w, N, K);
    const size_t q8k_bytes = static_cast<size_t>(K / 256) * 292;
    if (decode) {
      std::vector<uint8_t> a(q8k_bytes);
      for (int64_t m = 0; m < M; ++m) {
        L.q8k(x.data() + m * K, a.data(), K);
        L.gemv(static_cast<int>(K), y.data() + m * N, static_cast<size_t>(N), packed.data(), a.data(), 1,
               static_cast<int>(N));
      }
    } else {
      if (M % 4 != 0) return {};
      std::vector<uint8_t> a(q8k_bytes * static_cast<size_t>(M));
      for (int64_t m = 0; m < M; m += 4) L.quantize_mat(x.data() + m * K, a.data() + q8k_bytes * m, K);
      L.gemm(static_cast<int>(K), y.data(), static_cast<size_t>(N), packed.data(), a.data(), static_cast<int>(M),
             static_cast<int>(N));
    }
    return y;
  }
  if (decode || M < 8) return {};  // (vec_dot: checked separately)
  void* ctx = L.init({size_t{64} << 20, nullptr, false});
  void* a = L.new_tensor_2d(ctx, static_cast<int>(t), K, N);
  void* b = L.new_tensor_2d(ctx, 0 /* F32 */, K, M);
  std::memcpy(L.get_data(a), w, row_bytes(t, K) * static_cast<size_t>(N));
  std::memcpy(L.get_data(b), x.data(), x.size() * sizeof(float));
  void* c = L.mul_mat(ctx, a, b);
  void* gf = L.new_graph(ctx);
  L.build(gf, c);
  L.compute(ctx, gf, 2);
  std::memcpy(y.data(), L.get_data(c), y.size() * sizeof(float));
  L.free(ctx);
  return y;
}

// Ember's K-quant rows of both kinds against llama.cpp's batched paths;
// returns the number of outputs that differ.
int check_batched(const LlamaBatched& L, const char* what, DType t, const uint8_t* w, int64_t N, int64_t K,
                  uint32_t seed) {
  if (!L.ok() || !is_kquant(t)) return 0;
  const int64_t M = 16;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = normal(rng);
  int total = 0;
  for (const bool decode : {false, true}) {
    const auto yg = llama_batched(L, t, w, N, K, x, M, decode);
    if (yg.empty()) continue;
    const char* path = t == DType::Q4_K && N % 8 == 0 ? (decode ? "q4_K_8x8 gemv" : "q4_K_8x8 gemm") : "tiled";
    for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512Vnni}) {
      if (!cpu::isa_supported(isa)) continue;
      cpu::force_isa(isa);
      std::vector<float> ye(yg.size());
      cpu::MatmulScratch scratch;
      cpu::matmul({t, N, K, w}, x.data(), M, ye.data(), scratch, cpu::MatmulPath::kRowInvariant,
                  decode ? cpu::RowKind::kDecode : cpu::RowKind::kPrompt);
      int bad = 0;
      for (size_t i = 0; i < ye.size(); ++i) bad += std::memcmp(&ye[i], &yg[i], 4) != 0;
      std::printf("%-28s %-5s %lld x %lld, %s rows vs llama.cpp's %s, %-12s %4d of %zu outputs differ\n", what,
                  type_name(static_cast<uint32_t>(t)), static_cast<long long>(N), static_cast<long long>(K),
                  decode ? "decode" : "prompt", path, cpu::isa_to_string(isa), bad, ye.size());
      total += bad;
    }
    cpu::reset_isa();
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  // Ember's kernels in llama.cpp's orders: AMX prompt rows (their own order) off.
  ember::cpu::set_amx_prompt_rows(false);
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
  LlamaBatched lb;
  {
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(RTLD_DEFAULT, name));
    };
    sym(lb.gemv, "ggml_gemv_q4_K_8x8_q8_K");
    sym(lb.gemm, "ggml_gemm_q4_K_8x8_q8_K");
    sym(lb.quantize_mat, "ggml_quantize_mat_q8_K_4x8");
    sym(lb.init, "ggml_init");
    sym(lb.free, "ggml_free");
    sym(lb.new_tensor_2d, "ggml_new_tensor_2d");
    sym(lb.mul_mat, "ggml_mul_mat");
    sym(lb.new_graph, "ggml_new_graph");
    sym(lb.build, "ggml_build_forward_expand");
    sym(lb.get_data, "ggml_get_data");
    sym(lb.compute, "ggml_graph_compute_with_ctx");
    lb.q8k = get_traits(15 /* GGML_TYPE_Q8_K */)->from_float;
    if (!lb.ok()) std::printf("(no q4_K_8x8 / graph symbols in %s: batched paths not checked)\n", lib.c_str());
  }
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
          cpu::matmul({t.type, N, K, w}, x.data(), M, ye.data(), scratch, cpu::MatmulPath::kRowInvariant,
                      cpu::RowKind::kDecode);
          cpu::dequantize_rows({t.type, N, K, w}, 0, N, de.data());
          int bad = 0, badd = 0;
          // (decode rows of a repacked Q4_K weight take the q4_K_8x8 GEMV, checked below)
          const bool vec = !(t.type == DType::Q4_K && N % 8 == 0);
          for (size_t i = 0; vec && i < ye.size(); ++i) bad += std::memcmp(&ye[i], &yg[i], 4) != 0;
          for (size_t i = 0; i < de.size(); ++i) badd += std::memcmp(&de[i], &dg[i], 4) != 0;
          if (bad || badd)
            std::printf("%s (%s, %lld x %lld) %s: %d outputs, %d dequantized values differ%s\n", t.name.c_str(),
                        type_name(static_cast<uint32_t>(t.type)), static_cast<long long>(t.ne[1]),
                        static_cast<long long>(K), cpu::isa_to_string(isa), bad, badd, order_note(isa, t.type));
          total_bad += (llama_order(isa, t.type) ? bad : 0) + badd;
        }
        cpu::reset_isa();
        if (is_kquant(t.type))
          total_bad += check_batched(lb, t.name.c_str(), t.type, w, N, K, static_cast<uint32_t>(K * 7 + N));
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
  const DType types[] = {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q5_1,
                         DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  const int64_t N = 67, M = 5;
  cpu::set_decode_max_m(std::numeric_limits<int64_t>::max());
  for (DType t : types) {
    const bool kq = is_kquant(t);
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
        cpu::matmul({t, N, K, w.data()}, x.data(), M, ye.data(), scratch, cpu::MatmulPath::kRowInvariant,
                    cpu::RowKind::kDecode);  // (N = 67: every type's decode rows take ggml_vec_dot)
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
                    bad ? order_note(isa, t) : "");
        if (llama_order(isa, t)) total_bad += bad;
      }
      cpu::reset_isa();
      // The batched paths: N = 64 (Q4_K repacked: GEMV / GEMM) and N = 67 (tiled).
      if (kq) {
        const auto w64 = make_weight(t, 64, K, static_cast<uint32_t>(K + 5 * static_cast<int>(t)));
        total_bad += check_batched(lb, "random", t, w64.data(), 64, K, static_cast<uint32_t>(K + 1));
        total_bad += check_batched(lb, "random", t, w.data(), N, K, static_cast<uint32_t>(K + 2));
      }
    }
  }
  return total_bad == 0 ? 0 : 1;
}
