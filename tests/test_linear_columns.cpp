// test_linear_columns.cpp: the fused projection (linear_columns: several weights, one GEMM each way where they lie
// adjacent, its outputs column blocks of one tensor) and split_columns, on the CPU: values against separate linears,
// fp64 finite differences with adjacent and scattered weights and with consumers writing in place, weight gradients
// made adjacent and accumulated, and the blocks' gradient assembled in place from blocks written row-strided, copied
// from contiguous ones, or zero for blocks that got none. (The GPU kernels that write row-strided gradients: test_hgrn2_gates_cuda.cpp,
// test_hgru2_recurrence_cuda.cpp; the GEMMs on the GPU: test_linear_cuda.cpp.)
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace hgrn {
namespace {

using testing::random_tensor;

// y = scale·x (y contiguous) for a row-strided fp64 x, whose backward writes x's whole gradient where autograd places
// it (GradLayout::RowStrided), row by row through the buffer's stride, as the GPU gates and recurrence do. Records
// where it wrote.
const double* last_strided_write = nullptr;
Var scale_rows(Tape& tape, const Var& x, double scale) {
  const Tensor& xv = x->value;
  const int64_t width = xv.size(-1), rows = xv.numel() / width, stride = xv.row_stride();
  Tensor y = Tensor::empty(xv.shape(), DType::F64);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) y.data<double>()[r * width + c] = scale * xv.data<double>()[r * stride + c];
  Var out = op_output(tape, y, {x});
  if (out->requires_grad)
    tape.record([x, out, scale, width, rows] {
      if (!out->grad.defined()) return;
      bool accumulate = false;
      Tensor& dx = grad_buffer_for_write(x, &accumulate, GradLayout::RowStrided);
      const int64_t stride = dx.row_stride();
      double* d = dx.data<double>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < width; ++c) {
          const double v = scale * out->grad.data<double>()[r * width + c];
          d[r * stride + c] = accumulate ? d[r * stride + c] + v : v;
        }
      last_strided_write = d;
    });
  return out;
}

TEST(SplitColumns, BlocksAreViewsOfTheInput) {
  Tape tape;
  Var x = make_var(Tensor::from_vector<double>({0, 1, 2, 3, 4, 5, 6, 7}, {2, 4}), true, "x");
  const std::vector<Var> b = split_columns(tape, x, {1, 3, 0});
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[1]->value.raw_data(), x->value.data<double>() + 1);
  EXPECT_EQ(b[1]->value.row_stride(), 4);
  EXPECT_EQ(b[1]->value.clone().to_double_vector(), (std::vector<double>{1, 2, 3, 5, 6, 7}));
  EXPECT_EQ(b[2]->value.numel(), 0);
  EXPECT_THROW(split_columns(tape, x, {1, 2}), Error);  // widths must cover the last axis
  EXPECT_THROW(split_columns(tape, make_var(x->value.columns(0, 2)), {1, 1}), Error);  // not contiguous
}

// Blocks read by a row-strided op, through a contiguous copy (what the CPU references do) and by nothing at all.
TEST(SplitColumns, GradientsMatchFiniteDifferences) {
  Rng rng(41);
  Var x = make_var(random_tensor(rng, {3, 2, 9}), true, "x");
  Var w = make_var(random_tensor(rng, {4, 3}), true, "w");
  testing::expect_gradients_match_outputs(
      [](Tape& t, const std::vector<Var>& in) {
        const std::vector<Var> b = split_columns(t, in[0], {2, 3, 1, 3});
        return std::vector<Var>{scale_rows(t, b[0], 2.0), linear(t, contiguous(t, b[1]), in[1]),
                                scale_rows(t, b[3], -3.0)};  // b[2] unused: its columns get zeros
      },
      {x, w});
}

// x an op output (so that its gradient can change hands): the blocks' row-strided writes land in the very buffer that
// becomes x's gradient, and a block that got its gradient elsewhere is copied into place.
TEST(SplitColumns, GradientIsAssembledWhereTheBlocksWroteIt) {
  Rng rng(42);
  Var leaf = make_var(random_tensor(rng, {4, 6}), true, "leaf");
  Tape tape;
  Var x = scale_rows(tape, leaf, 1.0);
  const std::vector<Var> b = split_columns(tape, x, {2, 4});
  const double* written = nullptr;
  tape.record([&written] { written = last_strided_write; });  // runs after every consumer's backward
  Var y0 = scale_rows(tape, b[0], 3.0);
  Var y1 = scale_rows(tape, contiguous(tape, b[1]), 1.0);  // b[1]'s gradient arrives contiguous
  const Tensor d1 = random_tensor(rng, {4, 4});
  y1->grad = d1.clone();
  tape.backward(y0, Tensor::full({4, 2}, 1.0, DType::F64));
  ASSERT_TRUE(x->grad.defined());
  EXPECT_EQ(x->grad.raw_data(), written) << "b[0]'s gradient was not written into x's gradient buffer";
  EXPECT_FALSE(b[0]->grad.defined());  // the blocks' gradients end at the split
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(x->grad.item(r * 6 + c), 3.0);
    for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(x->grad.item(r * 6 + 2 + c), d1.item(r * 4 + c));
  }
}

// Seeds the blocks' gradients with the column blocks of dy and runs the tape.
void backward_through(Tape& tape, const std::vector<Var>& blocks, const Tensor& dy) {
  int64_t col = 0;
  std::vector<Tensor> seeds;
  for (const Var& b : blocks) {
    seeds.push_back(dy.columns(col, b->value.size(-1)).clone());
    col += b->value.size(-1);
  }
  for (size_t k = 1; k < blocks.size(); ++k) blocks[k]->grad = seeds[k];
  tape.backward(blocks[0], seeds[0]);
}

