// The CUDA kernels' shared code (gpu/layout.h) run on the host: device weight
// layouts against the reference dequantizers, the activation quantization
// against the CPU's, the GEMV lane arithmetic (gpu::reference_gemv, which the
// device must reproduce bit for bit) against the CPU decode kernels and a
// double-precision reference, the rows_are_decodes property (a row's bits do
// not depend on M), the KV pool layout and the split-K plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/tensor/types.h"
#include "cpu/matmul.h"
#include "cpu/matmul_internal.h"
#include "gpu/layout.h"

namespace ember {
namespace {

constexpr DType kQuantTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_0,
                                 DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K};
constexpr DType kKQuants[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K};
constexpr DType kFloatTypes[] = {DType::F16, DType::BF16, DType::F32};

// Random weights in the GGUF layout (as tests/ops/test_matmul.cpp).
std::vector<uint8_t> make_weight(DType t, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.002f, 0.03f);
  std::normal_distribution<float> normal(0.f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> out(row_bytes(t, K) * static_cast<size_t>(N) + 64);
  uint8_t* p = out.data();
  const int64_t nb = K / 32;
  for (int64_t r = 0; r < N; ++r) {
    switch (t) {
      case DType::Q4_0:
        for (int64_t b = 0; b < nb; ++b, p += sizeof(BlockQ4_0)) {
          BlockQ4_0 blk;
          blk.d = fp32_to_fp16((byte(rng) & 1 ? -1.f : 1.f) * scale(rng));
          for (auto& q : blk.qs) q = static_cast<uint8_t>(byte(rng));
          std::memcpy(p, &blk, sizeof(blk));
        }
        break;
      case DType::Q4_1:
        for (int64_t b = 0; b < nb; ++b, p += sizeof(BlockQ4_1)) {
          BlockQ4_1 blk;
          blk.d = fp32_to_fp16(scale(rng));
          blk.m = fp32_to_fp16(-8.f * scale(rng));
          for (auto& q : blk.qs) q = static_cast<uint8_t>(byte(rng));
          std::memcpy(p, &blk, sizeof(blk));
        }
        break;
      case DType::Q8_0:
        for (int64_t b = 0; b < nb; ++b, p += sizeof(BlockQ8_0)) {
          BlockQ8_0 blk;
          blk.d = fp32_to_fp16(scale(rng) / 16.f);
          for (auto& q : blk.qs) q = static_cast<int8_t>(byte(rng) - 128);
          std::memcpy(p, &blk, sizeof(blk));
        }
        break;
      case DType::Q5_0:
        for (int64_t b = 0; b < nb; ++b, p += sizeof(BlockQ5_0)) {
          BlockQ5_0 blk;
          blk.d = fp32_to_fp16((byte(rng) & 1 ? -1.f : 1.f) * scale(rng) / 2.f);
          for (auto& q : blk.qh) q = static_cast<uint8_t>(byte(rng));
          for (auto& q : blk.qs) q = static_cast<uint8_t>(byte(rng));
          std::memcpy(p, &blk, sizeof(blk));
        }
        break;
      case DType::Q5_1:
        for (int64_t b = 0; b < nb; ++b, p += sizeof(BlockQ5_1)) {
          BlockQ5_1 blk;
          blk.d = fp32_to_fp16(scale(rng) / 2.f);
          blk.m = fp32_to_fp16(-8.f * scale(rng));
          for (auto& q : blk.qh) q = static_cast<uint8_t>(byte(rng));
          for (auto& q : blk.qs) q = static_cast<uint8_t>(byte(rng));
          std::memcpy(p, &blk, sizeof(blk));
        }
        break;
      // K-quants: random quant and scale bits, f16 super-block scales of a
      // realistic magnitude (as tests/ops/test_matmul_kquants.cpp).
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q6_K: {
        const size_t bb = type_traits(t)->type_size;
        for (int64_t b = 0; b < K / kQK_K; ++b, p += bb) {
          for (size_t i = 0; i < bb; ++i) p[i] = static_cast<uint8_t>(byte(rng));
          if (t == DType::Q6_K) {
            const uint16_t d = fp32_to_fp16((byte(rng) & 1 ? -1.f : 1.f) * scale(rng) / 64.f);
            std::memcpy(p + offsetof(BlockQ6_K, d), &d, 2);
          } else {
            const uint16_t d = fp32_to_fp16(scale(rng) / 16.f), dmin = fp32_to_fp16(scale(rng) / 16.f);
            std::memcpy(p, &d, 2);
            std::memcpy(p + 2, &dmin, 2);
          }
        }
        break;
      }
      case DType::F16:
        for (int64_t k = 0; k < K; ++k, p += 2) {
          const uint16_t h = fp32_to_fp16(normal(rng));
          std::memcpy(p, &h, 2);
        }
        break;
      case DType::BF16:
        for (int64_t k = 0; k < K; ++k, p += 2) {
          const uint16_t h = fp32_to_bf16(normal(rng));
          std::memcpy(p, &h, 2);
        }
        break;
      default:
        for (int64_t k = 0; k < K; ++k, p += 4) {
          const float f = normal(rng);
          std::memcpy(p, &f, 4);
        }
        break;
    }
  }
  return out;
}

std::vector<float> make_x(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = normal(rng);
  if (K >= 64) {
    for (int i = 0; i < 32; ++i) x[i] = 0.0f;  // an all-zero block (d = 0)
    x[40] = 100.0f;                            // an outlier
  }
  return x;
}

std::vector<float> dequant(DType t, const std::vector<uint8_t>& w, int64_t N, int64_t K) {
  std::vector<float> out(static_cast<size_t>(N * K));
  const size_t rb = row_bytes(t, K);
  for (int64_t n = 0; n < N; ++n) type_traits(t)->dequantize_row(w.data() + n * rb, out.data() + n * K, K);
  return out;
}

TEST(GpuLayout, SplitBlocksDequantizeExactlyAsTheReference) {
  for (DType t : kQuantTypes) {
    for (uint32_t seed : {11u, 12u, 13u}) {
      const int64_t N = 3, K = gpu::is_kquant(t) ? 768 : 96, be = gpu::block_elems(t), nb = K / be;
      const auto w = make_weight(t, N, K, seed);
      const auto ref = dequant(t, w, N, K);
      std::vector<gpu::U32x4> qs(static_cast<size_t>(N * nb) * gpu::quant_qs_bytes(t) / 16 + 1);
      std::vector<uint32_t> sc(static_cast<size_t>(N * nb));
      auto* qs8 = reinterpret_cast<uint8_t*>(qs.data());
      auto* sc8 = reinterpret_cast<uint8_t*>(sc.data());
      for (int64_t b = 0; b < N * nb; ++b) {
        gpu::split_block(t, w.data() + b * gpu::gguf_block_bytes(t), qs8 + b * gpu::quant_qs_bytes(t),
                         sc8 + b * gpu::quant_header_bytes(t));
      }
      EXPECT_EQ(static_cast<size_t>(gpu::gguf_block_bytes(t)), type_traits(t)->type_size);
      EXPECT_EQ(static_cast<uint32_t>(be), type_traits(t)->block_size);
      EXPECT_EQ(gpu::quant_qs_bytes(t) % 16, 0) << "16-byte loads of the device blocks";
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          const float v = gpu::quant_weight_elem(t, qs8, sc8, K, n, k);
          ASSERT_EQ(v, ref[n * K + k]) << type_name(static_cast<uint32_t>(t)) << " n=" << n << " k=" << k;
          if (!gpu::is_kquant(t)) {
            const int64_t gb = n * nb + k / 32;
            ASSERT_EQ(gpu::dequant_elem(t, qs8 + gb * gpu::quant_qs_bytes(t), gpu::load_header(t, sc8, gb),
                                        static_cast<int>(k % 32)),
                      v);
          }
        }
      }
    }
  }
}

