// cpu::matmul / cpu::dequantize_rows for Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K
// and Q6_K:
//  * every ISA variant this CPU can run (forced with cpu::force_isa) x decode
//    (forced for all M) and prefill (oneDNN; without it the decode kernels) x M = 1..40 x odd N, against
//    the type table's reference dequantizer + a double-precision dot, with
//    the rounding of the activation quantization as the tolerance;
//  * the decode kernels bit-identical to the reference summation orders
//    (matmul_internal.h: quant_dot_reference / kquant_dot_reference, which
//    are llama.cpp's: K-quants in its one-row and batched orders, RowKind),
//    on every variant, 1 and 2 threads (Q5_0 / Q5_1 on AVX-512 have the
//    AVX-512 variant's own order, as its Q4_0 / Q4_1 / Q8_0 do: there each
//    row equals that row computed alone, the batch invariance);
//  * dequantize_rows (embedding lookup) equal to the reference dequantizer;
//  * the reference dequantizers on hand-built blocks with known values.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
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

constexpr DType kNewTypes[] = {DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,
                               DType::Q4_K, DType::Q5_K, DType::Q6_K};
constexpr Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni};

// (The prompt rows under test are llama.cpp's orders: AMX prompt rows off.)
struct Guard {
  int threads = omp_get_max_threads();
  Guard() { set_amx_prompt_rows(false); }
  ~Guard() {
    reset_amx_prompt_rows();
    reset_isa();
    reset_decode_max_m();
    omp_set_num_threads(threads);
  }
};

std::string tname(DType t) { return type_name(static_cast<uint32_t>(t)); }

// Random blocks in the GGUF layout: random quant bits, scales of a realistic
// magnitude (f16 fields), Q6_K's int8 sub-block scales over the full range.
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
      case DType::Q5_0: put(0, scale(rng)); break;
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

std::vector<float> make_x(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = normal(rng) * (pick(rng) == 0 ? 20.f : 1.f);
  if (K >= 512)  // an all-zero Q8_K block (scale 0) in row 0
    for (int k = 256; k < 512; ++k) x[k] = 0.f;
  return x;
}

std::vector<float> ref_dequant(DType t, const uint8_t* w, int64_t N, int64_t K) {
  std::vector<float> out(static_cast<size_t>(N * K));
  const size_t rb = row_bytes(t, K);
  for (int64_t r = 0; r < N; ++r) type_traits(t)->dequantize_row(w + r * rb, out.data() + r * K, K);
  return out;
}

