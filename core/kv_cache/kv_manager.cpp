#include "core/kv_cache/kv_manager.h"

#include <algorithm>
#include <cstring>

#include "core/model/batch.h"

namespace ember {

size_t KvSequence::resident() const {
  return bounded() ? static_cast<size_t>(layout_.resident(static_cast<int64_t>(n_computed_))) : n_computed_;
}

KvManager::KvManager(Backend& backend, const KvGeometry& geometry, bool prefix_caching, Rope rope)
    : pool_(backend, geometry, prefix_caching), rope_(std::move(rope)) {}

// ------------------------------------------------------------------ sequences

std::unique_ptr<KvSequence> KvManager::create(CachePolicy policy, int32_t n_ctx, int32_t n_ctx_train) const {
  StreamingLayout layout;
  if (policy.bounded()) {
    if (!pool_.supports_cache_policies()) {
      fail(StatusCode::kUnsupported,
           "session: the " + pool_.backend_name() + " backend does not support window/sink cache policies yet");
    }
    if (policy.kind == CachePolicyKind::kWindow) policy.sink_tokens = 0;
    if (policy.window_tokens == 0) policy.window_tokens = n_ctx - policy.sink_tokens;
    policy.validate(pool_.block_size(), n_ctx_train);
    layout = StreamingLayout(policy.sink_tokens, policy.window_tokens, pool_.block_size());
    const size_t bs = static_cast<size_t>(pool_.block_size());
    const size_t blocks = (static_cast<size_t>(layout.max_slots()) + bs - 1) / bs;
    if (blocks > pool_.total_blocks()) {
      fail(StatusCode::kOutOfMemory, "session: the cache policy needs " + std::to_string(blocks) +
                                         " KV blocks but the pool has " + std::to_string(pool_.total_blocks()));
    }
  }
  return std::unique_ptr<KvSequence>(new KvSequence(policy, layout));
}

void KvManager::reset(KvSequence& seq) {
  release(seq);
  seq.tokens_.clear();
  seq.generated_.clear();
  if (seq.bounded()) seq.layout_ = StreamingLayout(seq.policy_.sink_tokens, seq.policy_.window_tokens, block_size());
  seq.max_position_ = -1;
}

void KvManager::release(KvSequence& seq) {
  pool_.release(seq.block_table_);
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
    pool_.truncate(seq.block_table_, seq.layout_.kv_len(static_cast<int64_t>(n)));
    return;
  }
  seq.n_computed_ = n;
  pool_.truncate(seq.block_table_, static_cast<int32_t>(n));
}

// ------------------------------------------------------------------ scheduling

void KvManager::describe(const KvSequence& seq, SchedSequence& out) const {
  const bool bounded = seq.bounded();
  out.n_tokens = seq.tokens_.size();
  out.n_computed = seq.n_computed_;
  out.running = !seq.block_table_.empty();
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
    if (!pool_.prepare_write(seq.block_table_, ev.first_block * bs)) return false;
    // Shift the blocks that stay (those after the dropped ones, up to the
    // last written slot) first: if the backend fails, nothing has changed.
    const size_t used = (static_cast<size_t>(seq.layout_.kv_len(done)) + bs - 1) / bs;
    std::vector<int32_t> window;
    for (size_t i = static_cast<size_t>(ev.first_block + ev.dropped_blocks);
         i < std::min(used, seq.block_table_.size()); ++i) {
      window.push_back(seq.block_table_[i]);
    }
    pool_.shift_keys(window, -ev.shift, rope_.layers);
    pool_.drop_blocks(seq.block_table_, static_cast<size_t>(ev.first_block), static_cast<size_t>(ev.dropped_blocks));
    seq.layout_.apply(ev);
  }
  if (!pool_.reserve(seq.block_table_, seq.layout_.kv_len(done + static_cast<int64_t>(n_new)))) return false;
  return pool_.prepare_write(seq.block_table_, seq.layout_.kv_len(done));
}

bool KvManager::allocate_locked(KvSequence& seq, size_t n_slots) {
  // n_slots counts history tokens; a bounded policy maps them to fewer slots.
  if (seq.bounded()) return grow(seq, n_slots - std::min(n_slots, seq.n_computed_));
  if (!pool_.reserve(seq.block_table_, static_cast<int32_t>(n_slots))) return false;
  return pool_.prepare_write(seq.block_table_, static_cast<int32_t>(seq.n_computed_));
}

