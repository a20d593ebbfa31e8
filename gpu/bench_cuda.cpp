// bench_cuda: the CUDA backend's numbers for docs/BENCHMARKS.md, measured on
// the machine it runs on:
//   * device read bandwidth (streaming kernel) and copy bandwidth;
//   * prefill tokens/s (one sequence of --prefill tokens);
//   * decode tokens/s for batches of B sequences (each with --ctx tokens of
//     cache), with and without CUDA graphs; for B = 1 the fraction of the
//     read bandwidth reached = weight bytes per token / step time / bandwidth.
// It drives the model's forward pass (its architecture's, core/model/arch/) on the plugin backend
// directly, as the engine does for a step, logits download included.
//
//   bench_cuda --model /tmp/l3-8b-q4_0.gguf --ctx 512 --batches 1,8,32,64
//
// --agree N instead compares the device with the CPU backend on the same
// model: teacher-forced logits over N tokens of --text FILE (or synthetic
// ids) give the top-1 agreement and the mean KL(cpu || device); a greedy
// continuation of --gen tokens from the first 32 is run on both and compared
// token by token (the criteria: top-1 >= 99%, KL <= 0.01, >= 95% of
// greedy tokens equal). Exit status 1 when a criterion fails.
//
// Prints a table and one JSON object (also written to --json PATH).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/plugin.h"
#include "core/backend/registry.h"
#include "core/model/arch/registry.h"
#include "core/model/batch.h"
#include "core/model/model.h"
#include "core/tensor/types.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"

#include <cmath>
#include <fstream>
#include <sstream>

namespace ember::gpu_bench {
double read_bandwidth_gbs(size_t bytes, int iters);
double copy_bandwidth_gbs(size_t bytes, int iters);
}  // namespace ember::gpu_bench

