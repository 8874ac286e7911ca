// corpus.cpp: open_corpus, which checks the kind and the files before any reading and picks the reader.
#include "data/corpus.h"

#include "config/suggest.h"
#include "core/check.h"
#include "data/corpus_input.h"
#include "data/pile_reader.h"
#include "data/wikitext_reader.h"

namespace hgrn {

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
  if (kind == "wikitext") return make_wikitext_reader(std::move(files), options);
  return make_pile_reader(std::move(files), options);
}

}  // namespace hgrn
