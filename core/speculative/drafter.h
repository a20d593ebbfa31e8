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
//           rewrites with the same values.
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
  // The lowest confidence worth drafting with this drafter: what its own
  // work for a drafted token costs, on top of the verification row that
  // TreeParams::min_confidence pays for. The tree's floor is the larger of
  // the two (a TreeParams::min_confidence of 0 turns both off).
  virtual float min_confidence() const { return 0.0f; }
  // The floor the stream's tree applies (0: none; a drafter may skip its
  // own work where its proposals would fall below it).
  virtual void use_min_confidence(float) {}
};

// A model drafter's floor: a drafted token costs a forward pass of the draft
// besides its verification row (measured with a 2-layer distilled draft,
// docs/BENCHMARKS.md: about 0.35 of a decode step in all), so a token it
// proposes must be accepted about one time in three to pay; its confidence
// is calibrated (Calibration) so that this compares like with like.
inline constexpr float kModelDrafterMinConfidence = 0.3f;

// Per key (a drafter's own class of proposal), how many of one stream's
// proposals became tree nodes and how many of those the target accepted.
class AcceptanceCounts {
 public:
  // A candidate offered after node `leaf` (counted if it becomes a node).
  void proposed(int32_t leaf, int32_t token, int32_t key) { proposals_.push_back({leaf, token, key}); }
  // After verification (`path`: the accepted nodes); forgets the proposals.
  void verified(const DraftTree& tree, const std::vector<int32_t>& path);
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

// The target's first `layers` layers + final norm + head. `forward_mutex`
// is the engine's (one forward pass at a time).
class SelfDrafter final : public Drafter {
 public:
  SelfDrafter(Forward& forward, std::mutex& forward_mutex, KvManager& kv, int32_t layers, int32_t n_vocab)
      : forward_(forward), forward_mutex_(forward_mutex), kv_(kv), layers_(layers), n_vocab_(n_vocab) {}
  void propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates,
               std::vector<Candidate>& out) override;
  void verified(const DraftTree& tree, const std::vector<int32_t>& path) override { calibration_.verified(tree, path); }
  float min_confidence() const override { return kModelDrafterMinConfidence; }

 private:
  Calibration calibration_;
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
