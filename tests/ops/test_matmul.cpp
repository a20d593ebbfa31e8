// Correctness of cpu::matmul / cpu::dequantize_rows against a scalar
// reference: the type table's reference dequantizer + a double-precision dot.
//
// Every weight type x every ISA variant this CPU can run (others are skipped
// with a message) x decode path (forced for all M) and prefill path (oneDNN;
// in a build without it, the decode kernels again)
// x M in {1,2,3,5,8,17,64,300} x odd N x K multiple of 32 (and of 256),
// with 1 and 2 OpenMP threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor/types.h"
#include "core/util/status.h"
#include "cpu/cpu_features.h"
#include "cpu/dnnl_matmul.h"
#include "cpu/matmul.h"
#include "cpu/matmul_internal.h"

namespace ember::cpu {
namespace {

// A bf16 rounding error is uniform within half an ulp, and bf16's ulp is
// 2^-7 of the value's power of two, i.e. up to 2^-7 |x|: variance
// (2^-7 |x|)^2 / 12. (2^-8 |x| underestimates it by up to 2x in sigma for
// values just above a power of two; AVX-512 BF16 machines, whose prefill runs
// in bf16, exceeded that bound.)
constexpr double kBf16Ulp = 0x1p-7;

// libember links no oneDNN: the plugin libember_dnnl.so does, and this build
// made it (tests/dnnl_plugin_dir.cpp says where), so it must load.
TEST(Matmul, OneDnnPluginLoadsWhereTheBuildPutIt) {
#ifdef EMBER_DNNL_PLUGIN_DIR
  ASSERT_TRUE(dnnl_mm::available());
  std::vector<float> x(4 * 8, 1.0f), w(3 * 8, 0.5f), y(4 * 3, 0.0f);
  dnnl_mm::StreamHolder stream;
  dnnl_mm::matmul(dnnl_mm::Precision::kF32, 4, 3, 8, x.data(), 8, w.data(), y.data(), 3, stream);
  for (float v : y) EXPECT_EQ(v, 4.0f);
  EXPECT_GE(dnnl_mm::cache_entries(), 1u);
#else
  EXPECT_FALSE(dnnl_mm::available());
#endif
}

constexpr DType kTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                            DType::Q8_0, DType::F16,  DType::BF16, DType::F32};
constexpr Isa kIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni};
constexpr int64_t kMs[] = {1, 2, 3, 5, 8, 17, 64, 300};

// Restores the process-wide knobs whatever a test does.
struct KnobGuard {
  int threads = omp_get_max_threads();
  PrefillPrecision prec = prefill_precision();
  ~KnobGuard() {
    reset_isa();
    reset_amx_prompt_rows();
    reset_decode_max_m();
    set_prefill_precision(prec);
    omp_set_num_threads(threads);
  }
};

uint16_t f16(float f) { return fp32_to_fp16(f); }

// Random weights in the GGUF layout. Scales vary over a range like real
// models'; quants cover the full range including Q8_0's -128.
std::vector<uint8_t> make_weight(DType t, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.002f, 0.03f);
  std::normal_distribution<float> normal(0.f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> out(row_bytes(t, K) * static_cast<size_t>(N) + 64);  // slack is never read
  uint8_t* p = out.data();
  const int64_t nb = K / 32;
  for (int64_t r = 0; r < N; ++r) {
    switch (t) {
      case DType::Q4_0:
        for (int64_t b = 0; b < nb; ++b, p += sizeof(BlockQ4_0)) {
          BlockQ4_0 blk;
          blk.d = f16((byte(rng) & 1 ? -1.f : 1.f) * scale(rng));
          for (auto& q : blk.qs) q = static_cast<uint8_t>(byte(rng));
          std::memcpy(p, &blk, sizeof(blk));
        }
        break;
      case DType::Q4_1:
        for (int64_t b = 0; b < nb; ++b, p += sizeof(BlockQ4_1)) {
          BlockQ4_1 blk;
          blk.d = f16(scale(rng));
          blk.m = f16(-8.f * scale(rng));
          for (auto& q : blk.qs) q = static_cast<uint8_t>(byte(rng));
          std::memcpy(p, &blk, sizeof(blk));
        }
        break;
      case DType::Q8_0:
        for (int64_t b = 0; b < nb; ++b, p += sizeof(BlockQ8_0)) {
          BlockQ8_0 blk;
          blk.d = f16(scale(rng) / 16.f);
          for (auto& q : blk.qs) q = static_cast<int8_t>(byte(rng) - 128);  // -128..127
          std::memcpy(p, &blk, sizeof(blk));
        }
        break;
      case DType::F16:
        for (int64_t k = 0; k < K; ++k, p += 2) {
          const uint16_t h = f16(normal(rng));
          std::memcpy(p, &h, 2);
        }
        break;
      case DType::BF16:
        for (int64_t k = 0; k < K; ++k, p += 2) {
          const uint16_t h = fp32_to_bf16(normal(rng));
          std::memcpy(p, &h, 2);
        }
        break;
      case DType::F32:
        for (int64_t k = 0; k < K; ++k, p += 4) {
          const float f = normal(rng);
          std::memcpy(p, &f, 4);
        }
        break;
      default: {  // Q5_0, Q5_1, K-quants: random bits, f16 scales of a realistic size
        const size_t bytes = row_bytes(t, K), bs = type_traits(t)->type_size;
        for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(byte(rng));
        const size_t d_at = t == DType::Q6_K ? offsetof(BlockQ6_K, d) : 0;
        const bool has_min = t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K;
        if (t != DType::Q5_0 && t != DType::Q5_1 && t != DType::Q4_K && t != DType::Q5_K && t != DType::Q6_K)
          ADD_FAILURE() << "no generator for type";
        for (size_t off = 0; off < bytes; off += bs) {
          const uint16_t d = f16(scale(rng) / 8.f), m = f16(scale(rng) / 8.f);
          std::memcpy(p + off + d_at, &d, 2);
          if (has_min) std::memcpy(p + off + 2, &m, 2);
        }
        p += bytes;
      }
    }
  }
  return out;
}

// Activations like a transformer's: mostly N(0,1), a few outliers, and an
// all-zero block (scale 0) in row 0 when K allows.
std::vector<float> make_x(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = normal(rng) * (pick(rng) == 0 ? 20.f : 1.f);
  if (K >= 64)
    for (int k = 32; k < 64; ++k) x[k] = 0.f;
  return x;
}

std::vector<float> ref_dequant(DType t, const uint8_t* w, int64_t N, int64_t K) {
  const TypeTraits* tr = type_traits(t);
  EXPECT_NE(tr, nullptr);
  EXPECT_NE(tr->dequantize_row, nullptr);
  std::vector<float> out(static_cast<size_t>(N * K));
  const size_t rb = row_bytes(t, K);
  for (int64_t r = 0; r < N; ++r) tr->dequantize_row(w + r * rb, out.data() + r * K, K);
  return out;
}

float round_bf16(float f) { return bf16_to_fp32(fp32_to_bf16(f)); }

// What the implementation is allowed to round.
struct ErrorModel {
  bool act_q8 = false;    // activations quantized to 8-bit blocks of 32
  bool act_bf16 = false;  // activations rounded to bf16
  bool w_bf16 = false;    // weights rounded to bf16
};

