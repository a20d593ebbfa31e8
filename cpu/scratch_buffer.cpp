#include "cpu/scratch_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/util/status.h"

namespace ember::cpu {

void* alloc_host(size_t bytes, size_t map_from, bool* mapped) {
  *mapped = false;
  if (bytes < map_from) return std::aligned_alloc(64, (bytes + 63) & ~size_t{63});
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  *mapped = true;
  return p;
}

void free_host(void* p, size_t bytes, bool mapped) {
  if (mapped)
    munmap(p, bytes);
  else
    std::free(p);
}

void* ScratchBuffer::get(size_t bytes) {
  if (cap_ > kKeepBytes && bytes <= cap_ / 4) {
    if (++small_calls_ >= kShrinkAfter) release();
  } else {
    small_calls_ = 0;
  }
  if (bytes <= cap_) return p_;
  release();
  if (bytes > (size_t{1} << 62))
    fail(StatusCode::kOutOfMemory, "cpu scratch: cannot allocate " + std::to_string(bytes));
  const size_t want = (std::max(bytes, bytes + bytes / 4) + 4095) & ~size_t{4095};
  bool mapped = false;
  void* p = alloc_host(want, kMapBytes, &mapped);
  if (!p) fail(StatusCode::kOutOfMemory, "cpu scratch: cannot allocate " + std::to_string(want) + " bytes");
  p_ = p;
  cap_ = want;
  mapped_ = mapped;
  small_calls_ = 0;
  return p_;
}

void ScratchBuffer::release() {
  free_host(p_, cap_, mapped_);
  p_ = nullptr;
  cap_ = 0;
  mapped_ = false;
  small_calls_ = 0;
}

}  // namespace ember::cpu
