// Every Backend op on every backend that can be created in this process,
// against one scalar reference: the CPU backend always; the CUDA backend when
// libember_cuda.so loads and a GPU is present (otherwise those cases are
// skipped with the loader's message). On CUDA the GEMV path must also equal
// gpu::reference_gemv bit for bit, and the extras (device sampling, CUDA
// graphs) are tested.
//
//   EMBER_TEST_BACKENDS=cuda ./test_backend --gtest_filter='*BackendOps*'
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/plugin.h"
#include "core/tensor/types.h"
#include "core/util/status.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"
#include "gpu/layout.h"

namespace ember {
namespace {

struct Instance {
  std::unique_ptr<Backend> owner;
  Backend* backend = nullptr;
  BackendExtras* extras = nullptr;
  std::string skip;  // why it is unavailable
};

std::map<std::string, Instance>& instances() {
  static std::map<std::string, Instance> all;
  return all;
}

// The backends are released before main returns (not at static destruction,
// after the CUDA runtime's own teardown), so compute-sanitizer's leak check
// sees every device allocation freed.
class ReleaseBackends : public ::testing::Environment {
 public:
  void TearDown() override { instances().clear(); }
};
[[maybe_unused]] const auto* const kReleaseBackends = ::testing::AddGlobalTestEnvironment(new ReleaseBackends);

Instance& instance(const std::string& name) {
  auto& all = instances();
  auto it = all.find(name);
  if (it != all.end()) return it->second;
  Instance& in = all[name];
  try {
    if (name == "cpu" || name == "cpu_scalar") {
      in.owner = make_cpu_backend(2);
    } else {
#ifdef EMBER_CUDA_PLUGIN_PATH
      LoadedBackend lb = open_backend_plugin_file(EMBER_CUDA_PLUGIN_PATH, "cuda", 0);
#else
      LoadedBackend lb = open_backend_plugin("cuda", 0);
#endif
      in.owner = std::move(lb.backend);
      in.extras = lb.extras;
    }
    in.backend = in.owner.get();
  } catch (const Error& e) {
    in.skip = e.what();
  }
  return in;
}

// A device buffer of floats (or raw bytes) with host copies in and out.
class Buf {
 public:
  Buf(Backend& b, size_t bytes) : b_(b), bytes_(bytes) { p_ = b_.alloc(std::max<size_t>(bytes, 4)); }
  Buf(Backend& b, const std::vector<float>& v) : Buf(b, v.size() * 4) { b_.upload(p_, v.data(), v.size() * 4); }
  ~Buf() { b_.free_buffer(p_); }
  Buf(const Buf&) = delete;
  float* f() const { return static_cast<float*>(p_); }
  std::vector<float> get() const {
    std::vector<float> v(bytes_ / 4);
    b_.download(v.data(), p_, bytes_);
    return v;
  }
  void set(const std::vector<float>& v) { b_.upload(p_, v.data(), v.size() * 4); }

 private:
  Backend& b_;
  void* p_;
  size_t bytes_;
};

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Random weights in the GGUF layout.
std::vector<uint8_t> make_weight(DType t, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.002f, 0.03f);
  std::normal_distribution<float> normal(0.f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> out(row_bytes(t, K) * static_cast<size_t>(N) + 64);
  uint8_t* p = out.data();
  for (int64_t r = 0; r < N; ++r) {
    if (t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0) {
      const size_t bb = type_traits(t)->type_size;
      for (int64_t b = 0; b < K / 32; ++b, p += bb) {
        const uint16_t d = fp32_to_fp16(t == DType::Q8_0 ? scale(rng) / 16.f : scale(rng));
        std::memcpy(p, &d, 2);
        size_t q0 = 2;
        if (t == DType::Q4_1) {
          const uint16_t m = fp32_to_fp16(-8.f * scale(rng));
          std::memcpy(p + 2, &m, 2);
          q0 = 4;
        }
        for (size_t i = q0; i < bb; ++i) p[i] = static_cast<uint8_t>(byte(rng));
      }
    } else if (t == DType::Q5_0 || t == DType::Q5_1 || gpu::is_kquant(t)) {
      // Random quant (and sub-block scale) bits, f16 scales of a realistic magnitude.
      const size_t bb = type_traits(t)->type_size;
      for (int64_t b = 0; b < K / type_traits(t)->block_size; ++b, p += bb) {
        for (size_t i = 0; i < bb; ++i) p[i] = static_cast<uint8_t>(byte(rng));
        auto put = [&](size_t at, float v) {
          const uint16_t h = fp32_to_fp16(v);
          std::memcpy(p + at, &h, 2);
        };
        if (t == DType::Q5_0) {
          put(0, scale(rng) / 2.f);
        } else if (t == DType::Q5_1) {
          put(0, scale(rng) / 2.f);
          put(2, -16.f * scale(rng) / 2.f);
        } else if (t == DType::Q6_K) {
          put(offsetof(BlockQ6_K, d), scale(rng) / 64.f);
        } else {  // Q4_K, Q5_K
          put(0, scale(rng) / 16.f);
          put(2, scale(rng) / 16.f);
        }
      }
    } else {
      for (int64_t k = 0; k < K; ++k) {
        const float f = normal(rng);
        if (t == DType::F32) {
          std::memcpy(p, &f, 4);
          p += 4;
        } else {
          const uint16_t h = t == DType::F16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
          std::memcpy(p, &h, 2);
          p += 2;
        }
      }
    }
  }
  return out;
}

std::vector<float> dequant(DType t, const uint8_t* w, int64_t N, int64_t K) {
  std::vector<float> out(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) type_traits(t)->dequantize_row(w + n * row_bytes(t, K), out.data() + n * K, K);
  return out;
}

float f16_round(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

class BackendOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (const char* only = std::getenv("EMBER_TEST_BACKENDS")) {
      if (std::string(only).find(GetParam()) == std::string::npos) GTEST_SKIP() << "EMBER_TEST_BACKENDS=" << only;
    }
    Instance& in = instance(GetParam());
    if (!in.backend) GTEST_SKIP() << GetParam() << " backend unavailable: " << in.skip;
    b_ = in.backend;
    extras_ = in.extras;
    // cpu_scalar: the CPU backend with its portable kernels (what a CPU
    // without AVX2 runs), held to the same checks, bit-exact ones included.
    if (GetParam() == "cpu_scalar") cpu::force_isa(cpu::Isa::kScalar);
  }
  void TearDown() override {
    if (GetParam() == "cpu_scalar") cpu::reset_isa();
  }
  bool cuda() const { return GetParam() == "cuda"; }
  Backend& b() { return *b_; }

  Backend* b_ = nullptr;
  BackendExtras* extras_ = nullptr;
};

constexpr DType kAllTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q5_1, DType::Q4_K,
                               DType::Q5_K, DType::Q6_K, DType::F16,  DType::BF16, DType::F32};

TEST_P(BackendOps, EmbedIsExact) {
  for (DType t : kAllTypes) {
    const int64_t N = 50, K = gpu::is_kquant(t) ? 512 : 96;
    const auto w = make_weight(t, N, K, 3);
    auto dw = b().upload_weight(WeightDesc{t, N, K, w.data()});
    const std::vector<int32_t> ids = {3, 0, 49, 3};
    Buf out(b(), ids.size() * K * 4);
    b().embed(*dw, ids.data(), static_cast<int32_t>(ids.size()), out.f());
    const auto got = out.get();
    const auto ref = dequant(t, w.data(), N, K);
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(got[i * K + k], ref[ids[i] * K + k]) << type_name(static_cast<uint32_t>(t)) << " " << i << " " << k;
    const int32_t bad = 50;
    try {
      b().embed(*dw, &bad, 1, out.f());
      ADD_FAILURE() << "no error for an out-of-range id";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST_P(BackendOps, RmsNorm) {
  const int32_t rows = 3, dim = 200;
  const auto x = randn(static_cast<size_t>(rows) * dim, 1, 3.0f);
  const auto wv = randn(dim, 2);
  auto w = b().upload_weight(WeightDesc{DType::F32, 1, dim, wv.data()});
  Buf bx(b(), x), out(b(), x.size() * 4);
  b().rms_norm(bx.f(), *w, rows, dim, 1e-5f, out.f());
  b().rms_norm(bx.f(), *w, rows, dim, 1e-5f, bx.f());  // in place
  const auto got = out.get(), got_inplace = bx.get();
  for (int32_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int32_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double s = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int32_t i = 0; i < dim; ++i) {
      const double ref = x[r * dim + i] * s * wv[i];
      ASSERT_NEAR(got[r * dim + i], ref, 1e-5 * (1 + std::fabs(ref)));
      ASSERT_EQ(got_inplace[r * dim + i], got[r * dim + i]);
    }
  }
}

TEST_P(BackendOps, MatmulAllTypesPathsAndDecodeRows) {
  for (DType t : kAllTypes) {
    for (int64_t K : gpu::is_kquant(t) ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{96, 256}) {
      const int64_t N = 67;
      const auto w = make_weight(t, N, K, static_cast<uint32_t>(K + static_cast<int>(t)));
      auto dw = b().upload_weight(WeightDesc{t, N, K, w.data()});
      const auto wf = dequant(t, w.data(), N, K);
      for (int32_t M : {1, 2, 3, 5, 8, 9, 17, 64}) {
        for (bool decodes : {false, true}) {
          const auto x = randn(static_cast<size_t>(M) * K, static_cast<uint32_t>(M * 7 + K));
          Buf bx(b(), x), by(b(), static_cast<size_t>(M) * N * 4);
          b().matmul(*dw, bx.f(), M, by.f(), decodes);
          const auto y = by.get();
          const std::string where = std::string(type_name(static_cast<uint32_t>(t))) + " K=" + std::to_string(K) +
                                    " M=" + std::to_string(M) + (decodes ? " decodes" : " prefill");
          for (int32_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              double ref = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                ref += static_cast<double>(wf[n * K + k]) * x[m * K + k];
                mag += std::fabs(static_cast<double>(wf[n * K + k]) * x[m * K + k]);
              }
              const bool quant = gpu::is_quant(t);
              // CPU prefill may run in bf16 (oneDNN); cuBLAS in f16 (f32 for F32 weights).
              const double tol = (quant ? 0.02 : (t == DType::F32 && cuda() ? 1e-5 : 4e-3)) * mag + 1e-4;
              ASSERT_NEAR(y[m * N + n], ref, tol) << where << " m=" << m << " n=" << n;
            }
          }
          if (cuda() && (decodes || M <= gpu::kGemvMaxNR)) {
            // The device GEMV is the host emulation, bit for bit.
            std::vector<float> ref(static_cast<size_t>(M) * N);
            gpu::reference_gemv(t, w.data(), N, K, x.data(), M, ref.data());
            ASSERT_EQ(std::memcmp(ref.data(), y.data(), ref.size() * 4), 0) << where;
          }
          if (decodes) {
            // rows_are_decodes: each row exactly as alone.
            for (int32_t m : {0, M - 1}) {
              std::vector<float> xr(x.begin() + m * K, x.begin() + (m + 1) * K);
              Buf bx1(b(), xr), by1(b(), N * 4);
              b().matmul(*dw, bx1.f(), 1, by1.f(), true);
              const auto y1 = by1.get();
              ASSERT_EQ(std::memcmp(y1.data(), y.data() + m * N, N * 4), 0) << where << " row " << m;
            }
          }
        }
      }
    }
  }
}

