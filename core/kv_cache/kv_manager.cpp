#include "core/kv_cache/kv_manager.h"

#include <algorithm>
#include <cstring>

#include "core/model/batch.h"
#include "core/util/log.h"

namespace ember {

size_t KvSequence::resident() const {
  return bounded() ? static_cast<size_t>(layout_.resident(static_cast<int64_t>(n_computed_))) : n_computed_;
}

size_t KvSequence::blocks_held() const {
  size_t n = 0;
  for (const auto& t : tables_)
    n += static_cast<size_t>(std::count_if(t.begin(), t.end(), [](int32_t b) { return b >= 0; }));
  return n;
}

namespace {

void check_groups(const KvLayerGroups& groups, int32_t n_layers) {
  bool ok = groups.n_layers() == n_layers && groups.n_groups() >= 1 &&
            static_cast<int32_t>(groups.layers.size()) == groups.n_groups();
  int32_t total = 0;
  for (size_t g = 0; ok && g < groups.layers.size(); ++g) {
    const auto& ls = groups.layers[g];
    // (Empty or short only on a pipeline stage: KvLayerGroups::pipeline_stage.)
    ok = static_cast<int32_t>(ls.size()) <= groups.layers_per_group;
    total += static_cast<int32_t>(ls.size());
  }
  if (!ok || total != n_layers) fail(StatusCode::kInternal, "kv manager: layer groups do not cover the model's layers");
}

KvGeometry pool_geometry_for(const KvGeometry& all, const KvLayerGroups& groups) {
  check_groups(groups, all.num_layers);
  if (groups.pool_layers() < all.num_layers) {
    fail(StatusCode::kInternal, "kv manager: layer groups of unequal sizes in the model's own pool");
  }
  KvGeometry g = all;
  g.num_layers = groups.layers_per_group;
  const int64_t blocks = static_cast<int64_t>(all.num_blocks) * groups.n_groups();
  if (blocks > (int64_t{1} << 30)) fail(StatusCode::kInvalidArgument, "kv cache: too many KV blocks");
  g.num_blocks = static_cast<int32_t>(blocks);
  return g;
}

}  // namespace

KvManager::KvManager(Backend& backend, const KvGeometry& geometry, bool prefix_caching, Rope rope)
    : KvManager(backend, geometry, KvLayerGroups::from_windows(std::vector<int32_t>(geometry.num_layers, 0)),
                prefix_caching, std::move(rope)) {}

KvManager::KvManager(Backend& backend, const KvGeometry& geometry, KvLayerGroups groups, bool prefix_caching, Rope rope)
    : geometry_(geometry),
      groups_(std::move(groups)),
      pool_(std::make_shared<KvCache>(backend, pool_geometry_for(geometry, groups_), prefix_caching)),
      rope_(std::move(rope)) {
  init_rope();
}

KvManager::KvManager(std::shared_ptr<KvCache> pool, const KvGeometry& geometry, Rope rope)
    : geometry_(geometry),
      groups_(KvLayerGroups::chunked(geometry.num_layers, pool->geometry().num_layers)),
      pool_(std::move(pool)),
      index_(false),
      view_{geometry.num_kv_heads, geometry.head_dim},
      rope_(std::move(rope)) {
  const KvGeometry& p = pool_->geometry();
  if (!pool_->supports_kv_views()) {
    fail(StatusCode::kUnsupported, "kv manager: the " + pool_->backend_name() + " backend has no KV views");
  }
  if (geometry.block_size != p.block_size || geometry.num_layers <= 0 || geometry.head_dim <= 0 ||
      geometry.head_dim % 8 != 0 ||
      static_cast<int64_t>(geometry.num_kv_heads) * geometry.head_dim >
          static_cast<int64_t>(p.num_kv_heads) * p.head_dim) {
    fail(StatusCode::kUnsupported, "kv manager: " + std::to_string(geometry.num_kv_heads) + " x " +
                                       std::to_string(geometry.head_dim) + " K/V rows do not fit the pool's " +
                                       std::to_string(p.num_kv_heads) + " x " + std::to_string(p.head_dim));
  }
  check_groups(groups_, geometry.num_layers);
  init_rope();
}

void KvManager::init_rope() {
  if (!rope_.layers.empty()) {
    if (static_cast<int32_t>(rope_.layers.size()) != groups_.n_layers()) {
      fail(StatusCode::kInternal, "kv manager: one RoPE spec per layer is needed");
    }
    for (const auto& layers : groups_.layers) {
      std::vector<RopeSpec> specs;
      for (int32_t il : layers) specs.push_back(rope_.layers[static_cast<size_t>(il)]);
      group_rope_.push_back(std::move(specs));
    }
  }
}

// ------------------------------------------------------------------ layer groups

std::vector<std::vector<int32_t>*> KvManager::tables(KvSequence& seq) {
  std::vector<std::vector<int32_t>*> out;
  for (auto& t : seq.tables_) out.push_back(&t);
  return out;
}

void KvManager::truncate_all(KvSequence& seq, int32_t n_slots) {
  for (auto& t : seq.tables_) pool_->truncate(t, n_slots);
}

void KvManager::release_all(KvSequence& seq) {
  for (auto& t : seq.tables_) pool_->release(t);
}

void KvManager::commit_all(KvSequence& seq) {
  if (!index_) return;
  for (int32_t g = 0; g < groups_.n_groups(); ++g) {
    pool_->commit(seq.tables_[static_cast<size_t>(g)], seq.tokens_.data(), seq.n_computed_, seq.generated_.data(), g,
                  seq.salt_);
  }
}

void KvManager::trim_local(KvSequence& seq, size_t n) {
  if (seq.bounded() || !groups_.has_local()) return;
  for (int32_t g = 0; g < groups_.n_groups(); ++g) {
    const int64_t from = std::max<int64_t>(static_cast<int64_t>(n) - KvLayerGroups::kRollbackSlots, 0);
    const size_t first = groups_.first_needed_block(g, from, block_size());
    if (first > 0) pool_->free_entries(seq.tables_[static_cast<size_t>(g)], 0, first);
  }
}

size_t KvManager::regain_local(KvSequence& seq, size_t n) {
  if (seq.bounded() || !groups_.has_local() || n == 0) return n;
  const size_t bs = static_cast<size_t>(block_size());
  const size_t end = (n + bs - 1) / bs;  // blocks holding tokens [0, n)
  bool missing = false;
  for (int32_t g = 0; g < groups_.n_groups() && !missing; ++g) {
    std::vector<int32_t>& t = seq.tables_[static_cast<size_t>(g)];
    const size_t first = groups_.first_needed_block(g, static_cast<int64_t>(n), block_size());
    bool holes = false;
    for (size_t i = first; i < end && i < t.size(); ++i) holes |= t[i] < 0;
    if (!holes) continue;
    // Freed blocks were indexed when they filled: the prefix cache may still hold them.
    std::vector<int32_t> found =
        pool_->find_blocks(seq.tokens_.data(), std::min(end, n / bs), seq.generated_.data(), g, seq.salt_);
    for (size_t i = 0; i < found.size(); ++i) {
      if (i >= first && i < t.size() && t[i] < 0 && found[i] >= 0) {
        t[i] = found[i];
        found[i] = kNoBlock;
      }
    }
    pool_->release(found);  // (skips kNoBlock entries)
    for (size_t i = first; i < end && i < t.size(); ++i) missing |= t[i] < 0;
  }
  if (!missing) return n;
  release_all(seq);  // a block the window still needs is gone: recompute
  return 0;
}

void KvManager::add_batch_rows(KvSequence& seq, Batch& batch, const int32_t* toks, const int32_t* pos,
                               const int32_t* slot, int32_t n, int32_t first_logit, const uint8_t* decoded) {
  const size_t n_tab = seq.n_blocks();
  std::vector<int32_t> flat;
  flat.reserve(n_tab * seq.tables_.size());
  for (const auto& t : seq.tables_) flat.insert(flat.end(), t.begin(), t.end());
  const bool hole = seq.bounded() && seq.layout_.hole_end() > seq.layout_.hole_begin();
  batch.add_rows(toks, pos, slot, n, std::move(flat), hole ? seq.layout_.hole_begin() : 0,
                 hole ? seq.layout_.hole_end() : 0, first_logit, decoded);
  batch.seqs.back().n_groups = groups_.n_groups();
  batch.seqs.back().lora = seq.lora_;
}

// ------------------------------------------------------------------ sequences

std::unique_ptr<KvSequence> KvManager::create(CachePolicy policy, int32_t n_ctx, int32_t n_ctx_train) const {
  StreamingLayout layout;
  if (policy.bounded()) {
    pool_->refuse_if_split("window/sink cache policies");
    if (!pool_->supports_cache_policies()) {
      fail(StatusCode::kUnsupported,
           "session: the " + pool_->backend_name() + " backend does not support window/sink cache policies yet");
    }
    if (policy.kind == CachePolicyKind::kWindow) policy.sink_tokens = 0;
    if (policy.window_tokens == 0) policy.window_tokens = n_ctx - policy.sink_tokens;
    policy.validate(pool_->block_size(), n_ctx_train);
    layout = StreamingLayout(policy.sink_tokens, policy.window_tokens, pool_->block_size());
    const size_t bs = static_cast<size_t>(pool_->block_size());
    const size_t blocks = (static_cast<size_t>(layout.max_slots()) + bs - 1) / bs;
    if (blocks > total_blocks()) {
      fail(StatusCode::kOutOfMemory, "session: the cache policy needs " + std::to_string(blocks) +
                                         " KV blocks but the pool has " + std::to_string(total_blocks()));
    }
  }
  return std::unique_ptr<KvSequence>(new KvSequence(policy, layout, groups_.n_groups()));
}

void KvManager::reset(KvSequence& seq) {
  release(seq);
  seq.tokens_.clear();
  seq.generated_.clear();
  if (seq.bounded()) seq.layout_ = StreamingLayout(seq.policy_.sink_tokens, seq.policy_.window_tokens, block_size());
  seq.max_position_ = -1;
}

void KvManager::release(KvSequence& seq) {
  release_all(seq);
  seq.n_computed_ = 0;
  seq.provisional_.clear();
}

// ------------------------------------------------------------------ history

void KvManager::append(KvSequence& seq, const int32_t* ids, size_t n, bool generated) {
  seq.tokens_.insert(seq.tokens_.end(), ids, ids + n);
  seq.generated_.resize(seq.tokens_.size(), generated ? 1 : 0);
}

void KvManager::replace_history(KvSequence& seq, std::vector<int32_t> ids) {
  const auto& old = seq.tokens_;
  size_t common = 0;
  while (common < ids.size() && common < old.size() && ids[common] == old[common]) ++common;
  uncompute(seq, common);
  seq.tokens_ = std::move(ids);
  seq.generated_.resize(common);  // the kept prefix keeps its flags; the new rest is prompt
  seq.generated_.resize(seq.tokens_.size(), 0);
}

void KvManager::uncompute(KvSequence& seq, size_t n) {
  if (n >= seq.n_computed_) return;
  if (seq.bounded()) {
    if (!seq.layout_.can_truncate(static_cast<int64_t>(n))) {
      fail(StatusCode::kUnsupported, "the session's history changed at token " + std::to_string(n) +
                                         ", which its cache policy has already evicted");
    }
    seq.n_computed_ = n;
    truncate_all(seq, seq.layout_.kv_len(static_cast<int64_t>(n)));
    return;
  }
  truncate_all(seq, static_cast<int32_t>(n));
  seq.n_computed_ = regain_local(seq, n);
}

void KvManager::set_lora(KvSequence& seq, std::shared_ptr<const LoraSet> lora) {
  const uint64_t salt = lora_key(lora);
  if (salt != seq.salt_) {
    if (!index_ && salt != 0) {
      fail(StatusCode::kUnsupported, "LoRA adapters apply to the target model's sequences, not a draft model's");
    }
    uncompute(seq, 0);
    seq.provisional_.clear();
  }
  seq.salt_ = salt;
  seq.lora_ = std::move(lora);
}

// ------------------------------------------------------------------ scheduling

void KvManager::describe(const KvSequence& seq, SchedSequence& out) const {
  const bool bounded = seq.bounded();
  out.n_tokens = seq.tokens_.size();
  out.n_computed = seq.n_computed_;
  out.running = seq.n_blocks() > 0;
  out.max_chunk = bounded ? static_cast<size_t>(seq.layout_.chunk_limit(static_cast<int64_t>(seq.n_computed_))) : 0;
  out.max_slots = bounded ? static_cast<size_t>(seq.layout_.max_slots()) : 0;
  out.preemptible = !(bounded && seq.layout_.shifted());
}

bool KvManager::grow(KvSequence& seq, size_t n_new) {
  if (!seq.bounded()) return allocate_locked(seq, seq.n_computed_ + n_new);
  // StreamingLLM: evict (and K-shift) so the new tokens fit the window.
  const int32_t bs = block_size();
  const int64_t done = static_cast<int64_t>(seq.n_computed_);
  const StreamingLayout::Eviction ev = seq.layout_.plan(done, static_cast<int32_t>(n_new));
  if (ev.any()) {
    // The kept window moves to lower positions: its blocks must be private
    // (a shared one is copied) and leave the prefix index before the K-shift.
    std::vector<std::vector<int32_t>*> all = tables(seq);
    if (!pool_->prepare_write(all.data(), all.size(), ev.first_block * bs)) return false;
    // Shift the blocks that stay (those after the dropped ones, up to the
    // last written slot) first: if the backend fails, nothing has changed.
    const size_t used = (static_cast<size_t>(seq.layout_.kv_len(done)) + bs - 1) / bs;
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
      const std::vector<int32_t>& t = seq.tables_[static_cast<size_t>(g)];
      std::vector<int32_t> window;
      for (size_t i = static_cast<size_t>(ev.first_block + ev.dropped_blocks); i < std::min(used, t.size()); ++i) {
        window.push_back(t[i]);
      }
      pool_->shift_keys(window, -ev.shift, group_rope_.at(static_cast<size_t>(g)), view());
    }
    for (auto& t : seq.tables_) {
      pool_->drop_blocks(t, static_cast<size_t>(ev.first_block), static_cast<size_t>(ev.dropped_blocks));
    }
    seq.layout_.apply(ev);
  }
  std::vector<std::vector<int32_t>*> all = tables(seq);
  if (!pool_->reserve(all.data(), all.size(), seq.layout_.kv_len(done + static_cast<int64_t>(n_new)))) return false;
  return pool_->prepare_write(all.data(), all.size(), seq.layout_.kv_len(done));
}

