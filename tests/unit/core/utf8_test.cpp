#include "core/util/utf8.h"

#include <gtest/gtest.h>

namespace ember {
namespace {

TEST(Utf8, Validates) {
  EXPECT_TRUE(is_valid_utf8("hello"));
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9llo \xE4\xB8\xAD \xF0\x9F\x98\x80"));
  size_t bad = 0;
  EXPECT_FALSE(is_valid_utf8("ab\xFF", &bad));
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE4\xB8"));          // truncated
}

TEST(Utf8, CompletePrefix) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8\xAD"), 5u);
  EXPECT_EQ(utf8_complete_prefix("\xF0\x9F\x98"), 0u);
}

}  // namespace
}  // namespace ember
