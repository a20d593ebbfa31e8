#include "cpu/thread_governor.h"

#include <algorithm>

namespace ember::cpu {
namespace {
std::atomic<bool> g_test_rotate{false};
}  // namespace

void ThreadGovernor::set_test_rotate(bool on) { g_test_rotate.store(on, std::memory_order_relaxed); }

ThreadGovernor::ThreadGovernor(int max_threads, bool adaptive) : adaptive_(adaptive), threads_(1) {
  max_threads = std::max(1, max_threads);
  for (int t = max_threads;; t /= 2) {
    levels_.push_back(t);
    if (t == 1) break;
  }
  cost_.assign(levels_.size(), -1.0);
  threads_.store(levels_.front(), std::memory_order_relaxed);
}

void ThreadGovernor::set_level(int level) {
  threads_.store(levels_[static_cast<size_t>(level)], std::memory_order_relaxed);
}

void ThreadGovernor::record(double now, double seconds, double work) {
  const int n_levels = static_cast<int>(levels_.size());
  if (n_levels == 1) return;
  if (g_test_rotate.load(std::memory_order_relaxed)) {
    current_ = (current_ + 1) % n_levels;
    set_level(current_);
    return;
  }
  if (!adaptive_ || !(seconds >= 0.0) || !(work > 0.0)) return;
  window_seconds_ += seconds;
  window_work_ += work;
  ++window_calls_;
  if (window_calls_ < kWindowCalls || window_seconds_ < kWindowSeconds) return;
  const double cost = window_seconds_ / window_work_;
  window_seconds_ = window_work_ = 0.0;
  window_calls_ = 0;
  end_window(now, cost);
}

void ThreadGovernor::end_window(double now, double cost) {
  const int n_levels = static_cast<int>(levels_.size());
  ++stats_.windows;
  if (trial_ >= 0) {
    cost_[static_cast<size_t>(trial_)] = cost;
    if (cost < cost_[static_cast<size_t>(current_)] * (1.0 - kMargin)) {
      current_ = trial_;  // keep going the same way next time
      interval_ = kMinInterval;
      ++stats_.switches;
    } else {
      interval_ = std::min(interval_ * 2.0, kMaxInterval);
      next_dir_ = -next_dir_;
    }
    trial_ = -1;
    last_trial_ = now;
    set_level(current_);
    return;
  }
  // The window just measured is the one the next trial is compared with.
  cost_[static_cast<size_t>(current_)] = cost;
  if (last_trial_ < 0.0) last_trial_ = now;  // the first window only measures
  if (now - last_trial_ < interval_) return;
  int cand = current_ + next_dir_;
  if (cand < 0 || cand >= n_levels) {
    next_dir_ = -next_dir_;
    cand = current_ + next_dir_;
  }
  trial_ = cand;
  ++stats_.trials;
  set_level(trial_);
}

}  // namespace ember::cpu
