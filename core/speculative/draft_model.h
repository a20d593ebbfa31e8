// core::speculative — a draft model: a second GGUF with the target's
// vocabulary, run on the target engine's device.
//
// DraftRunner: the draft model bound to a backend of the engine's device
// kind, with its own KV manager and block pool (its layers, heads and head
// size differ from the target's, so its blocks cannot live in the target's
// pool) and its own forward pass. One per draft model per engine, shared by
// the streams that use it (one forward at a time).
//
// DraftModelDrafter: one stream's draft sequence in that pool, with the
// target session's cache policy. Before a tree is drafted it catches up with
// the target's history (only what was appended since the last tree: the
// accepted tokens); the tree's nodes are provisional tokens of the draft
// sequence, rolled back after verification.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/kv_cache/streaming.h"
#include "core/speculative/drafter.h"

namespace ember {
class Backend;
class Model;
}  // namespace ember

namespace ember::speculative {

// Throws ember::Error(kInvalidArgument) unless both models have the same
// vocabulary (size and every token's text).
void check_same_vocabulary(const Model& target, const Model& draft);

class DraftRunner {
 public:
  DraftRunner(std::shared_ptr<const Model> model, const std::string& device, int32_t n_threads, bool batch_invariant,
              uint64_t kv_memory_bytes = 128ull << 20);
  ~DraftRunner();
  const Model& model() const { return *model_; }
  KvManager& kv() { return *kv_; }
  Forward& forward() { return *forward_; }
  std::mutex& mutex() { return mutex_; }

 private:
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Forward> forward_;
  std::mutex mutex_;
};

class DraftModelDrafter final : public Drafter {
 public:
  DraftModelDrafter(std::shared_ptr<DraftRunner> runner, const CachePolicy& policy, int32_t n_ctx);
  ~DraftModelDrafter() override;
  void propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates,
               std::vector<Candidate>& out) override;
  void finish_tree(KvSequence& seq) override;

 private:
  // Brings the draft sequence to the target's history (all but its last
  // token computed) and reserves the tree's slots.
  void catch_up(const KvSequence& target, int32_t n_nodes);

  std::shared_ptr<DraftRunner> runner_;
  std::unique_ptr<KvSequence> seq_;
  bool tree_open_ = false;
  std::vector<float> logits_;
};

}  // namespace ember::speculative
