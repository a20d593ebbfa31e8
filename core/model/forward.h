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
};

}  // namespace ember