// Compares y against double-precision references. The bound is a 6-sigma
// estimate of the rounding the model allows (uniform rounding errors,
// independent per element) plus f32 accumulation slack, so it is relative to
// the row norms rather than to |y| (y can cancel to ~0).
void expect_close(const std::vector<float>& wf, const std::vector<float>& x, const std::vector<float>& y, int64_t M,
                  int64_t N, int64_t K, const ErrorModel& em, const std::string& what) {
  int bad = 0;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x.data() + m * K;
    std::vector<double> ex2(static_cast<size_t>(K), 0.0);  // variance of the error of x[k]
    for (int64_t b = 0; b * 32 < K; ++b) {
      double amax = 0;
      for (int64_t k = b * 32; k < std::min(K, b * 32 + 32); ++k) amax = std::max(amax, std::fabs((double)xr[k]));
      for (int64_t k = b * 32; k < std::min(K, b * 32 + 32); ++k) {
        double v = 0;
        if (em.act_q8) v += std::pow(amax / 127.0, 2) / 12.0;
        if (em.act_bf16) v += std::pow(xr[k] * kBf16Ulp, 2) / 12.0;
        ex2[k] = v;
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      const float* wr = wf.data() + n * K;
      double ref = 0, abs_sum = 0, var = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += (double)wr[k] * xr[k];
        abs_sum += std::fabs((double)wr[k] * xr[k]);
        var += (double)wr[k] * wr[k] * ex2[k];
        if (em.w_bf16) var += std::pow(wr[k] * kBf16Ulp * xr[k], 2) / 12.0;
      }
      const double tol = 6.0 * std::sqrt(var) + 2e-6 * abs_sum * std::sqrt((double)K) / 8.0 + 1e-6 * abs_sum + 1e-30;
      const double got = y[m * N + n];
      if (!(std::fabs(got - ref) <= tol)) {
        if (++bad <= 5)
          ADD_FAILURE() << what << ": y[" << m << "," << n << "] = " << got << ", reference " << ref << " (|diff| "
                        << std::fabs(got - ref) << " > tol " << tol << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << M * N << " outputs out of tolerance";
}

enum class Path { kDecode, kPrefill };

std::string name_of(DType t) { return type_name(static_cast<uint32_t>(t)); }

struct Case {
  DType type;
  Isa isa;
  Path path;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string n = name_of(info.param.type) + "_" + isa_to_string(info.param.isa) +
                  (info.param.path == Path::kDecode ? "_decode" : "_prefill");
  for (auto& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

std::vector<Case> all_cases() {
  std::vector<Case> c;
  for (DType t : kTypes)
    for (Isa i : kIsas)
      for (Path p : {Path::kDecode, Path::kPrefill}) c.push_back({t, i, p});
  return c;
}

class MatmulTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam().isa))
      GTEST_SKIP() << "this CPU cannot run the " << isa_to_string(GetParam().isa) << " kernels ("
                   << "cpu_features: avx512f=" << cpu_features().avx512f << " avx512vnni=" << cpu_features().avx512vnni
                   << ")";
    force_isa(GetParam().isa);
    set_decode_max_m(GetParam().path == Path::kDecode ? std::numeric_limits<int64_t>::max() : 0);
  }

  ErrorModel model() const {
    ErrorModel em;
    const DType t = GetParam().type;
    // (without oneDNN every M runs on the decode kernels)
    if (GetParam().path == Path::kDecode || !dnnl_mm::available()) {
      em.act_q8 = detail::is_quant(t);
      // The AVX-512 BF16 kernel rounds x to bf16 for _mm512_dpbf16_ps.
      em.act_bf16 = t == DType::BF16 && GetParam().isa == Isa::kAvx512Vnni && has_avx512_bf16();
    } else if (std::string(prefill_precision_name()) == "bf16") {
      em.act_bf16 = true;
      em.w_bf16 = t != DType::BF16;
    }
    return em;
  }

  void run(int64_t N, int64_t K, const std::vector<int64_t>& Ms, const std::vector<int>& threads) {
    const DType t = GetParam().type;
    const auto w = make_weight(t, N, K, static_cast<uint32_t>(N * 131 + K));
    const auto wf = ref_dequant(t, w.data(), N, K);
    const WeightView view{t, N, K, w.data()};
    MatmulScratch scratch;
    for (int64_t M : Ms) {
      const auto x = make_x(M, K, static_cast<uint32_t>(M * 7 + K));
      for (int th : threads) {
        omp_set_num_threads(th);
        std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
        matmul(view, x.data(), M, y.data(), scratch);
        expect_close(wf, x, y, M, N, K, model(),
                     name_of(t) + " " + isa_name() + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                         " M=" + std::to_string(M) + " threads=" + std::to_string(th));
        if (HasFailure()) return;
      }
    }
  }
  KnobGuard guard_;
};

TEST_P(MatmulTest, SmallShapes) {
  const std::vector<int64_t> ms(std::begin(kMs), std::end(kMs));
  run(1, 32, ms, {1});
  run(7, 64, ms, {1, 2});
  run(37, 256, ms, {1, 2});
  run(131, 96, ms, {2});
}

TEST_P(MatmulTest, WiderShapes) {
  // K a multiple of 256 (k-quant geometry), N odd, big enough that the
  // decode path really splits rows over 2 threads.
  run(1031, 512, {1, 2, 3, 5, 8, 17}, {1, 2});
  run(259, 2048, {1, 4, 64}, {2});
}

TEST_P(MatmulTest, FloatTypesAnyK) {
  if (detail::is_quant(GetParam().type)) GTEST_SKIP() << "quantized types need K % 32 == 0";
  run(13, 45, {1, 2, 3, 5, 17}, {1, 2});
  run(9, 7, {1, 3}, {1});
}

INSTANTIATE_TEST_SUITE_P(All, MatmulTest, testing::ValuesIn(all_cases()), case_name);

// ---------------------------------------------------------------- dequantization

class DequantTest : public testing::TestWithParam<std::tuple<DType, Isa>> {};

TEST_P(DequantTest, RowsMatchReference) {
  const auto [t, isa] = GetParam();
  if (!isa_supported(isa)) GTEST_SKIP() << "this CPU cannot run the " << isa_to_string(isa) << " kernels";
  KnobGuard guard;
  force_isa(isa);
  const int64_t N = 9, K = 256;
  const auto w = make_weight(t, N, K, 99);
  const auto wf = ref_dequant(t, w.data(), N, K);
  const WeightView view{t, N, K, w.data()};
  std::vector<float> out(static_cast<size_t>(4 * K));
  dequantize_rows(view, 3, 4, out.data());
  for (int64_t i = 0; i < 4 * K; ++i) {
    const float ref = wf[3 * K + i];
    ASSERT_NEAR(out[i], ref, 1e-6f * std::fabs(ref)) << "element " << i;
  }
  // bf16 / f32 tile dequantizers used by the prefill path (internal).
  const detail::IsaImpl& impl = isa == Isa::kScalar ? detail::scalar_impl()
                                : isa == Isa::kAvx2 ? detail::avx2_impl()
                                                    : detail::avx512_impl();
  std::vector<float> f(static_cast<size_t>(N * K));
  std::vector<uint16_t> b(static_cast<size_t>(N * K));
  impl.dequant_f32(t, w.data(), f.data(), N * K);
  impl.dequant_bf16(t, w.data(), b.data(), N * K);
  for (int64_t i = 0; i < N * K; ++i) {
    ASSERT_NEAR(f[i], wf[i], 1e-6f * std::fabs(wf[i])) << "f32 element " << i;
    // Q4_1's and Q5_1's d*q+m may be fused (one rounding less) before rounding to bf16.
    const float rb = round_bf16(wf[i]);
    ASSERT_NEAR(bf16_to_fp32(b[i]), rb, std::fabs(rb) * std::ldexp(1.f, -7)) << "bf16 element " << i;
    if (t != DType::Q4_1 && t != DType::Q5_1) {
      ASSERT_EQ(b[i], fp32_to_bf16(wf[i])) << "bf16 element " << i;
    }
  }
  std::vector<float> xs = make_x(1, 77, 5);
  std::vector<uint16_t> xb(xs.size());
  impl.f32_to_bf16(xs.data(), xb.data(), static_cast<int64_t>(xs.size()));
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(xb[i], fp32_to_bf16(xs[i])) << "f32_to_bf16 element " << i;
}

