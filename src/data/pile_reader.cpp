// pile_reader.cpp: Pile jsonl records -> documents, with per-record checks, the subset filter and its final check.
#include "data/pile_reader.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "config/suggest.h"
#include "data/utf8.h"

namespace hgrn {

namespace {

using nlohmann::json;

constexpr const char* kSkipAdvice = "; pass --skip-bad to skip such records and count them";
constexpr const char* kRecordShape = R"({"text": "...", "meta": {"pile_set_name": "..."}})";

// nlohmann's parse_error::what() reads "[json.exception.parse_error.101] parse error at line 1, column 7: syntax
// error ..."; the line is always 1 here (one record per line), so keep the column and the reason.
std::string describe_parse_error(const json::parse_error& error) {
  std::string message = error.what();
  const size_t column = message.find("column ");
  if (column != std::string::npos) return message.substr(column);
  const size_t bracket = message.find("] ");
  return bracket == std::string::npos ? message : message.substr(bracket + 2);
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", \"" : "\"") + names[i] + "\"";
  return out;
}

class PileReader final : public FileDocumentReader {
 public:
  PileReader(std::vector<CorpusFile> files, const CorpusOptions& options)
      : FileDocumentReader(std::move(files), options),
        requested_(options.pile_subsets.begin(), options.pile_subsets.end()) {}

 protected:
  std::optional<Document> next_from_file(LineReader& in) override;
  void after_all_files() override;

 private:
  // Throws the record's problem as "file:line: ..." unless skip_bad, else counts it in `counter`.
  void reject(const LineReader& in, int64_t& counter, const std::string& problem, const std::string& advice);
  // The record's document, or nullopt if it is skipped, filtered out or (with skip_bad) bad.
  std::optional<Document> take_record(const LineReader& in);

  std::set<std::string> requested_;
  std::map<std::string, int64_t> matched_;         // requested subset -> records that matched it
  std::map<std::string, int64_t> subsets_seen_;    // every pile_set_name met, for the message when one matched none
  int64_t records_without_subset_ = 0;
  std::string line_;
};

void PileReader::reject(const LineReader& in, int64_t& counter, const std::string& problem,
                        const std::string& advice) {
  HGRN_CHECK(options().skip_bad, in.path(), ":", in.line_number(), ": ", problem, advice, kSkipAdvice);
  counter += 1;
}

std::optional<Document> PileReader::take_record(const LineReader& in) {
  CorpusStats& stats = mutable_stats();
  if (const auto bad = first_invalid_utf8(line_)) {
    reject(in, stats.skipped_non_utf8, "invalid UTF-8 (" + describe_invalid_utf8(line_, *bad) + ")",
           "; Pile files are UTF-8 JSON (other characters must be \\u escapes)");
    return std::nullopt;
  }
  const std::string expected = std::string("; each line must be one JSON object like ") + kRecordShape;
  json record;
  try {
    record = json::parse(line_);
  } catch (const json::parse_error& error) {
    reject(in, stats.skipped_malformed, "malformed JSON at " + describe_parse_error(error), expected);
    return std::nullopt;
  }
  if (!record.is_object()) {
    reject(in, stats.skipped_malformed, std::string("expected a JSON object, got ") + record.type_name(), expected);
    return std::nullopt;
  }
  const auto text = record.find("text");
  if (text == record.end()) {
    reject(in, stats.skipped_malformed, "the record has no \"text\" field", expected);
    return std::nullopt;
  }
  if (!text->is_string()) {
    reject(in, stats.skipped_malformed, std::string("\"text\" is ") + text->type_name() + ", expected a string",
           expected);
    return std::nullopt;
  }
  std::optional<std::string> subset;
  if (const auto meta = record.find("meta"); meta != record.end()) {
    if (!meta->is_object()) {
      reject(in, stats.skipped_malformed, std::string("\"meta\" is ") + meta->type_name() + ", expected an object",
             expected);
      return std::nullopt;
    }
    if (const auto name = meta->find("pile_set_name"); name != meta->end()) {
      if (!name->is_string()) {
        reject(in, stats.skipped_malformed,
               std::string("\"meta.pile_set_name\" is ") + name->type_name() + ", expected a string", expected);
        return std::nullopt;
      }
      subset = name->get<std::string>();
    }
  }
  if (subset)
    subsets_seen_[*subset] += 1;
  else
    records_without_subset_ += 1;
  if (!requested_.empty()) {
    if (!subset || !requested_.count(*subset)) {
      stats.filtered_out += 1;
      return std::nullopt;
    }
    matched_[*subset] += 1;
  }
  std::string& content = text->get_ref<std::string&>();
  if (is_blank(content)) {
    stats.skipped_empty += 1;
    return std::nullopt;
  }
  return make_document(std::move(content), in, in.line_number());
}

std::optional<Document> PileReader::next_from_file(LineReader& in) {
  while (in.next_line(line_)) {
    if (is_blank(line_)) continue;  // blank lines separate nothing in jsonl; they are not records
    if (std::optional<Document> document = take_record(in)) return document;
  }
  return std::nullopt;
}

void PileReader::after_all_files() {
  std::vector<std::string> unmatched;  // in the order they were requested, each once
  for (const std::string& name : options().pile_subsets)
    if (!matched_.count(name) && std::find(unmatched.begin(), unmatched.end(), name) == unmatched.end())
      unmatched.push_back(name);
  if (unmatched.empty()) return;

  std::vector<std::string> seen_names;
  std::string seen;
  for (const auto& [name, count] : subsets_seen_) {
    seen += detail::concat(seen.empty() ? "" : ", ", "\"", name, "\" (", count, ")");
    seen_names.push_back(name);
  }
  if (seen.empty()) seen = "none (no record had meta.pile_set_name)";
  if (records_without_subset_ > 0 && !seen_names.empty())
    seen += detail::concat("; ", records_without_subset_, " record(s) had no meta.pile_set_name");
  std::string hints;
  for (const std::string& name : unmatched)
    if (const std::string close = closest_name(name, seen_names); !close.empty())
      hints += detail::concat(hints.empty() ? " (did you mean " : ", ", "\"", close, "\" for \"", name, "\"");
  if (!hints.empty()) hints += "?)";
  std::string file_list;
  for (const CorpusFile& file : files()) file_list += (file_list.empty() ? "" : ", ") + file.path;
  HGRN_CHECK(false, "pile subset", unmatched.size() > 1 ? "s " : " ", quoted_list(unmatched), " matched no record in ",
             files().size(), " file(s) (", file_list, "); the subsets seen were: ", seen,
             "; names are case-sensitive and must equal meta.pile_set_name exactly", hints);
}

}  // namespace

std::unique_ptr<DocumentReader> make_pile_reader(std::vector<CorpusFile> files, const CorpusOptions& options) {
  return std::make_unique<PileReader>(std::move(files), options);
}

}  // namespace hgrn
