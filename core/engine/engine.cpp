#include "core/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "core/backend/plugin.h"
#include "core/backend/registry.h"
#include "core/model/arch/registry.h"
#include "core/model/batch.h"
#include "core/speculative/draft_model.h"
#include "core/speculative/drafter.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/log.h"

namespace ember {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The part of a history the stream's sampler reads (its penalty window).
std::vector<int32_t> penalty_window(const Stream& s, const std::vector<int32_t>& tokens) {
  const int32_t last_n = s.penalty_last_n();
  const size_t keep = last_n < 0 ? tokens.size() : std::min(tokens.size(), static_cast<size_t>(last_n));
  return std::vector<int32_t>(tokens.end() - static_cast<std::ptrdiff_t>(keep), tokens.end());
}

// log p(token | row) from one row of logits (max-subtracted, double sum).
float log_prob(const float* row, int32_t n_vocab, int32_t token) {
  const float mx = *std::max_element(row, row + n_vocab);
  double sum = 0.0;
  for (int32_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
  return static_cast<float>(row[token] - mx - std::log(sum));
}
}  // namespace

// ------------------------------------------------------------------ lifetime

Engine::Engine(std::shared_ptr<const Model> model, const EngineParams& params)
    : model_(std::move(model)), params_(params) {
  const auto& c = model_->config();
  if (params_.kv_block_size <= 0 || params_.kv_block_size > 64) {
    fail(StatusCode::kInvalidArgument, "engine: kv_block_size must be in [1, 64]");
  }
  if (params_.max_batch_tokens <= 0 || params_.max_batch_tokens > (1 << 16)) {
    fail(StatusCode::kInvalidArgument, "engine: max_batch_tokens must be in [1, 65536]");
  }
  if (params_.max_running <= 0 || params_.max_running > 4096) {
    fail(StatusCode::kInvalidArgument, "engine: max_running must be in [1, 4096]");
  }
  if (params_.n_threads < 0 || params_.n_threads > 1024) {
    fail(StatusCode::kInvalidArgument, "engine: n_threads must be in [0, 1024]");
  }
  const Architecture* arch = find_architecture(model_->architecture());
  if (!arch) fail(StatusCode::kUnsupported, "engine: architecture '" + model_->architecture() + "' is not supported");
  CreatedBackend created = create_backend(params_.device, BackendOptions{params_.n_threads, params_.batch_invariant});
  backend_ = std::move(created.backend);
  backend_extras_ = created.extras;
  if (backend_extras_) {
    const char* g = std::getenv("EMBER_CUDA_GRAPHS");
    use_graphs_ = g != nullptr && std::string(g) == "1";
  }
  device_ = created.device;
  check_backend_limits(*backend_, c.head_dim, c.n_heads, c.n_kv_heads);

  KvGeometry g = model_->kv_geometry(params_.kv_block_size);
  const uint64_t blocks = params_.kv_memory_bytes / g.bytes_per_block();
  if (blocks == 0) fail(StatusCode::kInvalidArgument, "engine: kv_memory_bytes is smaller than one KV block");
  if (blocks > (1u << 30)) fail(StatusCode::kInvalidArgument, "engine: kv_memory_bytes is absurdly large");
  g.num_blocks = static_cast<int32_t>(blocks);
  kv_ = std::make_unique<KvManager>(*backend_, g, model_->kv_groups(), params_.prefix_caching,
                                    KvManager::Rope{model_->rope_specs()});
  scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{params_.max_batch_tokens, params_.max_running});
  forward_ = arch->make_forward(model_, *backend_, g.block_size);
}

Engine::~Engine() {
  // The worker is gone (stopped by the last EngineOwner) before we get here.
  if (worker_.joinable()) worker_.detach();
}

std::shared_ptr<EngineOwner> Engine::create(std::shared_ptr<const Model> model, const EngineParams& params) {
  std::shared_ptr<Engine> engine(new Engine(std::move(model), params));
  if (!params.manual) engine->worker_ = std::thread(&Engine::worker_loop, engine);
  return std::make_shared<EngineOwner>(engine);
}

