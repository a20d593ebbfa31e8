// How a window/sink cache gives kept tokens new positions: the two designs
// measured on the SmolLM2-135M cache geometry (30 layers, 3 KV heads of 64,
// 9 query heads, blocks of 16), one thread, process CPU time.
//
//   (a) keys stored before RoPE, rotated by their cache position inside
//       attention, every step, for every key read (the StreamingLLM
//       reference does this in PyTorch);
//   (b) keys stored rotated (as every session stores them today), re-rotated
//       in place by the shift when a block is evicted: llama.cpp's K-shift,
//       once per kv_block_size tokens (what Ember does).
//
// Prints per decode token: attention over the cache without rotation (what
// (b) pays every token), with rotation at read time (what (a) pays every
// token, on every session since the cache format is shared through the
// prefix cache), the K-shift of the whole window (what (b) pays per
// eviction) and its amortised share; and the accuracy of repeated K-shifts
// against a direct rotation (f16 rounding).
//
//   bench_kshift [--window 1020] [--sinks 4] [--reps 200]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "bench/bench_util.h"
#include "cpu/cpu_backend.h"

using namespace ember;
using ember::bench::arg_int;
using ember::bench::cpu_now;

namespace {

constexpr int kLayers = 30, kKvHeads = 3, kHeads = 9, kHd = 64, kBs = 16;
constexpr float kBase = 100000.0f;  // SmolLM2's rope_freq_base

// Keys/values of one layer for `n` tokens in blocks of kBs, f16, layout
// [block][kv head][slot][dim] as the CPU backend's pool.
struct Cache {
  int32_t n = 0, blocks = 0;
  std::vector<uint16_t> k, v;  // [layer][block][head][slot][dim]
  size_t block_elems() const { return static_cast<size_t>(kKvHeads) * kBs * kHd; }
  const uint16_t* kb(int l, int b, int h) const {
    return k.data() + ((static_cast<size_t>(l) * blocks + b) * kKvHeads + h) * kBs * kHd;
  }
  const uint16_t* vb(int l, int b, int h) const {
    return v.data() + ((static_cast<size_t>(l) * blocks + b) * kKvHeads + h) * kBs * kHd;
  }
};

inline float dot8(const float* q, const float* k) {
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < kHd; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), acc);
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}

