#include "core/engine/engine.h"
#include "core/engine/step_work.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <future>
#include <limits>
#include <map>

#include "core/backend/plugin.h"
#include "core/backend/registry.h"
#include "core/comm/communicator.h"
#include "core/engine/parallel.h"
#include "core/model/arch/registry.h"
#include "core/model/batch.h"
#include "core/speculative/spec_step.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/log.h"

namespace ember {

namespace {
// The part of a history the stream's sampler reads (its penalty window).
std::vector<int32_t> penalty_window(const Stream& s, const std::vector<int32_t>& tokens) {
  const int32_t last_n = s.penalty_last_n();
  const size_t keep = last_n < 0 ? tokens.size() : std::min(tokens.size(), static_cast<size_t>(last_n));
  return std::vector<int32_t>(tokens.end() - static_cast<std::ptrdiff_t>(keep), tokens.end());
}

}  // namespace

// ------------------------------------------------------------------ lifetime

Engine::Engine(std::shared_ptr<const Model> model, const EngineParams& params)
    : model_(std::move(model)), params_(params) {
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
  // A model split across ranks: this rank's part of it.
  shard_ = model_;
  if (params_.tp != 1 || params_.pp != 1) {
    if (params_.tp < 1 || params_.pp < 1 || params_.tp > 64 || params_.pp > 64) {
      fail(StatusCode::kInvalidArgument, "engine: tp and pp must be in [1, 64]");
    }
    if (params_.comm_timeout_ms <= 0) fail(StatusCode::kInvalidArgument, "engine: comm_timeout_ms must be positive");
    if (params_.micro_batches < 0 || params_.micro_batches > 1024) {
      fail(StatusCode::kInvalidArgument, "engine: micro_batches must be in [0, 1024]");
    }
    // The ranks' messages carry no engine id: one split engine per process.
    static std::mutex split_mutex;
    static std::weak_ptr<Engine*> split_engine;
    {
      std::lock_guard<std::mutex> lock(split_mutex);
      if (!split_engine.expired()) {
        fail(StatusCode::kBusy, "engine: this process already has an engine split across ranks (one at a time)");
      }
      split_token_ = std::make_shared<Engine*>(this);
      split_engine = split_token_;
    }
    if (params_.comm == "nccl" && params_.device.rfind("cuda", 0) != 0) {
      fail(StatusCode::kInvalidArgument, "engine: NCCL ranks run on CUDA devices (device \"cuda\"); use MPI on CPUs");
    }
    comm_ = comm::load_communicator(params_.comm, params_.comm_timeout_ms);
    if (comm_->size() != params_.tp * params_.pp) {
      fail(StatusCode::kInvalidArgument, "engine: tp x pp = " + std::to_string(params_.tp * params_.pp) +
                                             " ranks, but the MPI job has " + std::to_string(comm_->size()) +
                                             " (start it with mpirun -np " + std::to_string(params_.tp * params_.pp) +
                                             ")");
    }
    ModelShard spec;
    spec.tp = params_.tp;
    spec.pp = params_.pp;
    // Stage-major: the ranks of stage k are k * tp ... k * tp + tp - 1.
    spec.tp_rank = comm_->rank() % params_.tp;
    spec.pp_rank = comm_->rank() / params_.tp;
    spec.exact = params_.tp_exact;
    shard_ = Model::shard(model_, spec);
    // NCCL: one GPU per rank, the rank's index on its machine.
    if (params_.comm == "nccl" && params_.device == "cuda")
      params_.device = "cuda:" + std::to_string(comm_->local_rank());
  }
  CreatedBackend created = create_backend(
      params_.device, BackendOptions{params_.n_threads, params_.batch_invariant,
                                     params_.prompt_tiles < 0 ? !params_.manual : params_.prompt_tiles != 0});
  backend_ = std::move(created.backend);
  backend_extras_ = created.extras;
  if (backend_extras_) {
    const char* g = std::getenv("EMBER_CUDA_GRAPHS");
    use_graphs_ = g != nullptr && std::string(g) == "1";
  }
  device_ = created.device;
  const auto& sc = shard_->config();
  check_backend_limits(*backend_, sc.head_dim, sc.n_heads, sc.n_kv_heads);

  KvGeometry g = shard_->kv_geometry(params_.kv_block_size);
  g.dtype = params_.kv_dtype;
  if (g.dtype != DType::F16 && g.dtype != DType::Q8_0) fail(StatusCode::kInvalidArgument, "engine: unknown kv_dtype");
  if (!backend_->supports_kv_dtype(g.dtype)) {
    fail(StatusCode::kUnsupported, "engine: the " + backend_->name() + " backend has no q8_0 KV cache");
  }
  if (g.row_bytes() == 0) {
    fail(StatusCode::kUnsupported,
         "engine: a q8_0 KV cache needs head_dim a multiple of 32 (this model's: " + std::to_string(g.head_dim) + ")");
  }
  // A block's bytes as the pool lays them out: a pipeline stage's groups may
  // have room for more layers than it has (KvLayerGroups::pipeline_stage).
  KvLayerGroups groups = shard_->kv_groups();
  KvGeometry laid_out = g;
  laid_out.num_layers = groups.pool_layers();
  uint64_t blocks = params_.kv_memory_bytes / laid_out.bytes_per_block();
  if (comm_) {
    // Every rank's pool holds the same blocks (rank 0's tables index them
    // all): the fewest any rank's budget allows.
    std::vector<uint64_t> all(static_cast<size_t>(comm_->size()));
    comm_->all_gather(&blocks, sizeof blocks, all.data());
    blocks = *std::min_element(all.begin(), all.end());
  }
  if (blocks == 0) fail(StatusCode::kInvalidArgument, "engine: kv_memory_bytes is smaller than one KV block");
  if (blocks > (1u << 30)) fail(StatusCode::kInvalidArgument, "engine: kv_memory_bytes is absurdly large");
  g.num_blocks = static_cast<int32_t>(blocks);
  kv_ = std::make_unique<KvManager>(*backend_, g, std::move(groups), params_.prefix_caching,
                                    KvManager::Rope{shard_->rope_specs()});
  if (params_.background_step_tokens < 0 || params_.background_step_tokens > (1 << 16)) {
    fail(StatusCode::kInvalidArgument, "engine: background_step_tokens must be in [0, 65536]");
  }
  scheduler_ = std::make_unique<Scheduler>(
      SchedulerConfig{params_.max_batch_tokens, params_.max_running, params_.background_step_tokens});
  forward_ = arch->make_forward(shard_, *backend_, g.block_size);
  if (comm_) {
    ParallelContext ctx;
    ctx.comm = comm_.get();
    if (params_.tp > 1 && params_.pp > 1) {
      // Each stage's tensor-parallel group (after the timed all-gather
      // above: every rank is here).
      const ModelShard& sh = shard_->shard_spec();
      tp_comm_ = comm_->split(sh.pp_rank, sh.tp_rank);
      ctx.tp_comm = tp_comm_.get();
    }
    ctx.shard = shard_->shard_spec();
    ctx.micro_batches = params_.micro_batches;
    if (ctx.micro_batches == 0) {  // (measuring: EMBER_PP_MICRO_BATCHES=M; docs/PARALLEL.md)
      const char* m = std::getenv("EMBER_PP_MICRO_BATCHES");
      if (m && std::atoi(m) > 0 && std::atoi(m) <= 1024) ctx.micro_batches = std::atoi(m);
    }
    forward_->set_parallel(ctx);
    if (comm_->rank() == 0) {
      auto leader = std::make_unique<ParallelLeader>(std::move(forward_), *comm_);
      ParallelLeader* l = leader.get();
      kv_->pool()->set_split([l](const int32_t* src, const int32_t* dst, int32_t n) { l->mirror_copy(src, dst, n); });
      forward_ = std::move(leader);
    }
  }
  spec_ = std::make_unique<speculative::SpecStep>(
      speculative::SpecStep::Target{shard_, forward_.get(), &forward_mutex_, kv_.get(), backend_.get(), params_.device,
                                    params_.n_threads, params_.batch_invariant});
}

int32_t Engine::rank() const { return comm_ ? comm_->rank() : 0; }
int32_t Engine::world_size() const { return comm_ ? comm_->size() : 1; }

void Engine::follow() {
  if (rank() == 0) fail(StatusCode::kInvalidArgument, "engine: follow() is for ranks > 0 of a split model");
  std::lock_guard<std::mutex> lock(forward_mutex_);
  follow_leader(*forward_, *backend_, *comm_, model_->config().n_vocab, model_->config().n_embd);
}

Engine::~Engine() {
  // The worker is gone (stopped by the last EngineOwner) before we get here.
  if (worker_.joinable()) worker_.detach();
}

std::shared_ptr<EngineOwner> Engine::create(std::shared_ptr<const Model> model, const EngineParams& params) {
  std::shared_ptr<Engine> engine(new Engine(std::move(model), params));
  if (!params.manual && engine->rank() == 0) engine->worker_ = std::thread(&Engine::worker_loop, engine);
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
  for (auto& s : left) e.fail_stream(*s, StatusCode::kCancelled, "the engine was destroyed");
  left.clear();
  self.reset();  // may destroy the engine, on this thread
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
  // Dropped outside mutex_: the last reference to a finished stream may
  // destroy its session and with it the engine's last owner, whose
  // stop_worker() takes mutex_. (The engine itself stays alive: whoever
  // steps it holds it.)
  finished.clear();
}

// ------------------------------------------------------------------ one step

void Engine::plan(const std::vector<std::shared_ptr<Stream>>& streams, StepWork& w, int32_t token_budget) {
  // Gather: the scheduler's view of every live stream's sequence.
  for (const auto& sp : streams) {
    Stream& s = *sp;
    if (s.cancel_requested()) {
      end_stream(s, EndReason::kCancelled, /*parked=*/false);
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
    // An embedding needs every row's hidden state: no prefix-cache hits.
    if (s.embed_mode()) entry.reuse_limit = 0;
    s.sched().lookahead =
        s.score_mode() || s.embed_mode() ? 0 : spec_->lookahead(s.spec(), kv, s.session().n_ctx(), s.tokens_left());
    w.streams.push_back(&s);
    w.seqs.push_back(&s.sched());
    w.budget.push_back(entry);
  }
  // Schedule: every row of the step, trees' included, from one budget.
  if (token_budget > 0) {
    // Every running decode keeps its token, whatever the budget.
    int32_t decodes = 0;
    for (const SchedSequence* s : w.seqs) decodes += s->running && s->n_tokens == s->n_computed + 1;
    token_budget = std::max(token_budget, decodes);
  }
  KvManager::StepBudget budget = kv_->step_budget(w.budget);
  budget.set_reclaim([&w] {
    std::vector<speculative::StreamSpec*> specs;
    for (Stream* s : w.streams) specs.push_back(s->spec());
    return speculative::SpecStep::reclaim(specs);
  });
  w.plan = scheduler_->schedule(w.seqs, budget, token_budget);
  for (const auto& entry : budget.errors()) {
    const auto id = entry.first;
    const Error& error = entry.second;
    auto& run = w.plan.run;
    run.erase(std::remove_if(run.begin(), run.end(), [id](const auto& r) { return r.first->id == id; }), run.end());
    fail_stream(*w.streams[id], error.code(), error.message());
  }
  for (SchedSequence* f : w.plan.failed) {
    fail_stream(*w.streams[f->id], StatusCode::kOutOfMemory,
                "the sequence needs more KV blocks than the whole pool holds (" + std::to_string(kv_->total_blocks()) +
                    " blocks)");
  }
  // Batch: each planned sequence's rows (a tree's where one was drafted).
  for (const auto& [seq, chunk] : w.plan.run) {
    Stream& s = *w.streams[seq->id];
    KvSequence& kv = s.session().kv();
    std::lock_guard<std::mutex> lock(kv.mutex());
    const int32_t room = w.plan.lookahead_of(seq);
    if (room > 0) {
      const int32_t rows = spec_->draft(*s.spec(), kv, static_cast<size_t>(room), w.batch, candidate_filter(s));
      if (rows > 0) {
        StepWork::Entry en{&s, 1, w.n_logits, kv.tokens().size() - 1, rows};
        en.lookahead = en.tree = true;
        w.entries.push_back(en);
        w.n_logits += rows;
        continue;
      }
    }
    const size_t end = kv.n_computed() + static_cast<size_t>(chunk);
    if (s.embed_mode()) {
      // No logits; the hidden states of the rows the pooling takes.
      const int32_t first_row = w.batch.n_rows();
      kv_->add_rows(kv, w.batch, chunk, SIZE_MAX);
      w.entries.emplace_back(&s, chunk, -1, kv.n_computed(), 0);  // first_logit: the chunk's first history index
      StepWork::Entry& en = w.entries.back();
      en.embd_index = static_cast<int32_t>(w.batch.embd_rows.size());
      for (int32_t r = 0; r < chunk; ++r) {
        if (s.wants_embedding(kv.n_computed() + static_cast<size_t>(r), kv.tokens().size())) {
          w.batch.embd_rows.push_back(first_row + r);
        }
      }
      en.n_embd_rows = static_cast<int32_t>(w.batch.embd_rows.size()) - en.embd_index;
      continue;
    }
    if (s.score_mode()) {
      const size_t from = std::max(kv.n_computed(), s.score_first() == 0 ? size_t{0} : s.score_first() - 1);
      const int32_t rows = end > from ? static_cast<int32_t>(end - from) : 0;
      kv_->add_rows(kv, w.batch, chunk, from);
      w.batch.seqs.back().scores = true;
      w.entries.emplace_back(&s, chunk, rows > 0 ? w.n_logits : -1, from, rows);
      w.n_logits += rows;
      continue;
    }
    // Logits only for the last history token: it predicts the next one.
    const bool last = end == kv.tokens().size();
    kv_->add_rows(kv, w.batch, chunk, last ? end - 1 : SIZE_MAX);
    w.entries.emplace_back(&s, chunk, last ? w.n_logits++ : -1, end - 1, last ? 1 : 0);
    w.entries.back().lookahead = room > 0;
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
  embd_.resize(w.batch.embd_rows.size() * static_cast<size_t>(model_->config().n_embd));
  try {
    std::lock_guard<std::mutex> lock(forward_mutex_);
    // Decode-only steps on a device with graphs are recorded and replayed as
    // one CUDA graph (BackendExtras::graph_begin: results are those of eager
    // execution; the logits download ends the region).
    const bool graph = use_graphs_ && std::all_of(w.batch.seqs.begin(), w.batch.seqs.end(),
                                                  [](const BatchSeq& s) { return s.n_rows == 1; });
    if (graph) {
      backend_extras_->graph_begin((static_cast<uint64_t>(w.batch.n_rows()) << 32) | static_cast<uint32_t>(w.n_logits));
    }
    try {
      forward_->forward(w.batch, logits_.data(), embd_.data());
    } catch (...) {
      if (graph) backend_extras_->graph_abort();
      throw;
    }
    if (graph) backend_extras_->graph_end();
    return true;
  } catch (const Error& e) {
    for (auto& en : w.entries) fail_stream(*en.stream, e.code(), e.message());
  } catch (const std::bad_alloc&) {
    for (auto& en : w.entries) fail_stream(*en.stream, StatusCode::kOutOfMemory, "out of memory in the forward pass");
  }
  return false;
}

void Engine::outcome(StepWork& w) {
  if (testing::g_step_fault_hook) testing::g_step_fault_hook();
  const int32_t n_vocab = model_->config().n_vocab;
  for (auto& en : w.entries) {
    Stream& s = *en.stream;
    KvSequence& kv = s.session().kv();
    en.kv.computed = static_cast<size_t>(en.chunk);
    en.kv.lookahead = en.lookahead;
    if (!s.started_decoding()) s.add_prompt_tokens(static_cast<size_t>(en.chunk));
    if (s.cancel_requested()) {
      en.ends = true;
      en.end = EndReason::kCancelled;
      continue;
    }
    std::vector<int32_t> history, full_history;
    int32_t prev = -1;
    size_t room = SIZE_MAX;  // tokens the session's context still holds
    {
      std::lock_guard<std::mutex> lock(kv.mutex());
      const std::vector<int32_t>& tokens = kv.tokens();
      if (s.embed_mode()) {
        const size_t n_embd = static_cast<size_t>(model_->config().n_embd);
        int32_t j = 0;  // the chunk's rows the pooling takes, in order (as plan listed them)
        for (int32_t r = 0; r < en.chunk && j < en.n_embd_rows; ++r) {
          const size_t index = en.first_logit + static_cast<size_t>(r);
          if (!s.wants_embedding(index, tokens.size())) continue;
          s.add_embedding(index, embd_.data() + static_cast<size_t>(en.embd_index + j++) * n_embd);
        }
        en.ends = kv.n_computed() + static_cast<size_t>(en.chunk) >= tokens.size();  // every row run
        continue;
      }
      if (s.score_mode()) {
        for (int32_t r = 0; r < en.n_logit_rows; ++r) {
          const size_t target = en.first_logit + static_cast<size_t>(r) + 1;  // history index predicted
          if (target >= tokens.size() || target < s.score_first()) continue;
          const float* row = logits_.data() + static_cast<size_t>(en.logit_index + r) * n_vocab;
          s.set_score(target, token_log_prob(row, n_vocab, tokens[target]));
        }
        en.ends = kv.n_computed() + static_cast<size_t>(en.chunk) + 1 >= tokens.size();  // all scored
        continue;
      }
      if (en.logit_index < 0) continue;
      history = penalty_window(s, tokens);
      if (s.params().logits_processor) full_history = tokens;
      prev = tokens.back();
      const size_t n_ctx = static_cast<size_t>(s.session().n_ctx());
      if (!kv.bounded()) room = n_ctx > tokens.size() ? n_ctx - tokens.size() : 0;
    }
    float* row = logits_.data() + static_cast<size_t>(en.logit_index) * n_vocab;
    grammar::Matcher* matcher = s.matcher();
    const StreamParams& sp = s.params();
    // A row before a token is chosen from it: the stream's logit bias, its
    // logits processor (told the history and the row's path), then the
    // constraint (the decode row's mask was filled during the forward pass;
    // a tree node's is the constraint after the node's path), then the test
    // hook; with logprobs, the row's log-softmax is kept (by path) for the
    // tokens chosen from it.
    std::string processor_error;
    std::map<std::vector<int32_t>, RowLogprobs> row_logprobs;
    const bool check_first = matcher && s.checks_first();
    auto prepare_row = [&](const std::vector<int32_t>& path, float* r, bool decode_row) {
      if (!sp.logit_bias.empty()) apply_logit_bias(sp.logit_bias, r, n_vocab);
      if (sp.logits_processor && processor_error.empty()) {
        std::vector<int32_t> seen = full_history;
        seen.insert(seen.end(), path.begin(), path.end());
        try {
          if (!sp.logits_processor(r, n_vocab, seen)) processor_error = "the stream's logits processor failed";
        } catch (const std::exception& e) {
          processor_error = std::string("the stream's logits processor failed: ") + e.what();
        }
      }
      if (matcher) {
        if (decode_row) {
          if (!check_first) grammar::Matcher::apply(s.bitmask(), r, n_vocab);
        } else {
          matcher->mask_after(path, r, n_vocab);
        }
      }
      if (testing::g_outcome_mask_hook) testing::g_outcome_mask_hook(path.empty() ? prev : path.back(), r, n_vocab);
      if (sp.logprobs) row_logprobs[path] = RowLogprobs(r, n_vocab, sp.top_logprobs);
    };
    const speculative::SpecStep::RowMask mask = [&](const std::vector<int32_t>& path, float* r) {
      prepare_row(path, r, /*decode_row=*/false);
    };
    std::vector<int32_t> accepted;
    if (en.tree) {
      speculative::Verdict v =
          spec_->verify(*s.spec(), row, n_vocab, s.sampler(), history, std::max(s.tokens_left(), 1), mask);
      s.record_verification(v.drafted, v.path.size());
      accepted = std::move(v.tokens);
      en.kv.path = std::move(v.path);
    } else {
      prepare_row({}, row, /*decode_row=*/true);
      int32_t token;
      if (check_first) {
        // The tokens the sampler would consider are checked one by one; when
        // that does not settle the choice, the mask now, and the masked row
        // sampled (its penalties are already applied).
        token = s.sampler().sample_allowed(
            row, history, [matcher](int32_t t) { return matcher->allows(t); }, kMaxConstraintChecks);
        if (token < 0) {
          fill_timed(s);
          grammar::Matcher::apply(s.bitmask(), row, n_vocab);
          token = s.sampler().sample_penalized(row);
        }
      } else {
        token = s.sampler().sample(row, history);
      }
      accepted.push_back(token);
    }
    if (!processor_error.empty()) {
      // Nothing of this row is kept; the stream fails in the apply phase.
      en.ends = true;
      en.error = std::move(processor_error);
      en.kv.path.clear();
      continue;
    }
    std::vector<LogprobEntry> logprobs;
    if (sp.logprobs) {
      // Token k was chosen from the row after the first k accepted tokens.
      std::vector<int32_t> path;
      for (int32_t t : accepted) {
        auto it = row_logprobs.find(path);
        logprobs.push_back(it != row_logprobs.end() ? it->second.entry(t) : LogprobEntry{t, NAN, {}});
        path.push_back(t);
      }
    }
    // Cut where the stream ends: what follows never reaches the KV. The
    // path's nodes are computed; the target's next token (the last accepted)
    // joins the history pending, as in a plain decode.
    const size_t kept = s.take(accepted, room, &en.end, sp.logprobs ? &logprobs : nullptr);
    en.ends = en.end != EndReason::kNone;
    if (matcher) {
      // The constraint follows the kept tokens; once it is complete only a
      // stop token may follow, so the reply ends there.
      std::vector<int32_t> kept_tokens(accepted.begin(), accepted.begin() + static_cast<std::ptrdiff_t>(kept));
      if (matcher->accept_all(kept_tokens) != kept_tokens.size()) {
        log(LogLevel::kWarn, "engine: a kept token is outside the stream's constraint");
      }
      if (!en.ends && matcher->terminated()) {
        en.ends = true;
        en.end = EndReason::kEos;
      }
    }
    if (kept <= en.kv.path.size()) {
      en.kv.path.resize(kept);
    } else {
      en.kv.appended.assign(accepted.begin() + static_cast<std::ptrdiff_t>(en.kv.path.size()),
                            accepted.begin() + static_cast<std::ptrdiff_t>(kept));
    }
  }
}

void Engine::apply(StepWork& w) {
  for (auto& en : w.entries) {
    Stream& s = *en.stream;
    if (s.finished()) continue;
    en.kv.finished = en.ends;
    {
      KvSequence& kv = s.session().kv();
      std::lock_guard<std::mutex> lock(kv.mutex());
      kv_->apply(kv, en.kv);
    }
    if (!en.error.empty()) {
      fail_stream(s, StatusCode::kCancelled, en.error, /*parked=*/true);
    } else if (en.ends) {
      end_stream(s, en.end, /*parked=*/true);
    }
  }
}

void Engine::end_stream(Stream& s, EndReason reason, bool parked) {
  if (s.finished()) return;
  if (!parked) {
    KvSequence& kv = s.session().kv();
    std::lock_guard<std::mutex> lock(kv.mutex());
    kv_->park(kv);
  }
  s.flush(reason);
  s.session().end_turn(s.score_mode() || s.embed_mode() ? nullptr : &s.reply());
  // Its drafter gives back what it holds (a draft model's KV in the pool)
  // now, not when the host lets go of the stream.
  if (s.spec()) speculative::SpecStep::stop(*s.spec());
  s.finish(reason);
}

void Engine::fail_stream(Stream& s, StatusCode code, const std::string& message, bool parked) {
  if (s.finished()) return;
  try {
    if (!parked) {
      KvSequence& kv = s.session().kv();
      std::lock_guard<std::mutex> lock(kv.mutex());
      kv_->park(kv);
    }
  } catch (const std::exception& e) {  // the stream still ends; its blocks go with its session
    log(LogLevel::kError, "engine: parking a failed stream's sequence: %s", e.what());
  }
  s.session().end_turn(nullptr);
  if (s.spec()) speculative::SpecStep::stop(*s.spec());
  s.fail_with(code, message);
}

void Engine::prepare_speculation(Stream& stream) {
  if (comm_ && stream.spec_params().kind != SpecParams::Kind::kNone) {
    fail(StatusCode::kUnsupported, "speculative decoding on a model split across ranks is not supported yet");
  }
  stream.set_spec(spec_->prepare(stream.spec_params(), stream.session().policy(), stream.session().n_ctx()));
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
    plan(streams, w, token_budget);
    if (w.entries.empty()) {
      // Nothing could run (every sequence waits for blocks): let others finish.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return 0;
    }
    // Constraint masks of the decode rows are filled on a worker while the
    // forward pass runs (they depend only on the tokens kept so far).
    std::future<void> masks = fill_masks(w);
    const bool ran = run_forward(w);
    if (masks.valid()) masks.get();
    if (ran) {
      outcome(w);
      apply(w);
    }
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
      fail_stream(*s, code, message);
    } catch (...) {  // never leave the others waiting
    }
  }
}

namespace testing {
void (*g_step_fault_hook)() = nullptr;
void (*g_outcome_mask_hook)(int32_t prev_token, float* row, int32_t n_vocab) = nullptr;
}  // namespace testing

}  // namespace ember