void Engine::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (!worker_.joinable()) return;
  if (std::this_thread::get_id() == worker_.get_id()) {
    worker_.detach();
  } else {
    worker_.join();
  }
}

void Engine::submit(const std::shared_ptr<Stream>& stream) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams_.push_back(stream);
  }
  cv_.notify_all();
}

SchedulerStats Engine::scheduler_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  SchedulerStats s = stats_;
  s.waiting = streams_.size() > s.running ? streams_.size() - s.running : 0;
  return s;
}

void Engine::worker_loop(std::shared_ptr<Engine> self) {
  Engine& e = *self;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(e.mutex_);
      e.cv_.wait(lock, [&] { return e.stop_ || !e.streams_.empty(); });
      if (e.stop_) break;
    }
    try {
      e.step();
    } catch (const std::exception& ex) {
      log(LogLevel::kError, "engine step failed: %s", ex.what());
    }
  }
  // Streams still queued end with an error so no consumer waits forever.
  std::vector<std::shared_ptr<Stream>> left;
  {
    std::lock_guard<std::mutex> lock(e.mutex_);
    left.swap(e.streams_);
  }
  for (auto& s : left) s->fail_with(StatusCode::kCancelled, "the engine was destroyed");
  left.clear();
  self.reset();  // may destroy the engine, on this thread
}

// A step's cost grows with its rows (one per token it runs) from a fixed
// part: cost(r) = fixed + per_row * r with fixed, per_row >= 0. So one step
// of s rows measured at C ms bounds every other step: cost(r) <= C for
// r <= s, and cost(r) <= C * r / s for r > s. The prediction is the tightest
// of these bounds over recent steps, each size at its slowest measurement
// (noise never makes a size look cheaper than it was), and a step costlier
// than a sample's bound drops that sample (measure_step). Nothing is
// extrapolated from a fit: a step larger than any measured is priced at the
// largest one's cost per row, which overestimates it by that step's fixed
// share. A step also runs at most twice the rows of the largest one measured,
// so a cost that grows faster than its rows is measured before it is relied
// on. (A least-squares fit over steps of 1 or 2 rows once sized a step at 89
// rows that took 138 ms of a 16 ms frame.)
namespace {
struct SizeCost {
  int32_t rows;
  double ms;  // the slowest recent step of these rows
};
template <typename Sample>
size_t slowest_per_size(const Sample* samples, size_t n, SizeCost* out) {
  size_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    size_t j = 0;
    while (j < m && out[j].rows != samples[i].rows) ++j;
    if (j == m) out[m++] = {samples[i].rows, samples[i].ms};
    out[j].ms = std::max(out[j].ms, samples[i].ms);
  }
  return m;
}
}  // namespace

int32_t Engine::frame_token_budget(double left_ms) {
  std::lock_guard<std::mutex> lock(cost_mutex_);
  if (cost_count_ == 0) return 1;  // nothing measured yet: one token (decodes still run)
  SizeCost sizes[kCostSamples];
  const size_t m = slowest_per_size(cost_samples_, cost_count_, sizes);
  // The largest r whose prediction fits: the bound of size s allows
  // s * left / C rows when C fits at all.
  double rows = 0;
  int32_t largest = 0;
  for (size_t i = 0; i < m; ++i) {
    largest = std::max(largest, sizes[i].rows);
    if (sizes[i].ms <= left_ms) rows = std::max(rows, sizes[i].rows * left_ms / std::max(sizes[i].ms, 1e-3));
  }
  return static_cast<int32_t>(std::min(std::floor(rows), std::min(2.0 * largest, 65536.0)));
}

void Engine::measure_step(size_t rows, double ms) {
  if (rows == 0) return;
  std::lock_guard<std::mutex> lock(cost_mutex_);
  const int32_t r = static_cast<int32_t>(std::min<size_t>(rows, 65536));
  // A step costlier than an older sample's bound refutes that sample (the
  // cost is not only rows: which sequences run and how long their histories
  // are count too): it predicts nothing any more.
  size_t keep = 0;
  for (size_t i = 0; i < cost_count_; ++i) {
    const StepCostSample& c = cost_samples_[i];
    const double bound = r <= c.rows ? c.ms : c.ms * r / c.rows;
    if (bound >= ms) cost_samples_[keep++] = c;
  }
  cost_count_ = keep;
  if (cost_count_ == kCostSamples) {  // the oldest goes
    std::copy(cost_samples_ + 1, cost_samples_ + kCostSamples, cost_samples_);
    --cost_count_;
  }
  cost_samples_[cost_count_++] = {r, ms};
}

