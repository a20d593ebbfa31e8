#include "core/engine/engine.h"

#include <algorithm>
#include <cmath>

#include "core/backend/plugin.h"
#include "core/engine/batch.h"
#include "core/model/llama.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/log.h"

namespace ember {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

// ------------------------------------------------------------------ Engine

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
  if (params_.device == "cpu") {
    backend_ = make_cpu_backend(params_.n_threads, params_.batch_invariant);
  } else {
    try {
      LoadedBackend lb = open_backend_plugin(params_.device == "auto" ? "cuda" : params_.device, params_.n_threads);
      backend_ = std::move(lb.backend);
      backend_extras_ = lb.extras;
      if (backend_extras_) backend_extras_->set_batch_invariant(params_.batch_invariant);
    } catch (const Error& e) {
      if (params_.device != "auto") throw;
      log(LogLevel::kInfo, "engine: %s; running on the CPU", e.what());
      backend_ = make_cpu_backend(params_.n_threads, params_.batch_invariant);
    }
  }
  KvGeometry g;
  g.num_layers = c.n_layers;
  g.num_kv_heads = c.n_kv_heads;
  g.head_dim = c.head_dim;
  g.block_size = params_.kv_block_size;
  const uint64_t blocks = params_.kv_memory_bytes / g.bytes_per_block();
  if (blocks == 0) fail(StatusCode::kInvalidArgument, "engine: kv_memory_bytes is smaller than one KV block");
  if (blocks > (1u << 30)) fail(StatusCode::kInvalidArgument, "engine: kv_memory_bytes is absurdly large");
  g.num_blocks = static_cast<int32_t>(blocks);
  cache_ = std::make_unique<KvCache>(*backend_, g, params_.prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(SchedulerConfig{params_.max_batch_tokens, params_.max_running});
  forward_ = std::make_unique<LlamaForward>(model_, *backend_, g.block_size);
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

// The scheduler's window on the cache: sequences are streams' sessions.
class Engine::Budget final : public KvBudget {
 public:
  Budget(KvCache& cache, std::vector<Stream*>& by_index) : cache_(cache), streams_(by_index) {}
  bool allocate(SchedSequence& seq, size_t n_slots) override {
    Session& se = session(seq);
    std::lock_guard<std::mutex> lock(se.mutex_);
    // n_slots counts history tokens; a bounded policy maps them to fewer slots.
    if (se.bounded()) {
      try {
        return se.make_room_locked(n_slots - std::min(n_slots, se.n_cached_));
      } catch (const Error& e) {  // the stream fails after scheduling; its state is unchanged
        errors_.emplace_back(streams_[seq.id], e);
        return false;
      }
    }
    if (!cache_.reserve(se.block_table_, static_cast<int32_t>(n_slots))) return false;
    return cache_.prepare_write(se.block_table_, static_cast<int32_t>(se.n_cached_));
  }
  void free(SchedSequence& seq) override {
    Session& se = session(seq);
    std::lock_guard<std::mutex> lock(se.mutex_);
    // A session that evicted tokens cannot recompute its cache: it is never
    // preempted (SchedSequence::preemptible) and its pool share was checked
    // when it was created, so it keeps its blocks.
    if (se.bounded() && se.layout_.shifted()) return;
    cache_.release(se.block_table_);
    se.n_cached_ = 0;
    seq.n_computed = 0;
  }
  void admit(SchedSequence& seq) override {
    const Stream& st = *streams_[seq.id];
    Session& se = session(seq);
    std::lock_guard<std::mutex> lock(se.mutex_);
    if (!se.block_table_.empty() || se.tokens_.empty()) return;
    // Reuse cached full blocks, leaving at least the last token to compute
    // (and, when scoring, every token whose logits are wanted); a bounded
    // session takes at most its cache size.
    const size_t bs = static_cast<size_t>(cache_.block_size());
    size_t max_blocks = (se.tokens_.size() - 1) / bs;
    if (st.score_mode_) max_blocks = std::min(max_blocks, st.score_first_ == 0 ? 0 : (st.score_first_ - 1) / bs);
    if (se.bounded()) max_blocks = std::min(max_blocks, static_cast<size_t>(se.policy_.capacity()) / bs);
    se.block_table_ = cache_.match_prefix(se.tokens_.data(), se.tokens_.size(), max_blocks, true, se.decoded_.data());
    se.n_cached_ = se.block_table_.size() * static_cast<size_t>(cache_.block_size());
    seq.n_computed = se.n_cached_;
    if (se.bounded()) seq.max_chunk = static_cast<size_t>(se.layout_.chunk_limit(static_cast<int64_t>(se.n_cached_)));
  }
  size_t capacity_slots() const override { return cache_.total_blocks() * static_cast<size_t>(cache_.block_size()); }

 private:
  Session& session(const SchedSequence& seq) { return *streams_[seq.id]->session_; }

 public:
  std::vector<std::pair<Stream*, Error>> errors_;  // allocations that failed with an error

 private:
  KvCache& cache_;
  std::vector<Stream*>& streams_;
};

size_t Engine::run_steps(double max_ms, int64_t max_tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  size_t total = 0;
  for (;;) {
    const size_t n = step();
    total += n;
    if (n == 0) break;
    if (max_tokens > 0 && static_cast<int64_t>(total) >= max_tokens) break;
    if (max_ms > 0 && ms_between(t0, std::chrono::steady_clock::now()) >= max_ms) break;
  }
  return total;
}

void Engine::drop_finished_streams(std::vector<std::shared_ptr<Stream>>* live) {
  std::vector<std::shared_ptr<Stream>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t keep = 0;
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i]->finished_flag()) {
        finished.push_back(std::move(streams_[i]));
      } else {
        if (keep != i) streams_[keep] = std::move(streams_[i]);
        ++keep;
      }
    }
    streams_.resize(keep);
    if (live) *live = streams_;
  }
  // Dropped outside mutex_: the last reference to a finished stream may
  // destroy its session and with it the engine's last owner, whose
  // stop_worker() takes mutex_. (The engine itself stays alive: whoever
  // steps it holds it.)
  finished.clear();
}

