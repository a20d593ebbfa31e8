#include "core/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

namespace ember {
namespace {

std::vector<float> logits_for(std::initializer_list<float> v) { return std::vector<float>(v); }

TEST(Sampler, GreedyPicksArgmax) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, 4);
  auto l = logits_for({0.1f, 2.0f, -1.0f, 1.9f});
  EXPECT_EQ(s.sample(l.data(), {}), 1);
}

// The vectorized greedy argmax is std::max_element's answer: the first of
// equal maxima, NaNs never chosen unless first, -0 and +0 equal, any length.
TEST(Sampler, ArgmaxIsMaxElementsAnswer) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-5.f, 5.f);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int32_t n : {1, 2, 15, 16, 17, 33, 1000, 262147}) {
    for (int trial = 0; trial < 12; ++trial) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = trial % 3 == 0 ? std::round(u(rng)) : u(rng);  // ties on some trials
      if (trial == 4) v[0] = nan;
      if (trial == 5) v[static_cast<size_t>(n) / 2] = nan;
      if (trial == 6) std::fill(v.begin(), v.end(), -inf);
      if (trial == 7) std::fill(v.begin(), v.end(), 0.f), v[static_cast<size_t>(n) - 1] = -0.f;
      if (trial == 8) std::fill(v.begin(), v.end(), -0.f), v[static_cast<size_t>(n) - 1] = 0.f;
      if (trial == 9) v[static_cast<size_t>(n) - 1] = inf;
      if (trial == 10) std::fill(v.begin(), v.end(), nan);
      if (trial == 11) v[0] = nan, v[static_cast<size_t>(n) - 1] = 100.f;
      const int32_t want = static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
      EXPECT_EQ(Sampler::argmax(v.data(), n), want) << "n=" << n << " trial " << trial;
    }
  }
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 42;
  Sampler a(p, 8), b(p, 8);
  for (int i = 0; i < 100; ++i) {
    auto la = logits_for({0, 0.5f, 1, 1.5f, 0, 0.2f, 0.3f, 0.9f});
    auto lb = la;
    EXPECT_EQ(a.sample(la.data(), {}), b.sample(lb.data(), {}));
  }
}

TEST(Sampler, TopKRestrictsCandidates) {
  SamplingParams p;
  p.temperature = 5.0f;  // flat
  p.top_k = 2;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  Sampler s(p, 5);
  for (int i = 0; i < 200; ++i) {
    auto l = logits_for({0.0f, 3.0f, 2.9f, 0.1f, 0.2f});
    const int t = s.sample(l.data(), {});
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
}

TEST(Sampler, TopPAndMinPCut) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.5f;  // the first candidate alone has p > 0.5
  p.min_p = 0.0f;
  Sampler s(p, 3);
  for (int i = 0; i < 100; ++i) {
    auto l = logits_for({5.0f, 1.0f, 0.0f});
    EXPECT_EQ(s.sample(l.data(), {}), 0);
  }
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // token 1 has p1/p0 = e^-4 < 0.5
  Sampler m(p, 3);
  for (int i = 0; i < 100; ++i) {
    auto l = logits_for({5.0f, 1.0f, 0.0f});
    EXPECT_EQ(m.sample(l.data(), {}), 0);
  }
}

TEST(Sampler, TemperatureFollowsDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 7;
  Sampler s(p, 2);
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    auto l = logits_for({0.0f, std::log(3.0f)});  // p(1) = 0.75
    ones += s.sample(l.data(), {}) == 1;
  }
  EXPECT_NEAR(ones / static_cast<double>(n), 0.75, 0.015);
}

TEST(Sampler, RepeatPenaltyDemotesSeenTokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repeat_penalty = 2.0f;
  Sampler s(p, 3);
  auto l = logits_for({1.0f, 1.5f, 0.0f});
  EXPECT_EQ(s.sample(l.data(), {1}), 0);  // 1.5 / 2 < 1.0
  SamplingParams q;
  q.temperature = 0.0f;
  q.presence_penalty = 1.0f;
  Sampler t(q, 3);
  auto l2 = logits_for({1.0f, 1.5f, 0.0f});
  EXPECT_EQ(t.sample(l2.data(), {1, 1}), 0);
  SamplingParams r;
  r.temperature = 0.0f;
  r.frequency_penalty = 0.3f;
  Sampler u(r, 3);
  auto l3 = logits_for({1.0f, 1.5f, 0.0f});
  EXPECT_EQ(u.sample(l3.data(), {1}), 1);  // 1.2 > 1.0
  auto l4 = logits_for({1.0f, 1.5f, 0.0f});
  EXPECT_EQ(u.sample(l4.data(), {1, 1}), 0);  // 0.9 < 1.0
}

