// core::speculative — drafters: what proposes the next tokens of a branch.
//
//   ngram   prompt lookup over the sequence's own history: the longest
//           suffix of the branch (up to kMaxN tokens) that occurred earlier,
//           and what followed it there (probability = share of the matches);
//           no weights, no forward pass.
//   self    self-speculation: the target's first L layers, its final norm
//           and its output head (no extra weights). The first L layers of the
//           committed history are exactly the target's own, so the draft
//           reads the target's KV cache; it writes the drafted rows' K/V of
//           those layers into the tree's slots, which verification then
//           rewrites with the same values. Prompt lookup (also weightless)
//           beside it, and the early exit only where its drafts have paid
//           for its forward passes.
//   draft   a second model with the same vocabulary, with its own sequence
//           per stream, and prompt lookup beside it
//           (core/speculative/draft_model.h).
//
// A drafter is used by one stream at a time, on the engine's step thread,
// with the stream's sequence locked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/speculative/tree.h"

namespace ember {
class Forward;
class KvManager;
class KvSequence;
struct ModelConfig;
}  // namespace ember

namespace ember::speculative {

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Proposes what follows node `leaf` of `tree` (whose root is the last
  // token of seq's history): at most `max_candidates`, most likely first.
  virtual void propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates,
                       std::vector<Candidate>& out) = 0;
  // After drafting, before verification (a model drafter drops what it drafted).
  virtual void finish_tree(KvSequence&) {}
  // Between trees: gives back KV blocks the drafter keeps in the engine's
  // pool (the target's sequences need them; it recomputes later). True when
  // it freed any.
  virtual bool release_kv() { return false; }
  // After verification: `path` are the accepted nodes (a drafter may learn
  // how far its proposals can be trusted).
  virtual void verified(const DraftTree&, const std::vector<int32_t>& /*path*/) {}
  // The floor the stream's tree applies (TreeParams::min_confidence; 0:
  // none, and a model drafter's PayoffGate is off). A model drafter holds
  // its own candidates to its own, higher floor (PayoffGate::floor()).
  virtual void use_min_confidence(float) {}
};

// Per key (a drafter's own class of proposal), how many of one stream's
// proposals became tree nodes and how many of those the target accepted.
class AcceptanceCounts {
 public:
  // A candidate offered after node `leaf` (counted if it becomes a node).
  void proposed(int32_t leaf, int32_t token, int32_t key) { proposals_.push_back({leaf, token, key}); }
  // After verification (`path`: the accepted nodes); forgets the proposals.
  void verified(const DraftTree& tree, const std::vector<int32_t>& path);
  // At a tree's root: a tree that drafted nothing was not verified.
  void forget() { proposals_.clear(); }
  uint32_t drafted(int32_t key) const { return key < static_cast<int32_t>(drafted_.size()) ? drafted_[key] : 0; }
  uint32_t accepted(int32_t key) const { return key < static_cast<int32_t>(accepted_.size()) ? accepted_[key] : 0; }

 private:
  struct Proposal {
    int32_t leaf, token, key;
  };
  std::vector<Proposal> proposals_;  // this tree's
  std::vector<uint32_t> drafted_, accepted_;
};

// A model drafter's probabilities, calibrated as the stream goes: its drafts
// are counted in bins of the probability the model gave them, and a
// candidate's confidence is its bin's acceptance so far, with the model's
// own probability as the prior (worth kPrior drafts). A draft that is
// confidently wrong where the text goes its own way (a small distilled
// draft that cannot copy a passage the target copies) stops growing trees
// there; a calibrated one keeps its probabilities. Only the tree's shape
// depends on it: acceptance never reads a drafter's probabilities.
class Calibration {
 public:
  static constexpr int32_t kBins = 10;
  static constexpr float kPrior = 4.0f;
  // Replaces each candidate's probability (the model's, most likely first;
  // the order is kept) with its calibrated confidence.
  void calibrate(int32_t leaf, std::vector<Candidate>& candidates);
  void verified(const DraftTree& tree, const std::vector<int32_t>& path) { counts_.verified(tree, path); }
  void forget() { counts_.forget(); }
  float confidence(float p) const;