INSTANTIATE_TEST_SUITE_P(All, DequantTest, testing::Combine(testing::ValuesIn(kTypes), testing::ValuesIn(kIsas)),
                         [](const testing::TestParamInfo<std::tuple<DType, Isa>>& info) {
                           return name_of(std::get<0>(info.param)) + "_" + isa_to_string(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------- API behaviour

TEST(Matmul, IsaSelection) {
  KnobGuard guard;
  EXPECT_TRUE(isa_supported(Isa::kScalar));
  EXPECT_EQ(active_isa(), best_isa());
  const std::string best = isa_name();
  EXPECT_TRUE(best == "avx512_vnni" || best == "avx2" || best == "scalar") << best;
  force_isa(Isa::kScalar);
  EXPECT_STREQ(isa_name(), "scalar");
  reset_isa();
  EXPECT_EQ(isa_name(), best);
  if (!isa_supported(Isa::kAvx512Vnni)) {
    try {
      force_isa(Isa::kAvx512Vnni);
      FAIL() << "force_isa accepted an unsupported variant";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kUnsupported);
    }
    EXPECT_EQ(isa_name(), best);
  }
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(isa_supported(Isa::kAvx512Vnni),
            f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni && f.os_avx512);
}

TEST(Matmul, RejectsBadArguments) {
  std::vector<uint8_t> w(4096);
  std::vector<float> x(64), y(64);
  MatmulScratch s;
  auto code_of = [&](const WeightView& v, int64_t M) {
    try {
      matmul(v, x.data(), M, y.data(), s);
    } catch (const Error& e) {
      return e.code();
    }
    return StatusCode::kOk;
  };
  EXPECT_EQ(code_of({DType::Q8_K, 2, 256, w.data()}, 1), StatusCode::kUnsupported);
  EXPECT_EQ(code_of({DType::Q4_0, 2, 48, w.data()}, 1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of({DType::Q8_0, 2, 32, w.data()}, -1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of({DType::F32, 2, 32, nullptr}, 1), StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of({DType::F32, 2, 32, w.data()}, 0), StatusCode::kOk);  // M == 0: no-op
  EXPECT_EQ(code_of({DType::F32, 0, 32, w.data()}, 1), StatusCode::kOk);  // N == 0: no-op
  std::vector<float> out(64);
  EXPECT_THROW(dequantize_rows({DType::F32, 2, 32, w.data()}, 1, 2, out.data()), Error);
  EXPECT_THROW(dequantize_rows({DType::F32, 2, 32, w.data()}, -1, 1, out.data()), Error);
  EXPECT_NO_THROW(dequantize_rows({DType::F32, 2, 32, w.data()}, 2, 0, out.data()));
  EXPECT_TRUE(matmul_supports(DType::Q4_0));
  EXPECT_FALSE(matmul_supports(DType::Q8_K));
}

TEST(Matmul, PrefillPrecisionFallsBackWhenBf16Unavailable) {
  KnobGuard guard;
  set_prefill_precision(PrefillPrecision::kBf16);
  const std::string p = prefill_precision_name();
  EXPECT_EQ(p, dnnl_mm::bf16_supported() ? "bf16" : "f32");
  set_prefill_precision(PrefillPrecision::kF32);
  EXPECT_STREQ(prefill_precision_name(), "f32");
  set_prefill_precision(PrefillPrecision::kAuto);
  EXPECT_EQ(std::string(prefill_precision_name()),
            dnnl_mm::bf16_native() && dnnl_mm::bf16_supported() ? "bf16" : "f32");
  // Whatever precision was resolved, results stay correct.
  set_prefill_precision(PrefillPrecision::kBf16);
  set_decode_max_m(0);
  const int64_t N = 33, K = 128, M = 20;
  const auto w = make_weight(DType::Q8_0, N, K, 3);
  const auto wf = ref_dequant(DType::Q8_0, w.data(), N, K);
  const auto x = make_x(M, K, 4);
  std::vector<float> y(M * N);
  MatmulScratch s;
  matmul({DType::Q8_0, N, K, w.data()}, x.data(), M, y.data(), s);
  ErrorModel em;
  em.act_bf16 = em.w_bf16 = p == "bf16";
  em.act_q8 = !dnnl_mm::available();  // (the decode kernels then)
  expect_close(wf, x, y, M, N, K, em, "prefill " + p);
}

TEST(Matmul, DefaultThresholdSplitsPaths) {
  KnobGuard guard;
  reset_decode_max_m();
  for (DType t : kTypes) {
    EXPECT_GE(decode_max_m(t), 4) << name_of(t);
    EXPECT_LE(decode_max_m(t), 128) << name_of(t);
    EXPECT_LE(decode_max_m(), decode_max_m(t)) << name_of(t);
  }
  set_decode_max_m(5);
  EXPECT_EQ(decode_max_m(DType::Q4_0), 5);
  EXPECT_EQ(decode_max_m(), 5);
  reset_decode_max_m();
  const int64_t N = 45, K = 256;
  const auto w = make_weight(DType::Q4_0, N, K, 8);
  const auto wf = ref_dequant(DType::Q4_0, w.data(), N, K);
  MatmulScratch s;
  const int64_t th = decode_max_m(DType::Q4_0);
  for (int64_t M : {th, th + 1}) {
    const auto x = make_x(M, K, 9);
    std::vector<float> y(M * N);
    matmul({DType::Q4_0, N, K, w.data()}, x.data(), M, y.data(), s);
    ErrorModel em;
    em.act_q8 = M <= th || !dnnl_mm::available();
    em.act_bf16 = em.w_bf16 = !em.act_q8 && std::string(prefill_precision_name()) == "bf16";
    expect_close(wf, x, y, M, N, K, em, "M=" + std::to_string(M));
  }
  EXPECT_GT(s.bytes_reserved(), 0u);
  s.release();
  EXPECT_EQ(s.bytes_reserved(), 0u);
}

// The quantized kernels follow one summation order (quant_dot_reference,
// llama.cpp's AVX2 order), so the scalar and AVX2 variants agree to the bit
// for every M, tile shape and thread count, and with the reference computed
// directly from the prepared activations.
TEST(Matmul, QuantizedKernelsAreBitIdenticalToTheReferenceOrder) {
  KnobGuard guard;
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "no AVX2";
  set_decode_max_m(std::numeric_limits<int64_t>::max());
  const int64_t N = 37, K = 576;
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0}) {
    const auto w = make_weight(t, N, K, 99);
    const WeightView view{t, N, K, w.data()};
    for (int64_t M : {1, 2, 3, 4, 5, 7, 9}) {
      const auto x = make_x(M, K, static_cast<uint32_t>(M + 5));
      std::vector<float> ys(static_cast<size_t>(M * N)), ya(ys.size());
      MatmulScratch scratch;
      force_isa(Isa::kScalar);
      matmul(view, x.data(), M, ys.data(), scratch);
      force_isa(Isa::kAvx2);
      for (int th : {1, 2}) {
        omp_set_num_threads(th);
        matmul(view, x.data(), M, ya.data(), scratch);
        for (size_t i = 0; i < ys.size(); ++i)
          ASSERT_EQ(std::memcmp(&ys[i], &ya[i], 4), 0) << name_of(t) << " M=" << M << " threads=" << th << " output "
                                                       << i << ": scalar " << ys[i] << " avx2 " << ya[i];
      }
      // Against the reference order on the scalar variant's own activations.
      const auto& sc = detail::scalar_impl();
      std::vector<uint8_t> act(sc.act_row_bytes(t, K) * static_cast<size_t>(M));
      sc.prepare_acts(t, x.data(), M, K, act.data());
      for (int64_t m = 0; m < M; ++m) {
        const detail::Q8Row a = detail::q8_natural_row(act.data(), sc.act_row_bytes(t, K), K, m);
        for (int64_t n = 0; n < N; ++n) {
          const uint8_t* wr = w.data() + static_cast<size_t>(n) * row_bytes(t, K);
          const float r = t == DType::Q4_0   ? detail::quant_dot_reference<DType::Q4_0>(wr, a, K / 32)
                          : t == DType::Q4_1 ? detail::quant_dot_reference<DType::Q4_1>(wr, a, K / 32)
                                             : detail::quant_dot_reference<DType::Q8_0>(wr, a, K / 32);
          ASSERT_EQ(std::memcmp(&r, &ya[static_cast<size_t>(m * N + n)], 4), 0)
              << name_of(t) << " m=" << m << " n=" << n;
        }
      }
    }
  }
}

// Calls with many rows run in cache blocks of weight rows x activation rows
// (run_kernel_blocked in cpu/matmul.cpp): shapes big enough to split both
// ways give every row exactly what it gets alone, on every ISA and format.
TEST(Matmul, CacheBlockedRowsEqualOneRowAtATime) {
  KnobGuard guard;
  const int64_t K = 2048, N = 200, M = 70;  // > 1 activation block for every format, > 1 weight block for most
  const auto x = make_x(M, K, 5);
  for (Isa isa : kIsas) {
    if (!isa_supported(isa)) continue;
    force_isa(isa);
    for (DType t :
         {DType::Q4_0, DType::Q8_0, DType::Q5_1, DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::F16, DType::F32}) {
      const auto w = make_weight(t, N, K, 11);
      const WeightView v{t, N, K, w.data()};
      for (RowKind kind : {RowKind::kPrompt, RowKind::kDecode}) {
        for (int th : {1, 2}) {
          omp_set_num_threads(th);
          MatmulScratch scratch;
          std::vector<float> all(static_cast<size_t>(M * N), -1.0f), one(static_cast<size_t>(N));
          matmul(v, x.data(), M, all.data(), scratch, MatmulPath::kRowInvariant, kind);
          for (int64_t m = 0; m < M; ++m) {
            matmul(v, x.data() + m * K, 1, one.data(), scratch, MatmulPath::kRowInvariant, kind);
            ASSERT_EQ(std::memcmp(one.data(), all.data() + m * N, static_cast<size_t>(N) * 4), 0)
                << isa_to_string(isa) << " " << name_of(t) << " row " << m << " threads " << th;
          }
        }
      }
    }
  }
}

// matmul_group computes each weight's rows exactly as matmul() does, for
// every ISA, mixed formats (shared and separate activation rows), any M on
// the row-invariant path, and 1 or 2 threads.
TEST(Matmul, GroupEqualsSeparateCallsBitForBit) {
  KnobGuard guard;
  const int64_t K = 512;
  const std::vector<std::vector<std::pair<DType, int64_t>>> groups = {
      {{DType::Q4_1, 67}, {DType::Q4_1, 19}, {DType::Q4_1, 19}},
      {{DType::Q4_K, 40}, {DType::Q4_K, 16}, {DType::Q6_K, 16}},
      {{DType::Q8_0, 33}, {DType::F16, 9}},
      {{DType::F32, 24}, {DType::BF16, 8}, {DType::Q4_0, 70}, {DType::Q5_1, 5}},
  };
  for (Isa isa : kIsas) {
    if (!isa_supported(isa)) continue;
    force_isa(isa);
    for (size_t g = 0; g < groups.size(); ++g) {
      std::vector<std::vector<uint8_t>> ws;
      std::vector<WeightView> views;
      for (const auto& [t, N] : groups[g]) {
        ws.push_back(make_weight(t, N, K, static_cast<uint32_t>(7 + ws.size())));
        views.push_back(WeightView{t, N, K, ws.back().data()});
      }
      for (int64_t M : {1, 3, 16, 40}) {
        const auto x = make_x(M, K, static_cast<uint32_t>(M));
        for (int th : {1, 2}) {
          omp_set_num_threads(th);
          MatmulScratch scratch;
          std::vector<std::vector<float>> sep, grp;
          std::vector<float*> ys;
          for (const auto& v : views) {
            sep.emplace_back(static_cast<size_t>(M * v.rows));
            grp.emplace_back(static_cast<size_t>(M * v.rows), -1.0f);
            matmul(v, x.data(), M, sep.back().data(), scratch, MatmulPath::kRowInvariant);
          }
          for (auto& y : grp) ys.push_back(y.data());
          matmul_group(views.data(), ys.data(), static_cast<int>(views.size()), x.data(), M, scratch,
                       MatmulPath::kRowInvariant);
          for (size_t i = 0; i < views.size(); ++i)
            ASSERT_EQ(std::memcmp(sep[i].data(), grp[i].data(), sep[i].size() * 4), 0)
                << isa_to_string(isa) << " group " << g << " weight " << i << " M=" << M << " threads=" << th;
        }
      }
    }
  }
  const auto w = make_weight(DType::Q4_0, 8, K, 1);
  const auto w2 = make_weight(DType::Q4_0, 8, 2 * K, 1);
  const WeightView bad[2] = {{DType::Q4_0, 8, K, w.data()}, {DType::Q4_0, 8, 2 * K, w2.data()}};
  std::vector<float> x(2 * K), y0(8), y1(8);
  float* ys[2] = {y0.data(), y1.data()};
  MatmulScratch scratch;
  EXPECT_THROW(matmul_group(bad, ys, 2, x.data(), 1, scratch), Error);  // K differs
  EXPECT_THROW(matmul_group(bad, ys, 0, x.data(), 1, scratch), Error);
  EXPECT_THROW(matmul_group(bad, ys, kMaxGroup + 1, x.data(), 1, scratch), Error);
}

// On AVX-512 VNNI CPUs Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights are packed for the kernels
// (cpu::pack_weight): matmul on the packed rows equals matmul on the GGUF
// rows to the bit, whole quads or not, alone or in a group; the other
// variants ignore the packed rows.
TEST(Matmul, PackedRowsGiveIdenticalResults) {
  KnobGuard guard;
  for (Isa isa : kIsas) {
    if (!isa_supported(isa)) continue;
    force_isa(isa);
    for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0}) {
      for (int64_t K : {96, 512, 608}) {
        const int64_t N = 29;
        const auto w = make_weight(t, N, K, static_cast<uint32_t>(K));
        const size_t bytes = packed_bytes(t, N, K);
        EXPECT_EQ(bytes > 0, isa == Isa::kAvx512Vnni) << isa_to_string(isa);
        std::vector<uint8_t> storage(detail::packed_group_bytes(t, K) * ((N + 3) / 4) + 64);
        void* packed = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
        pack_weight({t, N, K, w.data()}, packed);
        for (int64_t M : {1, 3, 6}) {
          const auto x = make_x(M, K, static_cast<uint32_t>(M));
          std::vector<float> y0(static_cast<size_t>(M * N)), y1(y0.size()), y2(y0.size()), y3(y0.size());
          MatmulScratch scratch;
          const WeightView plain{t, N, K, w.data()}, fast{t, N, K, w.data(), packed};
          matmul(plain, x.data(), M, y0.data(), scratch, MatmulPath::kRowInvariant);
          matmul(fast, x.data(), M, y1.data(), scratch, MatmulPath::kRowInvariant);
          const WeightView group[2] = {fast, plain};
          float* ys[2] = {y2.data(), y3.data()};
          matmul_group(group, ys, 2, x.data(), M, scratch, MatmulPath::kRowInvariant);
          const std::string where = isa_to_string(isa) + std::string(" ") + name_of(t) + " K=" + std::to_string(K) +
                                    " M=" + std::to_string(M);
          EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * 4), 0) << where;
          EXPECT_EQ(std::memcmp(y0.data(), y2.data(), y0.size() * 4), 0) << where << " (group)";
          EXPECT_EQ(std::memcmp(y0.data(), y3.data(), y0.size() * 4), 0) << where << " (group)";
        }
      }
    }
  }
}