bool KvManager::allocate_locked(KvSequence& seq, size_t n_slots) {
  // n_slots counts history tokens; a bounded policy maps them to fewer slots.
  if (seq.bounded()) return grow(seq, n_slots - std::min(n_slots, seq.n_computed_));
  trim_local(seq, seq.n_computed_);
  std::vector<std::vector<int32_t>*> all = tables(seq);
  if (!pool_->reserve(all.data(), all.size(), static_cast<int32_t>(n_slots))) return false;
  return pool_->prepare_write(all.data(), all.size(), static_cast<int32_t>(seq.n_computed_));
}

void KvManager::free_locked(KvSequence& seq, SchedSequence& s) {
  // A sequence that evicted tokens cannot recompute its cache: it is never
  // preempted (SchedSequence::preemptible) and its pool share was checked
  // when it was created, so it keeps its blocks.
  if (seq.bounded() && seq.layout_.shifted()) return;
  release_all(seq);
  seq.n_computed_ = 0;
  s.n_computed = 0;
}

void KvManager::admit_locked(KvSequence& seq, size_t reuse_limit, SchedSequence& s) {
  if (seq.n_blocks() > 0 || seq.tokens_.empty()) return;
  // Reuse cached full blocks, leaving at least the last token to compute
  // (and every token whose logits are wanted); a bounded sequence takes at
  // most its cache size.
  const size_t bs = static_cast<size_t>(block_size());
  size_t max_blocks = (seq.tokens_.size() - 1) / bs;
  if (reuse_limit != SIZE_MAX) max_blocks = std::min(max_blocks, reuse_limit / bs);
  if (seq.bounded()) max_blocks = std::min(max_blocks, static_cast<size_t>(seq.policy_.capacity()) / bs);
  const size_t hit = match_groups(seq, max_blocks, seq.tables_);
  pool_->count_prefix(hit, std::min(max_blocks, seq.tokens_.size() / bs) - hit);
  seq.n_computed_ = hit * bs;
  s.n_computed = seq.n_computed_;
  if (seq.bounded()) s.max_chunk = static_cast<size_t>(seq.layout_.chunk_limit(static_cast<int64_t>(seq.n_computed_)));
}