// The device's 6-bit scale/min unpacking from three words (kq_scale_min) is
// ggml's get_scale_min_k4 (kquant_scale_min) for every sub-block.
TEST(GpuLayout, KQuantScaleMinUnpacking) {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 2000; ++trial) {
    uint8_t q[12];
    for (auto& b : q) b = static_cast<uint8_t>(trial == 0 ? 0xFF : trial == 1 ? 0 : byte(rng));
    const uint32_t s0 = gpu::load_u32_bytes(q), s1 = gpu::load_u32_bytes(q + 4), s2 = gpu::load_u32_bytes(q + 8);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      kquant_scale_min(j, q, &sc, &m);
      int gsc, gm;
      gpu::kq_scale_min(j, s0, s1, s2, &gsc, &gm);
      ASSERT_EQ(gsc, sc) << trial << " " << j;
      ASSERT_EQ(gm, m) << trial << " " << j;
    }
  }
}

// The K-quant GEMV unit decomposition: the 8 units of a super-block cover
// each of its 256 elements exactly once, with the quant value, scale and min
// the reference dequantizer uses (checked through the integer identity
// value = d * sc * q - dmin * m, q and the scales recovered from the unit).
TEST(GpuLayout, KQuantUnitsCoverTheBlock) {
  for (DType t : kKQuants) {
    const int64_t K = 256;
    for (uint32_t seed = 0; seed < 20; ++seed) {
      const auto w = make_weight(t, 1, K, 100 + seed);
      const auto ref = dequant(t, w, 1, K);
      std::vector<gpu::U32x4> qs(gpu::quant_qs_bytes(t) / 16 + 1);
      uint32_t hdr = 0;
      gpu::split_block(t, w.data(), reinterpret_cast<uint8_t*>(qs.data()), reinterpret_cast<uint8_t*>(&hdr));
      std::vector<int> seen(K, 0);
      for (int u = 0; u < 8; ++u) {
        const gpu::KUnit ku = gpu::kquant_load_unit(t, reinterpret_cast<const uint8_t*>(qs.data()), hdr, u);
        ASSERT_EQ(ku.g0, ku.e0 / 16);
        ASSERT_EQ(ku.g1, ku.e1 / 16);
        ASSERT_EQ(ku.e0 % 16, 0);
        ASSERT_EQ(ku.e1 % 16, 0);
        for (int run = 0; run < 2; ++run) {
          const int e = run ? ku.e1 : ku.e0;
          const uint32_t* words = run ? ku.hi : ku.lo;
          const int sc = run ? ku.sc1 : ku.sc0, mn = run ? ku.m1 : ku.m0;
          for (int i = 0; i < 16; ++i) {
            const int q = static_cast<int>((words[i / 4] >> (8 * (i % 4))) & 0xFFu);
            ASSERT_LT(q, t == DType::Q4_K ? 16 : t == DType::Q5_K ? 32 : 64);
            const float v = t == DType::Q6_K ? ku.d * static_cast<float>(sc) * static_cast<float>(q - 32)
                                             : ku.d * static_cast<float>(sc) * static_cast<float>(q) -
                                                   ku.dmin * static_cast<float>(mn);
            ASSERT_EQ(v, ref[e + i]) << type_name(static_cast<uint32_t>(t)) << " seed " << seed << " u " << u << " e "
                                     << e + i;
            ++seen[e + i];
          }
        }
      }
      for (int e = 0; e < K; ++e) ASSERT_EQ(seen[e], 1) << e;
    }
  }
}