void KvManager::free_locked(KvSequence& seq, SchedSequence& s) {
  // A sequence that evicted tokens cannot recompute its cache: it is never
  // preempted (SchedSequence::preemptible) and its pool share was checked
  // when it was created, so it keeps its blocks.
  if (seq.bounded() && seq.layout_.shifted()) return;
  pool_.release(seq.block_table_);
  seq.n_computed_ = 0;
  s.n_computed = 0;
}

void KvManager::admit_locked(KvSequence& seq, size_t reuse_limit, SchedSequence& s) {
  if (!seq.block_table_.empty() || seq.tokens_.empty()) return;
  // Reuse cached full blocks, leaving at least the last token to compute
  // (and every token whose logits are wanted); a bounded sequence takes at
  // most its cache size.
  const size_t bs = static_cast<size_t>(block_size());
  size_t max_blocks = (seq.tokens_.size() - 1) / bs;
  if (reuse_limit != SIZE_MAX) max_blocks = std::min(max_blocks, reuse_limit / bs);
  if (seq.bounded()) max_blocks = std::min(max_blocks, static_cast<size_t>(seq.policy_.capacity()) / bs);
  seq.block_table_ =
      pool_.match_prefix(seq.tokens_.data(), seq.tokens_.size(), max_blocks, true, seq.generated_.data());
  seq.n_computed_ = seq.block_table_.size() * bs;
  s.n_computed = seq.n_computed_;
  if (seq.bounded()) s.max_chunk = static_cast<size_t>(seq.layout_.chunk_limit(static_cast<int64_t>(seq.n_computed_)));
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
  const bool hole = bounded && seq.layout_.hole_end() > seq.layout_.hole_begin();
  batch.add_rows(seq.tokens_.data() + from, pos.data(), slot.data(), n, seq.block_table_,
                 hole ? seq.layout_.hole_begin() : 0, hole ? seq.layout_.hole_end() : 0, first,
                 seq.generated_.data() + from);
}

void KvManager::commit_computed(KvSequence& seq, size_t n, bool index) {
  seq.n_computed_ = std::min(seq.n_computed_ + n, seq.tokens_.size());
  // Blocks of a sequence that evicted tokens hold K/V at moved positions,
  // computed without the evicted context: never indexed.
  if (index && !seq.layout_.shifted())
    pool_.commit(seq.block_table_, seq.tokens_.data(), seq.n_computed_, seq.generated_.data());
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
  pool_.commit(seq.block_table_, seq.tokens_.data(), seq.n_computed_, seq.generated_.data());
  pool_.release(seq.block_table_);
  seq.n_computed_ = 0;
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
  const bool hole = bounded && seq.layout_.hole_end() > seq.layout_.hole_begin();
  batch.add_rows(seq.provisional_.data(), pos.data(), slot.data(), n, seq.block_table_,
                 hole ? seq.layout_.hole_begin() : 0, hole ? seq.layout_.hole_end() : 0, 0, generated.data());
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
  copy_slots(seq.block_table_, moves);
  std::vector<int32_t> kept;
  kept.reserve(path.size());
  for (int32_t i : path) kept.push_back(seq.provisional_[static_cast<size_t>(i)]);
  seq.provisional_.clear();
  append(seq, kept.data(), kept.size(), generated);
  seq.n_computed_ = seq.tokens_.size();
  const int32_t kv_len =
      seq.bounded() ? seq.layout_.kv_len(static_cast<int64_t>(seq.n_computed_)) : static_cast<int32_t>(seq.n_computed_);
  pool_.truncate(seq.block_table_, kv_len);
  if (!seq.layout_.shifted())
    pool_.commit(seq.block_table_, seq.tokens_.data(), seq.n_computed_, seq.generated_.data());
}

