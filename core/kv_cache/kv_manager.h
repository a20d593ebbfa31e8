// core::KvManager: the one owner of every sequence's KV bookkeeping.
//
// A sequence (KvSequence) is a token history and the KV that backs it: the
// block table into the engine's pool (KvCache), how many history tokens have
// been run through the model (computed), the cache policy (full, window,
// sinks + window) with its eviction state and in-cache positions, and the
// provisional tokens of a speculative step. KvManager is the only code that
// changes a KvSequence or the pool; sessions, streams, the engine step and
// session files ask it (vLLM v1's KVCacheManager over its BlockPool).
//
// What it offers:
//   history    append / replace / truncate tokens; what is computed follows
//   scheduling the scheduler's KvBudget (allocate, free = preempt, admit =
//              prefix-cache hit) through step_budget()
//   forward    rows of the next chunk into a Batch
//   apply      one engine step's outcome per sequence (StepOutcome: tokens
//              computed, a tree's kept path, the appended token, parked when
//              its stream ended): the only change a step makes after its plan
//   speculate  a tree's slots reserved in the plan (StepBudget::lookahead),
//              named by append_provisional(); apply keeps one root-to-leaf
//              path (commit_provisional) and rolls back the rest
//   park       between turns a full sequence pins no block (prefix cache)
//   files      export_blocks() / restore() for session save and load
//
// Layer groups (KvLayerGroups): with a model whose layers differ in their
// attention span (Gemma 3's sliding-window and global layers) the pool's
// blocks hold one group of layers each and a sequence has a block table per
// group; a sliding-window group frees the blocks its window has left as the
// sequence grows (full policy), so a long context holds only its global
// layers' K/V in full. Batches carry every group's table; session files keep
// the all-layer block layout.
//
// Threads: each KvSequence has a mutex that guards it (and, by convention,
// its owner's own state: a Session locks it for its messages too). Every
// method taking a KvSequence& expects the caller to hold that mutex, except
// the StepBudget methods, which lock it themselves. The pool has its own
// lock; the order is sequence, then pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/model/lora.h"
#include "core/kv_cache/kv_cache.h"
#include "core/kv_cache/streaming.h"
#include "core/scheduler/scheduler.h"
#include "core/util/status.h"

namespace ember {

struct Batch;

class KvSequence {
 public:
  // Guards this sequence (and its owner's state, see above).
  std::mutex& mutex() const { return mutex_; }

  const CachePolicy& policy() const { return policy_; }
  bool bounded() const { return policy_.bounded(); }
  // The history: every token of the sequence, and per token 1 if a stream
  // generated it (its row is computed as a decode, AttentionParams::decode_rows,
  // also when recomputed after a preemption), 0 for prompt and scored tokens.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<uint8_t>& generated() const { return generated_; }
  // History tokens [0, n_computed) have been run (resident or evicted).
  size_t n_computed() const { return n_computed_; }
  // Provisional tokens (speculation) sit in the slots after the computed
  // ones until they are committed or rolled back; not part of the history.
  const std::vector<int32_t>& provisional() const { return provisional_; }
  // Blocks (table entries) covering the cache: per layer group, the same count.
  size_t n_blocks() const { return tables_.empty() ? 0 : tables_[0].size(); }
  // Pool blocks the sequence holds now, every group (freed entries excluded).
  size_t blocks_held() const;
  const StreamingLayout& layout() const { return layout_; }
  // Highest RoPE position any of its rows was given (-1: none).
  int32_t max_position() const { return max_position_; }
  // The LoRA adapters its rows are computed with (KvManager::set_lora).
  const std::shared_ptr<const LoraSet>& lora() const { return lora_; }
  // Tokens whose K/V are in the cache now.
  size_t resident() const;
  // Whether its cache holds tokens at moved positions (an evicting policy
  // has shifted it): such a cache can neither be shared nor recomputed.
  bool shifted() const { return layout_.shifted(); }

 private:
  friend class KvManager;
  KvSequence(const CachePolicy& policy, const StreamingLayout& layout, int32_t n_groups)
      : policy_(policy), layout_(layout), tables_(static_cast<size_t>(n_groups)) {}