namespace ember {
namespace {

struct Args {
  std::string model, device = "cuda", json;
  int32_t ctx = 512, steps = 64, prefill = 512;
  std::vector<int32_t> batches = {1, 8, 32, 64};
  int graphs = 2;  // 0 off, 1 on, 2 both
  int32_t agree = 0, gen = 64;
  bool invariant = false;  // the engine's batch_invariant (BackendExtras::set_batch_invariant)
  std::string text;
};

[[noreturn]] void usage() {
  std::fprintf(
      stderr,
      "usage: bench_cuda --model PATH [--device cuda[:N]] [--ctx N] [--steps N] [--prefill N]\n"
      "                  [--batches 1,8,32,64] [--graphs on|off|both] [--batch-invariant on|off] [--json PATH]\n"
      "       bench_cuda --model PATH --agree N [--text FILE] [--gen N]\n");
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto v = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (k == "--model")
      a.model = v();
    else if (k == "--device")
      a.device = v();
    else if (k == "--ctx")
      a.ctx = std::atoi(v().c_str());
    else if (k == "--steps")
      a.steps = std::atoi(v().c_str());
    else if (k == "--prefill")
      a.prefill = std::atoi(v().c_str());
    else if (k == "--json")
      a.json = v();
    else if (k == "--agree")
      a.agree = std::atoi(v().c_str());
    else if (k == "--gen")
      a.gen = std::atoi(v().c_str());
    else if (k == "--text")
      a.text = v();
    else if (k == "--batch-invariant")
      a.invariant = v() == "on";
    else if (k == "--graphs") {
      const std::string g = v();
      a.graphs = g == "off" ? 0 : g == "on" ? 1 : 2;
    } else if (k == "--batches") {
      a.batches.clear();
      std::string s = v();
      for (size_t p = 0; p < s.size();) {
        const size_t c = s.find(',', p);
        a.batches.push_back(std::atoi(s.substr(p, c - p).c_str()));
        p = c == std::string::npos ? s.size() : c + 1;
      }
    } else {
      usage();
    }
  }
  if (a.model.empty()) usage();
  return a;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

uint64_t weight_bytes(const WeightDesc& d) { return static_cast<uint64_t>(row_bytes(d.type, d.cols)) * d.rows; }

LoadedBackend open_device(const std::string& device) {
#ifdef EMBER_CUDA_PLUGIN_PATH
  return open_backend_plugin_file(EMBER_CUDA_PLUGIN_PATH, device, 0);
#else
  return open_backend_plugin(device, 0);
#endif
}

// The model's forward pass on `be` (its architecture's, from the registry).
std::unique_ptr<Forward> forward_pass(const std::shared_ptr<const Model>& model, Backend& be, int32_t block_size) {
  const Architecture* arch = find_architecture(model->architecture());
  if (!arch) fail(StatusCode::kUnsupported, "bench_cuda: unsupported architecture " + model->architecture());
  return arch->make_forward(model, be, block_size);
}

// Teacher-forced logits of `toks` (one sequence, every row), in chunks; with
// n_layers < the model's, the logits of the first n_layers layers (the output
// norm and head applied to that residual stream, as self-speculation's exit).
std::vector<float> score(const std::shared_ptr<const Model>& model, Backend& be, const std::vector<int32_t>& toks,
                         int32_t n_layers = 0) {
  const auto& c = model->config();
  const int32_t bs = 16, n = static_cast<int32_t>(toks.size());
  KvGeometry g{c.n_layers, c.n_kv_heads, c.head_dim, bs, (n + bs - 1) / bs + 1};
  be.kv_init(g);
  const std::unique_ptr<Forward> fwd_owner = forward_pass(model, be, bs);
  Forward& fwd = *fwd_owner;
  std::vector<int32_t> table(g.num_blocks);
  for (int32_t i = 0; i < g.num_blocks; ++i) table[i] = g.num_blocks - 1 - i;
  std::vector<float> out(static_cast<size_t>(n) * c.n_vocab);
  const int32_t chunk = 128;
  for (int32_t p = 0; p < n; p += chunk) {
    const int32_t m = std::min(chunk, n - p);
    Batch b;
    b.add_sequence(toks.data() + p, m, p, table, false, true);
    fwd.forward_layers(b, out.data() + static_cast<size_t>(p) * c.n_vocab, n_layers > 0 ? n_layers : c.n_layers);
  }
  return out;
}

// Greedy continuation: prefill `prompt`, then `n` decode steps.
std::vector<int32_t> greedy(const std::shared_ptr<const Model>& model, Backend& be, const std::vector<int32_t>& prompt,
                            int32_t n) {
  const auto& c = model->config();
  const int32_t bs = 16, total = static_cast<int32_t>(prompt.size()) + n + 1;
  KvGeometry g{c.n_layers, c.n_kv_heads, c.head_dim, bs, (total + bs - 1) / bs + 1};
  be.kv_init(g);
  const std::unique_ptr<Forward> fwd_owner = forward_pass(model, be, bs);
  Forward& fwd = *fwd_owner;
  std::vector<int32_t> table(g.num_blocks);
  for (int32_t i = 0; i < g.num_blocks; ++i) table[i] = i;
  std::vector<float> l(c.n_vocab);
  Batch b;
  b.add_sequence(prompt.data(), static_cast<int32_t>(prompt.size()), 0, table, true);
  fwd.forward(b, l.data());
  std::vector<int32_t> out;
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(t);
    Batch d;
    d.add_sequence(&t, 1, pos++, table, true);
    fwd.forward(d, l.data());
  }
  return out;
}

// Two sets of logits for the same rows: the fraction of rows with the same
// argmax, the mean KL(p || q), the largest |p - q| and the largest |p|.
struct LogitsAgreement {
  double top1 = 0, mean_kl = 0, max_diff = 0, max_abs = 0;
};
LogitsAgreement compare_logits(const std::vector<float>& lp_all, const std::vector<float>& lq_all, size_t rows,
                               int32_t V) {
  LogitsAgreement out;
  size_t top1 = 0;
  double kl_sum = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* p = lp_all.data() + r * V;
    const float* q = lq_all.data() + r * V;
    top1 += (std::max_element(p, p + V) - p) == (std::max_element(q, q + V) - q);
    const double mp = *std::max_element(p, p + V), mq = *std::max_element(q, q + V);
    double zp = 0, zq = 0;
    for (int32_t i = 0; i < V; ++i) {
      zp += std::exp(p[i] - mp);
      zq += std::exp(q[i] - mq);
      out.max_diff = std::max(out.max_diff, static_cast<double>(std::fabs(p[i] - q[i])));
      out.max_abs = std::max(out.max_abs, static_cast<double>(std::fabs(p[i])));
    }
    for (int32_t i = 0; i < V; ++i) {
      const double lp = p[i] - mp - std::log(zp), lq = q[i] - mq - std::log(zq);
      kl_sum += std::exp(lp) * (lp - lq);
    }
  }
  out.top1 = static_cast<double>(top1) / rows;
  out.mean_kl = kl_sum / rows;
  return out;
}