size_t KvManager::match_groups(const KvSequence& seq, size_t max_blocks, std::vector<std::vector<int32_t>>& out) {
  const int32_t n_groups = groups_.n_groups();
  if (!index_) {
    out.assign(static_cast<size_t>(n_groups), {});
    return 0;
  }
  const int32_t bs = block_size();
  auto local = [&](int32_t g) { return !seq.bounded() && groups_.window[static_cast<size_t>(g)] > 0; };
  out.assign(static_cast<size_t>(n_groups), {});
  // Groups over the whole context need every block of the prefix...
  size_t h = max_blocks;
  for (int32_t g = 0; g < n_groups; ++g) {
    if (local(g)) continue;
    out[g] = pool_->match_prefix(seq.tokens_.data(), seq.tokens_.size(), h, false, seq.generated_.data(), g, seq.salt_);
    h = std::min(h, out[g].size());
  }
  // ...a sliding-window group only those its window sees from the end of it.
  for (int32_t g = 0; g < n_groups; ++g) {
    if (local(g)) out[g] = pool_->find_blocks(seq.tokens_.data(), h, seq.generated_.data(), g, seq.salt_);
  }
  for (; h > 0; --h) {
    bool ok = true;
    for (int32_t g = 0; g < n_groups && ok; ++g) {
      if (!local(g)) continue;
      for (size_t i = groups_.first_needed_block(g, static_cast<int64_t>(h * bs), bs); i < h && ok; ++i) {
        ok = out[g][i] >= 0;
      }
    }
    if (ok) break;
  }
  for (int32_t g = 0; g < n_groups; ++g) {
    pool_->truncate(out[g], static_cast<int32_t>(h * bs));
    if (local(g)) pool_->free_entries(out[g], 0, groups_.first_needed_block(g, static_cast<int64_t>(h * bs), bs));
  }
  return h;
}

