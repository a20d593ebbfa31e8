#include "core/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>

namespace ember {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab) : params_(params), n_vocab_(n_vocab) {
  uint64_t s = params.seed;
  for (auto& w : state_) w = splitmix64(s);
}

// xoshiro256** (public domain algorithm by Blackman and Vigna).
uint64_t Sampler::next_u64() {
  const uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

double Sampler::next_uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

void Sampler::apply_penalties(float* logits, const std::vector<int32_t>& history) const {
  const auto& p = params_;
  // Penalties over the last penalty_last_n tokens (llama.cpp semantics).
  if (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    const size_t n = history.size();
    const size_t window = p.penalty_last_n < 0 ? n : std::min<size_t>(n, static_cast<size_t>(p.penalty_last_n));
    for (size_t i = n - window; i < n; ++i) counts[history[i]]++;
    for (const auto& [tok, count] : counts) {
      if (tok < 0 || tok >= n_vocab_) continue;
      float& l = logits[tok];
      if (p.repeat_penalty != 1.0f && p.repeat_penalty > 0.0f) l = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
      l -= static_cast<float>(count) * p.frequency_penalty + (count > 0 ? p.presence_penalty : 0.0f);
    }
  }
}

namespace {
bool by_logit(const float a_logit, int32_t a_id, const float b_logit, int32_t b_id) {
  return a_logit > b_logit || (a_logit == b_logit && a_id < b_id);
}
}  // namespace

size_t Sampler::survivors(const float* logits) {
  const auto& p = params_;
  auto order = [](const Cand& a, const Cand& b) { return by_logit(a.logit, a.id, b.logit, b.id); };
  if (p.top_k > 0 && p.top_k < n_vocab_) {
    // The top k in one pass, in a heap of k whose front is the worst kept
    // (by_logit is a total order, ids breaking ties: the same k tokens in the
    // same order as sorting the whole vocabulary), so the candidates take
    // k entries, not the vocabulary's (SmolLM2: 384 KiB a session).
    const size_t k = static_cast<size_t>(p.top_k);
    if (cands_.capacity() > 4 * k + 64) std::vector<Cand>().swap(cands_);  // (grown by sample_allowed)
    cands_.clear();
    cands_.reserve(k);
    for (int32_t i = 0; i < n_vocab_; ++i) {
      const Cand c{logits[i], i};
      if (cands_.size() < k) {
        cands_.push_back(c);
        std::push_heap(cands_.begin(), cands_.end(), order);
      } else if (order(c, cands_.front())) {
        std::pop_heap(cands_.begin(), cands_.end(), order);
        cands_.back() = c;
        std::push_heap(cands_.begin(), cands_.end(), order);
      }
    }
    std::sort_heap(cands_.begin(), cands_.end(), order);
    return truncate(k);
  }
  cands_.resize(n_vocab_);
  for (int32_t i = 0; i < n_vocab_; ++i) cands_[i] = {logits[i], i};
  std::sort(cands_.begin(), cands_.end(), order);
  return truncate(cands_.size());
}

size_t Sampler::truncate(size_t n) {
  const auto& p = params_;
  // Softmax with temperature over the survivors (sorted, descending).
  std::vector<double>& probs = probs_;
  probs.resize(n);
  const double max_l = cands_[0].logit;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    probs[i] = std::exp((cands_[i].logit - max_l) / p.temperature);
    sum += probs[i];
  }
  for (size_t i = 0; i < n; ++i) probs[i] /= sum;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += probs[i];
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = std::max<size_t>(keep, 1);
  }
  if (p.min_p > 0.0f) {
    const double threshold = probs[0] * p.min_p;
    size_t keep = 1;
    while (keep < n && probs[keep] >= threshold) ++keep;
    n = keep;
  }
  return n;
}

int32_t Sampler::draw(size_t n) {
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += probs_[i];
  double r = next_uniform() * total;
  for (size_t i = 0; i < n; ++i) {
    r -= probs_[i];
    if (r < 0.0) return cands_[i].id;
  }
  return cands_[n - 1].id;
}

