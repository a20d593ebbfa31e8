#include "core/util/string_table.h"

#include <limits>

#include "core/util/hash.h"

namespace ember {

namespace {

uint64_t slot_hash(std::string_view s) { return mix64(fnv1a(s)); }

}  // namespace

bool StringTable::push_back(std::string_view s) {
  if (s.size() > std::numeric_limits<uint32_t>::max() - text_.size()) return false;
  if (ends_.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max())) return false;
  text_.append(s);
  ends_.push_back(static_cast<uint32_t>(text_.size()));
  return true;
}

int64_t StringTable::build_index(int64_t* earlier) {
  size_t cap = 16;
  while (cap * 3 < ends_.size() * 4) cap <<= 1;  // at most 3/4 full
  slots_.assign(cap, -1);
  const size_t mask = cap - 1;
  for (size_t i = 0; i < ends_.size(); ++i) {
    const std::string_view s = (*this)[i];
    for (size_t k = slot_hash(s) & mask;; k = (k + 1) & mask) {
      const int32_t at = slots_[k];
      if (at < 0) {
        slots_[k] = static_cast<int32_t>(i);
        break;
      }
      if ((*this)[static_cast<size_t>(at)] == s) {
        if (earlier) *earlier = at;
        slots_.clear();
        return static_cast<int64_t>(i);
      }
    }
  }
  return -1;
}

int64_t StringTable::find(std::string_view s) const {
  if (slots_.empty()) return -1;
  const size_t mask = slots_.size() - 1;
  for (size_t k = slot_hash(s) & mask;; k = (k + 1) & mask) {
    const int32_t at = slots_[k];
    if (at < 0) return -1;
    if ((*this)[static_cast<size_t>(at)] == s) return at;
  }
}

void StringTable::shrink_to_fit() {
  text_.shrink_to_fit();
  ends_.shrink_to_fit();
}

size_t StringTable::memory_bytes() const {
  return text_.capacity() + ends_.capacity() * sizeof(uint32_t) + slots_.capacity() * sizeof(int32_t);
}

}  // namespace ember