// The tile layout's order (and AMX prompt rows'), computed in scalar code:
// activations quantized per block as quantize_block_q8_scalar, blocks in
// order, acc = fma(float(exact int sum), dw * dx, acc), then for Q4_1 / Q5_1
// acc = fma(m, sx, acc); Q4_K / Q6_K per 32-value group (see the callers).
std::vector<float> tile_order_reference(DType t, const std::vector<uint8_t>& w, int64_t N, int64_t K,
                                        const std::vector<float>& x, int64_t M) {
  const bool k4 = t == DType::Q4_K || t == DType::Q6_K;
  const size_t rb = row_bytes(t, K), blk = rb / (K / 32);
  const bool has_min = t == DType::Q4_1 || t == DType::Q5_1, five = t == DType::Q5_0 || t == DType::Q5_1;
  const size_t qs_at = t == DType::Q8_0 ? 2 : 2 + (has_min ? 2 : 0) + (five ? 4 : 0);
  const int offset = t == DType::Q4_0 ? 8 : t == DType::Q5_0 ? 16 : 0;
  std::vector<float> ref(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m) {
    std::vector<int8_t> q(static_cast<size_t>(K));
    std::vector<float> d(static_cast<size_t>(K / 32)), sx(d.size());
    for (int64_t b = 0; b < K / 32; ++b) {
      // (The sum scale as the Q8_1 activations of Q4_1 / Q5_1 weights.)
      detail::quantize_block_q8_scalar(DType::Q4_1, x.data() + m * K + 32 * b, q.data() + 32 * b, &d[b], &sx[b]);
    }
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.f;
      for (int64_t b = 0; b < K / 32; ++b) {
        if (t == DType::Q6_K) {  // group g = b % 8: two 16-value sub-blocks, exact s1 * sc1 + s2 * sc2
          const auto* sb = reinterpret_cast<const BlockQ6_K*>(w.data() + static_cast<size_t>(n) * rb) + b / 8;
          const int g = static_cast<int>(b % 8), hh = g / 4, qq = g % 4;
          int64_t s12[2] = {0, 0};
          for (int i = 0; i < 32; ++i) {
            const uint8_t byte = sb->ql[64 * hh + 32 * (qq & 1) + i];
            const int v = ((qq >> 1 ? byte >> 4 : byte & 0xF) | (((sb->qh[32 * hh + i] >> (2 * qq)) & 3) << 4)) - 32;
            s12[i / 16] += v * q[static_cast<size_t>(32 * b + i)];
          }
          const int64_t tt = s12[0] * sb->scales[8 * hh + 2 * qq] + s12[1] * sb->scales[8 * hh + 2 * qq + 1];
          uint16_t hd;
          std::memcpy(&hd, &sb->d, 2);
          acc = std::fma(static_cast<float>(tt), fp16_to_fp32(hd) * d[b], acc);
          continue;
        }
        if (k4) {  // sub-block b % 8 of super-block b / 8: d * sc * q - dmin * m
          const uint8_t* sb = w.data() + static_cast<size_t>(n) * rb + static_cast<size_t>(b / 8) * 144;
          const int g = static_cast<int>(b % 8);
          uint16_t hd, hmin;
          std::memcpy(&hd, sb, 2);
          std::memcpy(&hmin, sb + 2, 2);
          uint8_t sc, mn;
          kquant_scale_min(g, sb + 4, &sc, &mn);
          int32_t sum = 0;
          for (int i = 0; i < 32; ++i) {
            const uint8_t byte = sb[16 + 32 * (g / 2) + i];
            sum += (g % 2 ? byte >> 4 : byte & 0xF) * q[static_cast<size_t>(32 * b + i)];
          }
          acc = std::fma(static_cast<float>(sum), (fp16_to_fp32(hd) * static_cast<float>(sc)) * d[b], acc);
          acc = std::fma(-(fp16_to_fp32(hmin) * static_cast<float>(mn)), sx[b], acc);
          continue;
        }
        const uint8_t* p = w.data() + static_cast<size_t>(n) * rb + static_cast<size_t>(b) * blk;
        uint16_t h, hm;
        uint32_t qh = 0;
        std::memcpy(&h, p, 2);
        std::memcpy(&hm, p + 2, 2);
        if (five) std::memcpy(&qh, p + (has_min ? 4 : 2), 4);
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) {
          int v;
          if (t == DType::Q8_0) {
            v = static_cast<int8_t>(p[2 + i]);
          } else {
            v = i < 16 ? p[qs_at + i] & 0xF : p[qs_at + i - 16] >> 4;
            if (five) v |= static_cast<int>((qh >> i) & 1) << 4;
            v -= offset;
          }
          sum += v * q[static_cast<size_t>(32 * b + i)];
        }
        acc = std::fma(static_cast<float>(sum), fp16_to_fp32(h) * d[b], acc);
        if (has_min) acc = std::fma(fp16_to_fp32(hm), sx[b], acc);
      }
      ref[static_cast<size_t>(m * N + n)] = acc;
    }
  }
  return ref;
}