// Weights [out_i, in] that lie one after another in one buffer, as the model allocates them.
std::vector<Var> adjacent_weights(Rng& rng, const std::vector<int64_t>& outs, int64_t in) {
  int64_t total = 0;
  for (int64_t o : outs) total += o;
  const Tensor all = random_tensor(rng, {total, in});
  std::vector<Var> w;
  int64_t row = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    w.push_back(make_var(all.rows(row, outs[i]), true, "w" + std::to_string(i)));
    row += outs[i];
  }
  return w;
}

TEST(LinearColumns, MatchesSeparateLinearsWithAdjacentAndScatteredWeights) {
  Rng rng(43);
  const Tensor x = random_tensor(rng, {2, 3, 5});
  const std::vector<Var> adjacent = adjacent_weights(rng, {4, 4, 7}, 5);
  std::vector<Var> scattered;
  for (const Var& w : adjacent) scattered.push_back(make_var(w->value.clone(), true));
  for (const auto& weights : {adjacent, scattered}) {
    Tape tape;
    Var xv = make_var(x.clone());
    const std::vector<Var> y = linear_columns(tape, xv, weights);
    ASSERT_EQ(y.size(), weights.size());
    for (size_t k = 0; k < weights.size(); ++k) {
      EXPECT_EQ(y[k]->value.row_stride(), 15);
      const Tensor want = linear(tape, xv, weights[k])->value;
      const Tensor got = y[k]->value.clone();
      ASSERT_EQ(got.shape(), want.shape());
      for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got.item(i), want.item(i), 1e-12);
    }
  }
}

TEST(LinearColumns, GradientsMatchFiniteDifferences) {
  Rng rng(44);
  Var x = make_var(random_tensor(rng, {3, 5}), true, "x");
  std::vector<Var> adjacent = adjacent_weights(rng, {2, 3, 1}, 5);
  std::vector<Var> scattered{make_var(random_tensor(rng, {2, 5}), true, "a"),
                             make_var(random_tensor(rng, {3, 5}), true, "b")};
  for (const auto& weights : {adjacent, scattered}) {
    std::vector<Var> inputs{x};
    inputs.insert(inputs.end(), weights.begin(), weights.end());
    testing::expect_gradients_match_outputs(
        [n = weights.size()](Tape& t, const std::vector<Var>& in) {
          return linear_columns(t, in[0], std::vector<Var>(in.begin() + 1, in.begin() + 1 + n));
        },
        inputs);
  }
}

// Consumers that write their blocks' gradients in place (row-strided), one through a contiguous copy, one block
// unused: dy assembled from all three ways.
TEST(LinearColumns, GradientsMatchFiniteDifferencesThroughInPlaceConsumers) {
  Rng rng(46);
  Var x = make_var(random_tensor(rng, {2, 3, 4}), true, "x");
  const std::vector<Var> w = adjacent_weights(rng, {3, 2, 2, 5}, 4);
  testing::expect_gradients_match_outputs(
      [](Tape& t, const std::vector<Var>& in) {
        const std::vector<Var> b = linear_columns(t, in[0], {in[1], in[2], in[3], in[4]});
        return std::vector<Var>{scale_rows(t, b[0], 2.0), scale_rows(t, contiguous(t, b[1]), -1.0),
                                scale_rows(t, b[3], 0.5)};
      },
      {x, w[0], w[1], w[2], w[3]});
}

// The first weight gradients are made in one buffer (adjacent for one dW GEMM from then on); a second backward adds
// to them; a weight whose gradient lives elsewhere takes the per-weight path, with the same sums.
TEST(LinearColumns, WeightGradientsAreMadeAdjacentAndAccumulate) {
  Rng rng(45);
  const Tensor x = random_tensor(rng, {6, 5}), dy = random_tensor(rng, {6, 9});
  std::vector<Var> w = adjacent_weights(rng, {3, 2, 4}, 5);
  auto step = [&](const std::vector<Var>& weights) {
    Tape tape;
    backward_through(tape, linear_columns(tape, make_var(x.clone()), weights), dy);
  };
  step(w);
  std::vector<Tensor> grads, once;
  for (const Var& v : w) grads.push_back(v->grad), once.push_back(v->grad.clone());
  EXPECT_TRUE(Tensor::adjacent_rows(grads).defined());
  step(w);
  for (size_t i = 0; i < w.size(); ++i)
    for (int64_t e = 0; e < once[i].numel(); ++e) EXPECT_NEAR(w[i]->grad.item(e), 2 * once[i].item(e), 1e-12);
  // Mixed: one gradient of its own (another buffer), two adjacent and stale.
  std::vector<Var> mixed = adjacent_weights(rng, {3, 2, 4}, 5);
  for (size_t i = 0; i < mixed.size(); ++i) mixed[i]->value.copy_from(w[i]->value);
  mixed[1]->grad = once[1].clone();
  step(mixed);
  for (size_t i = 0; i < w.size(); ++i)
    for (int64_t e = 0; e < once[i].numel(); ++e)
      EXPECT_NEAR(mixed[i]->grad.item(e), (i == 1 ? 2 : 1) * once[i].item(e), 1e-12) << "weight " << i;
}

}  // namespace
}  // namespace hgrn
