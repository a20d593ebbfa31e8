// soak: many concurrent streams with random parameters on one engine whose KV
// pool is small enough to force preemption (issue 14, item 3). A program, not
// a test: docs/RELIABILITY.md records its runs.
//
// Public C ABI only (ember/ember.h). What it does:
//   1. Draws every request from --seed: prompt (a small pool, raw text and
//      chat), greedy or sampled, max_tokens, stop strings, cache policy
//      (FULL, SINK, WINDOW), priority, speculative decoding (n-gram or self
//      drafter on 4 requests in 10), and whether and how it is cut short
//      (cancelled after k events, destroyed or released while running), and
//      the order its handles are destroyed in.
//   2. Runs every distinct greedy request alone, one at a time, on a separate
//      engine: the references.
//   3. Runs all requests from --concurrency threads on one engine (each
//      thread: a fresh session, a stream, its events, then the handles in the
//      drawn order), sampling VmRSS every --rss-ms.
//   4. Checks: no request fails (no ERROR event, no failed call); every
//      greedy request equals its reference (tokens, text and end reason;
//      a cancelled one is a prefix of it); the engine preempted at least
//      once (ember_scheduler_stats_t.preempted); no KV block stays in use at
//      the end; no stream waits more than --stall-s seconds for an event.
//   Leaks: run the ASan build (LeakSanitizer reports at exit).
// Exit status 0 when every check passed.
//
//   soak [--model PATH] [--requests 1000] [--concurrency 64] [--threads 2]
//        [--kv-blocks 96] [--seed 1] [--min-tokens 8] [--max-tokens 48]
//        [--rss-ms 250] [--rss-csv FILE] [--stall-s 120]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ember/ember.h"

namespace {

struct Options {
  std::string model;
  int requests = 1000;
  int concurrency = 64;
  int threads = 2;
  int kv_blocks = 96;
  uint64_t seed = 1;
  int min_tokens = 8;
  int max_tokens = 48;
  int rss_ms = 250;
  std::string rss_csv;
  int stall_s = 120;
};

// The prompt pool: few, so references are cheap; two share a long prefix (prefix
// cache hits, copy-on-write).
struct Prompt {
  bool chat;
  const char* text;
};
const Prompt kPrompts[] = {
    {false, "The capital of France is"},
    {false, "Once upon a time, in a small village by the sea, there lived an old fisherman who"},
    {false, "Once upon a time, in a small village by the sea, there lived a young girl who"},
    {false, "def fibonacci(n):\n    "},
    {true, "What is the boiling point of water?"},
    {true, "Write a haiku about autumn."},
    {true, "List three prime numbers."},
};
constexpr int kNumPrompts = sizeof kPrompts / sizeof kPrompts[0];

// Stop-string sets (index 0: none).
const std::vector<std::vector<const char*>> kStops = {{}, {"."}, {"\n\n", " and"}};
const int kTokenChoices[] = {8, 16, 32, 48};
enum Policy { kFull = 0, kSink = 1, kWindow = 2 };
constexpr int kSinkTokens = 4, kWindowTokens = 64;  // a prompt and 48 tokens overflow the window: it evicts
// How a request ends: run to its end; cancelled after some events (then
// drained); its stream destroyed or released while running; its session
// destroyed while the stream runs (which cancels it; then drained).
enum Cut { kRunToEnd = 0, kCancel = 1, kDestroyRunning = 2, kReleaseRunning = 3, kSessionDestroyedRunning = 4 };
enum Order { kStreamFirst = 0, kSessionFirst = 1 };

struct Request {
  int prompt = 0;
  bool greedy = true;
  int max_tokens = 8;
  int policy = kFull;
  int stops = 0;
  int priority = EMBER_PRIORITY_INTERACTIVE;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float repeat_penalty = 1.0f;
  uint64_t sample_seed = 0;
  int cut = kRunToEnd;
  int cut_after = 0;  // events before the cut
  int order = kStreamFirst;
  int spec = EMBER_SPEC_NONE;  // speculative drafter (references never speculate)
  auto key() const { return std::make_tuple(prompt, max_tokens, policy, stops); }
};

Request draw(uint64_t seed, int index, const Options& o) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<uint64_t>(index));
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  Request r;
  r.prompt = uniform(0, kNumPrompts - 1);
  r.greedy = chance(0.5);
  std::vector<int> tokens;
  for (int t : kTokenChoices)
    if (t >= o.min_tokens && t <= o.max_tokens) tokens.push_back(t);
  if (tokens.empty()) tokens.push_back(o.max_tokens);
  r.max_tokens = tokens[static_cast<size_t>(uniform(0, static_cast<int>(tokens.size()) - 1))];
  const int p = uniform(0, 9);
  r.policy = p < 6 ? kFull : p < 8 ? kSink : kWindow;
  const int s = uniform(0, 9);
  r.stops = s < 6 ? 0 : s < 8 ? 1 : 2;
  r.priority = chance(0.2) ? EMBER_PRIORITY_BACKGROUND : EMBER_PRIORITY_INTERACTIVE;
  r.temperature = 0.6f + 0.1f * static_cast<float>(uniform(0, 6));
  r.top_k = chance(0.5) ? 40 : 0;
  r.top_p = chance(0.5) ? 0.95f : 1.0f;
  r.repeat_penalty = chance(0.3) ? 1.1f : 1.0f;
  r.sample_seed = rng();
  const int c = uniform(0, 99);
  r.cut = c < 78   ? kRunToEnd
          : c < 85 ? kCancel
          : c < 90 ? kDestroyRunning
          : c < 95 ? kReleaseRunning
                   : kSessionDestroyedRunning;
  r.cut_after = uniform(0, 6);
  r.order = uniform(0, 1);
  // Speculative decoding on some requests: greedy ones must still equal
  // their (plain) solo runs, sampled ones run with rejection sampling.
  const int sp = uniform(0, 9);
  r.spec = sp < 3 ? EMBER_SPEC_NGRAM : sp < 4 ? EMBER_SPEC_SELF : EMBER_SPEC_NONE;
  return r;
}

