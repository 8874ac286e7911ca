// test_corpus.cpp: the corpus readers (data/corpus.h): WikiText article splitting, exact reproduction and the
// standard word counts; Pile jsonl / .jsonl.zst records, subsets and streaming decompression; every kind of bad
// input failing with its file and line, and counted instead with skip_bad; the download script without network.
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/corpus.h"
#include "data/utf8.h"
#include "data/wikitext_reader.h"

namespace hgrn {
namespace {

namespace fs = std::filesystem;

// A path in the test temp dir, unique per test so that tests running in parallel never share a file.
std::string temp_path(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return ::testing::TempDir() + "hgrn_corpus_" + info->test_suite_name() + "_" + info->name() + "_" + name;
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(out.good()) << "could not write fixture " << path;
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// One zstd frame of `data`; with a checksum, any corrupted byte is caught at the end of the frame at the latest.
std::string zstd_frame(const std::string& data, bool with_checksum = false) {
  std::string out(ZSTD_compressBound(data.size()), '\0');
  size_t size = 0;
  if (!with_checksum) {
    size = ZSTD_compress(out.data(), out.size(), data.data(), data.size(), 3);
  } else {
    ZSTD_CCtx* context = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(context, ZSTD_c_checksumFlag, 1);
    size = ZSTD_compress2(context, out.data(), out.size(), data.data(), data.size());
    ZSTD_freeCCtx(context);
  }
  EXPECT_FALSE(ZSTD_isError(size)) << ZSTD_getErrorName(size);
  out.resize(size);
  return out;
}

// A skippable frame (magic 0x184D2A50, little-endian length, payload), which decoders must step over.
std::string skippable_frame(const std::string& payload) {
  std::string frame = "\x50\x2A\x4D\x18";
  const auto size = static_cast<uint32_t>(payload.size());
  for (int shift = 0; shift < 32; shift += 8) frame += static_cast<char>((size >> shift) & 0xFF);
  return frame + payload;
}

std::vector<Document> read_all(DocumentReader& reader) {
  std::vector<Document> documents;
  while (std::optional<Document> document = reader.next()) documents.push_back(std::move(*document));
  return documents;
}

std::vector<Document> read_corpus(const std::string& kind, const std::vector<std::string>& paths,
                                  const CorpusOptions& options = {}, CorpusStats* stats = nullptr) {
  auto reader = open_corpus(kind, paths, options);
  std::vector<Document> documents = read_all(*reader);
  if (stats) *stats = reader->stats();
  return documents;
}

// Runs `action`, expects an Error, and checks that its message contains every one of `parts`.
void expect_error(const std::function<void()>& action, std::initializer_list<std::string> parts) {
  try {
    action();
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "message lacks \"" << part << "\":\n" << message;
    return;
  }
  ADD_FAILURE() << "expected an hgrn::Error";
}

// The shared real-data folder (never copied into the repository), or "" when absent.
std::string shared_data_dir() {
  if (const char* env = std::getenv("HGRN_SHARED_DATA"); env && *env) return env;
  return std::string(HGRN_SOURCE_DIR) + "/../shared/data";
}

#define SKIP_WITHOUT_SHARED_FILE(path)                                                                           \
  do {                                                                                                           \
    if (!fs::exists(path))                                                                                       \
      GTEST_SKIP() << "shared data file " << (path) << " is absent; set HGRN_SHARED_DATA to the folder that "    \
                   << "holds wikitext-2/ and pile-sample/ (default: HGRN_SOURCE_DIR/../shared/data)";            \
  } while (0)

// ----- WikiText -----------------------------------------------------------------------------------------------

// Two articles in WikiText's layout, with a section heading and a table row that looks like a title but is not
// framed by blank lines (WikiText-2 train has such rows, e.g. " = Goals ; A = ").
const std::string kWikiText =
    " \n"
    " = Alpha = \n"
    " \n"
    " Alpha is the first letter . \n"
    " \n"
    " = = History = = \n"
    " \n"
    " It came from aleph . \n"
    " Key : Pld \n"
    " = Goals ; A = \n"
    " Wins \n"
    " \n"
    " = Beta = \n"
    " \n"
    " Beta <unk> second @-@ letter . \n"
    " \n";

TEST(CorpusWikiText, TitleLinesAreLevelOneHeadingsOnly) {
  EXPECT_TRUE(is_wikitext_title_line(" = Valkyria Chronicles III = \n"));
  EXPECT_TRUE(is_wikitext_title_line(" = Title ="));
  EXPECT_TRUE(is_wikitext_title_line("= X =\r\n"));
  EXPECT_TRUE(is_wikitext_title_line(" = E = mc2 = \n"));  // an '=' inside the title is fine
  EXPECT_FALSE(is_wikitext_title_line(" = = Gameplay = = \n"));
  EXPECT_FALSE(is_wikitext_title_line(" = = = Sub = = = \n"));
  EXPECT_FALSE(is_wikitext_title_line(" =  = \n"));
  EXPECT_FALSE(is_wikitext_title_line(" \n"));
  EXPECT_FALSE(is_wikitext_title_line(" The = sign \n"));
}

TEST(CorpusWikiText, SplitsAtTitlesAndReproducesTheFileExactly) {
  const std::string path = write_file("wiki.train.tokens", kWikiText);
  CorpusStats stats;
  const std::vector<Document> documents = read_corpus("wikitext", {path}, {}, &stats);
  ASSERT_EQ(documents.size(), 2u);
  // The leading " \n" belongs to the first article; the section heading and the table row do not split.
  EXPECT_EQ(documents[0].text.substr(0, 14), " \n = Alpha = \n");
  EXPECT_NE(documents[0].text.find(" = Goals ; A = \n Wins \n"), std::string::npos);
  EXPECT_EQ(documents[1].text.substr(0, 11), " = Beta = \n");
  EXPECT_EQ(documents[0].line, 1);
  EXPECT_EQ(documents[1].line, 13);
  EXPECT_EQ(documents[0].file, path);
  EXPECT_EQ(documents[0].text + documents[1].text, kWikiText);

  EXPECT_EQ(stats.documents, 2);
  EXPECT_EQ(stats.bytes, static_cast<int64_t>(kWikiText.size()));
  // 37 words on 16 lines (each line ends in an <eos>).
  EXPECT_EQ(stats.words, 37 + 16);
  EXPECT_EQ(stats.skipped_empty + stats.skipped_non_utf8 + stats.skipped_malformed + stats.filtered_out, 0);
}

TEST(CorpusWikiText, LastLineWithoutNewlineIsKeptAndCounted) {
  const std::string text = " = A = \n \n one two\n \n = B = \n \n three";
  const std::string path = write_file("valid.txt", text);
  CorpusStats stats;
  const std::vector<Document> documents = read_corpus("wikitext", {path}, {}, &stats);
  ASSERT_EQ(documents.size(), 2u);
  EXPECT_EQ(documents[0].text + documents[1].text, text);
  EXPECT_EQ(documents[1].text, " = B = \n \n three");
  EXPECT_EQ(stats.words, (3 + 2 + 3 + 1) + 7);  // "= A =", "one two", "= B =", "three"; 7 lines
}

TEST(CorpusWikiText, FilesAreReadInOrderAndArticlesNeverSpanFiles) {
  const std::string first = write_file("a.tokens", " = One = \n \n text one \n");
  const std::string second = write_file("b.tokens", " more of one ? \n \n = Two = \n \n text two \n");
  auto reader = open_corpus("wikitext", {first, second}, {});
  EXPECT_EQ(reader->total_bytes(), static_cast<int64_t>(fs::file_size(first) + fs::file_size(second)));
  EXPECT_EQ(reader->bytes_read(), 0);
  std::vector<Document> documents;
  int64_t previous_progress = 0;
  while (std::optional<Document> document = reader->next()) {
    EXPECT_GE(reader->bytes_read(), previous_progress);
    previous_progress = reader->bytes_read();
    documents.push_back(*document);
  }
  ASSERT_EQ(documents.size(), 3u);
  EXPECT_EQ(documents[0].file, first);
  EXPECT_EQ(documents[1].file, second);
  EXPECT_EQ(documents[1].text, " more of one ? \n \n");  // the second file's lines before its first title
  EXPECT_EQ(documents[2].line, 3);
  EXPECT_EQ(reader->bytes_read(), reader->total_bytes());
}

TEST(CorpusWikiText, ZstdCompressedFileReadsLikeThePlainOne) {
  const std::string path = write_file("wiki.valid.tokens.zst", zstd_frame(kWikiText));
  const std::vector<Document> documents = read_corpus("wikitext", {path});
  ASSERT_EQ(documents.size(), 2u);
  EXPECT_EQ(documents[0].text + documents[1].text, kWikiText);
}

TEST(CorpusWikiText, InvalidUtf8FailsWithFileAndLine) {
  const std::string path = write_file("bad.tokens", " = A = \n \n ok \n \n = B = \n \n caf\xE9 \n \n");
  expect_error([&] { read_corpus("wikitext", {path}); },
               {path + ":7: invalid UTF-8 (byte 0xE9 at column 5)", "article that starts at line 5", "--skip-bad"});
}

TEST(CorpusWikiText, InvalidUtf8ArticleIsSkippedAndCountedWithSkipBad) {
  const std::string path =
      write_file("bad.tokens", " = A = \n \n ok \n \n = B = \n \n caf\xE9 \xFF \n \n = C = \n \n fine \n");
  CorpusOptions options;
  options.skip_bad = true;
  CorpusStats stats;
  const std::vector<Document> documents = read_corpus("wikitext", {path}, options, &stats);
  ASSERT_EQ(documents.size(), 2u);
  EXPECT_EQ(documents[0].text.substr(0, 8), " = A = \n");
  EXPECT_EQ(documents[1].text.substr(0, 8), " = C = \n");
  EXPECT_EQ(stats.skipped_non_utf8, 1);  // one article, however many bad bytes it holds
  EXPECT_EQ(stats.documents, 2);
}

TEST(CorpusWikiText, WhitespaceOnlyFileIsSkippedAndCountedAsEmpty) {
  const std::string path = write_file("blank.tokens", " \n\n \t \n");
  CorpusStats stats;
  EXPECT_TRUE(read_corpus("wikitext", {path}, {}, &stats).empty());
  EXPECT_EQ(stats.skipped_empty, 1);
  EXPECT_EQ(stats.documents, 0);
}

TEST(CorpusWikiText, EmptyFileIsAnEmptyCorpus) {
  const std::string path = write_file("empty.tokens", "");
  auto reader = open_corpus("wikitext", {path}, {});
  EXPECT_FALSE(reader->next().has_value());
  EXPECT_FALSE(reader->next().has_value());  // stays at the end
  const CorpusStats& stats = reader->stats();
  EXPECT_EQ(stats.documents + stats.bytes + stats.words + stats.skipped_empty, 0);
  EXPECT_EQ(reader->total_bytes(), 0);
  EXPECT_EQ(reader->bytes_read(), 0);
}

// The published WikiText-2 split sizes (words + one <eos> per line, as pytorch's word_language_model counts them)
// and its 600 / 60 / 60 articles; the documents concatenate back to the file byte for byte.
TEST(CorpusWikiText, SharedWikiText2WordCountsArticlesAndExactReproduction) {
  const struct {
    const char* name;
    int64_t words;
    int64_t articles;
  } splits[] = {{"train.txt", 2088628, 600}, {"valid.txt", 217646, 60}, {"test.txt", 245569, 60}};
  for (const auto& split : splits) {
    const std::string path = shared_data_dir() + "/wikitext-2/" + split.name;
    SKIP_WITHOUT_SHARED_FILE(path);
    auto reader = open_corpus("wikitext", {path}, {});
    std::string concatenated;
    int64_t articles = 0;
    while (std::optional<Document> document = reader->next()) {
      if (articles > 0) {
        const std::string first_line = document->text.substr(0, document->text.find('\n'));
        EXPECT_TRUE(is_wikitext_title_line(first_line)) << split.name << ":" << document->line << ": " << first_line;
      }
      concatenated += document->text;
      ++articles;
    }
    EXPECT_EQ(reader->stats().words, split.words) << split.name;
    EXPECT_EQ(articles, split.articles) << split.name;
    EXPECT_EQ(reader->stats().documents, split.articles) << split.name;
    EXPECT_TRUE(concatenated == read_file(path)) << split.name << ": the documents do not reproduce the file";
    EXPECT_EQ(reader->bytes_read(), reader->total_bytes());
  }
}

TEST(CorpusWikiText, SharedWikiText2RawFilesCountTheSameWords) {
  const struct {
    const char* name;
    int64_t words;
  } splits[] = {{"wiki.valid.raw", 217646}, {"wiki.test.raw", 245569}};
  for (const auto& split : splits) {
    const std::string path = shared_data_dir() + "/wikitext-2-raw/" + split.name;
    SKIP_WITHOUT_SHARED_FILE(path);
    CorpusStats stats;
    const std::vector<Document> documents = read_corpus("wikitext", {path}, {}, &stats);
    EXPECT_EQ(stats.words, split.words) << split.name;
    EXPECT_EQ(documents.size(), 60u) << split.name;
  }
}

TEST(CorpusUtf8, ValidatorFollowsTheWellFormedTable) {
  EXPECT_FALSE(first_invalid_utf8("plain ascii").has_value());
  EXPECT_FALSE(first_invalid_utf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9D\x84\x9E \xF4\x8F\xBF\xBF").has_value());
  EXPECT_EQ(first_invalid_utf8("ab\xC0\x80"), 2u);            // overlong NUL
  EXPECT_EQ(first_invalid_utf8("\xE0\x80\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(first_invalid_utf8("x\xED\xA0\x80"), 1u);         // UTF-16 surrogate
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);      // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("123456789\x80"), 9u);         // a lone continuation byte after the ASCII fast path
  EXPECT_EQ(first_invalid_utf8("ok\xE2\x82"), 2u);            // cut off by the end
  EXPECT_EQ(describe_invalid_utf8("ab\xFF", 2), "byte 0xFF at column 3");
}

// ----- Pile ---------------------------------------------------------------------------------------------------

std::string pile_record(const std::string& text, const std::string& subset) {
  std::string escaped;
  for (char c : text) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped += c;
  }
  return "{\"text\": \"" + escaped + "\", \"meta\": {\"pile_set_name\": \"" + subset + "\"}}\n";
}

const std::string kPileRecords = pile_record("First document.\nSecond line.", "Github") + "\n" +
                                 pile_record("A PubMed abstract with \"quotes\".", "PubMed Abstracts") +
                                 pile_record("Another abstract.", "PubMed Abstracts") +
                                 "{\"text\": \"no meta at all\"}\n" +
                                 pile_record("Caf\xC3\xA9 in UTF-8", "OpenWebText2");

TEST(CorpusPile, SharedSampleRecordsAndStats) {
  const std::string path = shared_data_dir() + "/pile-sample/pile_text.jsonl";
  SKIP_WITHOUT_SHARED_FILE(path);
  auto reader = open_corpus("pile", {path}, {});
  const std::vector<Document> documents = read_all(*reader);
  ASSERT_EQ(documents.size(), 10u);
  for (size_t i = 0; i < documents.size(); ++i) EXPECT_EQ(documents[i].line, static_cast<int64_t>(i + 1));
  EXPECT_EQ(documents[0].text.substr(0, 20), "Catalonia election: ");
  EXPECT_EQ(documents[5].text.substr(0, 4), "Q:\n\n");  // JSON escapes are decoded
  const CorpusStats& stats = reader->stats();
  EXPECT_EQ(stats.documents, 10);
  EXPECT_EQ(stats.bytes, 22473);
  EXPECT_EQ(stats.words, 3601);
  EXPECT_EQ(stats.filtered_out + stats.skipped_empty + stats.skipped_malformed + stats.skipped_non_utf8, 0);
  EXPECT_EQ(reader->bytes_read(), 23416);
  EXPECT_EQ(reader->total_bytes(), 23416);
}

TEST(CorpusPile, SharedSampleSubsetFilter) {
  const std::string path = shared_data_dir() + "/pile-sample/pile_text.jsonl";
  SKIP_WITHOUT_SHARED_FILE(path);
  const struct {
    std::vector<std::string> subsets;
    int64_t documents, bytes;
  } cases[] = {{{"PubMed Abstracts"}, 5, 8132},
               {{"OpenWebText2"}, 2, 9529},
               {{"StackExchange"}, 2, 4449},
               {{"Github"}, 1, 363},
               {{"Github", "OpenWebText2"}, 3, 363 + 9529}};
  for (const auto& c : cases) {
    CorpusOptions options;
    options.pile_subsets = c.subsets;
    CorpusStats stats;
    const std::vector<Document> documents = read_corpus("pile", {path}, options, &stats);
    EXPECT_EQ(static_cast<int64_t>(documents.size()), c.documents) << c.subsets[0];
    EXPECT_EQ(stats.bytes, c.bytes) << c.subsets[0];
    EXPECT_EQ(stats.filtered_out, 10 - c.documents) << c.subsets[0];
  }
}

TEST(CorpusPile, UnmatchedSubsetFailsAfterTheWholeReadListingTheSubsetsSeen) {
  const std::string path = shared_data_dir() + "/pile-sample/pile_text.jsonl";
  SKIP_WITHOUT_SHARED_FILE(path);
  CorpusOptions options;
  options.pile_subsets = {"Github", "Pubmed Abstracts"};
  auto reader = open_corpus("pile", {path}, options);
  std::optional<Document> github = reader->next();  // the matching subset's records come first
  ASSERT_TRUE(github.has_value());
  EXPECT_EQ(github->line, 4);
  expect_error([&] { reader->next(); },
               {"pile subset \"Pubmed Abstracts\" matched no record in 1 file(s) (" + path + ")",
                "\"Github\" (1), \"OpenWebText2\" (2), \"PubMed Abstracts\" (5), \"StackExchange\" (2)",
                "did you mean \"PubMed Abstracts\"", "case-sensitive"});
  EXPECT_FALSE(reader->next().has_value());
}

TEST(CorpusPile, FixtureRecordsSubsetsAndBlankLines) {
  const std::string path = write_file("records.jsonl", kPileRecords);
  CorpusStats stats;
  std::vector<Document> documents = read_corpus("pile", {path}, {}, &stats);
  ASSERT_EQ(documents.size(), 5u);
  EXPECT_EQ(documents[0].text, "First document.\nSecond line.");
  EXPECT_EQ(documents[1].text, "A PubMed abstract with \"quotes\".");
  EXPECT_EQ(documents[1].line, 3);  // line 2 is blank: ignored, but it still counts for line numbers
  EXPECT_EQ(documents[3].text, "no meta at all");
  EXPECT_EQ(documents[4].text, "Caf\xC3\xA9 in UTF-8");
  EXPECT_EQ(stats.words, (4 + 2) + (5 + 1) + (2 + 1) + (4 + 1) + (3 + 1));  // words + lines per record

  CorpusOptions options;
  options.pile_subsets = {"PubMed Abstracts"};
  documents = read_corpus("pile", {path}, options, &stats);
  ASSERT_EQ(documents.size(), 2u);
  EXPECT_EQ(stats.filtered_out, 3);  // the record without meta matches no subset
  EXPECT_EQ(documents[1].text, "Another abstract.");
}

TEST(CorpusPile, JsonEscapesDecodeToUtf8) {
  const std::string path =
      write_file("escapes.jsonl", "{\"text\": \"caf\\u00e9 \\ud83d\\ude00 tab\\tend\", \"meta\": {}}\n");
  const std::vector<Document> documents = read_corpus("pile", {path});
  ASSERT_EQ(documents.size(), 1u);
  EXPECT_EQ(documents[0].text, "caf\xC3\xA9 \xF0\x9F\x98\x80 tab\tend");
}

TEST(CorpusPile, ZstdShardReadsLikeThePlainFile) {
  const std::string plain = write_file("records.jsonl", kPileRecords);
  const std::string compressed = write_file("records.jsonl.zst", zstd_frame(kPileRecords));
  CorpusStats plain_stats, compressed_stats;
  const std::vector<Document> expected = read_corpus("pile", {plain}, {}, &plain_stats);
  auto reader = open_corpus("pile", {compressed}, {});
  const std::vector<Document> documents = read_all(*reader);
  ASSERT_EQ(documents.size(), expected.size());
  for (size_t i = 0; i < documents.size(); ++i) {
    EXPECT_EQ(documents[i].text, expected[i].text);
    EXPECT_EQ(documents[i].line, expected[i].line);
  }
  EXPECT_EQ(reader->stats().words, plain_stats.words);
  // Progress is in compressed bytes, so a bar over total_bytes ends at 100%.
  EXPECT_EQ(reader->bytes_read(), static_cast<int64_t>(fs::file_size(compressed)));
  EXPECT_EQ(reader->total_bytes(), static_cast<int64_t>(fs::file_size(compressed)));
}

TEST(CorpusPile, MultiFrameZstdWithALineSplitAcrossFrames) {
  // zstd -c a b > c and parallel compressors write several frames; a record may straddle two of them.
  const size_t cut = kPileRecords.find("Another") + 3;
  const std::string bytes = zstd_frame(kPileRecords.substr(0, cut)) + skippable_frame("index data") +
                            zstd_frame("") + zstd_frame(kPileRecords.substr(cut), true);
  const std::string path = write_file("frames.jsonl.zst", bytes);
  const std::vector<Document> documents = read_corpus("pile", {path});
  ASSERT_EQ(documents.size(), 5u);
  EXPECT_EQ(documents[2].text, "Another abstract.");
  EXPECT_EQ(documents[4].text, "Caf\xC3\xA9 in UTF-8");
}

TEST(CorpusPile, LinesLongerThanEveryBufferAreReadWhole) {
  std::string long_text(3 << 20, 'x');  // 3 MiB: longer than the line reader's and zstd's buffers
  for (size_t i = 0; i < long_text.size(); i += 1000) long_text[i] = ' ';
  const std::string records = pile_record("short", "Github") + pile_record(long_text, "Github") +
                              pile_record("after", "Github");
  const std::string path = write_file("long.jsonl.zst", zstd_frame(records));
  const std::vector<Document> documents = read_corpus("pile", {path});
  ASSERT_EQ(documents.size(), 3u);
  EXPECT_TRUE(documents[1].text == long_text);
  EXPECT_EQ(documents[2].text, "after");
  EXPECT_EQ(documents[2].line, 3);
}

TEST(CorpusPile, EmptyFilesAreAnEmptyCorpus) {
  const std::string plain = write_file("empty.jsonl", "");
  const std::string blank_lines = write_file("blank.jsonl", "\n  \n\n");
  const std::string compressed_empty = write_file("empty.jsonl.zst", zstd_frame(""));
  CorpusStats stats;
  EXPECT_TRUE(read_corpus("pile", {plain, blank_lines, compressed_empty}, {}, &stats).empty());
  EXPECT_EQ(stats.documents + stats.skipped_empty + stats.skipped_malformed, 0);
}

TEST(CorpusPile, TruncatedZstdFailsWithFileAndOffsetEvenWithSkipBad) {
  std::string records;
  for (int i = 0; i < 2000; ++i) records += pile_record("record number " + std::to_string(i), "Github");
  const std::string whole = zstd_frame(records);
  const std::string path = write_file("truncated.jsonl.zst", whole.substr(0, whole.size() / 2));
  for (bool skip_bad : {false, true}) {
    CorpusOptions options;
    options.skip_bad = skip_bad;
    expect_error([&] { read_corpus("pile", {path}, options); },
                 {path + ":", "truncated zstd stream: the file ends inside a frame", "at compressed byte",
                  "of the decompressed text", "--skip-bad cannot skip it", "re-download"});
  }
}

TEST(CorpusPile, ZeroByteZstdFileFails) {
  const std::string path = write_file("zero.jsonl.zst", "");
  expect_error([&] { read_corpus("pile", {path}); }, {path + ":1: the file is empty (0 bytes), which is not a zstd"});
}

TEST(CorpusPile, CorruptZstdFailsWithFileAndOffsetEvenWithSkipBad) {
  // A flipped byte in the frame header: the decoder refuses the frame at once.
  std::string bad_header = zstd_frame(kPileRecords);
  bad_header[0] = static_cast<char>(bad_header[0] ^ 0x40);
  const std::string header_path = write_file("bad_header.jsonl.zst", bad_header);
  expect_error([&] { read_corpus("pile", {header_path}); },
               {header_path + ":1: corrupt zstd data: ", "at compressed byte", "--skip-bad cannot skip it"});

  // A flipped byte inside a second, checksummed frame: caught at the latest by the checksum; the first frame's
  // records come through before that, and skip_bad does not hide the broken stream.
  std::string records;
  for (int i = 0; i < 500; ++i) records += pile_record("payload " + std::to_string(i * 7919), "Github");
  const std::string first_frame = zstd_frame(pile_record("intact", "Github"));
  std::string second_frame = zstd_frame(records, true);
  second_frame[second_frame.size() / 2] = static_cast<char>(second_frame[second_frame.size() / 2] ^ 0xFF);
  const std::string middle_path = write_file("bad_middle.jsonl.zst", first_frame + second_frame);
  CorpusOptions options;
  options.skip_bad = true;
  auto reader = open_corpus("pile", {middle_path}, options);
  std::optional<Document> intact = reader->next();
  ASSERT_TRUE(intact.has_value());
  EXPECT_EQ(intact->text, "intact");
  expect_error([&] { read_all(*reader); },
               {middle_path + ":", "corrupt zstd data: ", "at compressed byte", "--skip-bad cannot skip it"});
}

TEST(CorpusPile, GzipFileIsRefusedWithAHint) {
  const std::string path = write_file("shard.jsonl", std::string("\x1F\x8B\x08\x00", 4) + "rest");
  expect_error([&] { read_corpus("pile", {path}); }, {path, "gzip-compressed", "zstd"});
}

// Each kind of bad record, on line 3 after a good record and a blank line.
const struct BadRecord {
  const char* name;
  std::string line;
  std::string message;  // part of the message after "file:3: "
  bool non_utf8;
} kBadRecords[] = {
    {"syntax", "{\"text\": \"unterminated}", "malformed JSON at column", false},
    {"truncated_object", "{\"text\": \"a\"", "malformed JSON at column", false},
    {"lone_surrogate", "{\"text\": \"\\ud800\"}", "malformed JSON at column", false},
    {"array", "[1, 2]", "expected a JSON object, got array", false},
    {"no_text", "{\"meta\": {\"pile_set_name\": \"Github\"}}", "the record has no \"text\" field", false},
    {"number_text", "{\"text\": 5}", "\"text\" is number, expected a string", false},
    {"null_text", "{\"text\": null}", "\"text\" is null, expected a string", false},
    {"meta_string", "{\"text\": \"a\", \"meta\": \"Github\"}", "\"meta\" is string, expected an object", false},
    {"subset_number", "{\"text\": \"a\", \"meta\": {\"pile_set_name\": 3}}",
     "\"meta.pile_set_name\" is number, expected a string", false},
    {"latin1_byte", "{\"text\": \"caf\xE9\"}", "invalid UTF-8 (byte 0xE9 at column 14)", true},
    {"overlong", "{\"text\": \"\xC0\xAF\"}", "invalid UTF-8 (byte 0xC0 at column 11)", true},
};

TEST(CorpusPile, EachBadRecordFailsWithFileAndLine) {
  for (const BadRecord& bad : kBadRecords) {
    const std::string path =
        write_file(std::string(bad.name) + ".jsonl", pile_record("good", "Github") + "\n" + bad.line + "\n");
    expect_error([&] { read_corpus("pile", {path}); }, {path + ":3: " + bad.message, "--skip-bad"});
  }
}

TEST(CorpusPile, BadRecordsAreSkippedAndCountedWithSkipBad) {
  std::string contents = pile_record("first", "Github");
  int64_t malformed = 0, non_utf8 = 0;
  for (const BadRecord& bad : kBadRecords) {
    contents += bad.line + "\n" + pile_record("between", "Github");
    (bad.non_utf8 ? non_utf8 : malformed) += 1;
  }
  contents += "{\"text\": \"\"}\n{\"text\": \" \\n\\t \", \"meta\": {\"pile_set_name\": \"Github\"}}\n";
  contents += pile_record("last", "Github");
  const std::string path = write_file("mixed.jsonl", contents);
  CorpusOptions options;
  options.skip_bad = true;
  CorpusStats stats;
  const std::vector<Document> documents = read_corpus("pile", {path}, options, &stats);
  const auto bad_count = static_cast<int64_t>(std::size(kBadRecords));
  ASSERT_EQ(static_cast<int64_t>(documents.size()), 1 + bad_count + 1);
  EXPECT_EQ(stats.skipped_malformed, malformed);
  EXPECT_EQ(stats.skipped_non_utf8, non_utf8);
  EXPECT_EQ(stats.skipped_empty, 2);
  EXPECT_EQ(documents[1].line, 3);  // "between" after the first bad line
  EXPECT_EQ(documents.back().text, "last");
  EXPECT_EQ(documents.back().line, 1 + 2 * bad_count + 2 + 1);
}

TEST(CorpusPile, EmptyTextIsSkippedAndCountedWithoutSkipBad) {
  const std::string path = write_file("empty_text.jsonl", "{\"text\": \"\"}\n{\"text\": \"   \"}\n{\"text\": \"x\"}\n");
  CorpusStats stats;
  const std::vector<Document> documents = read_corpus("pile", {path}, {}, &stats);
  ASSERT_EQ(documents.size(), 1u);
  EXPECT_EQ(stats.skipped_empty, 2);
}

// ----- opening ------------------------------------------------------------------------------------------------

TEST(CorpusOpen, MissingFileFailsBeforeAnyReading) {
  const std::string good = write_file("good.jsonl", pile_record("x", "Github"));
  const std::string missing = temp_path("missing.jsonl.zst");
  expect_error([&] { open_corpus("pile", {good, missing}, {}); },
               {"corpus file " + missing + " does not exist (pile corpus)", "data/README.md"});
  expect_error([&] { open_corpus("wikitext", {missing}, {}); },
               {"corpus file " + missing + " does not exist (wikitext corpus)", "scripts/download_wikitext103.sh"});
}

TEST(CorpusOpen, DirectoryIsRefused) {
  const std::string directory = temp_path("dir");
  fs::create_directories(directory);
  expect_error([&] { open_corpus("wikitext", {directory}, {}); }, {directory + " is a directory"});
}

TEST(CorpusOpen, UnknownKindListsTheKinds) {
  expect_error([&] { open_corpus("wikitxt", {"x"}, {}); },
               {"unknown corpus kind \"wikitxt\": expected one of wikitext, pile", "did you mean \"wikitext\""});
}

TEST(CorpusOpen, NoPathsAndMisplacedSubsetsAreRefused) {
  expect_error([&] { open_corpus("pile", {}, {}); }, {"no pile corpus files given"});
  const std::string path = write_file("a.tokens", " = A = \n");
  CorpusOptions options;
  options.pile_subsets = {"Github"};
  expect_error([&] { open_corpus("wikitext", {path}, options); }, {"subsets apply only to kind pile"});
}

// ----- scripts/download_wikitext103.sh ------------------------------------------------------------------------

TEST(CorpusDownloadScript, FailsCleanlyWithoutNetwork) {
  if (std::system("command -v curl > /dev/null 2>&1 && command -v unzip > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "curl or unzip is not installed; the script needs both";
  const std::string destination = temp_path("wikitext-103");
  const std::string log = temp_path("download.log");
  // 10.255.255.1 is unroutable: curl either gets no route at once or times out connecting after 1 s.
  const std::string command = "HGRN_WIKITEXT103_URL=http://10.255.255.1/wikitext HGRN_CONNECT_TIMEOUT=1 bash " +
                              std::string(HGRN_SOURCE_DIR) + "/scripts/download_wikitext103.sh " + destination +
                              " > " + log + " 2>&1";
  const int status = std::system(command.c_str());
  const std::string output = read_file(log);
  EXPECT_NE(status, 0) << output;
  EXPECT_NE(output.find("could not download"), std::string::npos) << output;
  EXPECT_NE(output.find("network"), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(destination + "/wikitext-103-v1.zip")) << "a partial download was left behind";
  EXPECT_FALSE(fs::exists(destination + "/wiki.train.tokens"));
}

}  // namespace
}  // namespace hgrn