  mutable std::mutex mutex_;
  CachePolicy policy_;
  StreamingLayout layout_;  // bounded policies: where the tokens sit in the block tables
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> generated_;
  std::vector<std::vector<int32_t>> tables_;  // one block table per layer group
  size_t n_computed_ = 0;
  std::vector<int32_t> provisional_;
  int32_t max_position_ = -1;
  std::shared_ptr<const LoraSet> lora_;
  uint64_t salt_ = 0;  // lora_key(lora_): part of its blocks' prefix keys
};

class KvManager {
 public:
  // The pool's K-shift needs the model's RoPE (window/sink policies).
  // How each layer's keys were rotated (K-shift re-rotates them), one per
  // layer; the factors pointer must outlive the manager (the model's).
  struct Rope {
    std::vector<RopeSpec> layers;
  };
  // geometry: every layer of the model (num_blocks: how many such blocks the
  // memory holds); `groups` says how the pool splits them (the plain layout:
  // one group).
  KvManager(Backend& backend, const KvGeometry& geometry, bool prefix_caching, Rope rope);
  KvManager(Backend& backend, const KvGeometry& geometry, KvLayerGroups groups, bool prefix_caching, Rope rope);
  // Another model's sequences in `pool` (a draft model's KV in the target
  // engine's pool): `geometry` is that model's (its layers, KV heads and head
  // size; the block size must be the pool's), its layers go in order into the
  // pool's layers, a block per group of them, as rows of a KvView. Its blocks
  // are never prefix-indexed nor matched, and it has no session files.
  // Throws kUnsupported when the pool's backend has no KV views or the rows
  // are wider than the pool's.
  KvManager(std::shared_ptr<KvCache> pool, const KvGeometry& geometry, Rope rope);
  // The pool, to share with a KvView manager.
  const std::shared_ptr<KvCache>& pool() const { return pool_; }
  // The layout of this manager's rows when they are another model's.
  const KvView* view() const { return view_.num_kv_heads > 0 ? &view_ : nullptr; }

  // The all-layer view (session files): num_layers is the model's.
  const KvGeometry& geometry() const { return geometry_; }
  // The pool's own blocks: one layer group each.
  const KvGeometry& pool_geometry() const { return pool_->geometry(); }
  const KvLayerGroups& groups() const { return groups_; }
  int32_t block_size() const { return pool_->block_size(); }
  // Capacity in all-layer blocks (a sequence of n slots needs n / block_size).
  size_t total_blocks() const { return pool_->total_blocks() / static_cast<size_t>(groups_.n_groups()); }
  KvCacheStats stats() const { return pool_->stats(); }
  std::string backend_name() const { return pool_->backend_name(); }

  // ---- sequences
  // A new empty sequence. A bounded policy is completed (window size from
  // n_ctx), validated against the model's trained context, and must fit the
  // pool on its own: it holds its blocks for life and once it has evicted it
  // can never be preempted. Throws ember::Error.
  std::unique_ptr<KvSequence> create(CachePolicy policy, int32_t n_ctx, int32_t n_ctx_train) const;
  // Drops every block and the history (the policy stays).
  void reset(KvSequence& seq);
  // Releases the sequence's blocks; call before destroying it.
  void release(KvSequence& seq);

  // ---- history
  void append(KvSequence& seq, const int32_t* ids, size_t n, bool generated);
  // Replaces the history with `ids` (re-rendered chat), keeping the longest
  // common prefix computed; the rest counts as prompt.
  void replace_history(KvSequence& seq, std::vector<int32_t> ids);
  // Rolls the computed tokens back to at most `n` (their KV is dropped); the
  // history stays. Throws kUnsupported when a bounded policy has already
  // evicted token n.
  void uncompute(KvSequence& seq, size_t n);
  // The adapters the sequence's rows are computed with from now on. Cached
  // K/V depends on them: a different set drops every computed token (the
  // history stays and is computed again, from the prefix cache where the
  // same tokens were computed with the same set). Throws kUnsupported for a
  // bounded sequence that has evicted tokens.
  void set_lora(KvSequence& seq, std::shared_ptr<const LoraSet> lora);

  // ---- scheduling
  // The scheduler's view of a sequence (SchedSequence fields it owns).
  void describe(const KvSequence& seq, SchedSequence& out) const;
  // One step's KvBudget over the sequences of the step, indexed by
  // SchedSequence::id. reuse_limit: a prefix-cache hit may cover at most
  // history tokens [0, reuse_limit) (rows with wanted logits are computed).
  struct BudgetEntry {
    KvSequence* seq = nullptr;
    size_t reuse_limit = SIZE_MAX;
  };
  class StepBudget final : public KvBudget {
   public:
    bool allocate(SchedSequence& s, size_t n_slots) override;
    bool failed(const SchedSequence& s) const override;
    void free(SchedSequence& s) override;
    void admit(SchedSequence& s) override;
    size_t capacity_slots() const override;
    // A tree's slots after the decode's token: at most the room before a
    // bounded policy's next eviction, halved until the pool has them.
    size_t lookahead(SchedSequence& s, size_t n) override;
    bool reclaim() override { return reclaim_ && reclaim_(); }
    // What reclaim() calls (the engine: its streams' draft models give back
    // their KV).
    void set_reclaim(std::function<bool()> f) { reclaim_ = std::move(f); }
    // Allocations that failed with an error (the sequence must fail).
    const std::vector<std::pair<uint64_t, Error>>& errors() const { return errors_; }

