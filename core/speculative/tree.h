// core::speculative — token trees as LLMCad grows them, and the acceptance
// that verifies them against the target model without changing its output.
//
// A tree's node 0 is the root: the stream's pending token (the last token of
// the history, sampled but not yet run through the model). Every other node
// is a drafted token; its parent has a lower index, so a root-to-leaf path is
// increasing indices. Node i >= 1 is provisional token i - 1 of the sequence
// (core/kv_cache/kv_manager.h), at history index (last history index) +
// depth(i), in cache slot (last history slot) + i.
//
// Growth (LLMCad, Xu et al. 2023, §3): a drafter proposes the next tokens of
// the branch the pacer picks; the most likely candidate always extends the
// branch and every other candidate whose draft probability reaches
// `threshold` opens a branch beside it. The pacer gives the next draft token
// to the branch whose share of the tokens lags its share of the cumulative
// confidence (the product of its tokens' draft probabilities) the most.
// Drafting stops — and the target verifies the whole tree in one pass — when
// the best branch's confidence falls below alpha, or at the node or depth
// cap. Alpha adapts: halved after a fully accepted branch, set to the
// mismatch fraction otherwise. A chain is the tree with one branch.
#pragma once

#include <cstdint>
#include <vector>

namespace ember::speculative {

struct TreeParams {
  float threshold = 0.3f;  // a candidate with draft probability >= this opens a branch (> 1: chains only)
  int32_t max_nodes = 12;  // drafted tokens per tree (verification rows = max_nodes + 1)
  int32_t max_depth = 8;   // drafted tokens on one branch
  float alpha = 0.25f;     // initial verification trigger (adapts per stream)
  // No node is drafted whose cumulative confidence is below this: on a CPU a
  // verification row costs a tenth to a quarter of a decode step (measured:
  // docs/BENCHMARKS.md, speculative decoding), so a token accepted less than
  // one time in ten costs about what it can save, or more. (Not in the C
  // ABI; tests lower it to exercise drafts of flat distributions.)
  float min_confidence = 0.1f;
  // Throws ember::Error(kInvalidArgument) naming the first bad field.
  void validate() const;
};

struct Candidate {
  int32_t token = 0;
  float prob = 0.0f;  // the drafter's probability of the token after the branch
};

struct DraftTree {
  std::vector<int32_t> token, parent, depth;
  std::vector<float> prob, conf;  // draft probability; cumulative confidence (root 1)
  std::vector<uint8_t> open;      // a leaf the pacer may still extend

  void reset(int32_t root_token);
  int32_t size() const { return static_cast<int32_t>(token.size()); }
  int32_t drafted() const { return size() - 1; }
  int32_t add(int32_t parent_node, int32_t tok, float p);
  // Node ids of the path root..node, root excluded (depth(node) entries).
  std::vector<int32_t> path_to(int32_t node) const;
  // Tokens of the path root..node, root excluded.
  std::vector<int32_t> path_tokens(int32_t node) const;
  std::vector<int32_t> children(int32_t node) const;
  int32_t max_depth() const;
};

// Per-stream tree growth and its adaptive trigger.
class TreeGrower {
 public:
  explicit TreeGrower(const TreeParams& params) : params_(params), alpha_(params.alpha) {}
  const TreeParams& params() const { return params_; }
  float alpha() const { return alpha_; }

  // Starts a tree at `root`; `max_nodes` may lower the node cap for this
  // tree (room in the step's token budget or the cache policy's chunk).
  void start(int32_t root, int32_t max_nodes);
  DraftTree& tree() { return tree_; }
  const DraftTree& tree() const { return tree_; }
  // The open leaf the pacer extends next, or -1 when drafting should stop
  // (nothing open, the cap reached, or the best branch below alpha).
  int32_t next_leaf() const;
  // Adds the drafter's candidates for `leaf` (most likely first): the best
  // always, others at or above the threshold, within the caps. An empty list
  // closes the leaf.
  void extend(int32_t leaf, const std::vector<Candidate>& candidates);
  // After verification: `accepted` drafted tokens were kept along the branch
  // ending at node `last` (0: none). Adapts alpha.
  void verified(int32_t accepted, int32_t last);

 private:
  TreeParams params_;
  float alpha_;
  int32_t cap_ = 0;
  DraftTree tree_;
};

// What verification decided for one tree.
struct Acceptance {
  std::vector<int32_t> path;    // accepted drafted nodes, root to leaf (increasing ids)
  std::vector<int32_t> tokens;  // tokens to emit: the path's tokens, then the target's own next token
};

// Verifies a tree from the target's distributions. dist(node) returns the
// target's distribution after that node (what the stream's sampler would
// draw from there; greedy: the argmax with probability 1); uniform() draws
// from the stream's generator.
//  - greedy: follow the child equal to the target's argmax while one exists,
//    then the target's argmax: exactly the tokens plain decoding gives.
//  - sampling: multi-branch rejection sampling (SpecInfer's generalisation
//    of Leviathan et al. / Chen et al. to several deterministic proposals):
//    child c is accepted with probability p'(c) / Z, where p' is the target's
//    distribution with earlier rejected siblings removed and Z its remaining
//    mass; if every child is rejected, the next token is drawn from p'
//    renormalised. Each emitted token is distributed exactly as the target's.
// `max_tokens` caps the tokens emitted (>= 1).
template <class Dist, class Uniform>
Acceptance accept_tree(const DraftTree& tree, bool greedy, int32_t max_tokens, Dist&& dist, Uniform&& uniform);

namespace testing {
// Test hook: a deliberately wrong sampling rule (a child accepted with
// probability p(c), not p'(c)/Z, and a rejection redrawn from the untouched
// p), which the distribution test must catch.
extern bool g_broken_acceptance;
}  // namespace testing

}  // namespace ember::speculative

#include "core/speculative/accept.inc"
