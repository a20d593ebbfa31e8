// Anonymous memory for data streamed whole on every token (weights): on a
// 2 MiB boundary, with transparent huge pages asked for over all of it (the
// kernel backs each whole 2 MiB extent with one page where it can; the tail
// stays in small pages, so rounding costs no memory). Fewer TLB misses:
// +5-10% decode on the 1B shapes (docs/BENCHMARKS.md). EMBER_HUGEPAGES=0
// asks for none (the alignment stays).
#pragma once

#include <cstddef>

namespace ember {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// False when EMBER_HUGEPAGES=0.
bool huge_pages_enabled();

// A read-write private anonymous mapping of `bytes` (rounded up to whole small
// pages: what map_huge_free takes) starting on a 2 MiB boundary, huge pages
// asked for. nullptr when the system has no memory to map.
void* map_huge(size_t bytes);
void map_huge_free(void* p, size_t bytes);

}  // namespace ember