TEST(GpuLayout, FloatRowsWithPaddedStride) {
  for (DType t : kFloatTypes) {
    const int64_t N = 4, K = 37, stride = gpu::float_row_stride(K);
    EXPECT_EQ(stride, 40);
    const auto w = make_weight(t, N, K, 5);
    const auto ref = dequant(t, w, N, K);
    const int es = gpu::float_elem_bytes(t);
    std::vector<uint8_t> dev(static_cast<size_t>(N * stride * es), 0);
    for (int64_t n = 0; n < N; ++n) std::memcpy(dev.data() + n * stride * es, w.data() + n * K * es, K * es);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) ASSERT_EQ(gpu::float_weight_elem(t, dev.data(), stride, n, k), ref[n * K + k]);
  }
}

TEST(GpuLayout, ActivationQuantizationIsTheCpus) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int trial = 0; trial < 200; ++trial) {
    float x[32];
    for (float& v : x) v = trial == 0 ? 0.0f : normal(rng);
    if (trial == 1) x[7] = 1e30f;
    if (trial == 2) x[3] = -std::numeric_limits<float>::denorm_min();
    for (DType t : kQuantTypes) {
      int8_t qa[32], qb[32];
      gpu::ActScale s;
      float d, sum;
      gpu::quantize_block_host(t, x, qa, &s);
      cpu::detail::quantize_block_q8_scalar(t, x, qb, &d, &sum);
      ASSERT_EQ(std::memcmp(qa, qb, 32), 0) << trial;
      ASSERT_EQ(s.d, d) << trial;
      ASSERT_EQ(s.s, sum) << trial;
    }
  }
}

