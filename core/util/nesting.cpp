#include "core/util/nesting.h"

#include <algorithm>

namespace ember {

size_t nesting_depth(const std::string& text) {
  size_t depth = 0, most = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        in_string = false;
      }
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '(' || ch == '[' || ch == '{') {
      most = std::max(most, ++depth);
    } else if ((ch == ')' || ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return most;
}

}  // namespace ember
