// config.h: the resolved run configuration (model, data, training, checkpoint, logging sections of the YAML file).
// Model keys follow the Hugging Face / fla HGRN2Config names. Defaults here are the ones a config may leave out.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/check.h"

namespace hgrn {

// A config that cannot be used (bad file, unknown key, wrong type, impossible value). The CLI exits with status 2
// for these and 1 for other errors, so scripts can tell a mistyped config from a failed run.
struct ConfigError : Error {
  using Error::Error;
};

// How a model trades memory for time in training: which activations the backward gets by running forward work again
// instead of keeping them. Every setting computes the same bits; only memory and speed change.
struct ModelMemoryConfig {
  bool recompute = false;          // recompute each token mixer and MLP in the backward instead of keeping activations
  bool recompute_elementwise = true;  // recompute the gates', norms' and SwiGLU's outputs in the backward (cheap work)
                                      // instead of keeping them
  int64_t keep_elementwise_layers = 0;  // with recompute_elementwise: the first N layers keep those outputs anyway
  bool recompute_mlp_projections = false;  // recompute the MLP's gate and up projections (its widest kept activations)
                                           // in the backward from the block's normalised input: two more GEMMs
  bool recompute_gates = true;     // with recompute_elementwise, also the gates' outputs (false keeps them)
  bool recompute_weight_copies = false;  // bf16: drop the layers' bf16 weight copies between forward and backward
  int64_t recompute_gates_layers = 0;  // with recompute_gates false: the last N layers recompute their gates anyway
  int64_t keep_recurrence_states = 0;  // hgrn2 on the GPU: the first N layers keep the recurrence's per-chunk states
                                       // for the backward instead of recomputing them (B·H·T/64·K·V values a layer)

  bool operator==(const ModelMemoryConfig&) const = default;
};

struct ModelConfig {
  std::string type = "hgrn2";  // the family member (fla's model_type): hgrn2 | hgrn (HGRN1) | gla | retnet; models/registry.h
  int64_t hidden_size = 64;
  int64_t num_hidden_layers = 2;
  std::optional<int64_t> expand_ratio;  // K, the key/forget width per head; fla: if set, H = hidden_size / expand_ratio
  std::optional<int64_t> num_heads;     // if only this is set, expand_ratio = hidden_size / num_heads
  std::optional<double> expand_k;       // gla, retnet: all heads' key width = hidden_size · expand_k (null: fla's default)
  std::optional<double> expand_v;       // gla, retnet: all heads' value width = hidden_size · expand_v (null: fla's default)
  int64_t vocab_size = 256;
  int64_t hidden_ratio = 4;
  std::optional<int64_t> intermediate_size;  // default: 256·ceil(floor(D·hidden_ratio·2/3) / 256), as fla
  bool use_lower_bound = true;
  double norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  std::string attn_mode = "chunk";  // chunk (chunkwise, the training path) | fused_recurrent (step by step)
  bool complex = false;  // hgrn only: the HGRN1 paper's complex-valued HGRU in place of fla's real one
  ModelMemoryConfig memory;

  // HGRN2's sizes, derived from the fields above by fla's HGRN2Config rules (expand_ratio wins when both are set); throw ConfigError
  // when neither expand_ratio nor num_heads is set. parse_config has already checked that the sizes divide.
  int64_t heads() const;          // H
  int64_t key_dim() const;        // K = expand_ratio
  int64_t value_dim() const;      // V = hidden_size / H
  int64_t mlp_size() const;       // I

  bool operator==(const ModelConfig&) const = default;
};

// The synthetic Multi-Query Associative Recall task (HGRN2 paper, section 4.1; Zoology's MQAR): a sequence of
// key-value pairs, then queries of those keys; the model must emit each queried key's value.
// The largest data.mqar.num_train_sequences: a fixed set's sequence numbers fit 32 bits.
constexpr int64_t kMqarMaxTrainSequences = int64_t{1} << 31;

struct MqarConfig {
  int64_t num_kv_pairs = 8;
  int64_t num_keys = 0;    // 0: (vocab_size - 1) / 2 token ids for keys, the rest for values (token 0 = noise)
  std::string query_placement = "uniform";  // uniform (hgrn's layout) | power_law (Zoology's; data/mqar.h)
  double power_a = 0.01;   // power_law: a query's gap g after the pairs has weight (g + 1)^(power_a - 1)
  std::string filler = "zero";  // zero: token 0 | random: uniform over the whole vocabulary (Zoology's default)
  int64_t num_train_sequences = 0;  // training only: > 0 cycles over this many fixed sequences, reshuffled each
                                    // epoch (Zoology's fixed training set); 0: a fresh sequence every draw

  bool operator==(const MqarConfig&) const = default;
};

struct DataConfig {
  std::string task = "mqar";  // mqar (built in, needs no download) | tokens (shards written by `hgrn prepare`)
  int64_t seq_len = 64;
  std::string train_data;     // tokens: the path prefix of the training shards (PREFIX.bin, PREFIX.idx, PREFIX.json)
  std::string valid_data;     // tokens: the path prefix of the validation shards (empty: no validation split)
  bool shuffle = true;        // tokens: each epoch's windows in a shuffled order; false: in shard order
  bool stateful = false;      // tokens: each batch row reads one contiguous stream and carries its recurrent state
                              // from window to window (truncated BPTT; data/token_streams.h, train/carried_states.h)
  bool reset_state_at_document = false;  // tokens: restart the recurrent state at every document start (after an EOS)
  MqarConfig mqar;

