#include "core/speculative/spec_step.h"

#include <algorithm>

#include "core/kv_cache/kv_manager.h"
#include "core/model/batch.h"
#include "core/model/model.h"
#include "core/sampling/sampler.h"
#include "core/speculative/draft_model.h"
#include "core/speculative/drafter.h"
#include "core/util/log.h"

namespace ember::speculative {

namespace {
// The most nodes one tree drafts, whatever its parameters allow.
constexpr size_t kMaxTreeNodes = 64;
}  // namespace

StreamSpec::StreamSpec(std::unique_ptr<Drafter> drafter, const TreeParams& tree)
    : drafter_(std::move(drafter)), grower_(std::make_unique<TreeGrower>(tree)) {
  drafter_->use_min_confidence(tree.min_confidence);
}

StreamSpec::~StreamSpec() = default;

SpecStep::SpecStep(Target target) : t_(std::move(target)) {}

SpecStep::~SpecStep() = default;

std::unique_ptr<StreamSpec> SpecStep::prepare(const SpecParams& sp, const CachePolicy& policy, int32_t n_ctx) {
  const auto& c = t_.model->config();
  switch (sp.kind) {
    case SpecParams::Kind::kNone: return nullptr;
    case SpecParams::Kind::kNgram: return std::make_unique<StreamSpec>(std::make_unique<NgramDrafter>(), sp.tree);
    case SpecParams::Kind::kSelf: {
      // The default from measured acceptance (docs/BENCHMARKS.md): early exits
      // below ~3/4 of SmolLM2's layers agree with the full model on under 20%
      // of tokens.
      const int32_t layers = sp.self_layers > 0 ? sp.self_layers : std::max(1, c.n_layers * 7 / 8);
      if (layers >= c.n_layers) {
        fail(StatusCode::kInvalidArgument,
             "speculation: self-speculation must use fewer layers than the model's " + std::to_string(c.n_layers));
      }
      return std::make_unique<StreamSpec>(std::make_unique<SelfDrafter>(*t_.forward, *t_.forward_mutex, *t_.kv, c,
                                                                        layers, sp.draft_lookup, sp.payoff_gate),
                                          sp.tree);
    }
    case SpecParams::Kind::kDraft: {
      check_same_vocabulary(*t_.model, *sp.draft_model);
      std::shared_ptr<DraftRunner> runner;
      {
        std::lock_guard<std::mutex> lock(draft_mutex_);
        for (const auto& r : draft_runners_) {
          if (&r->model() == sp.draft_model.get()) runner = r;
        }
        if (!runner) {
          // In the engine's pool when the backend can hold the draft's rows
          // there; else a backend and pool of its own.
          try {
            runner = std::make_shared<DraftRunner>(sp.draft_model, *t_.backend, t_.kv->pool(), *t_.forward_mutex);
          } catch (const Error& e) {
            if (e.code() != StatusCode::kUnsupported) throw;
            log(LogLevel::kInfo, "speculation: the draft model's KV gets a pool of its own (%s)", e.what());
            runner = std::make_shared<DraftRunner>(sp.draft_model, t_.device, t_.n_threads, t_.batch_invariant);
          }
          draft_runners_.push_back(runner);
        }
      }
      return std::make_unique<StreamSpec>(
          std::make_unique<DraftModelDrafter>(runner, policy, n_ctx, c, sp.draft_lookup, sp.payoff_gate), sp.tree);
    }
  }
  return nullptr;
}

size_t SpecStep::lookahead(const StreamSpec* spec, const KvSequence& seq, int32_t n_ctx, int32_t tokens_left) const {
  if (!spec || !spec->active()) return 0;
  // A tree grows from the pending token: every token before it computed.
  if (seq.tokens().empty() || seq.n_computed() + 1 != seq.tokens().size() || !seq.provisional().empty()) return 0;
  // Room: what the stream may still emit after this step's token, a full
  // session's context (the root and every drafted depth must fit it), the
  // tree's own cap. (The cache policy's next eviction and the pool: the
  // scheduler's budget, KvManager::StepBudget::lookahead.)
  size_t room = std::min<size_t>(kMaxTreeNodes, static_cast<size_t>(spec->grower_->params().max_nodes));
  room = std::min<size_t>(room, static_cast<size_t>(std::max(tokens_left - 1, 0)));
  if (!seq.bounded()) {
    const size_t used = seq.tokens().size() + 1;  // the history and the token this step emits at least
    const size_t ctx = static_cast<size_t>(n_ctx);
    room = std::min(room, ctx > used ? ctx - used : 0);
  }
  return room;
}

int32_t SpecStep::draft(StreamSpec& spec, KvSequence& seq, size_t room, Batch& batch, const CandidateFilter& filter) {
  spec.tree_ = false;
  if (!spec.active() || room == 0) return 0;
  TreeGrower& grower = *spec.grower_;
  Drafter& drafter = *spec.drafter_;
  grower.start(seq.tokens().back(), static_cast<int32_t>(room));
  std::vector<Candidate> cands;
  const int32_t max_candidates = std::max(1, static_cast<int32_t>(1.0f / grower.params().threshold));
  try {
    for (int32_t leaf; (leaf = grower.next_leaf()) >= 0;) {
      drafter.propose(seq, grower.tree(), leaf, max_candidates, cands);
      if (filter) filter(grower.tree().path_tokens(leaf), cands);
      grower.extend(leaf, cands);
    }
    drafter.finish_tree(seq);
  } catch (const std::exception& e) {
    // A drafter that fails (its own KV pool full, say) ends speculation for
    // this stream, which goes on decoding plainly; nothing else is affected.
    log(LogLevel::kWarn, "speculation stopped for a stream: %s", e.what());
    try {
      drafter.finish_tree(seq);
    } catch (...) {}
    stop(spec);
    return 0;
  }
  const DraftTree& tree = grower.tree();
  if (tree.drafted() == 0) return 0;
  // The nodes take the reserved slots in order (node i: slot i after the root).
  const std::vector<int32_t> nodes(tree.token.begin() + 1, tree.token.end());
  if (!t_.kv->append_provisional(seq, nodes)) return 0;
  std::vector<int32_t> rows(static_cast<size_t>(tree.size()));
  for (int32_t i = 0; i < tree.size(); ++i) rows[static_cast<size_t>(i)] = i;
  t_.kv->add_tree_rows(seq, batch, tree.token, tree.parent, rows);
  spec.tree_ = true;
  return tree.size();
}

Verdict SpecStep::verify(StreamSpec& spec, float* rows, int32_t n_vocab, Sampler& sampler,
                         const std::vector<int32_t>& history, int32_t tokens_left, const RowMask& mask) {
  TreeGrower& grower = *spec.grower_;
  const DraftTree& tree = grower.tree();
  std::vector<std::pair<int32_t, double>> dist;
  auto target = [&](int32_t node) {
    const std::vector<int32_t> path = tree.path_tokens(node);
    std::vector<int32_t> h = history;
    h.insert(h.end(), path.begin(), path.end());
    float* row = rows + static_cast<size_t>(node) * n_vocab;
    if (mask) mask(path, row);
    sampler.distribution(row, h, dist);
    return dist;
  };
  const Acceptance acc =
      accept_tree(tree, sampler.greedy(), std::max(tokens_left, 1), target, [&] { return sampler.uniform(); });
  Verdict v;
  v.tokens = acc.tokens;
  v.drafted = static_cast<size_t>(tree.drafted());
  for (int32_t node : acc.path) v.path.push_back(node - 1);
  spec.drafter_->verified(tree, acc.path);
  grower.verified(static_cast<int32_t>(acc.path.size()), acc.path.empty() ? 0 : acc.path.back());
  spec.tree_ = false;
  return v;
}

bool SpecStep::reclaim(const std::vector<StreamSpec*>& specs) {
  bool freed = false;
  for (StreamSpec* s : specs) {
    if (s && s->active() && s->drafter_->release_kv()) freed = true;
  }
  return freed;
}

void SpecStep::stop(StreamSpec& spec) {
  spec.drafter_.reset();
  spec.grower_.reset();
  spec.tree_ = false;
}

}  // namespace ember::speculative
