// wikitext_reader.h: WikiText-2/103 files (.tokens, .raw, or pytorch/examples' train.txt/valid.txt/test.txt) as a
// stream of articles, each kept verbatim so that the documents of a file concatenate back to the file exactly.
#pragma once
#include <memory>
#include <string_view>
#include <vector>

#include "data/corpus.h"
#include "data/corpus_input.h"

namespace hgrn {

// True for a level-1 heading line " = Title = " (exactly one '=' on each side; " = = Section = = " is not one),
// with or without its '\n'. Surrounding spaces, tabs and a '\r' are ignored.
bool is_wikitext_title_line(std::string_view line);

// An article starts at a title line that follows a blank line (or starts the file) and is followed by a blank line
// (or ends it): WikiText's table rows such as " = Goals ; A = " match the title pattern but not its blank-line
// frame, and with this rule WikiText-2 splits into its 600 / 60 / 60 articles. Lines before the first title
// belong to the first article. Non-UTF-8 bytes: Error "file:line: ..." or, with skip_bad, the article is skipped
// and counted; whitespace-only articles (only possible in a file without titles) are skipped and counted.
std::unique_ptr<DocumentReader> make_wikitext_reader(std::vector<CorpusFile> files, const CorpusOptions& options);

}  // namespace hgrn