// Prompt rows of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights on AMX CPUs
// (cpu::amx_prompt_rows): every output equals the documented order computed
// here in scalar code (activations quantized per block as
// quantize_block_q8_scalar, blocks in order, acc = fma(float(exact int
// sum), dw * dx, acc), then for Q4_1 / Q5_1 acc = fma(m, sx, acc)), to the bit, for any
// M (tile padding, two tiles in flight, one row alone), any row count (a tail
// tile of rows), GGUF or packed rows, 1 or 2 threads; decode rows are
// untouched. The tile layout's rows of every kind take the same order, on
// AMX CPUs and (VNNI registers alone) on AVX-512 VNNI CPUs without AMX.
TEST(Matmul, AmxPromptRowsSumWholeBlocksInOrderForAnyBatch) {
  KnobGuard guard;
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512";
  force_isa(Isa::kAvx512Vnni);
  struct AmxReset {
    ~AmxReset() { reset_amx_prompt_rows(); }
  } amx_reset;
  const bool amx = set_amx_prompt_rows(true);  // false: no AMX-INT8 (or not granted), the tile layout alone
  ASSERT_EQ(amx_prompt_rows(DType::Q8_0), amx);
  EXPECT_FALSE(amx_prompt_rows(DType::Q5_K));
  {  // no tile layout for other types: a clear error, never a kernel reading the wrong bytes
    EXPECT_FALSE(tile_layout(DType::Q5_K));
    const auto w5 = make_weight(DType::Q5_K, 16, 256, 5);
    std::vector<uint8_t> junk(w5.size());
    std::vector<float> x(256), y(16);
    MatmulScratch scratch;
    const WeightView v{DType::Q5_K, 16, 256, w5.data(), junk.data(), true};
    EXPECT_THROW(matmul(v, x.data(), 1, y.data(), scratch, MatmulPath::kRowInvariant, RowKind::kDecode), Error);
    EXPECT_THROW(pack_weight(WeightView{DType::Q5_K, 16, 256, w5.data(), nullptr, true}, junk.data()), Error);
  }
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    ASSERT_EQ(amx_prompt_rows(t), amx) << name_of(t);
    const bool k4 = t == DType::Q4_K || t == DType::Q6_K;
    if (k4 && !amx) {  // llama.cpp's orders on their packed groups without AMX
      EXPECT_FALSE(tile_layout(t)) << name_of(t);
      continue;
    }
    // 71 blocks: three chunks of the kernel's 32, odd tails (Q4_K: 72, and
    // 40 rows, packed in groups of 8, a tile of 8 last).
    const int64_t N = k4 ? 40 : 37, K = k4 ? 256 * 9 : 32 * 71;
    const auto w = make_weight(t, N, K, 11);
    const size_t rb = row_bytes(t, K);
    const bool has_min = t == DType::Q4_1 || t == DType::Q5_1, five = t == DType::Q5_0 || t == DType::Q5_1;
    const size_t pb = packed_bytes(t, N, K);
    ASSERT_GT(pb, 0u) << name_of(t);
    std::vector<uint8_t> storage(pb + 64);
    uint8_t* packed = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
    pack_weight({t, N, K, w.data()}, packed);
    // The tile layout: every row kind in this order, on VNNI registers below
    // 16 rows and without tiles, on AMX tiles from 16.
    // Q4_K / Q6_K: their packed groups of 8 rows, read in this order.
    const bool tiled = detail::tile_packable(t) || k4;
    EXPECT_EQ(tile_layout(t), tiled) << name_of(t);
    const size_t tb = packed_bytes(t, N, K, true);
    EXPECT_EQ(tb > 0, tiled) << name_of(t);
    if (k4) {
      EXPECT_EQ(tb, pb) << name_of(t);
      MatmulScratch scratch;
      std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(N));
      const WeightView odd{t, N - 3, K, w.data(), packed, true};  // (rows % 8 != 0: no groups of 8)
      EXPECT_THROW(matmul(odd, x.data(), 1, y.data(), scratch, MatmulPath::kRowInvariant, RowKind::kDecode), Error);
    }
    std::vector<uint8_t> tile_storage(tb + 64);
    uint8_t* tiles = tile_storage.data() + (64 - reinterpret_cast<uintptr_t>(tile_storage.data()) % 64) % 64;
    if (tiled) {
      const size_t per_block = t == DType::Q8_0 ? 544 : 256 + 32 + (five ? 64 : 0) + (has_min ? 32 : 0);
      const size_t group = (static_cast<size_t>(K / 32) * per_block + 63) / 64 * 64;
      if (!k4) {
        EXPECT_EQ(tb, static_cast<size_t>((N + 15) / 16) * group);
      }
      WeightView tv{t, N, K, w.data(), nullptr, true};
      pack_weight(tv, tiles);
      tv.packed = tiles;
      std::vector<uint8_t> back(rb * static_cast<size_t>(N));
      unpack_rows(tv, 0, N, back.data());
      EXPECT_EQ(std::memcmp(back.data(), w.data(), back.size()), 0)
          << name_of(t) << ": unpack_rows gives the GGUF rows";
      unpack_rows(tv, 17, 3, back.data());
      EXPECT_EQ(std::memcmp(back.data(), w.data() + 17 * rb, 3 * rb), 0) << name_of(t);
    }
    for (int64_t M : {1, 5, 16, 17, 33, 40}) {
      const auto x = make_x(M, K, static_cast<uint32_t>(M + 3));
      const std::vector<float> ref = tile_order_reference(t, w, N, K, x, M);
      for (bool use_packed : {false, true})
        for (int th : {1, 2}) {
          omp_set_num_threads(th);
          std::vector<float> y(ref.size(), -1.f);
          MatmulScratch scratch;
          const WeightView v{t, N, K, w.data(), use_packed ? packed : nullptr};
          matmul(v, x.data(), M, y.data(), scratch, MatmulPath::kRowInvariant, RowKind::kPrompt);
          if (amx) {
            ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0)
                << name_of(t) << " M=" << M << (use_packed ? " packed" : " GGUF rows") << " threads=" << th;
          }
          if (!tiled) continue;
          for (RowKind kind : {RowKind::kPrompt, RowKind::kDecode, RowKind::kPromptNoTiles}) {
            std::vector<float> yt(ref.size(), -1.f), y2(ref.size(), -1.f);
            const WeightView tv{t, N, K, w.data(), tiles, true};
            matmul(tv, x.data(), M, yt.data(), scratch, MatmulPath::kRowInvariant, kind);
            ASSERT_EQ(std::memcmp(yt.data(), ref.data(), yt.size() * 4), 0)
                << name_of(t) << " M=" << M << " tile layout, kind " << static_cast<int>(kind) << " threads=" << th;
            const WeightView group[2] = {v, tv};  // with a weight of the other layout
            float* ys[2] = {y.data(), y2.data()};
            matmul_group(group, ys, 2, x.data(), M, scratch, MatmulPath::kRowInvariant, kind);
            ASSERT_EQ(std::memcmp(y2.data(), ref.data(), y2.size() * 4), 0)
                << name_of(t) << " M=" << M << " tile layout in a group, kind " << static_cast<int>(kind);
          }
        }
    }
  }
}

