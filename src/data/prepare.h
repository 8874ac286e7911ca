// prepare.h: turning a corpus into token shards (`hgrn prepare`): read documents, tokenise them in parallel, append
// the EOS token to each, and write them in their original order to PREFIX_train (and PREFIX_valid) in Megatron's
// indexed format with a JSON sidecar (data/token_shards.h).
//
// Pipeline: one reader thread pulls documents from the DocumentReader and groups them into batches of about
// 256 KiB of text; a pool of worker threads tokenises whole batches (Tokenizer::encode is const and thread-safe);
// the calling thread writes finished batches strictly in batch order. Batches are formed from the documents alone
// and written in order, so the shards are byte-identical whatever the thread count. At most a few batches per worker
// are in flight, so memory stays bounded on corpora of any size.
//
// Train/valid split: document i (0-based, in reading order, counting only documents the reader returns) goes to the
// validation shard when a Philox hash of (i, seed) maps below valid_fraction: deterministic, independent of threads
// and batches, and each document lands in exactly one split.
#pragma once
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "data/token_shards.h"

namespace hgrn {

// The most tokenising threads prepare starts: more only fails to start or fights over the cores.
inline constexpr int64_t kMaxPrepareThreads = 1024;

struct PrepareOptions {
  std::string corpus;                    // "wikitext" or "pile"
  std::vector<std::string> inputs;       // read in this order
  std::string tokenizer = "byte";        // "byte" or a tokenizer.json path
  std::string output_prefix;             // writes output_prefix + "_" + split (and output_prefix + "_valid")
  std::string split = "train";           // the name of the main output: train, or valid/test for a corpus whose
                                         // splits come as separate files (WikiText)
  double valid_fraction = 0.0;           // in [0, 1); 0 writes no validation shard
  uint64_t seed = 1234;                  // of the train/valid split
  int64_t threads = 0;                   // tokenising workers in [0, kMaxPrepareThreads]; 0: one per core
  bool force = false;                    // replace an earlier shard at the output prefix
  bool skip_bad = false;                 // skip and count bad records instead of failing
  std::vector<std::string> pile_subsets; // keep only these Pile subsets (empty: all)
  std::ostream* progress = nullptr;      // progress line and summary (nullptr: silent)
  bool progress_is_terminal = false;     // redraw one line with '\r' (else print a line every few seconds)
};

struct PrepareResult {
  std::string train_prefix;
  ShardMetadata train;
  std::string valid_prefix;              // empty without a validation split
  std::optional<ShardMetadata> valid;
  double seconds = 0.0;
};

// Throws hgrn::Error (naming the file, line or option) on bad options, unreadable or bad input, an output that
// exists (without force) or is not an earlier shard, an empty training split, a tokeniser failure or a write
// failure; nothing is committed then, and earlier shards under the same prefix are kept. Temporary files that a
// killed earlier prepare left next to the outputs are removed first, with a note on `progress`.
PrepareResult prepare_corpus(const PrepareOptions& options);

// Whether document `index` belongs to the validation split (see above).
bool document_goes_to_valid(uint64_t index, double valid_fraction, uint64_t seed);

}  // namespace hgrn
