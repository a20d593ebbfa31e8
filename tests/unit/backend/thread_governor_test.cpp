// cpu::ThreadGovernor on a simulated machine: seconds per byte as a function
// of the thread count, changed mid-run (a core becomes busy, then free).
#include "cpu/thread_governor.h"

#include <gtest/gtest.h>

#include <functional>

namespace ember::cpu {
namespace {

// Runs calls of 1 MB for `duration` simulated seconds; returns the
// fraction of calls that ran with `want` threads in the last half.
struct Sim {
  ThreadGovernor gov;
  double now = 0.0;
  explicit Sim(int max_threads) : gov(max_threads, true) {}
  double run(double duration, const std::function<double(int)>& sec_per_mb, int want) {
    const double end = now + duration, half = now + duration / 2;
    int64_t late = 0, late_want = 0;
    while (now < end) {
      const int t = gov.threads();
      const double s = sec_per_mb(t);
      now += s;
      gov.record(now, s, 1e6);
      if (now >= half) {
        ++late;
        late_want += t == want;
      }
    }
    return static_cast<double>(late_want) / static_cast<double>(late);
  }
};

TEST(ThreadGovernor, LaddersHalveToOne) {
  ThreadGovernor g(6, true);
  EXPECT_EQ(g.threads(), 6);
  EXPECT_EQ(g.max_threads(), 6);
  ThreadGovernor fixed(4, false);
  for (int i = 0; i < 1000; ++i) fixed.record(i * 0.01, 0.01, 1e6);
  EXPECT_EQ(fixed.threads(), 4);
  EXPECT_EQ(fixed.stats().trials, 0);
}

TEST(ThreadGovernor, StaysOnAllCoresWhenTheyAreFastest) {
  Sim sim(2);
  const double frac = sim.run(
      5.0, [](int t) { return t == 2 ? 0.0005 : 0.0009; }, 2);
  EXPECT_GT(frac, 0.97);  // trials at 1 thread take < 3% of the calls
  EXPECT_EQ(sim.gov.stats().switches, 0);
}

TEST(ThreadGovernor, FallsBackWhenACoreIsBusyAndRecoversWhenItFrees) {
  Sim sim(2);
  auto quiet = [](int t) { return t == 2 ? 0.0005 : 0.0009; };
  auto busy = [](int t) { return t == 2 ? 0.0020 : 0.0009; };  // the late thread holds every join
  EXPECT_GT(sim.run(2.0, quiet, 2), 0.97);
  EXPECT_GT(sim.run(2.0, busy, 1), 0.97);
  // Back to 2 threads within the longest trial interval (plus two windows).
  const double t0 = sim.now;
  while (sim.gov.threads() != 2 || sim.now - t0 < 0.001) {
    const double s = quiet(sim.gov.threads());
    sim.now += s;
    sim.gov.record(sim.now, s, 1e6);
    ASSERT_LT(sim.now - t0, ThreadGovernor::kMaxInterval + 0.1) << "did not recover";
  }
  EXPECT_GT(sim.run(2.0, quiet, 2), 0.97);
}

TEST(ThreadGovernor, FindsTheBestCountOnALongerLadder) {
  Sim sim(16);  // 16, 8, 4, 2, 1: 4 threads fastest (the others share busy cores)
  auto cost = [](int t) { return t == 4 ? 0.0004 : t == 8 ? 0.0007 : t == 2 ? 0.0006 : t == 16 ? 0.002 : 0.001; };
  EXPECT_GT(sim.run(6.0, cost, 4), 0.95);
}

TEST(ThreadGovernor, UnmeasuredCallsChangeNothing) {
  ThreadGovernor g(2, true);
  for (int i = 0; i < 10000; ++i) g.record(i * 0.01, 0.01, 0.0);
  EXPECT_EQ(g.stats().windows, 0);
  EXPECT_EQ(g.threads(), 2);
}

TEST(ThreadGovernor, TestRotationVisitsEveryCount) {
  ThreadGovernor g(4, false);
  ThreadGovernor::set_test_rotate(true);
  int seen[5] = {};
  for (int i = 0; i < 6; ++i) {
    g.record(i, 0.001, 0.0);
    ++seen[g.threads()];
  }
  ThreadGovernor::set_test_rotate(false);
  EXPECT_EQ(seen[4] + seen[2] + seen[1], 6);
  EXPECT_GT(seen[4], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_GT(seen[1], 0);
}

}  // namespace
}  // namespace ember::cpu