size_t Engine::run_steps(double max_ms, int64_t max_tokens) {
  // A frame budget: each step runs only the tokens whose predicted cost fits
  // the time left, so a long prompt waiting is prefilled across frames
  // instead of taking one frame for itself, and a step starts only if its
  // predicted cost fits: a frame ends within max_ms plus the prediction's
  // error, or, when not even the running decodes fit the budget, one step.
  const auto t0 = std::chrono::steady_clock::now();
  size_t total = 0;
  for (bool first = true;; first = false) {
    int32_t budget = 0;
    if (max_ms > 0) {
      // Every running decode gets its token whatever the budget: at most as
      // many as the sequences the last step ran.
      int32_t decodes;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        decodes = static_cast<int32_t>(std::min<size_t>(stats_.running, 65536));
      }
      budget = frame_token_budget(max_ms - ms_since(t0));
      // After the first step, another one starts only if its decodes fit.
      if (!first && budget < std::max(decodes, 1)) break;
      // The first step of a frame runs at least one prompt token beside the
      // decodes, so a prompt waiting advances every frame, however small.
      if (first) budget = std::max(budget, decodes + 1);
    }
    if (max_tokens > 0) {
      const int64_t left = std::min<int64_t>(max_tokens - static_cast<int64_t>(total), 65536);
      budget = static_cast<int32_t>(budget > 0 ? std::min<int64_t>(budget, left) : left);
    }
    const auto ts = std::chrono::steady_clock::now();
    const size_t n = step(budget);
    measure_step(n, ms_since(ts));
    total += n;
    if (n == 0) break;
    if (max_tokens > 0 && static_cast<int64_t>(total) >= max_tokens) break;
    if (max_ms > 0 && ms_since(t0) >= max_ms) break;
  }
  return total;
}

void Engine::drop_finished_streams(std::vector<std::shared_ptr<Stream>>* live) {
  std::vector<std::shared_ptr<Stream>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t keep = 0;
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i]->finished()) {
        finished.push_back(std::move(streams_[i]));
      } else {
        if (keep != i) streams_[keep] = std::move(streams_[i]);
        ++keep;
      }
    }
    streams_.resize(keep);
    if (live) *live = streams_;
  }
  for (auto& s : finished) {
    if (s->drafter()) s->set_speculation(nullptr);
  }
  // Dropped outside mutex_: the last reference to a finished stream may
  // destroy its session and with it the engine's last owner, whose
  // stop_worker() takes mutex_. (The engine itself stays alive: whoever
  // steps it holds it.)
  finished.clear();
}

// ------------------------------------------------------------------ one step

// What the phases of one step hand each other.
struct Engine::StepWork {
  // gather: the live streams; stream i has sched().id == i.
  std::vector<Stream*> streams;
  std::vector<SchedSequence*> seqs;
  std::vector<KvManager::BudgetEntry> budget;
  // schedule
  StepPlan plan;
  // batch: one entry per scheduled stream.
  struct Entry {
    Stream* stream;
    int32_t chunk;
    int32_t logit_index;  // -1: no logits this step
    size_t first_logit;   // history index of the row at logit_index
    int32_t n_logit_rows;
    bool tree = false;  // a speculative tree: rows = its nodes (root first)
  };
  std::vector<Entry> entries;
  Batch batch;
  int32_t n_logits = 0;
};