// y against a double-precision reference; the bound is 6 sigma of the
// activation quantization (blocks of `ablock`, uniform rounding error of
// amax/127) plus bf16 rounding where the prefill path runs in bf16, plus f32
// accumulation slack.
void expect_close(const std::vector<float>& wf, const std::vector<float>& x, const std::vector<float>& y, int64_t M,
                  int64_t N, int64_t K, int64_t ablock, bool bf16, const std::string& what) {
  int bad = 0;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x.data() + m * K;
    std::vector<double> ex2(static_cast<size_t>(K), 0.0);
    const int64_t blk = ablock > 0 ? ablock : 1;
    for (int64_t b = 0; b < K; b += blk) {
      double amax = 0;
      for (int64_t k = b; k < b + blk; ++k) amax = std::max(amax, std::fabs(static_cast<double>(xr[k])));
      for (int64_t k = b; k < b + blk; ++k) {
        double v = ablock ? std::pow(amax / 127.0, 2) / 12.0 : 0.0;
        if (bf16) v += std::pow(xr[k] * kBf16Ulp, 2) / 12.0;
        ex2[static_cast<size_t>(k)] = v;
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      const float* wr = wf.data() + n * K;
      double ref = 0, abs_sum = 0, var = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += static_cast<double>(wr[k]) * xr[k];
        abs_sum += std::fabs(static_cast<double>(wr[k]) * xr[k]);
        var += static_cast<double>(wr[k]) * wr[k] * ex2[static_cast<size_t>(k)];
        if (bf16) var += std::pow(wr[k] * kBf16Ulp * xr[k], 2) / 12.0;
      }
      const double tol =
          6.0 * std::sqrt(var) + 2e-6 * abs_sum * std::sqrt(static_cast<double>(K)) / 8.0 + 1e-6 * abs_sum + 1e-30;
      const double got = y[static_cast<size_t>(m * N + n)];
      if (!(std::fabs(got - ref) <= tol) && ++bad <= 5)
        ADD_FAILURE() << what << ": y[" << m << "," << n << "] = " << got << ", reference " << ref << " (tol " << tol
                      << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// The reference-order dot product of the scalar variant's prepared
// activations (what every variant's decode kernel must return bit for bit).
std::vector<float> reference_order(DType t, const std::vector<uint8_t>& w, const std::vector<float>& x, int64_t M,
                                   int64_t N, int64_t K, RowKind rows = RowKind::kPrompt) {
  const detail::KOrder order = detail::kquant_order(t, N, rows == RowKind::kDecode);
  const auto& sc = detail::scalar_impl();
  const size_t arb = sc.act_row_bytes(t, K);
  std::vector<uint8_t> act(arb * static_cast<size_t>(M) + 64);
  sc.prepare_acts(t, x.data(), M, K, act.data());
  std::vector<float> y(static_cast<size_t>(M * N));
  const size_t rb = row_bytes(t, K);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* wr = w.data() + static_cast<size_t>(n) * rb;
      float r = 0;
      if (detail::is_kquant(t)) {
        const detail::Q8KBlock* a = detail::q8k_row(act.data(), arb, m);
        r = t == DType::Q2_K   ? detail::kquant_dot_reference<DType::Q2_K>(wr, a, K / 256, order)
            : t == DType::Q3_K ? detail::kquant_dot_reference<DType::Q3_K>(wr, a, K / 256, order)
            : t == DType::Q4_K ? detail::kquant_dot_reference<DType::Q4_K>(wr, a, K / 256, order)
            : t == DType::Q5_K ? detail::kquant_dot_reference<DType::Q5_K>(wr, a, K / 256, order)
                               : detail::kquant_dot_reference<DType::Q6_K>(wr, a, K / 256, order);
      } else {
        const detail::Q8Row a = detail::q8_natural_row(act.data(), arb, K, m);
        r = t == DType::Q5_0 ? detail::quant_dot_reference<DType::Q5_0>(wr, a, K / 32)
                             : detail::quant_dot_reference<DType::Q5_1>(wr, a, K / 32);
      }
      y[static_cast<size_t>(m * N + n)] = r;
    }
  return y;
}

using Param = std::tuple<DType, Isa>;
std::string param_name(const testing::TestParamInfo<Param>& info) {
  std::string n = tname(std::get<0>(info.param)) + "_" + isa_to_string(std::get<1>(info.param));
  for (auto& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

// y for M rows of x, each computed in its own call (M = 1, one thread).
std::vector<float> one_row_at_a_time(const WeightView& w, const std::vector<float>& x, int64_t M, RowKind rk) {
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> y(static_cast<size_t>(M * w.rows));
  MatmulScratch scratch;
  for (int64_t m = 0; m < M; ++m)
    matmul(w, x.data() + m * w.cols, 1, y.data() + m * w.rows, scratch, MatmulPath::kRowInvariant, rk);
  omp_set_num_threads(threads);
  return y;
}

class KQuantMatmulTest : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!isa_supported(isa())) GTEST_SKIP() << "this CPU cannot run the " << isa_to_string(isa()) << " kernels";
    force_isa(isa());
  }
  DType type() const { return std::get<0>(GetParam()); }
  Isa isa() const { return std::get<1>(GetParam()); }
  int64_t K() const { return detail::is_kquant(type()) ? 768 : 352; }
  // The variant sums in the reference order (else in its own, row by row).
  bool reference_order_kernels() const { return detail::is_kquant(type()) || isa() != Isa::kAvx512Vnni; }
  Guard guard_;
};

