// The CPU backend's attention over an f16 cache and over a Q8_0 cache
// (KvGeometry::dtype), same shapes, one thread, process CPU time: per decode
// token (all layers, one query row over the whole cache, the one-token
// order) and per prompt row (a chunk of new rows over the cache, the
// batched order), and the cache's bytes per token.
//
//   bench_kv_dtype [--ctx 4096] [--chunk 64] [--reps 20]
//                  [--layers 30 --kv-heads 3 --heads 9 --head-dim 64]   (SmolLM2-135M)
//   Gemma 3 270M: --layers 18 --kv-heads 1 --heads 4 --head-dim 256
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "bench/bench_util.h"
#include "core/backend/backend.h"
#include "cpu/cpu_backend.h"

using namespace ember;
using ember::bench::arg_int;
using ember::bench::cpu_now;

namespace {

struct Result {
  double decode_us = 0, prompt_row_us = 0;
  size_t bytes_per_token = 0;
};

Result run(DType dtype, int layers, int kv_heads, int heads, int hd, int ctx, int chunk, int reps) {
  constexpr int kBs = 16;
  const int n = ctx + chunk;
  const int blocks = (n + kBs - 1) / kBs;
  KvGeometry g;
  g.num_layers = layers;
  g.num_kv_heads = kv_heads;
  g.head_dim = hd;
  g.block_size = kBs;
  g.num_blocks = blocks;
  g.dtype = dtype;
  auto backend = make_cpu_backend(1);
  backend->kv_init(g);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int32_t> table(blocks), slots(n);
  for (int b = 0; b < blocks; ++b) table[b] = b;
  for (int t = 0; t < n; ++t) slots[t] = t;
  std::vector<float> k(static_cast<size_t>(n) * kv_heads * hd), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (int l = 0; l < layers; ++l) backend->kv_store(l, k.data(), v.data(), slots.data(), n);
  std::vector<float> q(static_cast<size_t>(chunk) * heads * hd), out(q.size());
  for (auto& x : q) x = nd(rng);
  AttentionParams ap;
  ap.num_heads = heads;
  ap.num_kv_heads = kv_heads;
  ap.head_dim = hd;
  ap.scale = 0.125f;
  Result r;
  r.bytes_per_token = g.bytes_per_block() / kBs;
  // Decode: one generated token over ctx cached ones.
  {
    const int32_t kv_len = ctx + 1;
    const uint8_t dec = 1;
    ap.kv_len = &kv_len;
    ap.decode_rows = &dec;
    AttentionSeq seq{0, 1, table.data(), blocks};
    double best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = cpu_now();
      for (int i = 0; i < reps; ++i)
        for (int l = 0; l < layers; ++l) backend->attention(l, q.data(), &seq, 1, ap, out.data());
      best = std::min(best, (cpu_now() - t0) / reps);
    }
    r.decode_us = best * 1e6;
  }
  // A prompt chunk: `chunk` rows after ctx cached tokens.
  {
    std::vector<int32_t> kv_len(chunk);
    std::vector<uint8_t> dec(chunk, 0);
    for (int i = 0; i < chunk; ++i) kv_len[i] = ctx + i + 1;
    ap.kv_len = kv_len.data();
    ap.decode_rows = dec.data();
    AttentionSeq seq{0, chunk, table.data(), blocks};
    double best = 1e9;
    const int creps = std::max(1, reps / 4);
    for (int rep = 0; rep < 3; ++rep) {
      const double t0 = cpu_now();
      for (int i = 0; i < creps; ++i)
        for (int l = 0; l < layers; ++l) backend->attention(l, q.data(), &seq, 1, ap, out.data());
      best = std::min(best, (cpu_now() - t0) / creps);
    }
    r.prompt_row_us = best * 1e6 / chunk;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int ctx = arg_int(argc, argv, "--ctx", 4096), chunk = arg_int(argc, argv, "--chunk", 64);
  const int reps = arg_int(argc, argv, "--reps", 20);
  const int layers = arg_int(argc, argv, "--layers", 30), kv_heads = arg_int(argc, argv, "--kv-heads", 3);
  const int heads = arg_int(argc, argv, "--heads", 9), hd = arg_int(argc, argv, "--head-dim", 64);
  omp_set_num_threads(1);
  std::printf("attention, %d layers, %d/%d heads of %d, cache of %d tokens, chunk %d, 1 thread (CPU time)\n", layers,
              heads, kv_heads, hd, ctx, chunk);
  std::printf("%-6s %16s %18s %22s\n", "cache", "bytes/token", "decode us/token", "prompt us/row");
  const Result f = run(DType::F16, layers, kv_heads, heads, hd, ctx, chunk, reps);
  const Result q = run(DType::Q8_0, layers, kv_heads, heads, hd, ctx, chunk, reps);
  std::printf("%-6s %16zu %18.1f %22.1f\n", "f16", f.bytes_per_token, f.decode_us, f.prompt_row_us);
  std::printf("%-6s %16zu %18.1f %22.1f\n", "q8_0", q.bytes_per_token, q.decode_us, q.prompt_row_us);
  std::printf("q8_0 / f16: bytes %.3f, decode %.2fx the time, prompt rows %.2fx the time\n",
              static_cast<double>(q.bytes_per_token) / f.bytes_per_token, q.decode_us / f.decode_us,
              q.prompt_row_us / f.prompt_row_us);
  return 0;
}
