// How many threads the CPU backend's next parallel call uses, chosen from
// measured speed.
//
// On a quiet machine every core helps. In a busy host (a game's render
// thread, another process) a core shared with something else makes the
// thread on it late to every join, and each of the ~5 joins per layer then
// waits a scheduler time slice: 2 threads on 2 cores with one core busy
// decode slower than 1 thread does. The governor measures the backend's
// decode-sized matmuls (seconds per weight byte) in windows of at least
// kWindowSeconds, runs one window at a neighbouring thread count (the next
// count in max, max/2, ..., 1) now and then, and moves there when it is
// faster by more than kMargin. A trial that loses doubles the time to the next
// one (kMinInterval .. kMaxInterval), so a steady machine pays ~2% for the
// probing and a core that frees up is used again within kMaxInterval.
//
// Results never depend on the thread count: every kernel computes each
// output row, attention head or element on one thread in one order.
//
// Not thread-safe except threads(): one thread (the backend's caller)
// records; any thread may read the current count.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace ember::cpu {

class ThreadGovernor {
 public:
  static constexpr double kWindowSeconds = 0.008;
  static constexpr int kWindowCalls = 8;
  static constexpr double kMinInterval = 0.05;
  static constexpr double kMaxInterval = 0.4;
  static constexpr double kMargin = 0.05;

  // adaptive = false: always max_threads.
  ThreadGovernor(int max_threads, bool adaptive);

  int threads() const { return threads_.load(std::memory_order_relaxed); }
  int max_threads() const { return levels_.front(); }
  bool adaptive() const { return adaptive_; }

  // One call that ran with threads() threads, ended at `now` (seconds on any
  // monotonic clock), took `seconds` for `work` units (bytes of weights);
  // work 0: a call that is not measured (only the test rotation counts it).
  void record(double now, double seconds, double work);

  // Counters for benchmarks and tests.
  struct Stats {
    int64_t windows = 0;
    int64_t trials = 0;
    int64_t switches = 0;
  };
  Stats stats() const { return stats_; }

  // Tests: every call runs with the next count of the ladder in turn, so a
  // test can prove results do not depend on the thread count. Process-wide.
  static void set_test_rotate(bool on);

 private:
  void set_level(int level);
  void end_window(double now, double cost);

  std::vector<int> levels_;  // max, max/2, ..., 1 (distinct)
  bool adaptive_;
  std::atomic<int> threads_;
  int current_ = 0;           // level in use outside trials
  int trial_ = -1;            // level of the window in progress when it is a trial
  int next_dir_ = 1;          // which neighbour the next trial tries (+1: fewer threads)
  std::vector<double> cost_;  // seconds per work unit, per level (< 0: unknown)
  double window_seconds_ = 0.0, window_work_ = 0.0;
  int window_calls_ = 0;
  double last_trial_ = -1.0, interval_ = kMinInterval;
  Stats stats_;
};

}  // namespace ember::cpu