 private:
  static int32_t bin(float p) { return std::clamp(static_cast<int32_t>(p * kBins), 0, kBins - 1); }
  AcceptanceCounts counts_;
};

// A candidate's probability is its share of the continuations times how
// often this stream's drafts from a suffix match of the same length were
// accepted so far (Laplace's rule, (accepted + 1) / (drafted + 2)): a
// weightless drafter's confidence, calibrated as the stream goes, so that
// trees stay small where the text is not copied from its context.
class NgramDrafter final : public Drafter {
 public:
  static constexpr int32_t kMaxN = 4;  // longest suffix matched
  static constexpr int32_t kMinN = 1;
  static constexpr int32_t kMaxMatches = 64;  // most recent occurrences counted
  void propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates,
               std::vector<Candidate>& out) override;
  void verified(const DraftTree& tree, const std::vector<int32_t>& path) override { counts_.verified(tree, path); }
  // The acceptance estimate for drafts from an n-token match.
  float reliability(int32_t n) const;

 private:
  AcceptanceCounts counts_;  // key: the match length n
};

// Prompt lookup beside a model drafter: where the reply copies its context,
// lookup's candidates are better than a small model's and cost no forward
// pass. A tree whose root the lookup continues at or above the floor is the
// lookup's alone (the model is not asked); otherwise the model's candidates
// and the lookup's are merged, most confident first.
class LookupBeside {
 public:
  explicit LookupBeside(bool on) : on_(on) {}
  // The lookup's candidates for `leaf`; at the root, decides whether the
  // tree is the lookup's (`floor`: the tree's floor).
  void propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates, float floor);
  // Whether this tree is the lookup's alone.
  bool owns_tree() const { return owns_tree_; }
  // Whether `token` is among the lookup's candidates for the current leaf.
  bool proposed(int32_t token) const;
  // The union of the model's candidates (`out`) and the lookup's, most
  // confident first (a token both propose keeps the higher), at most `max`.
  void merge_into(std::vector<Candidate>& out, int32_t max_candidates) const;
  void verified(const DraftTree& tree, const std::vector<int32_t>& path) {
    if (on_) lookup_.verified(tree, path);
  }

 private:
  bool on_;
  bool owns_tree_ = false;
  NgramDrafter lookup_;
  std::vector<Candidate> found_;
};

// Multiply-adds of one token's forward pass through a model's first `layers`
// layers and its output head: a model drafter's cost relative to the
// target's whole forward pass (decoding reads each weight once per token).
double forward_macs(const ModelConfig& c, int32_t layers);

// A model drafter's payoff, tree by tree: what the model's own drafts earned
// (accepted tokens the lookup beside it did not also propose: a decode step
// each) against what they cost (`forward_cost` of a decode step per forward
// pass of the model, kRowCost per drafted row). After a tree that did not
// pay the model sits out 1, 2, 4 .. kMaxSkip trees (those are the lookup's
// alone); a tree that paid resets the count. The model's candidates below
// floor() = kRowCost + forward_cost are not offered: they cost more than
// they are expected to save; where that is 1 or more, the model is never
// run (no draft of it could pay, however often accepted).
class PayoffGate {
 public:
  static constexpr float kRowCost = 0.2f;  // a verification row, in decode steps (docs/BENCHMARKS.md)
  static constexpr int32_t kMaxSkip = 64;
  // `on` = false: never skips nor filters (tests run the model on every tree).
  PayoffGate(float forward_cost, bool on) : forward_cost_(forward_cost), on_(on) {}
  float floor() const { return kRowCost + forward_cost_; }
  // The confidence of the lookup's first candidate from which a tree is the
  // lookup's alone (0 when off): the model offers nothing more confident
  // (floor()), and its candidates can earn at most what the lookup's
  // misses, 1 - c, which must exceed its forward pass.
  float owning_floor() const { return on_ ? std::max(0.0f, std::min(floor(), 1.0f - forward_cost_)) : 0.0f; }
  // At every tree's root (a tree the model ran for that drafted nothing was
  // not verified: its forward passes earned nothing).
  void begin_tree();
  // Whether the model runs for this tree (false while it sits trees out).
  bool admit();
  void forward() { ++forwards_; }
  // The model's candidates for `leaf` (calibrated; most confident first):
  // drops those below floor() and records those the lookup did not propose.
  void offer(int32_t leaf, std::vector<Candidate>& candidates, const LookupBeside& lookup);
  void verified(const DraftTree& tree, const std::vector<int32_t>& path);
  void set_on(bool on) { on_ = on; }