bool KvManager::StepBudget::allocate(SchedSequence& s, size_t n_slots) {
  KvSequence& seq = *entries_[s.id].seq;
  std::lock_guard<std::mutex> lock(seq.mutex_);
  try {
    return kv_.allocate_locked(seq, n_slots);
  } catch (const Error& e) {  // the sequence fails after scheduling; its state is unchanged
    errors_.emplace_back(s.id, e);
    return false;
  }
}

bool KvManager::StepBudget::failed(const SchedSequence& s) const {
  return std::any_of(errors_.begin(), errors_.end(), [&](const auto& e) { return e.first == s.id; });
}

void KvManager::StepBudget::free(SchedSequence& s) {
  KvSequence& seq = *entries_[s.id].seq;
  std::lock_guard<std::mutex> lock(seq.mutex_);
  kv_.free_locked(seq, s);
}

void KvManager::StepBudget::admit(SchedSequence& s) {
  const BudgetEntry& e = entries_[s.id];
  std::lock_guard<std::mutex> lock(e.seq->mutex_);
  kv_.admit_locked(*e.seq, e.reuse_limit, s);
}

size_t KvManager::StepBudget::lookahead(SchedSequence& s, size_t n) {
  KvSequence& seq = *entries_[s.id].seq;
  std::lock_guard<std::mutex> lock(seq.mutex_);
  if (!seq.provisional_.empty() || seq.tokens_.empty() || seq.n_computed_ + 1 != seq.tokens_.size()) return 0;
  for (n = std::min(n, kv_.tree_room(seq)); n > 0; n /= 2) {
    try {
      if (kv_.reserve_tree(seq, n)) return n;
    } catch (const Error& e) {  // speculation is optional: the decode runs without it
      log(LogLevel::kWarn, "kv manager: no lookahead for a sequence: %s", e.what());
      return 0;
    }
  }
  return 0;
}