int32_t Sampler::sample_allowed(float* logits, const std::vector<int32_t>& history,
                                const std::function<bool(int32_t)>& allowed, int32_t max_checks) {
  apply_penalties(logits, history);
  if (params_.temperature <= 0.0f) {
    const int32_t t = argmax(logits, n_vocab_);
    return allowed(t) ? t : -1;
  }
  const size_t k = params_.top_k > 0 ? static_cast<size_t>(params_.top_k) : 0;
  if (k == 0 || k >= static_cast<size_t>(n_vocab_)) return -1;  // every token is a candidate: mask
  // The survivors of the masked row are the top k allowed tokens in the
  // same order: walk the tokens by logit, a sorted window at a time,
  // keeping the allowed ones at the front.
  cands_.resize(n_vocab_);
  for (int32_t i = 0; i < n_vocab_; ++i) cands_[i] = {logits[i], i};
  auto order = [](const Cand& a, const Cand& b) { return by_logit(a.logit, a.id, b.logit, b.id); };
  const size_t n = cands_.size();
  size_t sorted = 0, kept = 0;
  int32_t checks = 0;
  for (size_t i = 0; i < n && kept < k; ++i) {
    if (i == sorted) {
      const size_t next = std::min(n, sorted + std::max<size_t>(2 * k, 64));
      std::partial_sort(cands_.begin() + static_cast<ptrdiff_t>(sorted), cands_.begin() + static_cast<ptrdiff_t>(next),
                        cands_.end(), order);
      sorted = next;
    }
    // A -inf candidate: fewer than k finite allowed ones (the masked row's
    // survivors would include rejected tokens at zero probability).
    if (std::isinf(cands_[i].logit) && cands_[i].logit < 0) return -1;
    if (++checks > max_checks) return -1;
    if (allowed(cands_[i].id)) cands_[kept++] = cands_[i];
  }
  if (kept < k) return -1;
  return draw(truncate(k));
}

int32_t Sampler::sample_penalized(float* logits) {
  if (params_.temperature <= 0.0f) return argmax(logits, n_vocab_);
  return draw(survivors(logits));
}

// std::max_element's answer (the first largest; NaNs never win, but a NaN
// first stays), in two passes the compiler vectorizes: the largest value,
// lane by lane (x > best ? x : best keeps best against a NaN, as maxps
// does), then its first index. A vocabulary of 262k: ~10x faster than one
// dependent compare per logit.
int32_t Sampler::argmax(const float* logits, int32_t n_vocab) {
  if (n_vocab <= 0 || std::isnan(logits[0])) return 0;
  constexpr int kLanes = 16;
  float best[kLanes];
  for (float& b : best) b = logits[0];
  int32_t i = 0;
  for (; i + kLanes <= n_vocab; i += kLanes)
    for (int l = 0; l < kLanes; ++l) best[l] = logits[i + l] > best[l] ? logits[i + l] : best[l];
  float m = logits[0];
  for (float b : best) m = b > m ? b : m;
  for (; i < n_vocab; ++i) m = logits[i] > m ? logits[i] : m;
  for (int32_t j = 0; j < n_vocab; ++j)
    if (logits[j] == m) return j;
  return 0;
}

int32_t Sampler::sample(float* logits, const std::vector<int32_t>& history) {
  apply_penalties(logits, history);
  return sample_penalized(logits);
}

void Sampler::distribution(float* logits, const std::vector<int32_t>& history,
                           std::vector<std::pair<int32_t, double>>& out) {
  out.clear();
  apply_penalties(logits, history);
  if (params_.temperature <= 0.0f) {
    out.emplace_back(static_cast<int32_t>(std::max_element(logits, logits + n_vocab_) - logits), 1.0);
    return;
  }
  const size_t n = survivors(logits);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += probs_[i];
  for (size_t i = 0; i < n; ++i) out.emplace_back(cands_[i].id, probs_[i] / total);
}

float token_log_prob(const float* row, int32_t n_vocab, int32_t token) {
  const float mx = *std::max_element(row, row + n_vocab);
  double sum = 0.0;
  for (int32_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
  return static_cast<float>(row[token] - mx - std::log(sum));
}

}  // namespace ember
