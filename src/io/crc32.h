// crc32.h: CRC-32 (IEEE 802.3 / zlib polynomial, reflected 0xEDB88320), the checksum a checkpoint stores for every
// dataset so that a flipped bit on disk is caught at load time instead of silently corrupting a resumed run.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hgrn {

// The CRC-32 of `size` bytes at `data`, continuing from `previous` (the value returned for the bytes before; 0 to
// start). Matches zlib's crc32() and Python's zlib.crc32(), so a checkpoint's checksums can be checked with either:
// crc32("123456789") == 0xCBF43926.
uint32_t crc32(const void* data, size_t size, uint32_t previous = 0);

}  // namespace hgrn
