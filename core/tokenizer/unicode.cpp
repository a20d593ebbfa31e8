#include "core/tokenizer/unicode.h"

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
  return detail::kRunFlags[(it - begin) - 1];              // kRunStart[0] == 0
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

bool decode_utf8(std::string_view s, size_t pos, uint32_t* cp, size_t* len, bool* incomplete) {
  if (incomplete) *incomplete = false;
  const size_t n = s.size();
  const uint8_t b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) {
    *cp = b0;
    *len = 1;
    return true;
  }
  size_t need;
  uint32_t c;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    *len = 1;  // continuation byte, C0, C1 or F5..FF
    return false;
  }
  for (size_t i = 1; i <= need; ++i) {
    if (pos + i >= n) {
      *len = i;
      if (incomplete) *incomplete = true;
      return false;
    }
    const uint8_t b = static_cast<uint8_t>(s[pos + i]);
    const uint8_t l = (i == 1) ? lo : 0x80;
    const uint8_t h = (i == 1) ? hi : 0xBF;
    if (b < l || b > h) {
      *len = i;
      return false;
    }
    c = (c << 6) | (b & 0x3F);
  }
  *cp = c;
  *len = need + 1;
  return true;
}

size_t find_invalid_utf8(std::string_view s) {
  size_t pos = 0;
  const size_t n = s.size();
  while (pos < n) {
    // Fast path over ASCII.
    while (pos < n && static_cast<uint8_t>(s[pos]) < 0x80) ++pos;
    if (pos >= n) break;
    uint32_t cp;
    size_t len;
    if (!decode_utf8(s, pos, &cp, &len)) return pos;
    pos += len;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t byte_to_cp(uint8_t b) { return byte_map().to_cp[b]; }

int cp_to_byte(uint32_t cp) {
  if (cp >= byte_map().from_cp.size()) return -1;
  return byte_map().from_cp[cp];
}

const std::string& byte_to_utf8(uint8_t b) { return byte_map().utf8[b]; }

}  // namespace ember::unicode