size_t Engine::step() {
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
  const Tokenizer& tok = model_->tokenizer();
  const int32_t n_vocab = model_->config().n_vocab;

  // Refresh the scheduler's view of every live stream (sched_.id indexes `by_index`).
  std::vector<Stream*> by_index;
  std::vector<SchedSequence*> seqs;
  for (auto& sp : streams) {
    Stream& s = *sp;
    if (s.cancel_requested_) {
      s.finish(EndReason::kCancelled);
      continue;
    }
    Session& se = *s.session_;
    std::lock_guard<std::mutex> lock(se.mutex_);
    s.sched_.id = by_index.size();
    se.fill_sched_locked(s.sched_);
    // Scoring leaves the last token pending (its logits predict nothing known).
    if (s.score_mode_) s.sched_.n_tokens = se.tokens_.size() - 1;
    by_index.push_back(&s);
    seqs.push_back(&s.sched_);
  }
  Budget budget(*cache_, by_index);
  StepPlan plan = scheduler_->schedule(seqs, budget);
  for (auto& [stream, error] : budget.errors_) {
    for (auto it = plan.run.begin(); it != plan.run.end(); ++it) {
      if (by_index[it->first->id] == stream) {
        plan.run.erase(it);
        break;
      }
    }
    stream->fail_with(error.code(), error.message());
  }
  for (SchedSequence* f : plan.failed) {
    by_index[f->id]->fail_with(StatusCode::kOutOfMemory,
                               "the sequence needs more KV blocks than the whole pool holds (" +
                                   std::to_string(cache_->total_blocks()) + " blocks)");
  }

  struct Entry {
    Stream* stream;
    int32_t chunk;
    int32_t logit_index;  // -1: no logits this step
    size_t first_logit;   // history index of the row at logit_index
    int32_t n_logit_rows;
  };
  std::vector<Entry> entries;
  Batch batch;
  int32_t n_logits = 0;
  for (const auto& [seq, chunk] : plan.run) {
    Stream& s = *by_index[seq->id];
    Session& se = *s.session_;
    std::lock_guard<std::mutex> lock(se.mutex_);
    const size_t end = se.n_cached_ + static_cast<size_t>(chunk);
    if (s.score_mode_) {
      const size_t from = std::max(se.n_cached_, s.score_first_ == 0 ? size_t{0} : s.score_first_ - 1);
      const int32_t rows = end > from ? static_cast<int32_t>(end - from) : 0;
      se.add_rows_locked(batch, chunk, from);
      entries.push_back({&s, chunk, rows > 0 ? n_logits : -1, from, rows});
      n_logits += rows;
      continue;
    }
    const bool last = end == se.tokens_.size();
    if (se.bounded()) {
      se.add_rows_locked(batch, chunk, last ? end - 1 : SIZE_MAX);
    } else {
      batch.add_sequence(se.tokens_.data() + se.n_cached_, chunk, static_cast<int32_t>(se.n_cached_),
                         se.block_table_, last, false, se.decoded_.data() + se.n_cached_);
    }
    entries.push_back({&s, chunk, last ? n_logits++ : -1, end - 1, last ? 1 : 0});
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.steps++;
    stats_.running = entries.size();
    stats_.last_step_tokens = static_cast<size_t>(batch.n_rows());
    stats_.preempted = scheduler_->preemptions();
  }
  if (entries.empty()) {
    // Nothing could run (every sequence waits for blocks): let others finish.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return 0;
  }

  logits_.resize(static_cast<size_t>(n_logits) * n_vocab);
  try {
    std::lock_guard<std::mutex> lock(forward_mutex_);
    forward_->forward(batch, logits_.data());
  } catch (const Error& e) {
    for (auto& en : entries) en.stream->fail_with(e.code(), e.message());
    return static_cast<size_t>(batch.n_rows());
  } catch (const std::bad_alloc&) {
    for (auto& en : entries) en.stream->fail_with(StatusCode::kOutOfMemory, "out of memory in the forward pass");
    return static_cast<size_t>(batch.n_rows());
  }

  for (auto& en : entries) {
    Stream& s = *en.stream;
    Session& se = *s.session_;
    std::vector<int32_t> history;
    bool scored_all = false;
    {
      std::lock_guard<std::mutex> lock(se.mutex_);
      se.n_cached_ += static_cast<size_t>(en.chunk);
      // Blocks of a session that evicted tokens hold K/V at moved positions
      // and computed without the evicted context: never indexed.
      if (!se.layout_.shifted()) cache_->commit(se.block_table_, se.tokens_.data(), se.n_cached_, se.decoded_.data());
      if (!s.started_decoding_) s.stats_prompt_add(en.chunk);
      if (s.score_mode_) {
        for (int32_t r = 0; r < en.n_logit_rows; ++r) {
          const size_t target = en.first_logit + static_cast<size_t>(r) + 1;  // history index predicted
          if (target >= se.tokens_.size() || target < s.score_first_) continue;
          const float* row = logits_.data() + static_cast<size_t>(en.logit_index + r) * n_vocab;
          const float mx = *std::max_element(row, row + n_vocab);
          double sum = 0.0;
          for (int32_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
          s.scores_[target - s.score_first_] = static_cast<float>(row[se.tokens_[target]] - mx - std::log(sum));
        }
        scored_all = se.n_cached_ + 1 >= se.tokens_.size();
      } else if (en.logit_index >= 0) {
        // The sampler reads only the penalty window of the history.
        const int32_t last_n = s.params_.sampling.penalty_last_n;
        const size_t n = se.tokens_.size();
        const size_t keep = last_n < 0 ? n : std::min(n, static_cast<size_t>(last_n));
        history.assign(se.tokens_.end() - static_cast<std::ptrdiff_t>(keep), se.tokens_.end());
      }
    }
    if (s.score_mode_) {
      if (s.cancel_requested_) {
        s.finish(EndReason::kCancelled);
      } else if (scored_all) {
        s.finish(EndReason::kNone);
      }
      continue;
    }
    if (en.logit_index < 0) continue;
    if (s.cancel_requested_) {
      s.finish(EndReason::kCancelled);
      continue;
    }
    float* row = logits_.data() + static_cast<size_t>(en.logit_index) * n_vocab;
    const int32_t token = s.sampler_.sample(row, history);
    s.on_token(token, tok.is_eog(token));
  }
  return static_cast<size_t>(batch.n_rows());
}

void Engine::score(const int32_t* tokens, size_t n, float* logprobs, float* logits) {
  const auto& c = model_->config();
  if (n < 1) fail(StatusCode::kInvalidArgument, "score: need at least one token");
  if (n > static_cast<size_t>(c.n_ctx_train)) {
    fail(StatusCode::kContextFull, "score: " + std::to_string(n) + " tokens exceed the model's context (" +
                                       std::to_string(c.n_ctx_train) + ")");
  }
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) fail(StatusCode::kInvalidArgument, "score: token id out of range");
  }
  std::vector<int32_t> table;
  if (!cache_->reserve(table, static_cast<int32_t>(n))) {
    fail(StatusCode::kOutOfMemory, "score: the KV pool cannot hold " + std::to_string(n) + " tokens now");
  }
  struct Release {
    KvCache& cache;
    std::vector<int32_t>& table;
    ~Release() { cache.release(table); }
  } release{*cache_, table};
  const size_t chunk = static_cast<size_t>(params_.max_batch_tokens);
  std::vector<float> buf;
  for (size_t start = 0; start < n; start += chunk) {
    const size_t m = std::min(chunk, n - start);
    Batch batch;
    batch.add_sequence(tokens + start, static_cast<int32_t>(m), static_cast<int32_t>(start), table, false, true);
    buf.resize(m * c.n_vocab);
    {
      std::lock_guard<std::mutex> lock(forward_mutex_);
      forward_->forward(batch, buf.data());
    }
    for (size_t i = 0; i < m; ++i) {
      const float* row = buf.data() + i * c.n_vocab;
      const size_t pos = start + i;
      if (logits) std::copy(row, row + c.n_vocab, logits + pos * c.n_vocab);
      if (logprobs && pos + 1 < n) {
        const float mx = *std::max_element(row, row + c.n_vocab);
        double sum = 0.0;
        for (int32_t v = 0; v < c.n_vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
        logprobs[pos] = static_cast<float>(row[tokens[pos + 1]] - mx - std::log(sum));
      }
    }
  }
}