void KvManager::rollback_provisional(KvSequence& seq) {
  seq.provisional_.clear();
  const int64_t n = static_cast<int64_t>(seq.tokens_.size());
  pool_.truncate(seq.block_table_, seq.bounded() ? seq.layout_.kv_len(n) : static_cast<int32_t>(n));
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
  const bool hole = bounded && seq.layout_.hole_end() > seq.layout_.hole_begin();
  const int32_t first_row = batch.n_rows();
  batch.add_rows(toks.data(), pos.data(), slot.data(), n, seq.block_table_, hole ? seq.layout_.hole_begin() : 0,
                 hole ? seq.layout_.hole_end() : 0, 0, decoded.data());
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

void KvManager::copy_slots(const std::vector<int32_t>& table, const std::vector<std::pair<int32_t, int32_t>>& moves) {
  if (moves.empty()) return;
  const KvGeometry& g = geometry();
  const size_t bpb = g.bytes_per_block();
  const size_t head_bytes = static_cast<size_t>(g.head_dim) * sizeof(uint16_t);
  // Block layout (Backend::kv_read_block): per layer K then V, each
  // [num_kv_heads][block_size][head_dim] f16.
  std::vector<uint8_t> src(bpb), dst(bpb);
  for (const auto& [from, to] : moves) {
    const int32_t sb = table.at(static_cast<size_t>(from / g.block_size));
    const int32_t db = table.at(static_cast<size_t>(to / g.block_size));
    const int32_t so = from % g.block_size, dof = to % g.block_size;
    pool_.read_block(sb, src.data());
    if (db == sb) {
      dst = src;
    } else {
      pool_.read_block(db, dst.data());
    }
    for (int32_t l = 0; l < g.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int32_t h = 0; h < g.num_kv_heads; ++h) {
          const size_t part = (static_cast<size_t>(l) * 2 + kv) * g.num_kv_heads + h;
          const size_t base = part * g.block_size * head_bytes;
          std::memcpy(dst.data() + base + dof * head_bytes, src.data() + base + so * head_bytes, head_bytes);
        }
      }
    }
    pool_.write_block(db, dst.data());
  }
}

// ------------------------------------------------------------------ session files

KvManager::Export::~Export() {
  if (borrowed_) kv_.pool_.release(blocks_);
}

std::unique_ptr<KvManager::Export> KvManager::export_blocks(KvSequence& seq) {
  // A full sequence pins nothing between turns: export the prefix blocks the
  // pool still holds for it (what its next turn would reuse).
  if (!seq.bounded() && seq.block_table_.empty() && !seq.tokens_.empty()) {
    const size_t max_blocks = (seq.tokens_.size() - 1) / static_cast<size_t>(block_size());
    std::vector<int32_t> blocks = pool_.match_prefix(seq.tokens_.data(), seq.tokens_.size(), max_blocks,
                                                     /*count_stats=*/false, seq.generated_.data());
    const size_t n = blocks.size() * static_cast<size_t>(block_size());
    return std::unique_ptr<Export>(new Export(*this, std::move(blocks), n, true));
  }
  return std::unique_ptr<Export>(new Export(*this, seq.block_table_, seq.n_computed_, false));
}

void KvManager::restore(KvSequence& seq, Saved saved, const std::function<void(const std::string&)>& corrupt) {
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
  if (!pool_.reserve(seq.block_table_, static_cast<int32_t>(saved.n_blocks * static_cast<uint64_t>(bs)))) {
    fail(StatusCode::kOutOfMemory,
         "load: the KV pool has no room for the session's " + std::to_string(saved.n_blocks) + " blocks now");
  }
  const size_t bpb = geometry().bytes_per_block();
  for (size_t i = 0; i < seq.block_table_.size(); ++i) pool_.write_block(seq.block_table_[i], saved.blocks + i * bpb);
  seq.tokens_ = std::move(saved.tokens);
  seq.generated_ = std::move(saved.generated);
  seq.max_position_ = saved.max_position;
  seq.n_computed_ = saved.n_computed;
  pool_.truncate(seq.block_table_, static_cast<int32_t>(kv_len));
  if (seq.bounded() && !seq.layout_.shifted()) {
    pool_.commit(seq.block_table_, seq.tokens_.data(), seq.n_computed_, seq.generated_.data());
  } else if (!seq.bounded()) {
    park(seq);  // into the prefix cache, as an idle full session
  }
}

bool KvManager::reserve_scratch(KvSequence& seq, size_t n_slots) {
  return pool_.reserve(seq.block_table_, static_cast<int32_t>(n_slots));
}

}  // namespace ember
