// Engine::score: whole-context scoring outside any session (ember_engine_score).
#include <algorithm>

#include "core/engine/engine.h"
#include "core/model/batch.h"
#include "core/model/forward.h"
#include "core/sampling/sampler.h"

namespace ember {

void Engine::score(const int32_t* tokens, size_t n, float* logprobs, float* logits) {
  const auto& c = model_->config();
  if (n < 1) fail(StatusCode::kInvalidArgument, "score: need at least one token");
  if (n > static_cast<size_t>(c.n_ctx_train)) {
    fail(StatusCode::kContextFull,
         "score: " + std::to_string(n) + " tokens exceed the model's context (" + std::to_string(c.n_ctx_train) + ")");
  }
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c.n_vocab) fail(StatusCode::kInvalidArgument, "score: token id out of range");
  }
  // A private sequence, never indexed in the prefix cache.
  std::unique_ptr<KvSequence> seq = kv_->create(CachePolicy{}, c.n_ctx_train, c.n_ctx_train);
  std::lock_guard<std::mutex> seq_lock(seq->mutex());
  kv_->append(*seq, tokens, n, /*generated=*/false);
  if (!kv_->reserve_scratch(*seq, n)) {
    fail(StatusCode::kOutOfMemory, "score: the KV pool cannot hold " + std::to_string(n) + " tokens now");
  }
  struct Release {
    KvManager& kv;
    KvSequence& seq;
    ~Release() { kv.release(seq); }
  } release{*kv_, *seq};
  const size_t chunk = static_cast<size_t>(params_.max_batch_tokens);
  std::vector<float> buf;
  for (size_t start = 0; start < n; start += chunk) {
    const size_t m = std::min(chunk, n - start);
    Batch batch;
    kv_->add_rows(*seq, batch, static_cast<int32_t>(m), 0);  // logits for every row
    batch.seqs.back().scores = true;
    buf.resize(m * c.n_vocab);
    {
      std::lock_guard<std::mutex> lock(forward_mutex_);
      forward_->forward(batch, buf.data());
    }
    kv_->commit_computed(*seq, m, /*index=*/false);
    for (size_t i = 0; i < m; ++i) {
      const float* row = buf.data() + i * c.n_vocab;
      const size_t pos = start + i;
      if (logits) std::copy(row, row + c.n_vocab, logits + pos * c.n_vocab);
      if (logprobs && pos + 1 < n) logprobs[pos] = token_log_prob(row, c.n_vocab, tokens[pos + 1]);
    }
  }
}

}  // namespace ember
