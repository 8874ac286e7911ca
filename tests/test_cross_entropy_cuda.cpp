// test_cross_entropy_cuda.cpp: the CUDA cross-entropy against an fp64 reference (loss, target and correct counts,
// accumulated dlogits with a non-unit dloss) for fp32 and bf16 logits, odd row counts, small and real vocab sizes
// and ignored rows; ties and extreme logits; bitwise reproducibility; logits past 2^31 elements; target errors; the
// one-pass forward + gradient against the two kernels, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/cross_entropy.h"
#include "ops/fp8.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cross_entropy.h"
#endif

namespace hgrn {
namespace {

using testing::expect_close;
using testing::max_abs;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;

constexpr int64_t kIgnore = -100;

struct Reference {
  double loss = 0;
  int64_t num_targets = 0, num_correct = 0;
  Tensor dlogits;  // g0 + (softmax - onehot) * dloss / num_targets on counted rows
};

// Everything in fp64 from the values the GPU sees; argmax is the first maximal logit, as the CPU op defines it.
Reference reference(const Tensor& logits, const std::vector<int64_t>& targets, double dloss, const Tensor& g0) {
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const std::vector<double> x = logits.to_double_vector();
  std::vector<double> g = g0.to_double_vector();
  std::vector<double> lse(static_cast<size_t>(rows), 0.0);
  Reference ref;
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == kIgnore) continue;
    const double* row = x.data() + r * vocab;
    int64_t argmax = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (row[v] > row[argmax]) argmax = v;
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - row[argmax]);
    lse[r] = row[argmax] + std::log(sum);
    total += lse[r] - row[targets[r]];
    ref.num_targets += 1;
    ref.num_correct += argmax == targets[r];
  }
  ref.loss = ref.num_targets > 0 ? total / static_cast<double>(ref.num_targets) : 0.0;
  if (ref.num_targets > 0) {
    const double scale = dloss / static_cast<double>(ref.num_targets);
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] == kIgnore) continue;
      for (int64_t v = 0; v < vocab; ++v)
        g[r * vocab + v] += scale * (std::exp(x[r * vocab + v] - lse[r]) - (v == targets[r] ? 1.0 : 0.0));
    }
  }
  ref.dlogits = Tensor::from_vector(g, logits.shape());
  return ref;
}

