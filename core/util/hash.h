// Hashes the core shares: a streamed 64-bit hash for checksums and
// fingerprints, and FNV-1a for short keys (prefix-cache blocks, names).
//
// Their values are stored: the session file's checksum and model fingerprint
// (core/engine/session_file.cpp) are Hasher digests, so a change to Hasher
// makes every saved session unloadable. Keep them bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ember {

// A 64-bit hash (murmur3-style mixing over 8-byte words), streamed. Each
// bytes() call pads its own tail, so the digest depends on how the input was
// cut into calls: feed the same pieces to reproduce a digest.
class Hasher {
 public:
  explicit Hasher(uint64_t seed = 0x9E3779B97F4A7C15ull) : h_(seed) {}
  void bytes(const void* data, size_t n);
  template <typename T>
  void value(const T& v) {
    bytes(&v, sizeof v);
  }
  uint64_t digest() const;

 private:
  void word(uint64_t k);
  uint64_t h_;
  uint64_t len_ = 0;
};

// 64-bit FNV-1a.
inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnv1aPrime = 0x100000001b3ull;

// Continues FNV-1a state `h` over n bytes.
inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnv1aPrime;
  return h;
}
inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aOffset) { return fnv1a(s.data(), s.size(), h); }

// Continues FNV-1a state `h` over the four bytes of v, low byte first (the
// same on every host).
inline uint64_t fnv1a_u32(uint32_t v, uint64_t h) {
  for (int i = 0; i < 4; ++i) h = (h ^ ((v >> (8 * i)) & 0xFF)) * kFnv1aPrime;
  return h;
}

// Spreads a key's bits over all 64 (half of murmur3's fmix64): for hash
// tables indexed by the low bits.
inline uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

}  // namespace ember