   private:
    friend class KvManager;
    StepBudget(KvManager& kv, std::vector<BudgetEntry> entries) : kv_(kv), entries_(std::move(entries)) {}
    KvManager& kv_;
    std::vector<BudgetEntry> entries_;
    std::vector<std::pair<uint64_t, Error>> errors_;
    std::function<bool()> reclaim_;
  };
  StepBudget step_budget(std::vector<BudgetEntry> entries) { return StepBudget(*this, std::move(entries)); }
  // Grows the cache so `n_new` more history tokens can be computed (a
  // bounded policy evicts and K-shifts first). False when the pool lacks
  // blocks now (nothing changed that matters: retry later). Throws on a
  // backend failure.
  bool grow(KvSequence& seq, size_t n_new);

  // ---- forward
  // Appends rows for history tokens [n_computed, n_computed + n) to `batch`;
  // rows at history index >= first_logit get logits.
  void add_rows(KvSequence& seq, Batch& batch, int32_t n, size_t first_logit);
  // Marks `n` more history tokens computed and indexes full blocks in the
  // prefix cache (unless the cache is shifted or `index` is false).
  void commit_computed(KvSequence& seq, size_t n, bool index = true);
  // Between turns: indexes and releases a full sequence's blocks so an idle
  // session pins nothing (its next turn finds them again through the prefix
  // cache). Bounded sequences keep theirs.
  void park(KvSequence& seq);

  // ---- one step's outcome: the one place an engine step changes a
  // sequence after its plan (Engine::step's apply phase).
  struct StepOutcome {
    size_t computed = 0;  // history tokens the forward pass computed (indexed in the prefix cache)
    // The plan reserved lookahead slots (a token tree's): the provisional
    // tokens `path` (indices, root to leaf; empty: none) are kept as history
    // and computed; the rest, and slots reserved but not used, are released.
    bool lookahead = false;
    std::vector<int32_t> path;
    std::vector<int32_t> appended;  // generated tokens that then join the history (pending: not computed)
    bool finished = false;          // the stream ended: the sequence is parked (park())
  };
  void apply(KvSequence& seq, const StepOutcome& outcome);

  // ---- speculation
  // Reserves slots for `ids` after the computed tokens (all history tokens
  // must be computed). A bounded policy takes at most its chunk limit.
  // False when the pool lacks blocks now.
  bool append_provisional(KvSequence& seq, const std::vector<int32_t>& ids);
  // Rows for the provisional tokens as a chain: row i at position
  // n_computed + i attends to the computed tokens and provisional rows
  // 0..i. Every row gets logits. (A token tree's rows need a tree mask in the
  // Batch and its attention: speculative decoding adds it; the commit below
  // already keeps any root-to-leaf path.)
  void add_provisional_rows(KvSequence& seq, Batch& batch);
  // Keeps the provisional tokens `path` (indices into provisional(), root to
  // leaf; a chain's prefix is {0..k-1}) as history and computed tokens, with
  // their KV moved to consecutive slots; rolls back everything else.
  // `generated`: the kept tokens count as generated.
  void commit_provisional(KvSequence& seq, const std::vector<int32_t>& path, bool generated);
  void rollback_provisional(KvSequence& seq);

  // ---- token trees (core/speculative): node 0 is the root, the last
  // history token (the pending one: every token before it is computed);
  // node i >= 1 sits in the cache slot i after the root's, at the position
  // depth(i) after it. reserve_tree() makes room for the nodes before they
  // are known (a drafter writes their K/V as it drafts); append_provisional()
  // then names them (nodes 1..n in order) once the root is computed.
  // How many nodes may follow the root without crossing a bounded policy's
  // next eviction (SIZE_MAX for a full sequence).
  size_t tree_room(const KvSequence& seq) const;
  // Reserves slots for `n_nodes` nodes after the root. False when the pool
  // lacks blocks now (nothing reserved that matters: rollback_provisional()).
  bool reserve_tree(KvSequence& seq, size_t n_nodes);
  // Rows for the tree nodes `rows` (ids into tokens/parents; parents[i] < i,
  // parents[0] = -1) as one sequence of the batch whose rows are all
  // computed as decodes (BatchSeq::decodes); every row gets logits. A node
  // attends to the computed history and to its ancestors and itself only.
  void add_tree_rows(KvSequence& seq, Batch& batch, const std::vector<int32_t>& tokens,
                     const std::vector<int32_t>& parents, const std::vector<int32_t>& rows);
  // Shortens the history to its first `n` tokens (their KV past n dropped).
  // Throws kUnsupported when a bounded policy has already evicted token n.
  void truncate_history(KvSequence& seq, size_t n);

