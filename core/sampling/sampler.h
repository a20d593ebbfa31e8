// Token sampling: penalties, greedy or temperature with top-k / top-p /
// min-p, from a seeded RNG (same seed and logits -> same token, on every
// platform: the RNG and the uniform draw are our own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace ember {

struct SamplingParams {
  float temperature = 0.8f;  // <= 0: greedy
  int32_t top_k = 40;        // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;
  uint64_t seed = 0xEEEE;
};

// log p(token | row) from one row of logits (max-subtracted, double sum).
float token_log_prob(const float* row, int32_t n_vocab, int32_t token);

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t n_vocab);
  // Picks the next token from `logits` (n_vocab values, modified in place)
  // given the tokens so far (for penalties).
  int32_t sample(float* logits, const std::vector<int32_t>& history);
  // The distribution sample() draws from (penalties, temperature, top-k,
  // top-p, min-p applied), as (token, probability) pairs summing to 1, most
  // probable first; greedy (temperature <= 0) is the argmax with
  // probability 1. `logits` is modified in place. Speculative decoding
  // verifies drafts against it.
  void distribution(float* logits, const std::vector<int32_t>& history, std::vector<std::pair<int32_t, double>>& out);
  bool greedy() const { return params_.temperature <= 0.0f; }
  // sample() from the row as if every token `allowed` rejects were -inf,
  // without masking the row: the tokens are looked at in order of logit
  // until the choice is known (greedy: the argmax is allowed; sampled: the
  // top-k allowed tokens, which are the masked row's survivors in the same
  // order, so the token drawn is the one sample() draws from the masked
  // row). Returns -1 when that takes more than `max_checks` calls of
  // `allowed` (or top-k is off, or fewer than top-k finite tokens are
  // allowed): the caller masks the row and calls sample_penalized(). The
  // row's penalties are applied either way; the generator is drawn from
  // only when a token is returned.
  int32_t sample_allowed(float* logits, const std::vector<int32_t>& history,
                         const std::function<bool(int32_t)>& allowed, int32_t max_checks);
  // sample() on a row whose penalties are already applied.
  int32_t sample_penalized(float* logits);
  // The greedy choice of a row whose penalties are applied (the first of
  // equal maxima, as sample() picks).
  static int32_t argmax(const float* logits, int32_t n_vocab);
  // A uniform draw in [0, 1) from the sampler's own generator.
  double uniform() { return next_uniform(); }

 private:
  uint64_t next_u64();
  double next_uniform();  // [0, 1)
  void apply_penalties(float* logits, const std::vector<int32_t>& history) const;
  // Temperature softmax over the top-k survivors, then top-p and min-p:
  // fills cands_ (sorted) and probs_; returns how many survive.
  size_t survivors(const float* logits);
  // Softmax with temperature over the first n of cands_ (sorted), then
  // top-p and min-p: fills probs_; returns how many survive.
  size_t truncate(size_t n);
  // Draws one of the first n of cands_ by probs_.
  int32_t draw(size_t n);

  SamplingParams params_;
  int32_t n_vocab_;
  uint64_t state_[4];
  struct Cand {
    float logit;
    int32_t id;
  };
  std::vector<Cand> cands_;
  std::vector<double> probs_;
};

}  // namespace ember
