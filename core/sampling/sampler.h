// Token sampling: penalties, greedy or temperature with top-k / top-p /
// min-p, from a seeded RNG (same seed and logits -> same token, on every
// platform: the RNG and the uniform draw are our own).
#pragma once

#include <cstdint>
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

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t n_vocab);
  // Picks the next token from `logits` (n_vocab values, modified in place)
  // given the tokens so far (for penalties).
  int32_t sample(float* logits, const std::vector<int32_t>& history);

 private:
  uint64_t next_u64();
  double next_uniform();  // [0, 1)

  SamplingParams params_;
  int32_t n_vocab_;
  uint64_t state_[4];
  struct Cand {
    float logit;
    int32_t id;
  };
  std::vector<Cand> cands_;
};

}  // namespace ember
