// How deeply brackets nest in a text: the recursive parsers and printers
// behind JSON, schemas and grammars are held below a depth before they run.
#pragma once

#include <cstddef>
#include <string>

namespace ember {

// The deepest nesting of (, [ and { in `text`, skipping double-quoted
// strings with their escapes.
size_t nesting_depth(const std::string& text);

}  // namespace ember