  // ---- session files
  // The blocks that back the computed prefix, in table order, with how many
  // tokens they hold. An idle full sequence pins nothing: its prefix blocks
  // are found in the prefix cache and referenced until the Export goes.
  class Export {
   public:
    ~Export();
    Export(Export&&) = delete;
    // The first layer group's table (the only one in the plain layout).
    const std::vector<int32_t>& blocks() const { return tables_[0]; }
    size_t n_blocks() const { return tables_[0].size(); }
    size_t n_computed() const { return n_computed_; }
    // All-layer block i (geometry().bytes_per_block() bytes, layers in model
    // order, K then V each): gathered from the groups' blocks; a freed
    // sliding-window entry reads as zeros (no row can see it).
    void read(size_t i, void* dst) const;

   private:
    friend class KvManager;
    Export(KvManager& kv, std::vector<std::vector<int32_t>> tables, size_t n, bool borrowed)
        : kv_(kv), tables_(std::move(tables)), n_computed_(n), borrowed_(borrowed) {}
    KvManager& kv_;
    std::vector<std::vector<int32_t>> tables_;
    size_t n_computed_;
    bool borrowed_;
  };
  std::unique_ptr<Export> export_blocks(KvSequence& seq);
  // One pool block (pool_geometry().bytes_per_block() bytes).
  void read_block(int32_t block, void* dst) const { pool_->read_block(block, dst); }
  // Restores a saved sequence into the empty `seq`: history, computed count,
  // eviction state and the raw blocks (geometry().bytes_per_block() each,
  // table order).
  // Throws kBadFormat (inconsistent state, via `corrupt`) or kOutOfMemory.
  struct Saved {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> generated;
    size_t n_computed = 0;
    int64_t n_evicted = 0, dropped_blocks = 0;
    int32_t max_position = -1;
    const uint8_t* blocks = nullptr;
    size_t n_blocks = 0;
  };
  void restore(KvSequence& seq, Saved saved, const std::function<void(const std::string&)>& corrupt);

  // ---- whole-context scoring outside any session (Engine::score)
  // A private full-policy table for `n_slots` slots; false when the pool
  // lacks blocks now. release() it after use.
  bool reserve_scratch(KvSequence& seq, size_t n_slots);

 private:
  bool allocate_locked(KvSequence& seq, size_t n_slots);
  void admit_locked(KvSequence& seq, size_t reuse_limit, SchedSequence& s);
  void free_locked(KvSequence& seq, SchedSequence& s);
  // Copies the K/V of single slots inside one table (tree compaction).
  void copy_slots(KvSequence& seq, const std::vector<std::pair<int32_t, int32_t>>& moves);
  void init_rope();
  // The longest cached prefix of the sequence's history (at most max_blocks
  // blocks) that every layer group can resume from: `out` gets one table per
  // group (referenced blocks; a sliding-window group's entries before what its
  // window needs are kNoBlock). Returns its length in blocks.
  size_t match_groups(const KvSequence& seq, size_t max_blocks, std::vector<std::vector<int32_t>>& out);
  std::vector<std::vector<int32_t>*> tables(KvSequence& seq);
  void truncate_all(KvSequence& seq, int32_t n_slots);
  void commit_all(KvSequence& seq);
  void release_all(KvSequence& seq);
  // Frees what the sliding-window groups of a full sequence no longer need
  // once rows from token n on are computed.
  void trim_local(KvSequence& seq, size_t n);
  // After the computed tokens went back to n: makes the sliding-window groups
  // hold what rows from n on need again (from the prefix cache); returns the
  // count they can resume from (n, or less when a block is gone).
  size_t regain_local(KvSequence& seq, size_t n);
  // Appends the sequence's rows to the batch with every group's table.
  void add_batch_rows(KvSequence& seq, Batch& batch, const int32_t* toks, const int32_t* pos, const int32_t* slot,
                      int32_t n, int32_t first_logit, const uint8_t* decoded);

  KvGeometry geometry_;  // all layers
  KvLayerGroups groups_;
  std::shared_ptr<KvCache> pool_;
  bool index_ = true;  // prefix matching and indexing (off for a view)
  KvView view_;        // num_kv_heads 0: the pool's own rows
  Rope rope_;
  std::vector<std::vector<RopeSpec>> group_rope_;  // per group, its layers' specs
};

}  // namespace ember
