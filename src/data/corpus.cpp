// corpus.cpp: open_corpus, which checks the kind and the files before any reading and picks the reader.
#include "data/corpus.h"

#include <nlohmann/json.hpp>

#include "config/suggest.h"
#include "core/check.h"
#include "data/corpus_input.h"
#include "data/pile_reader.h"
#include "data/wikitext_reader.h"

namespace hgrn {

namespace {

// WikiText is plain text; a file whose first non-blank line is a JSON object is a Pile-style record file, which the
// WikiText reader would otherwise take as one long article of raw JSON.
void require_wikitext_like(const std::vector<CorpusFile>& files) {
  for (const CorpusFile& file : files) {
    LineReader in(file.path);
    std::string line;
    while (in.next_line(line) && is_blank(line)) {
    }
    const size_t start = line.find_first_not_of(" \t");
    HGRN_CHECK(start == std::string::npos || line[start] != '{' || !nlohmann::json::accept(line), "corpus file ",
               file.path, " does not look like WikiText: line ", in.line_number(),
               " is a JSON object, as in a Pile .jsonl shard; pass --corpus pile for JSON-lines input");
  }
}

}  // namespace

std::unique_ptr<DocumentReader> open_corpus(const std::string& kind, const std::vector<std::string>& paths,
                                            const CorpusOptions& options) {
  const std::vector<std::string> kinds = {"wikitext", "pile"};
  if (kind != "wikitext" && kind != "pile") {
    const std::string close = closest_name(kind, kinds);
    HGRN_CHECK(false, "unknown corpus kind \"", kind, "\": expected one of wikitext, pile",
               close.empty() ? "" : detail::concat(" (did you mean \"", close, "\"?)"));
  }
  // Subsets are a Pile notion; silently ignoring them on WikiText would hide a mistaken configuration.
  HGRN_CHECK(kind == "pile" || options.pile_subsets.empty(), "pile subsets were given for a ", kind,
             " corpus; subsets apply only to kind pile: remove them or use kind pile");
  std::vector<CorpusFile> files = check_corpus_files(kind, paths);
  if (kind == "wikitext") {
    require_wikitext_like(files);
    return make_wikitext_reader(std::move(files), options);
  }
  return make_pile_reader(std::move(files), options);
}

}  // namespace hgrn