void Engine::gather(const std::vector<std::shared_ptr<Stream>>& streams, StepWork& w) {
  for (const auto& sp : streams) {
    Stream& s = *sp;
    if (s.cancel_requested()) {
      s.finish(EndReason::kCancelled);
      continue;
    }
    KvSequence& kv = s.session().kv();
    std::lock_guard<std::mutex> lock(kv.mutex());
    s.sched().id = w.streams.size();
    kv_->describe(kv, s.sched());
    KvManager::BudgetEntry entry{&kv, SIZE_MAX};
    if (s.score_mode()) {
      // Scoring leaves the last token pending (its logits predict nothing
      // known), and every row whose logits are wanted is computed.
      s.sched().n_tokens = kv.tokens().size() - 1;
      entry.reuse_limit = s.score_first() == 0 ? 0 : s.score_first() - 1;
    }
    w.streams.push_back(&s);
    w.seqs.push_back(&s.sched());
    w.budget.push_back(entry);
  }
}

void Engine::schedule(StepWork& w, int32_t token_budget) {
  if (token_budget > 0) {
    // Every running decode keeps its token, whatever the budget.
    int32_t decodes = 0;
    for (const SchedSequence* s : w.seqs) decodes += s->running && s->n_tokens == s->n_computed + 1;
    token_budget = std::max(token_budget, decodes);
  }
  KvManager::StepBudget budget = kv_->step_budget(w.budget);
  // Draft models' KV in this pool is a cache of the target's history: it
  // goes before any sequence is preempted or kept waiting.
  budget.set_reclaim([&w] {
    bool freed = false;
    for (Stream* s : w.streams) {
      if (s->drafter() && s->drafter()->release_kv()) freed = true;
    }
    return freed;
  });
  w.plan = scheduler_->schedule(w.seqs, budget, token_budget);
  for (const auto& entry : budget.errors()) {
    const auto id = entry.first;
    const auto& error = entry.second;
    auto& run = w.plan.run;
    run.erase(std::remove_if(run.begin(), run.end(), [&](const auto& r) { return r.first->id == id; }), run.end());
    w.streams[id]->fail_with(error.code(), error.message());
  }
  for (SchedSequence* f : w.plan.failed) {
    w.streams[f->id]->fail_with(StatusCode::kOutOfMemory,
                                "the sequence needs more KV blocks than the whole pool holds (" +
                                    std::to_string(kv_->total_blocks()) + " blocks)");
  }
}

void Engine::build_batch(StepWork& w, int32_t token_budget) {
  // Speculative trees take what is left of the step's token budget.
  int64_t rows_left =
      (token_budget > 0 ? token_budget : params_.max_batch_tokens) - static_cast<int64_t>(w.plan.tokens());
  for (const auto& [seq, chunk] : w.plan.run) {
    Stream& s = *w.streams[seq->id];
    KvSequence& kv = s.session().kv();
    std::lock_guard<std::mutex> lock(kv.mutex());
    if (s.grower() && !s.score_mode() && chunk == 1 && kv.n_computed() + 1 == kv.tokens().size() && rows_left > 0 &&
        kv.provisional().empty()) {
      const size_t before = w.batch.tokens.size();
      if (add_tree(w, s, kv, static_cast<int32_t>(std::min<int64_t>(rows_left, 64)))) {
        rows_left -= static_cast<int64_t>(w.batch.tokens.size() - before) - 1;
        continue;
      }
    }
    const size_t end = kv.n_computed() + static_cast<size_t>(chunk);
    if (s.score_mode()) {
      const size_t from = std::max(kv.n_computed(), s.score_first() == 0 ? size_t{0} : s.score_first() - 1);
      const int32_t rows = end > from ? static_cast<int32_t>(end - from) : 0;
      kv_->add_rows(kv, w.batch, chunk, from);
      w.entries.push_back({&s, chunk, rows > 0 ? w.n_logits : -1, from, rows});
      w.n_logits += rows;
      continue;
    }
    // Logits only for the last history token: it predicts the next one.
    const bool last = end == kv.tokens().size();
    kv_->add_rows(kv, w.batch, chunk, last ? end - 1 : SIZE_MAX);
    w.entries.push_back({&s, chunk, last ? w.n_logits++ : -1, end - 1, last ? 1 : 0});
  }
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.steps++;
  stats_.running = w.entries.size();
  stats_.last_step_tokens = static_cast<size_t>(w.batch.n_rows());
  stats_.preempted = scheduler_->preemptions();
  stats_.reclaimed = scheduler_->reclaims();
}