TEST_P(BackendOps, QuantMatmulsSharingAnInput) {
  // Q, K, V (or gate, up) read the same input back to back; the CUDA backend
  // quantizes it once. A new upload into the input must not reuse the old one.
  const int64_t K = 128, N1 = 64, N2 = 32;
  const int32_t M = 3;
  const auto w1 = make_weight(DType::Q4_0, N1, K, 1), w2 = make_weight(DType::Q8_0, N2, K, 2);
  const auto w3 = make_weight(DType::Q4_0, N2, K, 3);
  auto d1 = b().upload_weight(WeightDesc{DType::Q4_0, N1, K, w1.data()});
  auto d2 = b().upload_weight(WeightDesc{DType::Q8_0, N2, K, w2.data()});
  auto d3 = b().upload_weight(WeightDesc{DType::Q4_0, N2, K, w3.data()});
  auto x = randn(static_cast<size_t>(M) * K, 4);
  Buf bx(b(), x), y1(b(), M * N1 * 4), y2(b(), M * N2 * 4), y3(b(), M * N2 * 4);
  auto check = [&](const std::vector<uint8_t>& w, DType t, int64_t N, const Buf& y, const std::vector<float>& xv) {
    const auto wf = dequant(t, w.data(), N, K);
    const auto got = y.get();
    for (int32_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          ref += static_cast<double>(wf[n * K + k]) * xv[m * K + k];
          mag += std::fabs(static_cast<double>(wf[n * K + k]) * xv[m * K + k]);
        }
        ASSERT_NEAR(got[m * N + n], ref, 0.02 * mag + 1e-4)
            << type_name(static_cast<uint32_t>(t)) << " " << m << " " << n;
      }
  };
  b().matmul(*d1, bx.f(), M, y1.f(), true);
  b().matmul(*d2, bx.f(), M, y2.f(), true);
  b().matmul(*d3, bx.f(), M, y3.f(), true);
  check(w1, DType::Q4_0, N1, y1, x);
  check(w2, DType::Q8_0, N2, y2, x);
  check(w3, DType::Q4_0, N2, y3, x);
  x = randn(x.size(), 5);
  bx.set(x);
  b().matmul(*d3, bx.f(), M, y3.f(), true);
  check(w3, DType::Q4_0, N2, y3, x);
  // An op writing the input in between (add) also breaks the sharing.
  b().matmul(*d1, bx.f(), M, y1.f(), true);
  b().add(bx.f(), bx.f(), x.size());
  for (auto& v : x) v = v + v;
  b().matmul(*d3, bx.f(), M, y3.f(), true);
  check(w3, DType::Q4_0, N2, y3, x);
}

// The same with K-quant weights (a Q4_K_M-style Q, K, V: Q4_K, Q4_K, Q6_K,
// all reading Q8_K activations) next to 32-element types on the same input
// (which need their own quantization).
TEST_P(BackendOps, KQuantMatmulsSharingAnInput) {
  const int64_t K = 512;
  const int32_t M = 3;
  struct W {
    DType t;
    int64_t N;
    std::vector<uint8_t> host;
    std::unique_ptr<DeviceWeight> dev;
  };
  std::vector<W> ws;
  const DType order[] = {DType::Q4_K, DType::Q4_K, DType::Q6_K, DType::Q4_0, DType::Q5_K, DType::Q4_1, DType::Q6_K};
  for (size_t i = 0; i < std::size(order); ++i) {
    W w{order[i], 32 + 8 * static_cast<int64_t>(i), {}, nullptr};
    w.host = make_weight(w.t, w.N, K, static_cast<uint32_t>(40 + i));
    w.dev = b().upload_weight(WeightDesc{w.t, w.N, K, w.host.data()});
    ws.push_back(std::move(w));
  }
  const auto x = randn(static_cast<size_t>(M) * K, 41);
  Buf bx(b(), x);
  std::vector<std::unique_ptr<Buf>> ys;
  for (auto& w : ws) {
    ys.push_back(std::make_unique<Buf>(b(), static_cast<size_t>(M) * w.N * 4));
    b().matmul(*w.dev, bx.f(), M, ys.back()->f(), true);
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    const auto& w = ws[i];
    const auto wf = dequant(w.t, w.host.data(), w.N, K);
    const auto got = ys[i]->get();
    std::vector<float> alone_ref;
    if (cuda()) {
      alone_ref.resize(static_cast<size_t>(M) * w.N);
      gpu::reference_gemv(w.t, w.host.data(), w.N, K, x.data(), M, alone_ref.data());
      ASSERT_EQ(std::memcmp(alone_ref.data(), got.data(), got.size() * 4), 0) << type_name(static_cast<uint32_t>(w.t));
    }
    for (int32_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < w.N; ++n) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          ref += static_cast<double>(wf[n * K + k]) * x[m * K + k];
          mag += std::fabs(static_cast<double>(wf[n * K + k]) * x[m * K + k]);
        }
        ASSERT_NEAR(got[m * w.N + n], ref, 0.02 * mag + 1e-4) << type_name(static_cast<uint32_t>(w.t)) << " " << m;
      }
  }
}

TEST_P(BackendOps, RopeAdjacentPairs) {
  const int32_t rows = 3, heads = 4, hd = 16;
  const std::vector<int32_t> pos = {0, 7, 1000};
  for (int32_t rot : {16, 8}) {
    const auto x = randn(static_cast<size_t>(rows) * heads * hd, 9);
    Buf bx(b(), x);
    b().rope(bx.f(), pos.data(), rows, heads, hd, rot, 10000.0f);
    const auto got = bx.get();
    for (int32_t r = 0; r < rows; ++r)
      for (int32_t h = 0; h < heads; ++h)
        for (int32_t i = 0; i < hd; i += 2) {
          const size_t o = (static_cast<size_t>(r) * heads + h) * hd + i;
          double y0 = x[o], y1 = x[o + 1];
          if (i < rot) {
            const float inv = static_cast<float>(std::pow(10000.0, -2.0 * (i / 2) / rot));
            const double th = static_cast<double>(static_cast<float>(pos[r]) * inv);
            y0 = x[o] * std::cos(th) - x[o + 1] * std::sin(th);
            y1 = x[o] * std::sin(th) + x[o + 1] * std::cos(th);
          }
          ASSERT_NEAR(got[o], y0, 2e-5) << r << " " << h << " " << i;
          ASSERT_NEAR(got[o + 1], y1, 2e-5);
        }
  }
}

TEST_P(BackendOps, RopeExtNeoxScaledWithFactors) {
  const int32_t rows = 3, heads = 4, hd = 16;
  const std::vector<int32_t> pos = {0, 7, 1000};
  for (bool neox : {true, false}) {
    for (int32_t rot : {16, 8}) {
      std::vector<float> factors(rot / 2);
      for (int32_t i = 0; i < rot / 2; ++i) factors[i] = 1.0f + 0.5f * static_cast<float>(i);
      RopeSpec spec;
      spec.rot_dim = rot;
      spec.freq_base = 500000.0f;
      spec.freq_scale = 0.25f;
      spec.neox = neox;
      spec.freq_factors = factors.data();
      const auto x = randn(static_cast<size_t>(rows) * heads * hd, 19);
      Buf bx(b(), x);
      b().rope_ext(bx.f(), pos.data(), rows, heads, hd, spec);
      const auto got = bx.get();
      for (int32_t r = 0; r < rows; ++r)
        for (int32_t h = 0; h < heads; ++h) {
          const size_t base = (static_cast<size_t>(r) * heads + h) * hd;
          std::vector<double> want(x.begin() + base, x.begin() + base + hd);
          for (int32_t i = 0; i < rot / 2; ++i) {
            const double th = 0.25 * pos[r] * std::pow(500000.0, -2.0 * i / rot) / factors[i];
            const int32_t a = neox ? i : 2 * i, c = neox ? i + rot / 2 : 2 * i + 1;
            want[a] = x[base + a] * std::cos(th) - x[base + c] * std::sin(th);
            want[c] = x[base + a] * std::sin(th) + x[base + c] * std::cos(th);
          }
          for (int32_t i = 0; i < hd; ++i)
            ASSERT_NEAR(got[base + i], want[i], 5e-5) << "neox " << neox << " rot " << rot << " row " << r << " " << i;
        }
    }
  }
}