  bool operator==(const DataConfig&) const = default;
};

struct TrainingConfig;
// The training settings a run of `world_size` ranks uses: grad_accum_steps derived from global_batch_size when that
// is set (an Error when it does not split into micro_batch_size x ranks x steps).
TrainingConfig resolve_batch_for_world(const TrainingConfig& training, int64_t world_size);

struct TrainingConfig {
  std::string device = "auto";     // auto | cpu | cuda
  std::string precision = "fp32";  // fp32 | bf16 | fp8 (bf16 and fp8 need cuda; fp8 FP8 tensor cores: sm_89+)
  bool fp8_lm_head = false;        // fp8: the LM head's GEMMs in FP8 too (an untied head); false keeps it in bf16
  uint64_t seed = 1234;
  int64_t micro_batch_size = 32;
  int64_t grad_accum_steps = 1;
  int64_t global_batch_size = 0;   // sequences per optimiser step over all ranks (0: micro x accum x ranks);
                                   // when set, grad_accum_steps is derived from it and the number of ranks
  int64_t max_steps = 1000;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;       // the schedule's floor, as a fraction of lr
  std::string schedule = "cosine"; // cosine | linear | inverse_sqrt | constant | wsd
  int64_t warmup_steps = 100;
  double decay_fraction = 0.2;     // wsd: the last fraction of steps that decays
  double weight_decay = 0.1;
  bool decay_embeddings = false;   // embeddings (and a tied lm_head) in the decayed group?
  bool deterministic = true;       // GPU: bitwise-reproducible runs (no GEMM autotuning); false is faster
  bool zero1 = false;              // several ranks: shard the optimiser moments across them (ZeRO-1)
  bool overlap_reductions = true;  // several ranks: reduce each layer's gradients during the backward (false: all
                                   // after it, with the whole GPU, none beside the backward's kernels)
  std::string grad_reduce_dtype = "fp32";  // several ranks: fp32 | bf16, the dtype the gradients are summed in
                                           // across ranks (bf16 halves the bytes sent, rounding each addend and sum)
  double collective_timeout_s = 600;  // several ranks: seconds a wait on the other ranks (MPI, NCCL) may last before
                                      // this rank stops with an error (a peer died or hangs); leave room for rank
                                      // 0's checkpoint writes and evaluations, which the others wait for
  double beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  double grad_clip = 1.0;          // global gradient-norm clip; 0 disables
  int64_t max_nonfinite_steps = 5; // a step whose loss or gradient norm is NaN/inf is skipped (weights and optimiser
                                   // untouched); this many in a row stop the run as diverged
  int64_t threads = 0;             // CPU threads (0: all cores, shared out among the ranks on a node)
  int64_t eval_interval = 100;     // steps between evaluations; 0 disables
  int64_t eval_batches = 4;

  bool operator==(const TrainingConfig&) const = default;
};

struct CheckpointConfig {
  int64_t interval = 0;   // steps between checkpoints; 0: only at the end
  int64_t keep_last = 3;
  int64_t keep_every = 0; // additionally keep every N-th step's checkpoint; 0: none
  std::string resume = "auto";  // auto | never | PATH
  std::string init_from;        // a Hugging Face HGRN2 directory (config.json + safetensors) whose weights start a new
                                // run (ignored when the run resumes from a checkpoint); empty: fla's initialisation

  bool operator==(const CheckpointConfig&) const = default;
};

struct LoggingConfig {
  std::string run_dir = "runs/default";   // metrics, checkpoints and the resolved config go here
  int64_t log_interval = 10;              // steps between progress lines
  std::string metrics_file = "metrics.jsonl";  // inside run_dir, one JSON object per logged step

  bool operator==(const LoggingConfig&) const = default;
};

struct Config {
  std::string source;  // the file it came from (for messages)
  std::vector<std::string> notes;  // adjustments made while resolving (e.g. a warm-up cut to fit max_steps)
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  CheckpointConfig checkpoint;
  LoggingConfig logging;

  // The settings only: where they came from and the notes do not make two configs differ.
  bool operator==(const Config& o) const {
    return model == o.model && data == o.data && training == o.training && checkpoint == o.checkpoint &&
           logging == o.logging;
  }
};

// What a model family's own checks (models/registry.h: ModelFamily::validate) report through: a failure names the
// key and where it was set, as every other config error does.
class ConfigChecker {
 public:
  virtual ~ConfigChecker() = default;
  [[noreturn]] virtual void fail_key(const std::string& key, const std::string& problem) const = 0;
  virtual bool is_set(const std::string& key) const = 0;  // set by the file or a --set (not a default)
};

// Loads a YAML file, applies `section.key=value` overrides (as from --set), validates everything and returns the
// resolved config. Throws hgrn::Error naming the file, the key and what was expected.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from YAML text (`source_name` stands in for the file name in messages).
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});
// A checkpoint's stored config, which an earlier hgrn may have written: keys that have moved since (the memory knobs,
// once training.*) are read at their new place instead of refused.
Config parse_stored_config(const std::string& yaml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides = {});
// Checks a config built in code (tests, tools) by the same rules as parse_config; throws ConfigError naming the key.
void validate_config(const Config& config);
// MQAR token ids: 0 is noise, 1..keys are keys, the remaining ids up to vocab_size - 1 are values.
int64_t mqar_key_count(const Config& config);
int64_t mqar_value_count(const Config& config);
// The resolved config as YAML (every key, defaults included), for the run directory and the printout.
std::string config_to_yaml(const Config& config);

// A key whose value differs between two configs, as config_to_yaml writes the values.
struct ConfigChange {
  std::string key, before, after;
};
// The keys whose values differ from `before_yaml` (a stored config, e.g. a checkpoint's, read as
// parse_stored_config reads it but not validated: its data paths need not exist any more) to `after`, in file order.
std::vector<ConfigChange> config_changes(const std::string& before_yaml, const std::string& before_source,
                                         const Config& after);

}  // namespace hgrn
