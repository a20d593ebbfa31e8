#include "core/sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ember {

void apply_logit_bias(const LogitBias& bias, float* row, int32_t n_vocab) {
  for (const auto& [token, b] : bias) {
    if (token >= 0 && token < n_vocab) row[token] += b;
  }
}

RowLogprobs::RowLogprobs(const float* row, int32_t n_vocab, int32_t top_n) : row_(row, row + n_vocab) {
  max_ = -std::numeric_limits<float>::infinity();
  for (float v : row_) max_ = std::max(max_, v);
  double sum = 0.0;
  if (std::isfinite(max_)) {
    for (float v : row_) sum += std::exp(static_cast<double>(v - max_));  // exp(-inf) = 0
  }
  log_sum_ = sum > 0.0 ? std::log(sum) : 0.0;
  if (top_n <= 0) return;
  const size_t n = std::min(static_cast<size_t>(top_n), row_.size());
  std::vector<int32_t> ids(row_.size());
  for (int32_t i = 0; i < n_vocab; ++i) ids[static_cast<size_t>(i)] = i;
  auto better = [this](int32_t a, int32_t b) {
    const float x = row_[static_cast<size_t>(a)], y = row_[static_cast<size_t>(b)];
    return x > y || (x == y && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(), better);
  for (size_t k = 0; k < n; ++k) top_.push_back({ids[k], entry_logprob(ids[k])});
}

float RowLogprobs::entry_logprob(int32_t token) const {
  const float v = row_[static_cast<size_t>(token)];
  if (!std::isfinite(max_) || v == -std::numeric_limits<float>::infinity()) {
    return -std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(static_cast<double>(v - max_) - log_sum_);
}

LogprobEntry RowLogprobs::entry(int32_t token) const {
  LogprobEntry e;
  e.token = token;
  e.logprob = token >= 0 && static_cast<size_t>(token) < row_.size() ? entry_logprob(token)
                                                                      : -std::numeric_limits<float>::infinity();
  e.top = top_;
  return e;
}

}  // namespace ember
