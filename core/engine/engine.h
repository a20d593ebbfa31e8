// core::Engine: binds a model to a backend, owns the KV manager (and through
// it the block pool), the scheduler and the model's forward pass, and runs
// steps on its worker thread (or on the caller's, in manual mode).
//
// One step (Engine::step) is one transaction in four phases:
//   plan     gather the live streams and the scheduler's view of their
//            sequences; the scheduler (core/scheduler/) decides which run how
//            many tokens (chunked prefill, decodes, preemption) and reserves
//            every row's KV from one budget (KvManager::StepBudget), a
//            speculative tree's last (core/speculative/spec_step.h: it
//            shrinks or is skipped before anything is preempted); then the
//            rows of each run, a drafted tree's where there is one
//   forward  one pass of the model over the batch (core/model/)
//   outcome  per sequence: scores, or a sampled token, or a verified tree's
//            accepted tokens (SpecStep::verify), cut where the stream ends
//            (EOS, stop string, max tokens, context; Stream::take) before
//            anything is committed
//   apply    KvManager::apply: computed tokens (and the prefix cache), the
//            kept tree path, the appended token, finished sequences parked;
//            then ended streams end their session's turn and get END
// Nothing changes a sequence's KV or history between the plan and apply.
//
// Sessions (core/engine/session.h) hold conversations; a stream
// (core/engine/stream.h) is one generation on a session.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/frame_budget.h"
#include "core/engine/session.h"
#include "core/engine/stream.h"
#include "core/kv_cache/kv_manager.h"
#include "core/model/model.h"
#include "core/scheduler/scheduler.h"
#include "core/speculative/spec_step.h"
#include "core/util/status.h"

namespace ember {

class Forward;
struct Batch;
namespace comm {
class Communicator;
}
namespace speculative {
class SpecStep;
}
class EngineOwner;
class BackendExtras;

struct EngineParams {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N", "auto" (CUDA when available)
  int32_t n_threads = 0;
  uint64_t kv_memory_bytes = 512ull << 20;
  int32_t kv_block_size = 16;
  // The KV cache's element type: F16, or Q8_0 (half the memory per token;
  // head_dim a multiple of 32, a backend with supports_kv_dtype).
  DType kv_dtype = DType::F16;
  int32_t max_batch_tokens = 512;
  int32_t max_running = 64;
  // Background prompt tokens per step beside interactive decodes
  // (SchedulerConfig::background_tokens; 0: no limit).
  int32_t background_step_tokens = 16;
  bool prefix_caching = true;
  // Every sequence computes exactly what it would alone (batching, chunked
  // prefill, prefix hits and preemption never change its tokens).
  bool batch_invariant = true;
  // Manual mode: no worker thread; the host runs steps with Engine::run_steps
  // (ember_engine_step) from its own loop, e.g. once per game frame.
  bool manual = false;
  // CPU prompt rows on AMX tiles where the CPU has them (cpu/matmul.h): -1
  // (default) unless `manual`, 0 never, 1 always. A call of a few AMX rows
  // costs several decode steps, which a frame budget's per-row pricing
  // (core/engine/frame_budget.h) cannot foresee; and the AMX order is not
  // the other kernels', so engines that differ here compute different bits.
  int32_t prompt_tiles = -1;
  // A model split across the ranks of an MPI job (issue 31; tp x pp must be
  // the job's size): tensor parallel over tp ranks, pipeline parallel over
  // pp stages, or both (pp stages of tp ranks, stage-major ranks). Rank 0's
  // engine is the one to use; the others call follow(). comm_timeout_ms: how
  // long a rank waits for its peers in a step before the job is declared
  // broken.
  int32_t tp = 1, pp = 1;
  int32_t comm_timeout_ms = 60000;
  int32_t micro_batches = 0;  // pipeline micro-batches per step (0: pp)
  // Tensor parallel: bit-identical to one rank (ModelShard::exact: 4
  // all-gathers a layer), or Megatron's all-reduce of partial sums (false: 2
  // all-reduces a layer, another summation order).
  bool tp_exact = true;
  // "mpi" (CPU or any device; device buffers staged through the host) or
  // "nccl" (CUDA ranks, one GPU each: "cuda" becomes "cuda:<local rank>").
  std::string comm = "mpi";
};

struct SchedulerStats {
  size_t running = 0, waiting = 0, last_step_tokens = 0;
  uint64_t preempted = 0, steps = 0;
  uint64_t reclaimed = 0;  // times draft models' KV was taken back for a sequence
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // Creates the engine and starts its worker thread.
  static std::shared_ptr<EngineOwner> create(std::shared_ptr<const Model> model, const EngineParams& params);
  ~Engine();