// Both row kinds (K-quants: llama.cpp's one-row and batched orders), and for
// N = 16 Q4_K's q4_K_8x8 GEMV / GEMM orders (N = 13: its vec_dot / tiled).
TEST_P(KQuantMatmulTest, DecodeIsBitIdenticalToTheReferenceOrder) {
  set_decode_max_m(std::numeric_limits<int64_t>::max());
  const DType t = type();
  const int64_t K = this->K();
  for (const int64_t N : {int64_t{13}, int64_t{16}}) {
    const auto w = make_weight(t, N, K, 7);
    const auto wf = ref_dequant(t, w.data(), N, K);
    const WeightView view{t, N, K, w.data()};
    MatmulScratch scratch;
    for (const RowKind rk : {RowKind::kPrompt, RowKind::kDecode}) {
      for (int64_t M = 1; M <= 40; M += N == 13 ? 1 : 3) {
        const auto x = make_x(M, K, static_cast<uint32_t>(M * 3 + 1));
        const auto yr =
            reference_order_kernels() ? reference_order(t, w, x, M, N, K, rk) : one_row_at_a_time(view, x, M, rk);
        for (int th : {1, 2}) {
          omp_set_num_threads(th);
          std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
          matmul(view, x.data(), M, y.data(), scratch, MatmulPath::kAuto, rk);
          for (size_t i = 0; i < y.size(); ++i)
            ASSERT_EQ(std::memcmp(&y[i], &yr[i], 4), 0)
                << tname(t) << " " << isa_name() << " N=" << N << (rk == RowKind::kDecode ? " decode" : " prompt")
                << " M=" << M << " threads=" << th << " output " << i << ": got " << y[i] << " reference order "
                << yr[i];
          expect_close(wf, x, y, M, N, K, detail::is_kquant(t) ? 256 : 32, false,
                       tname(t) + " decode " + isa_name() + " M=" + std::to_string(M));
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_P(KQuantMatmulTest, DecodeWiderShapes) {
  set_decode_max_m(std::numeric_limits<int64_t>::max());
  const DType t = type();
  const int64_t K = detail::is_kquant(t) ? 2048 : 1024;
  for (const int64_t N : {int64_t{301}, int64_t{304}}) {
    const auto w = make_weight(t, N, K, 11);
    const WeightView view{t, N, K, w.data()};
    MatmulScratch scratch;
    for (const RowKind rk : {RowKind::kPrompt, RowKind::kDecode}) {
      for (int64_t M : {1, 4, 7}) {
        const auto x = make_x(M, K, static_cast<uint32_t>(M + 100));
        const auto yr =
            reference_order_kernels() ? reference_order(t, w, x, M, N, K, rk) : one_row_at_a_time(view, x, M, rk);
        std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
        matmul(view, x.data(), M, y.data(), scratch, MatmulPath::kAuto, rk);
        ASSERT_EQ(std::memcmp(y.data(), yr.data(), y.size() * 4), 0)
            << tname(t) << " N=" << N << " kind " << static_cast<int>(rk) << " M=" << M;
      }
    }
  }
}

TEST_P(KQuantMatmulTest, Prefill) {
  set_decode_max_m(0);
  const DType t = type();
  const int64_t N = 77, K = this->K();
  const auto w = make_weight(t, N, K, 5);
  const auto wf = ref_dequant(t, w.data(), N, K);
  const WeightView view{t, N, K, w.data()};
  const bool bf16 = std::string(prefill_precision_name()) == "bf16";
  // (without oneDNN, the decode kernels with their quantized activations)
  const int64_t ablock = dnnl_mm::available() ? 0 : detail::is_kquant(t) ? 256 : 32;
  MatmulScratch scratch;
  for (int64_t M : {1, 2, 3, 17, 40, 65}) {
    const auto x = make_x(M, K, static_cast<uint32_t>(M + 9));
    std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
    matmul(view, x.data(), M, y.data(), scratch);
    expect_close(wf, x, y, M, N, K, ablock, bf16, tname(t) + " prefill " + isa_name() + " M=" + std::to_string(M));
    if (HasFailure()) return;
  }
}

TEST_P(KQuantMatmulTest, EmbeddingLookupEqualsReference) {
  const DType t = type();
  const int64_t N = 9, K = this->K();
  const auto w = make_weight(t, N, K, 3);
  const auto wf = ref_dequant(t, w.data(), N, K);
  const WeightView view{t, N, K, w.data()};
  std::vector<float> out(static_cast<size_t>(3 * K));
  dequantize_rows(view, 5, 3, out.data());
  // Q5_1's d*q + m may be fused (one rounding less) by the SIMD dequantizer.
  for (int64_t i = 0; i < 3 * K; ++i) {
    const float r = wf[static_cast<size_t>(5 * K + i)];
    if (t == DType::Q5_1 && isa() != Isa::kScalar)
      ASSERT_NEAR(out[static_cast<size_t>(i)], r, std::fabs(r) * 1e-6f + 1e-7f) << i;
    else
      ASSERT_EQ(std::memcmp(&out[static_cast<size_t>(i)], &r, 4), 0) << tname(t) << " element " << i;
  }
}

TEST_P(KQuantMatmulTest, RejectsKNotAMultipleOfTheBlock) {
  const DType t = type();
  const int64_t K = detail::is_kquant(t) ? 288 : 48;
  std::vector<uint8_t> w(4096);
  const WeightView view{t, 2, K, w.data()};
  std::vector<float> x(static_cast<size_t>(K)), y(2);
  MatmulScratch scratch;
  EXPECT_THROW(matmul(view, x.data(), 1, y.data(), scratch), Error);
}

INSTANTIATE_TEST_SUITE_P(All, KQuantMatmulTest,
                         testing::Combine(testing::ValuesIn(kNewTypes), testing::ValuesIn(kAllIsas)), param_name);

TEST(KQuantMatmul, SupportedTypes) {
  for (DType t : kNewTypes) EXPECT_TRUE(matmul_supports(t)) << tname(t);
  EXPECT_FALSE(matmul_supports(DType::Q8_K));
}

// Which of llama.cpp's orders each K-quant's rows take (its x86 AVX2 build:
// the repacked q4_K_8x8 kernels for Q4_K with N % 8 == 0; else vec_dot for
// one-row batches and the tiled kernels for 8+ rows).
TEST(KQuantMatmul, Orders) {
  using detail::KOrder;
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    SCOPED_TRACE(tname(t));
    const bool repacked = t == DType::Q4_K;
    EXPECT_EQ(detail::kquant_order(t, 16, true), repacked ? KOrder::kGemv8x8 : KOrder::kVec);
    EXPECT_EQ(detail::kquant_order(t, 16, false), repacked ? KOrder::kGemm8x8 : KOrder::kTiled);
    EXPECT_EQ(detail::kquant_order(t, 13, true), KOrder::kVec);
    EXPECT_EQ(detail::kquant_order(t, 13, false), KOrder::kTiled);
  }
}

// Q8_K activations: llama.cpp's quantize_row_q8_K_ref on a hand-checked block.
TEST(KQuantMatmul, Q8KQuantization) {
  std::vector<float> x(256, 0.f);
  x[0] = 1.f;
  x[1] = -2.f;  // largest |x|: max = -2, iscale = 63.5, d = 1/63.5
  x[17] = 0.5f;
  x[255] = 0.01f;  // 0.635 -> 1
  detail::Q8KBlock b;
  detail::quantize_row_q8k(x.data(), 256, &b);
  EXPECT_EQ(b.d, 1.f / (-127.f / -2.f));
  EXPECT_EQ(b.qs[0], 64);  // 63.5 -> 64 (even)
  EXPECT_EQ(b.qs[1], -127);
  EXPECT_EQ(b.qs[17], 32);  // 31.75
  EXPECT_EQ(b.qs[255], 1);
  EXPECT_EQ(b.bsums[0], 64 - 127);
  EXPECT_EQ(b.bsums[1], 32);
  EXPECT_EQ(b.bsums[15], 1);
  std::vector<float> z(256, 0.f);
  detail::quantize_row_q8k(z.data(), 256, &b);
  EXPECT_EQ(b.d, 0.f);
  EXPECT_EQ(b.bsums[3], 0);
}

// The AVX2 variant quantizes Q8_K rows with vector operations: the same
// bytes as quantize_row_q8k (the reference every kernel order assumes) on
// random rows, ties at .5, a largest |x| of both signs (the first wins),
// zeros, denormals, infinities and NaN.
TEST(KQuantMatmul, Avx2Q8KQuantizationEqualsTheReference) {
  if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "no AVX2";
  const int64_t K = 1024, M = 12;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = nd(rng) * 3.f;
  float* r = x.data();
  for (int j = 0; j < 256; ++j) r[j] = static_cast<float>(j % 9) - 4.f;  // row 0, block 0: ties
  r[256 + 7] = -9.f, r[256 + 100] = 9.f;                                 // block 1: -9 first
  r[512 + 3] = 9.f, r[512 + 200] = -9.f;                                 // block 2: +9 first
  for (int j = 768; j < 1024; ++j) r[j] = 0.f;                           // block 3: zeros
  r = x.data() + K;
  r[5] = std::numeric_limits<float>::quiet_NaN();   // row 1: NaN
  r[300] = std::numeric_limits<float>::infinity();  // block 1: +inf
  r[600] = -std::numeric_limits<float>::infinity(), r[601] = std::numeric_limits<float>::quiet_NaN();
  for (int j = 768; j < 1024; ++j) r[j] = std::numeric_limits<float>::denorm_min() * static_cast<float>(j % 5);
  r = x.data() + 2 * K;
  for (int j = 0; j < K; ++j) r[j] = static_cast<float>(j % 255) * 0.5f - 63.5f;  // row 2: many halves
  const size_t rb = detail::q8k_row_bytes(K);
  std::vector<uint8_t> a(rb * M), b(rb * M, 0xAA);
  detail::scalar_impl().prepare_acts(DType::Q4_K, x.data(), M, K, a.data());
  detail::avx2_impl().prepare_acts(DType::Q4_K, x.data(), M, K, b.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t blk = 0; blk < K / 256; ++blk) {
      const auto& p = reinterpret_cast<const detail::Q8KBlock*>(a.data() + m * rb)[blk];
      const auto& q = reinterpret_cast<const detail::Q8KBlock*>(b.data() + m * rb)[blk];
      const std::string where = "row " + std::to_string(m) + " block " + std::to_string(blk);
      ASSERT_EQ(std::memcmp(&p.d, &q.d, 4), 0) << where << ": d " << p.d << " vs " << q.d;
      ASSERT_EQ(std::memcmp(p.qs, q.qs, sizeof(p.qs)), 0) << where;
      ASSERT_EQ(std::memcmp(p.bsums, q.bsums, sizeof(p.bsums)), 0) << where;
    }
}

// ---- reference dequantizers on hand-built blocks

void pack_scale_min(uint8_t* s, int j, int sc, int m) {  // inverse of kquant_scale_min
  if (j < 4) {
    s[j] = static_cast<uint8_t>((s[j] & 0xC0) | sc);
    s[j + 4] = static_cast<uint8_t>((s[j + 4] & 0xC0) | m);
  } else {
    s[j + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
    s[j - 4] = static_cast<uint8_t>((s[j - 4] & 0x3F) | ((sc >> 4) << 6));
    s[j] = static_cast<uint8_t>((s[j] & 0x3F) | ((m >> 4) << 6));
  }
}

TEST(KQuantReference, Q4KAndQ5K) {
  for (DType t : {DType::Q4_K, DType::Q5_K}) {
    SCOPED_TRACE(tname(t));
    std::vector<uint8_t> blk(type_traits(t)->type_size, 0);
    const uint16_t d = fp32_to_fp16(0.5f), dmin = fp32_to_fp16(0.25f);
    std::memcpy(blk.data(), &d, 2);
    std::memcpy(blk.data() + 2, &dmin, 2);
    int sc[8], mn[8], q[256];
    for (int j = 0; j < 8; ++j) {
      sc[j] = (j * 9 + 5) % 64;
      mn[j] = (j * 23 + 60) % 64;
      pack_scale_min(blk.data() + 4, j, sc[j], mn[j]);
    }
    const int bits = t == DType::Q5_K ? 5 : 4;
    uint8_t* qs = blk.data() + (t == DType::Q5_K ? 48 : 16);
    uint8_t* qh = blk.data() + 16;
    for (int e = 0; e < 256; ++e) {
      q[e] = (e * 7 + 3) % (1 << bits);
      const int j = e / 64, l = e % 32, hi = (e / 32) % 2;
      qs[32 * j + l] = static_cast<uint8_t>(qs[32 * j + l] | ((q[e] & 0xF) << (4 * hi)));
      if (bits == 5 && (q[e] & 16)) qh[l] = static_cast<uint8_t>(qh[l] | (1 << (2 * j + hi)));
    }
    float y[256];
    type_traits(t)->dequantize_row(blk.data(), y, 256);
    for (int e = 0; e < 256; ++e)
      ASSERT_EQ(y[e], 0.5f * static_cast<float>(sc[e / 32]) * static_cast<float>(q[e]) -
                          0.25f * static_cast<float>(mn[e / 32]))
          << e;
  }
}

TEST(KQuantReference, Q6K) {
  BlockQ6_K b{};
  b.d = fp32_to_fp16(0.125f);
  int q[256];
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<int8_t>(i * 17 - 120);
  for (int e = 0; e < 256; ++e) {
    q[e] = (e * 13 + 7) % 64;
    const int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const int qli = 64 * h + l + (quarter & 1) * 32;
    b.ql[qli] = static_cast<uint8_t>(b.ql[qli] | ((q[e] & 0xF) << (4 * (quarter >> 1))));
    b.qh[32 * h + l] = static_cast<uint8_t>(b.qh[32 * h + l] | ((q[e] >> 4) << (2 * quarter)));
  }
  float y[256];
  type_traits(DType::Q6_K)->dequantize_row(&b, y, 256);
  for (int e = 0; e < 256; ++e)
    ASSERT_EQ(y[e], 0.125f * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q[e] - 32)) << e;
}

// Q2_K: element 128h + 32j + l is bits 2j of qs[32h + l]; scales[e / 16]
// low nibble the scale, high the min.
TEST(KQuantReference, Q2K) {
  BlockQ2_K b{};
  b.d = fp32_to_fp16(0.5f);
  b.dmin = fp32_to_fp16(0.25f);
  int q[256];
  for (int i = 0; i < 16; ++i) b.scales[i] = static_cast<uint8_t>(((i * 7 + 3) % 16) | (((i * 5 + 11) % 16) << 4));
  for (int e = 0; e < 256; ++e) {
    q[e] = (e * 13 + 7) % 4;
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    b.qs[32 * h + l] = static_cast<uint8_t>(b.qs[32 * h + l] | (q[e] << (2 * j)));
  }
  float y[256];
  type_traits(DType::Q2_K)->dequantize_row(&b, y, 256);
  for (int e = 0; e < 256; ++e)
    ASSERT_EQ(y[e], 0.5f * static_cast<float>(b.scales[e / 16] & 0xF) * static_cast<float>(q[e]) -
                        0.25f * static_cast<float>(b.scales[e / 16] >> 4))
        << e;
}

// Q3_K: 6-bit scales (stored + 32) packed in scales[12] (low 4 bits: bytes
// 0..7, nibble by nibble; high 2 bits: bytes 8..11), values q - 4 with the
// high bit in hmask.
TEST(KQuantReference, Q3K) {
  BlockQ3_K b{};
  b.d = fp32_to_fp16(0.125f);
  int sc[16], q[256];
  for (int i = 0; i < 16; ++i) {
    sc[i] = (i * 23 + 9) % 64;
    const int lo = sc[i] & 0xF, hi = sc[i] >> 4;
    b.scales[i % 8] = static_cast<uint8_t>(b.scales[i % 8] | (lo << (4 * (i / 8))));
    b.scales[8 + i % 4] = static_cast<uint8_t>(b.scales[8 + i % 4] | (hi << (2 * (i / 4))));
  }
  for (int e = 0; e < 256; ++e) {
    q[e] = (e * 11 + 5) % 8;  // stored value: q - 4 decoded
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    b.qs[32 * h + l] = static_cast<uint8_t>(b.qs[32 * h + l] | ((q[e] & 3) << (2 * j)));
    if (q[e] & 4) b.hmask[l] = static_cast<uint8_t>(b.hmask[l] | (1 << (4 * h + j)));
  }
  float y[256];
  type_traits(DType::Q3_K)->dequantize_row(&b, y, 256);
  for (int e = 0; e < 256; ++e)
    ASSERT_EQ(y[e], 0.125f * static_cast<float>(sc[e / 16] - 32) * static_cast<float>(q[e] - 4)) << e;
}

TEST(KQuantReference, Q5_0AndQ5_1) {
  BlockQ5_0 b0{};
  BlockQ5_1 b1{};
  b0.d = b1.d = fp32_to_fp16(0.5f);
  b1.m = fp32_to_fp16(-3.f);
  int q[32];
  uint32_t qh = 0;
  for (int e = 0; e < 32; ++e) {
    q[e] = (e * 11 + 5) % 32;
    b0.qs[e % 16] = b1.qs[e % 16] = static_cast<uint8_t>(b0.qs[e % 16] | ((q[e] & 0xF) << (e < 16 ? 0 : 4)));
    if (q[e] & 16) qh |= 1u << e;
  }
  std::memcpy(b0.qh, &qh, 4);
  std::memcpy(b1.qh, &qh, 4);
  float y0[32], y1[32];
  type_traits(DType::Q5_0)->dequantize_row(&b0, y0, 32);
  type_traits(DType::Q5_1)->dequantize_row(&b1, y1, 32);
  for (int e = 0; e < 32; ++e) {
    EXPECT_EQ(y0[e], 0.5f * static_cast<float>(q[e] - 16)) << e;
    EXPECT_EQ(y1[e], 0.5f * static_cast<float>(q[e]) - 3.f) << e;
  }
}

}  // namespace
}  // namespace ember::cpu
