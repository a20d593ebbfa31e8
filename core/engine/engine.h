// core::Engine, core::Session, core::Stream.
//
// The engine binds a model to a backend, owns the KV pool and runs steps on
// its worker thread: each step gathers the running streams, gives every
// decoding sequence one token and prefilling sequences a chunk of their
// prompt under the step's token budget, runs one batched forward pass, then
// samples and delivers events. Sessions hold conversations (tokens + block
// table); a stream is one generation on a session.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/chat/chat_template.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/streaming.h"
#include "core/model/model.h"
#include "core/sampling/sampler.h"
#include "core/scheduler/scheduler.h"
#include "core/util/status.h"

namespace ember {

class LlamaForward;
struct Batch;
class StreamingDetokenizer;
class EngineOwner;
class BackendExtras;
class Session;
class Stream;

struct EngineParams {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:N", "auto" (CUDA when available)
  int32_t n_threads = 0;
  uint64_t kv_memory_bytes = 512ull << 20;
  int32_t kv_block_size = 16;
  int32_t max_batch_tokens = 512;
  int32_t max_running = 64;
  bool prefix_caching = true;
  // Every sequence computes exactly what it would alone (batching, chunked
  // prefill, prefix hits and preemption never change its tokens).
  bool batch_invariant = true;
  // Manual mode: no worker thread; the host runs steps with Engine::run_steps
  // (ember_engine_step) from its own loop, e.g. once per game frame.
  bool manual = false;
};

struct SchedulerStats {
  size_t running = 0, waiting = 0, last_step_tokens = 0;
  uint64_t preempted = 0, steps = 0;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // Creates the engine and starts its worker thread.
  static std::shared_ptr<EngineOwner> create(std::shared_ptr<const Model> model, const EngineParams& params);
  ~Engine();

  const Model& model() const { return *model_; }
  const EngineParams& params() const { return params_; }
  KvCache& cache() { return *cache_; }
  SchedulerStats scheduler_stats() const;

  // Scores tokens from an empty context on the caller's thread (see
  // ember_engine_score). logprobs: n-1 values; logits: n*vocab or nullptr.
  void score(const int32_t* tokens, size_t n, float* logprobs, float* logits);

  // Manual mode: runs steps on the caller's thread until `max_ms`
  // milliseconds have passed or `max_tokens` tokens were processed (<= 0:
  // no limit on that axis) or there is no work. Returns tokens processed.
  size_t run_steps(double max_ms, int64_t max_tokens);
  bool manual() const { return params_.manual; }
  uint64_t next_arrival() { std::lock_guard<std::mutex> lock(mutex_); return arrivals_++; }

  // Internal: a stream asks to run / the worker wakes.
  void submit(const std::shared_ptr<Stream>& stream);
  // Stops the worker thread: joins it, or detaches it when called on the
  // worker itself (the worker then drops its own reference and exits).
  void stop_worker();

 private:
  Engine(std::shared_ptr<const Model> model, const EngineParams& params);
  static void worker_loop(std::shared_ptr<Engine> self);
  // Removes finished streams from the queue (and copies the rest to *live).
  void drop_finished_streams(std::vector<std::shared_ptr<Stream>>* live);
  // One engine step; returns false when there was nothing to do.
  // Returns the tokens processed (0 when there was nothing to run).
  size_t step();
  class Budget;

  std::shared_ptr<const Model> model_;
  EngineParams params_;
  std::unique_ptr<Backend> backend_;
  BackendExtras* backend_extras_ = nullptr;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<LlamaForward> forward_;
  std::mutex forward_mutex_;  // one forward pass at a time (worker or score)
  std::mutex step_mutex_;     // one step at a time (worker or manual callers)
  std::unique_ptr<Scheduler> scheduler_;
  uint64_t arrivals_ = 0;

  mutable std::mutex mutex_;  // guards streams_, stats_, stop_
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Stream>> streams_;
  SchedulerStats stats_;
  bool stop_ = false;
  std::thread worker_;
  std::vector<float> logits_;
};

struct StreamParams {
  SamplingParams sampling;
  int32_t max_tokens = 256;
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

enum class EndReason : int32_t { kNone = 0, kEos = 1, kStopString = 2, kMaxTokens = 3, kCancelled = 4, kContextFull = 5 };

struct StreamEvent {
  enum Type : int32_t { kText = 0, kEnd = 1, kError = 2 } type = kText;
  std::string text;
  std::vector<int32_t> tokens;
  EndReason end_reason = EndReason::kNone;
  StatusCode status = StatusCode::kOk;
  std::string error;
};

struct StreamStats {
  size_t prompt_tokens = 0, generated_tokens = 0;
  double ttft_ms = 0, tokens_per_second = 0, prefill_tokens_per_second = 0;
  bool finished = false;
  EndReason end_reason = EndReason::kNone;
};

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

// What a session's cache holds (ember_session_cache_info).
struct SessionCacheInfo {
  CachePolicy policy;
  size_t n_tokens = 0;       // tokens in the history
  size_t n_processed = 0;    // history tokens run through the model (resident or evicted)
  size_t resident = 0;       // tokens whose K/V are in the cache now
  uint64_t evicted = 0;      // tokens evicted by the policy
  size_t blocks = 0;         // KV blocks held
  size_t max_blocks = 0;     // the most it can hold (bounded policies; 0 = unbounded)
  int32_t max_position = -1; // highest RoPE position any of its tokens was given
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  // n_ctx: the context of a full session; for a window/sink policy with
  // window_tokens == 0 the cache size S + W (W = n_ctx - S).
  Session(std::shared_ptr<EngineOwner> engine, int32_t n_ctx, const std::string& system_prompt,
          int32_t priority = 0, CachePolicy policy = {});
  ~Session();

