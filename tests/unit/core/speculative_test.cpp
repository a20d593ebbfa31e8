// core/speculative alone: tree growth (threshold branches, caps, the pacer,
// the adaptive trigger), acceptance (greedy walk, rejection sampling's
// exactness on known distributions) and the n-gram drafter.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "core/kv_cache/kv_manager.h"
#include "core/speculative/drafter.h"
#include "core/speculative/tree.h"
#include "core/util/status.h"
#include "cpu/cpu_backend.h"

namespace ember::speculative {
namespace {

TreeParams params(float threshold = 0.3f, int32_t nodes = 12, int32_t depth = 8, float alpha = 0.25f) {
  TreeParams p;
  p.threshold = threshold;
  p.max_nodes = nodes;
  p.max_depth = depth;
  p.alpha = alpha;
  return p;
}

TEST(SpecTree, CandidatesAtTheThresholdOpenBranches) {
  TreeGrower g(params());
  g.start(7, 12);
  EXPECT_EQ(g.next_leaf(), 0);  // the root first
  g.extend(0, {{1, 0.5f}, {2, 0.3f}, {3, 0.2f}});
  const DraftTree& t = g.tree();
  ASSERT_EQ(t.size(), 3);  // 3 is below the threshold
  EXPECT_EQ(t.children(0), (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(t.conf[1], 0.5f);
  EXPECT_FLOAT_EQ(t.conf[2], 0.3f);
  EXPECT_EQ(t.depth[2], 1);
  // The most likely candidate extends even below the threshold...
  g.extend(1, {{4, 0.25f}});
  EXPECT_EQ(t.size(), 4);
  EXPECT_EQ(t.path_tokens(3), (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(t.path_to(3), (std::vector<int32_t>{1, 3}));
  // ... unless its branch's confidence would fall below min_confidence
  // (0.5 * 0.25 * 0.7 < 0.1).
  g.extend(3, {{5, 0.7f}});
  EXPECT_EQ(t.size(), 4);
  EXPECT_FALSE(t.open[3]);
  // An empty proposal closes the leaf.
  g.extend(2, {});
  EXPECT_FALSE(t.open[2]);
}

TEST(SpecTree, PacerPicksTheBranchWhoseTokensLagItsConfidence) {
  TreeGrower g(params(0.2f, 30, 8, 0.0f));
  g.start(0, 30);
  g.extend(0, {{1, 0.6f}, {2, 0.4f}});
  // Two leaves at depth 1: conf shares 0.6 / 0.4, token shares 0.5 / 0.5.
  EXPECT_EQ(g.next_leaf(), 1);
  g.extend(1, {{3, 0.9f}});
  // Leaves: node 2 (conf 0.4, depth 1), node 3 (conf 0.54, depth 2).
  // Shares: conf 0.4/0.94 = 0.43 vs tokens 1/3; node 3: 0.57 vs 2/3.
  EXPECT_EQ(g.next_leaf(), 2);
}

TEST(SpecTree, CapsAndTheConfidenceTrigger) {
  TreeGrower g(params(0.3f, 3, 2, 0.25f));
  g.start(0, 10);  // the stream's cap (3) wins over the caller's 10
  g.extend(0, {{1, 0.5f}, {2, 0.4f}, {3, 0.35f}, {4, 0.3f}});
  EXPECT_EQ(g.tree().drafted(), 3);
  EXPECT_EQ(g.next_leaf(), -1);  // node cap
  TreeGrower d(params(0.3f, 10, 2, 0.0f));
  d.start(0, 10);
  d.extend(0, {{1, 0.9f}});
  d.extend(1, {{2, 0.9f}});
  EXPECT_FALSE(d.tree().open[2]);  // depth cap
  EXPECT_EQ(d.next_leaf(), -1);
  // Alpha: verify once the best branch falls below it.
  TreeGrower a(params(0.3f, 10, 8, 0.5f));
  a.start(0, 10);
  a.extend(0, {{1, 0.8f}});
  EXPECT_EQ(a.next_leaf(), 1);  // 0.8 >= 0.5
  a.extend(1, {{2, 0.5f}});
  EXPECT_EQ(a.next_leaf(), -1);  // 0.4 < 0.5
}

TEST(SpecTree, AlphaHalvesAfterFullAcceptanceElseMismatchFraction) {
  TreeGrower g(params(0.3f, 10, 8, 0.4f));
  g.start(0, 10);
  g.extend(0, {{1, 0.9f}});
  g.extend(1, {{2, 0.9f}});
  g.verified(2, 2);  // the whole branch accepted
  EXPECT_FLOAT_EQ(g.alpha(), 0.2f);
  g.start(0, 10);
  g.extend(0, {{1, 0.9f}});
  g.extend(1, {{2, 0.9f}});
  g.extend(2, {{3, 0.9f}});
  g.extend(3, {{4, 0.9f}});
  g.verified(1, 1);  // 1 of the branch's 4 accepted: 3/4 rejected
  EXPECT_FLOAT_EQ(g.alpha(), 0.75f);
  EXPECT_THROW(params(0.0f).validate(), Error);
  EXPECT_THROW(params(0.3f, 0).validate(), Error);
  EXPECT_THROW(params(0.3f, 65).validate(), Error);
  EXPECT_THROW(params(0.3f, 8, 0).validate(), Error);
  EXPECT_THROW(params(0.3f, 8, 8, 1.5f).validate(), Error);
  EXPECT_NO_THROW(params().validate());
}

using Dist = std::vector<std::pair<int32_t, double>>;

TEST(SpecAccept, GreedyFollowsTheTargetsArgmaxAndAddsItsNextToken) {
  DraftTree t;
  t.reset(0);
  t.add(0, 5, 0.5f);  // 1
  t.add(0, 6, 0.5f);  // 2
  t.add(2, 7, 0.5f);  // 3
  t.add(3, 8, 0.5f);  // 4
  // The target: after root 6, after 2 -> 7, after 3 -> 9 (8 drafted).
  std::map<int32_t, int32_t> argmax = {{0, 6}, {2, 7}, {3, 9}, {1, 1}, {4, 1}};
  auto dist = [&](int32_t node) { return Dist{{argmax[node], 1.0}}; };
  auto never = []() -> double {
    ADD_FAILURE() << "greedy draws nothing";
    return 0.0;
  };
  Acceptance a = accept_tree(t, true, 100, dist, never);
  EXPECT_EQ(a.path, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(a.tokens, (std::vector<int32_t>{6, 7, 9}));
  // max_tokens caps what is emitted (the last one is never a kept node).
  a = accept_tree(t, true, 2, dist, never);
  EXPECT_EQ(a.path, (std::vector<int32_t>{2}));
  EXPECT_EQ(a.tokens, (std::vector<int32_t>{6, 7}));
  a = accept_tree(t, true, 1, dist, never);
  EXPECT_TRUE(a.path.empty());
  EXPECT_EQ(a.tokens, (std::vector<int32_t>{6}));
}

// One node's rejection sampling over three drafted children: the emitted
// first token's frequencies equal p (a chi-square-free check with a tight
// tolerance on 400k draws).
TEST(SpecAccept, RejectionSamplingKeepsTheTargetDistribution) {
  DraftTree t;
  t.reset(0);
  t.add(0, 2, 0.5f);
  t.add(0, 0, 0.3f);
  t.add(0, 3, 0.2f);
  const Dist p = {{0, 0.1}, {1, 0.2}, {2, 0.3}, {3, 0.05}, {4, 0.35}};
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  auto uniform = [&] { return u(rng); };
  auto dist = [&](int32_t node) { return node == 0 ? p : Dist{{9, 1.0}}; };
  std::map<int32_t, int> counts;
  const int n = 400000;
  for (int i = 0; i < n; ++i) counts[accept_tree(t, false, 2, dist, uniform).tokens.front()]++;
  for (const auto& [tok, prob] : p) {
    EXPECT_NEAR(counts[tok] / static_cast<double>(n), prob, 0.004) << "token " << tok;
  }
  // The broken rule of the distribution test is visibly off here too.
  testing::g_broken_acceptance = true;
  std::map<int32_t, int> broken;
  for (int i = 0; i < n; ++i) broken[accept_tree(t, false, 2, dist, uniform).tokens.front()]++;
  testing::g_broken_acceptance = false;
  EXPECT_GT(std::fabs(broken[2] / static_cast<double>(n) - 0.3), 0.02);
}

TEST(SpecNgram, ProposesWhatFollowedTheLongestEarlierMatch) {
  auto backend = make_cpu_backend(1);
  KvGeometry g;
  g.num_layers = 1;
  g.num_kv_heads = 1;
  g.head_dim = 8;
  g.block_size = 4;
  g.num_blocks = 8;
  KvManager kv(*backend, g, false, KvManager::Rope{std::vector<RopeSpec>(1, RopeSpec{8})});
  auto seq = kv.create(CachePolicy{}, 64, 64);
  // ... 1 2 3 4 ... 1 2 3 5 ... 1 2 3 4 ... 9 1 2 3  (root: 3)
  const std::vector<int32_t> h = {7, 1, 2, 3, 4, 8, 1, 2, 3, 5, 6, 1, 2, 3, 4, 9, 1, 2, 3};
  kv.append(*seq, h.data(), h.size(), false);
  DraftTree t;
  t.reset(3);
  NgramDrafter d;
  std::vector<Candidate> c;
  // Before any feedback a match is trusted half: (0 + 1) / (0 + 2).
  EXPECT_FLOAT_EQ(d.reliability(3), 0.5f);
  d.propose(*seq, t, 0, 4, c);
  ASSERT_EQ(c.size(), 2u);  // "1 2 3" -> 4 twice, 5 once
  EXPECT_EQ(c[0].token, 4);
  EXPECT_FLOAT_EQ(c[0].prob, 0.5f * 2.0f / 3.0f);
  EXPECT_EQ(c[1].token, 5);
  // Extending the branch with 4: "2 3 4" -> 8 once, 9 once (most recent first).
  const int32_t n1 = t.add(0, 4, c[0].prob);
  d.propose(*seq, t, n1, 4, c);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].token, 9);
  EXPECT_EQ(c[1].token, 8);
  EXPECT_FLOAT_EQ(c[0].prob, 0.25f);
  // Verification accepted node 1 (from a 3-token match) and a node 2 drafted
  // from the 4-token match "1 2 3 4" was rejected: the estimates follow.
  t.add(n1, 9, c[0].prob);
  d.verified(t, {1});
  EXPECT_FLOAT_EQ(d.reliability(3), 2.0f / 3.0f);
  EXPECT_FLOAT_EQ(d.reliability(4), 1.0f / 3.0f);
  // Nothing ever followed token 42.
  t.reset(42);
  const std::vector<int32_t> one = {42};
  kv.append(*seq, one.data(), 1, false);
  d.propose(*seq, t, 0, 4, c);
  EXPECT_TRUE(c.empty());
}

TEST(SpecDrafter, TopCandidatesAreTheMostProbableInOrder) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f};
  std::vector<Candidate> c;
  top_candidates(logits.data(), 5, 3, c);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].token, 1);  // ties: lower id first
  EXPECT_EQ(c[1].token, 3);
  EXPECT_EQ(c[2].token, 2);
  double sum = 0;
  for (float l : logits) sum += std::exp(l - 2.0);
  EXPECT_NEAR(c[0].prob, 1.0 / sum, 1e-6);
}

// The vectorized float exp behind the probabilities against double-precision
// exp, over a vocabulary's worth of logits spanning far more than float's
// exp range (and -inf, and an odd count for the tail).
TEST(SpecDrafter, TopCandidatesProbabilitiesMatchDoublePrecision) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  for (int32_t n : {49152, 1001, 7}) {
    std::vector<float> logits(static_cast<size_t>(n));
    for (float& l : logits) l = normal(gen);
    logits[3] = -std::numeric_limits<float>::infinity();
    logits[5] = -500.0f;
    logits[1] = 40.0f;  // everything below 40 - 87 underflows float's exp
    std::vector<Candidate> c;
    top_candidates(logits.data(), n, 5, c);
    ASSERT_EQ(c.size(), 5u);
    double sum = 0.0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - 40.0);
    EXPECT_EQ(c[0].token, 1);
    for (const Candidate& cand : c) {
      const double want = std::exp(static_cast<double>(logits[static_cast<size_t>(cand.token)]) - 40.0) / sum;
      EXPECT_NEAR(cand.prob, want, 1e-5 * want + 1e-30) << "n " << n << " token " << cand.token;
    }
  }
}

