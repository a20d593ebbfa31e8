// The forward-pass interface every architecture implements (one file per
// architecture in core/model/arch/, chosen by core/model/arch/registry.h).
#pragma once

#include "core/model/batch.h"

namespace ember {

class Forward {
 public:
  virtual ~Forward() = default;
  // Runs the batch; writes logits of batch.logit_rows (in that order) to
  // `logits` (host, logit_rows.size() * n_vocab floats). Throws ember::Error.
  virtual void forward(const Batch& batch, float* logits) = 0;
  // Early exit (self-speculative drafting): runs only the first `n_layers`
  // layers (writing their K/V), then the final norm and the output head.
  // n_layers >= the model's layer count is forward(). Throws ember::Error.
  virtual void forward_layers(const Batch& batch, float* logits, int32_t n_layers) = 0;
};

}  // namespace ember
