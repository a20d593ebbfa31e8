// UTF-8: the one library the whole core uses (tokenizer, chat templates,
// the C ABI's input checks, streamed text). Strict RFC 3629: no overlong
// forms, no surrogates, nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ember {

// Decodes one UTF-8 sequence at s[pos]. On success stores the code point and
// its byte length and returns true. On failure returns false and stores in
// *len the length of the maximal ill-formed subpart (>= 1): the number of bytes
// a decoder replaces with one U+FFFD ("substitution of maximal subparts").
// *incomplete is set when the failure is only that the input ends inside an
// otherwise valid sequence.
bool decode_utf8(std::string_view s, size_t pos, uint32_t* cp, size_t* len, bool* incomplete = nullptr);

// Byte offset of the first invalid UTF-8 sequence, or npos when s is valid.
size_t find_invalid_utf8(std::string_view s);

// True when `s` is valid UTF-8; otherwise false with *bad_offset (if given)
// set to the first offending byte.
bool is_valid_utf8(std::string_view s, size_t* bad_offset = nullptr);

// Appends the UTF-8 encoding of cp (cp must be <= U+10FFFF).
void append_utf8(std::string& out, uint32_t cp);

// Length of the longest prefix of `s` that ends on a character boundary,
// assuming `s` is valid UTF-8 apart from a possibly incomplete last character.
size_t utf8_complete_prefix(std::string_view s);

// Code points of `s`; an invalid sequence becomes one U+FFFD per maximal
// ill-formed subpart.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
// Number of code points of valid UTF-8 `s`.
size_t utf8_length(std::string_view s);

}  // namespace ember
