// utf8.cpp: the strict UTF-8 validator (Unicode Table 3-7, "Well-Formed UTF-8 Byte Sequences").
#include "data/utf8.h"

#include <cstdint>
#include <cstring>

#include "core/check.h"

namespace hgrn {

namespace {

// Length of the well-formed sequence starting at text[i], or 0 if it is ill-formed. The second byte's allowed range
// depends on the lead byte: that is what excludes overlong forms (E0, F0), surrogates (ED) and > U+10FFFF (F4).
size_t well_formed_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = 0;
  uint8_t second_lo = 0x80, second_hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_lo = 0xA0;
    if (lead == 0xED) second_hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_lo = 0x90;
    if (lead == 0xF4) second_hi = 0x8F;
  } else {
    return 0;  // a continuation byte without a lead, C0/C1 (always overlong) or F5..FF (beyond U+10FFFF)
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < second_lo || byte(i + 1) > second_hi) return 0;
  for (size_t k = 2; k < length; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  return length;
}

}  // namespace

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    // Corpus text is mostly ASCII: skip 8 bytes at a time while none has its high bit set.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const size_t length = well_formed_length(text, i);
    if (length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

std::string describe_invalid_utf8(std::string_view text, size_t offset) {
  static const char* const kHex = "0123456789ABCDEF";
  const auto byte = static_cast<uint8_t>(text[offset]);
  return detail::concat("byte 0x", kHex[byte >> 4], kHex[byte & 15], " at column ", offset + 1);
}

}  // namespace hgrn
