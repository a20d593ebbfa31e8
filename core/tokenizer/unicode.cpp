#include "core/tokenizer/unicode.h"

#include "core/util/utf8.h"

#include <algorithm>
#include <array>
#include <memory>
#include <string>

namespace ember::unicode {

namespace detail {
extern const char kUnicodeVersion[];
extern const size_t kNumRuns;
extern const uint32_t kRunStart[];
extern const uint16_t kRunFlags[];
}  // namespace detail

namespace {

uint16_t lookup_runs(uint32_t cp) {
  const uint32_t* begin = detail::kRunStart;
  const uint32_t* end = detail::kRunStart + detail::kNumRuns;
  const uint32_t* it = std::upper_bound(begin, end, cp);  // first start > cp
  return detail::kRunFlags[(it - begin) - 1];             // kRunStart[0] == 0
}

// Direct table for the BMP (128 KiB), built once; the rest uses binary search.
struct BmpTable {
  std::unique_ptr<uint16_t[]> flags{new uint16_t[0x10000]};
  BmpTable() {
    size_t run = 0;
    for (uint32_t cp = 0; cp < 0x10000; ++cp) {
      while (run + 1 < detail::kNumRuns && detail::kRunStart[run + 1] <= cp) ++run;
      flags[cp] = detail::kRunFlags[run];
    }
  }
};

const BmpTable& bmp() {
  static const BmpTable table;
  return table;
}

struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> from_cp{};  // alphabet is within U+0000..U+0143
  std::array<std::string, 256> utf8;
  ByteMap() {
    from_cp.fill(-1);
    auto self = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = self(b) ? static_cast<uint32_t>(b) : 256 + n++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
      append_utf8(utf8[b], to_cp[b]);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

uint16_t flags(uint32_t cp) {
  if (cp < 0x10000) return bmp().flags[cp];
  if (cp > kMaxCodePoint) return cp_flags::kUndefined;
  return lookup_runs(cp);
}

const char* tables_version() { return detail::kUnicodeVersion; }

uint32_t byte_to_cp(uint8_t b) { return byte_map().to_cp[b]; }

int cp_to_byte(uint32_t cp) {
  if (cp >= byte_map().from_cp.size()) return -1;
  return byte_map().from_cp[cp];
}

const std::string& byte_to_utf8(uint8_t b) { return byte_map().utf8[b]; }

}  // namespace ember::unicode
