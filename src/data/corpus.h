// corpus.h: reading the corpora hgrn trains on, as a stream of documents, from their native files:
// WikiText-2/103 (.tokens and .raw, split into articles at their " = Title = " headings) and the Pile (.jsonl and
// streaming .jsonl.zst; records {"text": ..., "meta": {"pile_set_name": ...}}, optionally filtered by subset).
// Bad input (missing file, truncated or corrupt .zst, malformed JSON line, non-UTF-8 bytes, empty documents) either
// fails with the file and line, or, with skip_bad, is skipped and counted; nothing vanishes silently.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hgrn {

struct Document {
  std::string text;
  std::string file;  // where it came from, for messages
  int64_t line = 0;  // 1-based line where it starts
};

struct CorpusOptions {
  bool skip_bad = false;                  // skip (and count) bad records instead of failing
  std::vector<std::string> pile_subsets;  // keep only these pile_set_name values (empty: all)
};

struct CorpusStats {
  int64_t documents = 0;         // returned
  int64_t bytes = 0;             // of returned documents' text
  int64_t words = 0;             // whitespace-separated words of returned text, plus one per line (WikiText's <eos>)
  int64_t skipped_malformed = 0; // bad JSON / missing "text" (only with skip_bad)
  int64_t skipped_non_utf8 = 0;  // only with skip_bad
  int64_t skipped_empty = 0;     // empty or whitespace-only documents (always skipped, always counted)
  int64_t filtered_out = 0;      // Pile records of other subsets
};

class DocumentReader {
 public:
  virtual ~DocumentReader() = default;
  virtual std::optional<Document> next() = 0;  // nullopt at the end of the last file
  virtual const CorpusStats& stats() const = 0;
  virtual int64_t bytes_read() const = 0;      // of the input files (compressed bytes for .zst), for progress
  virtual int64_t total_bytes() const = 0;     // of all input files
};

// kind: "wikitext" or "pile". paths: one or more files read in order.
std::unique_ptr<DocumentReader> open_corpus(const std::string& kind, const std::vector<std::string>& paths,
                                            const CorpusOptions& options);

}  // namespace hgrn
