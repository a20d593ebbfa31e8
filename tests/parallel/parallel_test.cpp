// A model split across MPI ranks (issue 31) against the same model on one
// rank, through the public C ABI only. Every rank runs this program:
//   mpirun -np N parallel_test --model M (--tp N | --pp N) [checks]
// Rank 0 runs --prompts greedy streams at once on the split engine and on an
// engine of its own that is not split, compares the tokens, scores a text on
// both (perplexity), and prints one line per figure; ranks > 0 follow. Each
// rank prints its resident memory once the model is loaded and its engine
// built. Checks (exit 1 when one fails):
//   --identical          every token equal and the perplexity bit for bit
//   --min-agreement F    the fraction of tokens equal before each stream's
//                        first difference, over all streams, at least F
//   --max-ppl-rel F      |ppl_split / ppl_one - 1| at most F plus 3 standard
//                        errors of the mean per-token log-probability
//                        difference (not bit-identical rows differ by chance
//                        token by token; a systematic loss is what fails)
//   --min-top1 F         the scored text's first 256 rows: the same top-1
//                        token on at least a fraction F
//   --score-file PATH    score this text (windows of 256 tokens; at most
//                        --score-tokens) instead of a paragraph of its own
//   --expect-error TEXT  creating the split engine must fail with TEXT in its
//                        message (on every rank)
// --tp-allreduce: Megatron's all-reduce split instead of the exact one.
// --comm mpi|nccl, --device cpu|cuda: the split engine's communicator and
// device (the engine on one rank runs on the same device).
// --no-score: rank 0 runs the split engine's streams only (memory figures).
// With --tp 1 --pp 1 (no mpirun) it only runs the streams and prints its peak
// resident memory: the baseline of the per-rank figures.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "ember/ember.h"

namespace {

const char* const kPrompts[] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In 1969, the first humans to walk on the Moon were",
    "A good recipe for pancakes needs",
    "The quick brown fox",
    "To install a Python package, you run",
    "The largest planet in our solar system is",
    "My favourite book is about a dragon who",
    "SELECT name FROM users WHERE",
    "The speed of light in vacuum is about",
    "Photosynthesis is the process by which",
    "Dear hiring manager, I am writing to apply for",
    "The tavern keeper looked at the travellers and said",
    "1, 1, 2, 3, 5, 8,",
    "The main causes of the French Revolution were",
    "To make a cup of tea, first",
    "Rust and C++ differ in how they manage",
    "The weather forecast for tomorrow says",
    "An embedded inference engine must never",
    "The mitochondria is known as",
    "Once the spaceship landed on Mars, the crew",
};
constexpr int kNumPrompts = sizeof(kPrompts) / sizeof(kPrompts[0]);

const char* const kScoreText =
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable "
    "metal type, oil-based ink and a wooden press adapted from those used to make wine. Within a few decades printing "
    "shops had spread to more than two hundred cities across Europe, and the cost of books fell so far that reading "
    "became an ordinary skill rather than the privilege of clergy and nobles. Scholars could now compare identical "
    "copies of a text, which made errors easier to find and ideas faster to spread.";

// VmRSS: (now) or VmHWM: (peak) of this process, MiB.
long rss_mib(const char* key = "VmRSS:") {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::atol(line.c_str() + std::strlen(key)) / 1024;
  }
  return -1;
}

std::string arg(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return def;
}
bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

void die(const char* what) {
  std::fprintf(stderr, "parallel_test: %s: %s\n", what, ember_last_error());
  std::exit(1);
}