// Q4_0 weights whose row count is a multiple of 8 (llama.cpp's AVX2 build
// repacks these to q4_0_8x8, this order) and Q4_1 / Q5_0 / Q5_1 / Q8_0
// weights of any row count on AVX2 CPUs: the tile layout, read by the AVX2
// tile kernel. Every output equals tile_order_reference to the bit for any
// M, a last half group of 8 rows (the others: also a last group of 5; Q8_0
// values of -128 included), every row kind, 1 or 2 threads, alone and
// in a group with GGUF rows, and with the scalar variant forced after
// packing; other types and Q4_0 row counts keep the GGUF rows, and so does
// everything with the tile layout's knob off.
TEST(Matmul, Avx2TileLayoutSumsWholeBlocksInOrder) {
  KnobGuard guard;
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "no AVX2";
  force_isa(Isa::kAvx2);
  struct AmxReset {
    ~AmxReset() { reset_amx_prompt_rows(); }
  } amx_reset;
  set_amx_prompt_rows(true);  // (the knob of the tile layout; AMX itself is the AVX-512 variant's)
  constexpr DType kTiled[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0};
  for (DType t : kTiled) EXPECT_TRUE(tile_layout(t)) << name_of(t);
  for (DType t : {DType::Q4_K, DType::Q6_K}) {
    EXPECT_FALSE(tile_layout(t)) << name_of(t);
    EXPECT_EQ(packed_bytes(t, 64, 256, true), 0u) << name_of(t);
  }
  const int64_t K71 = 32 * 71;
  EXPECT_EQ(packed_bytes(DType::Q4_0, 36, K71, true), 0u);  // (rows % 8 != 0: llama.cpp's vec_dot order)
  EXPECT_GT(packed_bytes(DType::Q5_0, 37, K71, true), 0u);
  EXPECT_EQ(packed_bytes(DType::Q8_0, 64, 2048, true), 0u);  // (long Q8_0 rows: the GGUF rows decode faster)
  EXPECT_GT(packed_bytes(DType::Q8_0, 64, 1024, true), 0u);
  set_amx_prompt_rows(false);
  for (DType t : kTiled) {
    EXPECT_FALSE(tile_layout(t)) << name_of(t);
    EXPECT_EQ(packed_bytes(t, 64, 256), 0u) << name_of(t);  // (no other packing of these on AVX2)
  }
  set_amx_prompt_rows(true);
  struct Case {
    DType t;
    int64_t N;
  };
  // Two groups and a half; one half group; the others also a last group of 5 rows.
  for (const Case& cs : {Case{DType::Q4_0, 40}, Case{DType::Q4_0, 8}, Case{DType::Q5_0, 40}, Case{DType::Q5_0, 8},
                         Case{DType::Q5_0, 37}, Case{DType::Q8_0, 40}, Case{DType::Q8_0, 37}, Case{DType::Q4_1, 37},
                         Case{DType::Q5_1, 40}, Case{DType::Q5_1, 21}}) {
    const DType t = cs.t;
    const int64_t N = cs.N;
    const int64_t K = t == DType::Q8_0 ? 32 * 31 : K71;  // (Q8_0: K <= 1024)
    auto w = make_weight(t, N, K, 23);
    if (t == DType::Q8_0) {  // every block's value 5 at -128, value 6 at 127 (|w| = 128 on the AVX2 kernel)
      const size_t rb = row_bytes(t, K);
      for (size_t at = 0; at < rb * static_cast<size_t>(N); at += rb / static_cast<size_t>(K / 32)) {
        w[at + 2 + 5] = 0x80;
        w[at + 2 + 6] = 0x7F;
      }
    }
    const size_t tb = packed_bytes(t, N, K, true);
    const size_t per_block = t == DType::Q8_0   ? 544
                             : t == DType::Q5_0 ? 352
                             : t == DType::Q4_1 ? 320
                             : t == DType::Q5_1 ? 384
                                                : 288;
    ASSERT_EQ(tb, static_cast<size_t>((N + 15) / 16) * ((static_cast<size_t>(K / 32) * per_block + 63) / 64 * 64));
    std::vector<uint8_t> storage(tb + 64);
    uint8_t* tiles = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
    WeightView tv{t, N, K, w.data(), nullptr, true};
    pack_weight(tv, tiles);
    tv.packed = tiles;
    std::vector<uint8_t> back(w.size());
    unpack_rows(tv, 0, N, back.data());
    ASSERT_EQ(std::memcmp(back.data(), w.data(), w.size()), 0) << name_of(t) << " N=" << N;
    const WeightView v{t, N, K, w.data()};
    for (int64_t M : {1, 2, 3, 5, 16, 17, 33}) {
      const auto x = make_x(M, K, static_cast<uint32_t>(M + 7));
      const std::vector<float> ref = tile_order_reference(t, w, N, K, x, M);
      for (int th : {1, 2}) {
        omp_set_num_threads(th);
        MatmulScratch scratch;
        for (RowKind kind : {RowKind::kPrompt, RowKind::kDecode, RowKind::kPromptNoTiles}) {
          std::vector<float> y(ref.size(), -1.f), y2(ref.size(), -1.f);
          matmul(tv, x.data(), M, y.data(), scratch, MatmulPath::kRowInvariant, kind);
          ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0)
              << name_of(t) << " N=" << N << " M=" << M << " kind " << static_cast<int>(kind) << " threads=" << th;
          const WeightView group[2] = {v, tv};
          float* ys[2] = {y.data(), y2.data()};
          matmul_group(group, ys, 2, x.data(), M, scratch, MatmulPath::kRowInvariant, kind);
          ASSERT_EQ(std::memcmp(y2.data(), ref.data(), y2.size() * 4), 0)
              << name_of(t) << " N=" << N << " M=" << M << " in a group, kind " << static_cast<int>(kind);
        }
      }
      force_isa(Isa::kScalar);
      {
        MatmulScratch scratch;
        std::vector<float> y(ref.size(), -1.f);
        matmul(tv, x.data(), M, y.data(), scratch, MatmulPath::kRowInvariant, RowKind::kDecode);
        ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0)
            << name_of(t) << " scalar forced, N=" << N << " M=" << M;
      }
      force_isa(Isa::kAvx2);
    }
  }
}

// Q4_K and Q6_K weights whose row count is a multiple of 8 are packed
// (8-row interleaved super-blocks, detail::PackedQ4Kx8 / PackedQ6Kx8) on
// AVX2 and AVX-512 CPUs, each variant reading them with its own kernels:
// prompt rows (Q4_K: llama.cpp's q4_K_8x8 GEMM
// order; Q6_K: its tiled order) and decode rows (its GEMV order; vec_dot's)
// give the GGUF rows' results to the bit, for any M, 1 or 2 threads, alone
// and in a group; other row counts and the scalar variant are not packed.
TEST(Matmul, PackedQ4KRowsGiveIdenticalResults) {
  KnobGuard guard;
  for (DType t : {DType::Q4_K, DType::Q6_K})
    for (Isa isa : kIsas) {
      if (!isa_supported(isa)) continue;
      force_isa(isa);
      EXPECT_EQ(packed_bytes(t, 12, 512), 0u) << "rows % 8 != 0";
      for (int64_t K : {256, 1024}) {
        for (int64_t N : {8, 64, 136}) {
          const auto w = make_weight(t, N, K, static_cast<uint32_t>(K + N));
          const size_t bytes = packed_bytes(t, N, K);
          EXPECT_EQ(bytes > 0, isa != Isa::kScalar) << isa_to_string(isa);
          if (bytes == 0) continue;
          EXPECT_EQ(bytes,
                    static_cast<size_t>(N / 8) * static_cast<size_t>(K / 256) * (t == DType::Q4_K ? 1216 : 1696));
          std::vector<uint8_t> packed(bytes + 1);  // deliberately not 64-byte aligned
          pack_weight({t, N, K, w.data()}, packed.data() + 1);
          const WeightView plain{t, N, K, w.data()}, fast{t, N, K, w.data(), packed.data() + 1};
          for (RowKind kind : {RowKind::kPrompt, RowKind::kDecode}) {
            for (int64_t M : {1, 2, 3, 4, 5, 9, 70}) {
              const auto x = make_x(M, K, static_cast<uint32_t>(M + K));
              for (int th : {1, 2}) {
                omp_set_num_threads(th);
                std::vector<float> y0(static_cast<size_t>(M * N)), y1(y0.size(), -1.f), y2(y0.size(), -1.f),
                    y3(y0.size(), -1.f);
                MatmulScratch scratch;
                matmul(plain, x.data(), M, y0.data(), scratch, MatmulPath::kRowInvariant, kind);
                matmul(fast, x.data(), M, y1.data(), scratch, MatmulPath::kRowInvariant, kind);
                const WeightView group[2] = {fast, plain};
                float* ys[2] = {y2.data(), y3.data()};
                matmul_group(group, ys, 2, x.data(), M, scratch, MatmulPath::kRowInvariant, kind);
                const std::string where = name_of(t) + (kind == RowKind::kPrompt ? " prompt" : " decode") +
                                          " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                                          " M=" + std::to_string(M) + " threads=" + std::to_string(th);
                ASSERT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * 4), 0) << where;
                ASSERT_EQ(std::memcmp(y0.data(), y2.data(), y0.size() * 4), 0) << where << " (group)";
                ASSERT_EQ(std::memcmp(y0.data(), y3.data(), y0.size() * 4), 0) << where << " (group)";
              }
            }
          }
        }
      }
    }
}

