// core::Stream: one generation (or one scoring or embedding pass) on a session.
//
// The host pulls events with next() or has them pushed to a callback; the
// engine's step feeds it (take, finish, fail_with). Text pieces
// never split a UTF-8 character and never show the start of a stop string
// that may still complete.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/chat/tools.h"
#include "core/engine/embed.h"
#include "core/grammar/grammar.h"
#include "core/sampling/logprobs.h"
#include "core/sampling/sampler.h"
#include "core/scheduler/scheduler.h"
#include "core/speculative/spec_step.h"
#include "core/util/status.h"

namespace ember {

class Session;
class StreamingDetokenizer;
class Tokenizer;

struct StreamParams {
  static constexpr int32_t kMaxTokensLimit = 1 << 24;
  static constexpr size_t kMaxStopStrings = 64;

  SamplingParams sampling;
  int32_t max_tokens = 256;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  SpecParams spec;
  // Structured output: the reply matches this (core/grammar/grammar.h).
  grammar::Constraint constraint;
  // Tool calling (core/chat/tools.h): how the reply may call the session's
  // tools. Session::start turns it into `constraint` and `tool_format`.
  chat::ToolChoice tool_choice;
  bool tool_calls = false;  // set by Session::start: parse calls in `tool_format`
  chat::ToolFormat tool_format = chat::ToolFormat::kGeneric;
  // Logits (core/sampling/logprobs.h): each row a token is chosen from gets
  // the bias, then the processor (false = the stream fails), then the
  // constraint's mask; with `logprobs` each token's log-probability in that
  // row (and its `top_logprobs` most likely alternatives) goes with it in
  // the events.
  LogitBias logit_bias;
  using LogitsProcessor = std::function<bool(float* row, int32_t n_vocab, const std::vector<int32_t>& history)>;
  LogitsProcessor logits_processor;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  static constexpr int32_t kMaxTopLogprobs = 20;

  // Throws ember::Error(kInvalidArgument) naming the first bad field.
  void validate() const;
};

enum class EndReason : int32_t {
  kNone = 0,
  kEos = 1,
  kStopString = 2,
  kMaxTokens = 3,
  kCancelled = 4,
  kContextFull = 5
};

struct StreamEvent {
  enum Type : int32_t { kText = 0, kEnd = 1, kError = 2, kToolCall = 3 } type = kText;
  std::string text;
  // With StreamParams::logprobs: one per token, and n_top alternatives per
  // token (token-major, most likely first).
  std::vector<float> logprobs;
  std::vector<TokenLogprob> top_logprobs;
  int32_t n_top = 0;
  chat::ToolCall call;  // kToolCall
  // END and ERROR end the stream; TEXT and TOOL_CALL do not.
  bool last() const { return type == kEnd || type == kError; }
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
  // Speculative decoding: tokens drafted, drafted tokens accepted, target
  // passes that verified a tree.
  uint64_t drafted_tokens = 0, accepted_tokens = 0, verify_passes = 0;
};

class Stream : public std::enable_shared_from_this<Stream> {
 public:
  using Callback = std::function<bool(const StreamEvent&)>;  // true = cancel
  // Validates `params` (throws ember::Error).
  Stream(std::shared_ptr<Session> session, const StreamParams& params);
  ~Stream();

  // ---- host side
  // Pops the next event. Returns kTimeout / kEndOfStream / kBusy / kOk.
  StatusCode next(StreamEvent& out, int32_t timeout_ms);
  // Pushes every event to `cb` (on the engine's thread) from now on. The
  // last (END/ERROR) call has returned before wait() returns, so the host
  // may free what the callback uses once wait() is back.
  void set_callback(Callback cb);
  void cancel() { cancel_requested_ = true; }
  // Until the stream has ended and its last callback (if any) returned. In
  // manual mode, runs engine steps on the caller's thread meanwhile.
  void wait();
  StreamStats stats() const;

  // ---- scoring (Session::score): rows from history index first - 1 on get
  // logits; scores()[i] is log p(history token first + i).
  void enable_scoring(size_t first, size_t n_scores);
  bool score_mode() const { return score_mode_; }
  size_t score_first() const { return score_first_; }
  const std::vector<float>& scores() const { return scores_; }

  // ---- embedding (core/engine/embed.h): every history token is run and
  // the final-normed hidden states the pooling needs are gathered;
  // embedding() is the pooled vector once the stream has ended.
  void enable_embedding(Pooling pooling, int32_t n_embd);
  bool embed_mode() const { return embed_mode_; }
  Pooling pooling() const { return pooling_; }
  // Whether history row `index` of `n_tokens` feeds the pooling.
  bool wants_embedding(size_t index, size_t n_tokens) const;
  // History row `index`'s hidden state. A row pooled before (recomputed
  // after a preemption) is not counted again.
  void add_embedding(size_t index, const float* row);
  std::vector<float> embedding() const;