bool Engine::run_forward(StepWork& w) {
  logits_.resize(static_cast<size_t>(w.n_logits) * model_->config().n_vocab);
  try {
    std::lock_guard<std::mutex> lock(forward_mutex_);
    // Decode-only steps on a device with graphs are recorded and replayed as
    // one CUDA graph (BackendExtras::graph_begin: results are those of eager
    // execution; the logits download ends the region).
    const bool graph = use_graphs_ && std::all_of(w.batch.seqs.begin(), w.batch.seqs.end(),
                                                  [](const BatchSeq& s) { return s.n_rows == 1; });
    if (graph) {
      backend_extras_->graph_begin((static_cast<uint64_t>(w.batch.n_rows()) << 32) |
                                   static_cast<uint32_t>(w.n_logits));
    }
    try {
      forward_->forward(w.batch, logits_.data());
    } catch (...) {
      if (graph) backend_extras_->graph_abort();
      throw;
    }
    if (graph) backend_extras_->graph_end();
    return true;
  } catch (const Error& e) {
    for (auto& en : w.entries) en.stream->fail_with(e.code(), e.message());
  } catch (const std::bad_alloc&) {
    for (auto& en : w.entries) en.stream->fail_with(StatusCode::kOutOfMemory, "out of memory in the forward pass");
  }
  return false;
}

void Engine::commit_and_sample(StepWork& w) {
  if (testing::g_step_fault_hook) testing::g_step_fault_hook();
  const Tokenizer& tok = model_->tokenizer();
  const int32_t n_vocab = model_->config().n_vocab;
  for (size_t i = 0; i < w.entries.size(); ++i) {
    auto& en = w.entries[i];
    if (en.tree) {
      commit_tree(w, i);
      continue;
    }
    Stream& s = *en.stream;
    KvSequence& kv = s.session().kv();
    std::vector<int32_t> history;
    bool scored_all = false;
    {
      std::lock_guard<std::mutex> lock(kv.mutex());
      kv_->commit_computed(kv, static_cast<size_t>(en.chunk));
      if (!s.started_decoding()) s.add_prompt_tokens(static_cast<size_t>(en.chunk));
      const std::vector<int32_t>& tokens = kv.tokens();
      if (s.score_mode()) {
        for (int32_t r = 0; r < en.n_logit_rows; ++r) {
          const size_t target = en.first_logit + static_cast<size_t>(r) + 1;  // history index predicted
          if (target >= tokens.size() || target < s.score_first()) continue;
          const float* row = logits_.data() + static_cast<size_t>(en.logit_index + r) * n_vocab;
          s.set_score(target, log_prob(row, n_vocab, tokens[target]));
        }
        scored_all = kv.n_computed() + 1 >= tokens.size();
      } else if (en.logit_index >= 0) {
        history = penalty_window(s, tokens);
      }
    }
    if (s.score_mode()) {
      if (s.cancel_requested()) {
        s.finish(EndReason::kCancelled);
      } else if (scored_all) {
        s.finish(EndReason::kNone);
      }
      continue;
    }
    if (en.logit_index < 0) continue;
    if (s.cancel_requested()) {
      s.finish(EndReason::kCancelled);
      continue;
    }
    float* row = logits_.data() + static_cast<size_t>(en.logit_index) * n_vocab;
    const int32_t token = s.sample(row, history);
    s.on_token(token, tok.is_eog(token));  // events: text, and end on a stop condition
  }
  // A finished stream's drafter gives back what it holds (a draft model's KV
  // in the pool) now, not when the host lets go of the stream.
  for (auto& en : w.entries) {
    if (en.stream->finished() && en.stream->drafter()) en.stream->set_speculation(nullptr);
  }
}

// ------------------------------------------------------------------ speculation

