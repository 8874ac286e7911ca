// carried_states.h: stateful training (data.stateful, truncated backpropagation through time): the recurrent state
// each batch row carries from its window in one optimiser step to its window in the next.
//
// Which rows carry which states: row b of a rank's micro-batch m reads the same stream in every step
// (data/token_streams.h), so micro-batch m has states of its own, one per layer ([micro_batch_size, ...] on the
// model's device, fp32 in training), which its forward starts from and replaces with its final ones. A state never
// passes from one micro-batch to another: the micro-batches of a step read different streams side by side, as the
// rows of one large batch would. The states enter the next window as constants (detached), so no gradient crosses
// a window boundary. Zero states start every stream: the first step and each epoch's first window, and (as the
// trainer resets them) the step after one whose loss or gradient was non-finite, whose final states may be too.
//
// Checkpoints keep every rank's states in global stream order: per layer one tensor [S, ...] whose row r·R + j is
// rank r's row j (R = micro_batch_size × grad_accum_steps rows per rank, S = world_size·R), so that a resumed run
// continues every stream from the bits it stopped at.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/causal_lm.h"

namespace hgrn {

class CarriedStates {
 public:
  // Zero states for `micro_batches` micro-batches of `micro_batch_size` rows, in the shapes and dtype `model`
  // carries per layer (read from one decoding step of one token), on its device.
  CarriedStates(const CausalLM& model, int64_t micro_batch_size, int64_t micro_batches);

  // Before micro-batch m's forward: the states it starts from, as Vars that want no gradient: the final states it
  // left one step before when `continues`, else zero states. Pass them to the forward, which leaves the micro-batch's
  // final states in them.
  std::vector<Var>* begin(int64_t micro_batch, bool continues);
  // After the micro-batch's backward: keeps the final states' values (detached from the tape).
  void end(int64_t micro_batch);
  // Zero states for every row.
  void reset();

  int64_t rows() const { return micro_batch_size_ * static_cast<int64_t>(states_.size()); }  // R
  // One layer's state of micro-batch m (tests).
  const Tensor& state(int64_t micro_batch, int64_t layer) const { return states_.at(micro_batch).at(layer); }

  // Every rank calls it: on rank 0, every rank's states in the checkpoint form above, on the CPU; empty elsewhere.
  std::vector<Tensor> gather() const;
  // Takes this rank's rows of `saved` (gather's form, read from checkpoint `path`); throws hgrn::Error naming `path`
  // when it holds no states, or another number of layers, shapes or dtype than this run carries.
  void restore(const std::vector<Tensor>& saved, const std::string& path);

 private:
  Tensor zero_state(int64_t layer) const;

  std::vector<Shape> row_shapes_;  // per layer, one row's state shape
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  int64_t micro_batch_size_ = 0;
  std::vector<std::vector<Tensor>> states_;  // [micro-batch][layer]: [micro_batch_size, row shape...]
  std::vector<std::vector<Var>> handed_out_;  // [micro-batch]: what begin() gave the forward
};

}  // namespace hgrn
