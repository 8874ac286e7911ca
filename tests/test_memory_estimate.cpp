// test_memory_estimate.cpp: `hgrn info`'s training-memory estimate (models/cost.h: training_memory) against the
// real program. The measured numbers are `hgrn bench` "peak in use" on an NVIDIA H200, or an H100 where marked
// (GiB); the estimate must stay within 10% of each, so a change to what the GPU path keeps that the model does
// not follow fails here. Each model.memory knob must also move the estimate the way it moved the measured peak.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "models/cost.h"

namespace hgrn {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double estimate_gib(const std::string& file, const std::vector<std::string>& overrides = {}) {
  const Config c = load_config(std::string(HGRN_SOURCE_DIR) + "/configs/" + file, overrides);
  return training_memory(c.model, c.training.micro_batch_size, c.data.seq_len, memory_target(c)).total() / kGiB;
}

struct MeasuredPeak {
  const char* config;
  std::vector<std::string> overrides;
  double peak_gib;  // hgrn bench's "peak in use" on an NVIDIA H200
};

const std::vector<MeasuredPeak>& measured_peaks() {
  static const std::vector<MeasuredPeak> peaks = {
      {"hgrn2-150m.yaml", {}, 15.58},
      {"hgrn2-385m.yaml", {}, 35.91},
      {"hgrn2-1b.yaml", {}, 31.53},
      {"hgrn1-150m.yaml", {}, 10.95},
      {"hgrn1-385m.yaml", {}, 33.11},                                           // H100
      {"hgrn1-385m.yaml", {"model.memory.keep_elementwise_layers=0"}, 25.20},  // H100
      {"hgrn1-1b.yaml", {}, 28.61},                                            // H100
      {"gla-385m.yaml", {}, 29.05},  // H100
      {"retnet-385m.yaml", {}, 39.03},  // H100
      {"retnet-385m.yaml", {"model.memory.keep_recurrence_states=0", "model.memory.recompute_gates=true"},
       29.66},  // H100
      {"hgrn2-385m.yaml", {"model.memory.recompute=true"}, 10.57},
      {"hgrn2-385m.yaml", {"model.memory.recompute_elementwise=false"}, 45.26},
      {"hgrn2-385m.yaml", {"model.memory.recompute_gates=false"}, 35.91},
      {"hgrn2-385m.yaml", {"model.memory.recompute_weight_copies=true"}, 35.29},
      {"hgrn2-385m.yaml", {"model.memory.recompute_mlp_projections=true"}, 27.38},
      {"hgrn2-385m.yaml", {"model.memory.keep_recurrence_states=12"}, 34.16},
      {"hgrn2-150m.yaml", {"training.precision=fp8"}, 15.61},  // H100
      {"hgrn2-385m.yaml", {"training.precision=fp8"}, 35.78},  // H100
      {"hgrn2-1b.yaml", {"training.precision=fp8"}, 30.85},  // H100
      {"hgrn1-385m.yaml", {"model.memory.recompute=true"}, 10.30},
      {"hgrn1-385m.yaml", {"model.memory.keep_elementwise_layers=26"}, 34.54},  // H100
  };
  return peaks;
}

TEST(MemoryEstimate, WithinTenPercentOfTheMeasuredGpuPeak) {
  for (const MeasuredPeak& row : measured_peaks()) {
    std::string label = row.config;
    for (const std::string& o : row.overrides) label += " --set " + o;
    const double estimate = estimate_gib(row.config, row.overrides);
    EXPECT_NEAR(estimate, row.peak_gib, 0.10 * row.peak_gib) << label;
  }
}

// Each knob moves the estimate the way it moved the measured peak (hgrn2-385m.yaml: 35.91 GiB as shipped).
TEST(MemoryEstimate, KnobsMoveItAsTheyMovedThePeak) {
  const double shipped = estimate_gib("hgrn2-385m.yaml");
  const auto with = [](const std::string& knob) { return estimate_gib("hgrn2-385m.yaml", {"model.memory." + knob}); };
  EXPECT_LT(with("recompute=true"), shipped);
  EXPECT_GT(with("recompute_elementwise=false"), shipped);
  EXPECT_LT(with("recompute_weight_copies=true"), shipped);
  EXPECT_LT(with("recompute_mlp_projections=true"), shipped);
  EXPECT_LT(with("keep_recurrence_states=12"), shipped);
  EXPECT_LT(with("keep_recurrence_states=12"), with("keep_recurrence_states=20"));
  // The file keeps the gates; recomputing them (in every layer, or in the last N) lowers the peak.
  EXPECT_DOUBLE_EQ(with("recompute_gates=false"), shipped);
  EXPECT_LT(with("recompute_gates=true"), shipped);
  EXPECT_LT(estimate_gib("hgrn2-385m.yaml", {"model.memory.recompute_gates_layers=10"}), shipped);
  EXPECT_LT(estimate_gib("hgrn1-385m.yaml", {"model.memory.recompute=true"}), estimate_gib("hgrn1-385m.yaml"));
  EXPECT_GT(estimate_gib("hgrn1-385m.yaml", {"model.memory.recompute_elementwise=false"}),
            estimate_gib("hgrn1-385m.yaml"));
  // Keeping the elementwise outputs in the first N layers lands in between, growing with N, all of them = off.
  const auto keep = [](int layers) {
    return estimate_gib("hgrn1-385m.yaml", {"model.memory.keep_elementwise_layers=" + std::to_string(layers)});
  };
  EXPECT_DOUBLE_EQ(keep(22), estimate_gib("hgrn1-385m.yaml"));  // as shipped
  EXPECT_GT(keep(13), keep(0));
  EXPECT_GT(keep(20), keep(13));
  EXPECT_LT(keep(20), estimate_gib("hgrn1-385m.yaml", {"model.memory.recompute_elementwise=false"}));
  EXPECT_DOUBLE_EQ(keep(26), estimate_gib("hgrn1-385m.yaml", {"model.memory.recompute_elementwise=false"}));
}

// The items add up, activations scale with the micro-batch, fp32 activations cost more than bf16 ones, and fp8 holds
// FP8 codes of the layers' weights instead of bf16 copies.
TEST(MemoryEstimate, ItemsScaleWithBatchAndPrecision) {
  const Config c = load_config(std::string(HGRN_SOURCE_DIR) + "/configs/hgrn2-385m.yaml");
  const MemoryTarget bf16 = memory_target(c);
  ASSERT_TRUE(bf16.gpu);
  const TrainingMemory full = training_memory(c.model, 16, 2048, bf16);
  const TrainingMemory half = training_memory(c.model, 8, 2048, bf16);
  EXPECT_DOUBLE_EQ(half.activations * 2, full.activations);
  EXPECT_DOUBLE_EQ(half.states * 2, full.states);
  EXPECT_GT(full.weight_copies, 0);
  EXPECT_DOUBLE_EQ(full.total(), full.states + full.activations + full.weights_and_optimizer +
                                     full.weight_copies + full.working_set);
  MemoryTarget fp32 = bf16;
  fp32.bytes_per_activation = 4;
  const TrainingMemory wide = training_memory(c.model, 16, 2048, fp32);
  EXPECT_GT(wide.activations, 1.5 * full.activations);  // the fp32 gates and states stay fp32
  EXPECT_EQ(wide.weight_copies, 0);
  // fp8: the head's bf16 copy, and 1 byte per layer weight (the FP8 codes a step keeps) instead of a bf16 copy.
  const Config c8 = load_config(std::string(HGRN_SOURCE_DIR) + "/configs/hgrn2-385m.yaml", {"training.precision=fp8"});
  const MemoryTarget fp8 = memory_target(c8);
  EXPECT_TRUE(fp8.fp8);
  const TrainingMemory codes = training_memory(c8.model, 16, 2048, fp8);
  const double head = static_cast<double>(c.model.vocab_size * c.model.hidden_size);
  EXPECT_DOUBLE_EQ(codes.weight_copies, full.weight_copies / 2 + head);
  EXPECT_DOUBLE_EQ(codes.total(), full.total() - (full.weight_copies - codes.weight_copies));
}

// A CPU run keeps its gradients between steps and has no bf16 copies or per-chunk GPU states.
TEST(MemoryEstimate, CpuPathKeepsGradients) {
  const Config c = load_config(std::string(HGRN_SOURCE_DIR) + "/configs/mqar-tiny.yaml", {"training.device=cpu"});
  const MemoryTarget target = memory_target(c);
  EXPECT_FALSE(target.gpu);
  const TrainingMemory m = training_memory(c.model, c.training.micro_batch_size, c.data.seq_len, target);
  const ModelCost cost = model_cost(c.model, c.data.seq_len);
  EXPECT_DOUBLE_EQ(m.weights_and_optimizer, 16.0 * static_cast<double>(cost.params_total));
  EXPECT_EQ(m.weight_copies, 0);
  EXPECT_GT(m.activations, 0);
  EXPECT_GT(m.working_set, 0);
}

}  // namespace
}  // namespace hgrn
