// libFuzzer target: speculative decoding through the public C ABI, as a
// differential test. Each input chooses a drafter (n-gram, self-speculation
// with some layers, a draft model with the target's vocabulary, a draft with
// another vocabulary), the tree's parameters (in and out of range), prompt
// lookup on or off, a cache policy (full, sink, window), a stop string,
// greedy or sampled decoding, and a prompt of token ids; both models are tiny
// random-weight files written once at start-up by tools/make_synthetic_model,
// on one manual-step engine with a small KV pool.
//
// Promises checked: ember_stream_start returns OK or INVALID_ARGUMENT, never
// crashes; a refused stream leaves the session usable; a greedy speculative
// stream emits exactly the tokens, text and end of the same stream without
// speculation (whatever the drafter, tree, policy or stop string); a sampled
// one ends (END or ERROR) without hanging; drafted >= accepted in the stats;
// after every input no KV block is left referenced.
//
// Input: byte 0 drafter, 1 self layers, 2 threshold, 3 nodes, 4 depth,
// 5 alpha, 6 flags (bit 0 lookup off, bit 1 sampled, bits 2-3 policy,
// bit 4 stop string, bit 5 chat prompt), 7 max tokens, 8..15 seed, then the
// prompt: pairs of bytes, each a token id (ids past the vocabulary included).
//
// Environment: EMBER_FUZZ_MAKE_MODEL overrides the make_synthetic_model
// binary; EMBER_FUZZ_WRITE_SEEDS=<dir> writes seed inputs and exits;
// EMBER_FUZZ_VERBOSE=1 prints each input's speculation figures.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ember/ember.h"
#include "fuzz_util.h"

namespace ember::fuzz {
namespace {

constexpr int32_t kVocab = 384;
constexpr size_t kHeader = 16;

struct State {
  std::string dir;
  std::string target_path, draft_path, other_path;
  ember_model* target = nullptr;
  ember_model* draft = nullptr;  // the target's vocabulary
  ember_model* other = nullptr;  // another vocabulary (refused)
  ember_engine* engine = nullptr;
};
State g;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "fuzz_spec: %s: %s\n", what.c_str(), ember_last_error());
  std::exit(1);
}

void cleanup() {
  if (g.engine) ember_engine_destroy(g.engine);
  for (ember_model* m : {g.target, g.draft, g.other}) ember_model_destroy(m);
  g.engine = nullptr;
  g.target = g.draft = g.other = nullptr;
  for (const std::string& p : {g.target_path, g.draft_path, g.other_path}) std::remove(p.c_str());
  if (!g.dir.empty()) ::rmdir(g.dir.c_str());
}

void make_model(const std::string& out, std::vector<std::string> shape) {
  for (const char* a : {"--type", "q8_0", "--ctx", "512", "--out"}) shape.emplace_back(a);
  shape.push_back(out);
  if (!make_synthetic_model(std::move(shape))) die("make_synthetic_model failed for " + out);
}

ember_model* load(const std::string& path) {
  ember_model* m = nullptr;
  if (ember_model_load(path.c_str(), nullptr, &m) != EMBER_OK) die("model_load " + path);
  return m;
}

void init() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ember-fuzz-spec-XXXXXX";
  if (!mkdtemp(templ.data())) die("mkdtemp");
  g.dir = templ;
  g.target_path = g.dir + "/target.gguf";
  g.draft_path = g.dir + "/draft.gguf";
  g.other_path = g.dir + "/other.gguf";
  std::atexit(cleanup);
  const std::string v = std::to_string(kVocab);
  make_model(g.target_path, {"--layers", "3", "--embd", "64", "--ff", "128", "--heads", "4", "--kv-heads", "2",
                             "--vocab", v, "--seed", "7"});
  make_model(g.draft_path, {"--layers", "1", "--embd", "32", "--ff", "64", "--heads", "2", "--kv-heads", "1", "--vocab",
                            v, "--seed", "8"});
  make_model(g.other_path, {"--layers", "1", "--embd", "32", "--ff", "64", "--heads", "2", "--kv-heads", "1", "--vocab",
                            std::to_string(kVocab + 32), "--seed", "9"});
  g.target = load(g.target_path);
  g.draft = load(g.draft_path);
  g.other = load(g.other_path);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.n_threads = 1;
  ep.manual_step = 1;
  ep.kv_memory_bytes = 256u << 10;  // 64 blocks of 16: drafts and targets compete for them
  ep.kv_block_size = 16;
  if (ember_engine_create(g.target, &ep, &g.engine) != EMBER_OK) die("engine_create");
}

size_t blocks_used() {
  ember_cache_stats_t cs{};
  cs.size = sizeof cs;
  EMBER_FUZZ_CHECK(ember_cache_stats(ember_engine_cache(g.engine), &cs) == EMBER_OK);
  return cs.blocks_used;
}

struct Outcome {
  bool ended = false;  // an END or ERROR event came
  int32_t end_reason = -1;
  bool error = false;
  std::vector<int32_t> tokens;
  std::string text;
  ember_stream_stats_t stats{};
};

