// line_reader.h: a corpus file read line by line, plain or zstd-compressed (chosen by the .zst/.zstd name or the
// zstd magic number), with lines of any length, in memory bounded by the longest line.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "data/zstd_stream.h"

namespace hgrn {

class LineReader {
 public:
  // Opens `path`; throws Error if it cannot be opened or is compressed in a format other than zstd.
  explicit LineReader(std::string path);

  // The next line into `line`, with its '\n' (the file's last line may lack one); false at the end of the file.
  // A truncated or corrupt compressed stream throws Error naming the file, the line and the compressed offset.
  bool next_line(std::string& line);

  int64_t line_number() const { return line_number_; }  // 1-based number of the line last returned
  int64_t bytes_consumed() const;                        // of the file on disk (compressed bytes for .zst)
  int64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }
  bool compressed() const { return zstd_ != nullptr; }

 private:
  size_t fill_buffer();

  std::string path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
  std::unique_ptr<ZstdFileStream> zstd_;
  int64_t file_size_ = 0;
  int64_t plain_bytes_read_ = 0;
  std::vector<char> buffer_;
  size_t buffer_size_ = 0;
  size_t buffer_pos_ = 0;
  bool ended_ = false;
  int64_t line_number_ = 0;
};

}  // namespace hgrn
