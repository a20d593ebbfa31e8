#include "core/speculative/tree.h"

#include <algorithm>
#include <cmath>

#include "core/util/status.h"

namespace ember::speculative {

namespace testing {
bool g_broken_acceptance = false;
}  // namespace testing

void TreeParams::validate() const {
  auto require = [](bool ok, const char* message) {
    if (!ok) fail(StatusCode::kInvalidArgument, message);
  };
  require(std::isfinite(threshold) && threshold > 0.0f, "speculation: threshold must be > 0");
  require(max_nodes >= 1 && max_nodes <= 64, "speculation: max_nodes must be in [1, 64]");
  require(max_depth >= 1 && max_depth <= 64, "speculation: max_depth must be in [1, 64]");
  require(std::isfinite(alpha) && alpha >= 0.0f && alpha <= 1.0f, "speculation: alpha must be in [0, 1]");
  require(std::isfinite(min_confidence) && min_confidence >= 0.0f && min_confidence <= 1.0f,
          "speculation: min_confidence must be in [0, 1]");
}

void DraftTree::reset(int32_t root_token) {
  token.assign(1, root_token);
  parent.assign(1, -1);
  depth.assign(1, 0);
  prob.assign(1, 1.0f);
  conf.assign(1, 1.0f);
  open.assign(1, 1);
}

int32_t DraftTree::add(int32_t parent_node, int32_t tok, float p) {
  const int32_t id = size();
  token.push_back(tok);
  parent.push_back(parent_node);
  depth.push_back(depth[parent_node] + 1);
  prob.push_back(p);
  conf.push_back(conf[parent_node] * p);
  open.push_back(1);
  return id;
}

std::vector<int32_t> DraftTree::path_to(int32_t node) const {
  std::vector<int32_t> path;
  for (int32_t n = node; n > 0; n = parent[n]) path.push_back(n);
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<int32_t> DraftTree::path_tokens(int32_t node) const {
  std::vector<int32_t> out;
  for (int32_t n : path_to(node)) out.push_back(token[n]);
  return out;
}

std::vector<int32_t> DraftTree::children(int32_t node) const {
  std::vector<int32_t> out;
  for (int32_t i = node + 1; i < size(); ++i) {
    if (parent[i] == node) out.push_back(i);
  }
  return out;
}

int32_t DraftTree::max_depth() const { return size() ? *std::max_element(depth.begin(), depth.end()) : 0; }

void TreeGrower::start(int32_t root, int32_t max_nodes) {
  tree_.reset(root);
  cap_ = std::max(0, std::min(max_nodes, params_.max_nodes));
}

int32_t TreeGrower::next_leaf() const {
  const DraftTree& t = tree_;
  if (t.drafted() >= cap_) return -1;
  // Open leaves: their confidence and token shares.
  double conf_sum = 0.0, tok_sum = 0.0, best_conf = 0.0;
  for (int32_t i = 0; i < t.size(); ++i) {
    if (!t.open[i]) continue;
    conf_sum += t.conf[i];
    tok_sum += t.depth[i];
    best_conf = std::max(best_conf, static_cast<double>(t.conf[i]));
  }
  if (conf_sum <= 0.0) return -1;
  // The trigger: the best branch is no longer confident enough (the root,
  // confidence 1, is always extended once).
  if (t.drafted() > 0 && best_conf < alpha_) return -1;
  int32_t pick = -1;
  double best = -2.0;
  for (int32_t i = 0; i < t.size(); ++i) {
    if (!t.open[i]) continue;
    const double lag = t.conf[i] / conf_sum - (tok_sum > 0 ? t.depth[i] / tok_sum : 0.0);
    if (lag > best) {
      best = lag;
      pick = i;
    }
  }
  return pick;
}

void TreeGrower::extend(int32_t leaf, const std::vector<Candidate>& candidates) {
  DraftTree& t = tree_;
  t.open[leaf] = 0;
  for (size_t k = 0; k < candidates.size(); ++k) {
    if (t.drafted() >= cap_) break;
    const Candidate& c = candidates[k];
    if (k > 0 && c.prob < params_.threshold) break;  // most likely first: the rest are below too
    if (!(c.prob > 0.0f) || t.conf[leaf] * std::min(c.prob, 1.0f) < params_.min_confidence) break;
    const int32_t id = t.add(leaf, c.token, std::min(c.prob, 1.0f));
    if (t.depth[id] >= params_.max_depth) t.open[id] = 0;
  }
}

void TreeGrower::verified(int32_t accepted, int32_t last) {
  const DraftTree& t = tree_;
  if (t.drafted() == 0) return;
  // Fully accepted: the accepted branch ran to a leaf of the tree.
  const bool full = accepted > 0 && last > 0 && t.children(last).empty();
  if (full) {
    alpha_ *= 0.5f;
  } else {
    // The mismatch fraction along the branch verification followed: its
    // drafted tokens that were rejected.
    int32_t depth = 0;
    const int32_t from = last > 0 ? last : 0;
    for (int32_t i = 0; i < t.size(); ++i) {
      // the deepest node below `from` (the branch the target walked into)
      int32_t n = i;
      while (n > 0 && n != from) n = t.parent[n];
      if (n == from) depth = std::max(depth, t.depth[i]);
    }
    alpha_ = depth > 0 ? static_cast<float>(depth - accepted) / static_cast<float>(depth) : alpha_;
  }
  alpha_ = std::clamp(alpha_, 1e-3f, 0.95f);
}

}  // namespace ember::speculative