size_t KvManager::StepBudget::capacity_slots() const {
  return kv_.total_blocks() * static_cast<size_t>(kv_.block_size());
}

// ------------------------------------------------------------------ forward

void KvManager::add_rows(KvSequence& seq, Batch& batch, int32_t n, size_t first_logit) {
  const size_t from = seq.n_computed_;
  if (n < 0 || from + static_cast<size_t>(n) > seq.tokens_.size()) {
    fail(StatusCode::kInternal, "kv manager: rows past the sequence's history");
  }
  const bool bounded = seq.bounded();
  std::vector<int32_t> pos(static_cast<size_t>(n)), slot(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int64_t t = static_cast<int64_t>(from) + i;
    pos[i] = bounded ? seq.layout_.position_of(t) : static_cast<int32_t>(t);
    slot[i] = bounded ? seq.layout_.slot_of(t) : static_cast<int32_t>(t);
    seq.max_position_ = std::max(seq.max_position_, pos[i]);
  }
  const int32_t first =
      first_logit <= from ? 0 : static_cast<int32_t>(std::min<size_t>(first_logit - from, static_cast<size_t>(n)));
  add_batch_rows(seq, batch, seq.tokens_.data() + from, pos.data(), slot.data(), n, first,
                 seq.generated_.data() + from);
}

void KvManager::commit_computed(KvSequence& seq, size_t n, bool index) {
  seq.n_computed_ = std::min(seq.n_computed_ + n, seq.tokens_.size());
  // Blocks of a sequence that evicted tokens hold K/V at moved positions,
  // computed without the evicted context: never indexed.
  if (index && !seq.layout_.shifted()) commit_all(seq);
  trim_local(seq, seq.n_computed_);
}

// Between turns a full sequence pins no KV memory, so idle conversations can
// never starve running ones: with prefix caching its full blocks stay in the
// pool's index (evictable, oldest first) and the next turn finds them again;
// without it, the next turn recomputes. Window/sink sequences keep their
// blocks instead: their footprint is bounded (S + W tokens), and once they
// have evicted tokens their cache could not be found again nor recomputed.
void KvManager::park(KvSequence& seq) {
  seq.provisional_.clear();
  if (seq.bounded()) return;
  commit_all(seq);
  release_all(seq);
  seq.n_computed_ = 0;
}

// ------------------------------------------------------------------ step outcome

void KvManager::apply(KvSequence& seq, const StepOutcome& o) {
  commit_computed(seq, o.computed);
  if (!o.path.empty()) {
    commit_provisional(seq, o.path, /*generated=*/true);
  } else if (o.lookahead || !seq.provisional_.empty()) {
    rollback_provisional(seq);  // also what the plan reserved and the step left unused
  }
  if (!o.appended.empty()) append(seq, o.appended.data(), o.appended.size(), /*generated=*/true);
  if (o.finished) park(seq);
}

// ------------------------------------------------------------------ speculation

bool KvManager::append_provisional(KvSequence& seq, const std::vector<int32_t>& ids) {
  if (!seq.provisional_.empty()) fail(StatusCode::kInternal, "kv manager: provisional tokens are pending");
  const size_t tail = seq.tokens_.size() - seq.n_computed_;
  const size_t n_new = tail + ids.size();
  if (seq.bounded() && n_new > static_cast<size_t>(seq.layout_.chunk_limit(static_cast<int64_t>(seq.n_computed_)))) {
    fail(StatusCode::kInvalidArgument, "kv manager: provisional tokens cross the cache policy's next eviction");
  }
  if (!grow(seq, n_new)) return false;
  seq.provisional_ = ids;
  return true;
}

