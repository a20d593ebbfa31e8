#include "core/util/utf8.h"

#include <cstdint>

namespace ember {

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

bool is_valid_utf8(std::string_view s, size_t* bad_offset) {
  const size_t bad = find_invalid_utf8(s);
  if (bad == std::string_view::npos) return true;
  if (bad_offset) *bad_offset = bad;
  return false;
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    uint32_t cp;
    size_t len;
    if (!decode_utf8(s, pos, &cp, &len)) cp = 0xFFFD;
    out.push_back(static_cast<char32_t>(cp));
    pos += len;
  }
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, static_cast<uint32_t>(c));
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

size_t utf8_complete_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size();
  // Walk back over at most 3 continuation bytes to the last lead byte.
  size_t i = n;
  int cont = 0;
  while (i > 0 && cont < 4 && (p[i - 1] & 0xC0) == 0x80) {
    --i;
    ++cont;
  }
  if (i == 0) return n;
  const uint8_t lead = p[i - 1];
  size_t need = lead < 0x80 ? 1 : (lead & 0xE0) == 0xC0 ? 2 : (lead & 0xF0) == 0xE0 ? 3 : (lead & 0xF8) == 0xF0 ? 4 : 1;
  return (static_cast<size_t>(cont) + 1 >= need) ? n : i - 1;
}

}  // namespace ember
