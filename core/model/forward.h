// The forward-pass interface every architecture implements (one file per
// architecture in core/model/arch/, chosen by core/model/arch/registry.h).
#pragma once

#include "core/backend/backend.h"
#include "core/kv_cache/layer_groups.h"
#include "core/model/batch.h"

namespace ember {

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
};

}  // namespace ember
