#include "core/kv_cache/kv_cache.h"

#include "core/util/status.h"

namespace ember {

KvCache::KvCache(Backend& backend, const KvGeometry& geometry) : backend_(backend), geometry_(geometry) {
  if (geometry.block_size <= 0 || geometry.block_size > 64) {
    fail(StatusCode::kInvalidArgument, "kv cache: block size must be in [1, 64]");
  }
  if (geometry.num_blocks <= 0) fail(StatusCode::kInvalidArgument, "kv cache: the memory budget holds no block");
  backend_.kv_init(geometry_);
  refcount_.assign(geometry_.num_blocks, 0);
  for (int32_t b = 0; b < geometry_.num_blocks; ++b) free_list_.push_back(b);
}

bool KvCache::reserve(std::vector<int32_t>& block_table, int32_t n_slots) {
  const size_t need = (static_cast<size_t>(n_slots) + geometry_.block_size - 1) / geometry_.block_size;
  if (need <= block_table.size()) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t extra = need - block_table.size();
  if (extra > free_list_.size()) return false;
  for (size_t i = 0; i < extra; ++i) {
    const int32_t b = free_list_.front();
    free_list_.pop_front();
    refcount_[b] = 1;
    block_table.push_back(b);
  }
  return true;
}

void KvCache::truncate(std::vector<int32_t>& block_table, int32_t n_slots) {
  const size_t keep = (static_cast<size_t>(std::max(n_slots, 0)) + geometry_.block_size - 1) / geometry_.block_size;
  if (keep >= block_table.size()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = keep; i < block_table.size(); ++i) unref_locked(block_table[i]);
  block_table.resize(keep);
}

void KvCache::unref_locked(int32_t block) {
  if (block < 0 || block >= geometry_.num_blocks || refcount_[block] <= 0) {
    fail(StatusCode::kInternal, "kv cache: releasing a block that is not held");
  }
  if (--refcount_[block] == 0) free_list_.push_back(block);
}

KvCacheStats KvCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  KvCacheStats s;
  s.block_size = geometry_.block_size;
  s.blocks_total = static_cast<size_t>(geometry_.num_blocks);
  s.blocks_free = free_list_.size();
  s.blocks_used = s.blocks_total - s.blocks_free;
  s.bytes_per_block = geometry_.bytes_per_block();
  return s;
}

}  // namespace ember