// Steps the (manual) engine until the stream ends.
Outcome drain(ember_stream* stream) {
  Outcome o;
  for (int i = 0; i < 512 && !o.ended; ++i) {
    ember_engine_step(g.engine, 0, 0, nullptr);
    for (;;) {
      ember_event ev{};
      ev.size = sizeof ev;
      const ember_status st = ember_stream_next(stream, &ev, 0);
      if (st == EMBER_ERR_END_OF_STREAM || st == EMBER_ERR_TIMEOUT) break;
      EMBER_FUZZ_CHECK(st == EMBER_OK);
      if (ev.type == EMBER_EVENT_TEXT) {
        o.tokens.insert(o.tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
        if (ev.text) o.text.append(ev.text, ev.text_length);
      } else if (ev.type == EMBER_EVENT_END || ev.type == EMBER_EVENT_ERROR) {
        o.ended = true;
        o.error = ev.type == EMBER_EVENT_ERROR;
        o.end_reason = ev.end_reason;
        break;
      }
    }
  }
  o.stats.size = sizeof o.stats;
  EMBER_FUZZ_CHECK(ember_stream_stats(stream, &o.stats) == EMBER_OK);
  return o;
}

struct Input {
  uint8_t drafter = 0, layers = 0, threshold = 0, nodes = 0, depth = 0, alpha = 0, flags = 0, max_tokens = 0;
  uint64_t seed = 0;
  std::vector<int32_t> prompt;
};

Input parse(const uint8_t* data, size_t size) {
  Input in;
  uint8_t h[kHeader] = {};
  std::memcpy(h, data, size < kHeader ? size : kHeader);
  in.drafter = h[0];
  in.layers = h[1];
  in.threshold = h[2];
  in.nodes = h[3];
  in.depth = h[4];
  in.alpha = h[5];
  in.flags = h[6];
  in.max_tokens = h[7];
  std::memcpy(&in.seed, h + 8, 8);
  for (size_t i = kHeader; i + 1 < size && in.prompt.size() < 96; i += 2) {
    in.prompt.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8)) % (kVocab + 8));
  }
  return in;
}

ember_session* new_session(const Input& in) {
  ember_session_params p;
  ember_session_params_init(&p);
  switch ((in.flags >> 2) & 3) {
    case 1:
      p.cache_policy = EMBER_CACHE_SINK;
      p.sink_tokens = 4;
      p.window_tokens = 44;
      break;
    case 2:
      p.cache_policy = EMBER_CACHE_WINDOW;
      p.window_tokens = 48;
      break;
    default: p.cache_policy = EMBER_CACHE_FULL; break;
  }
  ember_session* s = nullptr;
  EMBER_FUZZ_CHECK(ember_session_create(g.engine, &p, &s) == EMBER_OK);
  if (in.flags & 32) {
    ember_session_add_message(s, "user", "Repeat: the cat sat on the mat, the cat sat on the");
  }
  if (!in.prompt.empty()) {
    // Ids past the vocabulary are refused (INVALID_ARGUMENT) and add nothing.
    const ember_status st = ember_session_add_tokens(s, in.prompt.data(), in.prompt.size());
    EMBER_FUZZ_CHECK(st == EMBER_OK || st == EMBER_ERR_INVALID_ARGUMENT);
  }
  return s;
}

ember_stream_params params(const Input& in, bool spec) {
  ember_stream_params p;
  ember_stream_params_init(&p);
  p.max_tokens = 1 + in.max_tokens % 48;
  p.temperature = (in.flags & 2) ? 0.7f : 0.0f;
  p.seed = in.seed;
  static const char* const kStop[] = {"the", nullptr};
  if (in.flags & 16) p.stop = kStop;
  if (!spec) return p;
  static const int32_t kDrafters[] = {EMBER_SPEC_NGRAM, EMBER_SPEC_SELF, EMBER_SPEC_DRAFT, EMBER_SPEC_DRAFT};
  p.spec_drafter = kDrafters[in.drafter % 4];
  if (in.drafter % 4 >= 2) p.spec_draft_model = in.drafter % 4 == 2 ? g.draft : g.other;
  p.spec_self_layers = in.layers % 5;  // 3 and 4: not fewer than the model's 3 layers (refused)
  // Mostly in range, sometimes not (NaN, negative, huge).
  static const float kThresholds[] = {0.3f, 0.05f, 0.5f, 2.0f, 0.0f, -1.0f, NAN, 1e-6f};
  p.spec_threshold = kThresholds[in.threshold % 8];
  p.spec_max_nodes = in.nodes % 70;
  p.spec_max_depth = in.depth % 70;
  static const float kAlphas[] = {0.25f, 0.0f, 1.0f, 0.5f, 0.01f, 1.5f, NAN, 0.9f};
  p.spec_alpha = kAlphas[in.alpha % 8];
  p.spec_lookup = (in.flags & 1) ? 0 : 1;
  if (in.drafter >= 128) p.spec_lookup = 2;  // refused
  return p;
}