void Engine::prepare_speculation(Stream& stream) {
  const SpecParams& sp = stream.spec_params();
  const auto& c = model_->config();
  switch (sp.kind) {
    case SpecParams::Kind::kNone: return;
    case SpecParams::Kind::kNgram: stream.set_speculation(std::make_unique<speculative::NgramDrafter>()); return;
    case SpecParams::Kind::kSelf: {
      // The default from measured acceptance (docs/BENCHMARKS.md): early exits
      // below ~3/4 of SmolLM2's layers agree with the full model on under 20%
      // of tokens.
      const int32_t layers = sp.self_layers > 0 ? sp.self_layers : std::max(1, c.n_layers * 7 / 8);
      if (layers >= c.n_layers) {
        fail(StatusCode::kInvalidArgument,
             "speculation: self-speculation must use fewer layers than the model's " + std::to_string(c.n_layers));
      }
      stream.set_speculation(std::make_unique<speculative::SelfDrafter>(*forward_, forward_mutex_, *kv_, c, layers,
                                                                        sp.draft_lookup, sp.payoff_gate));
      return;
    }
    case SpecParams::Kind::kDraft: {
      speculative::check_same_vocabulary(*model_, *sp.draft_model);
      std::shared_ptr<speculative::DraftRunner> runner;
      {
        std::lock_guard<std::mutex> lock(draft_mutex_);
        for (const auto& r : draft_runners_) {
          if (&r->model() == sp.draft_model.get()) runner = r;
        }
        if (!runner) {
          // In this engine's pool when the backend can hold the draft's rows
          // there; else a backend and pool of its own.
          try {
            runner = std::make_shared<speculative::DraftRunner>(sp.draft_model, *backend_, kv_->pool(), forward_mutex_);
          } catch (const Error& e) {
            if (e.code() != StatusCode::kUnsupported) throw;
            log(LogLevel::kInfo, "speculation: the draft model's KV gets a pool of its own (%s)", e.what());
            runner = std::make_shared<speculative::DraftRunner>(sp.draft_model, params_.device, params_.n_threads,
                                                                params_.batch_invariant);
          }
          draft_runners_.push_back(runner);
        }
      }
      stream.set_speculation(
          std::make_unique<speculative::DraftModelDrafter>(runner, stream.session().policy(), stream.session().n_ctx(),
                                                           model_->config(), sp.draft_lookup, sp.payoff_gate));
      return;
    }
  }
}

bool Engine::add_tree(StepWork& w, Stream& s, KvSequence& kv, int32_t max_nodes) {
  speculative::TreeGrower& grower = *s.grower();
  // Room: the step's budget, the cache policy's next eviction, a full
  // session's context (the root and every drafted depth must fit it), and
  // what the stream may still emit.
  size_t room = std::min<size_t>(static_cast<size_t>(max_nodes), kv_->tree_room(kv));
  if (!kv.bounded()) {
    const size_t n_ctx = static_cast<size_t>(s.session().n_ctx());
    const size_t used = kv.tokens().size() + 1;  // the history and the token this step emits at least
    room = std::min(room, n_ctx > used ? n_ctx - used : 0);
  }
  room = std::min<size_t>(room, static_cast<size_t>(std::max(s.tokens_left() - 1, 0)));
  room = std::min<size_t>(room, static_cast<size_t>(grower.params().max_nodes));
  if (room == 0) return false;
  if (!kv_->reserve_tree(kv, room)) {
    kv_->rollback_provisional(kv);
    return false;
  }
  grower.start(kv.tokens().back(), static_cast<int32_t>(room));
  speculative::Drafter& drafter = *s.drafter();
  std::vector<speculative::Candidate> cands;
  const int32_t max_candidates = std::max(1, static_cast<int32_t>(1.0f / grower.params().threshold));
  try {
    for (int32_t leaf; (leaf = grower.next_leaf()) >= 0;) {
      drafter.propose(kv, grower.tree(), leaf, max_candidates, cands);
      grower.extend(leaf, cands);
    }
    drafter.finish_tree(kv);
  } catch (const std::exception& e) {
    // A drafter that fails (its own KV pool full, say) ends speculation for
    // this stream, which goes on decoding plainly; nothing else is affected.
    log(LogLevel::kWarn, "speculation stopped for a stream: %s", e.what());
    try {
      drafter.finish_tree(kv);
    } catch (...) {}
    kv_->rollback_provisional(kv);
    s.set_speculation(nullptr);
    return false;
  }
  const speculative::DraftTree& tree = grower.tree();
  if (tree.drafted() == 0) {
    kv_->rollback_provisional(kv);
    return false;
  }
  std::vector<int32_t> rows(static_cast<size_t>(tree.size()));
  for (int32_t i = 0; i < tree.size(); ++i) rows[static_cast<size_t>(i)] = i;
  kv_->add_tree_rows(kv, w.batch, tree.token, tree.parent, rows);
  StepWork::Entry en{&s, 1, w.n_logits, kv.tokens().size() - 1, tree.size()};
  en.tree = true;
  w.entries.push_back(en);
  w.n_logits += tree.size();
  return true;
}