  // ---- engine side (core/engine/engine.cpp). The stream is the step's
  // event sink: it detokenizes, checks its stop conditions and delivers; it
  // never changes the session or its KV (the engine's apply phase does).
  Session& session() const { return *session_; }
  SchedSequence& sched() { return sched_; }
  bool cancel_requested() const { return cancel_requested_; }
  bool finished() const;
  bool started_decoding() const { return started_decoding_; }
  int32_t penalty_last_n() const { return params_.sampling.penalty_last_n; }
  void add_prompt_tokens(size_t n);
  Sampler& sampler() { return sampler_; }
  void set_score(size_t target, float logprob) { scores_[target - score_first_] = logprob; }
  // The outcome phase: the step's accepted tokens, in order (one sampled
  // token, or a verified tree's path and the target's next token). Each is
  // detokenized and checked against the stop conditions (EOS, stop strings,
  // max_tokens, and `room`: how many more tokens the session's context
  // holds). Returns how many the stream keeps: all, or up to and including
  // the one it ends at (*end says why; kNone: it goes on). Text events for
  // the kept tokens are pushed; the END event waits for finish().
  // `logprobs` (with StreamParams::logprobs): one entry per token.
  size_t take(const std::vector<int32_t>& tokens, size_t room, EndReason* end,
              const std::vector<LogprobEntry>* logprobs = nullptr);
  const StreamParams& params() const { return params_; }
  // Speculative decoding state (core/speculative/spec_step.h; null when the
  // stream does not speculate).
  speculative::StreamSpec* spec() { return spec_.get(); }
  void set_spec(std::unique_ptr<speculative::StreamSpec> spec);
  const SpecParams& spec_params() const { return params_.spec; }
  // Structured output: the stream's position in its constraint (null: none).
  grammar::Matcher* matcher() { return matcher_.get(); }
  void set_matcher(std::unique_ptr<grammar::Matcher> m) { matcher_ = std::move(m); }
  const grammar::Constraint& constraint() const { return params_.constraint; }
  void record_verification(size_t drafted, size_t accepted);
  std::vector<uint32_t>& bitmask() { return bitmask_; }
  // This step's way to the constrained decode row's token (set by the
  // engine's fill_masks before the forward pass, read by the outcome phase):
  // true = check the sampler's candidates (Sampler::sample_allowed), false =
  // the mask filled during the forward pass.
  bool checks_first() const { return checks_first_; }
  void set_checks_first(bool v) { checks_first_ = v; }
  // How long the last full mask took (microseconds), and the steps since.
  uint32_t mask_cost_us() const { return mask_cost_us_; }
  uint32_t steps_since_mask() const { return steps_since_mask_; }
  void record_mask(uint32_t us) {
    mask_cost_us_ = us;
    steps_since_mask_ = 0;
  }
  void count_step_without_mask() { ++steps_since_mask_; }
  // Tokens it may still emit (max_tokens minus those generated).
  int32_t tokens_left() const;
  // Ending: flush() emits the text still held (except after a stop string)
  // so reply() is complete; the engine ends the session's turn; finish()
  // then pushes END (fail_with: ERROR). Both do nothing once ended.
  void flush(EndReason reason);
  const std::string& reply() const { return reply_text_; }
  void finish(EndReason reason);
  void fail_with(StatusCode code, const std::string& message);

 private:
  void push(StreamEvent ev);
  void emit_text(bool final_flush);
  // Sends `text` (and the tokens held) as events: text, or tool calls when
  // the stream parses them.
  void deliver(std::string text, bool final_flush);

  std::shared_ptr<Session> session_;
  StreamParams params_;
  SchedSequence sched_;  // the scheduler's view, refreshed every step
  Sampler sampler_;
  std::unique_ptr<StreamingDetokenizer> detok_;
  const Tokenizer& tokenizer_;
  std::unique_ptr<speculative::StreamSpec> spec_;
  std::unique_ptr<grammar::Matcher> matcher_;
  std::unique_ptr<chat::ToolCallParser> tool_parser_;
  std::vector<uint32_t> bitmask_;  // the next decode row's mask, filled during the forward pass
  bool checks_first_ = false;
  uint32_t mask_cost_us_ = 0, steps_since_mask_ = 0;
  std::atomic<bool> cancel_requested_{false};

  // Engine-thread state.
  std::string held_text_;  // decoded but not yet emitted (stop-string look-behind)
  std::vector<int32_t> held_tokens_;
  std::vector<float> held_logprobs_;  // with StreamParams::logprobs, one per held token
  std::vector<TokenLogprob> held_top_;
  std::string reply_text_;  // everything emitted, for the session's messages
  std::atomic<size_t> generated_{0};
  std::atomic<bool> started_decoding_{false};
  bool score_mode_ = false;
  size_t score_first_ = 0;
  std::vector<float> scores_;
  bool embed_mode_ = false;
  Pooling pooling_ = Pooling::kMean;
  std::vector<double> embd_sum_;
  size_t embd_rows_ = 0;
  size_t embd_next_ = 0;  // history rows below it are pooled

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<StreamEvent> queue_;
  Callback callback_;
  bool finished_ = false;       // END/ERROR pushed
  bool consumer_done_ = false;  // END/ERROR popped or handed to the callback
  bool callback_done_ = false;  // the callback's END/ERROR call has returned
  StreamStats stats_;
  std::chrono::steady_clock::time_point t_start_, t_first_token_, t_end_;
};

}  // namespace ember
