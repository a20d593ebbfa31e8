#include "core/engine/frame_budget.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/engine/engine.h"

namespace ember {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

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

int32_t FrameBudget::rows_within(double left_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (count_ == 0) return 1;  // nothing measured yet: one token (decodes still run)
  SizeCost sizes[kSamples];
  const size_t m = slowest_per_size(samples_, count_, sizes);
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

void FrameBudget::measure(size_t rows, double ms) {
  if (rows == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const int32_t r = static_cast<int32_t>(std::min<size_t>(rows, 65536));
  // A step costlier than an older sample's bound refutes that sample (the
  // cost is not only rows: which sequences run and how long their histories
  // are count too): it predicts nothing any more.
  size_t keep = 0;
  for (size_t i = 0; i < count_; ++i) {
    const Sample& c = samples_[i];
    const double bound = r <= c.rows ? c.ms : c.ms * r / c.rows;
    if (bound >= ms) samples_[keep++] = c;
  }
  count_ = keep;
  if (count_ == kSamples) {  // the oldest goes
    std::copy(samples_ + 1, samples_ + kSamples, samples_);
    --count_;
  }
  samples_[count_++] = {r, ms};
}

// Manual mode: the host's frame loop (ember_engine_step).
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
      budget = frame_.rows_within(max_ms - ms_since(t0));
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
    frame_.measure(n, ms_since(ts));
    total += n;
    if (n == 0) break;
    if (max_tokens > 0 && static_cast<int64_t>(total) >= max_tokens) break;
    if (max_ms > 0 && ms_since(t0) >= max_ms) break;
  }
  return total;
}

}  // namespace ember