ember_session_params session_params(const Request& r) {
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.priority = r.priority;
  sp.cache_policy = r.policy == kFull ? EMBER_CACHE_FULL : r.policy == kSink ? EMBER_CACHE_SINK : EMBER_CACHE_WINDOW;
  if (r.policy == kSink) sp.sink_tokens = kSinkTokens;
  if (r.policy != kFull) sp.window_tokens = kWindowTokens;
  return sp;
}

struct StopList {
  std::vector<const char*> ptrs;
  explicit StopList(int set) : ptrs(kStops[static_cast<size_t>(set)]) { ptrs.push_back(nullptr); }
};

ember_stream_params stream_params(const Request& r, const StopList& stops, bool speculate) {
  ember_stream_params p;
  ember_stream_params_init(&p);
  p.max_tokens = r.max_tokens;
  if (speculate) p.spec_drafter = r.spec;
  if (r.greedy) {
    p.temperature = 0.0f;
  } else {
    p.temperature = r.temperature;
    p.top_k = r.top_k;
    p.top_p = r.top_p;
    p.repeat_penalty = r.repeat_penalty;
    p.seed = r.sample_seed;
  }
  p.stop = r.stops ? stops.ptrs.data() : nullptr;
  return p;
}

struct Output {
  std::vector<int32_t> tokens;
  std::string text;
  int32_t end_reason = EMBER_END_NONE;
  bool ended = false;
};

// Global tallies.
std::mutex g_mutex;
std::vector<std::string> g_failures;
void failure(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_failures.size() < 50)
    g_failures.push_back(what);
  else if (g_failures.size() == 50)
    g_failures.push_back("(more failures not shown)");
}

bool call(ember_status st, const std::string& what) {
  if (st == EMBER_OK) return true;
  failure(what + ": " + ember_status_string(st) + ": " + ember_last_error());
  return false;
}

