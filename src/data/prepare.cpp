// prepare.cpp: the corpus -> token shard pipeline of `hgrn prepare` (reader thread, tokenising workers, in-order
// writer; design in prepare.h), its progress line and its summary.
#include "data/prepare.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "core/check.h"
#include "core/format.h"
#include "core/rng.h"
#include "core/status_line.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "io/atomic_write.h"

namespace hgrn {

namespace {


// A batch is closed at this much text or this many documents, whichever comes first: large enough that the locking
// per batch is negligible, small enough that a few megabytes of input already keep several workers busy.
constexpr size_t kBatchBytes = size_t{256} << 10;
constexpr size_t kBatchDocuments = 4096;

struct ReadBatch {
  uint64_t number = 0;          // position in the stream of batches: the order they are written in
  uint64_t first_document = 0;  // index of its first document among all documents read
  std::vector<Document> documents;
  std::vector<int64_t> words;   // CorpusStats.words of each document
};

struct TokenizedBatch {
  uint64_t first_document = 0;
  std::vector<int32_t> ids;       // every document's ids followed by its EOS, concatenated
  std::vector<int64_t> lengths;   // tokens of each document, EOS included
  std::vector<int64_t> bytes, words;
};

TokenizedBatch tokenize_batch(const ReadBatch& batch, const Tokenizer& tokenizer) {
  TokenizedBatch out;
  out.first_document = batch.first_document;
  out.words = batch.words;
  const int32_t eos = tokenizer.eos_id();
  for (const Document& document : batch.documents) {
    std::vector<int32_t> ids;
    try {
      ids = tokenizer.encode(document.text);
    } catch (const std::exception& error) {
      throw Error(detail::concat(document.file, ":", document.line, ": cannot tokenise the document that starts here: ",
                                 error.what()));
    }
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.ids.push_back(eos);
    out.lengths.push_back(static_cast<int64_t>(ids.size()) + 1);
    out.bytes.push_back(static_cast<int64_t>(document.text.size()));
  }
  return out;
}

// The threads and the queues between them. The destructor stops and joins every thread, so an exception on the
// writing side unwinds cleanly.
class Pipeline {
 public:
  enum class Poll { kBatch, kTimeout, kEnd };

  Pipeline(DocumentReader& reader, const Tokenizer& tokenizer, int64_t workers)
      : reader_(reader), tokenizer_(tokenizer), max_in_flight_(2 * static_cast<uint64_t>(workers) + 2) {
    try {
      threads_.emplace_back([this] { read_loop(); });
      for (int64_t w = 0; w < workers; ++w) threads_.emplace_back([this] { work_loop(); });
    } catch (...) {
      stop_and_join();
      throw;
    }
  }

  ~Pipeline() { stop_and_join(); }

  // Waits up to `timeout` for the next batch in order. Rethrows the first error of any thread.
  Poll poll(TokenizedBatch& out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait_for(lock, timeout, [&] {
      return error_ != nullptr || finished_.count(batches_written_) > 0 ||
             (input_done_ && batches_written_ == batches_read_);
    });
    if (error_ != nullptr) std::rethrow_exception(error_);
    const auto it = finished_.find(batches_written_);
    if (it != finished_.end()) {
      out = std::move(it->second);
      finished_.erase(it);
      ++batches_written_;
      lock.unlock();
      space_cv_.notify_one();
      return Poll::kBatch;
    }
    return input_done_ && batches_written_ == batches_read_ ? Poll::kEnd : Poll::kTimeout;
  }

  int64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

  // The reader's counts once poll has returned kEnd.
  CorpusStats final_stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return final_stats_;
  }