 private:
  void settle(float gain);

  float forward_cost_;
  bool on_;
  bool running_ = false;  // the model runs for the current tree
  int32_t forwards_ = 0;  // its forward passes in the current tree
  int32_t skip_ = 0;      // trees the model sits out after the next tree that does not pay
  int32_t backoff_ = 0;   // trees left to sit out
  AcceptanceCounts own_;  // key 0: the model's candidates the lookup did not propose
};

// What the model drafters share: prompt lookup beside the model (a tree the
// lookup owns does not run it), the model's probabilities calibrated
// (Calibration) and held to what can pay (PayoffGate). A subclass says
// whether the model can run for a tree (open_tree) and runs it for a leaf
// (model_logits).
class ModelDrafter : public Drafter {
 public:
  void propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates,
               std::vector<Candidate>& out) final;
  void verified(const DraftTree& tree, const std::vector<int32_t>& path) final;
  void use_min_confidence(float floor) final {
    floor_ = floor;
    gate_.set_on(gate_on_ && floor > 0.0f);
  }

 protected:
  // `forward_cost`: the model's forward pass over the target's (forward_macs);
  // `lookup`: prompt lookup beside the model; `gate`: the PayoffGate (tests
  // turn both off to run the model on every tree).
  ModelDrafter(float forward_cost, bool lookup, bool gate)
      : lookup_(lookup), gate_on_(gate), gate_(forward_cost, gate) {}
  // At the root of a tree the lookup does not own: whether the model runs
  // for it. The default asks the gate (admit()).
  virtual bool open_tree(KvSequence& /*seq*/) { return admit(); }
  bool admit() { return gate_.admit(); }
  // The model's logits (n_vocab values) for what follows `leaf`.
  virtual const float* model_logits(KvSequence& seq, const DraftTree& tree, int32_t leaf) = 0;
  virtual int32_t n_vocab() const = 0;

 private:
  LookupBeside lookup_;
  bool gate_on_;
  PayoffGate gate_;
  bool model_tree_ = false;  // the model runs for the current tree
  Calibration calibration_;
  float floor_ = 0.0f;
};

// The target's first `layers` layers + final norm + head, with prompt lookup
// beside it. `forward_mutex` is the engine's (one forward pass at a time).
// Its forward pass reads most of the target's weights, so its cost (gate) is
// forward_macs(L) / forward_macs(n): SmolLM2's default exit (26 of 30
// layers, 0.89 of a step) can never pay and is not run, where it agrees with
// the whole model on 42% of tokens; `self:L` for smaller L runs where its
// trees pay.
class SelfDrafter final : public ModelDrafter {
 public:
  SelfDrafter(Forward& forward, std::mutex& forward_mutex, KvManager& kv, const ModelConfig& config, int32_t layers,
              bool lookup = true, bool gate = true);

 private:
  const float* model_logits(KvSequence& seq, const DraftTree& tree, int32_t leaf) override;
  int32_t n_vocab() const override { return n_vocab_; }

  Forward& forward_;
  std::mutex& forward_mutex_;
  KvManager& kv_;
  int32_t layers_;
  int32_t n_vocab_;
  std::vector<float> logits_;
};

// The `k` most probable tokens of softmax(logits) (n values), most likely
// first, with their probabilities.
void top_candidates(const float* logits, int32_t n, int32_t k, std::vector<Candidate>& out);

}  // namespace ember::speculative