// Q8_K activations (K-quant weights): the host reference and the device's
// lane pieces (32 emulated lanes + butterfly) against the CPU's
// quantize_row_q8k, bit for bit, including ties of |x| (the first wins),
// zeros, NaN, infinities and huge values.
TEST(GpuLayout, KQuantActivationQuantizationIsTheCpus) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_int_distribution<int> pos(0, 255);
  for (int trial = 0; trial < 300; ++trial) {
    float x[256];
    for (float& v : x) v = trial == 0 ? 0.0f : normal(rng);
    switch (trial % 8) {
      case 1: {  // a tie of |x| with opposite signs: the first one's sign decides d's
        const int a = pos(rng), b = pos(rng);
        x[a] = 50.0f;
        x[b] = -50.0f;
        break;
      }
      case 2: x[pos(rng)] = std::numeric_limits<float>::quiet_NaN(); break;
      case 3: x[pos(rng)] = 1e30f; break;
      case 4: x[pos(rng)] = -std::numeric_limits<float>::infinity(); break;
      case 5:
        for (float& v : x) v = std::round(v);  // many ties
        break;
      case 6:
        for (float& v : x) v = 0.0f;
        x[pos(rng)] = std::numeric_limits<float>::quiet_NaN();  // only a NaN: an all-zero block
        break;
      case 7: x[pos(rng)] = -std::numeric_limits<float>::denorm_min(); break;
      default: break;
    }
    cpu::detail::Q8KBlock cpu_b;
    cpu::detail::quantize_row_q8k(x, 256, &cpu_b);
    int8_t q[256];
    gpu::KActBlock kb;
    gpu::quantize_kblock_host(x, q, &kb);
    ASSERT_EQ(std::memcmp(q, cpu_b.qs, 256), 0) << trial;
    ASSERT_EQ(std::memcmp(&kb.d, &cpu_b.d, 4), 0) << trial << " " << kb.d << " " << cpu_b.d;
    ASSERT_EQ(std::memcmp(kb.bsums, cpu_b.bsums, sizeof(kb.bsums)), 0) << trial;
    // The device's lane pieces.
    gpu::Q8KMax lanes[32];
    for (int l = 0; l < 32; ++l) lanes[l] = gpu::q8k_lane_max(x + 8 * l, l);
    for (int off = 16; off > 0; off >>= 1) {
      gpu::Q8KMax next[32];
      for (int l = 0; l < 32; ++l) next[l] = gpu::q8k_max_combine(lanes[l], lanes[l ^ off]);
      for (int l = 0; l < 32; ++l) lanes[l] = next[l];
    }
    int sums[32];
    float ds[32];
    int8_t qd[256];
    for (int l = 0; l < 32; ++l) {
      ASSERT_EQ(std::memcmp(&lanes[l], &lanes[0], sizeof(gpu::Q8KMax)), 0) << "lanes disagree, trial " << trial;
      uint32_t w[2];
      sums[l] = gpu::q8k_lane_quantize(x + 8 * l, lanes[l].amax, lanes[l].mx, w, &ds[l]);
      std::memcpy(qd + 8 * l, w, 8);
    }
    ASSERT_EQ(std::memcmp(qd, cpu_b.qs, 256), 0) << trial;
    ASSERT_EQ(std::memcmp(&ds[0], &cpu_b.d, 4), 0) << trial;
    for (int g = 0; g < 16; ++g) ASSERT_EQ(static_cast<int16_t>(sums[2 * g] + sums[2 * g + 1]), cpu_b.bsums[g]) << g;
  }
}