// The CPU's geglu with F16C (8 at a time, in chunks over the threads) and its
// portable loop give the same bits: every f16 value as a gate (the table's
// whole domain, both tails, infinities), random gates, a tail of 5.
TEST_P(BackendOps, GegluF16cIsTheScalarLoopBitForBit) {
  if (GetParam() != "cpu") GTEST_SKIP() << "the CPU backend's two geglu paths";
  if (!cpu::isa_supported(cpu::Isa::kAvx2)) GTEST_SKIP() << "no F16C path on this CPU";
  std::vector<float> g;
  for (uint32_t h = 0; h < (1u << 16); ++h) {
    const float x = fp16_to_fp32(static_cast<uint16_t>(h));
    if (!std::isnan(x)) g.push_back(x);
  }
  const auto r = randn(40000, 8, 6.0f);
  g.insert(g.end(), r.begin(), r.end());
  g.resize(g.size() / 8 * 8 + 5);
  const size_t n = g.size();
  const auto u = randn(n, 9);
  Buf bg(b(), g), bu(b(), u), out(b(), n * 4);
  b().geglu(bg.f(), bu.f(), n, out.f());
  const auto fast = out.get();
  cpu::force_isa(cpu::Isa::kScalar);
  b().geglu(bg.f(), bu.f(), n, out.f());
  cpu::reset_isa();
  const auto slow = out.get();
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(slow[i])) << i << ": gate " << g[i];
  // In place, as the models call it (out = gate).
  b().geglu(bg.f(), bu.f(), n, bg.f());
  const auto in_place = bg.get();
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(in_place[i]), std::bit_cast<uint32_t>(slow[i]))
        << i << " in place: gate " << g[i];
}

TEST_P(BackendOps, GegluScaleAndBias) {
  const size_t n = 4000;
  auto g = randn(n, 3, 4.0f);
  g[0] = -12.0f, g[1] = 11.0f, g[2] = -10.0f, g[3] = 10.0f, g[4] = 0.0f;  // the tails and their edges
  const auto u = randn(n, 4);
  Buf bg(b(), g), bu(b(), u), out(b(), n * 4);
  b().geglu(bg.f(), bu.f(), n, out.f());
  const auto y = out.get();
  for (size_t i = 0; i < n; ++i) {
    // llama.cpp: the f16-rounded gate's gelu, rounded to f16 (one f16 ulp of slack).
    double want;
    if (g[i] <= -10.0f) {
      want = 0.0;
    } else if (g[i] >= 10.0f) {
      want = static_cast<double>(g[i]) * u[i];
    } else {
      const double x = f16_round(g[i]);
      want = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x))) * u[i];
    }
    ASSERT_NEAR(y[i], want, 1.1e-3 * std::fabs(want) + 1e-6) << i << ": gate " << g[i];
  }
  b().scale(bu.f(), n, 0.0625f);
  const auto su = bu.get();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(su[i], u[i] * 0.0625f);
  const int32_t rows = 5, dim = 24;
  const auto bias = randn(dim, 6);
  WeightDesc d{DType::F32, 1, dim, bias.data()};
  auto wb = b().upload_weight(d);
  const auto x = randn(static_cast<size_t>(rows) * dim, 7);
  Buf bx(b(), x);
  b().add_bias(bx.f(), *wb, rows, dim);
  const auto xb = bx.get();
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t i = 0; i < dim; ++i) ASSERT_EQ(xb[r * dim + i], x[r * dim + i] + bias[i]);
}

TEST_P(BackendOps, ElementwiseAndGather) {
  const size_t n = 1000;
  const auto g = randn(n, 1, 4.0f), u = randn(n, 2);
  Buf bg(b(), g), bu(b(), u), out(b(), n * 4);
  b().swiglu(bg.f(), bu.f(), n, out.f());
  const auto s = out.get();
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(s[i], g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i], 1e-5 * (1 + std::fabs(s[i])));
  b().add(bg.f(), bu.f(), n);
  const auto a = bg.get();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], g[i] + u[i]);
  const int32_t dim = 10;
  const std::vector<int32_t> rows = {99, 0, 42, 42};
  Buf gathered(b(), rows.size() * dim * 4);
  b().gather_rows(bu.f(), rows.data(), static_cast<int32_t>(rows.size()), dim, gathered.f());
  const auto gr = gathered.get();
  for (size_t i = 0; i < rows.size(); ++i)
    for (int32_t d = 0; d < dim; ++d) ASSERT_EQ(gr[i * dim + d], u[rows[i] * dim + d]);
}

// LoRA terms (Backend::lora): y[r] += scale * B (A x[r]) per term, in term
// order, inputs rounded to each weight's type; a row's result is the same
// bits whatever else the call holds, rows without terms are untouched.
TEST_P(BackendOps, LoraTermsOnChosenRows) {
  const int64_t K = 96, N = 72;
  const int32_t n_rows = 9;  // row 8 has no term
  struct Spec {
    DType type;
    int64_t rank;
    float scale;
    std::vector<int32_t> rows;
    bool decodes;  // one-token rows: the other summation order
  };
  const std::vector<Spec> specs = {{DType::F16, 16, 0.7f, {0, 3, 5}, false},
                                   {DType::F32, 5, -1.3f, {1, 3}, false},
                                   {DType::BF16, 8, 2.0f, {6}, false},
                                   {DType::F16, 16, 1.5f, {7, 2}, true},
                                   {DType::F32, 12, 0.25f, {4}, true}};
  std::vector<std::vector<uint8_t>> a_bytes, b_bytes;
  std::vector<std::unique_ptr<DeviceWeight>> a_w, b_w;
  for (size_t i = 0; i < specs.size(); ++i) {
    a_bytes.push_back(make_weight(specs[i].type, specs[i].rank, K, 100 + static_cast<uint32_t>(i)));
    b_bytes.push_back(make_weight(specs[i].type, N, specs[i].rank, 200 + static_cast<uint32_t>(i)));
    a_w.push_back(b().upload_weight(WeightDesc{specs[i].type, specs[i].rank, K, a_bytes.back().data()}));
    b_w.push_back(b().upload_weight(WeightDesc{specs[i].type, N, specs[i].rank, b_bytes.back().data()}));
  }
  const auto x = randn(static_cast<size_t>(n_rows * K), 7);
  const auto y0 = randn(static_cast<size_t>(n_rows * N), 8);
  auto terms_of = [&](const std::vector<size_t>& which) {
    std::vector<LoraTerm> t;
    for (size_t i : which) {
      t.push_back(LoraTerm{a_w[i].get(), b_w[i].get(), specs[i].scale, specs[i].rows.data(),
                           static_cast<int32_t>(specs[i].rows.size()), specs[i].decodes});
    }
    return t;
  };
  Buf bx(b(), x), by(b(), y0);
  const auto all = terms_of({0, 1, 2, 3, 4});
  b().lora(all.data(), static_cast<int32_t>(all.size()), bx.f(), by.f());
  const auto y = by.get();
  // Reference: each term in order, in double, inputs rounded as the weight's type reads them.
  auto round_as = [](DType t, float v) {
    return t == DType::F16 ? f16_round(v) : t == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(v)) : v;
  };
  std::vector<float> ref = y0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& sp = specs[i];
    const auto A = dequant(sp.type, a_bytes[i].data(), sp.rank, K);
    const auto B = dequant(sp.type, b_bytes[i].data(), N, sp.rank);
    for (int32_t r : sp.rows) {
      std::vector<float> t(static_cast<size_t>(sp.rank));
      for (int64_t j = 0; j < sp.rank; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(A[j * K + k]) * round_as(sp.type, x[r * K + k]);
        t[j] = round_as(sp.type, static_cast<float>(acc));
      }
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t j = 0; j < sp.rank; ++j) acc += static_cast<double>(B[n * sp.rank + j]) * t[j];
        ref[r * N + n] += static_cast<float>(acc) * sp.scale;
      }
    }
  }
  for (int32_t r = 0; r < n_rows; ++r) {
    const bool touched = r != 8;
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(r * N + n);
      if (!touched) {
        ASSERT_EQ(y[i], y0[i]) << "row " << r << " has no term";
      } else {
        ASSERT_NEAR(y[i], ref[i], 2e-4 * (1 + std::fabs(ref[i]))) << "row " << r << " col " << n;
      }
    }
  }
  // Row 3 alone (its two terms, nothing else in the call): the same bits.
  const std::vector<int32_t> only3 = {3};
  std::vector<LoraTerm> alone = terms_of({0, 1});
  for (auto& t : alone) t.rows = only3.data(), t.n_rows = 1;
  Buf by2(b(), y0);
  b().lora(alone.data(), static_cast<int32_t>(alone.size()), bx.f(), by2.f());
  const auto y2 = by2.get();
  for (int64_t n = 0; n < N; ++n) ASSERT_EQ(y2[3 * N + n], y[3 * N + n]) << "col " << n;
}

// ---------------------------------------------------------------- KV cache + attention

struct SeqSpec {
  int32_t n_past;                        // tokens already in the cache
  int32_t n_new;                         // rows of this call
  int32_t hole_begin = 0, hole_end = 0;  // skipped cache slots (window/sink policies)
};

