// corpus_input.h: what the WikiText and Pile readers share: the input files (checked before any reading), a base
// DocumentReader that walks them in order with byte progress, and the text measures that CorpusStats reports.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/corpus.h"
#include "data/line_reader.h"

namespace hgrn {

struct CorpusFile {
  std::string path;
  int64_t size = 0;  // bytes on disk
};

// Checks that `paths` is not empty and that each path is a readable regular file; throws Error naming the first
// one that is not (and where such files come from). `kind` only words the messages.
std::vector<CorpusFile> check_corpus_files(const std::string& kind, const std::vector<std::string>& paths);

// True if `text` is empty or only ASCII whitespace (space, \t, \n, \v, \f, \r).
bool is_blank(std::string_view text);

// Whitespace-separated words plus one per line, the count that word-level perplexity is reported over (each line
// ends in an <eos>). A last line without '\n' still counts as a line.
int64_t count_words_and_lines(std::string_view text);

// Walks the files in order: the subclass turns one open file into documents; this class opens and closes files,
// counts bytes for progress and keeps the stats of returned documents.
class FileDocumentReader : public DocumentReader {
 public:
  FileDocumentReader(std::vector<CorpusFile> files, CorpusOptions options);

  std::optional<Document> next() final;
  const CorpusStats& stats() const final { return stats_; }
  int64_t bytes_read() const final;
  int64_t total_bytes() const final { return total_bytes_; }

 protected:
  // The next document of `in`, or nullopt when the file is used up (the next call then gets the next file).
  virtual std::optional<Document> next_from_file(LineReader& in) = 0;
  // Called once, after the last file is used up and before next() first returns nullopt.
  virtual void after_all_files() {}

  // Counts `text` as returned and wraps it with its origin.
  Document make_document(std::string text, const LineReader& in, int64_t line);

  const std::vector<CorpusFile>& files() const { return files_; }
  const CorpusOptions& options() const { return options_; }
  CorpusStats& mutable_stats() { return stats_; }

 private:
  std::vector<CorpusFile> files_;
  CorpusOptions options_;
  CorpusStats stats_;
  size_t next_file_ = 0;
  std::unique_ptr<LineReader> current_;
  int64_t bytes_of_finished_files_ = 0;
  int64_t total_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace hgrn
