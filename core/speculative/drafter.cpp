#include "core/speculative/drafter.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/kv_cache/kv_manager.h"
#include "core/model/batch.h"
#include "core/model/forward.h"
#include "core/model/model.h"

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
  if (leaf == 0) counts_.forget();  // (a tree that drafted nothing was not verified)
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

void LookupBeside::propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates, float floor) {
  found_.clear();
  if (on_) lookup_.propose(seq, tree, leaf, max_candidates, found_);
  if (leaf == 0) owns_tree_ = !found_.empty() && found_.front().prob >= floor;
}

bool LookupBeside::proposed(int32_t token) const {
  return std::any_of(found_.begin(), found_.end(), [&](const Candidate& c) { return c.token == token; });
}

void LookupBeside::merge_into(std::vector<Candidate>& out, int32_t max_candidates) const {
  for (const Candidate& c : found_) {
    auto it = std::find_if(out.begin(), out.end(), [&](const Candidate& o) { return o.token == c.token; });
    if (it == out.end()) {
      out.push_back(c);
    } else {
      it->prob = std::max(it->prob, c.prob);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.prob > b.prob; });
  if (static_cast<int32_t>(out.size()) > max_candidates) out.resize(static_cast<size_t>(max_candidates));
}

double forward_macs(const ModelConfig& c, int32_t layers) {
  const double embd = c.n_embd, q = static_cast<double>(c.n_heads) * c.head_dim,
               kv = static_cast<double>(c.n_kv_heads) * c.head_dim;
  const double layer = embd * (q + 2 * kv) + q * embd + 3.0 * embd * c.n_ff;
  return layers * layer + embd * c.n_vocab;
}

void PayoffGate::begin_tree() {
  if (running_) settle(-forward_cost_ * static_cast<float>(forwards_));
  own_.forget();
}

bool PayoffGate::admit() {
  if (on_ && (floor() >= 1.0f || backoff_ > 0)) {
    if (backoff_ > 0) --backoff_;
    return false;
  }
  running_ = true;
  return true;
}

void PayoffGate::offer(int32_t leaf, std::vector<Candidate>& candidates, const LookupBeside& lookup) {
  if (on_) {
    const float at_least = floor();
    candidates.erase(
        std::remove_if(candidates.begin(), candidates.end(), [&](const Candidate& c) { return c.prob < at_least; }),
        candidates.end());
  }
  for (const Candidate& c : candidates) {
    if (!lookup.proposed(c.token)) own_.proposed(leaf, c.token, 0);
  }
}

void PayoffGate::verified(const DraftTree& tree, const std::vector<int32_t>& path) {
  const uint32_t drafted = own_.drafted(0), accepted = own_.accepted(0);
  own_.verified(tree, path);
  if (!running_) return;
  settle(static_cast<float>(own_.accepted(0) - accepted) - kRowCost * static_cast<float>(own_.drafted(0) - drafted) -
         forward_cost_ * static_cast<float>(forwards_));
}

void PayoffGate::settle(float gain) {
  running_ = false;
  forwards_ = 0;
  if (!on_) return;
  if (gain > 0.0f) {
    skip_ = 0;
  } else {
    skip_ = std::min(std::max(2 * skip_, 1), kMaxSkip);
    backoff_ = skip_;
  }
}

void ModelDrafter::propose(KvSequence& seq, const DraftTree& tree, int32_t leaf, int32_t max_candidates,
                           std::vector<Candidate>& out) {
  out.clear();
  lookup_.propose(seq, tree, leaf, max_candidates, std::max(floor_, gate_.owning_floor()));
  if (leaf == 0) {
    gate_.begin_tree();
    calibration_.forget();  // (a tree that drafted nothing was not verified)
    model_tree_ = !lookup_.owns_tree() && open_tree(seq);
  }
  if (model_tree_) {
    const float* logits = model_logits(seq, tree, leaf);
    gate_.forward();
    top_candidates(logits, n_vocab(), max_candidates, out);
    calibration_.calibrate(leaf, out);
    gate_.offer(leaf, out, lookup_);
  }
  lookup_.merge_into(out, max_candidates);
}

void ModelDrafter::verified(const DraftTree& tree, const std::vector<int32_t>& path) {
  calibration_.verified(tree, path);
  lookup_.verified(tree, path);
  gate_.verified(tree, path);
}

SelfDrafter::SelfDrafter(Forward& forward, std::mutex& forward_mutex, KvManager& kv, const ModelConfig& config,
                         int32_t layers, bool lookup, bool gate)
    : ModelDrafter(static_cast<float>(forward_macs(config, layers) / forward_macs(config, config.n_layers)), lookup,
                   gate),
      forward_(forward),
      forward_mutex_(forward_mutex),
      kv_(kv),
      layers_(layers),
      n_vocab_(config.n_vocab) {}

const float* SelfDrafter::model_logits(KvSequence& seq, const DraftTree& tree, int32_t leaf) {
  Batch batch;
  kv_.add_tree_rows(seq, batch, tree.token, tree.parent, {leaf});
  logits_.resize(static_cast<size_t>(n_vocab_));
  std::lock_guard<std::mutex> lock(forward_mutex_);
  forward_.forward_layers(batch, logits_.data(), layers_);
  return logits_.data();
}

}  // namespace ember::speculative