// A model drafter's payoff gate: the model's candidates below its floor are
// not offered; a tree that did not earn its forward passes and rows (or was
// never verified: it drafted nothing) makes the model sit out 1, 2, 4 ..
// trees; a tree that paid resets that; a model that cannot pay never runs.
TEST(SpecDrafter, PayoffGateSkipsTreesAfterTreesThatDidNotPay) {
  const LookupBeside no_lookup(false);
  PayoffGate expensive(0.9f, true);  // floor 1.1: nothing it drafts could pay
  expensive.begin_tree();
  EXPECT_FALSE(expensive.admit());
  expensive.set_on(false);  // (tests: the model on every tree)
  expensive.begin_tree();
  EXPECT_TRUE(expensive.admit());

  PayoffGate gate(0.3f, true);
  EXPECT_FLOAT_EQ(gate.floor(), 0.5f);
  DraftTree t;
  // A tree that paid: one forward, one drafted row, accepted (1 - 0.2 - 0.3 > 0).
  gate.begin_tree();
  ASSERT_TRUE(gate.admit());
  gate.forward();
  std::vector<Candidate> c = {{5, 0.9f}, {7, 0.45f}, {6, 0.6f}};
  gate.offer(0, c, no_lookup);
  ASSERT_EQ(c.size(), 2u);  // 7 is below the floor
  EXPECT_EQ(c[0].token, 5);
  EXPECT_EQ(c[1].token, 6);
  t.reset(1);
  const int32_t n5 = t.add(0, 5, 0.9f);
  gate.verified(t, {n5});
  // A tree that did not: its draft rejected. The model sits out one tree.
  gate.begin_tree();
  ASSERT_TRUE(gate.admit());
  gate.forward();
  c = {{8, 0.9f}};
  gate.offer(0, c, no_lookup);
  t.reset(1);
  t.add(0, 8, 0.9f);
  gate.verified(t, {});
  gate.begin_tree();
  EXPECT_FALSE(gate.admit());
  // Again, unverified (nothing drafted): two trees out, then it runs.
  gate.begin_tree();
  ASSERT_TRUE(gate.admit());
  gate.forward();
  c = {{9, 0.2f}};
  gate.offer(0, c, no_lookup);
  EXPECT_TRUE(c.empty());
  for (int i = 0; i < 2; ++i) {
    gate.begin_tree();
    EXPECT_FALSE(gate.admit()) << i;
  }
  gate.begin_tree();
  ASSERT_TRUE(gate.admit());
  // A tree that pays resets the count: the next one runs.
  gate.forward();
  c = {{5, 0.9f}};
  gate.offer(0, c, no_lookup);
  t.reset(1);
  gate.verified(t, {t.add(0, 5, 0.9f)});
  gate.begin_tree();
  EXPECT_TRUE(gate.admit());
}

}  // namespace
}  // namespace ember::speculative
