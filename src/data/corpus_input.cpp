// corpus_input.cpp: input file checks, the file-walking base reader and the word count.
#include "data/corpus_input.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace hgrn {

namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

// Where files of this kind come from, appended to "does not exist" messages.
std::string where_to_get(const std::string& kind) {
  if (kind == "wikitext")
    return "; scripts/download_wikitext103.sh downloads WikiText-103 into data/wikitext-103";
  if (kind == "pile") return "; data/README.md says where Pile shards (.jsonl / .jsonl.zst) can be found";
  return "";
}

}  // namespace

std::vector<CorpusFile> check_corpus_files(const std::string& kind, const std::vector<std::string>& paths) {
  HGRN_CHECK(!paths.empty(), "no ", kind, " corpus files given: pass one or more files");
  std::vector<CorpusFile> files;
  for (const std::string& path : paths) {
    namespace fs = std::filesystem;
    std::error_code status_error;
    const fs::file_status status = fs::status(path, status_error);
    HGRN_CHECK(fs::exists(status), "corpus file ", path, " does not exist (", kind, " corpus); check the path",
               where_to_get(kind));
    HGRN_CHECK(!fs::is_directory(status), "corpus path ", path, " is a directory; pass the files inside it (",
               kind == "wikitext" ? "e.g. wiki.train.tokens" : "e.g. its .jsonl.zst shards", ")");
    std::FILE* probe = std::fopen(path.c_str(), "rb");
    HGRN_CHECK(probe != nullptr, "corpus file ", path, " cannot be read: ", std::strerror(errno),
               "; check its permissions");
    std::fclose(probe);
    std::error_code size_error;
    const auto size = fs::file_size(path, size_error);
    files.push_back({path, size_error ? 0 : static_cast<int64_t>(size)});
  }
  return files;
}

bool is_blank(std::string_view text) {
  for (char c : text)
    if (!is_ascii_space(c)) return false;
  return true;
}

int64_t count_words_and_lines(std::string_view text) {
  int64_t words = 0, lines = 0;
  bool in_word = false;
  for (char c : text) {
    if (is_ascii_space(c)) {
      in_word = false;
      if (c == '\n') ++lines;
    } else if (!in_word) {
      in_word = true;
      ++words;
    }
  }
  if (!text.empty() && text.back() != '\n') ++lines;
  return words + lines;
}

FileDocumentReader::FileDocumentReader(std::vector<CorpusFile> files, CorpusOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
  for (const CorpusFile& file : files_) total_bytes_ += file.size;
}

int64_t FileDocumentReader::bytes_read() const {
  return bytes_of_finished_files_ + (current_ ? current_->bytes_consumed() : 0);
}

std::optional<Document> FileDocumentReader::next() {
  while (!finished_) {
    if (!current_) {
      if (next_file_ == files_.size()) {
        finished_ = true;  // before the hook, so that a hook that throws is not run again by a later call
        after_all_files();
        break;
      }
      current_ = std::make_unique<LineReader>(files_[next_file_].path);
    }
    if (std::optional<Document> document = next_from_file(*current_)) return document;
    bytes_of_finished_files_ += files_[next_file_].size;
    current_.reset();
    ++next_file_;
  }
  return std::nullopt;
}

Document FileDocumentReader::make_document(std::string text, const LineReader& in, int64_t line) {
  stats_.documents += 1;
  stats_.bytes += static_cast<int64_t>(text.size());
  stats_.words += count_words_and_lines(text);
  return Document{std::move(text), in.path(), line};
}

}  // namespace hgrn