void KvManager::add_provisional_rows(KvSequence& seq, Batch& batch) {
  const size_t base = seq.tokens_.size();
  const int32_t n = static_cast<int32_t>(seq.provisional_.size());
  const bool bounded = seq.bounded();
  std::vector<int32_t> pos(static_cast<size_t>(n)), slot(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int64_t t = static_cast<int64_t>(base) + i;
    pos[i] = bounded ? seq.layout_.position_of(t) : static_cast<int32_t>(t);
    slot[i] = bounded ? seq.layout_.slot_of(t) : static_cast<int32_t>(t);
    seq.max_position_ = std::max(seq.max_position_, pos[i]);
  }
  const std::vector<uint8_t> generated(static_cast<size_t>(n), 1);
  add_batch_rows(seq, batch, seq.provisional_.data(), pos.data(), slot.data(), n, 0, generated.data());
}

void KvManager::commit_provisional(KvSequence& seq, const std::vector<int32_t>& path, bool generated) {
  if (seq.n_computed_ != seq.tokens_.size()) {
    fail(StatusCode::kInternal, "kv manager: provisional tokens committed before the history was computed");
  }
  const int32_t n_prov = static_cast<int32_t>(seq.provisional_.size());
  for (size_t j = 0; j < path.size(); ++j) {
    // Increasing indices (a root-to-leaf path in creation order), so moving
    // node path[j] down to slot j never overwrites a node still to move.
    if (path[j] < static_cast<int32_t>(j) || path[j] >= n_prov || (j > 0 && path[j] <= path[j - 1])) {
      fail(StatusCode::kInternal, "kv manager: a provisional path must be increasing node indices");
    }
  }
  const int64_t base = static_cast<int64_t>(seq.tokens_.size());
  auto slot_of = [&](int64_t t) { return seq.bounded() ? seq.layout_.slot_of(t) : static_cast<int32_t>(t); };
  std::vector<std::pair<int32_t, int32_t>> moves;
  for (size_t j = 0; j < path.size(); ++j) {
    if (path[j] != static_cast<int32_t>(j)) {
      moves.emplace_back(slot_of(base + path[j]), slot_of(base + static_cast<int64_t>(j)));
    }
  }
  copy_slots(seq, moves);
  std::vector<int32_t> kept;
  kept.reserve(path.size());
  for (int32_t i : path) kept.push_back(seq.provisional_[static_cast<size_t>(i)]);
  seq.provisional_.clear();
  append(seq, kept.data(), kept.size(), generated);
  seq.n_computed_ = seq.tokens_.size();
  const int32_t kv_len =
      seq.bounded() ? seq.layout_.kv_len(static_cast<int64_t>(seq.n_computed_)) : static_cast<int32_t>(seq.n_computed_);
  truncate_all(seq, kv_len);
  if (!seq.layout_.shifted()) commit_all(seq);
  trim_local(seq, seq.n_computed_);
}

void KvManager::rollback_provisional(KvSequence& seq) {
  seq.provisional_.clear();
  const int64_t n = static_cast<int64_t>(seq.tokens_.size());
  truncate_all(seq, seq.bounded() ? seq.layout_.kv_len(n) : static_cast<int32_t>(n));
}

size_t KvManager::tree_room(const KvSequence& seq) const {
  if (!seq.bounded()) return SIZE_MAX;
  const size_t tail = seq.tokens_.size() - std::min(seq.tokens_.size(), seq.n_computed_);
  const size_t limit = static_cast<size_t>(seq.layout_.chunk_limit(static_cast<int64_t>(seq.n_computed_)));
  return limit > tail ? limit - tail : 0;
}

bool KvManager::reserve_tree(KvSequence& seq, size_t n_nodes) {
  if (!seq.provisional_.empty()) fail(StatusCode::kInternal, "kv manager: provisional tokens are pending");
  if (seq.tokens_.empty() || seq.n_computed_ + 1 != seq.tokens_.size()) {
    fail(StatusCode::kInternal, "kv manager: a token tree needs exactly one pending history token");
  }
  if (n_nodes > tree_room(seq)) fail(StatusCode::kInternal, "kv manager: a token tree crosses the next eviction");
  return grow(seq, 1 + n_nodes);
}

