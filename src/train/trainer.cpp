// trainer.cpp: the training loop. Reads top to bottom: set-up, then per step: learning rate, micro-batches
// (forward, loss, backward into accumulated gradients), clip, AdamW update, progress and metrics, evaluation.
#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/allocator.h"
#include "core/format.h"
#include "core/trace.h"
#include "dist/world.h"
#include "data/data_sources.h"
#include "data/mqar.h"
#include "data/token_streams.h"
#include "io/checkpoint.h"
#include "io/hf_export.h"
#include "models/cost.h"
#include "models/registry.h"
#include "ops/gemm_cpu.h"
#include "train/evaluate.h"
#include "train/lm_loss.h"
#include "train/memory_fit.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/resume_config.h"
#include "train/run_lock.h"
#include "train/schedule.h"
#include "train/stop_signal.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/gemm.h"
#endif

namespace hgrn {

namespace {

// Independent random streams derived from the one configured seed.
enum RngStream : uint64_t { kInitStream = 0, kTrainDataStream = 1, kEvalDataStream = 2 };

uint64_t stream_seed(uint64_t seed, RngStream stream) { return Rng(seed).fork(stream).next_u64(); }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// `adam_m`/`adam_v`: the optimiser moments, whole and on the CPU (DataParallel::gather_moments).
// `recurrent_states`: data.stateful's carried states, gathered (CarriedStates::gather); empty otherwise.
TrainingState capture_state(const CausalLM& model, std::vector<Tensor> adam_m, std::vector<Tensor> adam_v,
                            const AdamW& optimizer, const BatchSource& data, const Config& config, int64_t step,
                            int64_t tokens_seen, std::vector<Tensor> recurrent_states) {
  TrainingState s;
  s.step = step;
  s.tokens_seen = tokens_seen;
  s.world_size = world().size;
  s.data_cursor = data.cursor();
  // Every random stream of a run (initialisation, training data, evaluation data) is derived from the seed by
  // counter-based forks, and the data stream's position is data_cursor: the seed is the whole RNG state to keep.
  s.rng = RngState{config.training.seed, 0};
  // Checkpoints are written from host copies (on the CPU these are the tensors themselves).
  for (const auto& [spec, var] : model.parameters()) s.params.emplace_back(spec.name, on_device(var->value, Device::CPU));
  s.adam_m = std::move(adam_m);
  s.adam_v = std::move(adam_v);
  s.adam_step = optimizer.step_count();
  s.recurrent_states = std::move(recurrent_states);
  s.config_yaml = config_to_yaml(config);
  s.model_signature = model_signature(config.model);
  s.hgrn_version = HGRN_VERSION;
  s.git_commit = HGRN_GIT_COMMIT;
  return s;
}

// The checkpoint to continue from, per checkpoint.resume: auto (newest valid one in the run's checkpoint
// directory, if any), never (none; refuses to start over a directory that holds checkpoints) or a path.
std::optional<std::string> checkpoint_to_resume(const Config& config, const std::string& dir, std::ostream& log) {
  const std::string& resume = config.checkpoint.resume;
  if (resume == "auto") return find_checkpoint_to_resume(dir, log);
  if (resume == "never") {
    std::ostringstream ignored;
    HGRN_CHECK(!find_latest_valid_checkpoint(dir, ignored), "checkpoint.resume is never, but ", dir,
               " already holds checkpoints that a new run would overwrite: choose another logging.run_dir, delete "
               "them, or resume with checkpoint.resume: auto");
    return std::nullopt;
  }
  return resume;
}

}  // namespace

// auto: the GPU when there is one. cuda: a GPU or a clear error.
Device resolve_device(const std::string& device) {
  if (device == "cpu") return Device::CPU;
  if (cuda_available()) {
    const World& w = world();
    if (w.size > 1) {
      const int gpus = cuda_device_count();
      HGRN_CHECK(w.local_size <= gpus, w.local_size, " processes on this node share ", gpus, " visible GPU(s): "
                 "launch at most one process per GPU (mpirun -np ", gpus, " on one node), or set training.device: cpu");
      cuda_use_device(w.local_rank);
    }
    return Device::CUDA;
  }
  HGRN_CHECK(device == "auto", "training.device is cuda, but ",
#ifdef HGRN_WITH_CUDA
             "no CUDA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
#else
             "this hgrn was built without CUDA (rebuild where nvcc is found, or -DHGRN_CUDA=ON)",
#endif
             "; or set training.device: cpu");
  return Device::CPU;
}

DataParallelOptions data_parallel_options(const TrainingConfig& tc) {
  return {tc.zero1, tc.grad_reduce_dtype == "bf16" ? DType::BF16 : DType::F32, tc.overlap_reductions};
}

// fp32, or bf16 activations with fp32 master weights (GPU only).
uint64_t evaluation_data_seed(uint64_t seed) { return stream_seed(seed, kEvalDataStream); }

DType activation_dtype(const std::string& precision, Device device) {
  if (precision == "fp32") return DType::F32;
  HGRN_CHECK(device == Device::CUDA, "training.precision is ", precision,
             ", but training runs on the CPU (no GPU found): ", precision,
             " training needs a GPU; set training.precision: fp32");
  return DType::BF16;
}

namespace {
// training.precision fp8: the model's projections on FP8 tensor cores; the LM head (and the embeddings where tied
// to it) stay in bf16, as Transformer Engine's recipes keep the output layer, unless training.fp8_lm_head.
std::unique_ptr<Fp8LinearScope> fp8_linear_scope(const CausalLM& model, bool fp8_lm_head) {
  std::vector<Var> excluded;
  for (const auto& [spec, param] : model.parameters())
    if ((param->name == "lm_head.weight" && !fp8_lm_head) || param->name == "model.embeddings.weight")
      excluded.push_back(param);
  return std::make_unique<Fp8LinearScope>(Fp8Recipe{}, static_cast<int64_t>(model.parameters().size()), excluded);
}

std::unique_ptr<CausalLM> make_model(const Config& config, uint64_t init_seed, Device device,
                                     DType activation_dtype) {
  Rng init_rng(init_seed);
  std::unique_ptr<CausalLM> model = create_model(config.model, init_rng, DType::F32);
  model->to_device(device, activation_dtype);
#ifdef HGRN_WITH_CUDA
  set_gemm_autotune(device == Device::CUDA && !config.training.deterministic);
#endif
  return model;
}

// The model's parameters in order (the indices fp8_scaling_save records).
std::vector<Var> parameter_vars(const CausalLM& model) {
  std::vector<Var> vars;
  for (const auto& [spec, param] : model.parameters()) vars.push_back(param);
  return vars;
}
}  // namespace

TrainingModel::TrainingModel(const Config& config, uint64_t init_seed, Device device, DType activation_dtype)
    : owned_model(make_model(config, init_seed, device, activation_dtype)),
      model(*owned_model),
      data_parallel(world().size > 1 ? std::make_unique<DataParallel>(
                                           model, make_param_groups(model.parameters(), config.training.decay_embeddings),
                                           data_parallel_options(config.training))
                                     : nullptr),
      optimizer(data_parallel ? data_parallel->optimizer_params()
                              : make_param_groups(model.parameters(), config.training.decay_embeddings),
                AdamWConfig{config.training.beta1, config.training.beta2, config.training.adam_eps,
                            config.training.weight_decay}) {
  if (config.data.stateful) {
    const TrainingConfig tc = resolve_batch_for_world(config.training, world().size);
    carried_states = std::make_unique<CarriedStates>(model, tc.micro_batch_size, tc.grad_accum_steps);
  }
  if (config.training.precision == "fp8") {
    fp8 = fp8_linear_scope(model, config.training.fp8_lm_head);
    // Several ranks: every amax a scale comes from is the maximum over the ranks, so that all derive the same scales.
    if (DataParallel* dp = data_parallel.get())
      fp8_set_amax_reduction([dp](float* amax, int64_t count) { dp->all_reduce_max(amax, count, "fp8 amax reduction"); });
  }
}

StepResult training_step(TrainingModel& setup, BatchSource& data, const TrainingConfig& tc, double lr) {
  StepResult r;
  AdamW& optimizer = setup.optimizer;
  DataParallel* dp = setup.data_parallel.get();
  optimizer.zero_grad();
  std::vector<Tensor> losses;
  for (int64_t micro = 0; micro < tc.grad_accum_steps; ++micro) {
    TraceRange trace("micro-batch " + std::to_string(micro));
    // Several ranks: the last micro-batch's backward reduces each layer's gradients as soon as they are complete.
    if (dp) dp->reduce_in_next_backward(micro + 1 == tc.grad_accum_steps);
    Tape tape;
    // data.stateful: the micro-batch's rows start from the states they carried out of the previous step.
    std::vector<Var>* states =
        setup.carried_states ? setup.carried_states->begin(micro, data.next_batch_continues_streams()) : nullptr;
    CrossEntropyResult ce = language_model_loss(setup.model, tape, data.next_batch(tc.micro_batch_size), states);
    // Each micro-batch loss is a mean; the step's loss is their average, so each seeds 1/accum.
    // With N ranks each seed is also divided by N, so that summing the ranks' gradients gives the global mean.
    const double seed = 1.0 / static_cast<double>(tc.grad_accum_steps * world().size);
    tape.backward(ce.loss, on_device(Tensor::full({}, seed, DType::F32), setup.model.device()));
    if (states) setup.carried_states->end(micro);
    losses.push_back(ce.loss->value);
    r.targets += ce.num_targets;
    r.correct += ce.num_correct;
  }
  // The losses are read (a wait for the device) once the optimiser's work is queued too, so that the GPU goes from
  // the backward into the update without waiting for the host; with several ranks they are summed over the ranks
  // before that.
  const auto read_losses = [&] {
    for (const Tensor& loss : losses) r.loss += loss.item() / static_cast<double>(tc.grad_accum_steps);
  };
  if (dp) {
    read_losses();
    TraceRange trace("gradient reduction");
    dp->finish_gradient_reduction();
    std::vector<double> totals{r.loss, static_cast<double>(r.targets), static_cast<double>(r.correct)};
    allreduce_sum(totals);
    r.loss = totals[0] / world().size;
    r.targets = static_cast<int64_t>(totals[1]);
    r.correct = static_cast<int64_t>(totals[2]);
  }
  std::function<double()> grad_norm;
  {
    TraceRange trace("optimizer");
    // Clipping is folded into the update: the gradients are read once more, not scaled in place first.
    // A non-finite loss skips the update as a non-finite gradient does (every rank sees the same summed loss).
    const std::vector<Tensor> guards = dp ? std::vector<Tensor>{Tensor::full({}, r.loss, DType::F64)} : losses;
    grad_norm = optimizer.clip_and_step(lr, tc.grad_clip, dp ? dp->grad_norm_total() : nullptr, guards);
  }
  // The step's amaxes (the maximum over the ranks) into the histories, new scales for the next step (no-op without
  // fp8).
  fp8_end_step();
  if (dp && dp->zero1()) {
    TraceRange trace("weight all-gather");
    dp->finish_update();  // queued: the next forward waits for each bucket where it reads it
  }
  // The next step's gradients marked zero now, while the GPU runs this step's update (queued before them, it reads
  // the buffers first: one stream): giving the buffers back is host work the GPU would otherwise wait for at the
  // next step's start. The call at the start then finds nothing to do.
  optimizer.zero_grad();
  // The reads that wait for the device come last, once the whole step is queued.
  if (!dp) read_losses();
  r.grad_norm = grad_norm();
  return r;
}

TrainingSummary train(const Config& config, std::ostream& root_log, const TrainOptions& options) {
  // Data parallelism: every rank trains; rank 0 alone prints, writes the run directory and checkpoints.
  const World& w = world();
  const TrainingConfig tc = resolve_batch_for_world(config.training, w.size);
  std::ostringstream discarded;
  std::ostream& log = w.is_root() ? root_log : discarded;
  set_peer_timeout(tc.collective_timeout_s);
  require_same_on_all_ranks("hgrn binary", std::string(HGRN_VERSION) + " " + HGRN_GIT_COMMIT);
  require_same_on_all_ranks("config", config_to_yaml(config));
  const Clock::time_point start = Clock::now();

  // ---- set-up: device, threads, run directory, model, optimiser, data ----
  // auto takes the GPU only for a model that can train there (config validation refuses cuda for one that cannot).
  const std::string no_cuda = model_family(config.model.type).cuda_refusal(config.model);
  if (!no_cuda.empty() && tc.device == "auto") log << "note: training on the CPU: " << no_cuda << "\n";
  const Device device = resolve_device(no_cuda.empty() ? tc.device : "cpu");
  const DType act_dtype = activation_dtype(tc.precision, device);
  // Before the model or the run directory exist.
  require_training_fits(config, device, act_dtype == DType::BF16 ? 2 : 4);
  // Several ranks on a node share its cores: each one spinning up a thread per core would oversubscribe them.
  const int threads = tc.threads > 0 ? static_cast<int>(tc.threads)
                      : w.local_size > 1 && !std::getenv("OMP_NUM_THREADS")
                          ? std::max(1, omp_get_num_procs() / w.local_size)
                                         : 0;
  if (threads > 0) {
    omp_set_num_threads(threads);
    gemm_cpu_set_threads(threads);
  }
  log << "hgrn " << HGRN_VERSION << " (git " << HGRN_GIT_COMMIT << ") training on ";
  double gpu_peak_tflops = 0;  // the measured bf16 GEMM rate: the MFU's denominator
  if (device == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    gpu_peak_tflops = measure_bf16_gemm_tflops();
#endif
    log << "cuda (" << cuda_device_name() << ", measured bf16 GEMM peak " << std::lround(gpu_peak_tflops)
        << " TFLOP/s), " << dtype_name(act_dtype) << " activations, fp32 master weights\n";
  } else {
    log << "cpu with " << omp_get_max_threads() << " threads\n";
  }
  if (w.size > 1) {
    const std::string options = describe(data_parallel_options(tc));
    log << w.size << " data-parallel ranks (" << (device == Device::CUDA ? "NCCL" : "MPI")
        << (options.empty() ? "" : ", " + options) << "); global batch " << w.size << " x " << tc.micro_batch_size
        << " x " << tc.grad_accum_steps << " sequences\n";
  }
  log << "---- resolved config (" << config.source << ") ----\n" << config_to_yaml(config) << "----\n";
  for (const std::string& note : config.notes) log << "note: " << note << "\n";

  // One writer per run directory, before anything in it is read or written: rank 0 (the only rank that writes)
  // holds the lock; the other ranks learn whether it got it, so that a refused run stops on every rank.
  std::optional<RunDirLock> run_lock;
  std::string lock_error;
  if (w.is_root()) {
    try {
      run_lock.emplace(config.logging.run_dir);
    } catch (const Error& error) {
      lock_error = error.what();
    }
  }
  std::vector<double> lock_failed{lock_error.empty() ? 0.0 : 1.0};
  allreduce_sum(lock_failed);
  if (!lock_error.empty()) throw Error(lock_error);
  HGRN_CHECK(lock_failed[0] == 0, "rank 0 could not lock logging.run_dir = ", config.logging.run_dir,
             " (see its message)");

  // The checkpoint to continue from, and whether the config may continue it, before anything is written.
  const std::string checkpoint_dir = config.logging.run_dir + "/checkpoints";
  const std::optional<std::string> resume_path = checkpoint_to_resume(config, checkpoint_dir, log);
  std::optional<TrainingState> resumed;
  std::vector<ConfigChange> config_changes_on_resume;
  if (resume_path) {
    resumed = load_checkpoint(*resume_path);
    check_checkpoint_model(*resumed, model_signature(config.model), *resume_path);
    config_changes_on_resume =
        check_resume_config(resumed->config_yaml, *resume_path, config, options.allow_config_change, log);
  }
  std::optional<MetricsFile> metrics;
  if (w.is_root()) {
    record_run_config(config, resumed ? resumed->step : -1, config_changes_on_resume);
    const std::string metrics_path = config.logging.run_dir + "/" + config.logging.metrics_file;
    // Records of steps after the checkpoint belong to a run that was cut short; resuming recomputes those steps.
    if (resumed) drop_metrics_after(metrics_path, resumed->step);
    metrics.emplace(metrics_path);
    if (resumed) metrics->append_resume(resumed->step, *resume_path);
  }

  const auto setup =
      std::make_unique<TrainingModel>(config, stream_seed(tc.seed, kInitStream), device, act_dtype);
  CausalLM& model = setup->model;
  AdamW& optimizer = setup->optimizer;
  const ModelCost cost = model_cost(config.model, config.data.seq_len);
  log << "model: " << cost.params_total << " parameters, " << cost.flops_per_token_train / 1e6
      << " MFLOP per token (train)\n";
  if (setup->data_parallel && setup->data_parallel->zero1()) {
    int64_t kept = 0;
    for (const ParamRef& ref : optimizer.params()) kept += ref.updated_elements();
    log << "ZeRO-1: rank 0 keeps the AdamW moments of " << kept << " of the " << cost.params_total
        << " parameters\n";
  }

  std::unique_ptr<BatchSource> train_data = make_training_source(config, stream_seed(tc.seed, kTrainDataStream), w.rank, w.size);
  std::unique_ptr<BatchSource> eval_data = make_evaluation_source(config, evaluation_data_seed(tc.seed));
  const std::optional<double> chance = chance_accuracy(config);
  if (config.data.task == "mqar")
    log << "data: MQAR, " << config.data.mqar.num_kv_pairs << " key-value pairs in " << config.data.seq_len
        << " tokens, " << mqar_layout_summary(config.data.mqar) << "; chance accuracy " << *chance << "\n";
  else if (const auto* streams = dynamic_cast<const StreamWindowSampler*>(train_data.get()))
    log << "data: " << streams->layout().streams << " contiguous streams of " << streams->layout().length
        << " tokens from " << config.data.train_data << " (data.stateful: each row carries its recurrent state over "
        << streams->windows_per_stream() << " windows of " << config.data.seq_len << " tokens per epoch"
        << (w.size > 1 ? "; rank r reads streams r*R to r*R + R - 1, R = " +
                             std::to_string(setup->carried_states->rows())
                       : "")
        << ")" << (config.data.reset_state_at_document ? ", the state restarted at each document start" : "")
        << (eval_data ? ", evaluation on " + config.data.valid_data + " in windows" : "") << "\n";
  else
    log << "data: windows of " << config.data.seq_len << " tokens from " << config.data.train_data
        << (config.data.shuffle ? " (shuffled each epoch)" : " (in shard order: data.shuffle false)")
        << (config.data.reset_state_at_document ? ", the state restarted at each document start" : "")
        << (eval_data ? ", evaluation on " + config.data.valid_data : ", no validation split (data.valid_data)")
        << "\n";

  // ---- resume: weights, optimiser moments, step and data cursor from a checkpoint ----
  int64_t start_step = 0, tokens_seen = 0;
  if (resumed) {
    TrainingState& state = *resumed;
    const std::string& path = *resume_path;
    std::vector<std::pair<std::string, Shape>> shapes;
    for (const auto& [spec, var] : model.parameters()) shapes.emplace_back(spec.name, spec.shape);
    check_checkpoint_compatible(state, model_signature(config.model), w.size, shapes, path);
    model.load_parameters(state.params, path);
    optimizer.load_state(std::move(state.adam_m), std::move(state.adam_v), state.adam_step);
    train_data->set_cursor(state.data_cursor);
    if (setup->carried_states) setup->carried_states->restore(state.recurrent_states, path);
    if (setup->fp8) {
      HGRN_CHECK(!state.fp8_scaling.empty(), "checkpoint ", path, " holds no FP8 scaling states (/fp8_scaling): it "
                 "was not written by a training.precision fp8 run; resume it with the precision it was trained in");
      fp8_scaling_restore(state.fp8_scaling, parameter_vars(model), path);
    }
    start_step = state.step;
    tokens_seen = state.tokens_seen;
    log << "resumed from " << path << " at step " << start_step << "\n";
    resumed.reset();  // the weights and moments now live in the model and the optimiser
  } else if (!config.checkpoint.init_from.empty()) {
    // A model made elsewhere (fla, or hgrn's own export) continues training here: same shape, fresh optimiser.
    const std::string& dir = config.checkpoint.init_from;
    const std::string theirs = model_signature(read_hf_config(dir)), ours = model_signature(config.model);
    HGRN_CHECK(theirs == ours, "checkpoint.init_from = ", dir, " holds a model of another shape: it is '", theirs,
               "', the config describes '", ours, "'; make the model section match its config.json");
    model.load_parameters(read_hf_weights(dir, config.model), dir);
    log << "initialised the weights from " << dir << "\n";
  }
  auto save = [&](int64_t steps_done) {
    // The moments, whole, on rank 0 (under ZeRO-1 every rank sends its share); rank 0 alone writes: the ranks
    // hold identical weights.
    std::vector<Tensor> adam_m, adam_v;
    if (setup->data_parallel) setup->data_parallel->wait_for_weights();  // the host copies them below
    if (setup->data_parallel && setup->data_parallel->zero1()) {
      setup->data_parallel->gather_moments(optimizer, &adam_m, &adam_v);
    } else if (w.is_root()) {
      for (const Tensor& m : optimizer.first_moments()) adam_m.push_back(on_device(m, Device::CPU));
      for (const Tensor& v : optimizer.second_moments()) adam_v.push_back(on_device(v, Device::CPU));
    }
    std::vector<Tensor> recurrent_states;  // every rank's, on rank 0
    if (setup->carried_states) recurrent_states = setup->carried_states->gather();
    if (!w.is_root()) return;
    TrainingState state = capture_state(model, std::move(adam_m), std::move(adam_v), optimizer, *train_data, config,
                                        steps_done, tokens_seen, std::move(recurrent_states));
    if (setup->fp8) state.fp8_scaling = fp8_scaling_save(parameter_vars(model));
    const std::string path = save_checkpoint(checkpoint_dir, state);
    prune_checkpoints(checkpoint_dir, config.checkpoint.keep_last, config.checkpoint.keep_every);
    log << "checkpoint " << path << std::endl;
  };
  TrainingSummary summary;
  summary.tokens_seen = tokens_seen;
  summary.chance_accuracy = chance.value_or(0.0);
  const int64_t tokens_per_step = w.size * tc.micro_batch_size * tc.grad_accum_steps * config.data.seq_len;
  const Clock::time_point loop_start = Clock::now();
  Clock::time_point interval_start = loop_start;
  double interval_loss = 0, interval_targets = 0, interval_correct = 0;
  int64_t interval_steps = 0;
  int64_t nonfinite_in_a_row = 0;

  if (start_step >= tc.max_steps)
    log << "the checkpoint is already at training.max_steps = " << tc.max_steps
        << ": nothing to train (raise training.max_steps, or use another logging.run_dir for a new run)\n";

  // ---- the loop ----
  for (int64_t step = start_step; step < tc.max_steps; ++step) {
    const double lr = learning_rate(tc, step);
    const StepResult r = training_step(*setup, *train_data, tc, lr);
    const double step_loss = r.loss, grad_norm = r.grad_norm;
    const int64_t step_targets = r.targets, step_correct = r.correct;

    summary.steps = step + 1;
    tokens_seen += tokens_per_step;
    summary.tokens_seen = tokens_seen;
    if (step == start_step) summary.first_loss = step_loss;
    summary.step_losses.push_back(step_loss);
    // A NaN or inf loss or gradient norm made the optimiser skip the update (weights and moments untouched). Such
    // a step counts as taken (its
    // batch is consumed, as on every rank: the loss and the norm are the same everywhere) but not in the averages.
    if (!std::isfinite(step_loss) || !std::isfinite(grad_norm)) {
      // data.stateful: the step's final states may be non-finite too; its streams go on from zero states.
      if (setup->carried_states) setup->carried_states->reset();
      ++nonfinite_in_a_row;
      ++summary.nonfinite_steps;
      log << "step " << step + 1 << ": non-finite loss " << step_loss << " or gradient norm " << grad_norm
          << ": update skipped (" << nonfinite_in_a_row << " in a row, training.max_nonfinite_steps = "
          << tc.max_nonfinite_steps << ")" << std::endl;
      if (metrics) metrics->append_nonfinite(step + 1, step_loss, grad_norm, nonfinite_in_a_row);
      HGRN_CHECK(nonfinite_in_a_row < tc.max_nonfinite_steps, "training diverged: ", nonfinite_in_a_row,
                 " steps in a row up to step ", step + 1, " had a non-finite loss or gradient norm (training."
                 "max_nonfinite_steps = ", tc.max_nonfinite_steps, "). Lower training.lr (now ", tc.lr,
                 ") or lengthen training.warmup_steps, then resume from the last checkpoint in ", checkpoint_dir,
                 " with --allow-config-change");
    } else {
      nonfinite_in_a_row = 0;
      interval_loss += step_loss;
      interval_targets += static_cast<double>(step_targets);
      interval_correct += static_cast<double>(step_correct);
      ++interval_steps;
    }

    const bool last = step + 1 == tc.max_steps;
    if (((step + 1) % config.logging.log_interval == 0 || last || step == start_step) && interval_steps > 0) {
      device_synchronize();  // the GPU may still run the update: time what was done
      const double elapsed = seconds_since(loop_start);
      const double interval_s = seconds_since(interval_start);
      StepMetrics m;
      m.step = step + 1;
      m.max_steps = tc.max_steps;
      m.loss = interval_loss / static_cast<double>(interval_steps);
      m.accuracy = interval_correct / std::max(interval_targets, 1.0);
      m.grad_norm = grad_norm;
      m.lr = lr;
      m.tokens_per_s = static_cast<double>(interval_steps * tokens_per_step) / std::max(interval_s, 1e-9);
      m.elapsed_s = elapsed;
      m.eta_s = elapsed / static_cast<double>(step + 1 - start_step) * static_cast<double>(tc.max_steps - step - 1);
      m.tokens_seen = summary.tokens_seen;
      if (device == Device::CUDA) {
        m.mfu = gpu_peak_tflops > 0 ? cost.flops_per_token_train * m.tokens_per_s / (gpu_peak_tflops * 1e12 * w.size)
                                    : 0;  // tokens/s counts every rank; the peak is one GPU's
        m.peak_memory_gib = static_cast<double>(cuda_memory_stats().peak_in_use_bytes) / (1u << 30);
      }
      log << format_progress_line(m) << std::endl;
      if (metrics) metrics->append("train", m);
      summary.final_loss = m.loss;
      interval_start = Clock::now();
      interval_loss = interval_targets = interval_correct = 0;
      interval_steps = 0;
    }
    if (eval_data && w.is_root() && ((tc.eval_interval > 0 && (step + 1) % tc.eval_interval == 0) || last)) {
      const Fp8LinearPause bf16_evaluation;  // fp8: evaluated in bf16, as `hgrn eval` does, the amaxes untouched
      const EvalResult held_out = evaluate_batches(model, *eval_data, tc.eval_batches, tc.micro_batch_size);
      const double eval_loss = held_out.loss, eval_accuracy = held_out.accuracy;
      log << "eval  " << step + 1 << " | loss " << eval_loss << " | ppl " << std::exp(eval_loss) << " | accuracy "
          << eval_accuracy;
      if (chance) log << " (chance " << *chance << ")";
      log << std::endl;
      if (metrics) metrics->append_eval(step + 1, eval_loss, eval_accuracy);
      summary.eval_loss = eval_loss;
      summary.eval_accuracy = eval_accuracy;
      summary.evaluated = true;
    }
    // A signal may reach only some ranks: all of them stop after the same step if any one was asked to.
    std::vector<double> stop_votes{stop_requested() ? 1.0 : 0.0};
    allreduce_sum(stop_votes);
    const bool stop = stop_votes[0] > 0;
    if ((config.checkpoint.interval > 0 && (step + 1) % config.checkpoint.interval == 0) || last || stop)
      save(step + 1);
    if (stop && !last) {
      log << "stopped by signal " << (stop_signal_number() ? std::to_string(stop_signal_number()) : "(on another rank)")
          << " after step " << step + 1 << "; resume with the same "
          << "command (checkpoint.resume: auto)" << std::endl;
      summary.stopped_by_signal = true;
      break;
    }
  }

  summary.wall_s = seconds_since(start);
  log << "done: " << summary.steps << " steps, " << summary.tokens_seen << " tokens in "
      << format_duration(summary.wall_s) << "; loss " << summary.first_loss << " -> " << summary.final_loss
      << (summary.evaluated ? "" : ", no held-out evaluation");
  if (summary.evaluated) log << ", eval loss " << summary.eval_loss << ", eval accuracy " << summary.eval_accuracy;
  if (summary.evaluated && chance) log << " (chance " << *chance << ")";
  log << "\n";
  return summary;
}

int run_training(const Config& config, const TrainOptions& options) {
  install_stop_signal_handlers();
  return train(config, std::cout, options).stopped_by_signal ? kExitStoppedBySignal : 0;
}

}  // namespace hgrn