Tensor targets_tensor(const std::vector<int64_t>& targets, DType dtype) {
  return Tensor::from_vector(targets, {static_cast<int64_t>(targets.size())}).to(dtype);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() && std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// Runs the GPU op on (logits, targets) with an existing gradient g0 and dloss 0.7, and checks it against the
// fp64 reference. The logits and g0 passed in are already rounded through `act`.
void check_against_reference(const Tensor& logits, const std::vector<int64_t>& targets, const Tensor& g0, DType act,
                             DType target_dtype) {
  const double dloss = 0.7;
  const Reference ref = reference(logits, targets, dloss, g0);
  Tape tape;
  Var lg = make_var(to_gpu(logits, act), true, "logits");
  lg->grad = to_gpu(g0, act);
  CrossEntropyResult r = cross_entropy(tape, lg, targets_tensor(targets, target_dtype).to(Device::CUDA), kIgnore);
  EXPECT_EQ(r.loss->value.dim(), 0);
  EXPECT_EQ(r.loss->value.dtype(), DType::F32);
  EXPECT_EQ(r.loss->value.device(), Device::CUDA);
  EXPECT_EQ(r.num_targets, ref.num_targets);
  EXPECT_EQ(r.num_correct, ref.num_correct);
  // Per-row fp32 log-sum-exp (rows of ~10) and an fp32 sum over rows: ~1e-7 relative.
  expect_close(r.loss->value, Tensor::full({}, ref.loss, DType::F64), 1e-5, 1e-5 * std::max(1.0, ref.loss), "loss");
  tape.backward(r.loss, Tensor::full({}, dloss, DType::F32));
  const double scale = max_abs(ref.dlogits);
  if (act == DType::F32)  // fp32 exp and one fused add per element
    expect_close(lg->grad, ref.dlogits, 1e-5, 1e-5 * scale, "dlogits");
  else  // the result is stored in bf16: 2^-9 relative rounding per element
    expect_close(lg->grad, ref.dlogits, 1e-2, 1e-2 * scale, "dlogits");
}

TEST(CrossEntropyCuda, MatchesFp64Reference) {
  HGRN_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t rows, vocab;
  };
  const Case cases[] = {{1, 41}, {63, 5003}, {65, 41}, {2047, 5003}, {63, 50304}, {2047, 41}, {65, 50304}};
  Rng rng(201);
  for (const Case& c : cases) {
    for (DType act : {DType::F32, DType::BF16}) {
      const DType target_dtype = c.rows % 2 ? DType::I64 : DType::I32;
      SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " vocab " << c.vocab << " " << dtype_name(act)
                                        << " targets " << dtype_name(target_dtype));
      Tensor logits = random_tensor(rng, {c.rows, c.vocab}, 3.0);
      std::vector<int64_t> targets(static_cast<size_t>(c.rows));
      for (int64_t r = 0; r < c.rows; ++r) {
        targets[r] = c.rows > 1 && r % 5 == 2 ? kIgnore : static_cast<int64_t>(rng.below(c.vocab));
        if (targets[r] != kIgnore && r % 3 == 0)  // a third of the rows predicted right, so num_correct is tested
          logits.set_item(r * c.vocab + targets[r], logits.item(r * c.vocab + targets[r]) + 12.0);
      }
      targets.back() = c.vocab - 1;  // the last class, at the end of the last row
      const Tensor x = round_through(logits, act);
      // An existing gradient of the size of the softmax terms, so that accumulation (+=) is checked too.
      const Tensor g0 = round_through(random_tensor(rng, {c.rows, c.vocab}, 1.0 / (c.vocab * c.rows)), act);
      check_against_reference(x, targets, g0, act, target_dtype);
    }
  }
}

TEST(CrossEntropyCuda, TiesAndExtremeLogits) {
  HGRN_SKIP_WITHOUT_GPU();
  Tensor logits = Tensor::from_vector<double>({1000, -1000, 0, 0,   // target 1: loss 2000
                                               0, 999, 0, 0,        // target 0: loss ~999, no overflow
                                               2, 5, 5, 1,          // target 2: tied with 1, which comes first: wrong
                                               2, 5, 5, 1,          // target 1: the first maximal logit: right
                                               3, 3, 3, 3,          // target 0: all tied: right, loss log 4
                                               9, 9, 9, 9},         // ignored
                                              {6, 4});
  const std::vector<int64_t> targets = {1, 0, 2, 1, 0, kIgnore};
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    const Tensor x = round_through(logits, act);
    check_against_reference(x, targets, Tensor::zeros({6, 4}, DType::F64), act, DType::I64);
    Tape tape;
    CrossEntropyResult r = cross_entropy(tape, make_var(to_gpu(x, act)), targets_tensor(targets, DType::I32).to(Device::CUDA));
    EXPECT_EQ(r.num_targets, 5);
    EXPECT_EQ(r.num_correct, 2);
  }
}

TEST(CrossEntropyCuda, AllRowsIgnoredGivesZeroLossAndZeroGradient) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(202);
  for (DType act : {DType::F32, DType::BF16}) {
    Tape tape;
    Var lg = make_var(to_gpu(random_tensor(rng, {65, 41}), act), true, "logits");
    CrossEntropyResult r = cross_entropy(
        tape, lg, targets_tensor(std::vector<int64_t>(65, kIgnore), DType::I32).to(Device::CUDA), kIgnore);
    EXPECT_EQ(r.num_targets, 0);
    EXPECT_EQ(r.num_correct, 0);
    EXPECT_EQ(r.loss->value.to(Device::CPU).item(), 0.0);
    tape.backward(r.loss);
    ASSERT_TRUE(lg->grad.defined());
    expect_close(lg->grad, Tensor::zeros({65, 41}, DType::F64), 0.0, 0.0, "dlogits");  // exactly zero
  }
}

