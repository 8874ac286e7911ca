// trainer.h: `hgrn train`: the training loop for a resolved config.
#pragma once
#include <cstdint>
#include <memory>
#include <ostream>
#include <vector>

#include "config/config.h"
#include "data/batch_source.h"
#include "dist/data_parallel.h"
#include "models/registry.h"
#include "ops/fp8_linear.h"
#include "train/carried_states.h"
#include "train/optimizer.h"

namespace hgrn {

struct TrainingSummary {
  int64_t steps = 0;
  int64_t tokens_seen = 0;
  double first_loss = 0;      // training loss of the first step
  double final_loss = 0;      // mean training loss over the last logging interval
  double eval_loss = 0;       // held-out loss and accuracy after the last step
  double eval_accuracy = 0;
  bool evaluated = false;     // whether eval_loss and eval_accuracy were measured (not without held-out data)
  double chance_accuracy = 0; // what guessing would score on the task
  double wall_s = 0;
  std::vector<double> step_losses;  // the training loss of every step this run took, in order
  int64_t nonfinite_steps = 0;      // steps skipped for a non-finite loss or gradient norm
  bool stopped_by_signal = false;   // SIGTERM/SIGINT: stopped early after writing a checkpoint
};

// One optimiser step: grad_accum_steps micro-batches (forward, loss, backward into the accumulated gradients), global
// gradient clipping, the AdamW update at lr. The training loop and `hgrn bench` both run exactly this.
struct StepResult {
  double loss = 0;  // mean over the micro-batches' mean losses
  int64_t targets = 0, correct = 0;
  double grad_norm = 0;  // before clipping
};
// The model (initialised on the CPU from init_seed, so the same weights on any device, then moved to `device` with
// `activation_dtype` activations), with several ranks its data parallelism (gradient reduction, ZeRO-1), and its
// AdamW, set up from the training config the way a run uses them (recomputation, GEMM autotuning per
// training.deterministic), and with data.stateful the states its batch rows carry from step to step: what
// `hgrn train` and `hgrn bench` share.
struct TrainingModel {
  TrainingModel(const Config& config, uint64_t init_seed, Device device, DType activation_dtype);
  std::unique_ptr<CausalLM> owned_model;
  CausalLM& model;
  std::unique_ptr<DataParallel> data_parallel;  // null for a single process
  AdamW optimizer;
  std::unique_ptr<CarriedStates> carried_states;  // data.stateful (train/carried_states.h); null otherwise
  std::unique_ptr<Fp8LinearScope> fp8;            // training.precision fp8 (ops/fp8_linear.h); null otherwise
};

// One optimiser step over tc.grad_accum_steps micro-batches. On return the gradients are already marked zero for the
// next step (AdamW::zero_grad).
StepResult training_step(TrainingModel& setup, BatchSource& data, const TrainingConfig& tc, double lr);

// The compute device a training.device setting resolves to (auto: the GPU when one is visible) and the activation
// dtype of a training.precision on that device (fp8: bf16 activations, FP8 linear layers); both throw a clear Error for an impossible combination. With
// several ranks on the GPU, resolve_device also binds this process to its GPU (its rank on the node).
Device resolve_device(const std::string& device);
DType activation_dtype(const std::string& precision, Device device);

// The data parallelism training.zero1 and training.grad_reduce_dtype ask for.
DataParallelOptions data_parallel_options(const TrainingConfig& tc);

// The seed of the held-out MQAR stream a run with this training.seed evaluates on (its evaluations and `hgrn eval`).
uint64_t evaluation_data_seed(uint64_t seed);

struct TrainOptions {
  bool allow_config_change = false;  // resume even when keys that change what is trained differ from the checkpoint's
};

// Trains the model the config describes, writing progress to `log` and metrics/config into logging.run_dir (which
// it locks for the run: a second trainer on the same directory is refused).
TrainingSummary train(const Config& config, std::ostream& log, const TrainOptions& options = {});

// `hgrn train`: train() with progress on stdout and the stop-signal handlers installed; returns the process exit
// status: 0 when max_steps were reached, kExitStoppedBySignal (75) after a graceful stop on SIGTERM/SIGINT.
int run_training(const Config& config, const TrainOptions& options = {});

}  // namespace hgrn
