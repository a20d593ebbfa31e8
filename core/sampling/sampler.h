// Token sampling: penalties, greedy or temperature with top-k / top-p /
// min-p, from a seeded RNG (same seed and logits -> same token, on every
// platform: the RNG and the uniform draw are our own).
#pragma once

#include <cstddef>
#include <cstdint>
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
  // A uniform draw in [0, 1) from the sampler's own generator.
  double uniform() { return next_uniform(); }

 private:
  uint64_t next_u64();
  double next_uniform();  // [0, 1)
  void apply_penalties(float* logits, const std::vector<int32_t>& history) const;
  // Temperature softmax over the top-k survivors, then top-p and min-p:
  // fills cands_ (sorted) and probs_; returns how many survive.
  size_t survivors(const float* logits);

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