void Engine::commit_tree(StepWork& w, size_t i) {
  const auto& en = w.entries[i];
  Stream& s = *en.stream;
  KvSequence& kv = s.session().kv();
  const Tokenizer& tok = model_->tokenizer();
  const int32_t n_vocab = model_->config().n_vocab;
  speculative::TreeGrower& grower = *s.grower();
  const speculative::DraftTree& tree = grower.tree();
  std::vector<int32_t> history;
  {
    std::lock_guard<std::mutex> lock(kv.mutex());
    kv_->commit_computed(kv, 1);  // the root
    if (!s.started_decoding()) s.add_prompt_tokens(1);
    if (s.cancel_requested()) {
      kv_->rollback_provisional(kv);
    } else {
      history = penalty_window(s, kv.tokens());
    }
  }
  if (s.cancel_requested()) {
    s.finish(EndReason::kCancelled);
    return;
  }
  Sampler& sampler = s.sampler();
  std::vector<std::pair<int32_t, double>> dist;
  auto target = [&](int32_t node) {
    std::vector<int32_t> h = history;
    for (int32_t t : tree.path_tokens(node)) h.push_back(t);
    float* row = logits_.data() + static_cast<size_t>(en.logit_index + node) * n_vocab;
    sampler.distribution(row, h, dist);
    return dist;
  };
  const speculative::Acceptance acc = speculative::accept_tree(tree, sampler.greedy(), std::max(s.tokens_left(), 1),
                                                               target, [&] { return sampler.uniform(); });
  bool kept = false;  // the accepted path's tokens and KV joined the history
  {
    std::lock_guard<std::mutex> lock(kv.mutex());
    const std::vector<int32_t> node_tokens(tree.token.begin() + 1, tree.token.end());
    // (append_provisional only names the nodes: their slots are reserved.)
    if (!acc.path.empty() && kv_->append_provisional(kv, node_tokens)) {
      std::vector<int32_t> path;  // provisional indices
      for (int32_t node : acc.path) path.push_back(node - 1);
      kv_->commit_provisional(kv, path, /*generated=*/true);
      kept = true;
    } else {
      kv_->rollback_provisional(kv);
    }
  }
  s.drafter()->verified(tree, kept ? acc.path : std::vector<int32_t>{});
  const size_t n_kept = kept ? acc.path.size() : 0;
  grower.verified(static_cast<int32_t>(n_kept), kept ? acc.path.back() : 0);
  s.record_verification(static_cast<size_t>(tree.drafted()), n_kept);
  for (size_t j = 0; j < n_kept; ++j) {
    const int32_t t = acc.tokens[j];
    s.on_committed_token(t, tok.is_eog(t), n_kept - 1 - j);
    if (s.finished()) return;
  }
  // The target's own next token (or, if the path could not be kept, the
  // first accepted token) is the pending one, as in a plain decode.
  const int32_t next = kept || acc.path.empty() ? acc.tokens.back() : acc.tokens.front();
  s.on_token(next, tok.is_eog(next));
}

