#include "core/engine/frame_budget.h"

#include <algorithm>
#include <cmath>

namespace ember {

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

}  // namespace ember