TEST(GpuLayout, Dp4aEmulation) {
  EXPECT_EQ(gpu::dp4a(0x01020304, 0x01010101, 5), 1 + 2 + 3 + 4 + 5);
  EXPECT_EQ(gpu::dp4a(static_cast<int>(0xFF80017Fu), static_cast<int>(0x7F7F7F7Fu), 0),
            127 * 127 + 1 * 127 + (-128) * 127 + (-1) * 127);
}

// y = x . W^T with the CPU's decode kernels (scalar variant, decode path forced).
std::vector<float> cpu_decode(DType t, const std::vector<uint8_t>& w, int64_t N, int64_t K, const std::vector<float>& x,
                              int64_t M) {
  cpu::force_isa(cpu::Isa::kScalar);
  cpu::set_decode_max_m(std::numeric_limits<int64_t>::max());
  std::vector<float> y(static_cast<size_t>(M * N));
  cpu::MatmulScratch scratch;
  cpu::matmul(cpu::WeightView{t, N, K, w.data()}, x.data(), M, y.data(), scratch);
  cpu::reset_isa();
  cpu::reset_decode_max_m();
  return y;
}

TEST(GpuLayout, GemvMatchesCpuDecodeAndDoubleReference) {
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K, DType::F16, DType::BF16, DType::F32}) {
    // K-quants: 1 super-block (8 busy lanes), 3, and 17 (lanes with 5 and 4).
    const std::vector<int64_t> ks =
        gpu::is_kquant(t) ? std::vector<int64_t>{256, 768, 4352} : std::vector<int64_t>{32, 96, 256, 1056};
    for (int64_t K : ks) {
      for (int64_t M : {1, 2, 3, 5, 8, 11}) {
        const int64_t N = 7;
        const auto w = make_weight(t, N, K, static_cast<uint32_t>(K * 31 + M));
        const auto x = make_x(M, K, static_cast<uint32_t>(K + M));
        std::vector<float> y(static_cast<size_t>(M * N));
        gpu::reference_gemv(t, w.data(), N, K, x.data(), M, y.data());
        const auto yc = cpu_decode(t, w, N, K, x, M);
        const auto wf = dequant(t, w, N, K);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            double ref = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; ++k) {
              ref += static_cast<double>(wf[n * K + k]) * x[m * K + k];
              mag += std::fabs(static_cast<double>(wf[n * K + k]) * x[m * K + k]);
            }
            const float got = y[m * N + n];
            const std::string where = std::string(type_name(static_cast<uint32_t>(t))) + " K=" + std::to_string(K) +
                                      " M=" + std::to_string(M) + " m=" + std::to_string(m) + " n=" + std::to_string(n);
            // Same integer dots and scales as the CPU: only the f32 summation order differs.
            EXPECT_NEAR(got, yc[m * N + n], 1e-5 * mag + 1e-6) << where;
            // Against exact math: 8-bit activations cost ~1% of the magnitude
            // (row 0 holds a 100x outlier that coarsens its block: CPU check only).
            const double tol = gpu::is_quant(t) ? 0.02 * mag + 1e-4 : 1e-5 * mag + 1e-6;
            if (m > 0 || K < 64 || !gpu::is_quant(t)) {
              EXPECT_NEAR(got, ref, tol) << where;
            }
          }
        }
      }
    }
  }
}

