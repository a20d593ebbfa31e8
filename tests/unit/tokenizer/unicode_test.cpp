#include "core/tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace ember::unicode {
namespace {

using namespace cp_flags;

std::string u8(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

TEST(Unicode, TablesVersion) { EXPECT_STREQ(tables_version(), "15.1.0"); }

TEST(Unicode, Categories) {
  EXPECT_TRUE(flags('a') & kLetter);
  EXPECT_TRUE(flags('Z') & kLetter);
  EXPECT_TRUE(flags(0x00E9) & kLetter);  // é
  EXPECT_TRUE(flags(0x4E2D) & kLetter);  // 中 (Lo)
  EXPECT_TRUE(flags(0x02B0) & kLetter);  // ʰ (Lm)
  EXPECT_TRUE(flags('7') & kNumber);
  EXPECT_TRUE(flags(0x00B2) & kNumber);  // ² (No)
  EXPECT_TRUE(flags(0x216B) & kNumber);  // Ⅻ (Nl)
  EXPECT_TRUE(flags(0x0663) & kNumber);  // Arabic-Indic 3 (Nd)
  EXPECT_TRUE(flags(0x0301) & kMark);    // combining acute
  EXPECT_TRUE(flags('!') & kPunctuation);
  EXPECT_TRUE(flags('$') & kSymbol);
  EXPECT_TRUE(flags(0x1F600) & kSymbol);  // 😀
  EXPECT_TRUE(flags(0x200D) & kControl);  // ZWJ (Cf)
  EXPECT_TRUE(flags(0x0378) & kUndefined);
  EXPECT_TRUE(flags(0x110000) & kUndefined);
  // Unicode 15.0 / 15.1 additions, as in llama.cpp's tables.
  EXPECT_TRUE(flags(0x1FAE8) & kSymbol);    // 🫨 (15.0)
  EXPECT_TRUE(flags(0x31350) & kLetter);    // CJK Ext H (15.0)
  EXPECT_TRUE(flags(0x2EBF0) & kLetter);    // CJK Ext I (15.1)
  EXPECT_TRUE(flags(0x1C89) & kUndefined);  // assigned only in 16.0
}

TEST(Unicode, WhitespaceIsTheWhiteSpaceProperty) {
  const std::set<uint32_t> ws = {0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,   0xA0,   0x1680,
                                 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
                                 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
  for (uint32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    ASSERT_EQ(is_whitespace(cp), ws.count(cp) > 0) << std::hex << cp;
  }
  EXPECT_FALSE(is_whitespace(0x1C));  // Python's isspace() says yes; White_Space says no
  EXPECT_FALSE(is_whitespace(0x200B));
}

TEST(Unicode, DecodeValid) {
  for (uint32_t cp :
       {0x0u, 0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFDu, 0xFFFFu, 0x10000u, 0x1F600u, 0x10FFFFu}) {
    const std::string s = u8(cp);
    uint32_t got = 0;
    size_t len = 0;
    ASSERT_TRUE(decode_utf8(s, 0, &got, &len)) << std::hex << cp;
    EXPECT_EQ(got, cp);
    EXPECT_EQ(len, s.size());
    EXPECT_EQ(find_invalid_utf8(s), std::string::npos);
  }
}

TEST(Unicode, DecodeRejectsIllFormed) {
  struct Case {
    std::string bytes;
    size_t subpart;  // length of the maximal ill-formed subpart at 0
    bool incomplete;
  };
  const Case cases[] = {
      {"\x80", 1, false},  // lone continuation
      {"\xBF", 1, false},
      {"\xC0\xAF", 1, false},  // overlong (C0/C1 never valid)
      {"\xC1\xBF", 1, false},
      {"\xE0\x80\xAF", 1, false},      // overlong 3-byte
      {"\xED\xA0\x80", 1, false},      // surrogate D800
      {"\xF0\x8F\xBF\xBF", 1, false},  // overlong 4-byte
      {"\xF4\x90\x80\x80", 1, false},  // > U+10FFFF
      {"\xF5\x80\x80\x80", 1, false},
      {"\xFF", 1, false},
      {"\xC3", 1, true},  // truncated
      {"\xE2\x82", 2, true},
      {"\xF0\x9F\x98", 3, true},
      {"\xE2\x82x", 2, false},  // interrupted
      {"\xF0\x9F\x98x", 3, false},
      {"\xC3\xC3", 1, false},
  };
  for (const Case& c : cases) {
    uint32_t cp;
    size_t len = 0;
    bool incomplete = false;
    EXPECT_FALSE(decode_utf8(c.bytes, 0, &cp, &len, &incomplete)) << testing::PrintToString(c.bytes);
    EXPECT_EQ(len, c.subpart) << testing::PrintToString(c.bytes);
    EXPECT_EQ(incomplete, c.incomplete) << testing::PrintToString(c.bytes);
  }
  EXPECT_EQ(find_invalid_utf8("abc\xC3\xA9\xFF"), 5u);
  EXPECT_EQ(find_invalid_utf8("ok\xE2\x82"), 2u);
  EXPECT_EQ(find_invalid_utf8(""), std::string::npos);
}

TEST(Unicode, ByteAlphabetIsABijection) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = byte_to_cp(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second);
    EXPECT_EQ(cp_to_byte(cp), b);
    EXPECT_EQ(byte_to_utf8(static_cast<uint8_t>(b)), u8(cp));
  }
  EXPECT_EQ(byte_to_cp(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_cp('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_cp('a'), static_cast<uint32_t>('a'));
  EXPECT_EQ(byte_to_cp(0xAD), 0x143u);
  EXPECT_EQ(cp_to_byte(0x144), -1);
  EXPECT_EQ(cp_to_byte(0x4E2D), -1);
}

}  // namespace
}  // namespace ember::unicode