void KvManager::add_tree_rows(KvSequence& seq, Batch& batch, const std::vector<int32_t>& tokens,
                              const std::vector<int32_t>& parents, const std::vector<int32_t>& rows) {
  if (seq.tokens_.empty() || tokens.empty() || tokens.size() != parents.size()) {
    fail(StatusCode::kInternal, "kv manager: malformed token tree");
  }
  const int64_t root = static_cast<int64_t>(seq.tokens_.size()) - 1;
  const bool bounded = seq.bounded();
  auto slot_of = [&](int64_t t) { return bounded ? seq.layout_.slot_of(t) : static_cast<int32_t>(t); };
  auto position_of = [&](int64_t t) { return bounded ? seq.layout_.position_of(t) : static_cast<int32_t>(t); };
  const int32_t n = static_cast<int32_t>(rows.size());
  std::vector<int32_t> toks(rows.size()), pos(rows.size()), slot(rows.size());
  std::vector<uint8_t> decoded(rows.size(), 1);
  std::vector<std::vector<int32_t>> paths(rows.size());
  for (int32_t r = 0; r < n; ++r) {
    const int32_t node = rows[r];
    if (node < 0 || static_cast<size_t>(node) >= tokens.size()) fail(StatusCode::kInternal, "kv manager: bad tree row");
    // The node's ancestors below the root, root first, then itself.
    std::vector<int32_t>& path = paths[r];
    for (int32_t a = node; a > 0; a = parents[a]) {
      if (parents[a] < 0 || parents[a] >= a)
        fail(StatusCode::kInternal, "kv manager: a tree parent must precede its child");
      path.push_back(slot_of(root + a));
    }
    std::reverse(path.begin(), path.end());
    const int64_t depth = static_cast<int64_t>(path.size());
    toks[r] = tokens[node];
    pos[r] = position_of(root + depth);
    slot[r] = slot_of(root + node);
    seq.max_position_ = std::max(seq.max_position_, pos[r]);
    if (node == 0) decoded[r] = seq.generated_[static_cast<size_t>(root)];
  }
  const int32_t first_row = batch.n_rows();
  add_batch_rows(seq, batch, toks.data(), pos.data(), slot.data(), n, 0, decoded.data());
  batch.seqs.back().decodes = true;
  // Index i >= the slot after the root is the ancestor at depth i - root slot
  // (the slots a chain of these tokens would occupy).
  const int32_t from = slot_of(root) + 1;
  for (int32_t r = 0; r < n; ++r) {
    if (!paths[r].empty()) batch.set_tree_row(first_row + r, from, paths[r]);
  }
}

void KvManager::truncate_history(KvSequence& seq, size_t n) {
  if (n >= seq.tokens_.size()) return;
  if (!seq.provisional_.empty()) rollback_provisional(seq);
  uncompute(seq, n);
  seq.tokens_.resize(n);
  seq.generated_.resize(n);
}

void KvManager::copy_slots(KvSequence& seq, const std::vector<std::pair<int32_t, int32_t>>& moves) {
  if (moves.empty()) return;
  const KvGeometry& g = pool_geometry();
  const size_t bpb = g.bytes_per_block();
  // Block layout (Backend::kv_read_block): per pool layer K then V, each a
  // chunk of [num_kv_heads][block_size][head_dim] f16, the pool's or, for a
  // view, the view's at the start of the pool's chunk.
  const size_t chunk_bytes = static_cast<size_t>(g.num_kv_heads) * g.block_size * g.head_dim * sizeof(uint16_t);
  const int32_t n_heads = view() ? view_.num_kv_heads : g.num_kv_heads;
  const size_t head_bytes = static_cast<size_t>(view() ? view_.head_dim : g.head_dim) * sizeof(uint16_t);
  std::vector<uint8_t> src(bpb), dst(bpb);
  for (size_t gi = 0; gi < seq.tables_.size(); ++gi) {
    const std::vector<int32_t>& table = seq.tables_[gi];
    const int32_t n_layers = static_cast<int32_t>(groups_.layers[gi].size());
    for (const auto& [from, to] : moves) {
      const int32_t sb = table.at(static_cast<size_t>(from / g.block_size));
      const int32_t db = table.at(static_cast<size_t>(to / g.block_size));
      if (sb < 0 || db < 0) fail(StatusCode::kInternal, "kv manager: moving K/V of a freed block");
      const int32_t so = from % g.block_size, dof = to % g.block_size;
      pool_->read_block(sb, src.data());
      if (db == sb) {
        dst = src;
      } else {
        pool_->read_block(db, dst.data());
      }
      for (int32_t l = 0; l < n_layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          for (int32_t h = 0; h < n_heads; ++h) {
            const size_t base = (static_cast<size_t>(l) * 2 + kv) * chunk_bytes + h * g.block_size * head_bytes;
            std::memcpy(dst.data() + base + dof * head_bytes, src.data() + base + so * head_bytes, head_bytes);
          }
        }
      }
      pool_->write_block(db, dst.data());
    }
  }
}

// ------------------------------------------------------------------ session files

KvManager::Export::~Export() {
  if (borrowed_)
    for (auto& t : tables_) kv_.pool_->release(t);
}

void KvManager::Export::read(size_t i, void* dst) const {
  if (kv_.view()) fail(StatusCode::kInternal, "kv manager: another model's KV has no session files");
  const KvLayerGroups& groups = kv_.groups_;
  if (groups.n_groups() == 1) {
    kv_.pool_->read_block(tables_[0].at(i), dst);
    return;
  }
  const size_t layer_bytes = kv_.pool_geometry().bytes_per_block() / static_cast<size_t>(groups.layers_per_group);
  std::vector<uint8_t> block(kv_.pool_geometry().bytes_per_block());
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int32_t g = 0; g < groups.n_groups(); ++g) {
    const int32_t b = tables_[static_cast<size_t>(g)].at(i);
    if (b >= 0) kv_.pool_->read_block(b, block.data());
    for (size_t j = 0; j < groups.layers[g].size(); ++j) {
      uint8_t* to = out + static_cast<size_t>(groups.layers[g][j]) * layer_bytes;
      if (b >= 0) {
        std::memcpy(to, block.data() + static_cast<size_t>(j) * layer_bytes, layer_bytes);
      } else {
        std::memset(to, 0, layer_bytes);
      }
    }
  }
}