 private:
  void fail(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error_ == nullptr) error_ = error;
      stop_ = true;
    }
    space_cv_.notify_all();
    work_cv_.notify_all();
    done_cv_.notify_all();
  }

  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    space_cv_.notify_all();
    work_cv_.notify_all();
    done_cv_.notify_all();
    for (std::thread& thread : threads_)
      if (thread.joinable()) thread.join();
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stop_;
  }

  void read_loop() {
    try {
      uint64_t next_document = 0, next_batch = 0;
      bool end = false;
      while (!end) {
        ReadBatch batch;
        batch.number = next_batch;
        batch.first_document = next_document;
        size_t bytes = 0;
        while (bytes < kBatchBytes && batch.documents.size() < kBatchDocuments) {
          if (stopping()) return;
          // The reader counts words as it returns documents, so the difference is this document's count.
          const int64_t words_before = reader_.stats().words;
          std::optional<Document> document = reader_.next();
          bytes_read_.store(reader_.bytes_read(), std::memory_order_relaxed);
          if (!document) {
            end = true;
            break;
          }
          batch.words.push_back(reader_.stats().words - words_before);
          bytes += document->text.size();
          batch.documents.push_back(std::move(*document));
        }
        if (batch.documents.empty()) break;
        next_document += batch.documents.size();
        ++next_batch;
        {
          std::unique_lock<std::mutex> lock(mutex_);
          space_cv_.wait(lock, [&] { return stop_ || batches_read_ - batches_written_ < max_in_flight_; });
          if (stop_) return;
          queue_.push_back(std::move(batch));
          ++batches_read_;
        }
        work_cv_.notify_one();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        final_stats_ = reader_.stats();
        input_done_ = true;
      }
      work_cv_.notify_all();
      done_cv_.notify_all();
    } catch (...) {
      fail(std::current_exception());
    }
  }

  void work_loop() {
    try {
      for (;;) {
        ReadBatch batch;
        {
          std::unique_lock<std::mutex> lock(mutex_);
          work_cv_.wait(lock, [&] { return stop_ || !queue_.empty() || input_done_; });
          if (stop_ || queue_.empty()) return;
          batch = std::move(queue_.front());
          queue_.pop_front();
        }
        TokenizedBatch tokens = tokenize_batch(batch, tokenizer_);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          finished_.emplace(batch.number, std::move(tokens));
        }
        done_cv_.notify_all();
      }
    } catch (...) {
      fail(std::current_exception());
    }
  }

  DocumentReader& reader_;
  const Tokenizer& tokenizer_;
  const uint64_t max_in_flight_;  // batches read but not yet written: bounds memory

  mutable std::mutex mutex_;
  std::condition_variable space_cv_, work_cv_, done_cv_;
  std::deque<ReadBatch> queue_;
  std::map<uint64_t, TokenizedBatch> finished_;
  uint64_t batches_read_ = 0, batches_written_ = 0;
  bool input_done_ = false, stop_ = false;
  std::exception_ptr error_;
  CorpusStats final_stats_;
  std::atomic<int64_t> bytes_read_{0};
  std::vector<std::thread> threads_;
};

// 1234567 bytes -> "1.23 MB".
std::string with_unit(double value, const char* unit) {
  return format_scaled(value, 1000.0, {"", "K", "M", "G", "T"}, " ", unit);
}

// The progress line of a prepare run (core/status_line.h paces it).
class ProgressLine {
 public:
  ProgressLine(std::ostream* out, bool terminal, int64_t total_bytes)
      : line_(out, terminal), total_bytes_(total_bytes) {}

  void update(int64_t bytes_read, int64_t documents, int64_t tokens, bool force = false) {
    if (!line_.due(force)) return;
    const double elapsed = std::max(1e-9, line_.elapsed_s());
    const double bytes_per_second = static_cast<double>(bytes_read) / elapsed;
    char percent[16] = "";
    if (total_bytes_ > 0)
      std::snprintf(percent, sizeof percent, " (%.1f%%)",
                    100.0 * static_cast<double>(bytes_read) / static_cast<double>(total_bytes_));
    std::string line = "prepare: " + with_unit(static_cast<double>(bytes_read), "B") + " / " +
                       with_unit(static_cast<double>(total_bytes_), "B") + percent + " | " +
                       std::to_string(documents) + " docs | " + with_unit(static_cast<double>(tokens), "tokens") +
                       " | " + with_unit(static_cast<double>(tokens) / elapsed, "tok/s") + " | " +
                       with_unit(bytes_per_second, "B/s");
    if (bytes_per_second > 0 && bytes_read < total_bytes_)
      line += " | ETA " + format_duration(static_cast<double>(total_bytes_ - bytes_read) / bytes_per_second);
    line_.show(line);
  }

  void end_line() { line_.end_line(); }

  double elapsed() const { return line_.elapsed_s(); }

 private:
  StatusLine line_;
  int64_t total_bytes_;
};

struct SplitCounts {
  int64_t bytes = 0, words = 0;
};