// Greedy replies of `n` sessions running at once on `engine`.
std::vector<std::vector<int32_t>> generate(ember_engine* engine, int n, int tokens) {
  std::vector<ember_session*> sessions(static_cast<size_t>(n));
  std::vector<ember_stream*> streams(static_cast<size_t>(n));
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (ember_session_create(engine, nullptr, &sessions[i]) != EMBER_OK) die("session");
    if (ember_session_add_text(sessions[i], kPrompts[i % kNumPrompts], 0) != EMBER_OK) die("prompt");
    ember_stream_params sp;
    ember_stream_params_init(&sp);
    sp.temperature = 0.0f;
    sp.max_tokens = tokens;
    sp.ignore_eos = 1;
    if (ember_stream_start(sessions[i], &sp, &streams[i]) != EMBER_OK) die("stream");
  }
  for (int i = 0; i < n; ++i) {
    for (;;) {
      ember_event ev;
      std::memset(&ev, 0, sizeof ev);
      ev.size = sizeof ev;
      if (ember_stream_next(streams[i], &ev, -1) != EMBER_OK) die("stream_next");
      if (ev.type == EMBER_EVENT_TEXT) out[i].insert(out[i].end(), ev.tokens, ev.tokens + ev.n_tokens);
      if (ev.type == EMBER_EVENT_ERROR) die("a stream failed");
      if (ev.type == EMBER_EVENT_END) break;
    }
    ember_stream_destroy(streams[i]);
    ember_session_destroy(sessions[i]);
  }
  return out;
}

