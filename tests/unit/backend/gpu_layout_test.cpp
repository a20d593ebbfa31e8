// The CUDA kernels' shared code (gpu/layout.h) run on the host: device weight
// layouts against the reference dequantizers, the activation quantization
// against the CPU's, the GEMV lane arithmetic (gpu::reference_gemv, which the
// device must reproduce bit for bit) against the CPU decode kernels and a
// double-precision reference, the rows_are_decodes property (a row's bits do
// not depend on M), the KV pool layout and the split-K plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/tensor/types.h"
#include "cpu/matmul.h"
#include "cpu/matmul_internal.h"
#include "gpu/layout.h"

namespace ember {
namespace {

constexpr DType kQuantTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q5_1};
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
    const int64_t N = 3, K = 96, nb = K / 32;
    const auto w = make_weight(t, N, K, 11);
    const auto ref = dequant(t, w, N, K);
    std::vector<uint8_t> qs(static_cast<size_t>(N * nb) * gpu::quant_qs_bytes(t));
    std::vector<uint32_t> sc(static_cast<size_t>(N * nb));
    for (int64_t b = 0; b < N * nb; ++b) {
      gpu::split_block(t, w.data() + b * gpu::gguf_block_bytes(t), qs.data() + b * gpu::quant_qs_bytes(t),
                       reinterpret_cast<uint8_t*>(sc.data()) + b * gpu::quant_header_bytes(t));
    }
    EXPECT_EQ(static_cast<size_t>(gpu::gguf_block_bytes(t)), type_traits(t)->type_size);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t gb = n * nb + k / 32;
        const float v =
            gpu::dequant_elem(t, qs.data() + gb * gpu::quant_qs_bytes(t),
                              gpu::load_header(t, reinterpret_cast<uint8_t*>(sc.data()), gb), static_cast<int>(k % 32));
        ASSERT_EQ(v, ref[n * K + k]) << type_name(static_cast<uint32_t>(t)) << " n=" << n << " k=" << k;
      }
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
  for (DType t :
       {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q5_0, DType::Q5_1, DType::F16, DType::BF16, DType::F32}) {
    for (int64_t K : {32, 96, 256, 1056}) {
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
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::F16, DType::BF16, DType::F32}) {
    const int64_t N = 5, K = 320, M = 11;
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
