// core::speculative::SpecStep — speculative decoding inside an engine step,
// all of it here: a stream's drafter and tree grower (StreamSpec), how many
// tree nodes a decode asks the step's plan for (lookahead: the scheduler
// reserves their KV from the same budget as every other row, after every
// sequence's own tokens, so a tree shrinks or is skipped before anything is
// preempted), drafting the tree into those slots (draft) and the verification
// outcome (verify: the accepted tokens and the tree path whose KV is kept).
// The engine's apply phase commits the path (KvManager::apply); nothing here
// changes a sequence's history.
//
// One step, for a decoding stream that speculates:
//   plan     lookahead()           the nodes it may draft; the scheduler
//                                  reserves what the pool and budget allow
//            draft()               grows the tree into the reserved slots
//                                  (the drafters: drafter.h, draft_model.h)
//                                  and adds its rows to the batch
//   forward  one pass verifies every row of every tree
//   outcome  verify()              accept_tree over the target's logits
//                                  (tree.h, accept.inc): tokens, kept path
//   apply    KvManager::apply      the path's KV kept, the rest rolled back
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/speculative/tree.h"

namespace ember {
class Backend;
class Forward;
class KvManager;
class KvSequence;
class Model;
class Sampler;
struct Batch;
struct CachePolicy;

// Speculative decoding for a stream: who drafts, and the tree.
struct SpecParams {
  enum class Kind : int32_t { kNone = 0, kNgram = 1, kSelf = 2, kDraft = 3 };
  Kind kind = Kind::kNone;
  int32_t self_layers = 0;                   // kSelf: the target's first L layers (0: 7/8 of them, rounded down)
  std::shared_ptr<const Model> draft_model;  // kDraft: same vocabulary as the target
  // kSelf, kDraft: prompt lookup's candidates beside the model's (C ABI:
  // spec_lookup; tests turn it off to exercise the model's drafts and the
  // draft model's own KV on every tree).
  bool draft_lookup = true;
  // kSelf, kDraft: the model sits out trees after trees where its drafts did
  // not pay for its forward passes (speculative::PayoffGate; not in the C
  // ABI; tests turn it off).
  bool payoff_gate = true;
  speculative::TreeParams tree;
};
}  // namespace ember

namespace ember::speculative {

class Drafter;
class DraftRunner;

// One stream's speculation state (held by the stream, used only here). Empty
// (no drafter) once speculation has stopped for the stream.
class StreamSpec {
 public:
  explicit StreamSpec(std::unique_ptr<Drafter> drafter, const TreeParams& tree);
  ~StreamSpec();
  bool active() const { return drafter_ != nullptr; }

 private:
  friend class SpecStep;
  std::unique_ptr<Drafter> drafter_;
  std::unique_ptr<TreeGrower> grower_;
  bool tree_ = false;  // a tree was drafted this step (its rows are in the batch)
};

// What verification decided for one stream's tree.
struct Verdict {
  std::vector<int32_t> tokens;  // the accepted path's tokens, then the target's own next token
  std::vector<int32_t> path;    // the accepted nodes as provisional indices (node - 1), root to leaf
  size_t drafted = 0;           // nodes the tree held
};

class SpecStep {
 public:
  // How the engine's forward pass and KV are shared with the drafters.
  struct Target {
    std::shared_ptr<const Model> model;
    Forward* forward = nullptr;
    std::mutex* forward_mutex = nullptr;  // one forward pass at a time
    KvManager* kv = nullptr;
    Backend* backend = nullptr;
    std::string device;  // for a draft model that needs a backend of its own
    int32_t n_threads = 0;
    bool batch_invariant = true;
  };
  explicit SpecStep(Target target);
  ~SpecStep();

  // A stream's speculation from its parameters (nullptr for Kind::kNone):
  // checks the draft model's vocabulary and the self-speculation depth.
  // Throws ember::Error before the stream is submitted.
  std::unique_ptr<StreamSpec> prepare(const SpecParams& params, const CachePolicy& policy, int32_t n_ctx);

  // Plan: the tree nodes a stream whose next row is a decode of `seq` may
  // draft this step (0: none); `n_ctx`: a full session's context,
  // `tokens_left`: what the stream may still emit. The caller holds seq's
  // mutex.
  size_t lookahead(const StreamSpec* spec, const KvSequence& seq, int32_t n_ctx, int32_t tokens_left) const;
  // Plan: grows the tree into the `room` slots reserved after the pending
  // token, names them as provisional tokens and adds its rows (root first)
  // to `batch`. Returns the rows added, 0 when nothing was drafted (the
  // caller adds the plain decode row; the reserved slots go at apply). A
  // drafter that fails ends speculation for this stream only.
  // `filter(path, candidates)` may drop candidates a constraint rejects
  // after the node's path (root excluded) before they join the tree.
  using CandidateFilter = std::function<void(const std::vector<int32_t>& path, std::vector<Candidate>& candidates)>;
  int32_t draft(StreamSpec& spec, KvSequence& seq, size_t room, Batch& batch, const CandidateFilter& filter = {});
  // Whether `spec` drafted a tree this step.
  static bool drafted(const StreamSpec* spec) { return spec && spec->tree_; }
  // Outcome: verifies this step's tree from its rows' logits (`rows`: one
  // per node, root first); `mask(path, row)` may reject tokens of a node's
  // row (`path`: its tokens after the root) before the sampler sees it (a
  // grammar); `history`: the penalty
  // window before the root's successor. Tells the drafter and the grower
  // what was accepted.
  using RowMask = std::function<void(const std::vector<int32_t>& path, float* row)>;
  Verdict verify(StreamSpec& spec, float* rows, int32_t n_vocab, Sampler& sampler, const std::vector<int32_t>& history,
                 int32_t tokens_left, const RowMask& mask);
  // Plan: draft models' KV in the engine's pool is a cache of the targets'
  // histories; it goes before any sequence is preempted or kept waiting.
  // True when something was freed.
  static bool reclaim(const std::vector<StreamSpec*>& specs);
  // A finished stream's drafter gives back what it holds now.
  static void stop(StreamSpec& spec);

 private:
  Target t_;
  std::mutex draft_mutex_;
  std::vector<std::shared_ptr<DraftRunner>> draft_runners_;  // one per draft model
};

}  // namespace ember::speculative
