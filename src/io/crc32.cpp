// crc32.cpp: a byte-at-a-time table-driven CRC-32 with the reflected IEEE polynomial 0xEDB88320.
// Checkpoints are small next to the training step that writes them, so the simple 1 KiB table is fast enough.
#include "io/crc32.h"

#include <array>

namespace hgrn {
namespace {

// table[b] is the CRC register after shifting the byte b through eight rounds of polynomial division.
constexpr std::array<uint32_t, 256> make_crc32_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t reg = byte;
    for (int bit = 0; bit < 8; ++bit) reg = (reg & 1u) ? (reg >> 1) ^ 0xEDB88320u : reg >> 1;
    table[byte] = reg;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32Table = make_crc32_table();

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t previous) {
  // The register is kept inverted between calls (the standard pre- and post-conditioning), which is what lets a
  // caller continue a checksum across several buffers.
  uint32_t reg = ~previous;
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) reg = kCrc32Table[(reg ^ bytes[i]) & 0xFFu] ^ (reg >> 8);
  return ~reg;
}

}  // namespace hgrn