std::unique_ptr<KvManager::Export> KvManager::export_blocks(KvSequence& seq) {
  // A full sequence pins nothing between turns: export the prefix blocks the
  // pool still holds for it (what its next turn would reuse).
  if (!seq.bounded() && seq.n_blocks() == 0 && !seq.tokens_.empty()) {
    const size_t max_blocks = (seq.tokens_.size() - 1) / static_cast<size_t>(block_size());
    std::vector<std::vector<int32_t>> found;
    const size_t n = match_groups(seq, max_blocks, found) * static_cast<size_t>(block_size());
    return std::unique_ptr<Export>(new Export(*this, std::move(found), n, true));
  }
  return std::unique_ptr<Export>(new Export(*this, seq.tables_, seq.n_computed_, false));
}

void KvManager::restore(KvSequence& seq, Saved saved, const std::function<void(const std::string&)>& corrupt) {
  if (view()) fail(StatusCode::kInternal, "kv manager: another model's KV has no session files");
  const int32_t bs = block_size();
  int64_t kv_len = static_cast<int64_t>(saved.n_computed);
  if (saved.n_computed > saved.tokens.size()) corrupt("more tokens processed than in the history");
  if (seq.bounded()) {
    seq.layout_.restore(saved.n_evicted, saved.dropped_blocks);
    if (!seq.layout_.consistent() ||
        (saved.n_evicted > 0 && static_cast<int64_t>(saved.n_computed) < seq.policy_.sink_tokens + saved.n_evicted)) {
      corrupt("inconsistent eviction state");
    }
    if (seq.layout_.resident(static_cast<int64_t>(saved.n_computed)) > seq.policy_.capacity()) {
      corrupt("more resident tokens than the cache policy allows");
    }
    kv_len = seq.layout_.kv_len(static_cast<int64_t>(saved.n_computed));
  } else if (saved.n_evicted != 0 || saved.dropped_blocks != 0) {
    corrupt("a full session with evicted tokens");
  }
  if (static_cast<uint64_t>((kv_len + bs - 1) / bs) > saved.n_blocks) corrupt("fewer KV blocks than tokens processed");
  std::vector<std::vector<int32_t>*> all = tables(seq);
  if (!pool_->reserve(all.data(), all.size(), static_cast<int32_t>(saved.n_blocks * static_cast<uint64_t>(bs)))) {
    fail(StatusCode::kOutOfMemory,
         "load: the KV pool has no room for the session's " + std::to_string(saved.n_blocks) + " blocks now");
  }
  const size_t bpb = geometry().bytes_per_block();
  if (groups_.n_groups() == 1) {
    for (size_t i = 0; i < seq.n_blocks(); ++i) pool_->write_block(seq.tables_[0][i], saved.blocks + i * bpb);
  } else {  // scatter each all-layer block's layers into the groups' blocks
    const size_t layer_bytes = pool_geometry().bytes_per_block() / static_cast<size_t>(groups_.layers_per_group);
    std::vector<uint8_t> block(pool_geometry().bytes_per_block());
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
      for (size_t i = 0; i < seq.n_blocks(); ++i) {
        for (size_t j = 0; j < groups_.layers[g].size(); ++j) {
          std::memcpy(block.data() + j * layer_bytes,
                      saved.blocks + i * bpb + static_cast<size_t>(groups_.layers[g][j]) * layer_bytes, layer_bytes);
        }
        pool_->write_block(seq.tables_[static_cast<size_t>(g)][i], block.data());
      }
    }
  }
  seq.tokens_ = std::move(saved.tokens);
  seq.generated_ = std::move(saved.generated);
  seq.max_position_ = saved.max_position;
  seq.n_computed_ = saved.n_computed;
  truncate_all(seq, static_cast<int32_t>(kv_len));
  // What an export leaves out (zeros in the file) is below what rows from
  // n_computed need: freed here, before anything could read it.
  if (!seq.bounded() && groups_.has_local()) {
    for (int32_t g = 0; g < groups_.n_groups(); ++g) {
      const size_t first = groups_.first_needed_block(g, static_cast<int64_t>(seq.n_computed_), bs);
      pool_->free_entries(seq.tables_[static_cast<size_t>(g)], 0, first);
    }
  }
  if (seq.bounded() && !seq.layout_.shifted()) {
    commit_all(seq);
  } else if (!seq.bounded()) {
    park(seq);  // into the prefix cache, as an idle full session
  }
}

bool KvManager::reserve_scratch(KvSequence& seq, size_t n_slots) {
  std::vector<std::vector<int32_t>*> all = tables(seq);
  return pool_->reserve(all.data(), all.size(), static_cast<int32_t>(n_slots));
}

}  // namespace ember