// ------------------------------------------------------------------ Session

Session::Session(std::shared_ptr<EngineOwner> engine, int32_t n_ctx, const std::string& system_prompt,
                 int32_t priority, CachePolicy policy)
    : engine_(std::move(engine)), priority_(priority), policy_(policy) {
  const int32_t train = (*engine_)->model().config().n_ctx_train;
  if (n_ctx < 0) fail(StatusCode::kInvalidArgument, "session: n_ctx must be >= 0");
  n_ctx_ = n_ctx == 0 ? train : std::min(n_ctx, train);
  if (policy_.bounded()) {
    KvCache& cache = (*engine_)->cache();
    if (!cache.supports_cache_policies()) {
      fail(StatusCode::kUnsupported, "session: the " + cache.backend_name() +
                                         " backend does not support window/sink cache policies yet");
    }
    if (policy_.kind == CachePolicyKind::kWindow) policy_.sink_tokens = 0;
    if (policy_.window_tokens == 0) policy_.window_tokens = n_ctx_ - policy_.sink_tokens;
    policy_.validate(cache.block_size(), train);
    layout_ = StreamingLayout(policy_.sink_tokens, policy_.window_tokens, cache.block_size());
    // It holds its blocks for its whole life and can never be preempted once
    // it has evicted, so the pool must be able to hold all of them.
    const size_t blocks = (static_cast<size_t>(layout_.max_slots()) + cache.block_size() - 1) / cache.block_size();
    if (blocks > cache.total_blocks()) {
      fail(StatusCode::kOutOfMemory, "session: the cache policy needs " + std::to_string(blocks) +
                                         " KV blocks but the pool has " + std::to_string(cache.total_blocks()));
    }
  }
  if (!system_prompt.empty()) {
    messages_.push_back({"system", system_prompt});
    mode_ = Mode::kChat;
  }
}