// The AVX-512 packed Q4_K kernels at the largest magnitudes (6-bit scales
// 63, nibbles 13..15, activations near 127 in Q8_K): a super-block's total
// passes 2^24, where a total summed in float would round; the results must
// equal the scalar variant's integer totals to the bit, in both 8x8 orders
// (random weights stay far below: a float super-block total in the GEMV
// order passed PackedQ4KRowsGiveIdenticalResults and failed here).
TEST(Matmul, PackedQ4KLargestTotalsEqualTheScalarOrder) {
  if (!isa_supported(Isa::kAvx512Vnni)) GTEST_SKIP() << "the AVX-512 kernels need AVX-512 VNNI";
  KnobGuard guard;
  const int64_t N = 32, K = 2048;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> nib(13, 15), pick(0, 9);
  std::vector<uint8_t> w(row_bytes(DType::Q4_K, K) * static_cast<size_t>(N));
  for (size_t off = 0; off < w.size(); off += sizeof(BlockQ4_K)) {
    BlockQ4_K b;
    b.d = f16(0.01f + 0.001f * static_cast<float>(pick(rng)));
    b.dmin = f16(0.003f);
    std::memset(b.scales, 0xFF, sizeof(b.scales));  // every scale and min 63
    for (auto& q : b.qs) q = static_cast<uint8_t>(nib(rng) | (nib(rng) << 4));
    std::memcpy(w.data() + off, &b, sizeof(b));
  }
  for (int64_t M : {1, 4, 5, 16}) {
    std::vector<float> x(static_cast<size_t>(M * K));
    for (auto& v : x) v = 0.9f + 0.01f * static_cast<float>(pick(rng));  // Q8_K values 114..127
    std::vector<uint8_t> packed(packed_bytes(DType::Q4_K, N, K));
    pack_weight({DType::Q4_K, N, K, w.data()}, packed.data());
    for (RowKind kind : {RowKind::kPrompt, RowKind::kDecode}) {
      std::vector<float> ys(static_cast<size_t>(M * N)), yp(ys.size(), -1.f);
      MatmulScratch scratch;
      force_isa(Isa::kScalar);
      matmul({DType::Q4_K, N, K, w.data()}, x.data(), M, ys.data(), scratch, MatmulPath::kRowInvariant, kind);
      force_isa(Isa::kAvx512Vnni);
      matmul({DType::Q4_K, N, K, w.data(), packed.data()}, x.data(), M, yp.data(), scratch, MatmulPath::kRowInvariant,
             kind);
      for (size_t i = 0; i < ys.size(); ++i)
        ASSERT_EQ(std::memcmp(&ys[i], &yp[i], 4), 0) << (kind == RowKind::kPrompt ? "prompt" : "decode") << " M=" << M
                                                     << " output " << i << ": scalar " << ys[i] << " packed " << yp[i];
    }
  }
}

// What lets the CPU backend release a packed weight's GGUF pages: its
// kernels read the packed copy alone (the GGUF pointer below is garbage), for
// every row kind and batch size, and unpack_rows gives the GGUF bytes back
// exactly (the embedding lookup of a tied table).
TEST(Matmul, PackedCopyAloneServesEveryRowAndUnpacksExactly) {
  KnobGuard guard;
  for (Isa isa : kIsas) {
    if (!isa_supported(isa)) continue;
    force_isa(isa);
    for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
      const bool kx8 = t == DType::Q4_K || t == DType::Q6_K;
      for (int64_t N : {kx8 ? int64_t{16} : int64_t{13}, int64_t{40}}) {
        const int64_t K = kx8 ? 512 : 608;
        const size_t bytes = packed_bytes(t, N, K);
        if (bytes == 0) continue;
        const auto w = make_weight(t, N, K, static_cast<uint32_t>(N * 7 + K));
        std::vector<uint8_t> storage(bytes + 64);
        uint8_t* packed = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
        pack_weight({t, N, K, w.data()}, packed);
        const std::vector<uint8_t> garbage(w.size(), 0xA5);
        const WeightView plain{t, N, K, w.data()}, alone{t, N, K, garbage.data(), packed};
        const std::string where = isa_to_string(isa) + std::string(" ") + name_of(t) + " N=" + std::to_string(N);
        std::vector<uint8_t> back(w.size(), 0);
        unpack_rows(alone, 0, N, back.data());
        EXPECT_EQ(back, w) << where;
        const size_t rb = row_bytes(t, K);
        std::vector<uint8_t> one(rb);
        unpack_rows(alone, N - 3, 1, one.data());
        EXPECT_EQ(std::memcmp(one.data(), w.data() + static_cast<size_t>(N - 3) * rb, rb), 0) << where;
        EXPECT_THROW(unpack_rows(alone, N - 1, 2, one.data()), Error);
        for (RowKind kind : {RowKind::kPrompt, RowKind::kDecode}) {
          for (int64_t M : {1, 3, 9, 40}) {
            const auto x = make_x(M, K, static_cast<uint32_t>(M + 5));
            std::vector<float> y0(static_cast<size_t>(M * N)), y1(y0.size(), -1.f);
            MatmulScratch scratch;
            matmul(plain, x.data(), M, y0.data(), scratch, MatmulPath::kRowInvariant, kind);
            matmul(alone, x.data(), M, y1.data(), scratch, MatmulPath::kRowInvariant, kind);
            EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * 4), 0)
                << where << (kind == RowKind::kPrompt ? " prompt" : " decode") << " M=" << M;
          }
        }
      }
    }
  }
}

TEST(Matmul, ConcurrentCallersWithOwnScratch) {
  // Two threads of control, each with its own scratch, mixing decode and
  // prefill calls on shared weights (the primitive cache is shared).
  const int64_t N = 97, K = 256;
  const auto w = make_weight(DType::Q4_1, N, K, 21);
  const auto wf = ref_dequant(DType::Q4_1, w.data(), N, K);
  const WeightView view{DType::Q4_1, N, K, w.data()};
  std::vector<std::vector<float>> xs, ys;
  const int64_t Ms[] = {1, 3, 40, 70};
  for (int64_t M : Ms) {
    xs.push_back(make_x(M, K, static_cast<uint32_t>(M)));
    ys.emplace_back(M * N);
  }
  std::vector<std::string> errors(2);
  auto worker = [&](int id) {
    try {
      MatmulScratch s;
      for (int rep = 0; rep < 5; ++rep)
        for (size_t i = id; i < xs.size(); i += 2) matmul(view, xs[i].data(), Ms[i], ys[i].data(), s);
    } catch (const std::exception& e) {
      errors[id] = e.what();
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (size_t i = 0; i < xs.size(); ++i) {
    ErrorModel em;
    em.act_q8 = Ms[i] <= decode_max_m(DType::Q4_1) || !dnnl_mm::available();
    em.act_bf16 = em.w_bf16 = !em.act_q8 && std::string(prefill_precision_name()) == "bf16";
    expect_close(wf, xs[i], ys[i], Ms[i], N, K, em, "concurrent M=" + std::to_string(Ms[i]));
  }
}

}  // namespace
}  // namespace ember::cpu

// ---------------------------------------------------------------- AVX-512 kernels, emulated
//
// The AVX-512 kernels (cpu/matmul_avx512_kernels.inc) compiled a second time
// against a portable emulation of the intrinsics (cpu/matmul_avx512_emu.h),
// so their logic (layouts, lane bookkeeping, tails, the Q8_0 +128 trick,
// both BF16 kernels) is checked on every CPU. On CPUs with AVX-512 VNNI the
// real kernels run in the MatmulTest cases above as well.
#include "cpu/matmul_avx512_emu.h"

namespace ember::cpu::detail::avx512emu {
namespace {
#include "cpu/matmul_avx512_kernels.inc"

// After the kernels: it uses their helpers.
#include "cpu/dequant_avx512.inc"
}  // namespace
const IsaImpl& table(bool dp_bf16) { return dp_bf16 ? impl_table<true>() : impl_table<false>(); }
DecodeKernel kquant(DType t) { return kquant_kernel(t); }
}  // namespace ember::cpu::detail::avx512emu

