#include "core/kv_cache/kv_cache.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "core/util/fault.h"
#include "core/util/hash.h"
#include "core/util/status.h"

namespace ember {

bool KvLayerGroups::has_local() const {
  return std::any_of(window.begin(), window.end(), [](int32_t w) { return w > 0; });
}

KvLayerGroups KvLayerGroups::from_windows(const std::vector<int32_t>& layer_window) {
  KvLayerGroups g;
  const int32_t n = static_cast<int32_t>(layer_window.size());
  if (n == 0) return g;
  std::map<int32_t, std::vector<int32_t>> classes;  // window -> its layers, in order
  for (int32_t il = 0; il < n; ++il) classes[std::max(layer_window[il], 0)].push_back(il);
  int32_t per = 0;
  for (const auto& c : classes) per = std::gcd(per, static_cast<int32_t>(c.second.size()));
  g.layers_per_group = per;
  g.group_of_layer.assign(n, 0);
  g.index_in_group.assign(n, 0);
  for (const auto& [w, ls] : classes) {
    for (size_t i = 0; i < ls.size(); i += static_cast<size_t>(per)) {
      const int32_t group = g.n_groups();
      g.window.push_back(w);
      g.layers.emplace_back(ls.begin() + static_cast<std::ptrdiff_t>(i),
                            ls.begin() + static_cast<std::ptrdiff_t>(i + static_cast<size_t>(per)));
      for (int32_t j = 0; j < per; ++j) {
        g.group_of_layer[ls[i + j]] = group;
        g.index_in_group[ls[i + j]] = j;
      }
    }
  }
  return g;
}

KvLayerGroups KvLayerGroups::pipeline_stage(const std::vector<int32_t>& layer_window,
                                            const std::vector<int32_t>& stage_layers, int32_t stage) {
  const int32_t n_stages = static_cast<int32_t>(stage_layers.size());
  if (stage < 0 || stage >= n_stages) fail(StatusCode::kInternal, "kv layer groups: stage out of range");
  // classes[window][s]: stage s's layers of that window, in its own numbers.
  std::map<int32_t, std::vector<std::vector<int32_t>>> classes;
  int32_t first = 0;
  for (int32_t s = 0; s < n_stages; ++s) {
    const int32_t n = stage_layers[static_cast<size_t>(s)];
    if (n < 1 || first + n > static_cast<int32_t>(layer_window.size())) {
      fail(StatusCode::kInternal, "kv layer groups: stages do not cover the model's layers");
    }
    for (int32_t il = 0; il < n; ++il) {
      auto& per_stage = classes[std::max(layer_window[static_cast<size_t>(first + il)], 0)];
      per_stage.resize(static_cast<size_t>(n_stages));
      per_stage[static_cast<size_t>(s)].push_back(il);
    }
    first += n;
  }
  if (first != static_cast<int32_t>(layer_window.size())) {
    fail(StatusCode::kInternal, "kv layer groups: stages do not cover the model's layers");
  }
  auto count = [](const std::vector<int32_t>& v) { return static_cast<int32_t>(v.size()); };
  int32_t most = 0;  // the largest class on any stage
  for (const auto& c : classes)
    for (const auto& ls : c.second) most = std::max(most, count(ls));
  // Candidates: every class cut into ceil(its largest stage's count / L)
  // groups; each stage then needs ceil(count / groups) layers a group.
  std::vector<int32_t> best_groups;
  int64_t best_unused = -1;
  for (int32_t l = 1; l <= most; ++l) {
    std::vector<int32_t> groups;
    int32_t total = 0;
    for (const auto& c : classes) {
      int32_t largest = 0;
      for (const auto& ls : c.second) largest = std::max(largest, count(ls));
      groups.push_back((largest + l - 1) / l);
      total += groups.back();
    }
    int64_t unused = 0;
    for (int32_t s = 0; s < n_stages; ++s) {
      int32_t per = 1;
      size_t ci = 0;
      for (const auto& c : classes) {
        per = std::max(per, (count(c.second[static_cast<size_t>(s)]) + groups[ci] - 1) / groups[ci]);
        ++ci;
      }
      unused += static_cast<int64_t>(per) * total - stage_layers[static_cast<size_t>(s)];
    }
    const int32_t best_total = std::accumulate(best_groups.begin(), best_groups.end(), 0);
    if (best_unused < 0 || unused < best_unused || (unused == best_unused && total < best_total)) {
      best_unused = unused;
      best_groups = groups;
    }
  }
  KvLayerGroups g;
  const int32_t n = stage_layers[static_cast<size_t>(stage)];
  size_t ci = 0;
  for (const auto& c : classes) {
    g.layers_per_group = std::max(
        {g.layers_per_group, 1, (count(c.second[static_cast<size_t>(stage)]) + best_groups[ci] - 1) / best_groups[ci]});
    ++ci;
  }
  g.group_of_layer.assign(static_cast<size_t>(n), 0);
  g.index_in_group.assign(static_cast<size_t>(n), 0);
  ci = 0;
  for (const auto& [w, per_stage] : classes) {
    const std::vector<int32_t>& ls = per_stage[static_cast<size_t>(stage)];
    for (int32_t k = 0; k < best_groups[ci]; ++k) {
      const int32_t group = g.n_groups();
      g.window.push_back(w);
      g.layers.emplace_back();
      for (int32_t j = 0; j < g.layers_per_group; ++j) {
        const int32_t i = k * g.layers_per_group + j;
        if (i >= count(ls)) break;
        const int32_t il = ls[static_cast<size_t>(i)];
        g.layers.back().push_back(il);
        g.group_of_layer[static_cast<size_t>(il)] = group;
        g.index_in_group[static_cast<size_t>(il)] = j;
      }
    }
    ++ci;
  }
  return g;
}

KvLayerGroups KvLayerGroups::chunked(int32_t n_layers, int32_t per_group) {
  KvLayerGroups g;
  g.layers_per_group = per_group;
  for (int32_t il = 0; il < n_layers; ++il) {
    if (il % per_group == 0) {
      g.window.push_back(0);
      g.layers.emplace_back();
    }
    g.group_of_layer.push_back(g.n_groups() - 1);
    g.index_in_group.push_back(il % per_group);
    g.layers.back().push_back(il);
  }
  return g;
}

size_t KvLayerGroups::first_needed_block(int32_t group, int64_t n, int32_t block_size) const {
  const int32_t w = window[static_cast<size_t>(group)];
  const int64_t first_slot = (n + 1 - w) & ~int64_t{31};
  if (w <= 0 || first_slot <= 0) return 0;
  return static_cast<size_t>(first_slot / block_size);
}

KvCache::KvCache(Backend& backend, const KvGeometry& geometry, bool prefix_caching)
    : backend_(backend), geometry_(geometry), prefix_caching_(prefix_caching) {
  if (geometry.block_size <= 0 || geometry.block_size > 64) {
    fail(StatusCode::kInvalidArgument, "kv cache: block size must be in [1, 64]");
  }
  if (geometry.num_blocks <= 0) fail(StatusCode::kInvalidArgument, "kv cache: the memory budget holds no block");
  backend_.kv_init(geometry_);
  blocks_.resize(static_cast<size_t>(geometry_.num_blocks));
  for (int32_t b = 0; b < geometry_.num_blocks; ++b) free_list_push_back(b);
}

uint64_t KvCache::chain_hash(uint64_t parent, const int32_t* tokens, int32_t n) {
  // FNV-1a over the parent hash and the token ids, then a final mix. The
  // start is the parent xor a constant that is FNV's offset basis less its
  // last decimal digit (as it always was: any constant serves).
  constexpr uint64_t kStart = 1469598103934665603ull;
  uint64_t h = fnv1a_u32(static_cast<uint32_t>(parent >> 32), kStart ^ parent);
  h = fnv1a_u32(static_cast<uint32_t>(parent), h);
  for (int32_t i = 0; i < n; ++i) h = fnv1a_u32(static_cast<uint32_t>(tokens[i]), h);
  return mix64(h);
}

uint64_t KvCache::group_seed(int32_t group) {
  if (group == 0) return 0;  // the plain layout keeps its keys
  uint64_t z = static_cast<uint64_t>(group) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  return z ^ (z >> 27);
}

void KvCache::free_list_push_back(int32_t b) {
  BlockMeta& m = blocks_[b];
  m.prev = free_tail_;
  m.next = -1;
  if (free_tail_ >= 0)
    blocks_[free_tail_].next = b;
  else
    free_head_ = b;
  free_tail_ = b;
  m.in_free_list = true;
  if (m.hashed)
    ++cached_count_;
  else
    ++free_count_;
}

void KvCache::free_list_remove(int32_t b) {
  BlockMeta& m = blocks_[b];
  if (m.prev >= 0)
    blocks_[m.prev].next = m.next;
  else
    free_head_ = m.next;
  if (m.next >= 0)
    blocks_[m.next].prev = m.prev;
  else
    free_tail_ = m.prev;
  m.prev = m.next = -1;
  m.in_free_list = false;
  if (m.hashed)
    --cached_count_;
  else
    --free_count_;
}

void KvCache::unhash_locked(int32_t b) {
  BlockMeta& m = blocks_[b];
  if (!m.hashed) return;
  auto it = index_.find(m.hash);
  if (it != index_.end() && it->second == b) index_.erase(it);
  if (m.in_free_list) {
    --cached_count_;
    ++free_count_;
  }
  m.hashed = false;
  m.tokens.clear();
}

int32_t KvCache::take_free_block_locked() {
  const int32_t b = free_head_;
  if (b < 0) return -1;
  free_list_remove(b);
  if (blocks_[b].hashed) {
    unhash_locked(b);
    ++counters_.evictions;
  }
  blocks_[b].refcount = 1;
  return b;
}

namespace {
// A block's key tokens: the ids, with bit 30 set on generated tokens (ids
// are below 2^30), so a block computed from generated tokens and one holding
// the same ids as prompt are different entries.
const int32_t* key_tokens(const int32_t* t, const uint8_t* decoded, size_t first, int32_t n,
                          std::vector<int32_t>& buf) {
  if (!decoded) return t;
  bool any = false;
  for (int32_t i = 0; i < n; ++i) any |= decoded[first + static_cast<size_t>(i)] != 0;
  if (!any) return t;
  buf.assign(t, t + n);
  for (int32_t i = 0; i < n; ++i)
    if (decoded[first + static_cast<size_t>(i)]) buf[static_cast<size_t>(i)] |= int32_t{1} << 30;
  return buf.data();
}
}  // namespace

std::vector<int32_t> KvCache::match_locked(const int32_t* tokens, size_t n, const uint8_t* decoded, int32_t group,
                                           uint64_t salt, bool stop_at_missing) {
  std::vector<int32_t> out;
  const int32_t bs = geometry_.block_size;
  uint64_t parent = group_seed(group) ^ salt;
  std::vector<int32_t> key;
  for (size_t i = 0; i < n; ++i) {
    const int32_t* t = key_tokens(tokens + i * bs, decoded, i * bs, bs, key);
    const uint64_t h = chain_hash(parent, t, bs);
    auto it = index_.find(h);
    int32_t found = kNoBlock;
    if (it != index_.end()) {
      BlockMeta& m = blocks_[it->second];
      if (m.parent_hash == parent && std::equal(m.tokens.begin(), m.tokens.end(), t)) {  // else a collision
        if (m.in_free_list) free_list_remove(it->second);
        ++m.refcount;
        found = it->second;
      }
    }
    if (found == kNoBlock && stop_at_missing) break;
    out.push_back(found);
    parent = h;
  }
  return out;
}

std::vector<int32_t> KvCache::match_prefix(const int32_t* tokens, size_t n_tokens, size_t max_blocks, bool count_stats,
                                           const uint8_t* decoded, int32_t group, uint64_t salt) {
  if (!prefix_caching_) return {};
  const size_t full = std::min(n_tokens / static_cast<size_t>(geometry_.block_size), max_blocks);
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int32_t> out = match_locked(tokens, full, decoded, group, salt, true);
  if (count_stats) {
    counters_.prefix_hits += out.size();
    counters_.prefix_misses += full - out.size();
  }
  return out;
}

std::vector<int32_t> KvCache::find_blocks(const int32_t* tokens, size_t n_blocks, const uint8_t* decoded, int32_t group,
                                          uint64_t salt) {
  if (!prefix_caching_) return std::vector<int32_t>(n_blocks, kNoBlock);
  std::lock_guard<std::mutex> lock(mutex_);
  return match_locked(tokens, n_blocks, decoded, group, salt, false);
}

void KvCache::count_prefix(size_t hits, size_t misses) {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_.prefix_hits += hits;
  counters_.prefix_misses += misses;
}

bool KvCache::reserve(std::vector<int32_t>& block_table, int32_t n_slots) {
  std::vector<int32_t>* t = &block_table;
  return reserve(&t, 1, n_slots);
}

bool KvCache::reserve(std::vector<int32_t>* const* tables, size_t n_tables, int32_t n_slots) {
  const size_t need = (static_cast<size_t>(std::max(n_slots, 0)) + geometry_.block_size - 1) / geometry_.block_size;
  size_t extra = 0;
  for (size_t g = 0; g < n_tables; ++g) extra += need > tables[g]->size() ? need - tables[g]->size() : 0;
  if (extra == 0) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (extra > free_count_ + cached_count_) return false;
  if (testing::inject_alloc_failure(testing::AllocSite::kKvBlock)) {
    fail(StatusCode::kOutOfMemory, "kv cache: cannot allocate " + std::to_string(extra) + " KV blocks (injected)");
  }
  for (size_t g = 0; g < n_tables; ++g) {
    while (tables[g]->size() < need) tables[g]->push_back(take_free_block_locked());
  }
  return true;
}

bool KvCache::prepare_write(std::vector<int32_t>& block_table, int32_t first_slot) {
  std::vector<int32_t>* t = &block_table;
  return prepare_write(&t, 1, first_slot);
}

bool KvCache::prepare_write(std::vector<int32_t>* const* tables, size_t n_tables, int32_t first_slot) {
  const size_t first_block = static_cast<size_t>(std::max(first_slot, 0)) / geometry_.block_size;
  std::vector<int32_t> src, dst;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // All or nothing: a failure must not leave a table pointing at a copy
    // whose content was never copied.
    size_t copies = 0;
    for (size_t g = 0; g < n_tables; ++g) {
      const std::vector<int32_t>& table = *tables[g];
      for (size_t i = first_block; i < table.size(); ++i) copies += table[i] >= 0 && blocks_[table[i]].refcount > 1;
    }
    if (copies > free_count_ + cached_count_) return false;
    if (copies > 0 && testing::inject_alloc_failure(testing::AllocSite::kKvBlock)) {
      fail(StatusCode::kOutOfMemory,
           "kv cache: cannot allocate " + std::to_string(copies) + " KV blocks for copy-on-write (injected)");
    }
    for (size_t g = 0; g < n_tables; ++g) {
      std::vector<int32_t>& table = *tables[g];
      for (size_t i = first_block; i < table.size(); ++i) {
        const int32_t b = table[i];
        if (b < 0) continue;
        BlockMeta& m = blocks_[b];
        if (m.refcount > 1) {
          const int32_t copy = take_free_block_locked();
          if (copy < 0) return false;
          --m.refcount;
          table[i] = copy;
          src.push_back(b);
          dst.push_back(copy);
          ++counters_.cow_copies;
        } else if (m.hashed) {
          unhash_locked(b);  // only we hold it: its content is about to change
        }
      }
    }
  }
  if (!src.empty()) {
    if (mirror_) mirror_(src.data(), dst.data(), static_cast<int32_t>(src.size()));
    backend_.kv_copy_blocks(src.data(), dst.data(), static_cast<int32_t>(src.size()));
  }
  return true;
}

