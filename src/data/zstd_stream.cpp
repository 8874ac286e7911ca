// zstd_stream.cpp: ZstdFileStream on top of libzstd's ZSTD_decompressStream.
#include "data/zstd_stream.h"

#include <zstd.h>

namespace hgrn {

ZstdFileStream::ZstdFileStream(std::FILE* file)
    : file_(file), context_(ZSTD_createDCtx()), in_buffer_(ZSTD_DStreamInSize()) {
  HGRN_CHECK(context_ != nullptr, "zstd: could not allocate a decompression context (out of memory?)");
  // Shards written with `zstd --long` need windows up to 2 GiB; the decoder allocates only what a frame declares,
  // so raising the limit costs nothing for ordinary frames (the default refuses windows above 128 MiB).
  ZSTD_DCtx_setParameter(context_, ZSTD_d_windowLogMax, 31);
}

ZstdFileStream::~ZstdFileStream() { ZSTD_freeDCtx(context_); }

void ZstdFileStream::refill() {
  consumed_before_buffer_ += static_cast<int64_t>(in_size_);
  in_size_ = std::fread(in_buffer_.data(), 1, in_buffer_.size(), file_);
  in_pos_ = 0;
  if (in_size_ == 0) {
    if (std::ferror(file_)) throw CompressedStreamError("read error on the compressed file", consumed_before_buffer_);
    file_ended_ = true;
  }
}

size_t ZstdFileStream::read(char* out, size_t capacity) {
  ZSTD_outBuffer output{out, capacity, 0};
  while (output.pos == 0) {
    if (in_pos_ == in_size_ && !file_ended_) refill();
    const bool input_exhausted = file_ended_ && in_pos_ == in_size_;
    if (input_exhausted && !inside_frame_) {
      // A file of zero bytes is no zstd stream (even empty content compresses to a frame header): most likely a
      // download that never started, which should not pass for an empty corpus.
      if (compressed_bytes_consumed() == 0)
        throw CompressedStreamError("the file is empty (0 bytes), which is not a zstd stream", 0);
      return 0;
    }
    ZSTD_inBuffer input{in_buffer_.data(), in_size_, in_pos_};
    const size_t result = ZSTD_decompressStream(context_, &output, &input);
    in_pos_ = input.pos;
    if (ZSTD_isError(result))
      throw CompressedStreamError(detail::concat("corrupt zstd data: ", ZSTD_getErrorName(result)),
                                  compressed_bytes_consumed());
    // 0 means the frame is complete and fully flushed; anything else means the decoder is inside a frame.
    inside_frame_ = result != 0;
    if (input_exhausted && output.pos == 0 && inside_frame_)
      throw CompressedStreamError("truncated zstd stream: the file ends inside a frame", compressed_bytes_consumed());
  }
  return output.pos;
}

}  // namespace hgrn
