// test_embedding.cpp: embedding lookup against hand values, its scatter-add gradient (finite differences, repeated
// ids, bit-exact in-order accumulation) and its errors.
#include <gtest/gtest.h>

#include <omp.h>

#include "gradcheck.h"
#include "ops/embedding.h"

namespace hgrn {
namespace {

TEST(Embedding, ForwardGathersRowsForAnyIdShape) {
  Tape tape;
  Var w = make_var(Tensor::from_vector<double>({0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32}, {4, 3}));
  Tensor ids = Tensor::from_vector<int32_t>({3, 0, 3, 1}, {2, 2});
  Var y = embedding(tape, w, ids);
  EXPECT_EQ(y->value.shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(y->value.to_double_vector(), (std::vector<double>{30, 31, 32, 0, 1, 2, 30, 31, 32, 10, 11, 12}));

  Var y64 = embedding(tape, w, Tensor::from_vector<int64_t>({2}, {1}));
  EXPECT_EQ(y64->value.shape(), (Shape{1, 3}));
  EXPECT_EQ(y64->value.to_double_vector(), (std::vector<double>{20, 21, 22}));
}

TEST(Embedding, GradientsMatchFiniteDifferences) {
  Rng rng(11);
  Var w = make_var(testing::random_tensor(rng, {5, 4}), true, "weight");
  Tensor ids = Tensor::from_vector<int64_t>({4, 1, 1, 0, 4, 4}, {2, 3});
  testing::expect_gradients_match([&](Tape& t, const std::vector<Var>& in) { return embedding(t, in[0], ids); }, {w});
}

TEST(Embedding, RepeatedIdsAccumulate) {
  Tape tape;
  Var w = make_var(Tensor::zeros({3, 2}, DType::F64), true, "weight");
  Tensor ids = Tensor::from_vector<int32_t>({2, 0, 2, 2}, {4});
  Var y = embedding(tape, w, ids);
  tape.backward(y, Tensor::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}));
  // row 0 <- position 1 (3, 4); row 1 unused; row 2 <- positions 0, 2, 3 (1+5+7, 2+6+8).
  EXPECT_EQ(w->grad.to_double_vector(), (std::vector<double>{3, 4, 0, 0, 13, 16}));
}

TEST(Embedding, GradientAccumulatesIntoExistingBuffer) {
  Tape tape;
  Var w = make_var(Tensor::zeros({2, 1}, DType::F64), true, "weight");
  w->grad = Tensor::from_vector<double>({100, 200}, {2, 1});
  Var y = embedding(tape, w, Tensor::from_vector<int32_t>({1}, {1}));
  tape.backward(y, Tensor::from_vector<double>({5}, {1, 1}));
  EXPECT_EQ(w->grad.to_double_vector(), (std::vector<double>{100, 205}));
}

// The weight gradient must be the in-order sum over positions, bit for bit, whatever the thread count: fp32 addition
// is not associative, so any other order (or a racy one) shows up as differing bits with this many repeats.
TEST(Embedding, WeightGradientIsInOrderSumForAnyThreadCount) {
  const int64_t vocab = 7, width = 150, rows = 3000;
  Rng rng(12);
  Tensor ids = Tensor::empty({rows}, DType::I64);
  for (int64_t i = 0; i < rows; ++i) ids.set_item(i, static_cast<double>(rng.below(vocab)));
  Tensor dy = testing::random_tensor(rng, {rows, width}, 1.0, DType::F32);

  std::vector<float> expected(static_cast<size_t>(vocab * width), 0.0f);
  const float* dyp = dy.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c)
      expected[static_cast<size_t>(ids.data<int64_t>()[r] * width + c)] += dyp[r * width + c];

  const int saved_threads = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Tape tape;
    Var w = make_var(Tensor::zeros({vocab, width}, DType::F32), true, "weight");
    tape.backward(embedding(tape, w, ids), dy);
    const float* got = w->grad.data<float>();
    for (int64_t i = 0; i < vocab * width; ++i)
      ASSERT_EQ(got[i], expected[static_cast<size_t>(i)]) << "threads " << threads << " element " << i;
  }
  omp_set_num_threads(saved_threads);
}

TEST(Embedding, OutOfRangeIdIsAnErrorNamingIdAndVocab) {
  Tape tape;
  Var w = make_var(Tensor::zeros({5, 2}, DType::F32));
  try {
    embedding(tape, w, Tensor::from_vector<int32_t>({0, 5}, {2}));
    FAIL() << "id 5 with vocab 5 was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("id 5"), std::string::npos) << what;
    EXPECT_NE(what.find("vocab size 5"), std::string::npos) << what;
  }
  EXPECT_THROW(embedding(tape, w, Tensor::from_vector<int64_t>({-1}, {1})), Error);
}

TEST(Embedding, RejectsBadArguments) {
  Tape tape;
  Var w = make_var(Tensor::zeros({5, 2}, DType::F32));
  EXPECT_THROW(embedding(tape, w, Tensor::zeros({2}, DType::F32)), Error);  // ids must be integers
  Var w3 = make_var(Tensor::zeros({5, 2, 1}, DType::F32));
  EXPECT_THROW(embedding(tape, w3, Tensor::from_vector<int32_t>({0}, {1})), Error);  // weight must be [Vocab, D]
}

}  // namespace
}  // namespace hgrn