void KvCache::refuse_if_split(const char* what) const {
  if (mirror_)
    fail(StatusCode::kUnsupported, std::string(what) + " on a model split across ranks are not supported yet");
}

void KvCache::commit(const std::vector<int32_t>& block_table, const int32_t* tokens, size_t n_filled,
                     const uint8_t* decoded, int32_t group, uint64_t salt) {
  if (!prefix_caching_) return;
  const int32_t bs = geometry_.block_size;
  const size_t full = std::min(n_filled / static_cast<size_t>(bs), block_table.size());
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t parent = group_seed(group) ^ salt;
  bool parent_known = true;  // false past a freed entry, until a hashed block gives it again
  std::vector<int32_t> key;
  for (size_t i = 0; i < full; ++i) {
    const int32_t b = block_table[i];
    if (b < 0) {
      parent_known = false;
      continue;
    }
    BlockMeta& m = blocks_[b];
    if (m.hashed) {
      parent = m.hash;
      parent_known = true;
      continue;
    }
    if (!parent_known) {  // rare: an unindexed block right after freed ones
      parent = group_seed(group) ^ salt;
      for (size_t j = 0; j < i; ++j)
        parent = chain_hash(parent, key_tokens(tokens + j * bs, decoded, j * bs, bs, key), bs);
      parent_known = true;
    }
    const int32_t* t = key_tokens(tokens + i * bs, decoded, i * bs, bs, key);
    const uint64_t h = chain_hash(parent, t, bs);
    auto [it, inserted] = index_.emplace(h, b);
    if (inserted) {
      m.hashed = true;
      m.hash = h;
      m.parent_hash = parent;
      m.tokens.assign(t, t + bs);
    }
    // Not inserted: another block already holds this content; ours stays private.
    parent = h;
  }
}

