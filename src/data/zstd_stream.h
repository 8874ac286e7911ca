// zstd_stream.h: streaming decompression of a .zst file (any number of frames, as `zstd` and the Pile's .jsonl.zst
// shards write them) in constant memory, telling a clean end from a truncated or corrupt stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"

struct ZSTD_DCtx_s;

namespace hgrn {

// A truncated or corrupt compressed stream. Carries the reason and the compressed byte offset separately so that
// the line reader, which knows the line number reached, can compose the message for the user.
struct CompressedStreamError : Error {
  CompressedStreamError(std::string reason, int64_t compressed_offset)
      : Error(reason), reason(std::move(reason)), compressed_offset(compressed_offset) {}
  std::string reason;
  int64_t compressed_offset;
};

class ZstdFileStream {
 public:
  // Reads compressed bytes from `file` (not owned; it must outlive this stream).
  explicit ZstdFileStream(std::FILE* file);
  ~ZstdFileStream();
  ZstdFileStream(const ZstdFileStream&) = delete;
  ZstdFileStream& operator=(const ZstdFileStream&) = delete;

  // Decompresses up to `capacity` bytes into `out`; returns how many (at least 1), or 0 once the file ends exactly
  // at the end of a frame. Throws CompressedStreamError if the file ends inside a frame, is empty, or is corrupt.
  size_t read(char* out, size_t capacity);

  // Compressed bytes taken from the file so far (for progress and for the offset in messages).
  int64_t compressed_bytes_consumed() const { return consumed_before_buffer_ + static_cast<int64_t>(in_pos_); }

 private:
  void refill();

  std::FILE* file_;
  ZSTD_DCtx_s* context_;
  std::vector<char> in_buffer_;
  size_t in_size_ = 0;  // valid bytes in in_buffer_
  size_t in_pos_ = 0;   // bytes of in_buffer_ already given to the decoder
  int64_t consumed_before_buffer_ = 0;
  bool file_ended_ = false;
  bool inside_frame_ = false;  // the decoder has started a frame it has not finished (and flushed)
};

}  // namespace hgrn
