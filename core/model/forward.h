// The forward-pass interface every architecture implements (one file per
// architecture in core/model/arch/, chosen by core/model/arch/registry.h).
#pragma once

#include "core/backend/backend.h"
#include "core/kv_cache/layer_groups.h"
#include "core/model/batch.h"
#include "core/model/model.h"

namespace ember {

namespace comm {
class Communicator;
}

// How a forward pass is part of a model split across ranks (issue 31): the
// communicator and which shard this rank's model is (Model::shard). Every
// rank runs the same batches in the same order; rank 0 alone needs the
// logits (the others pass buffers of the same size).
struct ParallelContext {
  comm::Communicator* comm = nullptr;  // null: not split
  // The tensor-parallel group: the ranks of this pipeline stage, numbered by
  // tp_rank (comm itself without pipeline stages). Its collectives carry the
  // heads' and columns' gathers and sums; comm carries the stages' rows.
  comm::Communicator* tp_comm = nullptr;
  ModelShard shard;
  // Micro-batches a pipeline-parallel step is cut into (at sequence
  // boundaries, so a row computes what it would in one batch): 0 = pp.
  int32_t micro_batches = 0;
};

class Forward {
 public:
  virtual ~Forward() = default;
  // Runs the batch; writes logits of batch.logit_rows (in that order) to
  // `logits` (host, logit_rows.size() * n_vocab floats) and the final-normed
  // hidden states of batch.embd_rows to `embd` (host, embd_rows.size() *
  // n_embd floats; may be null when embd_rows is empty). Throws ember::Error.
  virtual void forward(const Batch& batch, float* logits, float* embd = nullptr) = 0;
  // Early exit (self-speculative drafting): runs only the first `n_layers`
  // layers (writing their K/V), then the final norm and the output head.
  // n_layers >= the model's layer count is forward(). Throws ember::Error.
  virtual void forward_layers(const Batch& batch, float* logits, int32_t n_layers) = 0;
  // Where the K/V go: the pool's layer groups for this model's layers (a
  // batch's tables follow them) and, for another model's pool, the layout of
  // its rows (KvManager::view()). By default the model's own groups.
  virtual void use_kv_layout(const KvLayerGroups& groups, const KvView* view) = 0;
  // Makes this forward pass one rank's part of a split model (its model must
  // be the shard ctx.shard describes). Throws ember::Error(kUnsupported)
  // where the architecture cannot be split.
  virtual void set_parallel(const ParallelContext& ctx) = 0;
};

}  // namespace ember