TEST(GpuLayout, GemvRowsDoNotDependOnM) {
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16, DType::BF16,
                  DType::F32}) {
    const int64_t N = 5, K = gpu::is_kquant(t) ? 1280 : 320, M = 11;
    const auto w = make_weight(t, N, K, 77);
    const auto x = make_x(M, K, 78);
    std::vector<float> all(static_cast<size_t>(M * N));
    gpu::reference_gemv(t, w.data(), N, K, x.data(), M, all.data());
    for (int nr : {1, 2, 4, 8}) {
      std::vector<float> forced(static_cast<size_t>(M * N));
      gpu::reference_gemv(t, w.data(), N, K, x.data(), M, forced.data(), nr);
      ASSERT_EQ(std::memcmp(forced.data(), all.data(), all.size() * 4), 0) << "NR " << nr;
    }
    for (int64_t m = 0; m < M; ++m) {
      std::vector<float> one(static_cast<size_t>(N));
      std::vector<float> xr(x.begin() + m * K, x.begin() + (m + 1) * K);
      gpu::reference_gemv(t, w.data(), N, K, xr.data(), 1, one.data());
      ASSERT_EQ(std::memcmp(one.data(), all.data() + m * N, N * 4), 0)
          << type_name(static_cast<uint32_t>(t)) << " row " << m;
    }
  }
}

TEST(GpuLayout, KvOffsetIsTheCpuLayout) {
  // cpu_backend.cpp: layer stride 2 * block_elems * num_blocks; K|V; block;
  // then (kv_head * block_size + slot) * head_dim.
  const int32_t L = 3, nkv = 2, bs = 16, hd = 64, nblocks = 10;
  const int64_t be = static_cast<int64_t>(nkv) * bs * hd;
  for (int32_t l = 0; l < L; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int32_t b : {0, 3, 9})
        for (int32_t h = 0; h < nkv; ++h)
          for (int32_t s : {0, 5, 15}) {
            const int64_t cpu =
                l * 2 * be * nblocks + kv * be * nblocks + b * be + (static_cast<int64_t>(h) * bs + s) * hd;
            ASSERT_EQ(gpu::kv_offset(l, kv, b, h, s, nblocks, nkv, bs, hd), cpu);
          }
}

TEST(GpuLayout, AttentionSplitPlan) {
  for (int64_t items : {1, 8, 24, 300, 4096}) {
    for (int32_t len : {0, 1, 31, 32, 33, 100, 1000, 4096, 32768, 131072}) {
      const gpu::AttnSplit p = gpu::plan_attention_split(items, len, 132);
      const int32_t tiles = (len + gpu::kAttnTile - 1) / gpu::kAttnTile;
      ASSERT_GE(p.n_splits, 1);
      ASSERT_LE(p.n_splits, 32);
      ASSERT_GE(static_cast<int64_t>(p.n_splits) * p.tiles_per_split, tiles) << items << " " << len;
      if (p.n_splits > 1) {
        ASSERT_GE(p.tiles_per_split, 2);
      }
      // Stable inside a power-of-two bucket (CUDA graphs keep their shape).
      if (tiles > 1) {
        int32_t hi = 1;
        while (hi < tiles) hi <<= 1;
        const gpu::AttnSplit q = gpu::plan_attention_split(items, hi * gpu::kAttnTile, 132);
        ASSERT_EQ(q.n_splits, p.n_splits);
        ASSERT_EQ(q.tiles_per_split, p.tiles_per_split);
      }
    }
  }
  // Batch-1 decode over a long cache is split across the GPU.
  EXPECT_GE(gpu::plan_attention_split(8, 8192, 132).n_splits, 16);
  // A big batch is not.
  EXPECT_EQ(gpu::plan_attention_split(4096, 8192, 132).n_splits, 1);
  // Batch-invariant plan: fixed 512-slot splits whatever the batch.
  for (int32_t len : {0, 1, 512, 513, 3000, 131072}) {
    const gpu::AttnSplit p = gpu::plan_attention_split_invariant(len);
    EXPECT_EQ(p.tiles_per_split, gpu::kAttnInvariantSplitTiles);
    EXPECT_EQ(p.n_splits, std::max(1, (len + 511) / 512)) << len;
  }
  EXPECT_EQ(gpu::attn_rows_per_tile(1), 16);
  EXPECT_EQ(gpu::attn_rows_per_tile(3), 5);
  EXPECT_EQ(gpu::attn_rows_per_tile(4), 4);
  EXPECT_EQ(gpu::attn_rows_per_tile(16), 1);
}

}  // namespace
}  // namespace ember
