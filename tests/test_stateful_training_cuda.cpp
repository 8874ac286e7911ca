// test_stateful_training_cuda.cpp: data.stateful on the GPU: the carried states live on the device (fp32 whatever the
// activation dtype), a stopped and resumed stateful run continues bit for bit in fp32 and bf16 for every family
// member, and the GPU's per-step losses track the CPU's stateful run.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "config/config.h"
#include "data/data_sources.h"
#include "gpu_test.h"
#include "scratch_dir.h"
#include "token_shard_fixtures.h"
#include "train/trainer.h"

namespace hgrn {
void expect_stateful_bitwise_resume(const std::string& device, const std::string& precision,
                                    const std::string& model);  // test_stateful_training.cpp

namespace {

// 2 micro-batches of 2 rows, 16-token windows, 8 steps.
constexpr const char* kStatefulYaml = R"(
model: {hidden_size: 16, num_hidden_layers: 2, expand_ratio: 8, vocab_size: 17, intermediate_size: 32}
data: {task: tokens, seq_len: 16, stateful: true}
training: {micro_batch_size: 2, grad_accum_steps: 2, max_steps: 8, lr: 0.003, warmup_steps: 3, eval_interval: 0,
           eval_batches: 1}
logging: {log_interval: 100}
)";

TEST(StatefulTrainingCuda, ResumeContinuesBitwiseIdenticallyInFp32) {
  HGRN_SKIP_WITHOUT_GPU();
  for (const char* model : {"hgrn2", "hgrn", "hgrn-complex"}) {
    SCOPED_TRACE(model);
    expect_stateful_bitwise_resume("cuda", "fp32", model);
  }
}

TEST(StatefulTrainingCuda, ResumeContinuesBitwiseIdenticallyInBf16) {
  HGRN_SKIP_WITHOUT_GPU();
  for (const char* model : {"hgrn2", "hgrn", "hgrn-complex"}) {
    SCOPED_TRACE(model);
    expect_stateful_bitwise_resume("cuda", "bf16", model);
  }
}

// In bf16 training the carried states are fp32 tensors on the GPU, before and after a step, for every member.
TEST(StatefulTrainingCuda, CarriedStatesAreFp32OnTheGpu) {
  HGRN_SKIP_WITHOUT_GPU();
  const testing::ScratchDir scratch;
  const std::string shard = scratch / "tokens";
  testing::write_random_token_shard(shard, 17, 341, 7);
  for (const std::vector<std::string>& model : std::vector<std::vector<std::string>>{
           {"model.type=hgrn2"}, {"model.type=hgrn"}, {"model.type=hgrn", "model.complex=true"}}) {
    SCOPED_TRACE(model.back());
    std::vector<std::string> overrides = model;
    overrides.insert(overrides.end(), {"data.train_data=" + shard, "logging.run_dir=" + scratch / "run",
                                       "training.device=cuda", "training.precision=bf16"});
    const Config config = parse_config(kStatefulYaml, "stateful-gpu.yaml", overrides);
    TrainingModel setup(config, 5, Device::CUDA, DType::BF16);
    ASSERT_NE(setup.carried_states, nullptr);
    const auto expect_fp32_on_gpu = [&](const char* when) {
      for (int64_t m = 0; m < 2; ++m)
        for (int64_t l = 0; l < 2; ++l) {
          const Tensor& state = setup.carried_states->state(m, l);
          EXPECT_EQ(state.device(), Device::CUDA) << when << ", micro-batch " << m << ", layer " << l;
          EXPECT_EQ(state.dtype(), DType::F32) << when << ", micro-batch " << m << ", layer " << l;
          EXPECT_EQ(state.size(0), 2) << when << ", micro-batch " << m << ", layer " << l;
        }
    };
    expect_fp32_on_gpu("before the first step");
    const std::unique_ptr<BatchSource> rows = make_training_source(config, 1);
    const StepResult step = training_step(setup, *rows, config.training, config.training.lr);
    EXPECT_TRUE(std::isfinite(step.loss));
    expect_fp32_on_gpu("after a step");
  }
}

// The same stateful run on the CPU and on the GPU in fp32 (no TF32): the losses differ by rounding only, also in the
// steps whose rows start from carried states (every step after the first of an epoch).
TEST(StatefulTrainingCuda, Fp32StatefulRunTracksTheCpuRun) {
  HGRN_SKIP_WITHOUT_GPU();
  const testing::ScratchDir scratch;
  const std::string shard = scratch / "tokens";
  testing::write_random_token_shard(shard, 17, 341, 7);
  const auto run = [&](const std::string& device) {
    const Config config = parse_config(kStatefulYaml, "stateful-gpu.yaml",
                                       {"data.train_data=" + shard, "logging.run_dir=" + scratch / ("run-" + device),
                                        "training.device=" + device});
    std::ostringstream log;
    return train(config, log);
  };
  const TrainingSummary cpu = run("cpu"), gpu = run("cuda");
  ASSERT_EQ(gpu.step_losses.size(), cpu.step_losses.size());
  // 1e-4 relative: fp32 GEMMs and recurrences summed in other orders over 8 steps of a tiny model.
  for (size_t s = 0; s < cpu.step_losses.size(); ++s)
    EXPECT_NEAR(gpu.step_losses[s], cpu.step_losses[s], 1e-4 * cpu.step_losses[s]) << "step " << s + 1;
}

}  // namespace
}  // namespace hgrn