ember_session* open_session(ember_engine* engine, const Request& r, int index) {
  const ember_session_params sp = session_params(r);
  ember_session* s = nullptr;
  const std::string tag = "request " + std::to_string(index);
  if (!call(ember_session_create(engine, &sp, &s), tag + ": session_create")) return nullptr;
  const Prompt& p = kPrompts[r.prompt];
  const ember_status st = p.chat ? ember_session_add_message(s, "user", p.text) : ember_session_add_text(s, p.text, 0);
  if (!call(st, tag + ": add prompt")) {
    ember_session_destroy(s);
    return nullptr;
  }
  return s;
}

// Pulls events until END/ERROR, or until `limit` events (then returns with
// ended == false). A wait longer than stall_s is a failure (a hang).
bool pull(ember_stream* stream, Output& out, int limit, int stall_s, const std::string& tag) {
  int events = 0;
  auto last = std::chrono::steady_clock::now();
  while (!out.ended && (limit < 0 || events < limit)) {
    ember_event ev;
    std::memset(&ev, 0, sizeof ev);
    ev.size = sizeof ev;
    const ember_status st = ember_stream_next(stream, &ev, 1000);
    if (st == EMBER_ERR_TIMEOUT) {
      if (std::chrono::steady_clock::now() - last > std::chrono::seconds(stall_s)) {
        failure(tag + ": no event for " + std::to_string(stall_s) + " s (hang)");
        return false;
      }
      continue;
    }
    if (!call(st, tag + ": stream_next")) return false;
    last = std::chrono::steady_clock::now();
    ++events;
    if (ev.type == EMBER_EVENT_TEXT) {
      out.text.append(ev.text, ev.text_length);
      out.tokens.insert(out.tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
    } else if (ev.type == EMBER_EVENT_END) {
      out.end_reason = ev.end_reason;
      out.ended = true;
    } else {
      failure(tag + ": ERROR event " + ember_status_string(ev.status) + ": " + ember_last_error());
      return false;
    }
  }
  return true;
}

// A greedy request run alone on `engine` (the reference).
bool solo(ember_engine* engine, const Request& r, Output& out, int stall_s) {
  ember_session* s = open_session(engine, r, -1);
  if (!s) return false;
  StopList stops(r.stops);
  const ember_stream_params p = stream_params(r, stops, /*speculate=*/false);
  ember_stream* st = nullptr;
  bool ok = call(ember_stream_start(s, &p, &st), "reference: stream_start");
  if (ok) ok = pull(st, out, -1, stall_s, "reference");
  ember_stream_destroy(st);
  ember_session_destroy(s);
  return ok && out.ended;
}

using Key = decltype(Request{}.key());

struct Tally {
  std::atomic<int> done{0}, greedy_checked{0}, greedy_prefix_checked{0}, cancelled{0}, destroyed_running{0},
      released_running{0}, session_destroyed_running{0}, ended_cancelled{0}, sampled{0}, policy[3]{}, speculative{0};
  std::atomic<uint64_t> tokens{0}, accepted{0};
};

void run_request(ember_engine* engine, const Request& r, int index, const std::map<Key, Output>& refs, const Options& o,
                 Tally& tally) {
  const std::string tag = "request " + std::to_string(index);
  ember_session* s = open_session(engine, r, index);
  if (!s) return;
  tally.policy[r.policy]++;
  if (r.spec != EMBER_SPEC_NONE) tally.speculative++;
  StopList stops(r.stops);
  const ember_stream_params p = stream_params(r, stops, /*speculate=*/true);
  ember_stream* st = nullptr;
  if (!call(ember_stream_start(s, &p, &st), tag + ": stream_start")) {
    ember_session_destroy(s);
    return;
  }
  Output out;
  bool ok = true;
  bool stream_gone = false, session_gone = false;
  if (r.cut == kRunToEnd) {
    ok = pull(st, out, -1, o.stall_s, tag);
  } else {
    ok = pull(st, out, r.cut_after, o.stall_s, tag);
    if (ok && !out.ended) {
      if (r.cut == kCancel) {
        tally.cancelled++;
        ok = call(ember_stream_cancel(st), tag + ": cancel") && pull(st, out, -1, o.stall_s, tag);
        if (ok && out.end_reason == EMBER_END_CANCELLED) tally.ended_cancelled++;
      } else if (r.cut == kSessionDestroyedRunning) {
        tally.session_destroyed_running++;
        ember_session_destroy(s);
        session_gone = true;
        ok = pull(st, out, -1, o.stall_s, tag);
        if (ok && out.end_reason == EMBER_END_CANCELLED) tally.ended_cancelled++;
      } else if (r.cut == kDestroyRunning) {
        tally.destroyed_running++;
        ember_stream_destroy(st);
        stream_gone = true;
      } else {
        tally.released_running++;
        ember_stream_release(st);
        stream_gone = true;
      }
    }
  }
  if (ok && !stream_gone) {
    ember_stream_stats_t stats;
    std::memset(&stats, 0, sizeof stats);
    stats.size = sizeof stats;
    if (call(ember_stream_stats(st, &stats), tag + ": stats")) {
      tally.tokens += stats.generated_tokens;
      tally.accepted += stats.accepted_tokens;
    }
  }
  // The handles, in the drawn order (a session destroyed first cancels
  // nothing here: the stream has ended or is already gone).
  if (r.order == kSessionFirst) {
    if (!session_gone) ember_session_destroy(s);
    if (!stream_gone) ember_stream_destroy(st);
  } else {
    if (!stream_gone) ember_stream_destroy(st);
    if (!session_gone) ember_session_destroy(s);
  }
  if (!ok) return;
  if (!r.greedy) {
    tally.sampled++;
  } else {
    const Output& ref = refs.at(r.key());
    const bool complete = out.ended && out.end_reason != EMBER_END_CANCELLED;
    if (complete) {
      if (out.tokens != ref.tokens || out.text != ref.text || out.end_reason != ref.end_reason) {
        failure(tag + " (prompt " + std::to_string(r.prompt) + ", max_tokens " + std::to_string(r.max_tokens) +
                ", policy " + std::to_string(r.policy) + ", stops " + std::to_string(r.stops) +
                "): greedy output differs from its solo run: \"" + out.text + "\" vs \"" + ref.text + "\"");
      } else {
        tally.greedy_checked++;
      }
    } else {
      const bool prefix = out.tokens.size() <= ref.tokens.size() &&
                          std::equal(out.tokens.begin(), out.tokens.end(), ref.tokens.begin()) &&
                          ref.text.compare(0, out.text.size(), out.text) == 0;
      if (!prefix) {
        failure(tag + ": cut greedy output is not a prefix of its solo run: \"" + out.text + "\" vs \"" + ref.text +
                "\"");
      } else {
        tally.greedy_prefix_checked++;
      }
    }
  }
  tally.done++;
}

size_t rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

bool parse(int argc, char** argv, Options& o) {
  const char* home = std::getenv("EMBER_HOME");
  const char* h = std::getenv("HOME");
  o.model = std::string(home && *home ? home : std::string(h ? h : ".") + "/.cache/ember") +
            "/SmolLM2-135M-Instruct.Q4_1.gguf";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (a == "--model")
      o.model = v;
    else if (a == "--requests")
      o.requests = std::atoi(v);
    else if (a == "--concurrency")
      o.concurrency = std::atoi(v);
    else if (a == "--threads")
      o.threads = std::atoi(v);
    else if (a == "--kv-blocks")
      o.kv_blocks = std::atoi(v);
    else if (a == "--seed")
      o.seed = std::strtoull(v, nullptr, 10);
    else if (a == "--min-tokens")
      o.min_tokens = std::atoi(v);
    else if (a == "--max-tokens")
      o.max_tokens = std::atoi(v);
    else if (a == "--rss-ms")
      o.rss_ms = std::atoi(v);
    else if (a == "--rss-csv")
      o.rss_csv = v;
    else if (a == "--stall-s")
      o.stall_s = std::atoi(v);
    else
      return false;
  }
  return o.requests > 0 && o.concurrency > 0 && o.kv_blocks > 0 && o.rss_ms > 0 && o.min_tokens <= o.max_tokens;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: soak [--model PATH] [--requests N] [--concurrency C] [--threads T] [--kv-blocks B] "
                 "[--seed S] [--min-tokens N] [--max-tokens N] [--rss-ms MS] [--rss-csv FILE] [--stall-s S]\n");
    return 2;
  }
  const auto t_start = std::chrono::steady_clock::now();
  ember_model* model = nullptr;
  if (!call(ember_model_load(o.model.c_str(), nullptr, &model), "model_load")) {
    std::fprintf(stderr, "soak: %s\n", g_failures.front().c_str());
    return 2;
  }
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.n_threads = o.threads;

  // 1. The requests.
  std::vector<Request> requests;
  for (int i = 0; i < o.requests; ++i) requests.push_back(draw(o.seed, i, o));

  // 2. References: each distinct greedy request alone on its own engine.
  std::map<Key, Output> refs;
  {
    ember_engine* ref_engine = nullptr;
    ember_engine_params rp = ep;
    rp.kv_memory_bytes = 64ull << 20;
    if (!call(ember_engine_create(model, &rp, &ref_engine), "reference engine_create")) return 2;
    for (const Request& r : requests) {
      if (!r.greedy || refs.count(r.key())) continue;
      Output out;
      if (!solo(ref_engine, r, out, o.stall_s)) {
        std::fprintf(stderr, "soak: a reference failed: %s\n", g_failures.empty() ? "?" : g_failures.back().c_str());
        return 2;
      }
      refs.emplace(r.key(), std::move(out));
    }
    ember_engine_destroy(ref_engine);
  }
  const double t_refs = seconds_since(t_start);

  // 3. The soak.
  ember_engine* engine = nullptr;
  {
    // The pool in blocks: ask a probe engine for the block size in bytes.
    ember_engine_params pp = ep;
    pp.kv_memory_bytes = 1ull << 20;
    ember_engine* probe = nullptr;
    if (!call(ember_engine_create(model, &pp, &probe), "probe engine_create")) return 2;
    ember_cache_stats_t cs;
    std::memset(&cs, 0, sizeof cs);
    cs.size = sizeof cs;
    call(ember_cache_stats(ember_engine_cache(probe), &cs), "cache_stats");
    ember_engine_destroy(probe);
    ep.kv_memory_bytes = static_cast<uint64_t>(o.kv_blocks) * cs.bytes_per_block;
  }
  if (!call(ember_engine_create(model, &ep, &engine), "engine_create")) return 2;
  ember_model_destroy(model);  // the engine keeps it alive

  std::atomic<bool> sampling{true};
  std::vector<std::pair<double, size_t>> rss;  // seconds since the soak began, KiB
  std::vector<int> rss_done;                   // requests done at each sample
  Tally tally;
  const auto t_soak = std::chrono::steady_clock::now();
  std::thread sampler([&] {
    while (sampling.load()) {
      rss.emplace_back(seconds_since(t_soak), rss_kib());
      rss_done.push_back(tally.done.load());
      std::this_thread::sleep_for(std::chrono::milliseconds(o.rss_ms));
    }
  });
  std::atomic<int> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < o.concurrency; ++w) {
    workers.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < o.requests;)
        run_request(engine, requests[static_cast<size_t>(i)], i, refs, o, tally);
    });
  }
  for (auto& t : workers) t.join();
  const double t_run = seconds_since(t_soak);

  // Streams released while running end at the engine's next steps.
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  for (int i = 0; i < 200; ++i) {
    call(ember_cache_stats(ember_engine_cache(engine), &cs), "cache_stats");
    if (cs.blocks_used == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ember_scheduler_stats_t ss;
  std::memset(&ss, 0, sizeof ss);
  ss.size = sizeof ss;
  call(ember_scheduler_stats(ember_engine_scheduler(engine), &ss), "scheduler_stats");
  ember_engine_destroy(engine);
  sampling = false;
  sampler.join();
  const size_t rss_end = rss_kib();

  if (ss.preempted == 0) failure("the engine never preempted: the pool was not small enough");
  if (cs.blocks_used != 0)
    failure(std::to_string(cs.blocks_used) + " KV blocks still in use after every request ended");
  const int completed = tally.done.load();
  if (completed != o.requests && g_failures.empty()) failure("requests lost");

  // RSS: the peak, and the peak of each quarter of the requests (a plateau:
  // the last quarters no higher than the second).
  size_t peak = 0;
  size_t quarter_peak[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < rss.size(); ++i) {
    peak = std::max(peak, rss[i].second);
    const int q = std::min(3, rss_done[i] * 4 / std::max(o.requests, 1));
    quarter_peak[q] = std::max(quarter_peak[q], rss[i].second);
  }
  if (!o.rss_csv.empty()) {
    std::ofstream csv(o.rss_csv);
    csv << "seconds,rss_kib,requests_done\n";
    for (size_t i = 0; i < rss.size(); ++i) csv << rss[i].first << "," << rss[i].second << "," << rss_done[i] << "\n";
  }

  std::printf("soak: %d requests, concurrency %d, %d CPU threads, KV pool %d blocks (%.1f MiB), seed %llu\n",
              o.requests, o.concurrency, o.threads, o.kv_blocks, static_cast<double>(ep.kv_memory_bytes) / 1048576.0,
              static_cast<unsigned long long>(o.seed));
  std::printf("requests completed:     %d of %d (FULL %d, SINK %d, WINDOW %d)\n", completed, o.requests,
              tally.policy[kFull].load(), tally.policy[kSink].load(), tally.policy[kWindow].load());
  std::printf("greedy equal to solo:   %d (+ %d cut short, each a prefix of its solo run); %zu distinct references\n",
              tally.greedy_checked.load(), tally.greedy_prefix_checked.load(), refs.size());
  std::printf("sampled:                %d\n", tally.sampled.load());
  std::printf("speculative:            %d requests (n-gram or self drafter), %llu drafted tokens accepted\n",
              tally.speculative.load(), static_cast<unsigned long long>(tally.accepted.load()));
  std::printf(
      "cut short:              cancelled %d, session destroyed while running %d (of these two, ended CANCELLED: %d); "
      "stream destroyed running %d, released running %d\n",
      tally.cancelled.load(), tally.session_destroyed_running.load(), tally.ended_cancelled.load(),
      tally.destroyed_running.load(), tally.released_running.load());
  std::printf("generated tokens:       %llu\n", static_cast<unsigned long long>(tally.tokens.load()));
  std::printf("preemptions:            %llu (engine steps %llu)\n", static_cast<unsigned long long>(ss.preempted),
              static_cast<unsigned long long>(ss.steps));
  std::printf("KV blocks in use at end: %zu of %zu\n", cs.blocks_used, cs.blocks_total);
  std::printf(
      "RSS (VmRSS):            peak %.1f MiB; per quarter of requests %.1f / %.1f / %.1f / %.1f MiB; "
      "after the engine was destroyed %.1f MiB; %zu samples every %d ms\n",
      peak / 1024.0, quarter_peak[0] / 1024.0, quarter_peak[1] / 1024.0, quarter_peak[2] / 1024.0,
      quarter_peak[3] / 1024.0, rss_end / 1024.0, rss.size(), o.rss_ms);
  std::printf("time:                   references %.1f s, soak %.1f s, total %.1f s\n", t_refs, t_run,
              seconds_since(t_start));
  if (!g_failures.empty()) {
    std::printf("FAILED: %zu problem(s)\n", g_failures.size());
    for (const auto& f : g_failures) std::printf("  %s\n", f.c_str());
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
