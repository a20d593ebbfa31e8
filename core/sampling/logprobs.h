// What a stream may do to a row of logits before a token is chosen from it
// (logit bias, banned tokens), and what it may report about the row after
// (the chosen token's log-probability and the most likely alternatives,
// OpenAI's logprobs / top_logprobs).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ember {

// A token's bias, added to its logit; -infinity bans the token.
using LogitBias = std::vector<std::pair<int32_t, float>>;

// Adds each bias to its token's logit (ids were checked against the vocabulary).
void apply_logit_bias(const LogitBias& bias, float* row, int32_t n_vocab);

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

// One generated token's log-probability in the row it was chosen from (after
// the bias, the logits processor and the constraint's mask; before penalties,
// temperature and truncation), and the row's `n` most likely tokens.
struct LogprobEntry {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // most likely first; ties: the lower id first
};

// A row's log-softmax, computed once: the log-probability of any token and
// the top n. Tokens at -infinity (banned, masked) have -infinity.
class RowLogprobs {
 public:
  RowLogprobs() = default;
  RowLogprobs(const float* row, int32_t n_vocab, int32_t top_n);
  // The entry for `token` (top filled from the row's top_n).
  LogprobEntry entry(int32_t token) const;
  bool empty() const { return row_.empty(); }

 private:
  float entry_logprob(int32_t token) const;
  std::vector<float> row_;  // a copy: the sampler changes the row in place later
  double log_sum_ = 0.0;
  float max_ = 0.0f;
  std::vector<TokenLogprob> top_;
};

}  // namespace ember
