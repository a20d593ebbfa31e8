// What the Jinja parser (jinja_parser.cpp) uses of the lexer
// (jinja_lexer.cpp): the tokens, lex(), and the syntax error both raise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/chat/jinja.h"

namespace ember::jinja {

enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Op, Eof };

struct Token {
  Tok type;
  size_t pos = 0;
  std::string value;  // Data text, Name, decoded String, Op text
  int64_t ival = 0;
  double fval = 0;
};

// Throws Error(kBadFormat) naming the line of `pos` in `src`.
[[noreturn]] void syntax_error(const std::string& src, size_t pos, const std::string& msg);

// The tokens of `source`. Newlines are normalised (\r\n, \r and \n all
// become \n) and one trailing newline is dropped; *normalized receives that
// text, which the tokens' positions refer to.
std::vector<Token> lex(const std::string& source, std::string* normalized);

}  // namespace ember::jinja