void KvCache::unref_locked(int32_t b) {
  if (b < 0 || b >= geometry_.num_blocks || blocks_[b].refcount <= 0) {
    fail(StatusCode::kInternal, "kv cache: releasing a block that is not held");
  }
  if (--blocks_[b].refcount == 0) free_list_push_back(b);
}

void KvCache::truncate(std::vector<int32_t>& block_table, int32_t n_slots) {
  const size_t keep = (static_cast<size_t>(std::max(n_slots, 0)) + geometry_.block_size - 1) / geometry_.block_size;
  if (keep >= block_table.size()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = block_table.size(); i-- > keep;)
    if (block_table[i] >= 0) unref_locked(block_table[i]);
  block_table.resize(keep);
}

void KvCache::drop_blocks(std::vector<int32_t>& block_table, size_t first, size_t count) {
  if (count == 0) return;
  if (first + count > block_table.size()) fail(StatusCode::kInternal, "kv cache: dropping blocks past the table");
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = first; i < first + count; ++i)
    if (block_table[i] >= 0) unref_locked(block_table[i]);
  block_table.erase(block_table.begin() + static_cast<std::ptrdiff_t>(first),
                    block_table.begin() + static_cast<std::ptrdiff_t>(first + count));
}

void KvCache::free_entries(std::vector<int32_t>& block_table, size_t first, size_t last) {
  last = std::min(last, block_table.size());
  if (first >= last) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Oldest first: they are the first to be evicted.
  for (size_t i = first; i < last; ++i) {
    if (block_table[i] < 0) continue;
    unref_locked(block_table[i]);
    block_table[i] = kNoBlock;
  }
}

