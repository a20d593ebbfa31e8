// core::FrameBudget: how many rows an engine step may run so that it fits the
// time left in a host's frame (manual mode, Engine::run_steps), from the
// measured costs of recent steps.
//
// A step's cost grows with its rows (one per token it runs) from a fixed
// part: cost(r) = fixed + per_row * r with fixed, per_row >= 0. So one step
// of s rows measured at C ms bounds every other step: cost(r) <= C for
// r <= s, and cost(r) <= C * r / s for r > s. The prediction is the tightest
// of these bounds over recent steps, each size at its slowest measurement
// (noise never makes a size look cheaper than it was), and a step costlier
// than a sample's bound drops that sample (measure). Nothing is extrapolated
// from a fit: a step larger than any measured is priced at the largest one's
// cost per row, which overestimates it by that step's fixed share. A step
// also runs at most twice the rows of the largest one measured, so a cost
// that grows faster than its rows is measured before it is relied on. (A
// least-squares fit over steps of 1 or 2 rows once sized a step at 89 rows
// that took 138 ms of a 16 ms frame.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace ember {

class FrameBudget {
 public:
  // The most rows a step may run whose predicted cost (an upper bound on
  // the measured costs) fits left_ms; 0: not even one. Before anything was
  // measured: 1.
  int32_t rows_within(double left_ms);
  // A step of `rows` rows took `ms` milliseconds.
  void measure(size_t rows, double ms);

 private:
  struct Sample {
    int32_t rows = 0;
    double ms = 0;
  };
  static constexpr size_t kSamples = 32;
  std::mutex mutex_;
  Sample samples_[kSamples];  // oldest first
  size_t count_ = 0;
};

}  // namespace ember