int run_agree(const Args& a) {
  std::shared_ptr<const Model> model = Model::load(a.model);
  const auto& c = model->config();
  std::vector<int32_t> toks;
  if (!a.text.empty()) {
    std::ifstream in(a.text, std::ios::binary);
    if (!in) fail(StatusCode::kNotFound, "cannot read " + a.text);
    std::stringstream ss;
    ss << in.rdbuf();
    toks = model->tokenizer().encode(ss.str(), false, false);
  } else {
    for (int32_t i = 0; i < a.agree; ++i) toks.push_back((i * 7919 + 13) % c.n_vocab);
  }
  if (static_cast<int32_t>(toks.size()) > a.agree) toks.resize(a.agree);
  if (toks.size() < 40) fail(StatusCode::kInvalidArgument, "--agree needs at least 40 tokens");
  // The CPU backend from the registry (one backend never includes another).
  CreatedBackend created_cpu = create_backend("cpu", BackendOptions{});
  if (created_cpu.device != "cpu") {
    fail(StatusCode::kInvalidArgument, "--agree compares with the CPU backend: unset EMBER_FORCE_DEVICE");
  }
  const std::unique_ptr<Backend>& cpu = created_cpu.backend;
  LoadedBackend dev = open_device(a.device);
  std::printf("agreement: %s vs %s on %s, %zu tokens\n", dev.backend->name().c_str(), cpu->name().c_str(),
              model->name().c_str(), toks.size());
  const auto lc = score(model, *cpu, toks);
  const auto ld = score(model, *dev.backend, toks);
  const int32_t V = c.n_vocab;
  const LogitsAgreement all = compare_logits(lc, ld, toks.size(), V);
  const double top1_frac = all.top1, mean_kl = all.mean_kl, max_diff = all.max_diff;
  const std::vector<int32_t> prompt(toks.begin(), toks.begin() + 32);
  const auto gc = greedy(model, *cpu, prompt, a.gen);
  const auto gd = greedy(model, *dev.backend, prompt, a.gen);
  size_t same = 0, first_diff = gc.size();
  for (size_t i = 0; i < gc.size(); ++i) {
    if (gc[i] == gd[i])
      ++same;
    else if (first_diff == gc.size())
      first_diff = i;
  }
  const double greedy_frac = static_cast<double>(same) / gc.size();
  // Where the two part: the same comparison after the first L layers (64 tokens).
  const std::vector<int32_t> head(toks.begin(), toks.begin() + std::min<size_t>(64, toks.size()));
  std::printf("by depth (first %zu tokens; logits of the first L layers):\n%8s %14s %12s %8s\n", head.size(), "layers",
              "max|diff|/max", "mean KL", "top-1");
  for (int32_t L = 1;; L = std::min(L * 2, c.n_layers)) {
    const LogitsAgreement d =
        compare_logits(score(model, *cpu, head, L), score(model, *dev.backend, head, L), head.size(), V);
    std::printf("%8d %14.5f %12.6f %7.1f%%\n", L, d.max_abs > 0 ? d.max_diff / d.max_abs : 0.0, d.mean_kl,
                100.0 * d.top1);
    if (L == c.n_layers) break;
  }
  std::printf("teacher-forced: top-1 agreement %.2f%%, mean KL %.5f, max |logit diff| %.4g\n", 100 * top1_frac, mean_kl,
              max_diff);
  std::printf("greedy: %zu/%zu tokens equal (first difference at %zu)\n", same, gc.size(), first_diff);
  const bool ok = top1_frac >= 0.99 && mean_kl <= 0.01 && greedy_frac >= 0.95;
  std::printf(
      "{\"device\":\"%s\",\"model\":\"%s\",\"tokens\":%zu,\"top1\":%.6f,\"mean_kl\":%.6g,"
      "\"greedy_equal\":%.6f,\"pass\":%s}\n",
      dev.backend->name().c_str(), model->name().c_str(), toks.size(), top1_frac, mean_kl, greedy_frac,
      ok ? "true" : "false");
  return ok ? 0 : 1;
}

