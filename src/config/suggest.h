// suggest.h: "did you mean ...?" hints: the known name closest to a mistyped one (config keys, enum values,
// subcommands), by edit distance.
#pragma once
#include <string>
#include <vector>

namespace hgrn {

// Levenshtein distance with adjacent transpositions counted as one edit (so "hiddne" is 1 away from "hidden").
int edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word` when it is close enough to be a plausible typo (at most a third of the word's
// length in edits, and at least one edit allowed), else "". Case is ignored; ties go to the earlier candidate.
std::string closest_name(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace hgrn