void KvCache::shift_keys(const std::vector<int32_t>& blocks, int32_t delta, const std::vector<RopeSpec>& layers,
                         const KvView* view) {
  if (blocks.empty() || delta == 0) return;
  refuse_if_split("K-shifts (window/sink sessions)");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int32_t b : blocks) {
      if (b < 0 || b >= geometry_.num_blocks || blocks_[b].refcount != 1 || blocks_[b].hashed) {
        fail(StatusCode::kInternal, "kv cache: K-shift of a block that is shared or indexed");
      }
    }
  }
  if (view) {
    if (layers.empty() || static_cast<int32_t>(layers.size()) > geometry_.num_layers) {
      fail(StatusCode::kInternal, "kv cache: K-shift of a view needs one RoPE spec per layer it uses");
    }
    backend_.kv_rope_shift_view(*view, blocks.data(), static_cast<int32_t>(blocks.size()), delta, layers.data(),
                                static_cast<int32_t>(layers.size()));
    return;
  }
  if (static_cast<int32_t>(layers.size()) != geometry_.num_layers) {
    fail(StatusCode::kInternal, "kv cache: K-shift needs one RoPE spec per layer");
  }
  backend_.kv_rope_shift_layers(blocks.data(), static_cast<int32_t>(blocks.size()), delta, layers.data(),
                                static_cast<int32_t>(layers.size()));
}

size_t KvCache::available_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return free_count_ + cached_count_;
}

KvCacheStats KvCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  KvCacheStats s = counters_;
  s.block_size = geometry_.block_size;
  s.blocks_total = total_blocks();
  s.blocks_free = free_count_;
  s.blocks_cached = cached_count_;
  s.blocks_used = s.blocks_total - free_count_ - cached_count_;
  s.bytes_per_block = geometry_.bytes_per_block();
  return s;
}

}  // namespace ember