Session::~Session() {
  std::lock_guard<std::mutex> lock(mutex_);
  (*engine_)->cache().release(block_table_);
}

void Session::require_idle_locked() const {
  if (busy_) fail(StatusCode::kBusy, "the session is running a stream");
}

void Session::add_message(const std::string& role, const std::string& content) {
  if (role.empty()) fail(StatusCode::kInvalidArgument, "add_message: empty role");
  const Model& model = (*engine_)->model();
  if (!model.chat_template()) fail(StatusCode::kUnsupported, model.chat_template_error());
  std::lock_guard<std::mutex> lock(mutex_);
  require_idle_locked();
  if (mode_ == Mode::kText) {
    fail(StatusCode::kInvalidArgument, "add_message: the session holds raw text; reset it before chatting");
  }
  mode_ = Mode::kChat;
  messages_.push_back({role, content});
}

void Session::add_text(const std::string& text, bool parse_special) {
  const Tokenizer& tok = (*engine_)->model().tokenizer();
  std::lock_guard<std::mutex> lock(mutex_);
  require_idle_locked();
  if (mode_ == Mode::kChat) {
    fail(StatusCode::kInvalidArgument, "add_text: the session holds chat messages; reset it first");
  }
  append_tokens_locked(tok.encode(text, tokens_.empty(), parse_special));
}

