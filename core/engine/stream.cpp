#include "core/engine/stream.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/engine/engine.h"
#include "core/engine/session.h"
#include "core/tokenizer/tokenizer.h"

namespace ember {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
void require(bool ok, const char* message) {
  if (!ok) fail(StatusCode::kInvalidArgument, message);
}
}  // namespace

void StreamParams::validate() const {
  const SamplingParams& s = sampling;
  require(max_tokens > 0 && max_tokens <= kMaxTokensLimit, "stream params: max_tokens must be in [1, 16777216]");
  require(s.temperature >= 0.0f && s.temperature <= 100.0f, "stream params: temperature must be in [0, 100]");
  require(s.top_k >= 0, "stream params: top_k must be >= 0");
  require(s.top_p > 0.0f && s.top_p <= 1.0f, "stream params: top_p must be in (0, 1]");
  require(s.min_p >= 0.0f && s.min_p <= 1.0f, "stream params: min_p must be in [0, 1]");
  require(s.repeat_penalty > 0.0f && s.repeat_penalty <= 100.0f, "stream params: repeat_penalty must be in (0, 100]");
  require(s.presence_penalty >= -100.0f && s.presence_penalty <= 100.0f,
          "stream params: presence_penalty out of range");
  require(s.frequency_penalty >= -100.0f && s.frequency_penalty <= 100.0f,
          "stream params: frequency_penalty out of range");
  require(s.penalty_last_n >= -1, "stream params: penalty_last_n must be >= -1");
  require(stop.size() <= kMaxStopStrings, "stream params: at most 64 stop strings");
  for (const auto& s : stop) require(!s.empty(), "stream params: empty stop string");
  require(top_logprobs >= 0 && top_logprobs <= kMaxTopLogprobs, "stream params: top_logprobs must be in [0, 20]");
  require(top_logprobs == 0 || logprobs, "stream params: top_logprobs needs logprobs");
  for (const auto& [token, bias] : logit_bias) {
    require(token >= 0, "stream params: a logit bias names a negative token id");
    require(!std::isnan(bias) && bias != std::numeric_limits<float>::infinity(),
            "stream params: a logit bias must be a number or -infinity (a ban)");
  }
  require(spec.kind >= SpecParams::Kind::kNone && spec.kind <= SpecParams::Kind::kDraft,
          "stream params: unknown speculative drafter");
  if (spec.kind != SpecParams::Kind::kNone) spec.tree.validate();
  require(spec.self_layers >= 0, "stream params: spec self layers must be >= 0");
  require(spec.kind != SpecParams::Kind::kDraft || spec.draft_model != nullptr,
          "stream params: the draft drafter needs a draft model");
  constraint.validate();
}

Stream::Stream(std::shared_ptr<Session> session, const StreamParams& params)
    : session_(std::move(session)),
      params_(params),
      sampler_(params.sampling, session_->engine().model().config().n_vocab),
      detok_(std::make_unique<StreamingDetokenizer>(session_->engine().model().tokenizer())),
      tokenizer_(session_->engine().model().tokenizer()) {
  params_.validate();
  const int32_t n_vocab = session_->engine().model().config().n_vocab;
  for (const auto& b : params_.logit_bias) {
    if (b.first >= n_vocab) {
      fail(StatusCode::kInvalidArgument, "stream params: a logit bias names token " + std::to_string(b.first) +
                                             ", past the vocabulary of " + std::to_string(n_vocab));
    }
  }
  if (params_.tool_calls) tool_parser_ = std::make_unique<chat::ToolCallParser>(params_.tool_format);
  t_start_ = std::chrono::steady_clock::now();
}

Stream::~Stream() = default;

void Stream::enable_scoring(size_t first, size_t n_scores) {
  score_mode_ = true;
  score_first_ = first;
  scores_.assign(n_scores, std::nanf(""));
}

void Stream::enable_embedding(Pooling pooling, int32_t n_embd) {
  embed_mode_ = true;
  pooling_ = pooling;
  embd_sum_.assign(static_cast<size_t>(n_embd), 0.0);
  embd_rows_ = 0;
  embd_next_ = 0;
}

bool Stream::wants_embedding(size_t index, size_t n_tokens) const {
  switch (pooling_) {
    case Pooling::kMean: return true;
    case Pooling::kLast: return index + 1 == n_tokens;
    case Pooling::kCls: return index == 0;
  }
  return false;
}

void Stream::add_embedding(size_t index, const float* row) {
  if (index < embd_next_) return;
  for (size_t i = 0; i < embd_sum_.size(); ++i) embd_sum_[i] += row[i];
  ++embd_rows_;
  embd_next_ = index + 1;
}

std::vector<float> Stream::embedding() const {
  std::vector<float> v(embd_sum_.size(), 0.0f);
  if (embd_rows_ == 0) return v;
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(embd_sum_[i] / static_cast<double>(embd_rows_));
  return v;
}

bool Stream::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

void Stream::add_prompt_tokens(size_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.prompt_tokens += n;
}

