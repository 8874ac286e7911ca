// line_reader.cpp: LineReader: compression detection, buffered reading and line splitting.
#include "data/line_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string_view>

namespace hgrn {

namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool starts_with_bytes(const unsigned char* head, size_t head_size, std::initializer_list<unsigned char> magic) {
  if (head_size < magic.size()) return false;
  return std::equal(magic.begin(), magic.end(), head);
}

// The name of a compression format hgrn does not read, recognised by magic number or file name, else "".
std::string foreign_compression(std::string_view path, const unsigned char* head, size_t head_size) {
  if (starts_with_bytes(head, head_size, {0x1F, 0x8B}) || ends_with(path, ".gz")) return "gzip";
  if (starts_with_bytes(head, head_size, {0xFD, '7', 'z', 'X', 'Z', 0x00}) || ends_with(path, ".xz")) return "xz";
  if (starts_with_bytes(head, head_size, {'B', 'Z', 'h'}) || ends_with(path, ".bz2")) return "bzip2";
  return "";
}

}  // namespace

LineReader::LineReader(std::string path)
    : path_(std::move(path)), file_(std::fopen(path_.c_str(), "rb"), &std::fclose), buffer_(kBufferBytes) {
  HGRN_CHECK(file_ != nullptr, "cannot open corpus file ", path_, ": ", std::strerror(errno),
             "; check that it exists and is readable");
  std::error_code size_error;
  file_size_ = static_cast<int64_t>(std::filesystem::file_size(path_, size_error));
  if (size_error) file_size_ = 0;

  unsigned char head[6] = {};
  const size_t head_size = std::fread(head, 1, sizeof head, file_.get());
  std::rewind(file_.get());
  const bool zstd_magic = starts_with_bytes(head, head_size, {0x28, 0xB5, 0x2F, 0xFD});
  if (zstd_magic || ends_with(path_, ".zst") || ends_with(path_, ".zstd")) {
    zstd_ = std::make_unique<ZstdFileStream>(file_.get());
    return;
  }
  const std::string foreign = foreign_compression(path_, head, head_size);
  HGRN_CHECK(foreign.empty(), path_, ": the file is ", foreign, "-compressed, which hgrn does not read; ",
             "decompress it, or recompress it with zstd (e.g. `", foreign == "gzip" ? "zcat" : foreign == "xz" ? "xzcat" : "bzcat",
             " FILE | zstd -o FILE.zst`), since hgrn streams .zst files");
}

int64_t LineReader::bytes_consumed() const {
  return zstd_ ? zstd_->compressed_bytes_consumed() : plain_bytes_read_;
}

size_t LineReader::fill_buffer() {
  if (zstd_) {
    try {
      return zstd_->read(buffer_.data(), buffer_.size());
    } catch (const CompressedStreamError& e) {
      const int64_t line = line_number_ + 1;  // the line being assembled when the stream broke
      HGRN_CHECK(false, path_, ":", line, ": ", e.reason, " (at compressed byte ", e.compressed_offset, " of ",
                 file_size_, ", while reading line ", line, " of the decompressed text); nothing after this point ",
                 "can be read, so --skip-bad cannot skip it either: re-download the file (`zstd -t ", path_,
                 "` tests it)");
    }
  }
  const size_t got = std::fread(buffer_.data(), 1, buffer_.size(), file_.get());
  HGRN_CHECK(got > 0 || !std::ferror(file_.get()), path_, ":", line_number_ + 1, ": read error: ",
             std::strerror(errno), "; check the disk or the file system the corpus is on");
  plain_bytes_read_ += static_cast<int64_t>(got);
  return got;
}

bool LineReader::next_line(std::string& line) {
  line.clear();
  while (!ended_) {
    if (buffer_pos_ == buffer_size_) {
      buffer_size_ = fill_buffer();
      buffer_pos_ = 0;
      if (buffer_size_ == 0) {
        ended_ = true;
        break;
      }
    }
    const char* start = buffer_.data() + buffer_pos_;
    const size_t available = buffer_size_ - buffer_pos_;
    const void* newline = std::memchr(start, '\n', available);
    const size_t take = newline ? static_cast<size_t>(static_cast<const char*>(newline) - start) + 1 : available;
    line.append(start, take);
    buffer_pos_ += take;
    if (newline) {
      ++line_number_;
      return true;
    }
  }
  if (line.empty()) return false;
  ++line_number_;  // the last line, without a final '\n'
  return true;
}

}  // namespace hgrn