void Session::add_tokens(std::vector<int32_t> ids) {
  const int32_t n_vocab = (*engine_)->model().config().n_vocab;
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab) fail(StatusCode::kInvalidArgument, "add_tokens: token id " + std::to_string(id) + " out of range");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  require_idle_locked();
  if (mode_ == Mode::kChat) {
    fail(StatusCode::kInvalidArgument, "add_tokens: the session holds chat messages; reset it first");
  }
  append_tokens_locked(ids);
}

void Session::append_tokens_locked(const std::vector<int32_t>& ids) {
  if (!bounded() && tokens_.size() + ids.size() > static_cast<size_t>(n_ctx_)) {
    fail(StatusCode::kContextFull, std::to_string(tokens_.size() + ids.size()) +
                                       " tokens exceed the session's context of " + std::to_string(n_ctx_));
  }
  mode_ = Mode::kText;
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  decoded_.resize(tokens_.size(), 0);
}

void Session::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  require_idle_locked();
  (*engine_)->cache().release(block_table_);
  tokens_.clear();
  decoded_.clear();
  n_cached_ = 0;
  messages_.clear();
  mode_ = Mode::kEmpty;
  if (bounded()) layout_ = StreamingLayout(policy_.sink_tokens, policy_.window_tokens, layout_.block_size());
  max_position_ = -1;
}

void Session::cancel_active() {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = active_.lock();
  }
  if (s) s->cancel();
}

size_t Session::token_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tokens_.size();
}

// Between turns a session pins no KV memory, so idle conversations can never
// starve running ones: with prefix caching its full blocks stay in the pool's
// index (evictable, oldest first) and the next turn finds them again through
// the prefix cache; without it, the next turn recomputes.
//
// Window/sink sessions keep their blocks instead: their footprint is bounded
// (S + W tokens), and once they have evicted tokens their cache could not be
// found again nor recomputed.
void Session::park_locked() {
  if (bounded()) return;
  KvCache& cache = (*engine_)->cache();
  cache.commit(block_table_, tokens_.data(), n_cached_, decoded_.data());
  cache.release(block_table_);
  n_cached_ = 0;
}

void Session::truncate_cache_locked(size_t n) {
  if (n < n_cached_ && bounded()) {
    if (!layout_.can_truncate(static_cast<int64_t>(n))) {
      fail(StatusCode::kUnsupported, "the session's history changed at token " + std::to_string(n) +
                                         ", which its cache policy has already evicted");
    }
    n_cached_ = n;
    (*engine_)->cache().truncate(block_table_, layout_.kv_len(static_cast<int64_t>(n)));
    return;
  }
  if (n < n_cached_) {
    n_cached_ = n;
    (*engine_)->cache().truncate(block_table_, static_cast<int32_t>(n));
  }
}

// Re-renders the conversation with the generation prompt and keeps the
// longest common token prefix with what is already cached.
void Session::sync_chat_tokens_locked() {
  const Model& model = (*engine_)->model();
  const Tokenizer& tok = model.tokenizer();
  ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  if (tok.bos() >= 0) opts.bos_token = tok.token_to_piece(tok.bos());
  if (tok.eos() >= 0) opts.eos_token = tok.token_to_piece(tok.eos());
  const std::string text = model.chat_template()->apply(messages_, opts);
  std::vector<int32_t> ids = tok.encode(text, true, true);
  size_t common = 0;
  while (common < ids.size() && common < tokens_.size() && ids[common] == tokens_[common]) ++common;
  truncate_cache_locked(common);
  tokens_ = std::move(ids);
  decoded_.resize(common);  // the kept prefix keeps its flags; the re-rendered rest is prompt
  decoded_.resize(tokens_.size(), 0);
}

std::shared_ptr<Stream> Session::start(const StreamParams& params) {
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    require_idle_locked();
    if (mode_ == Mode::kChat) sync_chat_tokens_locked();
    if (tokens_.empty()) fail(StatusCode::kInvalidArgument, "stream_start: the session is empty; add a message or text first");
    if (!bounded() && tokens_.size() >= static_cast<size_t>(n_ctx_)) {
      fail(StatusCode::kContextFull, "stream_start: the prompt (" + std::to_string(tokens_.size()) +
                                         " tokens) fills the session's context of " + std::to_string(n_ctx_));
    }
    KvCache& cache = (*engine_)->cache();
    size_t need_slots = tokens_.size() + 1;
    if (bounded()) need_slots = std::min(need_slots, static_cast<size_t>(layout_.max_slots()));
    const size_t need_blocks = (need_slots + cache.block_size() - 1) / cache.block_size();
    if (need_blocks > cache.stats().blocks_total) {
      fail(StatusCode::kOutOfMemory, "stream_start: the prompt needs " + std::to_string(need_blocks) +
                                         " KV blocks but the pool has " + std::to_string(cache.stats().blocks_total));
    }
    // The last token must be run again to get logits if everything is cached.
    if (n_cached_ >= tokens_.size()) truncate_cache_locked(tokens_.size() - 1);
    const size_t prompt = tokens_.size() - n_cached_;
    stream = std::make_shared<Stream>(shared_from_this(), params, prompt);
    stream->sched_.priority = priority_;
    stream->sched_.arrival = (*engine_)->next_arrival();
    busy_ = true;
    active_ = stream;
  }
  (*engine_)->submit(stream);
  return stream;
}