  const Model& model() const { return *model_; }
  const EngineParams& params() const { return params_; }
  // The device the backend runs on ("cpu", "cuda:0", ...).
  const std::string& device() const { return device_; }
  KvManager& kv() { return *kv_; }
  KvCacheStats cache_stats() const { return kv_->stats(); }
  SchedulerStats scheduler_stats() const;

  // Scores tokens from an empty context on the caller's thread (see
  // ember_engine_score). logprobs: n-1 values; logits: n*vocab or nullptr.
  void score(const int32_t* tokens, size_t n, float* logprobs, float* logits);

  // Manual mode: runs steps on the caller's thread until `max_ms`
  // milliseconds have passed or `max_tokens` tokens were processed (<= 0:
  // no limit on that axis) or there is no work. Returns tokens processed.
  size_t run_steps(double max_ms, int64_t max_tokens);
  bool manual() const { return params_.manual; }
  uint64_t next_arrival() {
    std::lock_guard<std::mutex> lock(mutex_);
    return arrivals_++;
  }

  // ---- a model split across ranks (EngineParams::tp / pp)
  // This process's rank (0 when not split) and the job's size.
  int32_t rank() const;
  int32_t world_size() const;
  // On a rank > 0: runs rank 0's forward passes until rank 0's engine is
  // destroyed (returns) or a rank fails (throws). Only on ranks > 0.
  void follow();
  // The part of the model this rank holds (the model itself when not split).
  const Model& shard() const { return *shard_; }

  // A stream asks to run (the worker wakes).
  void submit(const std::shared_ptr<Stream>& stream);
  // Gives a stream that asked for speculative decoding its drafter
  // (SpecStep::prepare). Throws ember::Error before the stream is submitted.
  void prepare_speculation(Stream& stream);
  // Gives a stream with a constraint (structured output) its matcher,
  // compiling the constraint or finding it compiled. Throws ember::Error
  // (kInvalidArgument: a schema, grammar or regex the engine cannot take;
  // kUnsupported: no grammar engine in this build) before it is submitted.
  void prepare_constraint(Stream& stream);
  // Stops the worker thread: joins it, or detaches it when called on the
  // worker itself (the worker then drops its own reference and exits).
  void stop_worker();

 private:
  Engine(std::shared_ptr<const Model> model, const EngineParams& params);
  static void worker_loop(std::shared_ptr<Engine> self);
  // Removes finished streams from the queue (and copies the rest to *live).
  void drop_finished_streams(std::vector<std::shared_ptr<Stream>>* live);
  // One engine step. token_budget > 0 caps the tokens it runs (prompts are
  // chunked to fit; every running decode still gets its token). Returns the
  // tokens processed (0 when nothing ran). Never throws: a failure ends the
  // step's streams with an ERROR event.
  size_t step(int32_t token_budget = 0);
  void fail_streams(const std::vector<std::shared_ptr<Stream>>& streams, StatusCode code, const std::string& message);

