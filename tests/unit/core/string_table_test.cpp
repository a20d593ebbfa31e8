#include "core/util/string_table.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace ember {
namespace {

TEST(StringTable, KeepsEveryStringAndFindsItsPosition) {
  // Empty strings, embedded NULs, bytes >= 0x80, prefixes of each other, long ones.
  std::vector<std::string> in = {"", "a", "ab", std::string("a\0b", 3), "\xE2\x96\x81the", std::string(1000, 'x'), "b"};
  std::mt19937 rng(7);
  for (int i = 0; i < 5000; ++i) {
    std::string s(rng() % 24, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    in.push_back(s);
  }
  StringTable t;
  std::unordered_map<std::string, int64_t> first;
  std::vector<std::string> kept;
  for (const std::string& s : in)
    if (first.emplace(s, static_cast<int64_t>(kept.size())).second) {
      ASSERT_TRUE(t.push_back(s));
      kept.push_back(s);
    }
  EXPECT_EQ(t.find("a"), -1);  // no index yet
  EXPECT_EQ(t.build_index(), -1);
  t.shrink_to_fit();
  ASSERT_EQ(t.size(), kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(t[i], kept[i]);
    EXPECT_EQ(t.find(kept[i]), static_cast<int64_t>(i));
  }
  EXPECT_EQ(t.find("not in the table"), -1);
  EXPECT_EQ(t.find(std::string("a\0", 2)), -1);
  EXPECT_GT(t.memory_bytes(), 0u);
}

TEST(StringTable, ReportsTheFirstDuplicate) {
  StringTable t;
  for (const char* s : {"x", "y", "z", "y", "x"}) ASSERT_TRUE(t.push_back(s));
  int64_t earlier = -1;
  EXPECT_EQ(t.build_index(&earlier), 3);
  EXPECT_EQ(earlier, 1);
  EXPECT_EQ(t.find("x"), -1);  // the index is left empty
}

TEST(StringTable, EmptyTable) {
  StringTable t;
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.build_index(), -1);
  EXPECT_EQ(t.find(""), -1);
}

}  // namespace
}  // namespace ember
