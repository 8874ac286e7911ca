// utf8.h: strict UTF-8 validation of corpus text (the Unicode standard's well-formed byte sequences: no overlong
// forms, no surrogates, nothing above U+10FFFF), so bad bytes are caught where they are read, with their position.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace hgrn {

// The byte offset of the first byte that does not start a well-formed UTF-8 sequence, or nullopt if all of
// `text` is well-formed. A sequence cut off by the end of `text` counts as ill-formed.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// "byte 0xC3 at column 17" for the ill-formed sequence at `offset` (column 1-based, in bytes), for messages.
std::string describe_invalid_utf8(std::string_view text, size_t offset);

}  // namespace hgrn