void Stream::push(StreamEvent ev) {
  Callback cb;
  std::vector<StreamEvent> deliver;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ev.last()) finished_ = true;
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
    if (e.last()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        callback_done_ = true;
      }
      cv_.notify_all();
    }
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
  std::string text = held_text_.substr(0, emit);
  held_text_.erase(0, emit);
  reply_text_ += text;
  deliver(std::move(text), final_flush);
}

void Stream::deliver(std::string text, bool final_flush) {
  std::vector<chat::ToolCallParser::Piece> pieces;
  if (tool_parser_) {
    tool_parser_->feed(text, final_flush, pieces);
  } else if (!text.empty()) {
    pieces.emplace_back();
    pieces.back().text = std::move(text);
  }
  // The tokens go with the next event out (a call's tokens with its call).
  if (pieces.empty()) {
    if (!final_flush || held_tokens_.empty()) return;
    pieces.emplace_back();
  }
  for (auto& piece : pieces) {
    StreamEvent ev;
    ev.tokens = std::move(held_tokens_);
    held_tokens_.clear();
    if (params_.logprobs) {
      ev.logprobs = std::move(held_logprobs_);
      ev.top_logprobs = std::move(held_top_);
      ev.n_top = params_.top_logprobs;
      held_logprobs_.clear();
      held_top_.clear();
    }
    if (piece.is_call) {
      ev.type = StreamEvent::kToolCall;
      ev.call = std::move(piece.call);
      ev.call.id = "call_" + std::to_string(session_->next_tool_call_number());
    } else {
      ev.type = StreamEvent::kText;
      ev.text = std::move(piece.text);
    }
    push(std::move(ev));
  }
}

void Stream::set_spec(std::unique_ptr<speculative::StreamSpec> spec) { spec_ = std::move(spec); }

void Stream::record_verification(size_t drafted, size_t accepted) {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.drafted_tokens += drafted;
  stats_.accepted_tokens += accepted;
  stats_.verify_passes += 1;
}

int32_t Stream::tokens_left() const {
  const size_t g = generated_;
  return g >= static_cast<size_t>(params_.max_tokens) ? 0 : params_.max_tokens - static_cast<int32_t>(g);
}

size_t Stream::take(const std::vector<int32_t>& tokens, size_t room, EndReason* end,
                    const std::vector<LogprobEntry>* logprobs) {
  *end = EndReason::kNone;
  for (size_t j = 0; j < tokens.size(); ++j) {
    const int32_t token = tokens[j];
    const size_t kept = j + 1;
    if (params_.logprobs) {
      // Every kept token has its entry (an end-of-generation token's is
      // dropped with it below, as the token is not sent).
      const LogprobEntry* e = logprobs && j < logprobs->size() ? &(*logprobs)[j] : nullptr;
      held_logprobs_.push_back(e ? e->logprob : std::numeric_limits<float>::quiet_NaN());
      for (int32_t k = 0; k < params_.top_logprobs; ++k) {
        held_top_.push_back(e && static_cast<size_t>(k) < e->top.size() ? e->top[static_cast<size_t>(k)]
                                                                        : TokenLogprob{});
      }
    }
    if (!started_decoding_) {
      started_decoding_ = true;
      t_first_token_ = std::chrono::steady_clock::now();
    }
    ++generated_;
    if (tokenizer_.is_eog(token) && !params_.ignore_eos) {
      if (params_.logprobs) {  // not sent: neither is its entry
        held_logprobs_.pop_back();
        held_top_.resize(held_top_.size() - static_cast<size_t>(params_.top_logprobs));
      }
      *end = EndReason::kEos;
      return kept;
    }
    held_text_ += detok_->feed(token);
    held_tokens_.push_back(token);
    for (const auto& stop : params_.stop) {
      const size_t at = held_text_.find(stop);
      if (at != std::string::npos) {
        held_text_.resize(at);
        emit_text(true);
        *end = EndReason::kStopString;
        return kept;
      }
    }
    emit_text(false);
    if (generated_ >= static_cast<size_t>(params_.max_tokens)) {
      *end = EndReason::kMaxTokens;
      return kept;
    }
    if (kept >= room) {
      *end = EndReason::kContextFull;
      return kept;
    }
  }
  return tokens.size();
}

void Stream::flush(EndReason reason) {
  if (finished() || reason == EndReason::kStopString) return;
  held_text_ += detok_->flush();
  emit_text(true);
}

void Stream::finish(EndReason reason) {
  if (finished()) return;
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
  if (finished()) return;
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
  if (out.last()) consumer_done_ = true;
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
  if (!deliver.empty()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      callback_done_ = true;
    }
    cv_.notify_all();
  }
}

void Stream::wait() {
  Engine& engine = session_->engine();
  if (engine.manual()) {
    // No worker: drive the engine from here until this stream has ended.
    while (!finished()) engine.run_steps(0, 1);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return finished_ && (!callback_ || callback_done_); });
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
    if (generated_ > 1 && decode_ms > 0)
      s.tokens_per_second = static_cast<double>(generated_ - 1) / (decode_ms / 1000.0);
  }
  return s;
}

}  // namespace ember
