// pile_reader.h: the Pile's native files (.jsonl and streaming .jsonl.zst), one JSON object per line,
// {"text": "...", "meta": {"pile_set_name": "..."}}, as a stream of documents, optionally filtered by subset.
#pragma once
#include <memory>
#include <vector>

#include "data/corpus.h"
#include "data/corpus_input.h"

namespace hgrn {

// Per line, in this order: a blank line is ignored (not counted); raw bytes that are not UTF-8 -> Error or, with
// skip_bad, skipped_non_utf8; malformed JSON, a value that is not an object, a missing or non-string "text", a
// non-object "meta" or a non-string "meta.pile_set_name" -> Error or, with skip_bad, skipped_malformed; a record
// of a subset not in options.pile_subsets -> filtered_out (a record without pile_set_name matches no subset);
// empty or whitespace-only "text" -> skipped_empty. After the last file, a requested subset that matched no
// record is an Error listing the subsets seen.
std::unique_ptr<DocumentReader> make_pile_reader(std::vector<CorpusFile> files, const CorpusOptions& options);

}  // namespace hgrn