namespace ember::cpu {
namespace {

// A minimal decode driver (what matmul.cpp's run_decode does), with the
// rows split into two uneven chunks to exercise chunk boundaries.
void emu_decode(const detail::IsaImpl& impl, const WeightView& w, const float* x, int64_t M, float* y) {
  const size_t arb = impl.act_row_bytes(w.type, w.cols);
  void* act = nullptr;
  if (arb) {
    act = std::aligned_alloc(64, (arb * static_cast<size_t>(M) + 63) & ~size_t{63});
    impl.prepare_acts(w.type, x, M, w.cols, static_cast<uint8_t*>(act));
  }
  const detail::DecodeCtx c{w.type,
                            static_cast<const uint8_t*>(w.data),
                            detail::weight_row_bytes(w.type, w.cols),
                            w.cols,
                            M,
                            x,
                            static_cast<const uint8_t*>(act),
                            arb,
                            y,
                            w.rows};
  const detail::DecodeKernel k = impl.kernel(w.type);
  const int64_t split = w.rows / 3;
  k(c, 0, split);
  k(c, split, w.rows);
  if (detail::packable(w.type)) {  // the packed rows give the same results to the bit
    const size_t gb = detail::packed_group_bytes(w.type, w.cols);
    void* packed = std::aligned_alloc(64, gb * static_cast<size_t>((w.rows + 3) / 4));
    ember::cpu::pack_weight(w, packed);
    std::vector<float> yp(static_cast<size_t>(M * w.rows), std::nanf(""));
    detail::DecodeCtx cp = c;
    cp.packed = static_cast<const uint8_t*>(packed);
    cp.packed_group_bytes = gb;
    cp.y = yp.data();
    k(cp, 0, split);
    k(cp, split, w.rows);
    EXPECT_EQ(std::memcmp(yp.data(), y, yp.size() * sizeof(float)), 0)
        << "packed rows, " << type_name(static_cast<uint32_t>(w.type)) << " K=" << w.cols << " M=" << M;
    std::free(packed);
  }
  std::free(act);
}

class EmulatedAvx512Test : public testing::TestWithParam<std::tuple<DType, bool>> {
 protected:
  void run(int64_t N, int64_t K, const std::vector<int64_t>& Ms) {
    const auto [t, dp] = GetParam();
    const detail::IsaImpl& impl = detail::avx512emu::table(dp);
    const auto w = make_weight(t, N, K, static_cast<uint32_t>(N * 17 + K));
    const auto wf = ref_dequant(t, w.data(), N, K);
    for (int64_t M : Ms) {
      const auto x = make_x(M, K, static_cast<uint32_t>(M * 3 + K));
      std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
      emu_decode(impl, {t, N, K, w.data()}, x.data(), M, y.data());
      ErrorModel em;
      em.act_q8 = detail::is_quant(t);
      em.act_bf16 = dp && t == DType::BF16;
      expect_close(wf, x, y, M, N, K, em,
                   "emulated avx512 " + name_of(t) + (dp ? " (dpbf16)" : "") + " N=" + std::to_string(N) +
                       " K=" + std::to_string(K) + " M=" + std::to_string(M));
      if (HasFailure()) return;
    }
  }
};

TEST_P(EmulatedAvx512Test, Decode) {
  const std::vector<int64_t> ms(std::begin(kMs), std::end(kMs));
  run(7, 64, ms);    // 2 blocks: a partial quad only
  run(37, 256, ms);  // whole quads
  run(131, 96, ms);  // 3 blocks
  run(21, 160, ms);  // 5 blocks: a quad + a partial one
  run(9, 576, ms);   // 18 blocks: SmolLM2's K
  run(9, 1024, {1, 2, 3, 4, 5});
}

TEST_P(EmulatedAvx512Test, FloatTypesAnyK) {
  if (detail::is_quant(std::get<0>(GetParam()))) GTEST_SKIP() << "quantized types need K % 32 == 0";
  run(13, 45, {1, 2, 3, 5, 17});
  run(9, 7, {1, 3});
  run(11, 77, {1, 4});
}

TEST_P(EmulatedAvx512Test, Dequantize) {
  const auto [t, dp] = GetParam();
  const detail::IsaImpl& impl = detail::avx512emu::table(dp);
  const int64_t N = 5, K = 96;
  const auto w = make_weight(t, N, K, 77);
  const auto wf = ref_dequant(t, w.data(), N, K);
  std::vector<float> f(static_cast<size_t>(N * K));
  std::vector<uint16_t> b(static_cast<size_t>(N * K));
  impl.dequant_f32(t, w.data(), f.data(), N * K);
  impl.dequant_bf16(t, w.data(), b.data(), N * K);
  for (int64_t i = 0; i < N * K; ++i) {
    ASSERT_NEAR(f[i], wf[i], 1e-6f * std::fabs(wf[i])) << "f32 element " << i;
    const float rb = round_bf16(wf[i]);
    ASSERT_NEAR(bf16_to_fp32(b[i]), rb, std::fabs(rb) * std::ldexp(1.f, -7)) << "bf16 element " << i;
  }
  if (!detail::is_quant(t)) {  // odd element counts (tails)
    std::vector<float> f2(45);
    impl.dequant_f32(t, w.data(), f2.data(), 45);
    for (int i = 0; i < 45; ++i) ASSERT_EQ(f2[i], wf[i]) << "tail element " << i;
  }
  std::vector<float> xs = make_x(1, 77, 5);
  std::vector<uint16_t> xb(xs.size());
  impl.f32_to_bf16(xs.data(), xb.data(), static_cast<int64_t>(xs.size()));
  for (size_t i = 0; i < xs.size(); ++i) ASSERT_EQ(xb[i], fp32_to_bf16(xs[i])) << "f32_to_bf16 element " << i;
}

// The AVX-512 K-quant kernels (emulated) equal the scalar variant, which
// follows llama.cpp's orders, to the bit: every M tile, several rows, decode
// and prompt rows (N = 16: Q4_K's q4_K_8x8 GEMV / GEMM orders; N = 11: the
// vec_dot / tiled orders).
TEST(EmulatedAvx512KQuants, EqualTheScalarVariantBitForBit) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "the emulation needs AVX2";
  KnobGuard guard;
  set_decode_max_m(std::numeric_limits<int64_t>::max());
  const int64_t K = 768;
  const auto& avx2 = detail::avx2_impl();
  for (const int64_t N : {int64_t{11}, int64_t{16}}) {
    for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
      const auto w = make_weight(t, N, K, 31);
      for (const RowKind rk : {RowKind::kPrompt, RowKind::kDecode}) {
        for (int64_t M : {1, 2, 3, 4, 5, 9}) {
          const auto x = make_x(M, K, static_cast<uint32_t>(M + 40));
          std::vector<float> ys(static_cast<size_t>(M * N)), ye(ys.size(), std::nanf(""));
          MatmulScratch scratch;
          force_isa(Isa::kScalar);
          matmul({t, N, K, w.data()}, x.data(), M, ys.data(), scratch, MatmulPath::kRowInvariant, rk);
          const size_t arb = avx2.act_row_bytes(t, K);
          std::vector<uint8_t> act(arb * static_cast<size_t>(M) + 64);
          avx2.prepare_acts(t, x.data(), M, K, act.data());
          detail::DecodeCtx c{t, w.data(), row_bytes(t, K), K, M, x.data(), act.data(), arb, ye.data(), N};
          c.korder = detail::kquant_order(t, N, rk == RowKind::kDecode);
          const detail::DecodeKernel k = detail::avx512emu::kquant(t);
          ASSERT_NE(k, nullptr);
          k(c, 0, 4);
          k(c, 4, N);
          for (size_t i = 0; i < ys.size(); ++i)
            ASSERT_EQ(std::memcmp(&ys[i], &ye[i], 4), 0)
                << name_of(t) << " N=" << N << " order " << static_cast<int>(c.korder) << " M=" << M << " output " << i
                << ": scalar " << ys[i] << " emulated avx512 " << ye[i];
          // The packed 8-row groups (PackedQ4Kx8 / PackedQ6Kx8), whole and split.
          if ((t == DType::Q4_K || t == DType::Q6_K) && N % 8 == 0) {
            std::vector<uint8_t> packed(detail::kx8_group_bytes(t, K) * static_cast<size_t>(N / 8));
            pack_weight({t, N, K, w.data()}, packed.data());
            std::vector<float> yp(ys.size(), std::nanf(""));
            detail::DecodeCtx cp = c;
            cp.packed = packed.data();
            cp.packed_group_bytes = detail::kx8_group_bytes(t, K);
            cp.y = yp.data();
            for (int split : {0, 3}) {  // both groups in one tile; one group alone and rows from the GGUF copy
              std::fill(yp.begin(), yp.end(), std::nanf(""));
              k(cp, 0, split);
              k(cp, split, N);
              for (size_t i = 0; i < ys.size(); ++i)
                ASSERT_EQ(std::memcmp(&ys[i], &yp[i], 4), 0)
                    << "packed " << name_of(t) << " N=" << N << " split " << split << " order "
                    << static_cast<int>(c.korder) << " M=" << M << " output " << i << ": scalar " << ys[i]
                    << " emulated avx512 " << yp[i];
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, EmulatedAvx512Test, testing::Combine(testing::ValuesIn(kTypes), testing::Bool()),
                         [](const testing::TestParamInfo<std::tuple<DType, bool>>& info) {
                           return name_of(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_bf16" : "_nobf16");
                         });

}  // namespace
}  // namespace ember::cpu