TEST(CrossEntropyCuda, BitwiseReproducible) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(203);
  const int64_t rows = 2047, vocab = 5003;
  Tensor logits = to_gpu(random_tensor(rng, {rows, vocab}, 3.0), DType::BF16);
  std::vector<int64_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = r % 7 == 3 ? kIgnore : static_cast<int64_t>(rng.below(vocab));
  Tensor targets = targets_tensor(t, DType::I64).to(Device::CUDA);
  Tensor first_loss, first_grad;
  for (int run = 0; run < 2; ++run) {
    Tape tape;
    Var lg = make_var(logits, true, "logits");
    CrossEntropyResult r = cross_entropy(tape, lg, targets);
    tape.backward(r.loss);
    if (run == 0) {
      first_loss = r.loss->value;
      first_grad = lg->grad;
    } else {
      EXPECT_TRUE(same_bits(r.loss->value, first_loss));
      EXPECT_TRUE(same_bits(lg->grad, first_grad));
    }
  }
}

// The chunked head's one-pass forward + gradient (cross_entropy_forward_gradient_cuda) against the forward and
// backward kernels it stands for (dloss 1, one target, overwriting the logits): loss, log-sum-exp, targets, counts and
// the gradient bit for bit, on rows with ignored and out-of-range targets, ties (integer logits), small and real
// vocabularies. Where a row does not suit it (unaligned rows; fp32 rows of the 50k vocabulary, two of which exceed
// an SM's shared memory) it must say so and leave everything untouched.
TEST(CrossEntropyCuda, OnePassGradientHasTheTwoKernelBits) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  struct Case {
    DType act;
    int64_t rows, vocab;
    bool one_pass;
  };
  for (const Case& c : {Case{DType::BF16, 37, 64, true}, Case{DType::BF16, 129, 1000, true},
                        Case{DType::F32, 65, 1004, true}, Case{DType::BF16, 300, 50304, true},
                        Case{DType::F32, 7, 50304, false}, Case{DType::BF16, 9, 37, false}}) {
    SCOPED_TRACE(detail::concat(dtype_name(c.act), " rows ", c.rows, " vocab ", c.vocab));
    Rng rng(static_cast<uint64_t>(c.rows * 7 + c.vocab));
    Tensor x = random_tensor(rng, {c.rows, c.vocab}, 3.0);
    for (int64_t v = 0; v < c.vocab; v += 3) x.set_item(2 * c.vocab + v, 5.0);  // row 2: ties at its maximum
    const Tensor logits = to_gpu(x, c.act);
    std::vector<int64_t> t(static_cast<size_t>(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) t[r] = r % 5 == 1 ? kIgnore : static_cast<int64_t>(rng.below(c.vocab));
    t[0] = c.vocab;  // out of range: the row counts as ignored, and the counts name it
    const Tensor targets = targets_tensor(t, DType::I32).to(Device::CUDA);
    struct Outputs {
      Tensor logits, loss, lse, row_target, counts, scratch;
    };
    auto outputs = [&]() {
      return Outputs{logits.clone(), Tensor::zeros({1}, DType::F32, Device::CUDA),
                     Tensor::zeros({c.rows}, DType::F32, Device::CUDA),
                     Tensor::zeros({c.rows}, DType::I32, Device::CUDA),
                     Tensor::zeros({kCrossEntropyCountSlots}, DType::I64, Device::CUDA),
                     Tensor::zeros({static_cast<int64_t>((cross_entropy_scratch_bytes(c.rows) + 7) / 8)}, DType::I64,
                                   Device::CUDA)};
    };
    Outputs two = outputs(), one = outputs();
    const Tensor dloss = Tensor::full({}, 1.0, DType::F32, Device::CUDA);
    cross_entropy_forward_cuda(two.logits.raw_data(), c.act, targets.raw_data(), DType::I32, c.rows, c.vocab, kIgnore,
                               two.loss.data<float>(), two.lse.data<float>(), two.row_target.data<int32_t>(),
                               two.counts.data<int64_t>(), two.scratch.raw_data());
    cross_entropy_backward_cuda(two.logits.raw_data(), c.act, two.lse.data<float>(), two.row_target.data<int32_t>(),
                                dloss.data<float>(), 1, two.logits.raw_data(), c.rows, c.vocab, false);
    const bool ran = cross_entropy_forward_gradient_cuda(
        one.logits.raw_data(), c.act, targets.raw_data(), DType::I32, c.rows, c.vocab, kIgnore, one.loss.data<float>(),
        one.lse.data<float>(), one.row_target.data<int32_t>(), one.counts.data<int64_t>(), one.scratch.raw_data());
    ASSERT_EQ(ran, c.one_pass);
    if (!ran) {
      EXPECT_TRUE(same_bits(one.logits, logits)) << "logits changed";
      EXPECT_EQ(one.counts.to(Device::CPU).item(0), 0) << "counts written";
      continue;
    }
    EXPECT_TRUE(same_bits(one.logits, two.logits)) << "dlogits";
    EXPECT_TRUE(same_bits(one.loss, two.loss)) << "loss";
    EXPECT_TRUE(same_bits(one.lse, two.lse)) << "log-sum-exp";
    EXPECT_TRUE(same_bits(one.row_target, two.row_target)) << "targets";
    EXPECT_TRUE(same_bits(one.counts, two.counts)) << "counts";
    EXPECT_EQ(one.counts.to(Device::CPU).item(2), 0) << "the first bad row";
    EXPECT_GT(one.counts.to(Device::CPU).item(0), c.rows / 2) << "targets counted";
    EXPECT_FALSE(same_bits(one.logits, logits)) << "the gradient was written over the logits";

    // The gradient as FP8 codes instead (the LM head in FP8): the codes of the gradient stored above, cast by the
    // reference (E5M2 at scale 2048), its amax, the logits left alone and every other output the same.
    Outputs coded = outputs();
    const float scale = 2048.0f;
    const Tensor scale_t = Tensor::full({1}, scale, DType::F32, Device::CUDA),
                 amax_t = Tensor::zeros({1}, DType::F32, Device::CUDA);
    const int64_t n = c.rows * c.vocab;
    const Tensor codes = Tensor::zeros({(n + 3) / 4}, DType::I32, Device::CUDA);
    const Fp8CodesOut out{static_cast<uint8_t*>(codes.raw_data()), scale_t.data<float>(), amax_t.data<float>(),
                          Fp8Format::E5M2};
    ASSERT_TRUE(cross_entropy_forward_gradient_cuda(
        coded.logits.raw_data(), c.act, targets.raw_data(), DType::I32, c.rows, c.vocab, kIgnore,
        coded.loss.data<float>(), coded.lse.data<float>(), coded.row_target.data<int32_t>(),
        coded.counts.data<int64_t>(), coded.scratch.raw_data(), &out));
    EXPECT_TRUE(same_bits(coded.logits, logits)) << "the logits were left alone";
    EXPECT_TRUE(same_bits(coded.loss, one.loss)) << "loss";
    EXPECT_TRUE(same_bits(coded.lse, one.lse)) << "log-sum-exp";
    EXPECT_TRUE(same_bits(coded.counts, one.counts)) << "counts";
    const Tensor g = one.logits.to(Device::CPU).to(DType::F32);
    std::vector<uint8_t> want(static_cast<size_t>(n));
    fp8_quantize(g.data<float>(), n, scale, Fp8Format::E5M2, want.data());
    const Tensor got = codes.to(Device::CPU);
    const uint8_t* got_codes = static_cast<const uint8_t*>(got.raw_data());
    EXPECT_EQ(std::vector<uint8_t>(got_codes, got_codes + n), want) << "codes";
    EXPECT_EQ(amax_t.to(Device::CPU).data<float>()[0], fp8_amax(g.data<float>(), n)) << "amax";
  }
#endif
}