// The CPU backend computes attention as llama.cpp does without flash
// attention (cpu/cpu_backend.cpp, attend_group): this is that computation
// written out in scalar code, operation by operation, to check the CPU's
// result bit for bit. expf_ref is the algorithm of llama.cpp's ggml_v_expf.
float bits_to_f(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t f_to_bits(float f) { return std::bit_cast<uint32_t>(f); }
float expf_ref(float x) {
  const float shifter = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, shifter);
  const float n = z - shifter;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const uint32_t e = f_to_bits(z) << 23;
  const float k = bits_to_f(e + f_to_bits(1.0f));
  const float u = b * b;
  const float j =
      std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
               0x1.ffffecp-1f * b);
  if (!(std::fabs(n) > 126.0f)) return std::fma(j, k, k);
  const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = bits_to_f(g + 0x7f000000u), s2 = bits_to_f(e - g);
  if (std::fabs(n) > 192.0f) return s1 * s1;
  return std::fma(s2, j, s2) * s1;
}
float hsum8_tree(const float l[8]) {  // ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))
  const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
  return (t0 + t2) + (t1 + t3);
}
float hadd_tree(const float l[8]) {  // ((l0+l4) + (l1+l5)) + ((l2+l6) + (l3+l7))
  const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
  return (t0 + t1) + (t2 + t3);
}
// Four 8-lane accumulators reduced as ggml_vec_dot_f16 does: (a0+a2) + (a1+a3), then hadd_tree.
float reduce_vec(const float a[4][8]) {
  float l[8];
  for (int k = 0; k < 8; ++k) l[k] = (a[0][k] + a[2][k]) + (a[1][k] + a[3][k]);
  return hadd_tree(l);
}
// k, v: [slot][hd] f16-rounded rows of one kv head; q: one query head.
std::vector<float> attention_llamacpp_order(const float* q_in, const std::vector<const float*>& k,
                                            const std::vector<const float*>& v, const std::vector<bool>& skip,
                                            int32_t hd, float scale, bool vec_order) {
  const int32_t n = static_cast<int32_t>(k.size()), n_pad = (n + 31) / 32 * 32;
  std::vector<float> q(hd), s(n_pad, -INFINITY);
  for (int32_t i = 0; i < hd; ++i) q[i] = f16_round(q_in[i]);
  for (int32_t t = 0; t < n; ++t) {
    if (skip[t]) continue;
    float dot;
    if (!vec_order) {
      float l[8] = {};
      for (int32_t i = 0; i < hd; i += 8)
        for (int c = 0; c < 8; ++c) l[c] = std::fma(k[t][i + c], q[i + c], l[c]);
      dot = hsum8_tree(l);
    } else {
      float a[4][8] = {};
      const int32_t np = hd / 32 * 32;
      for (int32_t i = 0; i < np; i += 32)
        for (int j = 0; j < 4; ++j)
          for (int c = 0; c < 8; ++c) a[j][c] = std::fma(k[t][i + 8 * j + c], q[i + 8 * j + c], a[j][c]);
      double d = reduce_vec(a);
      for (int32_t i = np; i < hd; ++i) d += static_cast<double>(k[t][i] * q[i]);
      dot = static_cast<float>(d);
    }
    s[t] = dot * scale;
  }
  float mx = -INFINITY;
  for (float x : s) mx = std::max(mx, x);
  double sum = 0;
  for (int32_t c = 0; c < n_pad; c += 8) {
    float e[8];
    for (int i = 0; i < 8; ++i) s[c + i] = e[i] = expf_ref(s[c + i] - mx);
    sum += hsum8_tree(e);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (auto& x : s) x = f16_round(x * inv);
  const int lanes = vec_order ? 32 : 8;
  std::vector<float> acc(static_cast<size_t>(lanes) * hd, 0.0f), out(hd);
  for (int32_t t = 0; t < n; ++t)
    for (int32_t d = 0; d < hd; ++d) acc[(t % lanes) * hd + d] = std::fma(s[t], v[t][d], acc[(t % lanes) * hd + d]);
  for (int32_t d = 0; d < hd; ++d) {
    if (!vec_order) {
      float l[8];
      for (int c = 0; c < 8; ++c) l[c] = acc[c * hd + d];
      out[d] = hsum8_tree(l);
    } else {
      float a[4][8];
      for (int j = 0; j < 4; ++j)
        for (int c = 0; c < 8; ++c) a[j][c] = acc[(8 * j + c) * hd + d];
      out[d] = reduce_vec(a);
    }
  }
  return out;
}

// A row of Q8_0 KV as the cache holds it (llama.cpp's quantize_row_q8_0_ref:
// d = max|x| / 127 as f16, q = roundf(x / d)), read back as d * q.
std::vector<float> q8_round(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t b = 0; b + 32 <= x.size(); b += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f, dh = fp16_to_fp32(fp32_to_fp16(d));
    for (int j = 0; j < 32; ++j) out[b + j] = dh * static_cast<float>(static_cast<int8_t>(std::roundf(x[b + j] * id)));
  }
  return out;
}

// Fills the cache of `layer` for every sequence (past + new tokens), runs
// attention for the new rows and compares with a double-precision reference.
// kv_dtype Q8_0: the cache holds Q8_0 rows; the references read the same
// dequantized values (so the CPU's result is still the llama.cpp-order
// computation on them, to the bit).
void check_attention(Backend& be, int32_t heads, int32_t kv_heads, int32_t hd, int32_t bs,
                     const std::vector<SeqSpec>& specs, uint32_t seed, int32_t window = 0,
                     DType kv_dtype = DType::F16) {
  const int32_t layers = 2, layer = 1, G = heads / kv_heads;
  int32_t blocks_needed = 0;
  for (const auto& s : specs) blocks_needed += (s.n_past + s.n_new + bs - 1) / bs;
  KvGeometry g;
  g.num_layers = layers;
  g.num_kv_heads = kv_heads;
  g.head_dim = hd;
  g.block_size = bs;
  g.num_blocks = blocks_needed + 7;
  g.dtype = kv_dtype;
  be.kv_init(g);
  std::mt19937 rng(seed);
  std::vector<int32_t> perm(g.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);  // non-contiguous, out-of-order blocks
  size_t next_block = 0;
  const int32_t kv_dim = kv_heads * hd;

  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<float>> kmirror, vmirror;  // [slot][kv_dim], f16-rounded
  std::vector<AttentionSeq> seqs;
  std::vector<int32_t> kv_len;
  int32_t row = 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    const int32_t total = specs[s].n_past + specs[s].n_new;
    std::vector<int32_t> table;
    for (int32_t i = 0; i < (total + bs - 1) / bs; ++i) table.push_back(perm[next_block++]);
    const auto k = randn(static_cast<size_t>(total) * kv_dim, seed + 100 + s);
    const auto v = randn(static_cast<size_t>(total) * kv_dim, seed + 200 + s);
    std::vector<int32_t> slots(total);
    for (int32_t t = 0; t < total; ++t) slots[t] = table[t / bs] * bs + t % bs;
    Buf bk(be, k), bv(be, v);
    be.kv_store(layer, bk.f(), bv.f(), slots.data(), total);
    // Layer 0 gets different data: attention must read its own layer.
    const auto junk = randn(k.size(), seed + 300 + s, 50.0f);
    Buf bj(be, junk);
    be.kv_store(0, bj.f(), bj.f(), slots.data(), total);
    std::vector<float> km(k.size()), vm(v.size());
    if (kv_dtype == DType::Q8_0) {
      km = q8_round(k), vm = q8_round(v);
    } else {
      for (size_t i = 0; i < k.size(); ++i) km[i] = f16_round(k[i]), vm[i] = f16_round(v[i]);
    }
    kmirror.push_back(km);
    vmirror.push_back(vm);
    tables.push_back(table);
    for (int32_t r = 0; r < specs[s].n_new; ++r) kv_len.push_back(specs[s].n_past + r + 1);
    seqs.push_back(AttentionSeq{row, specs[s].n_new, nullptr, static_cast<int32_t>(table.size()), specs[s].hole_begin,
                                specs[s].hole_end});
    row += specs[s].n_new;
  }
  for (size_t s = 0; s < specs.size(); ++s) seqs[s].block_table = tables[s].data();
  const int32_t rows = row;
  const auto q = randn(static_cast<size_t>(rows) * heads * hd, seed + 7);
  Buf bq(be, q), out(be, q.size() * 4);
  AttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  p.kv_len = kv_len.data();
  p.window = window;
  // Single-row sequences are decodes (a generated token fed back), the rest
  // prompt rows: both summation orders of the CPU backend are checked.
  std::vector<uint8_t> decode_rows;
  for (const auto& sp : specs)
    decode_rows.insert(decode_rows.end(), static_cast<size_t>(sp.n_new), sp.n_new == 1 ? 1 : 0);
  p.decode_rows = decode_rows.data();
  be.attention(layer, bq.f(), seqs.data(), static_cast<int32_t>(seqs.size()), p, out.f());
  const auto got = out.get();
  // The CPU backend must equal the llama.cpp-order computation bit for bit;
  // every backend must be within f16 precision of the exact (double) result.
  const bool exact = be.name().rfind("cpu", 0) == 0;
  for (size_t s = 0; s < specs.size(); ++s) {
    for (int32_t r = seqs[s].first_row; r < seqs[s].first_row + seqs[s].n_rows; ++r) {
      for (int32_t h = 0; h < heads; ++h) {
        const int32_t kvh = h / G;
        const float* qh = q.data() + (static_cast<size_t>(r) * heads + h) * hd;
        const float* o_got = got.data() + (static_cast<size_t>(r) * heads + h) * hd;
        auto in_hole = [&](int32_t t) {
          return (t >= specs[s].hole_begin && t < specs[s].hole_end) || (window > 0 && t < kv_len[r] - window);
        };
        if (exact) {
          std::vector<const float*> kr, vr;
          std::vector<bool> skip;
          for (int32_t t = 0; t < kv_len[r]; ++t) {
            kr.push_back(kmirror[s].data() + (static_cast<size_t>(t) * kv_heads + kvh) * hd);
            vr.push_back(vmirror[s].data() + (static_cast<size_t>(t) * kv_heads + kvh) * hd);
            skip.push_back(in_hole(t));
          }
          const auto want = attention_llamacpp_order(qh, kr, vr, skip, hd, p.scale, decode_rows[r] != 0);
          for (int32_t i = 0; i < hd; ++i)
            ASSERT_EQ(f_to_bits(o_got[i]), f_to_bits(want[i]))
                << "seq " << s << " row " << r << " head " << h << " dim " << i << ": " << o_got[i] << " vs " << want[i]
                << " (heads " << heads << "/" << kv_heads << ", hd " << hd << ", bs " << bs << ")";
        }
        std::vector<double> sc(kv_len[r]);
        double mx = -1e300;
        for (int32_t t = 0; t < kv_len[r]; ++t) {
          if (in_hole(t)) continue;
          double d = 0;
          for (int32_t i = 0; i < hd; ++i)
            d += static_cast<double>(qh[i]) * kmirror[s][(static_cast<size_t>(t) * kv_heads + kvh) * hd + i];
          sc[t] = d * p.scale;
          mx = std::max(mx, sc[t]);
        }
        double sum = 0;
        for (int32_t t = 0; t < kv_len[r]; ++t) sum += (sc[t] = in_hole(t) ? 0.0 : std::exp(sc[t] - mx));
        // f16 query and probabilities (the CPU's, like llama.cpp's): 2^-11
        // relative on each, |V| < 6 here.
        const double tol = exact ? 4e-3 : 2e-4;
        for (int32_t i = 0; i < hd; ++i) {
          double o = 0;
          for (int32_t t = 0; t < kv_len[r]; ++t)
            o += sc[t] * vmirror[s][(static_cast<size_t>(t) * kv_heads + kvh) * hd + i];
          o /= sum;
          ASSERT_NEAR(o_got[i], o, tol) << "seq " << s << " row " << r << " head " << h << " dim " << i << " (heads "
                                        << heads << "/" << kv_heads << ", hd " << hd << ", bs " << bs << ")";
        }
      }
    }
  }
}

