// main.cpp: the hgrn command line: train, info, eval, prepare, export, bench, generate and --version. Each subcommand
// lives in its own file under src/cli/; this file parses, dispatches and turns exceptions into messages and exit
// statuses.
#include <yaml-cpp/exceptions.h>

#include <unistd.h>

#include <cstdlib>
#include <iostream>

#include "cli/bench.h"
#include "cli/common.h"
#include "cli/eval.h"
#include "cli/export.h"
#include "cli/generate.h"
#include "cli/info.h"
#include "cli/prepare.h"
#include "cli/train.h"
#include "config/config.h"
#include "dist/world.h"

// Idle OpenMP threads sleep instead of spinning unless the user chose otherwise: a spinning worker takes the core the
// step's serial parts need, on a machine with few cores even when it is quiet (docs/benchmarks.md#cpu). libgomp reads
// OMP_WAIT_POLICY when it loads, before main, so the policy takes effect by running this program once more with it.
static void prefer_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  ::setenv("OMP_WAIT_POLICY", "passive", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: go on with the default policy
}

int main(int argc, char** argv) {
  using namespace hgrn::cli;
  prefer_passive_openmp_wait(argv);
  try {
    hgrn::init_world(&argc, &argv);  // MPI, when started by mpirun/srun
  } catch (const std::exception& error) {
    print_error(error.what());
    return kExitRuntimeError;
  }
  CLI::App app{"hgrn: pretrain HGRN-family language models: HGRN2, HGRN1, GLA and RetNet (C++/CUDA).", "hgrn"};
  app.set_version_flag("--version", version_text(), "Print the version, git commit and whether CUDA is compiled in");
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  hgrn info --config configs/mqar-tiny.yaml     # sizes, FLOPs and memory of a config\n"
      "  hgrn train --config configs/mqar-tiny.yaml    # train it\n"
      "  hgrn train -c configs/mqar-tiny.yaml --set training.lr=1e-3\n"
      "  hgrn export --checkpoint CKPT --format hf --out DIR   # weights for transformers + fla\n"
      "  hgrn bench --config configs/hgrn2-150m.yaml   # tokens/s, MFU and peak memory on the GPU\n"
      "  hgrn generate --checkpoint CKPT --prompt 'Once upon a time'   # sample from a model\n"
      "Run 'hgrn <command> --help' for a command's options.");
  TrainArgs train_args;
  ConfigArgs info_args;
  CLI::App* train = add_train_command(app, train_args);
  CLI::App* info = add_info_command(app, info_args);
  EvalArgs eval_args;
  CLI::App* eval = add_eval_command(app, eval_args);
  ExportArgs export_args;
  CLI::App* export_command = add_export_command(app, export_args);
  BenchArgs bench_args;
  CLI::App* bench = add_bench_command(app, bench_args);
  GenerateArgs generate_args;
  CLI::App* generate = add_generate_command(app, generate_args);
  hgrn::PrepareOptions prepare_options;
  CLI::App* prepare = add_prepare_command(app, prepare_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return report_parse_error(app, error, argc, argv);
  }

  // A config the loader rejects, or other input a command refuses (UsageError), is the user's to fix (status 2);
  // anything else failed while running (1).
  try {
    if (*train) return run_train_command(train_args);
    if (*info) return run_info_command(info_args, std::cout);
    if (*eval) return run_eval_command(eval_args, std::cout);
    if (*export_command) return run_export_command(export_args, std::cout);
    if (*prepare) return run_prepare_command(prepare_options);
    if (*bench) return run_bench_command(bench_args, std::cout);
    if (*generate) return run_generate_command(generate_args, std::cout, std::cerr);
  } catch (const hgrn::ConfigError& error) {
    print_error(error.what());
    return kExitUsageError;
  } catch (const UsageError& error) {
    print_error(error.what());
    return kExitUsageError;
  } catch (const YAML::Exception& error) {
    print_error(std::string("config: ") + error.what());
    return kExitUsageError;
  } catch (const std::exception& error) {
    print_error(error.what());
    return kExitRuntimeError;
  }
  return kExitUsageError;
}