  // Appends `ids` (completion mode) and scores them under the cache policy
  // through the engine's scheduler: out[i] = log p(ids[i] | every session
  // token before it), NaN for a token with nothing before it. out may be
  // nullptr (ingest only). The last token stays pending (not yet run), so the
  // next call or stream continues from it. Blocks until done.
  void score(const std::vector<int32_t>& ids, float* out);
  SessionCacheInfo cache_info() const;
  const CachePolicy& policy() const { return policy_; }

  // Writes the session (history, policy, messages, KV) to `path`
  // (core/engine/session_file.cpp). The session must be idle.
  void save(const std::string& path);
  // Restores a saved session on `engine`; priority < 0 keeps the saved one.
  static std::shared_ptr<Session> load(std::shared_ptr<EngineOwner> engine, const std::string& path,
                                       int32_t priority = -1);

  void add_message(const std::string& role, const std::string& content);
  void add_text(const std::string& text, bool parse_special);
  void add_tokens(std::vector<int32_t> ids);
  void reset();
  size_t token_count() const;
  std::shared_ptr<Stream> start(const StreamParams& params);
  // Cancels the running stream, if any (used when the session handle goes).
  void cancel_active();

  Engine& engine() { return **engine_; }

 private:
  friend class Engine;
  friend class Stream;
  void require_idle_locked() const;
  void park_locked();
  void append_tokens_locked(const std::vector<int32_t>& ids);
  void sync_chat_tokens_locked();
  void truncate_cache_locked(size_t n);
  bool bounded() const { return policy_.bounded(); }
  // Bounded policies: evicts (and K-shifts) so that `n_new` tokens fit the
  // window, then reserves their slots. False (retry later) when the pool has
  // no block for them.
  bool make_room_locked(size_t n_new);
  // Appends rows for tokens [n_cached_, n_cached_ + n) to `batch`; rows at
  // history index >= first_logit get logits.
  void add_rows_locked(Batch& batch, int32_t n, size_t first_logit);
  void fill_sched_locked(SchedSequence& seq) const;

  std::shared_ptr<EngineOwner> engine_;
  int32_t n_ctx_;
  int32_t priority_ = 0;
  mutable std::mutex mutex_;
  bool busy_ = false;
  enum class Mode { kEmpty, kChat, kText } mode_ = Mode::kEmpty;
  std::vector<ChatMessage> messages_;
  // All tokens of the conversation; tokens_[0, n_cached_) have their K/V in block_table_.
  std::vector<int32_t> tokens_;
  // Parallel to tokens_: 1 for a token a stream generated (its row is
  // computed as a decode, AttentionParams::decode_rows, also when recomputed
  // after a preemption), 0 for prompt and scored tokens.
  std::vector<uint8_t> decoded_;
  size_t n_cached_ = 0;
  std::vector<int32_t> block_table_;
  std::weak_ptr<Stream> active_;
  CachePolicy policy_;
  StreamingLayout layout_;    // bounded policies: where the tokens sit in block_table_
  int32_t max_position_ = -1; // highest RoPE position given to any of its rows
};

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  using Callback = std::function<bool(const StreamEvent&)>;  // true = cancel
  Stream(std::shared_ptr<Session> session, const StreamParams& params, size_t prompt_tokens);
  ~Stream();

  // Pops the next event. Returns kTimeout / kEndOfStream / kBusy / kOk.
  StatusCode next(StreamEvent& out, int32_t timeout_ms);
  void set_callback(Callback cb);
  void cancel() { cancel_requested_ = true; }
  void wait();
  StreamStats stats() const;

 private:
  friend class Engine;
  friend class Session;
  // Worker side.
  bool finished_flag() const;
  void stats_prompt_add(int32_t n);
  void on_token(int32_t token, bool is_eog);
  void finish(EndReason reason);
  void fail_with(StatusCode code, const std::string& message);
  void push(StreamEvent ev);
  void emit_text(bool final_flush);

  std::shared_ptr<Session> session_;
  StreamParams params_;
  SchedSequence sched_;  // the scheduler's view, refreshed every step
  Sampler sampler_;
  std::unique_ptr<StreamingDetokenizer> detok_;
  std::atomic<bool> cancel_requested_{false};

  // Worker-owned state.
  std::string held_text_;              // decoded but not yet emitted (stop-string look-behind)
  std::vector<int32_t> held_tokens_;
  std::string reply_text_;             // everything emitted, for the session's messages
  std::atomic<size_t> generated_{0};
  std::atomic<bool> started_decoding_{false};
  // Scoring (Session::score) instead of sampling: rows from history index
  // score_first_ - 1 on get logits; scores_[i] is log p(token score_first_ + i).
  bool score_mode_ = false;
  size_t score_first_ = 0;
  std::vector<float> scores_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<StreamEvent> queue_;
  Callback callback_;
  bool finished_ = false;      // END/ERROR pushed
  bool consumer_done_ = false; // END/ERROR popped
  StreamEvent current_;        // the last popped event (storage for the C ABI)
  StreamStats stats_;
  std::chrono::steady_clock::time_point t_start_, t_first_token_, t_end_;
};

}  // namespace ember