void Session::fill_sched_locked(SchedSequence& seq) const {
  seq.n_tokens = tokens_.size();
  seq.n_computed = n_cached_;
  seq.running = !block_table_.empty();
  seq.max_chunk = bounded() ? static_cast<size_t>(layout_.chunk_limit(static_cast<int64_t>(n_cached_))) : 0;
  seq.max_slots = bounded() ? static_cast<size_t>(layout_.max_slots()) : 0;
  seq.preemptible = !(bounded() && layout_.shifted());
}

bool Session::make_room_locked(size_t n_new) {
  Engine& engine = **engine_;
  KvCache& cache = engine.cache();
  const int32_t bs = cache.block_size();
  const int64_t done = static_cast<int64_t>(n_cached_);
  const StreamingLayout::Eviction ev = layout_.plan(done, static_cast<int32_t>(n_new));
  if (ev.any()) {
    // The kept window moves to lower positions: its blocks must be private
    // (a shared one is copied) and leave the prefix index before the K-shift.
    if (!cache.prepare_write(block_table_, ev.first_block * bs)) return false;
    // Shift the blocks that stay (those after the dropped ones, up to the
    // last written slot) first: if the backend fails, nothing has changed.
    const size_t used = (static_cast<size_t>(layout_.kv_len(done)) + bs - 1) / bs;
    std::vector<int32_t> window;
    for (size_t i = static_cast<size_t>(ev.first_block + ev.dropped_blocks); i < std::min(used, block_table_.size()); ++i) {
      window.push_back(block_table_[i]);
    }
    const auto& c = engine.model().config();
    cache.shift_keys(window, -ev.shift, c.rope_dim, c.rope_freq_base);
    cache.drop_blocks(block_table_, static_cast<size_t>(ev.first_block), static_cast<size_t>(ev.dropped_blocks));
    layout_.apply(ev);
  }
  if (!cache.reserve(block_table_, layout_.kv_len(done + static_cast<int64_t>(n_new)))) return false;
  return cache.prepare_write(block_table_, layout_.kv_len(done));
}

void Session::add_rows_locked(Batch& batch, int32_t n, size_t first_logit) {
  std::vector<int32_t> pos(static_cast<size_t>(n)), slot(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int64_t t = static_cast<int64_t>(n_cached_) + i;
    pos[i] = bounded() ? layout_.position_of(t) : static_cast<int32_t>(t);
    slot[i] = bounded() ? layout_.slot_of(t) : static_cast<int32_t>(t);
    max_position_ = std::max(max_position_, pos[i]);
  }
  const int32_t first = first_logit <= n_cached_ ? 0
                        : static_cast<int32_t>(std::min<size_t>(first_logit - n_cached_, static_cast<size_t>(n)));
  const bool hole = bounded() && layout_.hole_end() > layout_.hole_begin();
  batch.add_rows(tokens_.data() + n_cached_, pos.data(), slot.data(), n, block_table_, hole ? layout_.hole_begin() : 0,
                 hole ? layout_.hole_end() : 0, first, decoded_.data() + n_cached_);
}

SessionCacheInfo Session::cache_info() const {
  std::lock_guard<std::mutex> lock(mutex_);
  SessionCacheInfo info;
  info.policy = policy_;
  info.n_tokens = tokens_.size();
  info.n_processed = n_cached_;
  info.resident = bounded() ? static_cast<size_t>(layout_.resident(static_cast<int64_t>(n_cached_))) : n_cached_;
  info.evicted = static_cast<uint64_t>(layout_.n_evicted());
  info.blocks = block_table_.size();
  const size_t bs = static_cast<size_t>((*engine_)->cache().block_size());
  info.max_blocks = bounded() ? (static_cast<size_t>(layout_.max_slots()) + bs - 1) / bs : 0;
  info.max_position = max_position_;
  return info;
}