void check_options(const PrepareOptions& options) {
  HGRN_CHECK(!options.inputs.empty(), "prepare: no input files (pass --input FILE...)");
  HGRN_CHECK(!options.output_prefix.empty(), "prepare: the output prefix is empty (pass --output PREFIX)");
  HGRN_CHECK(options.valid_fraction >= 0.0 && options.valid_fraction < 1.0,
             "prepare: --valid-fraction must be in [0, 1), got ", options.valid_fraction);
  HGRN_CHECK(options.threads >= 0 && options.threads <= kMaxPrepareThreads, "prepare: --threads must be in [0, ",
             kMaxPrepareThreads, "] (0: one per core), got ", options.threads);
}

// What a killed earlier prepare left next to the outputs, removed before this run writes there.
void remove_stale_outputs(const std::vector<std::string>& prefixes, std::ostream* progress) {
  for (const std::string& prefix : prefixes)
    for (const std::string& path : {shard_bin_path(prefix), shard_idx_path(prefix), shard_json_path(prefix)})
      for (const std::string& stale : remove_stale_temporaries(path))
        if (progress != nullptr) *progress << "note: removed " << stale << ", left by a prepare that was killed\n";
}

}  // namespace

bool document_goes_to_valid(uint64_t index, double valid_fraction, uint64_t seed) {
  if (valid_fraction <= 0.0) return false;
  const auto block = philox4x32_10(
      {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0x5b117u, 0xd0c5u},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t bits = ((static_cast<uint64_t>(block[0]) << 32) | block[1]) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53 < valid_fraction;
}

PrepareResult prepare_corpus(const PrepareOptions& options) {
  check_options(options);
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);
  CorpusOptions corpus_options;
  corpus_options.skip_bad = options.skip_bad;
  corpus_options.pile_subsets = options.pile_subsets;
  const std::unique_ptr<DocumentReader> reader = open_corpus(options.corpus, options.inputs, corpus_options);

  PrepareResult result;
  const bool with_valid = options.valid_fraction > 0.0;
  HGRN_CHECK(!options.split.empty() && options.split.find('/') == std::string::npos,
             "prepare: --split must be a plain name such as train, valid or test, got '", options.split, "'");
  HGRN_CHECK(!(with_valid && options.split == "valid"),
             "prepare: --split valid with --valid-fraction would write two shards named PREFIX_valid");
  result.train_prefix = options.output_prefix + "_" + options.split;
  if (with_valid) result.valid_prefix = options.output_prefix + "_valid";
  std::vector<std::string> prefixes = {result.train_prefix};
  if (with_valid) prefixes.push_back(result.valid_prefix);
  remove_stale_outputs(prefixes, options.progress);
  for (const std::string& prefix : prefixes) require_shard_replaceable(prefix, options.force);
  // Writers before the pipeline: on an error the pipeline's threads are joined first, then the writers remove
  // their temporary files.
  TokenShardWriter train_writer(result.train_prefix, tokenizer->vocab_size());
  std::optional<TokenShardWriter> valid_writer;
  if (with_valid) valid_writer.emplace(result.valid_prefix, tokenizer->vocab_size());

  int64_t workers = options.threads;
  if (workers == 0) workers = std::max<int64_t>(1, std::thread::hardware_concurrency());
  ProgressLine progress(options.progress, options.progress_is_terminal, reader->total_bytes());
  SplitCounts train_counts, valid_counts;
  int64_t documents = 0, tokens = 0;
  CorpusStats stats;
  {
    std::optional<Pipeline> started;
    try {
      started.emplace(*reader, *tokenizer, workers);
    } catch (const std::system_error& error) {
      throw Error(detail::concat("prepare: cannot start ", workers, " tokenising threads: ", error.what(),
                                 "; pass a smaller --threads (0: one per core)"));
    }
    Pipeline& pipeline = *started;
    TokenizedBatch batch;
    for (;;) {
      const Pipeline::Poll poll = pipeline.poll(batch, std::chrono::milliseconds(100));
      if (poll == Pipeline::Poll::kEnd) break;
      if (poll == Pipeline::Poll::kBatch) {
        const int32_t* ids = batch.ids.data();
        for (size_t d = 0; d < batch.lengths.size(); ++d) {
          const bool to_valid =
              with_valid && document_goes_to_valid(batch.first_document + d, options.valid_fraction, options.seed);
          (to_valid ? *valid_writer : train_writer).append_document(ids, batch.lengths[d]);
          SplitCounts& counts = to_valid ? valid_counts : train_counts;
          counts.bytes += batch.bytes[d];
          counts.words += batch.words[d];
          ids += batch.lengths[d];
        }
        documents += static_cast<int64_t>(batch.lengths.size());
        tokens += static_cast<int64_t>(batch.ids.size());
      }
      progress.update(pipeline.bytes_read(), documents, tokens);
    }
    progress.update(pipeline.bytes_read(), documents, tokens, /*force=*/true);
    progress.end_line();
    stats = pipeline.final_stats();
  }
  HGRN_CHECK(documents > 0, "prepare: the input holds no documents to write (", stats.skipped_empty, " empty, ",
             stats.skipped_malformed, " malformed, ", stats.skipped_non_utf8, " not UTF-8, ", stats.filtered_out,
             " filtered out by --pile-subsets)");
  HGRN_CHECK(train_writer.documents() > 0, "prepare: the ", options.split, " split would be empty: all ", documents,
             " documents went to ", result.valid_prefix, " with --valid-fraction ", options.valid_fraction,
             "; use a smaller --valid-fraction (nothing was written)");

  ShardMetadata base;
  base.tokenizer = tokenizer->name();
  base.vocab_size = tokenizer->vocab_size();
  base.eos_id = tokenizer->eos_id();
  base.corpus = options.corpus;
  base.input_files = options.inputs;
  base.skipped_malformed = stats.skipped_malformed;
  base.skipped_non_utf8 = stats.skipped_non_utf8;
  base.skipped_empty = stats.skipped_empty;
  base.filtered_out = stats.filtered_out;
  base.valid_fraction = options.valid_fraction;
  base.split_seed = options.seed;
  base.hgrn_version = std::string(HGRN_VERSION) + " (git " + HGRN_GIT_COMMIT + ")";

  auto finish_split = [&](TokenShardWriter& writer, const char* split, const SplitCounts& counts) {
    ShardMetadata metadata = base;
    metadata.split = split;
    metadata.bytes = counts.bytes;
    metadata.words = counts.words;
    writer.finish(metadata);
    metadata.documents = writer.documents();
    metadata.tokens = writer.tokens();
    metadata.dtype = token_dtype_name(writer.dtype());
    return metadata;
  };
  // The validation shard first: the training shard is the one later steps look for, so it appears last.
  if (valid_writer) result.valid = finish_split(*valid_writer, "valid", valid_counts);
  result.train = finish_split(train_writer, options.split.c_str(), train_counts);
  result.seconds = progress.elapsed();

  if (options.progress != nullptr) {
    std::ostream& out = *options.progress;
    const double seconds = std::max(result.seconds, 1e-9);
    out << "prepare: done in " << format_duration(result.seconds) << " (" << workers << " tokenising thread"
        << (workers == 1 ? "" : "s") << "): " << documents << " documents, " << tokens << " tokens, "
        << with_unit(static_cast<double>(stats.bytes), "B") << " of text ("
        << with_unit(static_cast<double>(tokens) / seconds, "tokens/s") << ", "
        << with_unit(static_cast<double>(reader->total_bytes()) / seconds, "B/s") << ")\n";
    auto split_line = [&](const char* name, const ShardMetadata& m, const std::string& prefix) {
      out << "  " << name << ": " << m.documents << " documents, " << m.tokens << " tokens (" << m.dtype << ") -> "
          << prefix << ".{bin,idx,json}\n";
    };
    split_line(options.split.c_str(), result.train, result.train_prefix);
    if (result.valid) {
      split_line("valid", *result.valid, result.valid_prefix);
      if (result.valid->documents == 0)
        out << "  warning: the validation split is empty (" << documents << " documents x valid fraction "
            << options.valid_fraction << "); use a larger --valid-fraction or a separate validation file\n";
    }
    out << "  skipped: " << stats.skipped_malformed << " malformed, " << stats.skipped_non_utf8 << " not UTF-8, "
        << stats.skipped_empty << " empty; " << stats.filtered_out << " filtered out by --pile-subsets\n"
        << std::flush;
  }
  return result;
}

}  // namespace hgrn
