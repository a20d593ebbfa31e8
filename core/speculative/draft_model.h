// core::speculative — a draft model: a second GGUF with the target's
// vocabulary, run on the target engine's device.
//
// DraftRunner: the draft model on the target engine's backend, its KV in the
// engine's block pool through a KvManager of its own over that pool (its
// layers, heads and head size differ from the target's: its rows are a
// KvView inside the pool's blocks, a block per group of its layers), and its
// own forward pass. A backend without KV views (or a draft whose K/V rows are
// wider than the target's) gets a backend and pool of its own instead. One per
// draft model per engine, shared by the streams that use it (one forward at a
// time; on the engine's backend, under the engine's forward lock).
//
// DraftModelDrafter: the draft model's candidates together with prompt
// lookup's (NgramDrafter over the target's history: where the reply copies
// its context a small draft rarely does as well, and lookup costs no forward
// pass); a tree the model declines (no room lately, or sitting out trees
// after trees whose drafts did not pay: PayoffGate) may still be the
// lookup's alone (ModelDrafter holds what the two model drafters share). One stream's draft sequence
// in that pool, with the target session's cache policy. Before a tree is
// drafted it catches up with the target's history (only what was appended since the last tree: the
// accepted tokens); the tree's nodes are provisional tokens of the draft
// sequence, rolled back after verification. When the pool has no room, a
// full draft sequence gives its blocks back (it recomputes later) and the
// stream decodes plainly for a few steps.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/streaming.h"
#include "core/speculative/drafter.h"

namespace ember {
class Backend;
struct Batch;
class Model;
}  // namespace ember

namespace ember::speculative {

// Throws ember::Error(kInvalidArgument) unless both models have the same
// vocabulary (size and every token's text).
void check_same_vocabulary(const Model& target, const Model& draft);

class DraftRunner {
 public:
  // A backend and pool of its own.
  DraftRunner(std::shared_ptr<const Model> model, const std::string& device, int32_t n_threads, bool batch_invariant,
              uint64_t kv_memory_bytes = 128ull << 20);
  // On the engine's backend, in its pool (`forward_mutex`: the engine's, held
  // around each draft forward). Throws kUnsupported when the pool cannot hold
  // the draft's rows (see above).
  DraftRunner(std::shared_ptr<const Model> model, Backend& backend, std::shared_ptr<KvCache> pool,
              std::mutex& forward_mutex);
  ~DraftRunner();
  const Model& model() const { return *model_; }
  KvManager& kv() { return *kv_; }
  // Runs the draft model on a batch of its sequences.
  void forward(const Batch& batch, float* logits);
  std::mutex& mutex() { return mutex_; }
  // Whether its KV lives in the engine's pool.
  bool shares_pool() const { return shared_forward_mutex_ != nullptr; }

 private:
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> own_backend_;
  std::mutex* shared_forward_mutex_ = nullptr;
  std::unique_ptr<KvManager> kv_;
  std::unique_ptr<Forward> forward_;
  std::mutex mutex_;
};

class DraftModelDrafter final : public ModelDrafter {
 public:
  // `lookup`: prompt lookup's candidates beside the draft's; `gate`: the
  // PayoffGate, its cost the draft's forward_macs over the target's
  // (`target`), catch-up passes not counted.
  DraftModelDrafter(std::shared_ptr<DraftRunner> runner, const CachePolicy& policy, int32_t n_ctx,
                    const ModelConfig& target, bool lookup = true, bool gate = true);
  ~DraftModelDrafter() override;
  void finish_tree(KvSequence& seq) override;
  bool release_kv() override;

 private:
  // Declines the tree while the pool had no room lately or the gate keeps
  // the draft out; else catches up with the target and opens the tree.
  bool open_tree(KvSequence& seq) override;
  const float* model_logits(KvSequence& seq, const DraftTree& tree, int32_t leaf) override;
  int32_t n_vocab() const override;
  // Brings the draft sequence to the target's history (all but its last
  // token computed) and reserves the tree's slots. False when the pool has
  // no room now (a full sequence has given its blocks back).
  bool catch_up(const KvSequence& target, int32_t n_nodes);

  std::shared_ptr<DraftRunner> runner_;
  std::unique_ptr<KvSequence> seq_;
  bool tree_open_ = false;
  int32_t backoff_ = 0;  // trees left to skip (the pool had no room)
  std::vector<float> logits_;
};

}  // namespace ember::speculative
