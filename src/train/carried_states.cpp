// carried_states.cpp: the states of data.stateful between optimiser steps, and their checkpoint form (rows in
// global stream order, carried_states.h).
#include "train/carried_states.h"

#include <algorithm>

#include "dist/world.h"

namespace hgrn {

namespace {
int64_t row_numel(const Shape& row_shape) {
  int64_t n = 1;
  for (const int64_t d : row_shape) n *= d;
  return n;
}

Shape with_rows(int64_t rows, const Shape& row_shape) {
  Shape shape{rows};
  shape.insert(shape.end(), row_shape.begin(), row_shape.end());
  return shape;
}
}  // namespace

CarriedStates::CarriedStates(const CausalLM& model, int64_t micro_batch_size, int64_t micro_batches)
    : device_(model.device()), micro_batch_size_(micro_batch_size) {
  HGRN_CHECK(micro_batch_size >= 1 && micro_batches >= 1, "CarriedStates: ", micro_batches, " micro-batches of ",
             micro_batch_size, " rows");
  // What forward carries per row is what a decoding step leaves: the same layers, shapes and dtype.
  std::vector<RecurrentState> probe;
  model.decode_step(Tensor::zeros({1}, DType::I32), probe);
  for (const RecurrentState& layer : probe) {
    const Shape& shape = layer.tensor.shape();
    row_shapes_.emplace_back(shape.begin() + 1, shape.end());
    dtype_ = layer.tensor.dtype();
  }
  states_.resize(static_cast<size_t>(micro_batches));
  handed_out_.resize(static_cast<size_t>(micro_batches));
  reset();
}

Tensor CarriedStates::zero_state(int64_t layer) const {
  return Tensor::zeros(with_rows(micro_batch_size_, row_shapes_[static_cast<size_t>(layer)]), dtype_, device_);
}

void CarriedStates::reset() {
  for (std::vector<Tensor>& micro_batch : states_) {
    micro_batch.clear();
    for (size_t l = 0; l < row_shapes_.size(); ++l) micro_batch.push_back(zero_state(static_cast<int64_t>(l)));
  }
}

std::vector<Var>* CarriedStates::begin(int64_t micro_batch, bool continues) {
  std::vector<Tensor>& states = states_.at(static_cast<size_t>(micro_batch));
  std::vector<Var>& vars = handed_out_[static_cast<size_t>(micro_batch)];
  vars.clear();
  for (size_t l = 0; l < states.size(); ++l) {
    if (!continues) states[l] = zero_state(static_cast<int64_t>(l));
    // A fresh Var without a gradient: the previous window's tape does not reach it.
    vars.push_back(make_var(states[l]));
  }
  return &vars;
}

void CarriedStates::end(int64_t micro_batch) {
  std::vector<Tensor>& states = states_.at(static_cast<size_t>(micro_batch));
  std::vector<Var>& vars = handed_out_[static_cast<size_t>(micro_batch)];
  HGRN_CHECK(vars.size() == states.size(), "CarriedStates: the forward left ", vars.size(), " states, the model has ",
             states.size(), " layers");
  for (size_t l = 0; l < states.size(); ++l) {
    HGRN_CHECK(vars[l] && vars[l]->value.shape() == states[l].shape() && vars[l]->value.dtype() == dtype_,
               "CarriedStates: layer ", l, "'s final state is not a ", dtype_name(dtype_), " ",
               shape_str(states[l].shape()), " tensor");
    states[l] = vars[l]->value;
  }
  vars.clear();
}

std::vector<Tensor> CarriedStates::gather() const {
  const World& w = world();
  HGRN_CHECK(dtype_ == DType::F32, "CarriedStates: checkpoints keep fp32 states, these are ", dtype_name(dtype_));
  // This rank's R rows of every layer, layer by layer, each layer's micro-batches in order.
  std::vector<float> mine;
  for (size_t l = 0; l < row_shapes_.size(); ++l)
    for (const std::vector<Tensor>& micro_batch : states_) {
      const Tensor state = on_device(micro_batch[l], Device::CPU);
      mine.insert(mine.end(), state.data<float>(), state.data<float>() + state.numel());
    }
  const std::vector<float> all = gather_to_root(mine);  // rank 0: every rank's part, in rank order
  if (!w.is_root()) return {};
  const size_t per_rank = mine.size();
  HGRN_CHECK(all.size() == per_rank * static_cast<size_t>(w.size), "CarriedStates: gathered ", all.size(),
             " values from ", w.size, " ranks of ", per_rank);
  std::vector<Tensor> out;
  size_t layer_offset = 0;  // where the layer's rows start in each rank's part
  for (size_t l = 0; l < row_shapes_.size(); ++l) {
    const size_t count = static_cast<size_t>(rows() * row_numel(row_shapes_[l]));
    Tensor layer = Tensor::empty(with_rows(w.size * rows(), row_shapes_[l]), DType::F32);
    for (size_t r = 0; r < static_cast<size_t>(w.size); ++r)
      std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(r * per_rank + layer_offset), count,
                  layer.data<float>() + r * count);
    layer_offset += count;
    out.push_back(std::move(layer));
  }
  return out;
}

void CarriedStates::restore(const std::vector<Tensor>& saved, const std::string& path) {
  const World& w = world();
  HGRN_CHECK(!saved.empty(), "checkpoint ", path, " holds no carried recurrent states (/recurrent_states): it was "
             "written by a run without data.stateful, and a stateful run continues only from a stateful run's "
             "checkpoint. Resume it with data.stateful: false, or start a new stateful run (another "
             "logging.run_dir, or checkpoint.resume: never)");
  HGRN_CHECK(saved.size() == row_shapes_.size(), "checkpoint ", path, " holds the carried states of ", saved.size(),
             " layers, this model has ", row_shapes_.size());
  const int64_t streams = w.size * rows();
  for (size_t l = 0; l < saved.size(); ++l) {
    const Shape expected = with_rows(streams, row_shapes_[l]);
    HGRN_CHECK(saved[l].shape() == expected && saved[l].dtype() == dtype_, "checkpoint ", path,
               ": the carried state of layer ", l, " is ", dtype_name(saved[l].dtype()), " ",
               shape_str(saved[l].shape()), ", this run carries ", dtype_name(dtype_), " ", shape_str(expected),
               " (", streams, " streams: training.micro_batch_size x training.grad_accum_steps x ", w.size,
               " rank(s), and the model's state shape); resume with the config that wrote it");
  }
  for (size_t m = 0; m < states_.size(); ++m)
    for (size_t l = 0; l < saved.size(); ++l) {
      const int64_t first = w.rank * rows() + static_cast<int64_t>(m) * micro_batch_size_;
      states_[m][l] = on_device(saved[l].rows(first, micro_batch_size_).clone(), device_);
    }
}

}  // namespace hgrn
