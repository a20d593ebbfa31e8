#include "core/util/hash.h"

#include <gtest/gtest.h>

#include <string>

namespace ember {
namespace {

// Session files store Hasher digests (checksum, model fingerprint): these
// values were computed by the hash session files have always used.
TEST(Hash, HasherDigestsAreStable) {
  EXPECT_EQ(Hasher().digest(), 0x9ca066f1a4ab2eeaull);
  const std::string s = "The quick brown fox jumps over the lazy dog";
  Hasher h(0x73657373696f6e31ull);
  h.value(uint32_t{2});
  h.value(uint64_t{0x1234567890abcdefull});
  h.bytes(s.data(), s.size());
  h.bytes(s.data(), 5);
  EXPECT_EQ(h.digest(), 0x4d0f0e481b8a37e9ull);
}

TEST(Hash, Fnv1aMatchesTheReference) {
  EXPECT_EQ(fnv1a(""), kFnv1aOffset);
  EXPECT_EQ(fnv1a("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a("foobar"), 0x85944171f73967e8ull);
  // fnv1a_u32: the four bytes low first, as fnv1a over them.
  const unsigned char le[4] = {0x78, 0x56, 0x34, 0x12};
  EXPECT_EQ(fnv1a_u32(0x12345678u, kFnv1aOffset), fnv1a(le, 4));
}

TEST(Hash, Mix64) {
  EXPECT_EQ(mix64(0), 0u);
  EXPECT_NE(mix64(1), mix64(2));
}

}  // namespace
}  // namespace ember