// sample_allowed (tokens checked against a constraint in order of logit)
// draws the same token, from the same generator state, as sample() on the row
// with every rejected token at -inf: over random rows, allowed sets from
// nearly everything to a handful, greedy and sampled, with and without
// penalties, and with a check budget small enough to fall back.
TEST(Sampler, CheckingTokensEqualsSamplingTheMaskedRow) {
  const int32_t n_vocab = 2000;
  uint64_t x = 12345;
  auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int fell_back = 0, decided = 0;
  for (int trial = 0; trial < 400; ++trial) {
    SamplingParams p;
    p.temperature = trial % 5 == 0 ? 0.0f : 0.5f + static_cast<float>(trial % 4) * 0.3f;
    p.top_k = trial % 3 == 0 ? 40 : (trial % 3 == 1 ? 5 : 100);
    p.repeat_penalty = trial % 2 ? 1.3f : 1.0f;
    p.seed = static_cast<uint64_t>(trial);
    const int keep_in = 1 + static_cast<int>(next() % 4) * 30;  // ~1/1 .. ~1/91 of the tokens allowed
    std::vector<char> allowed(n_vocab);
    for (int32_t t = 0; t < n_vocab; ++t) allowed[t] = next() % static_cast<uint64_t>(keep_in) == 0;
    std::vector<float> row(n_vocab);
    for (float& v : row) v = static_cast<float>(next() % 2000) / 100.0f - 10.0f;  // ties happen
    std::vector<int32_t> history;
    for (int i = 0; i < 20; ++i) history.push_back(static_cast<int32_t>(next() % n_vocab));
    const int32_t budget = trial % 7 == 0 ? 8 : 128;

    std::vector<float> masked = row;
    for (int32_t t = 0; t < n_vocab; ++t) {
      if (!allowed[t]) masked[t] = -INFINITY;
    }
    Sampler ref(p, n_vocab), checked(p, n_vocab);
    std::vector<float> checked_row = row;
    for (int draw = 0; draw < 3; ++draw) {  // the generators stay in step
      std::vector<float> m = masked, c = checked_row;
      const int32_t want = ref.sample(m.data(), history);
      int32_t got = checked.sample_allowed(
          c.data(), history, [&](int32_t t) { return allowed[t] != 0; }, budget);
      if (got < 0) {
        ++fell_back;
        for (int32_t t = 0; t < n_vocab; ++t) {
          if (!allowed[t]) c[t] = -INFINITY;
        }
        got = checked.sample_penalized(c.data());
      } else {
        ++decided;
      }
      ASSERT_EQ(got, want) << "trial " << trial << " draw " << draw;
      ASSERT_TRUE(allowed[got]);
    }
  }
  // Both ways were taken.
  EXPECT_GT(fell_back, 50);
  EXPECT_GT(decided, 50);
}

}  // namespace
}  // namespace ember

namespace ember {
namespace {

// survivors() selects the top k in one pass through a heap of k; it must be
// the k tokens, in the order, that sorting the whole row gives (ties broken
// by the lower id), for any k, ties and -inf included.
TEST(Sampler, TopKSurvivorsAreTheSortedRowsFirstK) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t n = 1 + static_cast<int32_t>(rng() % 3000);
    std::vector<float> row(static_cast<size_t>(n));
    for (float& x : row) {
      const uint32_t r = rng() % 100;
      x = r < 30 ? static_cast<float>(rng() % 8) : r < 35 ? -INFINITY : static_cast<float>(rng() % 100000) / 997.0f;
    }
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i;
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int32_t k : {1, 2, 5, 40, 64, n - 1, n}) {
      if (k < 1 || k >= n) continue;
      SamplingParams p;
      p.temperature = 1e6f;  // flat: nothing cut by top-p / min-p
      p.top_p = 1.0f;
      p.min_p = 0.0f;
      p.top_k = k;
      Sampler s(p, n);
      std::vector<float> logits = row;
      std::vector<std::pair<int32_t, double>> dist;
      s.distribution(logits.data(), {}, dist);
      size_t finite = 0;
      for (int32_t i = 0; i < k; ++i) finite += std::isfinite(row[ids[static_cast<size_t>(i)]]) ? 1 : 0;
      ASSERT_GE(dist.size(), std::min<size_t>(finite, 1)) << "n " << n << " k " << k;
      for (size_t i = 0; i < dist.size(); ++i)
        ASSERT_EQ(dist[i].first, ids[i]) << "n " << n << " k " << k << " rank " << i;
    }
  }
}

}  // namespace
}  // namespace ember