  // The phases of a step (see the top of this file).
  struct StepWork;
  void plan(const std::vector<std::shared_ptr<Stream>>& streams, StepWork& w, int32_t token_budget);
  bool run_forward(StepWork& w);
  void outcome(StepWork& w);
  void apply(StepWork& w);
  // Ends a stream: its sequence parked (unless apply did), its reply to the
  // session, the session's turn over, then END (fail_stream: ERROR).
  void end_stream(Stream& s, EndReason reason, bool parked);
  // Fills the constraint masks of the step's decode rows on a worker (the
  // rows that need one: see checks_first).
  std::future<void> fill_masks(StepWork& w);
  // Whether the stream's decode row is sampled by checking the tokens the
  // sampler looks at against the constraint (Sampler::sample_allowed: the
  // same token as from the masked row) and masked only when that does not
  // settle it; never for rows that report logprobs (they need the masked
  // row's distribution). A full mask costs from microseconds to
  // milliseconds by the grammar's state (bounded strings are the dear
  // ones), checking a token a few microseconds. Decided per step by
  // fill_masks (Stream::checks_first); the result is the same either way.
  static bool checks_first(Stream& s);
  // The most tokens a row checks before it falls back to the full mask.
  static constexpr int32_t kMaxConstraintChecks = 128;
  // Sampled rows: a mask that took at most this long is filled during the
  // forward pass; a dearer one is checked instead, re-measured every
  // kMaskProbeSteps steps.
  static constexpr uint32_t kCheapMaskUs = 150;
  static constexpr uint32_t kMaskProbeSteps = 8;
  // Fills the stream's mask and records how long it took.
  static void fill_timed(Stream& s);
  // Drops drafted candidates the stream's constraint rejects (none: empty).
  speculative::SpecStep::CandidateFilter candidate_filter(Stream& s);
  void fail_stream(Stream& s, StatusCode code, const std::string& message, bool parked = false);

  std::shared_ptr<const Model> model_;
  std::shared_ptr<const Model> shard_;  // what the forward pass runs (model_ when not split)
  EngineParams params_;
  std::string device_;
  std::shared_ptr<comm::Communicator> comm_;     // split models only (the process's one)
  std::unique_ptr<comm::Communicator> tp_comm_;  // tp x pp: this stage's tensor-parallel group
  std::shared_ptr<Engine*> split_token_;         // held while this split engine lives
  std::unique_ptr<Backend> backend_;
  BackendExtras* backend_extras_ = nullptr;
  // CUDA graphs for decode-only steps: EMBER_CUDA_GRAPHS=1 (off by default
  // until the engine-level replay == eager check has run on a GPU).
  bool use_graphs_ = false;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Forward> forward_;
  std::mutex forward_mutex_;  // one forward pass at a time (worker or score)
  std::mutex step_mutex_;     // one step at a time (worker or manual callers)
  std::unique_ptr<Scheduler> scheduler_;
  uint64_t arrivals_ = 0;
  FrameBudget frame_;  // manual mode (run_steps): rows per step that fit a frame
  std::unique_ptr<speculative::SpecStep> spec_;

  mutable std::mutex mutex_;  // guards streams_, stats_, stop_
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Stream>> streams_;
  SchedulerStats stats_;
  bool stop_ = false;
  std::thread worker_;
  std::vector<float> logits_;
  std::vector<float> embd_;  // the step's embedding rows (batch.embd_rows)
  std::mutex grammar_mutex_;
  std::unique_ptr<grammar::Compiler> grammar_;  // made by the first constrained stream
};

namespace testing {
// Test hook: when set, called at the start of every step's outcome phase;
// an exception it throws is a failure inside the engine's step.
extern void (*g_step_fault_hook)();
// Test hook, shaped like a grammar's mask: when set, called in the outcome
// phase on every row of logits a token is chosen from (a decode's, each
// node of a speculative tree) before sampling or verification, with the
// token the row follows; it may set logits to -inf to reject tokens.
extern void (*g_outcome_mask_hook)(int32_t prev_token, float* row, int32_t n_vocab);
}  // namespace testing

// What users of an engine hold (the C handle and every session). The worker
// thread holds the Engine itself; when the last owner goes, the worker stops,
// so an Engine never outlives its users and never joins its own thread.
class EngineOwner {
 public:
  explicit EngineOwner(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}
  ~EngineOwner() { engine_->stop_worker(); }
  Engine& operator*() const { return *engine_; }
  Engine* operator->() const { return engine_.get(); }

 private:
  std::shared_ptr<Engine> engine_;
};

}  // namespace ember
