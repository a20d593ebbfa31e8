#include "core/kv_cache/streaming.h"

#include <cstdint>

#include <algorithm>
#include <string>

#include "core/util/status.h"

namespace ember {

namespace {
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
}  // namespace

void CachePolicy::validate(int32_t block_size, int32_t n_ctx_train) const {
  if (kind == CachePolicyKind::kFull) return;
  if (kind != CachePolicyKind::kWindow && kind != CachePolicyKind::kSink) {
    fail(StatusCode::kInvalidArgument, "cache policy: unknown kind");
  }
  if (sink_tokens < 0) fail(StatusCode::kInvalidArgument, "cache policy: sink_tokens must be >= 0");
  if (kind == CachePolicyKind::kWindow && sink_tokens != 0) {
    fail(StatusCode::kInvalidArgument, "cache policy: a window policy keeps no sink tokens");
  }
  if (window_tokens < block_size) {
    fail(StatusCode::kInvalidArgument, "cache policy: window_tokens (" + std::to_string(window_tokens) +
                                           ") must be at least the KV block size (" + std::to_string(block_size) + ")");
  }
  if (static_cast<int64_t>(sink_tokens) + window_tokens > n_ctx_train) {
    fail(StatusCode::kInvalidArgument, "cache policy: sink_tokens + window_tokens (" +
                                           std::to_string(static_cast<int64_t>(sink_tokens) + window_tokens) +
                                           ") exceed the model's context (" + std::to_string(n_ctx_train) + ")");
  }
}

StreamingLayout::StreamingLayout(int32_t sinks, int32_t window, int32_t block_size)
    : sinks_(sinks), window_(window), block_size_(block_size) {
  if (block_size <= 0 || sinks < 0 || window < block_size) {
    fail(StatusCode::kInvalidArgument, "streaming layout: need sinks >= 0 and window >= block size > 0");
  }
}

int32_t StreamingLayout::win_begin() const {
  return static_cast<int32_t>(sinks_ + n_evicted_ - dropped_blocks_ * block_size_);
}

int32_t StreamingLayout::max_slots() const { return static_cast<int32_t>(round_up(sinks_, block_size_) + window_); }

int32_t StreamingLayout::kv_len(int64_t n_processed) const {
  if (n_processed <= sinks_) return static_cast<int32_t>(n_processed);
  return static_cast<int32_t>(n_processed - dropped_blocks_ * block_size_);
}

int32_t StreamingLayout::resident(int64_t n_processed) const {
  const int64_t s = std::min<int64_t>(n_processed, sinks_);
  const int64_t w = std::max<int64_t>(0, n_processed - sinks_ - n_evicted_);
  return static_cast<int32_t>(s + w);
}

int32_t StreamingLayout::slot_of(int64_t t) const {
  if (t < sinks_) return static_cast<int32_t>(t);
  if (t < sinks_ + n_evicted_) fail(StatusCode::kInternal, "streaming layout: slot of an evicted token");
  return static_cast<int32_t>(t - dropped_blocks_ * block_size_);
}

int32_t StreamingLayout::position_of(int64_t t) const {
  if (t < sinks_) return static_cast<int32_t>(t);
  if (t < sinks_ + n_evicted_) fail(StatusCode::kInternal, "streaming layout: position of an evicted token");
  return static_cast<int32_t>(t - n_evicted_);
}

StreamingLayout::Eviction StreamingLayout::plan(int64_t n_processed, int32_t n_new) const {
  if (n_new < 0) fail(StatusCode::kInternal, "streaming layout: negative chunk");
  if (n_processed < sinks_ + n_evicted_ && n_evicted_ > 0) {
    fail(StatusCode::kInternal, "streaming layout: processed count inside the evicted range");
  }
  Eviction e;
  e.first_block = static_cast<int32_t>(round_up(sinks_, block_size_) / block_size_);
  int64_t evicted = n_evicted_, dropped = dropped_blocks_;
  int64_t in_window = std::max<int64_t>(0, n_processed + n_new - sinks_ - evicted);
  while (in_window > window_) {
    const int64_t wb = sinks_ + evicted - dropped * block_size_;
    int64_t n;
    if (wb % block_size_ != 0) {
      n = round_up(wb, block_size_) - wb;
      e.hole_tokens += static_cast<int32_t>(n);
    } else {
      n = block_size_;
      ++dropped;
      ++e.dropped_blocks;
    }
    // Only tokens already processed are evicted (max_chunk guarantees it).
    if (sinks_ + evicted + n > n_processed)
      fail(StatusCode::kInternal, "streaming layout: eviction past processed tokens");
    evicted += n;
    in_window -= n;
  }
  e.shift = static_cast<int32_t>(evicted - n_evicted_);
  return e;
}

int32_t StreamingLayout::chunk_limit(int64_t n_processed) const {
  const Eviction first = plan(n_processed, 1);
  const int64_t evicted = n_evicted_ + first.shift;
  // After the first token's eviction the window may grow to W again.
  const int64_t limit = static_cast<int64_t>(window_) + sinks_ + evicted - n_processed;
  return static_cast<int32_t>(std::clamp<int64_t>(limit, 1, INT32_MAX));
}

void StreamingLayout::apply(const Eviction& e) {
  n_evicted_ += e.shift;
  dropped_blocks_ += e.dropped_blocks;
}

bool StreamingLayout::consistent() const {
  if (n_evicted_ < 0 || dropped_blocks_ < 0) return false;
  // Divided, not multiplied: the counts may come from a corrupt file.
  if (dropped_blocks_ > n_evicted_ / block_size_) return false;
  // Positions and slots are int32: more evicted tokens than that is corrupt.
  if (n_evicted_ > INT32_MAX - sinks_) return false;
  const int64_t wb = win_begin();
  if (wb < sinks_ || wb > round_up(sinks_, block_size_)) return false;
  if (n_evicted_ > 0 && wb != round_up(sinks_, block_size_)) return false;
  return true;
}

}  // namespace ember
