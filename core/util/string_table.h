// Many short strings addressed by position, stored back to back in one
// buffer, with an optional text -> position index: a vocabulary's texts
// without a 32-byte std::string header, a heap block and a hash-map node
// each. Gemma 3's 262,144 tokens take ~8 MB this way instead of ~30 MB.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ember {

class StringTable {
 public:
  // Appends s. False (nothing appended) when the table's text would pass
  // 4 GiB or its count 2^31 - 1: positions and offsets are 32-bit.
  bool push_back(std::string_view s);

  size_t size() const { return ends_.size(); }
  std::string_view operator[](size_t i) const {
    const uint32_t b = i == 0 ? 0 : ends_[i - 1];
    return {text_.data() + b, static_cast<size_t>(ends_[i] - b)};
  }

  // Indexes every string pushed so far (for find). Returns -1, or the
  // position of the first string equal to an earlier one (then *earlier is
  // that one's position and the index is left empty).
  int64_t build_index(int64_t* earlier = nullptr);
  // Position of the string equal to s, -1 if none (or no index built).
  int64_t find(std::string_view s) const;

  // Drops spare capacity (once the table is complete).
  void shrink_to_fit();
  // Bytes held, for memory accounting.
  size_t memory_bytes() const;

 private:
  std::string text_;
  std::vector<uint32_t> ends_;  // ends_[i]: one past string i's last byte in text_
  std::vector<int32_t> slots_;  // open addressing: positions, -1 empty
};

}  // namespace ember
