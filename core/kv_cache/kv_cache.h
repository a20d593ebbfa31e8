// core::KvCache: the pool of fixed-size KV blocks shared by every sequence of
// an engine, with prefix caching.
//
// - Blocks are reference counted: a prefix shared by several sequences is
//   stored once. A block about to be written while shared is copied first
//   (copy-on-write, prepare_write).
// - Every full block a sequence has computed is indexed by a hash of
//   (parent block's hash, the block's token ids), so a new sequence whose
//   prompt starts with the same tokens reuses it (match_prefix). Hash
//   collisions are detected by comparing the stored token ids.
// - Unreferenced blocks sit in one free list in eviction order: blocks freed
//   last are reused last; a cached (hashed) block leaves the index only when
//   the pool hands it out again.
// - Layer groups (KvLayerGroups): a block may hold a group of the model's
//   layers rather than all of them; a sequence then has one block table per
//   group, and a group of sliding-window layers frees the blocks its window
//   has left (entries kNoBlock in its table). Prefix keys include the group.
// The storage lives in the backend (Backend::kv_init); this class does the
// bookkeeping. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/backend/backend.h"
#include "core/kv_cache/layer_groups.h"

namespace ember {

struct KvCacheStats {
  int32_t block_size = 0;
  size_t blocks_total = 0, blocks_used = 0, blocks_cached = 0, blocks_free = 0;
  uint64_t prefix_hits = 0, prefix_misses = 0;  // in blocks
  uint64_t evictions = 0, cow_copies = 0;
  size_t bytes_per_block = 0;
};

class KvCache {
 public:
  KvCache(Backend& backend, const KvGeometry& geometry, bool prefix_caching = true);

  const KvGeometry& geometry() const { return geometry_; }
  int32_t block_size() const { return geometry_.block_size; }
  size_t total_blocks() const { return static_cast<size_t>(geometry_.num_blocks); }

  // Longest run of cached full blocks that starts `tokens`, at most
  // `max_blocks`; the returned blocks are referenced by the caller (release
  // them like any other). Counts prefix hits and misses.
  // `decoded` (may be null): per token, 1 for a generated token, whose K/V
  // are computed in the decode order (AttentionParams::decode_rows). It is
  // part of a block's key, here and in commit, so a reused block always
  // holds what the reusing sequence would have computed itself.
  // `group`: the layer group the blocks belong to (its own keys). `salt`:
  // what else the K/V depends on (the sequence's LoRA adapters, 0: none);
  // blocks match only blocks committed with the same salt.
  std::vector<int32_t> match_prefix(const int32_t* tokens, size_t n_tokens, size_t max_blocks, bool count_stats = true,
                                    const uint8_t* decoded = nullptr, int32_t group = 0, uint64_t salt = 0);
  // Like match_prefix, but looks up every one of the first `n_blocks` full
  // blocks and does not stop at a missing one: its entry is kNoBlock (a
  // sliding-window group needs only the blocks at the end of the prefix).
  // Found blocks are referenced by the caller.
  std::vector<int32_t> find_blocks(const int32_t* tokens, size_t n_blocks, const uint8_t* decoded, int32_t group,
                                   uint64_t salt = 0);
  // Prefix-cache statistics counted by the caller (in blocks).
  void count_prefix(size_t hits, size_t misses);

