#include "core/speculative/drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/kv_cache/kv_manager.h"
#include "core/model/batch.h"
#include "core/model/forward.h"

namespace ember::speculative {

namespace {

// exp(x) for x <= 0, in float (relative error ~1e-7): x = n ln 2 + r with
// |r| <= ln 2 / 2, e^r by Cephes' polynomial, 2^n from the exponent bits.
// No calls and no branches, so that a loop of it vectorizes: the softmax
// of a drafted token's 49,152 logits took as long as a 2-layer draft's
// whole forward pass with std::exp.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// The sum of exp(logits[i] - mx): sixteen float partial sums (a fixed order:
// the same sum on every run), added in double at the end.
double sum_exp(const float* logits, int32_t n, float mx) {
  constexpr int32_t kLanes = 16;
  float acc[kLanes] = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t j = 0; j < kLanes; ++j) acc[j] += exp_nonpositive(logits[i + j] - mx);
  }
  double sum = 0.0;
  for (; i < n; ++i) sum += exp_nonpositive(logits[i] - mx);
  for (float a : acc) sum += a;
  return sum;
}

}  // namespace

void top_candidates(const float* logits, int32_t n, int32_t k, std::vector<Candidate>& out) {
  out.clear();
  if (n <= 0 || k <= 0) return;
  const float mx = *std::max_element(logits, logits + n);
  const double sum = sum_exp(logits, n, mx);
  // The k largest logits, in order (ties: lower id first).
  std::vector<int32_t> best;
  best.reserve(static_cast<size_t>(k) + 1);
  for (int32_t i = 0; i < n; ++i) {
    if (static_cast<int32_t>(best.size()) == k && logits[i] <= logits[best.back()]) continue;
    auto at =
        std::upper_bound(best.begin(), best.end(), i, [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    best.insert(at, i);
    if (static_cast<int32_t>(best.size()) > k) best.pop_back();
  }
  for (int32_t id : best) {
    out.push_back({id, static_cast<float>(exp_nonpositive(logits[id] - mx) / sum)});
  }
}

void NgramDrafter::propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates,
                           std::vector<Candidate>& out) {
  out.clear();
  const std::vector<int32_t>& hist = seq.tokens();
  const int64_t H = static_cast<int64_t>(hist.size());
  if (H < 2) return;
  // The branch: the history (ending with the root) and the drafted tokens.
  const std::vector<int32_t> drafted = tree.path_tokens(leaf);
  const int64_t L = H + static_cast<int64_t>(drafted.size());
  auto at = [&](int64_t i) { return i < H ? hist[static_cast<size_t>(i)] : drafted[static_cast<size_t>(i - H)]; };
  for (int32_t n = kMaxN; n >= kMinN; --n) {
    if (n > L) continue;
    // Occurrences of the branch's last n tokens that end at j (j + 1 < H:
    // what followed is known), most recent first.
    std::vector<std::pair<int32_t, int32_t>> counts;  // (token, count), in order of first (most recent) sight
    int32_t matches = 0;
    for (int64_t j = H - 2; j >= n - 1 && matches < kMaxMatches; --j) {
      bool eq = true;
      for (int32_t k = 0; k < n && eq; ++k) eq = hist[static_cast<size_t>(j - k)] == at(L - 1 - k);
      if (!eq) continue;
      ++matches;
      const int32_t next = hist[static_cast<size_t>(j + 1)];
      auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == next; });
      if (it == counts.end()) {
        counts.emplace_back(next, 1);
      } else {
        ++it->second;
      }
    }
    if (matches == 0) continue;
    std::stable_sort(counts.begin(), counts.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    const float trust = reliability(n);
    for (const auto& [tok, c] : counts) {
      if (static_cast<int32_t>(out.size()) >= max_candidates) break;
      out.push_back({tok, trust * static_cast<float>(c) / static_cast<float>(matches)});
      counts_.proposed(leaf, tok, n);
    }
    return;
  }
}

float NgramDrafter::reliability(int32_t n) const {
  return static_cast<float>(counts_.accepted(n) + 1) / static_cast<float>(counts_.drafted(n) + 2);
}

void AcceptanceCounts::verified(const DraftTree& tree, const std::vector<int32_t>& path) {
  for (int32_t node = 1; node < tree.size(); ++node) {
    for (const Proposal& p : proposals_) {
      if (p.leaf != tree.parent[node] || p.token != tree.token[node]) continue;
      const size_t k = static_cast<size_t>(p.key);
      if (k >= drafted_.size()) {
        drafted_.resize(k + 1, 0);
        accepted_.resize(k + 1, 0);
      }
      drafted_[k]++;
      if (std::find(path.begin(), path.end(), node) != path.end()) accepted_[k]++;
      break;
    }
  }
  proposals_.clear();
}

float Calibration::confidence(float p) const {
  const int32_t b = bin(p);
  return (static_cast<float>(counts_.accepted(b)) + kPrior * p) / (static_cast<float>(counts_.drafted(b)) + kPrior);
}

void Calibration::calibrate(int32_t leaf, std::vector<Candidate>& candidates) {
  for (Candidate& c : candidates) {
    counts_.proposed(leaf, c.token, bin(c.prob));
    c.prob = confidence(c.prob);
  }
}

void SelfDrafter::propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates,
                          std::vector<Candidate>& out) {
  Batch batch;
  kv_.add_tree_rows(seq, batch, tree.token, tree.parent, {leaf});
  logits_.resize(static_cast<size_t>(n_vocab_));
  {
    std::lock_guard<std::mutex> lock(forward_mutex_);
    forward_.forward_layers(batch, logits_.data(), layers_);
  }
  top_candidates(logits_.data(), n_vocab_, max_candidates, out);
  calibration_.calibrate(leaf, out);
}

}  // namespace ember::speculative
