// test_layernorm.cpp: LayerNorm with weight and bias against the formula, fp64 finite-difference gradients (with and
// without weight and bias), thread-count independence of the parameter gradients, and argument checks.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "gradcheck.h"
#include "ops/layernorm.h"

namespace hgrn {
namespace {

using testing::random_tensor;

TEST(LayerNorm, ForwardMatchesFormula) {
  Rng rng(1);
  const Tensor x = random_tensor(rng, {3, 5}, 2.0), w = random_tensor(rng, {5}), b = random_tensor(rng, {5});
  for (DType dtype : {DType::F64, DType::F32}) {
    Tape tape;
    Var y = layernorm(tape, make_var(x.to(dtype)), make_var(w.to(dtype)), make_var(b.to(dtype)), 1e-5);
    const Tensor xr = x.to(dtype).to(DType::F64), wr = w.to(dtype).to(DType::F64), br = b.to(dtype).to(DType::F64);
    for (int64_t r = 0; r < 3; ++r) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < 5; ++c) mean += xr.item(r * 5 + c) / 5;
      for (int64_t c = 0; c < 5; ++c) var += (xr.item(r * 5 + c) - mean) * (xr.item(r * 5 + c) - mean) / 5;
      for (int64_t c = 0; c < 5; ++c) {
        const double want = (xr.item(r * 5 + c) - mean) / std::sqrt(var + 1e-5) * wr.item(c) + br.item(c);
        // fp32: rounding of the statistics and the product, values of order 1-5.
        EXPECT_NEAR(y->value.item(r * 5 + c), want, dtype == DType::F64 ? 1e-13 : 1e-5) << dtype_name(dtype);
      }
    }
  }
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  for (int variant = 0; variant < 3; ++variant) {  // weight and bias; neither; bias only
    SCOPED_TRACE(variant);
    Rng rng(2 + variant);
    Var x = make_var(random_tensor(rng, {4, 6}, 2.0), true, "x");
    Var w = variant == 0 ? make_var(random_tensor(rng, {6}), true, "w") : nullptr;
    Var b = variant != 1 ? make_var(random_tensor(rng, {6}), true, "b") : nullptr;
    std::vector<Var> inputs{x};
    if (w) inputs.push_back(w);
    if (b) inputs.push_back(b);
    testing::expect_gradients_match(
        [&](Tape& tape, const std::vector<Var>&) { return layernorm(tape, x, w, b, 1e-3); }, inputs, 9, 1e-6, 1e-7);
  }
}

TEST(LayerNorm, ParameterGradientBitsIndependentOfThreadCount) {
  // 300 rows x 128 = 38400 elements, above the size where the op forks a team.
  Rng rng(5);
  const Tensor x = random_tensor(rng, {300, 128}, 1.0, DType::F32), dy = random_tensor(rng, {300, 128}, 1.0, DType::F32);
  const auto grads = [&](int threads) {
    omp_set_num_threads(threads);
    Tape tape;
    Var xv = make_var(x.clone(), true), w = make_var(Tensor::full({128}, 1.5, DType::F32), true),
        b = make_var(Tensor::zeros({128}, DType::F32), true);
    tape.backward(layernorm(tape, xv, w, b, 1e-6), dy);
    return std::vector<std::vector<double>>{xv->grad.to_double_vector(), w->grad.to_double_vector(),
                                            b->grad.to_double_vector()};
  };
  const int saved = omp_get_max_threads();
  const auto one = grads(1), four = grads(4);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, four);
}

TEST(LayerNorm, RejectsBadArguments) {
  Tape tape;
  const Var x = make_var(Tensor::zeros({2, 4}, DType::F64));
  EXPECT_THROW(layernorm(tape, x, make_var(Tensor::zeros({3}, DType::F64)), nullptr, 1e-6), Error);
  EXPECT_THROW(layernorm(tape, x, nullptr, make_var(Tensor::zeros({4}, DType::F32)), 1e-6), Error);
  EXPECT_THROW(layernorm(tape, x, nullptr, nullptr, -1.0), Error);
}

}  // namespace
}  // namespace hgrn
