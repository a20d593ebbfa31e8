#include "core/util/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace ember {

namespace {
size_t mapped_length(size_t bytes) { return (bytes + 4095) / 4096 * 4096; }
}  // namespace

bool huge_pages_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("EMBER_HUGEPAGES");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

void* map_huge(size_t bytes) {
  const size_t len = mapped_length(bytes);
  void* raw = ::mmap(nullptr, len + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  // Keep [a, a + len) of the over-sized mapping, a on a 2 MiB boundary.
  const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t a = (r + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (a > r) ::munmap(raw, a - r);
  if (r + kHugePageBytes > a) ::munmap(reinterpret_cast<void*>(a + len), r + kHugePageBytes - a);
  if (huge_pages_enabled()) ::madvise(reinterpret_cast<void*>(a), len, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(a);
}

void map_huge_free(void* p, size_t bytes) {
  if (p) ::munmap(p, mapped_length(bytes));
}

}  // namespace ember