void Session::score(const std::vector<int32_t>& ids, float* out) {
  const int32_t n_vocab = (*engine_)->model().config().n_vocab;
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab) fail(StatusCode::kInvalidArgument, "score: token id " + std::to_string(id) + " out of range");
  }
  if (out) std::fill(out, out + ids.size(), std::nanf(""));
  if (ids.empty()) return;
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    require_idle_locked();
    if (mode_ == Mode::kChat) fail(StatusCode::kInvalidArgument, "score: the session holds chat messages; reset it first");
    const size_t first = tokens_.size();
    // Logits are needed from the token before the first scored one (checked
    // before anything changes: a bounded cache may refuse to go back).
    if (out && first > 0 && n_cached_ > first - 1) truncate_cache_locked(first - 1);
    append_tokens_locked(ids);
    if (n_cached_ + 1 >= tokens_.size()) return;  // nothing to run (e.g. the very first token)
    stream = std::make_shared<Stream>(shared_from_this(), StreamParams{}, tokens_.size() - n_cached_);
    stream->score_mode_ = true;
    // Without `out` nothing is scored: logits only from the last token on.
    stream->score_first_ = out ? first : tokens_.size();
    stream->scores_.assign(tokens_.size() - stream->score_first_, std::nanf(""));
    stream->sched_.priority = priority_;
    stream->sched_.arrival = (*engine_)->next_arrival();
    busy_ = true;
    active_ = stream;
  }
  (*engine_)->submit(stream);
  stream->wait();
  StreamEvent ev;
  while (stream->next(ev, 0) == StatusCode::kOk) {
    if (ev.type == StreamEvent::kError) throw Error(ev.status, "score: " + ev.error);
    if (ev.type == StreamEvent::kEnd && ev.end_reason == EndReason::kCancelled) {
      fail(StatusCode::kCancelled, "score: cancelled");
    }
  }
  if (out) std::copy(stream->scores_.begin(), stream->scores_.end(), out);
}

// ------------------------------------------------------------------ Stream

Stream::Stream(std::shared_ptr<Session> session, const StreamParams& params, size_t prompt_tokens)
    : session_(std::move(session)),
      params_(params),
      sampler_(params.sampling, session_->engine().model().config().n_vocab),
      detok_(std::make_unique<StreamingDetokenizer>(session_->engine().model().tokenizer())) {
  if (params_.max_tokens <= 0) fail(StatusCode::kInvalidArgument, "stream: max_tokens must be > 0");
  for (const auto& s : params_.stop) {
    if (s.empty()) fail(StatusCode::kInvalidArgument, "stream: empty stop string");
  }
  t_start_ = std::chrono::steady_clock::now();
  (void)prompt_tokens;
}

Stream::~Stream() = default;

bool Stream::finished_flag() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

void Stream::stats_prompt_add(int32_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.prompt_tokens += static_cast<size_t>(n);
}

void Stream::push(StreamEvent ev) {
  Callback cb;
  std::vector<StreamEvent> deliver;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ev.type != StreamEvent::kText) finished_ = true;
    queue_.push_back(std::move(ev));
    if (callback_) {
      cb = callback_;
      deliver.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
      if (finished_) consumer_done_ = true;
    }
  }
  cv_.notify_all();
  for (const auto& e : deliver) {
    if (cb(e)) cancel_requested_ = true;
  }
}

void Stream::emit_text(bool final_flush) {
  // Hold back the longest tail that could still grow into a stop string.
  size_t keep = 0;
  if (!final_flush) {
    for (const auto& stop : params_.stop) {
      const size_t max_len = std::min(stop.size() - 1, held_text_.size());
      for (size_t len = max_len; len > keep; --len) {
        if (held_text_.compare(held_text_.size() - len, len, stop, 0, len) == 0) {
          keep = len;
          break;
        }
      }
    }
  }
  const size_t emit = held_text_.size() - keep;
  if (emit == 0 && !(final_flush && !held_tokens_.empty())) return;
  StreamEvent ev;
  ev.type = StreamEvent::kText;
  ev.text = held_text_.substr(0, emit);
  ev.tokens = std::move(held_tokens_);
  held_tokens_.clear();
  held_text_.erase(0, emit);
  reply_text_ += ev.text;
  if (ev.text.empty() && ev.tokens.empty()) return;
  push(std::move(ev));
}