TEST_P(BackendOps, AttentionPrefillDecodeMixedGqa) {
  // Prefill from empty, a chunked prefill on a cache, decodes (one short, one long).
  const std::vector<SeqSpec> mixed = {{0, 20}, {40, 3}, {300, 1}, {5, 1}};
  check_attention(b(), 8, 2, 64, 16, mixed, 1);              // G = 4
  check_attention(b(), 6, 2, 64, 16, mixed, 2);              // G = 3 (SmolLM2-like)
  check_attention(b(), 4, 4, 32, 16, mixed, 3);              // MHA
  check_attention(b(), 16, 1, 128, 16, mixed, 4);            // G = 16, head_dim 128
  check_attention(b(), 4, 2, 256, 8, {{0, 5}, {33, 1}}, 5);  // head_dim 256, block 8
  check_attention(b(), 4, 2, 72, 5, {{0, 9}, {13, 2}}, 6);   // head_dim 72, odd block size
}

TEST_P(BackendOps, AttentionOverAQ8Cache) {
  if (!b().supports_kv_dtype(DType::Q8_0)) GTEST_SKIP() << "no q8_0 KV cache";
  const std::vector<SeqSpec> mixed = {{0, 20}, {40, 3}, {300, 1}, {5, 1}};
  check_attention(b(), 8, 2, 64, 16, mixed, 41, 0, DType::Q8_0);
  check_attention(b(), 6, 2, 64, 16, mixed, 42, 0, DType::Q8_0);
  check_attention(b(), 4, 4, 32, 16, mixed, 43, 0, DType::Q8_0);
  check_attention(b(), 16, 1, 128, 16, mixed, 44, 0, DType::Q8_0);
  check_attention(b(), 4, 2, 256, 8, {{0, 5}, {33, 1}}, 45, 0, DType::Q8_0);
  check_attention(b(), 4, 1, 256, 16, {{600, 1}, {0, 70}, {520, 8}}, 46, 512, DType::Q8_0);  // window
  if (b().supports_cache_policies())
    check_attention(b(), 8, 2, 64, 16, {{100, 1, 4, 60}, {40, 3, 4, 20}, {300, 1, 4, 200}}, 47, 0, DType::Q8_0);
  // Rows that are no multiple of 32 cannot be Q8_0.
  KvGeometry g{1, 2, 72, 16, 4};
  g.dtype = DType::Q8_0;
  try {
    b().kv_init(g);
    FAIL() << "a q8_0 cache of head_dim 72 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kUnsupported);
  }
}

TEST_P(BackendOps, AttentionSkipsTheHole) {
  if (!b().supports_cache_policies()) GTEST_SKIP() << "no cache policies";
  // Sinks + window: slots [4, hole_end) evicted; holes inside a tile, across
  // tiles, covering whole 32-slot tiles, and with long caches (split-K).
  check_attention(b(), 8, 2, 64, 16, {{100, 1, 4, 60}, {40, 3, 4, 20}, {300, 1, 4, 200}, {20, 2}}, 21);
  check_attention(b(), 4, 4, 32, 16, {{2000, 1, 4, 1900}, {70, 8, 10, 11}}, 22);
}

TEST_P(BackendOps, AttentionSlidingWindow) {
  // Local layers (Gemma 3): each row sees its last `window` slots only; rows
  // of one chunk have windows that start at different slots; with a hole too.
  check_attention(b(), 8, 2, 64, 16, {{100, 1}, {40, 30}, {300, 1}, {5, 3}}, 31, 37);
  check_attention(b(), 4, 1, 256, 16, {{600, 1}, {0, 70}, {520, 8}}, 32, 512);
  check_attention(b(), 4, 4, 32, 16, {{2000, 1}, {70, 8}}, 33, 64);
  if (b().supports_cache_policies()) check_attention(b(), 8, 2, 64, 16, {{100, 1, 4, 60}, {40, 3, 4, 20}}, 34, 50);
}