// Perplexity of `ids` scored in windows of `window` tokens (each from an
// empty context); the first window's logits go to *logits.
double perplexity(ember_engine* engine, const std::vector<int32_t>& ids, size_t window, std::vector<float>* logits,
                  std::vector<double>* per_token) {
  double nll = 0.0;
  size_t count = 0;
  per_token->clear();
  for (size_t at = 0; at + 1 < ids.size(); at += window) {
    const size_t n = std::min(window, ids.size() - at);
    if (n < 2) break;
    std::vector<float> lp(n);
    if (ember_engine_score(engine, ids.data() + at, n, lp.data(), at == 0 ? logits->data() : nullptr) != EMBER_OK) {
      die("score");
    }
    for (size_t i = 0; i + 1 < n; ++i) {
      nll -= lp[i];
      per_token->push_back(lp[i]);
    }
    count += n - 1;
  }
  return std::exp(nll / static_cast<double>(count));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model_path = arg(argc, argv, "--model", "");
  const int tp = std::atoi(arg(argc, argv, "--tp", "1").c_str());
  const int pp = std::atoi(arg(argc, argv, "--pp", "1").c_str());
  const int n_prompts = std::atoi(arg(argc, argv, "--prompts", "8").c_str());
  const int n_tokens = std::atoi(arg(argc, argv, "--tokens", "16").c_str());
  const double min_agree = std::atof(arg(argc, argv, "--min-agreement", "0").c_str());
  const double max_ppl_rel = std::atof(arg(argc, argv, "--max-ppl-rel", "1e9").c_str());
  const double min_top1 = std::atof(arg(argc, argv, "--min-top1", "0").c_str());
  const std::string expect_error = arg(argc, argv, "--expect-error", "");
  const bool identical = flag(argc, argv, "--identical");

  const long rss_start = rss_mib();  // (the libraries, before the model)
  ember_model_params mp;
  ember_model_params_init(&mp);
  mp.use_mmap = EMBER_MODEL_MAP_SHARED;
  ember_model* model = nullptr;
  if (ember_model_load(model_path.c_str(), &mp, &model) != EMBER_OK) die("loading the model");
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.n_threads = std::atoi(arg(argc, argv, "-t", "1").c_str());
  ep.tp_size = tp;
  ep.pp_size = pp;
  ep.comm_timeout_ms = std::atoi(arg(argc, argv, "--comm-timeout-ms", "30000").c_str());
  ep.kv_memory_bytes = 64ull << 20;
  ep.comm = arg(argc, argv, "--comm", "mpi") == "nccl" ? EMBER_COMM_NCCL : EMBER_COMM_MPI;
  ep.tp_exact = flag(argc, argv, "--tp-allreduce") ? 0 : 1;
  ep.device = arg(argc, argv, "--device", "cpu") == "cuda" ? EMBER_DEVICE_CUDA : EMBER_DEVICE_CPU;
  ember_engine* split = nullptr;
  const ember_status st = ember_engine_create(model, &ep, &split);
  if (!expect_error.empty()) {
    const std::string msg = st == EMBER_OK ? "" : ember_last_error();
    std::printf("parallel_test: engine creation: %s\n", st == EMBER_OK ? "succeeded" : msg.c_str());
    ember_engine_destroy(split);
    ember_model_destroy(model);
    return st != EMBER_OK && msg.find(expect_error) != std::string::npos ? 0 : 1;
  }
  if (st != EMBER_OK) die("creating the split engine");
  int32_t rank = 0, size = 1;
  if (ember_engine_rank(split, &rank, &size) != EMBER_OK) die("rank");
  std::printf("parallel_test: rank %d of %d: resident %ld MiB at start, %ld MiB after loading\n", rank, size, rss_start,
              rss_mib());
  std::fflush(stdout);
  if (rank > 0) {
    const ember_status fs = ember_engine_follow(split);
    if (fs != EMBER_OK) std::fprintf(stderr, "parallel_test: rank %d: %s\n", rank, ember_last_error());
    std::printf("parallel_test: rank %d of %d: peak resident %ld MiB\n", rank, size, rss_mib("VmHWM:"));
    ember_engine_destroy(split);
    ember_model_destroy(model);
    return fs == EMBER_OK ? 0 : 1;
  }
  if (tp == 1 && pp == 1) {  // the baseline of the memory figures: one engine, not split, the same work
    generate(split, n_prompts, n_tokens);
    std::printf("parallel_test: one rank: resident %ld MiB at start, peak %ld MiB\n", rss_start, rss_mib("VmHWM:"));
    ember_engine_destroy(split);
    ember_model_destroy(model);
    return 0;
  }
  if (const char* pidfile = std::getenv("PARALLEL_TEST_PIDFILE")) {  // (the fault test stops rank 1)
    std::ofstream(pidfile) << getpid() << "\n";
  }
  const auto a = generate(split, n_prompts, n_tokens);
  if (flag(argc, argv, "--no-score")) {  // (memory figures: the streams only)
    std::printf("parallel_test: rank 0 of %d: peak resident %ld MiB\n", size, rss_mib("VmHWM:"));
    ember_engine_destroy(split);
    ember_model_destroy(model);
    return 0;
  }
  ember_engine_params one;
  ember_engine_params_init(&one);
  one.n_threads = ep.n_threads;
  one.kv_memory_bytes = ep.kv_memory_bytes;
  one.device = ep.device;
  ember_engine* single = nullptr;
  if (ember_engine_create(model, &one, &single) != EMBER_OK) die("creating the engine on one rank");
  const auto b = generate(single, n_prompts, n_tokens);
  size_t agree = 0, total = 0, equal_streams = 0, same_position = 0;
  for (int i = 0; i < n_prompts; ++i) {
    size_t k = 0;
    while (k < a[i].size() && k < b[i].size() && a[i][k] == b[i][k]) ++k;
    agree += k;
    total += b[i].size();
    equal_streams += a[i] == b[i] ? 1 : 0;
    for (size_t j = 0; j < a[i].size() && j < b[i].size(); ++j) same_position += a[i][j] == b[i][j] ? 1 : 0;
  }
  const double agreement = total ? static_cast<double>(agree) / static_cast<double>(total) : 0.0;
  // The text scored: --score-file (up to --score-tokens tokens, in windows of
  // 256) or a paragraph of its own.
  std::string text = kScoreText;
  const std::string score_file = arg(argc, argv, "--score-file", "");
  if (!score_file.empty()) {
    std::ifstream in(score_file, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (text.empty()) die("--score-file is empty or unreadable");
  }
  std::vector<int32_t> ids(text.size() + 16);
  size_t n_ids = 0;
  if (ember_tokenize(model, text.c_str(), 1, 0, ids.data(), ids.size(), &n_ids) != EMBER_OK) die("tokenize");
  ids.resize(std::min<size_t>(n_ids, std::atol(arg(argc, argv, "--score-tokens", "1000000").c_str())));
  const size_t window = 256;
  const ember_model_info_t info = [&] {
    ember_model_info_t i;
    std::memset(&i, 0, sizeof i);
    i.size = sizeof i;
    ember_model_info(model, &i);
    return i;
  }();
  const size_t first = std::min(window, ids.size());
  std::vector<float> la(first * static_cast<size_t>(info.vocab_size)), lb(la.size());
  std::vector<double> lpa, lpb;
  const double ppl_split = perplexity(split, ids, window, &la, &lpa),
               ppl_one = perplexity(single, ids, window, &lb, &lpb);
  // The per-token log-probability differences: their mean is log(ppl_one /
  // ppl_split); their spread says how far that mean can be from 0 by chance
  // (the standard error).
  double mean = 0.0, var = 0.0;
  for (size_t i = 0; i < lpa.size(); ++i) mean += lpa[i] - lpb[i];
  mean /= static_cast<double>(lpa.size());
  for (size_t i = 0; i < lpa.size(); ++i) var += (lpa[i] - lpb[i] - mean) * (lpa[i] - lpb[i] - mean);
  const double stderr_mean = std::sqrt(var / static_cast<double>(lpa.size() - 1) / static_cast<double>(lpa.size()));
  double max_diff = 0.0, max_abs = 0.0, kl = 0.0;
  size_t top1 = 0;
  for (size_t t = 0; t < first; ++t) {
    const float* x = &la[t * static_cast<size_t>(info.vocab_size)];
    const float* y = &lb[t * static_cast<size_t>(info.vocab_size)];
    size_t ax = 0, ay = 0;
    for (size_t v = 0; v < static_cast<size_t>(info.vocab_size); ++v) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(x[v] - y[v])));
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(y[v])));
      if (x[v] > x[ax]) ax = v;
      if (y[v] > y[ay]) ay = v;
    }
    top1 += ax == ay ? 1 : 0;
    // KL(one rank || split) of this row's distribution.
    double zx = 0.0, zy = 0.0;
    for (size_t v = 0; v < static_cast<size_t>(info.vocab_size); ++v) {
      zx += std::exp(static_cast<double>(x[v] - x[ax]));
      zy += std::exp(static_cast<double>(y[v] - y[ay]));
    }
    for (size_t v = 0; v < static_cast<size_t>(info.vocab_size); ++v) {
      const double ly = static_cast<double>(y[v] - y[ay]) - std::log(zy);
      const double lx = static_cast<double>(x[v] - x[ax]) - std::log(zx);
      kl += std::exp(ly) * (ly - lx);
    }
  }
  const double rel = std::fabs(ppl_split / ppl_one - 1.0);
  std::printf(
      "parallel_test: tp %d pp %d: %d greedy streams x %d tokens: %zu/%zu streams identical, tokens equal "
      "before each stream's first difference %.4f (at the same position %.4f)\n",
      tp, pp, n_prompts, n_tokens, equal_streams, static_cast<size_t>(n_prompts), agreement,
      total ? static_cast<double>(same_position) / static_cast<double>(total) : 0.0);
  std::printf(
      "parallel_test: perplexity over %zu tokens: split %.6f, one rank %.6f (relative difference %.2e; "
      "standard error of the mean log-probability difference %.2e)\n",
      ids.size(), ppl_split, ppl_one, rel, stderr_mean);
  std::printf(
      "parallel_test: logits of the first %zu tokens: top-1 equal %zu/%zu, mean KL %.3g, max |difference| %.3g "
      "(max |logit| %.3g)\n",
      first, top1, first, kl / static_cast<double>(first), max_diff, max_abs);
  std::printf("parallel_test: rank 0 of %d: peak resident %ld MiB (with the engine on one rank too)\n", size,
              rss_mib("VmHWM:"));
  ember_engine_destroy(single);
  ember_engine_destroy(split);  // (the followers end)
  ember_model_destroy(model);
  // Perplexity: within max_ppl_rel beyond what chance allows (3 standard
  // errors of the per-token differences' mean), i.e. no systematic loss.
  bool ok = agreement >= min_agree && rel <= max_ppl_rel + 3.0 * stderr_mean &&
            static_cast<double>(top1) >= min_top1 * static_cast<double>(first);
  if (identical) ok = ok && equal_streams == static_cast<size_t>(n_prompts) && ppl_split == ppl_one;
  std::printf("parallel_test: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