// One query row, one layer, flash-style (online softmax per block), the same
// structure as the CPU backend. With `rotate`, each key is converted and
// rotated by its cache position (cos/sin tables, pairs interleaved) before
// the dot products: design (a).
template <bool rotate>
void attend(const Cache& c, int layer, const float* q, const float* cosd, const float* sind, float* out) {
  constexpr int group = kHeads / kKvHeads;
  for (int h = 0; h < kKvHeads; ++h) {
    float m[group], l[group];
    alignas(32) float acc[group][kHd];
    for (int g = 0; g < group; ++g) {
      m[g] = -INFINITY;
      l[g] = 0;
      std::fill(acc[g], acc[g] + kHd, 0.0f);
    }
    alignas(32) float kf[kHd], vf[kHd];
    float scores[group][kBs];
    for (int b = 0; b * kBs < c.n; ++b) {
      const int n = std::min(kBs, c.n - b * kBs);
      const uint16_t* kb = c.kb(layer, b, h);
      const uint16_t* vb = c.vb(layer, b, h);
      float bmax[group];
      for (int g = 0; g < group; ++g) bmax[g] = -INFINITY;
      for (int t = 0; t < n; ++t) {
        for (int i = 0; i < kHd; i += 8) {
          _mm256_store_ps(kf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kb + t * kHd + i))));
        }
        if constexpr (rotate) {
          const int pos = b * kBs + t;
          const float* cs = cosd + static_cast<size_t>(pos) * kHd;
          const float* sn = sind + static_cast<size_t>(pos) * kHd;
          for (int i = 0; i < kHd; i += 8) {
            const __m256 x = _mm256_load_ps(kf + i);
            const __m256 sw = _mm256_permute_ps(x, 0xB1);  // (x1, x0) pairs
            _mm256_store_ps(kf + i,
                            _mm256_fmadd_ps(sw, _mm256_loadu_ps(sn + i), _mm256_mul_ps(x, _mm256_loadu_ps(cs + i))));
          }
        }
        for (int g = 0; g < group; ++g) {
          scores[g][t] = dot8(q + (h * group + g) * kHd, kf) * 0.125f;
          bmax[g] = std::max(bmax[g], scores[g][t]);
        }
      }
      for (int g = 0; g < group; ++g) {
        const float nm = std::max(m[g], bmax[g]);
        const float corr = std::exp(m[g] - nm);
        l[g] *= corr;
        for (int i = 0; i < kHd; ++i) acc[g][i] *= corr;
        m[g] = nm;
      }
      for (int t = 0; t < n; ++t) {
        for (int i = 0; i < kHd; i += 8) {
          _mm256_store_ps(vf + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vb + t * kHd + i))));
        }
        for (int g = 0; g < group; ++g) {
          const float w = std::exp(scores[g][t] - m[g]);
          l[g] += w;
          const __m256 wv = _mm256_set1_ps(w);
          for (int i = 0; i < kHd; i += 8) {
            _mm256_store_ps(acc[g] + i, _mm256_fmadd_ps(wv, _mm256_load_ps(vf + i), _mm256_load_ps(acc[g] + i)));
          }
        }
      }
    }
    for (int g = 0; g < group; ++g) {
      for (int i = 0; i < kHd; ++i) out[(h * group + g) * kHd + i] = acc[g][i] / l[g];
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int window = arg_int(argc, argv, "--window", 1020);
  const int sinks = arg_int(argc, argv, "--sinks", 4);
  const int reps = arg_int(argc, argv, "--reps", 200);
  omp_set_num_threads(1);
  const int n = sinks + window;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Cache c;
  c.n = n;
  c.blocks = (n + kBs - 1) / kBs;
  c.k.resize(static_cast<size_t>(kLayers) * c.blocks * c.block_elems());
  c.v.resize(c.k.size());
  for (auto& x : c.k) x = _cvtss_sh(nd(rng), 0);
  for (auto& x : c.v) x = _cvtss_sh(nd(rng), 0);
  // cos/sin per position, each value duplicated for its pair; sin signed
  // (-s, +s) so that out = x * cos + swap(x) * sin.
  std::vector<float> cosd(static_cast<size_t>(n) * kHd), sind(cosd.size());
  for (int p = 0; p < n; ++p) {
    for (int i = 0; i < kHd / 2; ++i) {
      const double th = p * std::pow(static_cast<double>(kBase), -2.0 * i / kHd);
      cosd[static_cast<size_t>(p) * kHd + 2 * i] = cosd[static_cast<size_t>(p) * kHd + 2 * i + 1] =
          static_cast<float>(std::cos(th));
      sind[static_cast<size_t>(p) * kHd + 2 * i] = static_cast<float>(-std::sin(th));
      sind[static_cast<size_t>(p) * kHd + 2 * i + 1] = static_cast<float>(std::sin(th));
    }
  }
  std::vector<float> q(kHeads * kHd), out(q.size());
  for (auto& x : q) x = nd(rng);
  auto time_attention = [&](bool rotate) {
    double best = 1e9;
    for (int r = 0; r < 5; ++r) {
      const double t0 = cpu_now();
      for (int i = 0; i < reps; ++i) {
        for (int l = 0; l < kLayers; ++l) {
          if (rotate)
            attend<true>(c, l, q.data(), cosd.data(), sind.data(), out.data());
          else
            attend<false>(c, l, q.data(), cosd.data(), sind.data(), out.data());
        }
      }
      best = std::min(best, (cpu_now() - t0) / reps);
    }
    return best * 1e6;  // us per token (all layers)
  };
  const double plain_us = time_attention(false);
  const double rotate_us = time_attention(true);

  // The engine's own attention kernel and K-shift (CPU backend).
  KvGeometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kKvHeads;
  g.head_dim = kHd;
  g.block_size = kBs;
  g.num_blocks = c.blocks + 1;
  auto backend = make_cpu_backend(1);
  backend->kv_init(g);
  std::vector<int32_t> table(c.blocks);
  for (int b = 0; b < c.blocks; ++b) table[b] = b;
  AttentionSeq seq{0, 1, table.data(), c.blocks};
  const int32_t kv_len = n;
  AttentionParams ap;
  ap.num_heads = kHeads;
  ap.num_kv_heads = kKvHeads;
  ap.head_dim = kHd;
  ap.scale = 0.125f;
  ap.kv_len = &kv_len;
  double engine_us = 1e9;
  for (int r = 0; r < 5; ++r) {
    const double t0 = cpu_now();
    for (int i = 0; i < reps; ++i) {
      for (int l = 0; l < kLayers; ++l) backend->attention(l, q.data(), &seq, 1, ap, out.data());
    }
    engine_us = std::min(engine_us, (cpu_now() - t0) / reps * 1e6);
  }
  // K-shift of the window's blocks (everything after the sinks' block).
  std::vector<int32_t> window_blocks(table.begin() + 1, table.end());
  double shift_us = 1e9;
  for (int r = 0; r < 5; ++r) {
    const double t0 = cpu_now();
    for (int i = 0; i < 20; ++i) {
      backend->kv_rope_shift(window_blocks.data(), static_cast<int32_t>(window_blocks.size()), -kBs, kHd, kBase);
    }
    shift_us = std::min(shift_us, (cpu_now() - t0) / 20 * 1e6);
  }

  // Accuracy of repeated K-shifts: keys rotated to position p and stored,
  // shifted k times by -16, against keys rotated to p - 16k directly.
  auto shift_error = [&](int shifts) {
    KvGeometry g1 = g;
    g1.num_layers = 1;
    g1.num_blocks = 2;
    auto be = make_cpu_backend(1);
    be->kv_init(g1);
    const int rows = kBs;
    std::vector<float> raw(static_cast<size_t>(rows) * kKvHeads * kHd), k1, vz(raw.size(), 0.0f);
    for (auto& x : raw) x = nd(rng);
    auto store = [&](int block, int pos0) {
      k1 = raw;
      std::vector<int32_t> pos(rows), slots(rows);
      for (int r = 0; r < rows; ++r) {
        pos[r] = pos0 + r;
        slots[r] = block * kBs + r;
      }
      be->rope(k1.data(), pos.data(), rows, kKvHeads, kHd, kHd, kBase);
      be->kv_store(0, k1.data(), vz.data(), slots.data(), rows);
    };
    const int start = sinks + window;
    store(0, start);
    const int32_t b0 = 0;
    for (int s = 0; s < shifts; ++s) be->kv_rope_shift(&b0, 1, -kBs, kHd, kBase);
    store(1, start - kBs * shifts);
    std::vector<uint16_t> a(g1.bytes_per_block() / 2), d(a.size());
    be->kv_read_block(0, a.data());
    be->kv_read_block(1, d.data());
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < static_cast<size_t>(kKvHeads) * kBs * kHd; ++i) {
      const double x = _cvtsh_ss(a[i]), y = _cvtsh_ss(d[i]);
      num += (x - y) * (x - y);
      den += y * y;
      mx = std::max(mx, std::fabs(x - y));
    }
    return std::make_pair(std::sqrt(num / den), mx);
  };
  const auto e1 = shift_error(1);
  const int life = (window + kBs - 1) / kBs;  // shifts a key lives through in the window
  const auto eN = shift_error(life);

  std::printf(
      "geometry: %d layers, %d KV heads x %d, %d query heads, block %d; cache %d tokens (S=%d, W=%d); 1 thread, CPU "
      "time\n",
      kLayers, kKvHeads, kHd, kHeads, kBs, n, sinks, window);
  std::printf("%-58s %10s\n", "per decode token (all layers)", "us");
  std::printf("%-58s %10.1f\n", "attention, keys stored rotated (b: every token)", plain_us);
  std::printf("%-58s %10.1f\n", "attention, keys rotated at read time (a: every token)", rotate_us);
  std::printf("%-58s %10.1f\n", "engine attention kernel (CPU backend), for reference", engine_us);
  std::printf("%-58s %10.1f\n", "K-shift of the window by one block (b: per eviction)", shift_us);
  std::printf("%-58s %10.1f\n", "K-shift amortised over the block's tokens (b)", shift_us / kBs);
  std::printf("extra cost per token: (a) %+.1f us (%+.0f%% of attention), (b) %+.1f us (%+.1f%%)\n",
              rotate_us - plain_us, 100.0 * (rotate_us - plain_us) / plain_us, shift_us / kBs,
              100.0 * shift_us / kBs / plain_us);
  std::printf(
      "K-shift accuracy vs direct rotation (f16 keys): 1 shift rel RMS %.2e (max abs %.2e); %d shifts (a key's life in "
      "W=%d) rel RMS %.2e (max abs %.2e)\n",
      e1.first, e1.second, life, window, eN.first, eN.second);
  std::printf(
      "{\"plain_us\": %.2f, \"rotate_at_read_us\": %.2f, \"engine_attention_us\": %.2f, \"kshift_us\": %.2f, "
      "\"kshift_amortised_us\": %.2f, \"kshift_rel_rms_1\": %.3e, \"kshift_rel_rms_life\": %.3e}\n",
      plain_us, rotate_us, engine_us, shift_us, shift_us / kBs, e1.first, eN.first);
  return 0;
}
