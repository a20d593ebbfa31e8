#include "core/util/hash.h"

#include <cstring>

namespace ember {

void Hasher::bytes(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  len_ += n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    word(w);
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < n; ++k) tail |= static_cast<uint64_t>(p[i + k]) << (8 * k);
  if (i < n) word(tail ^ 0xA5A5A5A5A5A5A5A5ull);
}

uint64_t Hasher::digest() const {
  uint64_t h = mix64(h_ ^ len_);
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

void Hasher::word(uint64_t k) {
  k *= 0x87c37b91114253d5ull;
  k = (k << 31) | (k >> 33);
  k *= 0x4cf5ad432745937full;
  h_ ^= k;
  h_ = ((h_ << 27) | (h_ >> 37)) * 5 + 0x52dce729;
}

}  // namespace ember
