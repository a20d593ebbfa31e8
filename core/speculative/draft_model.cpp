#include "core/speculative/draft_model.h"

#include <algorithm>

#include "core/backend/backend.h"
#include "core/backend/registry.h"
#include "core/kv_cache/kv_manager.h"
#include "core/model/arch/registry.h"
#include "core/model/batch.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"

namespace ember::speculative {

void check_same_vocabulary(const Model& target, const Model& draft) {
  const Tokenizer& a = target.tokenizer();
  const Tokenizer& b = draft.tokenizer();
  if (target.config().n_vocab != draft.config().n_vocab || a.n_vocab() != b.n_vocab()) {
    fail(StatusCode::kInvalidArgument, "speculation: the draft model's vocabulary has " +
                                           std::to_string(draft.config().n_vocab) + " tokens, the target's " +
                                           std::to_string(target.config().n_vocab));
  }
  for (int32_t id = 0; id < a.n_vocab(); ++id) {
    if (a.token_text(id) != b.token_text(id)) {
      fail(StatusCode::kInvalidArgument,
           "speculation: the draft model's vocabulary differs from the target's at token " + std::to_string(id));
    }
  }
}

DraftRunner::DraftRunner(std::shared_ptr<const Model> model, const std::string& device, int32_t n_threads,
                         bool batch_invariant, uint64_t kv_memory_bytes)
    : model_(std::move(model)) {
  const auto& c = model_->config();
  const Architecture* arch = find_architecture(model_->architecture());
  if (!arch) {
    fail(StatusCode::kUnsupported,
         "speculation: the draft model's architecture '" + model_->architecture() + "' is not supported");
  }
  own_backend_ = create_backend(device, BackendOptions{n_threads, batch_invariant}).backend;
  check_backend_limits(*own_backend_, c.head_dim, c.n_heads, c.n_kv_heads);
  KvGeometry g = model_->kv_geometry(16);
  g.num_blocks = static_cast<int32_t>(std::max<uint64_t>(kv_memory_bytes / g.bytes_per_block(), 1));
  kv_ = std::make_unique<KvManager>(*own_backend_, g, model_->kv_groups(), /*prefix_caching=*/false,
                                    KvManager::Rope{model_->rope_specs()});
  forward_ = arch->make_forward(model_, *own_backend_, g.block_size);
}

DraftRunner::DraftRunner(std::shared_ptr<const Model> model, Backend& backend, std::shared_ptr<KvCache> pool,
                         std::mutex& forward_mutex)
    : model_(std::move(model)), shared_forward_mutex_(&forward_mutex) {
  const auto& c = model_->config();
  const Architecture* arch = find_architecture(model_->architecture());
  if (!arch) {
    fail(StatusCode::kUnsupported,
         "speculation: the draft model's architecture '" + model_->architecture() + "' is not supported");
  }
  check_backend_limits(backend, c.head_dim, c.n_heads, c.n_kv_heads);
  const int32_t block_size = pool->block_size();
  KvGeometry g = model_->kv_geometry(block_size);
  g.dtype = pool->geometry().dtype;  // the draft's rows in the target's pool, in its element type
  if (g.row_bytes() == 0) {
    fail(StatusCode::kUnsupported, "speculation: the draft model's head_dim " + std::to_string(g.head_dim) +
                                       " does not fit a q8_0 KV cache (a multiple of 32)");
  }
  kv_ = std::make_unique<KvManager>(std::move(pool), g, KvManager::Rope{model_->rope_specs()});
  forward_ = arch->make_forward(model_, backend, block_size);
  forward_->use_kv_layout(kv_->groups(), kv_->view());
}

void DraftRunner::forward(const Batch& batch, float* logits) {
  if (!shared_forward_mutex_) {
    forward_->forward(batch, logits);
    return;
  }
  std::lock_guard<std::mutex> lock(*shared_forward_mutex_);
  forward_->forward(batch, logits);
}

DraftRunner::~DraftRunner() {
  forward_.reset();  // before the backend its buffers live on
  kv_.reset();
}

DraftModelDrafter::DraftModelDrafter(std::shared_ptr<DraftRunner> runner, const CachePolicy& policy, int32_t n_ctx,
                                     const ModelConfig& target, bool lookup, bool gate)
    : ModelDrafter(static_cast<float>(forward_macs(runner->model().config(), runner->model().config().n_layers) /
                                      forward_macs(target, target.n_layers)),
                   lookup, gate),
      runner_(std::move(runner)) {
  const auto& c = runner_->model().config();
  std::lock_guard<std::mutex> lock(runner_->mutex());
  seq_ = runner_->kv().create(policy, std::min(n_ctx, c.n_ctx_train), c.n_ctx_train);
}

DraftModelDrafter::~DraftModelDrafter() {
  std::lock_guard<std::mutex> lock(runner_->mutex());
  std::lock_guard<std::mutex> seq_lock(seq_->mutex());
  runner_->kv().release(*seq_);
}

bool DraftModelDrafter::catch_up(const KvSequence& target, int32_t n_nodes) {
  KvManager& kv = runner_->kv();
  // The pool is shared with the target's sequences, which come first: with
  // no room, a full draft sequence gives its blocks back (it recomputes when
  // there is room again) and a few trees are skipped.
  auto no_room = [&] {
    kv.rollback_provisional(*seq_);
    if (!seq_->bounded()) kv.release(*seq_);
    backoff_ = 8;
    return false;
  };
  // The target's history only grew by accepted tokens since the last tree
  // (a changed history keeps the common prefix; a bounded draft that has
  // evicted a changed token cannot, and throws).
  if (seq_->tokens() != target.tokens()) kv.replace_history(*seq_, target.tokens());
  const size_t want = seq_->tokens().size() - 1;  // everything but the root
  std::vector<float> none;
  while (seq_->n_computed() < want) {
    size_t n = std::min<size_t>(want - seq_->n_computed(), 256);
    if (seq_->bounded()) {
      const size_t limit = static_cast<size_t>(seq_->layout().chunk_limit(static_cast<int64_t>(seq_->n_computed())));
      n = std::min(n, std::max<size_t>(limit, 1));
    }
    if (!kv.grow(*seq_, n)) return no_room();
    Batch batch;
    kv.add_rows(*seq_, batch, static_cast<int32_t>(n), SIZE_MAX);
    runner_->forward(batch, none.data());
    kv.commit_computed(*seq_, n, /*index=*/false);
  }
  if (static_cast<size_t>(n_nodes) > kv.tree_room(*seq_) || !kv.reserve_tree(*seq_, static_cast<size_t>(n_nodes))) {
    return no_room();
  }
  return true;
}

bool DraftModelDrafter::open_tree(KvSequence& seq) {
  if (backoff_ > 0) {
    --backoff_;
    return false;
  }
  if (!admit()) return false;
  std::lock_guard<std::mutex> lock(runner_->mutex());
  std::lock_guard<std::mutex> seq_lock(seq_->mutex());
  // Room for every node the target reserved (its slots after the root).
  if (!catch_up(seq, static_cast<int32_t>(std::min<size_t>(64, runner_->kv().tree_room(*seq_))))) return false;
  tree_open_ = true;
  return true;
}

const float* DraftModelDrafter::model_logits(KvSequence&, const DraftTree& tree, int32_t leaf) {
  std::lock_guard<std::mutex> lock(runner_->mutex());
  std::lock_guard<std::mutex> seq_lock(seq_->mutex());
  Batch batch;
  runner_->kv().add_tree_rows(*seq_, batch, tree.token, tree.parent, {leaf});
  logits_.resize(static_cast<size_t>(n_vocab()));
  runner_->forward(batch, logits_.data());
  return logits_.data();
}

int32_t DraftModelDrafter::n_vocab() const { return runner_->model().config().n_vocab; }

bool DraftModelDrafter::release_kv() {
  if (!runner_->shares_pool()) return false;  // (its own pool: nothing the engine could use)
  std::lock_guard<std::mutex> lock(runner_->mutex());
  std::lock_guard<std::mutex> seq_lock(seq_->mutex());
  // (a bounded draft keeps its window: its evicted history cannot be redone)
  if (tree_open_ || seq_->bounded() || seq_->n_blocks() == 0) return false;
  KvManager& kv = runner_->kv();
  kv.rollback_provisional(*seq_);
  kv.release(*seq_);
  backoff_ = 8;
  return true;
}

void DraftModelDrafter::finish_tree(KvSequence&) {
  if (!tree_open_) return;
  std::lock_guard<std::mutex> lock(runner_->mutex());
  std::lock_guard<std::mutex> seq_lock(seq_->mutex());
  runner_->kv().rollback_provisional(*seq_);
  tree_open_ = false;
}

}  // namespace ember::speculative