size_t Engine::step(int32_t token_budget) {
  std::lock_guard<std::mutex> step_lock(step_mutex_);
  std::vector<std::shared_ptr<Stream>> streams;
  drop_finished_streams(&streams);
  // Streams that end in this step leave the queue at its end too: in manual
  // mode no later step may come, and a queued stream holds its session (and
  // the session its engine), which would never be freed.
  struct DropAtEnd {
    Engine& e;
    ~DropAtEnd() { e.drop_finished_streams(nullptr); }
  } drop_at_end{*this};
  if (streams.empty()) return 0;

  // A failure anywhere in the step ends every stream of the step with an
  // ERROR event: no consumer is left waiting, and the engine goes on.
  try {
    StepWork w;
    gather(streams, w);
    schedule(w, token_budget);
    build_batch(w, token_budget);
    if (w.entries.empty()) {
      // Nothing could run (every sequence waits for blocks): let others finish.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return 0;
    }
    if (run_forward(w)) commit_and_sample(w);
    return static_cast<size_t>(w.batch.n_rows());
  } catch (const Error& e) {
    fail_streams(streams, e.code(), "engine step failed: " + e.message());
  } catch (const std::bad_alloc&) {
    fail_streams(streams, StatusCode::kOutOfMemory, "engine step failed: out of memory");
  } catch (const std::exception& e) {
    fail_streams(streams, StatusCode::kInternal, std::string("engine step failed: ") + e.what());
  } catch (...) {
    fail_streams(streams, StatusCode::kInternal, "engine step failed: unknown exception");
  }
  log(LogLevel::kError, "engine: a step failed; its streams ended with an error");
  return 0;
}

void Engine::fail_streams(const std::vector<std::shared_ptr<Stream>>& streams, StatusCode code,
                          const std::string& message) {
  for (const auto& s : streams) {
    try {
      s->fail_with(code, message);
    } catch (...) {  // never leave the others waiting
    }
  }
}

namespace testing {
void (*g_step_fault_hook)() = nullptr;
}  // namespace testing

// ------------------------------------------------------------------ scoring

void Engine::score(const int32_t* tokens, size_t n, float* logprobs, float* logits) {
  const auto& c = model_->config();
  if (n < 1) fail(StatusCode::kInvalidArgument, "score: need at least one token");
  if (n > static_cast<size_t>(c.n_ctx_train)) {
    fail(StatusCode::kContextFull,
         "score: " + std::to_string(n) + " tokens exceed the model's context (" + std::to_string(c.n_ctx_train) + ")");
  }
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) fail(StatusCode::kInvalidArgument, "score: token id out of range");
  }
  // A private sequence, never indexed in the prefix cache.
  std::unique_ptr<KvSequence> seq = kv_->create(CachePolicy{}, c.n_ctx_train, c.n_ctx_train);
  std::lock_guard<std::mutex> seq_lock(seq->mutex());
  kv_->append(*seq, tokens, n, /*generated=*/false);
  if (!kv_->reserve_scratch(*seq, n)) {
    fail(StatusCode::kOutOfMemory, "score: the KV pool cannot hold " + std::to_string(n) + " tokens now");
  }
  struct Release {
    KvManager& kv;
    KvSequence& seq;
    ~Release() { kv.release(seq); }
  } release{*kv_, *seq};
  const size_t chunk = static_cast<size_t>(params_.max_batch_tokens);
  std::vector<float> buf;
  for (size_t start = 0; start < n; start += chunk) {
    const size_t m = std::min(chunk, n - start);
    Batch batch;
    kv_->add_rows(*seq, batch, static_cast<int32_t>(m), 0);  // logits for every row
    buf.resize(m * c.n_vocab);
    {
      std::lock_guard<std::mutex> lock(forward_mutex_);
      forward_->forward(batch, buf.data());
    }
    kv_->commit_computed(*seq, m, /*index=*/false);
    for (size_t i = 0; i < m; ++i) {
      const float* row = buf.data() + i * c.n_vocab;
      const size_t pos = start + i;
      if (logits) std::copy(row, row + c.n_vocab, logits + pos * c.n_vocab);
      if (logprobs && pos + 1 < n) logprobs[pos] = log_prob(row, c.n_vocab, tokens[pos + 1]);
    }
  }
}

}  // namespace ember