// More than 2^31 logits (42700 rows of a 50304 vocab, bf16): any 32-bit index in the kernels would wrap. The rows
// are constant (cheap to fill and to check: loss log V, gradient (1/V - onehot) / N) except the last, which is random.
TEST(CrossEntropyCuda, LogitsPast2To31Elements) {
  HGRN_SKIP_WITHOUT_GPU();
  const int64_t rows = 42700, vocab = 50304;
  ASSERT_GT(rows * vocab, int64_t{1} << 31);
  Rng rng(204);
  Tensor last = round_through(random_tensor(rng, {1, vocab}, 3.0), DType::BF16);
  const std::vector<int64_t> last_target = {12345};
  Tensor logits = Tensor::zeros({rows, vocab}, DType::BF16, Device::CUDA);
  logits.select_row(rows - 1).copy_from(last.to(DType::BF16).reshape({vocab}));
  std::vector<int64_t> t(rows, 0);
  t.back() = last_target[0];

  Tape tape;
  Var lg = make_var(logits, true, "logits");
  CrossEntropyResult r = cross_entropy(tape, lg, targets_tensor(t, DType::I32).to(Device::CUDA));
  const Reference last_ref = reference(last, last_target, 1.0, Tensor::zeros({1, vocab}, DType::F64));
  EXPECT_EQ(r.num_targets, rows);
  EXPECT_EQ(r.num_correct, rows - 1 + last_ref.num_correct);  // a constant row's first maximal logit is class 0
  const double want = ((rows - 1) * std::log(static_cast<double>(vocab)) + last_ref.loss) / rows;
  // fp32 sums of ~42 rows per thread then a 1024-way tree: ~1e-6 relative.
  expect_close(r.loss->value, Tensor::full({}, want, DType::F64), 1e-5, 1e-5 * want, "loss");
  tape.backward(r.loss);

  Tensor constant_row = Tensor::full({vocab}, 1.0 / vocab / rows, DType::F64);
  constant_row.set_item(0, (1.0 / vocab - 1.0) / rows);
  // bf16 storage of the gradient: 2^-9 relative per element.
  for (int64_t row : {int64_t{0}, int64_t{42691}, rows - 2})
    expect_close(lg->grad.select_row(row), constant_row, 1e-2, 1e-2 / rows, "dlogits constant row");
  Tensor last_grad = last_ref.dlogits.reshape({vocab});
  for (int64_t v = 0; v < vocab; ++v) last_grad.set_item(v, last_grad.item(v) / rows);  // dloss / N, not / 1
  expect_close(lg->grad.select_row(rows - 1), last_grad, 1e-2, 1e-2 * max_abs(last_grad), "dlogits last row");
}

