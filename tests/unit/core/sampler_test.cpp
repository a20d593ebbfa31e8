#include "core/sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

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

}  // namespace
}  // namespace ember