void run(const Input& in) {
  ember_session* plain_s = new_session(in);
  ember_session* spec_s = new_session(in);
  const ember_stream_params pp = params(in, false);
  ember_stream* plain = nullptr;
  const ember_status plain_st = ember_stream_start(plain_s, &pp, &plain);
  EMBER_FUZZ_CHECK(plain_st == EMBER_OK || plain_st == EMBER_ERR_INVALID_ARGUMENT);  // (an empty session)
  if (plain_st != EMBER_OK) {
    const ember_stream_params sp = params(in, true);
    ember_stream* spec = nullptr;
    EMBER_FUZZ_CHECK(ember_stream_start(spec_s, &sp, &spec) != EMBER_OK && spec == nullptr);
    ember_session_destroy(plain_s);
    ember_session_destroy(spec_s);
    return;
  }
  const Outcome a = drain(plain);
  EMBER_FUZZ_CHECK(a.ended);
  ember_stream_destroy(plain);

  const ember_stream_params sp = params(in, true);
  ember_stream* spec = nullptr;
  const ember_status st = ember_stream_start(spec_s, &sp, &spec);
  EMBER_FUZZ_CHECK(st == EMBER_OK || st == EMBER_ERR_INVALID_ARGUMENT);
  if (st != EMBER_OK) {
    EMBER_FUZZ_CHECK(spec == nullptr);
    // Refused: the session is not left busy.
    EMBER_FUZZ_CHECK(ember_stream_start(spec_s, &pp, &spec) == EMBER_OK);
  }
  const Outcome b = drain(spec);
  ember_stream_destroy(spec);
  EMBER_FUZZ_CHECK(b.ended);
  EMBER_FUZZ_CHECK(b.stats.accepted_tokens <= b.stats.drafted_tokens);
  if (st == EMBER_OK && pp.temperature == 0.0f && !a.error && !b.error) {
    EMBER_FUZZ_CHECK(b.tokens == a.tokens);
    EMBER_FUZZ_CHECK(b.text == a.text);
    EMBER_FUZZ_CHECK(b.end_reason == a.end_reason);
  }
  if (std::getenv("EMBER_FUZZ_VERBOSE")) {
    uint64_t h = 0;
    for (int32_t t : b.tokens) h = (h ^ static_cast<uint64_t>(t)) * 0x100000001b3ull;
    std::fprintf(stderr,
                 "fuzz_spec: drafter %d start %d: %zu tokens (hash %08llx; plain %zu), drafted %zu, accepted %zu, "
                 "passes %zu\n",
                 sp.spec_drafter, static_cast<int>(st), b.tokens.size(), static_cast<unsigned long long>(h >> 32),
                 a.tokens.size(), static_cast<size_t>(b.stats.drafted_tokens),
                 static_cast<size_t>(b.stats.accepted_tokens), static_cast<size_t>(b.stats.verify_passes));
  }
  ember_session_destroy(plain_s);
  ember_session_destroy(spec_s);
  EMBER_FUZZ_CHECK(blocks_used() == 0);
}

std::vector<uint8_t> encode(uint8_t drafter, uint8_t layers, uint8_t flags, uint8_t max_tokens,
                            const std::vector<uint16_t>& prompt) {
  std::vector<uint8_t> b = {drafter, layers, 0, 12, 8, 0, flags, max_tokens, 1, 2, 3, 4, 5, 6, 7, 8};
  for (uint16_t t : prompt) {
    b.push_back(static_cast<uint8_t>(t & 0xFF));
    b.push_back(static_cast<uint8_t>(t >> 8));
  }
  return b;
}

void write_seeds(const std::string& dir) {
  // A prompt that repeats (lookup drafts), one that does not.
  std::vector<uint16_t> rep, rnd;
  for (int i = 0; i < 40; ++i) rep.push_back(static_cast<uint16_t>(100 + i % 7));
  for (int i = 0; i < 24; ++i) rnd.push_back(static_cast<uint16_t>((i * 37 + 11) % kVocab));
  write_seed(dir, "ngram", encode(0, 0, 0, 40, rep));
  write_seed(dir, "self-1", encode(1, 1, 1, 30, rep));
  write_seed(dir, "draft", encode(2, 0, 0, 40, rnd));
  write_seed(dir, "draft-alone-sink", encode(2, 0, 1 | 4, 47, rep));
  write_seed(dir, "draft-window-stop", encode(2, 0, 8 | 16, 40, rep));
  write_seed(dir, "other-vocabulary", encode(3, 0, 0, 8, rnd));
  write_seed(dir, "sampled-self-2", encode(1, 2, 2, 30, rnd));
  write_seed(dir, "chat-ngram", encode(0, 0, 32, 30, {}));
}

}  // namespace
}  // namespace ember::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace ember::fuzz;
  init();
  write_seeds_if_asked(write_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember::fuzz;
  run(parse(data, size));
  return 0;
}
