// core::KvCache: the pool of fixed-size KV blocks shared by every sequence of
// an engine. Blocks are reference counted (a shared prefix is stored once);
// free blocks are handed out from a free list. The storage itself lives in
// the backend (Backend::kv_init); this class only does the bookkeeping.
// Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "core/backend/backend.h"

namespace ember {

struct KvCacheStats {
  int32_t block_size = 0;
  size_t blocks_total = 0, blocks_used = 0, blocks_cached = 0, blocks_free = 0;
  uint64_t prefix_hits = 0, prefix_misses = 0;
  size_t bytes_per_block = 0;
};

class KvCache {
 public:
  KvCache(Backend& backend, const KvGeometry& geometry);

  const KvGeometry& geometry() const { return geometry_; }
  int32_t block_size() const { return geometry_.block_size; }

  // Grows `block_table` so it covers `n_slots` slots. All or nothing: returns
  // false (and leaves the table unchanged) when the pool lacks blocks.
  bool reserve(std::vector<int32_t>& block_table, int32_t n_slots);
  // Shrinks `block_table` to cover only `n_slots` slots, releasing the rest.
  void truncate(std::vector<int32_t>& block_table, int32_t n_slots);
  // Releases every block of the table and clears it.
  void release(std::vector<int32_t>& block_table) { truncate(block_table, 0); }

  KvCacheStats stats() const;

 private:
  void unref_locked(int32_t block);

  Backend& backend_;
  KvGeometry geometry_;
  mutable std::mutex mutex_;
  std::vector<int32_t> refcount_;
  std::deque<int32_t> free_list_;
};

}  // namespace ember