// Token trees (speculative verification): each tree row, seeing the cache
// through its slot map (prefix, then its ancestors' slots), computes exactly
// what the same path decoded as a chain in consecutive slots computes.
void check_tree_attention(Backend& be, int32_t heads, int32_t kv_heads, int32_t hd, int32_t bs, int32_t n_past,
                          const std::vector<int32_t>& parents, uint32_t seed, int32_t window = 0) {
  const int32_t layer = 1, n_nodes = static_cast<int32_t>(parents.size()), kv_dim = kv_heads * hd;
  auto depth_of = [&](int32_t n) {
    int32_t d = 0;
    for (int32_t a = n; a > 0; a = parents[static_cast<size_t>(a)]) ++d;
    return d;
  };
  auto path_of = [&](int32_t n) {  // ancestors below the root, then n
    std::vector<int32_t> p;
    for (int32_t a = n; a > 0; a = parents[static_cast<size_t>(a)]) p.push_back(a);
    std::reverse(p.begin(), p.end());
    return p;
  };
  // The tree: the prefix in slots [0, n_past), node i (0 = root) in slot
  // n_past + i. One chain per node: the prefix, then its path in order.
  const int32_t tree_slots = n_past + n_nodes;
  const int32_t tree_blocks = (tree_slots + bs - 1) / bs;
  const int32_t chain_blocks = (n_past + n_nodes + bs - 1) / bs;
  KvGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = kv_heads;
  g.head_dim = hd;
  g.block_size = bs;
  g.num_blocks = tree_blocks + n_nodes * chain_blocks + 3;
  be.kv_init(g);
  std::mt19937 rng(seed);
  std::vector<int32_t> perm(static_cast<size_t>(g.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  const auto k = randn(static_cast<size_t>(tree_slots) * kv_dim, seed + 1);
  const auto v = randn(static_cast<size_t>(tree_slots) * kv_dim, seed + 2);
  auto store = [&](const std::vector<int32_t>& table, const std::vector<int32_t>& src_rows) {
    // Writes rows src_rows[i] of k/v into logical slots i of `table`.
    std::vector<float> ks, vs;
    std::vector<int32_t> slots;
    for (size_t i = 0; i < src_rows.size(); ++i) {
      const size_t r = static_cast<size_t>(src_rows[i]);
      ks.insert(ks.end(), k.begin() + r * kv_dim, k.begin() + (r + 1) * kv_dim);
      vs.insert(vs.end(), v.begin() + r * kv_dim, v.begin() + (r + 1) * kv_dim);
      slots.push_back(table[i / bs] * bs + static_cast<int32_t>(i) % bs);
    }
    Buf bk(be, ks), bv(be, vs);
    be.kv_store(layer, bk.f(), bv.f(), slots.data(), static_cast<int32_t>(slots.size()));
  };
  std::vector<int32_t> tree_table;
  for (int32_t i = 0; i < tree_blocks; ++i) tree_table.push_back(perm[next++]);
  std::vector<int32_t> all(static_cast<size_t>(tree_slots));
  std::iota(all.begin(), all.end(), 0);
  store(tree_table, all);
  std::vector<std::vector<int32_t>> chain_tables(static_cast<size_t>(n_nodes));
  for (int32_t n = 0; n < n_nodes; ++n) {
    for (int32_t i = 0; i < chain_blocks; ++i) chain_tables[static_cast<size_t>(n)].push_back(perm[next++]);
    std::vector<int32_t> rows(static_cast<size_t>(n_past + 1));
    std::iota(rows.begin(), rows.end(), 0);  // the prefix and the root
    for (int32_t a : path_of(n)) rows.push_back(n_past + a);
    store(chain_tables[static_cast<size_t>(n)], rows);
  }
  // Tree rows: one sequence of n_nodes rows; chains: n_nodes one-row sequences.
  const auto q = randn(static_cast<size_t>(n_nodes) * heads * hd, seed + 3);
  std::vector<int32_t> kv_len(static_cast<size_t>(n_nodes)), from(static_cast<size_t>(n_nodes), -1),
      begin(static_cast<size_t>(n_nodes), 0), map;
  for (int32_t n = 0; n < n_nodes; ++n) {
    const int32_t d = depth_of(n);
    kv_len[static_cast<size_t>(n)] = n_past + 1 + d;
    if (n == 0) continue;
    from[static_cast<size_t>(n)] = n_past + 1;
    begin[static_cast<size_t>(n)] = static_cast<int32_t>(map.size());
    for (int32_t a : path_of(n)) map.push_back(n_past + a);
  }
  std::vector<uint8_t> decode(static_cast<size_t>(n_nodes), 1);
  AttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  p.decode_rows = decode.data();
  p.window = window;
  Buf bq(be, q), tree_out(be, q.size() * 4), chain_out(be, q.size() * 4);
  AttentionSeq tree_seq{0, n_nodes, tree_table.data(), tree_blocks, 0, 0};
  p.kv_len = kv_len.data();
  p.tree_from = from.data();
  p.tree_begin = begin.data();
  p.tree_slots = map.data();
  be.attention(layer, bq.f(), &tree_seq, 1, p, tree_out.f());
  std::vector<AttentionSeq> chains;
  for (int32_t n = 0; n < n_nodes; ++n) {
    chains.push_back(AttentionSeq{n, 1, chain_tables[static_cast<size_t>(n)].data(), chain_blocks, 0, 0});
  }
  p.tree_from = p.tree_begin = p.tree_slots = nullptr;
  be.attention(layer, bq.f(), chains.data(), n_nodes, p, chain_out.f());
  const auto got = tree_out.get(), want = chain_out.get();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(f_to_bits(got[i]), f_to_bits(want[i]))
        << "node " << i / (static_cast<size_t>(heads) * hd) << " element " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST_P(BackendOps, AttentionTokenTreeRowsEqualTheirChains) {
  // A chain, a bushy tree, a deep tree; across block boundaries; GQA; a
  // window (Gemma 3's local layers) that cuts into the prefix.
  const std::vector<int32_t> chain = {-1, 0, 1, 2, 3, 4};
  const std::vector<int32_t> bushy = {-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 3, 10};
  const std::vector<int32_t> deep = {-1, 0, 1, 2, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 3, 14, 15, 16, 17, 18, 19};
  check_tree_attention(b(), 8, 2, 64, 16, 30, chain, 41);
  check_tree_attention(b(), 6, 2, 64, 16, 45, bushy, 42);
  check_tree_attention(b(), 4, 4, 32, 16, 100, deep, 43);
  check_tree_attention(b(), 4, 1, 128, 8, 7, bushy, 44);
  check_tree_attention(b(), 8, 2, 64, 16, 90, deep, 45, 40);
}

TEST_P(BackendOps, AttentionLongContextDecodes) {
  // Long caches at decode: split-K on the GPU.
  check_attention(b(), 32, 8, 128, 16, {{2047, 1}}, 11);
  check_attention(b(), 8, 2, 64, 16, {{4000, 1}, {100, 1}, {1500, 1}}, 12);
  check_attention(b(), 8, 8, 64, 16, {{700, 40}}, 13);  // a long chunked prefill
  // Fewer items than twice the threads: the CPU splits each over them.
  check_attention(b(), 8, 1, 64, 16, {{3000, 1}}, 14);
  check_attention(b(), 9, 3, 64, 16, {{1100, 1}}, 15);
}

TEST_P(BackendOps, KvCopyBlocksIncludingChains) {
  // Write a sequence into blocks {3}, copy 3 -> 9 -> 11 (a chain: sequential
  // semantics), then attend through block 11: same result as through 3.
  const int32_t heads = 4, kv_heads = 2, hd = 64, bs = 16;
  KvGeometry g{2, kv_heads, hd, bs, 16};
  b().kv_init(g);
  const int32_t n = 10;
  const auto k = randn(static_cast<size_t>(n) * kv_heads * hd, 1), v = randn(k.size(), 2);
  std::vector<int32_t> slots(n);
  for (int32_t t = 0; t < n; ++t) slots[t] = 3 * bs + t;
  Buf bk(b(), k), bv(b(), v);
  for (int32_t l = 0; l < 2; ++l) b().kv_store(l, bk.f(), bv.f(), slots.data(), n);
  const std::vector<int32_t> src = {3, 9}, dst = {9, 11};
  b().kv_copy_blocks(src.data(), dst.data(), 2);
  const auto q = randn(static_cast<size_t>(heads) * hd, 3);
  Buf bq(b(), q), o1(b(), q.size() * 4), o2(b(), q.size() * 4);
  AttentionParams p{heads, kv_heads, hd, 0.125f, nullptr};
  const int32_t len = n;
  p.kv_len = &len;
  for (int32_t l = 0; l < 2; ++l) {
    const int32_t t3 = 3, t11 = 11;
    AttentionSeq s3{0, 1, &t3, 1}, s11{0, 1, &t11, 1};
    b().attention(l, bq.f(), &s3, 1, p, o1.f());
    b().attention(l, bq.f(), &s11, 1, p, o2.f());
    const auto a = o1.get(), c = o2.get();
    ASSERT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0) << "layer " << l;
  }
}

TEST_P(BackendOps, KvBlockReadWriteAndRopeShift) {
  if (!b().supports_cache_policies()) GTEST_SKIP() << "no cache policies";
  const int32_t layers = 3, kv_heads = 2, hd = 64, bs = 16;
  KvGeometry g{layers, kv_heads, hd, bs, 6};
  b().kv_init(g);
  const size_t bytes = g.bytes_per_block();
  // Write / read round trip, bit for bit, and the other blocks untouched.
  std::vector<uint16_t> img(bytes / 2);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& h : img) h = fp32_to_fp16(d(rng));
  b().kv_write_block(4, img.data());
  std::vector<uint16_t> back(img.size()), other(img.size());
  b().kv_read_block(4, back.data());
  ASSERT_EQ(std::memcmp(img.data(), back.data(), bytes), 0);
  b().kv_read_block(3, other.data());
  for (uint16_t h : other) ASSERT_EQ(h, 0);
  // The image is [layer][K|V][kv_head][slot][head_dim]: shift K by delta and compare.
  const int32_t delta = -37, rot = 48;
  const float base = 10000.0f;
  const int32_t blocks[2] = {4, 99};  // an id outside the pool is skipped
  b().kv_rope_shift(blocks, 2, delta, rot, base);
  b().kv_read_block(4, back.data());
  const size_t per = static_cast<size_t>(kv_heads) * bs * hd;
  for (int32_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const uint16_t* a = img.data() + (static_cast<size_t>(l) * 2 + kv) * per;
      const uint16_t* c = back.data() + (static_cast<size_t>(l) * 2 + kv) * per;
      for (size_t row = 0; row < static_cast<size_t>(kv_heads) * bs; ++row) {
        for (int32_t i = 0; i < hd; i += 2) {
          double y0 = fp16_to_fp32(a[row * hd + i]), y1 = fp16_to_fp32(a[row * hd + i + 1]);
          if (kv == 0 && i < rot) {
            const double th = delta * std::pow(static_cast<double>(base), -2.0 * (i / 2) / rot);
            const double x0 = y0, x1 = y1;
            y0 = x0 * std::cos(th) - x1 * std::sin(th);
            y1 = x0 * std::sin(th) + x1 * std::cos(th);
          }
          ASSERT_NEAR(fp16_to_fp32(c[row * hd + i]), y0, 2e-3 * (1 + std::fabs(y0))) << l << " " << kv << " " << row;
          ASSERT_NEAR(fp16_to_fp32(c[row * hd + i + 1]), y1, 2e-3 * (1 + std::fabs(y1)));
        }
      }
    }
  }
}

// A Q8_0 cache: block copies and raw reads are byte-exact, a K-shift
// rotates each K row (dequantized, rotated, requantized: within Q8_0's
// rounding of the exact rotation) and leaves V as it was.
TEST_P(BackendOps, Q8CacheCopyReadWriteAndShift) {
  if (!b().supports_kv_dtype(DType::Q8_0) || !b().supports_cache_policies()) GTEST_SKIP() << "no q8_0 KV cache";
  const int32_t layers = 2, kv_heads = 2, hd = 64, bs = 16;
  KvGeometry g{layers, kv_heads, hd, bs, 6};
  g.dtype = DType::Q8_0;
  b().kv_init(g);
  const size_t bytes = g.bytes_per_block();
  ASSERT_EQ(bytes, static_cast<size_t>(layers) * 2 * kv_heads * bs * (hd / 32 * 34));
  const auto k = randn(static_cast<size_t>(bs) * kv_heads * hd, 61), v = randn(k.size(), 62);
  std::vector<int32_t> slots(bs);
  for (int32_t t = 0; t < bs; ++t) slots[t] = 4 * bs + t;
  Buf bk(b(), k), bv(b(), v);
  for (int32_t l = 0; l < layers; ++l) b().kv_store(l, bk.f(), bv.f(), slots.data(), bs);
  const int32_t src = 4, dst = 1;
  b().kv_copy_blocks(&src, &dst, 1);
  std::vector<uint8_t> img(bytes), copy(bytes), back(bytes);
  b().kv_read_block(4, img.data());
  b().kv_read_block(1, copy.data());
  ASSERT_EQ(img, copy);
  // The stored rows are the reference's Q8_0 of k and v.
  const size_t rb = hd / 32 * 34, per = static_cast<size_t>(kv_heads) * bs * rb;
  auto deq = [&](const uint8_t* row) {
    std::vector<float> x(hd);
    for (int32_t b0 = 0; b0 < hd; b0 += 32) {
      uint16_t dh;
      std::memcpy(&dh, row + b0 / 32 * 34, 2);
      for (int j = 0; j < 32; ++j)
        x[b0 + j] = fp16_to_fp32(dh) * static_cast<float>(static_cast<int8_t>(row[b0 / 32 * 34 + 2 + j]));
    }
    return x;
  };
  for (int32_t h = 0; h < kv_heads; ++h)
    for (int32_t t = 0; t < bs; ++t) {
      const std::vector<float> kin(k.begin() + (static_cast<size_t>(t) * kv_heads + h) * hd,
                                   k.begin() + (static_cast<size_t>(t) * kv_heads + h + 1) * hd);
      ASSERT_EQ(deq(img.data() + (static_cast<size_t>(h) * bs + t) * rb), q8_round(kin)) << h << " " << t;
    }
  std::vector<RopeSpec> specs(layers);
  specs[0].rot_dim = 48;  // adjacent pairs, part of the row
  specs[1].rot_dim = 64;
  specs[1].neox = true;
  specs[1].freq_base = 1000000.0f;
  const int32_t delta = -37, blocks[1] = {4};
  b().kv_rope_shift_layers(blocks, 1, delta, specs.data(), layers);
  b().kv_read_block(4, back.data());
  for (int32_t l = 0; l < layers; ++l) {
    const uint8_t* vin = img.data() + (static_cast<size_t>(l) * 2 + 1) * per;
    ASSERT_EQ(std::memcmp(vin, back.data() + (static_cast<size_t>(l) * 2 + 1) * per, per), 0) << "V changed";
    for (size_t row = 0; row < static_cast<size_t>(kv_heads) * bs; ++row) {
      const auto x = deq(img.data() + static_cast<size_t>(l) * 2 * per + row * rb);
      const auto y = deq(back.data() + static_cast<size_t>(l) * 2 * per + row * rb);
      std::vector<double> want(x.begin(), x.end());
      const int32_t rot = specs[l].rot_dim, half = rot / 2;
      for (int32_t i = 0; i < half; ++i) {
        const double th = delta * std::pow(static_cast<double>(specs[l].freq_base), -2.0 * i / rot);
        const int32_t a = specs[l].neox ? i : 2 * i, c = specs[l].neox ? i + half : 2 * i + 1;
        want[a] = x[a] * std::cos(th) - x[c] * std::sin(th);
        want[c] = x[a] * std::sin(th) + x[c] * std::cos(th);
      }
      double amax = 0;
      for (double w : want) amax = std::max(amax, std::fabs(w));
      for (int32_t i = 0; i < hd; ++i) ASSERT_NEAR(y[i], want[i], amax / 127.0 + 1e-6) << l << " " << row << " " << i;
    }
  }
}

