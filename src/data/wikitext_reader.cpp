// wikitext_reader.cpp: splitting WikiText files into articles at their title lines, with one line of lookahead.
#include "data/wikitext_reader.h"

#include "data/utf8.h"

namespace hgrn {

namespace {

std::string_view trim(std::string_view text) {
  const auto is_trimmed = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!text.empty() && is_trimmed(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_trimmed(text.back())) text.remove_suffix(1);
  return text;
}

class WikiTextReader final : public FileDocumentReader {
 public:
  using FileDocumentReader::FileDocumentReader;

 protected:
  std::optional<Document> next_from_file(LineReader& in) override;

 private:
  struct Article {
    std::string text;
    int64_t first_line = 0;
    bool has_content = false;  // a non-blank line; blank lines before a title stay with the article after it
    bool has_invalid_utf8 = false;
  };

  void start_file(LineReader& in);
  void advance(LineReader& in);
  void append_current_line(Article& article, const LineReader& in);
  // The finished article as a document, or nullopt if it is skipped (and counted).
  std::optional<Document> finish(Article& article, const LineReader& in);

  bool in_file_ = false;
  // A window of two lines: the title rule needs to see the line after the current one.
  std::string current_, next_;
  bool have_current_ = false, have_next_ = false;
  int64_t current_line_ = 0;
  bool previous_was_blank_ = true;  // the start of a file counts as a blank line before the first
};

void WikiTextReader::start_file(LineReader& in) {
  in_file_ = true;
  previous_was_blank_ = true;
  have_current_ = in.next_line(current_);
  current_line_ = 1;
  have_next_ = have_current_ && in.next_line(next_);
}

void WikiTextReader::advance(LineReader& in) {
  previous_was_blank_ = is_blank(current_);
  current_.swap(next_);
  have_current_ = have_next_;
  ++current_line_;
  have_next_ = have_current_ && in.next_line(next_);
}

void WikiTextReader::append_current_line(Article& article, const LineReader& in) {
  if (article.text.empty()) article.first_line = current_line_;
  if (!article.has_invalid_utf8) {
    if (const auto bad = first_invalid_utf8(current_)) {
      HGRN_CHECK(options().skip_bad, in.path(), ":", current_line_, ": invalid UTF-8 (",
                 describe_invalid_utf8(current_, *bad), ") in the article that starts at line ", article.first_line,
                 "; WikiText files are UTF-8: pass --skip-bad to skip such articles and count them");
      article.has_invalid_utf8 = true;
    }
  }
  article.text += current_;
  article.has_content = article.has_content || !is_blank(current_);
}

std::optional<Document> WikiTextReader::finish(Article& article, const LineReader& in) {
  std::optional<Document> document;
  if (article.has_invalid_utf8)
    mutable_stats().skipped_non_utf8 += 1;
  else if (!article.has_content)
    mutable_stats().skipped_empty += 1;
  else
    document = make_document(std::move(article.text), in, article.first_line);
  article = Article{};
  return document;
}

std::optional<Document> WikiTextReader::next_from_file(LineReader& in) {
  if (!in_file_) start_file(in);
  Article article;
  while (have_current_) {
    const bool starts_article = article.has_content && previous_was_blank_ && is_wikitext_title_line(current_) &&
                                (!have_next_ || is_blank(next_));
    if (starts_article) {
      if (std::optional<Document> document = finish(article, in)) return document;
    }
    append_current_line(article, in);
    advance(in);
  }
  in_file_ = false;
  if (!article.text.empty()) return finish(article, in);
  return std::nullopt;
}

}  // namespace

bool is_wikitext_title_line(std::string_view line) {
  line = trim(line);
  if (line.size() < 5 || line.substr(0, 2) != "= " || line.substr(line.size() - 2) != " =") return false;
  const std::string_view title = trim(line.substr(2, line.size() - 4));
  return !title.empty() && title.front() != '=' && title.back() != '=';
}

std::unique_ptr<DocumentReader> make_wikitext_reader(std::vector<CorpusFile> files, const CorpusOptions& options) {
  return std::make_unique<WikiTextReader>(std::move(files), options);
}

}  // namespace hgrn