TEST(CrossEntropyCuda, OutOfRangeTargetIsAnError) {
  HGRN_SKIP_WITHOUT_GPU();
  Tape tape;
  Var lg = make_var(Tensor::zeros({4, 5003}, DType::BF16, Device::CUDA), true, "logits");
  auto message = [&](const std::vector<int64_t>& targets, DType dtype) -> std::string {
    try {
      cross_entropy(tape, lg, targets_tensor(targets, dtype).to(Device::CUDA), kIgnore);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string m = message({1, 5003, kIgnore, 7000}, DType::I32);
  EXPECT_NE(m.find("target 5003 in row 1"), std::string::npos) << m;
  EXPECT_NE(m.find("vocab size 5003"), std::string::npos) << m;
  m = message({kIgnore, kIgnore, 0, -1}, DType::I64);  // -1 is not the ignore_index
  EXPECT_NE(m.find("target -1 in row 3"), std::string::npos) << m;
  m = message({0, int64_t{1} << 33, 0, 0}, DType::I64);  // would wrap to 0 as an int32
  EXPECT_NE(m.find("target 8589934592 in row 1"), std::string::npos) << m;
  EXPECT_EQ(tape.size(), 0u);
  // Targets must live with the logits, and match their rows.
  EXPECT_THROW(cross_entropy(tape, lg, targets_tensor({0, 1, 2, 3}, DType::I32)), Error);
  EXPECT_THROW(cross_entropy(tape, lg, targets_tensor({0, 1, 2}, DType::I32).to(Device::CUDA)), Error);
}

}  // namespace
}  // namespace hgrn