// Rows no model should produce still store without an out-of-range
// conversion (UBSan in CI): subnormal values (1 / d overflows), inf, NaN.
TEST_P(BackendOps, Q8CacheStoresDegenerateRows) {
  if (!b().supports_kv_dtype(DType::Q8_0)) GTEST_SKIP() << "no q8_0 KV cache";
  const int32_t hd = 64;
  KvGeometry g{1, 1, hd, 16, 2};
  g.dtype = DType::Q8_0;
  b().kv_init(g);
  std::vector<float> k(4 * hd, 1e-41f), v(4 * hd, 0.0f);
  k[hd + 3] = INFINITY;
  k[2 * hd + 5] = NAN;
  k[3 * hd + 7] = -3e38f;
  const std::vector<int32_t> slots = {0, 1, 2, 3};
  Buf bk(b(), k), bv(b(), v);
  b().kv_store(0, bk.f(), bv.f(), slots.data(), 4);
  std::vector<uint8_t> img(g.bytes_per_block());
  b().kv_read_block(0, img.data());
  const size_t rb = hd / 32 * 34;
  EXPECT_EQ(static_cast<int8_t>(img[2]), 127);  // a subnormal row: every value the block's maximum
  EXPECT_EQ(static_cast<int8_t>(img[3 * rb + 2 + 7]), -127);
}

// K-shift for other architectures: NEOX pairs, a base per layer (Gemma 3's
// local and global layers), scaled frequencies with factors.
TEST_P(BackendOps, KvRopeShiftPerLayerNeox) {
  if (!b().supports_cache_policies()) GTEST_SKIP() << "no cache policies";
  const int32_t layers = 3, kv_heads = 2, hd = 64, bs = 16;
  KvGeometry g{layers, kv_heads, hd, bs, 6};
  b().kv_init(g);
  const size_t bytes = g.bytes_per_block();
  std::vector<uint16_t> img(bytes / 2), back(bytes / 2);
  std::mt19937 rng(2);
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& h : img) h = fp32_to_fp16(d(rng));
  b().kv_write_block(2, img.data());
  const int32_t delta = -29, rot = 64;
  std::vector<float> factors(rot / 2);
  for (int32_t i = 0; i < rot / 2; ++i) factors[i] = 1.0f + 0.25f * static_cast<float>(i % 5);
  std::vector<RopeSpec> specs(layers);
  for (int32_t l = 0; l < layers; ++l) {
    specs[l].rot_dim = rot;
    specs[l].neox = true;
    specs[l].freq_base = l == 1 ? 1000000.0f : 10000.0f;
    specs[l].freq_scale = l == 2 ? 0.5f : 1.0f;
    specs[l].freq_factors = l == 2 ? factors.data() : nullptr;
  }
  const int32_t blocks[1] = {2};
  b().kv_rope_shift_layers(blocks, 1, delta, specs.data(), layers);
  b().kv_read_block(2, back.data());
  const size_t per = static_cast<size_t>(kv_heads) * bs * hd;
  for (int32_t l = 0; l < layers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const uint16_t* a = img.data() + (static_cast<size_t>(l) * 2 + kv) * per;
      const uint16_t* c = back.data() + (static_cast<size_t>(l) * 2 + kv) * per;
      for (size_t row = 0; row < static_cast<size_t>(kv_heads) * bs; ++row) {
        std::vector<double> want(hd);
        for (int32_t i = 0; i < hd; ++i) want[i] = fp16_to_fp32(a[row * hd + i]);
        if (kv == 0) {
          for (int32_t i = 0; i < rot / 2; ++i) {
            double th = delta * std::pow(static_cast<double>(specs[l].freq_base), -2.0 * i / rot) * specs[l].freq_scale;
            if (specs[l].freq_factors) th /= specs[l].freq_factors[i];
            const double x0 = want[i], x1 = want[i + rot / 2];
            want[i] = x0 * std::cos(th) - x1 * std::sin(th);
            want[i + rot / 2] = x0 * std::sin(th) + x1 * std::cos(th);
          }
        }
        for (int32_t i = 0; i < hd; ++i)
          ASSERT_NEAR(fp16_to_fp32(c[row * hd + i]), want[i], 2e-3 * (1 + std::fabs(want[i])))
              << "layer " << l << " kv " << kv << " row " << row << " dim " << i;
      }
    }
  }
}

// The engine's default batch_invariant mode (the CPU backend's default; the
// CUDA backend's through BackendExtras::set_batch_invariant): a row gives the
// same bits whatever else is in the batch.
TEST_P(BackendOps, BatchInvariantRows) {
  if (extras_) extras_->set_batch_invariant(true);
  // Matmul: 37 rows computed together equal each row computed alone, for
  // both kinds of row (prompt and decode). Where one order serves both kinds
  // a prompt row also equals its decode. The CPU sums the kinds in different
  // orders for K-quant weights (llama.cpp's batched and one-row kernels) and
  // for Q4_0 / Q8_0 when AMX prompt rows are on; CUDA never does.
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F16}) {
    const int64_t N = 40, K = gpu::is_kquant(t) ? 256 : 128;
    const int32_t M = 37;
    const auto w = make_weight(t, N, K, 9);
    auto dw = b().upload_weight(WeightDesc{t, N, K, w.data()});
    const auto x = randn(static_cast<size_t>(M) * K, 10);
    const bool one_order = cuda() || !(gpu::is_kquant(t) || cpu::amx_prompt_rows(t));
    for (bool decodes : {false, true}) {
      Buf bx(b(), x), by(b(), static_cast<size_t>(M) * N * 4);
      b().matmul(*dw, bx.f(), M, by.f(), decodes);
      const auto all = by.get();
      for (int32_t m : {0, 17, 36}) {
        std::vector<float> xr(x.begin() + m * K, x.begin() + (m + 1) * K);
        Buf bx1(b(), xr), by1(b(), N * 4);
        for (bool decode : {false, true}) {
          if (decode != decodes && !one_order) continue;
          b().matmul(*dw, bx1.f(), 1, by1.f(), decode);
          const auto one = by1.get();
          ASSERT_EQ(std::memcmp(one.data(), all.data() + m * N, N * 4), 0)
              << type_name(static_cast<uint32_t>(t)) << " row " << m << (decode ? " (decode)" : " (prompt)")
              << " against " << M << (decodes ? " decode rows" : " prompt rows");
        }
      }
    }
  }
  // Attention: a 20-token prefill computed next to a decode on a 3000-slot
  // cache equals each sequence computed alone (prompt rows and a decode row).
  const int32_t heads = 8, kv_heads = 2, hd = 64, bs = 16;
  KvGeometry g{1, kv_heads, hd, bs, 256};
  b().kv_init(g);
  std::vector<int32_t> ta(2), tb(190);
  std::iota(ta.begin(), ta.end(), 0);
  std::iota(tb.begin(), tb.end(), 10);
  auto fill = [&](const std::vector<int32_t>& table, int32_t n, uint32_t seed) {
    const auto k = randn(static_cast<size_t>(n) * kv_heads * hd, seed), v = randn(k.size(), seed + 1);
    std::vector<int32_t> slots(n);
    for (int32_t i = 0; i < n; ++i) slots[i] = table[i / bs] * bs + i % bs;
    Buf bk(b(), k), bv(b(), v);
    b().kv_store(0, bk.f(), bv.f(), slots.data(), n);
  };
  fill(ta, 20, 1);
  fill(tb, 3001, 2);
  const auto q = randn(static_cast<size_t>(21) * heads * hd, 3);
  Buf bq(b(), q), out(b(), q.size() * 4);
  std::vector<int32_t> lens(21);
  for (int32_t r = 0; r < 20; ++r) lens[r] = r + 1;
  lens[20] = 3001;
  AttentionSeq seqs[2] = {{0, 20, ta.data(), 2}, {20, 1, tb.data(), 190}};
  std::vector<uint8_t> decode_rows(21, 0);
  decode_rows[20] = 1;
  AttentionParams p{heads, kv_heads, hd, 0.125f, lens.data(), decode_rows.data()};
  b().attention(0, bq.f(), seqs, 2, p, out.f());
  const auto batched = out.get();
  const size_t row = static_cast<size_t>(heads) * hd;
  // Each sequence alone: the 20-row prefill, and the decode row.
  {
    Buf bq1(b(), std::vector<float>(q.begin(), q.begin() + 20 * row)), o1(b(), 20 * row * 4);
    AttentionParams p1{heads, kv_heads, hd, 0.125f, lens.data()};
    b().attention(0, bq1.f(), &seqs[0], 1, p1, o1.f());
    const auto alone = o1.get();
    ASSERT_EQ(std::memcmp(alone.data(), batched.data(), 20 * row * 4), 0) << "the prefill rows";
  }
  {
    Buf bq1(b(), std::vector<float>(q.begin() + 20 * row, q.end())), o1(b(), row * 4);
    AttentionSeq one{0, 1, tb.data(), 190};
    AttentionParams p1{heads, kv_heads, hd, 0.125f, &lens[20], &decode_rows[20]};
    b().attention(0, bq1.f(), &one, 1, p1, o1.f());
    const auto alone = o1.get();
    ASSERT_EQ(std::memcmp(alone.data(), batched.data() + 20 * row, row * 4), 0) << "the decode row";
  }
}