  // Grows `block_table` so it covers `n_slots` slots, evicting cached blocks
  // if needed. All or nothing: false (table unchanged) when the pool lacks
  // blocks.
  bool reserve(std::vector<int32_t>& block_table, int32_t n_slots);
  // The same for several tables at once (a sequence's layer groups), all or
  // nothing.
  bool reserve(std::vector<int32_t>* const* tables, size_t n_tables, int32_t n_slots);
  // Makes the block holding `first_slot` (and every later one) private to
  // this table before it is written: a shared block is copied, a cached
  // block leaves the index. False when no block is free for the copy.
  bool prepare_write(std::vector<int32_t>& block_table, int32_t first_slot);
  // The same for several tables at once, all or nothing. kNoBlock entries are skipped.
  bool prepare_write(std::vector<int32_t>* const* tables, size_t n_tables, int32_t first_slot);
  // Indexes the full blocks of a sequence whose first `n_filled` slots hold
  // the K/V of `tokens[0, n_filled)`. Blocks already indexed are skipped.
  // kNoBlock entries are skipped (the chain of keys goes on through them).
  void commit(const std::vector<int32_t>& block_table, const int32_t* tokens, size_t n_filled,
              const uint8_t* decoded = nullptr, int32_t group = 0, uint64_t salt = 0);
  // Shrinks `block_table` to cover `n_slots` slots, releasing the rest
  // (last block first, so the tail of a sequence is evicted before its head).
  void truncate(std::vector<int32_t>& block_table, int32_t n_slots);
  void release(std::vector<int32_t>& block_table) { truncate(block_table, 0); }
  // Removes `count` blocks from `block_table` starting at index `first` and
  // releases them (a cache policy evicting its oldest window blocks; the later
  // entries move down, no KV is copied).
  void drop_blocks(std::vector<int32_t>& block_table, size_t first, size_t count);
  // Releases the blocks of table entries [first, last) and marks them
  // kNoBlock (a sliding-window group freeing what its window has left).
  void free_entries(std::vector<int32_t>& block_table, size_t first, size_t last);
  // K-shift of whole blocks (Backend::kv_rope_shift). The caller holds them
  // privately (prepare_write) and none of them is in the prefix index.
  // layers: one RopeSpec per layer (Backend::kv_rope_shift_layers).
  // view (may be null): the blocks hold another model's rows (KvView), in
  // the first layers.size() pool layers.
  void shift_keys(const std::vector<int32_t>& blocks, int32_t delta, const std::vector<RopeSpec>& layers,
                  const KvView* view = nullptr);
  bool supports_kv_views() const { return backend_.supports_kv_views(); }
  bool supports_cache_policies() const { return backend_.supports_cache_policies(); }
  std::string backend_name() const { return backend_.name(); }
  // Raw block contents (KvGeometry::bytes_per_block() bytes): save/restore.
  void read_block(int32_t block, void* dst) const {
    refuse_if_split("session files (saving or restoring KV)");
    backend_.kv_read_block(block, dst);
  }
  void write_block(int32_t block, const void* src) {
    refuse_if_split("session files (saving or restoring KV)");
    backend_.kv_write_block(block, src);
  }
  // The pool is one rank's part of a model split across ranks (issue 31):
  // every block copy is first sent to the other ranks through `mirror` (their
  // pools hold the same blocks for their heads or layers); what only this
  // rank's pool could do (K-shift, raw block reads and writes) is refused.
  using CopyMirror = std::function<void(const int32_t* src, const int32_t* dst, int32_t n)>;
  void set_split(CopyMirror mirror) { mirror_ = std::move(mirror); }
  bool split() const { return static_cast<bool>(mirror_); }
  // Throws ember::Error(kUnsupported) naming `what` on a split pool.
  void refuse_if_split(const char* what) const;

  // Number of blocks that reserve() could hand out now (free + cached).
  size_t available_blocks() const;
  KvCacheStats stats() const;

 private:
  CopyMirror mirror_;
  struct BlockMeta {
    int32_t refcount = 0;
    bool hashed = false;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;  // the block's token ids, to detect hash collisions
    uint64_t parent_hash = 0;
    int32_t prev = -1, next = -1;  // free-list links
    bool in_free_list = false;
  };
  static uint64_t chain_hash(uint64_t parent, const int32_t* tokens, int32_t n);
  static uint64_t group_seed(int32_t group);
  // Looks up the first n full blocks (stop_at_missing: the leading run only).
  std::vector<int32_t> match_locked(const int32_t* tokens, size_t n, const uint8_t* decoded, int32_t group,
                                    uint64_t salt, bool stop_at_missing);
  void free_list_push_back(int32_t b);
  void free_list_remove(int32_t b);
  int32_t take_free_block_locked();  // evicts a cached block if needed; -1 if none
  void unref_locked(int32_t b);
  void unhash_locked(int32_t b);

  Backend& backend_;
  KvGeometry geometry_;
  bool prefix_caching_;
  mutable std::mutex mutex_;
  std::vector<BlockMeta> blocks_;
  int32_t free_head_ = -1, free_tail_ = -1;
  size_t free_count_ = 0, cached_count_ = 0;
  std::unordered_map<uint64_t, int32_t> index_;  // hash -> block
  KvCacheStats counters_;
};

}  // namespace ember