void Stream::on_token(int32_t token, bool is_eog) {
  const auto now = std::chrono::steady_clock::now();
  if (!started_decoding_) {
    started_decoding_ = true;
    t_first_token_ = now;
  }
  ++generated_;
  Session& se = *session_;
  size_t n_ctx;
  size_t n_tokens;
  {
    std::lock_guard<std::mutex> lock(se.mutex_);
    se.tokens_.push_back(token);
    se.decoded_.push_back(1);
    n_ctx = se.bounded() ? SIZE_MAX : static_cast<size_t>(se.n_ctx_);  // a bounded cache never fills
    n_tokens = se.tokens_.size();
  }
  if (is_eog && !params_.ignore_eos) {
    finish(EndReason::kEos);
    return;
  }
  held_text_ += detok_->feed(token);
  held_tokens_.push_back(token);
  for (const auto& stop : params_.stop) {
    const size_t at = held_text_.find(stop);
    if (at != std::string::npos) {
      held_text_.resize(at);
      emit_text(true);
      finish(EndReason::kStopString);
      return;
    }
  }
  emit_text(false);
  if (generated_ >= static_cast<size_t>(params_.max_tokens)) {
    finish(EndReason::kMaxTokens);
  } else if (n_tokens >= n_ctx) {
    finish(EndReason::kContextFull);
  }
}

void Stream::finish(EndReason reason) {
  if (finished_flag()) return;
  if (reason != EndReason::kStopString) {
    held_text_ += detok_->flush();
    emit_text(true);
  }
  Session& se = *session_;
  {
    std::lock_guard<std::mutex> lock(se.mutex_);
    if (se.mode_ == Session::Mode::kChat) se.messages_.push_back({"assistant", reply_text_});
    se.park_locked();
    se.busy_ = false;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    t_end_ = std::chrono::steady_clock::now();
    stats_.generated_tokens = generated_;
    stats_.end_reason = reason;
  }
  StreamEvent ev;
  ev.type = StreamEvent::kEnd;
  ev.end_reason = reason;
  push(std::move(ev));
}

void Stream::fail_with(StatusCode code, const std::string& message) {
  if (finished_flag()) return;
  Session& se = *session_;
  {
    std::lock_guard<std::mutex> lock(se.mutex_);
    se.park_locked();
    se.busy_ = false;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    t_end_ = std::chrono::steady_clock::now();
    stats_.generated_tokens = generated_;
  }
  StreamEvent ev;
  ev.type = StreamEvent::kError;
  ev.status = code;
  ev.error = message;
  push(std::move(ev));
}

StatusCode Stream::next(StreamEvent& out, int32_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (callback_) return StatusCode::kBusy;
  if (consumer_done_) return StatusCode::kEndOfStream;
  auto ready = [&] { return !queue_.empty(); };
  if (timeout_ms < 0) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
    return StatusCode::kTimeout;
  }
  out = std::move(queue_.front());
  queue_.pop_front();
  if (out.type != StreamEvent::kText) consumer_done_ = true;
  return StatusCode::kOk;
}

void Stream::set_callback(Callback cb) {
  std::vector<StreamEvent> deliver;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (callback_) fail(StatusCode::kBusy, "stream: a callback is already set");
    if (consumer_done_) fail(StatusCode::kEndOfStream, "stream: already ended");
    callback_ = cb;
    if (finished_) {  // nothing more will be pushed: deliver what is queued now
      deliver.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
      consumer_done_ = true;
    }
  }
  for (const auto& e : deliver) cb(e);
}

void Stream::wait() {
  Engine& engine = session_->engine();
  if (engine.manual()) {
    // No worker: drive the engine from here until this stream has ended.
    while (!finished_flag()) engine.run_steps(0, 1);
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return finished_; });
}

StreamStats Stream::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  StreamStats s = stats_;
  s.finished = finished_;
  s.generated_tokens = generated_;
  if (started_decoding_) {
    s.ttft_ms = ms_between(t_start_, t_first_token_);
    if (s.ttft_ms > 0) s.prefill_tokens_per_second = static_cast<double>(s.prompt_tokens) / (s.ttft_ms / 1000.0);
    const auto end = finished_ ? t_end_ : std::chrono::steady_clock::now();
    const double decode_ms = ms_between(t_first_token_, end);
    if (generated_ > 1 && decode_ms > 0) s.tokens_per_second = static_cast<double>(generated_ - 1) / (decode_ms / 1000.0);
  }
  return s;
}

}  // namespace ember