// ---------------------------------------------------------------- extras (CUDA)

// The CPU sampler's selection (core/sampling/sampler.cpp) given the uniform draw.
int32_t host_sample(const std::vector<float>& logits, const DeviceSamplingParams& p) {
  const int32_t V = static_cast<int32_t>(logits.size());
  if (p.temperature <= 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<std::pair<float, int32_t>> c(V);
  for (int32_t i = 0; i < V; ++i) c[i] = {logits[i], i};
  auto by = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  const int32_t k = p.top_k <= 0 || p.top_k > std::min(V, BackendExtras::kMaxDeviceTopK)
                        ? std::min(V, BackendExtras::kMaxDeviceTopK)
                        : p.top_k;
  std::partial_sort(c.begin(), c.begin() + k, c.end(), by);
  size_t n = k;
  std::vector<double> probs(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (probs[i] = std::exp((c[i].first - c[0].first) / p.temperature));
  for (auto& x : probs) x /= sum;
  if (p.top_p < 1.0f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += probs[i];
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = std::max<size_t>(keep, 1);
  }
  if (p.min_p > 0) {
    size_t keep = 1;
    while (keep < n && probs[keep] >= probs[0] * p.min_p) ++keep;
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += probs[i];
  double r = p.uniform * total;
  for (size_t i = 0; i < n; ++i) {
    r -= probs[i];
    if (r < 0) return c[i].second;
  }
  return c[n - 1].second;
}

TEST_P(BackendOps, DeviceSampling) {
  if (!extras_) GTEST_SKIP() << GetParam() << " has no extras";
  const int32_t rows = 3, V = 5000;
  auto logits = randn(static_cast<size_t>(rows) * V, 5, 2.0f);
  logits[1 * V + 17] = 9.0f;
  logits[1 * V + 18] = 9.0f;  // a tie: the first wins
  Buf bl(b(), logits);
  std::vector<int32_t> out(rows);
  extras_->sample_argmax(bl.f(), rows, V, out.data());
  for (int32_t r = 0; r < rows; ++r) {
    const auto* row = logits.data() + static_cast<size_t>(r) * V;
    EXPECT_EQ(out[r], std::max_element(row, row + V) - row) << r;
  }
  std::mt19937 rng(8);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int mismatches = 0, trials = 0;
  for (int32_t top_k : {0, 1, 40, 1024, 3000})
    for (float top_p : {1.0f, 0.9f, 0.5f})
      for (float min_p : {0.0f, 0.05f})
        for (float temp : {0.0f, 0.7f, 1.5f}) {
          std::vector<DeviceSamplingParams> ps(rows);
          for (auto& p : ps) p = DeviceSamplingParams{temp, top_k, top_p, min_p, u(rng)};
          extras_->sample(bl.f(), rows, V, ps.data(), nullptr, out.data());
          for (int32_t r = 0; r < rows; ++r) {
            std::vector<float> row(logits.begin() + static_cast<size_t>(r) * V,
                                   logits.begin() + static_cast<size_t>(r + 1) * V);
            ++trials;
            mismatches += out[r] != host_sample(row, ps[r]);  // only a draw on a boundary may differ
          }
        }
  EXPECT_LE(mismatches, trials / 50) << mismatches << " of " << trials;
  // Penalties: a huge repeat penalty on the argmax moves the choice.
  const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
  const int32_t count = 1;
  DevicePenalties pen;
  pen.tokens = &best;
  pen.counts = &count;
  pen.n = 1;
  pen.presence = 100.0f;
  DeviceSamplingParams greedy{0.0f, 0, 1.0f, 0.0f, 0.0};
  int32_t tok = -1;
  extras_->sample(bl.f(), 1, V, &greedy, &pen, &tok);
  EXPECT_NE(tok, best);
}

TEST_P(BackendOps, GraphReplayEqualsEagerExecution) {
  if (!extras_) GTEST_SKIP() << GetParam() << " has no extras";
  const int32_t heads = 8, kv_heads = 2, hd = 64, dim = heads * hd, bs = 16;
  KvGeometry g{1, kv_heads, hd, bs, 8};
  b().kv_init(g);
  const auto wq = make_weight(DType::Q4_0, dim, dim, 1), wk = make_weight(DType::Q4_0, kv_heads * hd, dim, 2);
  auto dq = b().upload_weight(WeightDesc{DType::Q4_0, dim, dim, wq.data()});
  auto dk = b().upload_weight(WeightDesc{DType::Q4_0, kv_heads * hd, dim, wk.data()});
  const auto nw = randn(dim, 3);
  auto dn = b().upload_weight(WeightDesc{DType::F32, 1, dim, nw.data()});
  const int32_t rows = 2;  // two decoding sequences
  Buf x(b(), static_cast<size_t>(rows) * dim * 4), h(b(), static_cast<size_t>(rows) * dim * 4),
      q(b(), static_cast<size_t>(rows) * dim * 4), k(b(), static_cast<size_t>(rows) * kv_heads * hd * 4),
      o(b(), static_cast<size_t>(rows) * dim * 4);
  const std::vector<int32_t> t0 = {1, 4}, t1 = {6, 2};
  // mode 0: eager; 1: graph_begin/graph_end; 2: graph_begin only (the download ends the region).
  auto step = [&](int32_t n_past, int mode) {
    x.set(randn(static_cast<size_t>(rows) * dim, 100 + n_past));
    const std::vector<int32_t> pos = {n_past, n_past + 3};
    const std::vector<int32_t> slots = {t0[(pos[0]) / bs] * bs + pos[0] % bs, t1[(pos[1]) / bs] * bs + pos[1] % bs};
    const std::vector<int32_t> lens = {pos[0] + 1, pos[1] + 1};
    AttentionSeq seqs[2] = {{0, 1, t0.data(), 2}, {1, 1, t1.data(), 2}};
    AttentionParams p{heads, kv_heads, hd, 0.125f, lens.data()};
    if (mode != 0) extras_->graph_begin(42);
    b().rms_norm(x.f(), *dn, rows, dim, 1e-5f, h.f());
    b().matmul(*dq, h.f(), rows, q.f(), true);
    b().matmul(*dk, h.f(), rows, k.f(), true);
    b().rope(q.f(), pos.data(), rows, heads, hd, hd, 10000.0f);
    b().rope(k.f(), pos.data(), rows, kv_heads, hd, hd, 10000.0f);
    b().kv_store(0, k.f(), k.f(), slots.data(), rows);
    b().attention(0, q.f(), seqs, 2, p, o.f());
    b().add(o.f(), x.f(), static_cast<size_t>(rows) * dim);
    if (mode == 1) extras_->graph_end();
    return o.get();
  };
  std::vector<std::vector<float>> eager, graphed;
  for (int32_t n = 0; n < 6; ++n) eager.push_back(step(n, 0));
  b().kv_init(g);  // same pool again (the graphs are dropped)
  for (int32_t n = 0; n < 6; ++n) graphed.push_back(step(n, 1));
  for (int32_t n = 0; n < 6; ++n) {
    ASSERT_EQ(std::memcmp(eager[n].data(), graphed[n].data(), eager[n].size() * 4), 0) << "step " << n;
  }
  const GraphStats st = extras_->graph_stats();
  EXPECT_GE(st.captures, 1u);
  EXPECT_GE(st.replays + st.updates, 4u);
  // A download ends a region by itself (the core may omit graph_end).
  b().kv_init(g);
  for (int32_t n = 0; n < 6; ++n) {
    const auto got = step(n, 2);
    ASSERT_EQ(std::memcmp(eager[n].data(), got.data(), got.size() * 4), 0) << "implicit end, step " << n;
  }
  // An op that throws inside a region leaves the backend usable.
  extras_->graph_begin(44);
  const int32_t bad = -1;
  EXPECT_THROW(b().embed(*dq, &bad, 1, h.f()), Error);
  EXPECT_EQ(step(0, 0).size(), static_cast<size_t>(rows) * dim);
}

INSTANTIATE_TEST_SUITE_P(All, BackendOps,
                         ::testing::Values(std::string("cpu"), std::string("cpu_scalar"), std::string("cuda")),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace ember