int run(const Args& a) {
  if (a.agree > 0) return run_agree(a);
  const double read_bw = gpu_bench::read_bandwidth_gbs(size_t{2} << 30, 10);
  const double copy_bw = gpu_bench::copy_bandwidth_gbs(size_t{1} << 30, 10);
  std::shared_ptr<const Model> model = Model::load(a.model);
  const auto& c = model->config();
#ifdef EMBER_CUDA_PLUGIN_PATH
  LoadedBackend lb = open_backend_plugin_file(EMBER_CUDA_PLUGIN_PATH, a.device, 0);
#else
  LoadedBackend lb = open_backend_plugin(a.device, 0);
#endif
  Backend& be = *lb.backend;
  BackendExtras* ex = lb.extras;
  if (ex) ex->set_batch_invariant(a.invariant);

  // Bytes a decode token reads: every matmul weight once (+ norms, one embedding row).
  uint64_t wbytes = weight_bytes(model->output()) + weight_bytes(model->output_norm());
  for (const auto& l : model->layers()) {
    for (const WeightDesc* d : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.attn_norm, &l.ffn_norm}) {
      wbytes += weight_bytes(*d);
    }
  }
  const uint64_t kv_bytes_per_token = static_cast<uint64_t>(c.n_layers) * 2 * c.n_kv_heads * c.head_dim * 2;

  const int32_t bs = 16;
  const int32_t max_b = *std::max_element(a.batches.begin(), a.batches.end());
  const int32_t per_seq = std::max(a.ctx + a.steps * 2 + 8, a.prefill + 8);
  const int32_t blocks_per_seq = (per_seq + bs - 1) / bs;
  KvGeometry g;
  g.num_layers = c.n_layers;
  g.num_kv_heads = c.n_kv_heads;
  g.head_dim = c.head_dim;
  g.block_size = bs;
  g.num_blocks = blocks_per_seq * std::max(max_b, 1);
  be.kv_init(g);
  const std::unique_ptr<Forward> fwd_owner = forward_pass(model, be, bs);
  Forward& fwd = *fwd_owner;
  auto table = [&](int32_t s) {
    std::vector<int32_t> t(blocks_per_seq);
    for (int32_t i = 0; i < blocks_per_seq; ++i) t[i] = s * blocks_per_seq + i;
    return t;
  };

  std::printf("device: %s (%s)\nmodel: %s, %d layers, embd %d, vocab %d; %.1f MiB of weights read per decode token\n",
              be.name().c_str(), lb.build_info.c_str(), model->name().c_str(), c.n_layers, c.n_embd, c.n_vocab,
              static_cast<double>(wbytes) / (1 << 20));
  std::printf("bandwidth: read %.0f GB/s, device copy %.0f GB/s; batch_invariant %s\n", read_bw, copy_bw,
              a.invariant ? "on" : "off");

  // Prefill.
  std::vector<float> logits(static_cast<size_t>(c.n_vocab) * std::max(max_b, 1));
  double prefill_tps = 0;
  if (a.prefill > 0) {
    std::vector<int32_t> toks(a.prefill);
    for (int32_t i = 0; i < a.prefill; ++i) toks[i] = (i * 7919 + 13) % c.n_vocab;
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      Batch b;
      b.add_sequence(toks.data(), a.prefill, 0, table(0), true);
      const double t0 = now_s();
      fwd.forward(b, logits.data());
      best = std::min(best, now_s() - t0);
    }
    prefill_tps = a.prefill / best;
    std::printf("prefill: %d tokens in %.2f ms = %.0f tokens/s\n", a.prefill, best * 1e3, prefill_tps);
  }

  std::string json = "{\"device\":\"" + be.name() + "\",\"model\":\"" + model->name() +
                     "\",\"read_bw_gbs\":" + std::to_string(read_bw) + ",\"copy_bw_gbs\":" + std::to_string(copy_bw) +
                     ",\"weight_bytes_per_token\":" + std::to_string(wbytes) + ",\"ctx\":" + std::to_string(a.ctx) +
                     ",\"batch_invariant\":" + (a.invariant ? "true" : "false") +
                     ",\"prefill_tokens\":" + std::to_string(a.prefill) +
                     ",\"prefill_tps\":" + std::to_string(prefill_tps) + ",\"decode\":[";
  std::printf("\n%6s %7s %10s %12s %10s %14s\n", "batch", "graphs", "ms/step", "tokens/s", "weights", "weights+KV");
  bool first = true;
  for (int32_t B : a.batches) {
    for (int graphs : {0, 1}) {
      if ((a.graphs == 0 && graphs) || (a.graphs == 1 && !graphs)) continue;
      if (graphs && !ex) continue;
      int32_t n_past = a.ctx;
      auto step = [&]() {
        Batch b;
        for (int32_t s = 0; s < B; ++s) {
          const int32_t tok = (s * 31 + n_past) % c.n_vocab;
          b.add_sequence(&tok, 1, n_past, table(s), true);
        }
        if (graphs) ex->graph_begin(static_cast<uint64_t>(B));  // the logits download ends the region
        fwd.forward(b, logits.data());
        ++n_past;
      };
      for (int i = 0; i < 3; ++i) step();
      const double t0 = now_s();
      for (int i = 0; i < a.steps; ++i) step();
      const double dt = (now_s() - t0) / a.steps;
      const double tps = B / dt;
      // Fraction of the read bandwidth: each step reads the weights once and
      // every sequence's cache.
      const double w_frac = static_cast<double>(wbytes) / dt / (read_bw * 1e9);
      const double kv = static_cast<double>(kv_bytes_per_token) * (a.ctx + a.steps / 2.0) * B;
      const double all_frac = (static_cast<double>(wbytes) + kv) / dt / (read_bw * 1e9);
      std::printf("%6d %7s %10.3f %12.1f %9.1f%% %13.1f%%\n", B, graphs ? "on" : "off", dt * 1e3, tps, 100 * w_frac,
                  100 * all_frac);
      json += std::string(first ? "" : ",") + "{\"batch\":" + std::to_string(B) +
              ",\"graphs\":" + (graphs ? "true" : "false") + ",\"ms_per_step\":" + std::to_string(dt * 1e3) +
              ",\"tokens_per_s\":" + std::to_string(tps) + ",\"weight_bw_fraction\":" + std::to_string(w_frac) +
              ",\"weight_kv_bw_fraction\":" + std::to_string(all_frac) + "}";
      first = false;
    }
  }
  json += "]";
  if (ex) {
    const GraphStats st = ex->graph_stats();
    json += ",\"graph_captures\":" + std::to_string(st.captures) + ",\"graph_updates\":" + std::to_string(st.updates) +
            ",\"graph_replays\":" + std::to_string(st.replays);
  }
  json += "}";
  std::printf("\n%s\n", json.c_str());
  if (!a.json.empty()) {
    if (FILE* f = std::fopen(a.json.c_str(), "w")) {
      std::fprintf(f, "%s\n", json.c_str());
      std::fclose(f);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ember

int main(int argc, char** argv) {
  try {
    return ember::run(ember::parse(argc, argv));
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
}
