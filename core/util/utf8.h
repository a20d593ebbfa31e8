// UTF-8 validation (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
#pragma once

#include <cstddef>
#include <string_view>

namespace ember {

// True when `s` is valid UTF-8; otherwise false with *bad_offset (if given)
// set to the first offending byte.
bool is_valid_utf8(std::string_view s, size_t* bad_offset = nullptr);

// Length of the longest prefix of `s` that ends on a character boundary,
// assuming `s` is valid UTF-8 apart from a possibly incomplete last character.
size_t utf8_complete_prefix(std::string_view s);

}  // namespace ember
