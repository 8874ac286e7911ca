// test_embedding_cuda.cpp: the CUDA embedding against the fp64 reference (gather and scatter-add with many repeated
// ids, fp32 and bf16 outputs, odd widths and token counts), bit-for-bit against the CPU op in fp32 (same summation
// order) and against itself run to run, at a real model's size, and its errors (bad ids, mismatched devices/dtypes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/embedding.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;

// Ids with heavy repetition: half come from a few hot tokens (so one weight row sums hundreds of dy rows, as common
// tokens do in real text), the rest are uniform over the vocab; the first and last ids of the vocab always appear.
Tensor repeated_ids(Rng& rng, const Shape& shape, int64_t vocab, DType dtype) {
  Tensor ids = Tensor::empty(shape, dtype);
  const int64_t hot[] = {0, vocab - 1, 7 % vocab, vocab / 2};
  for (int64_t i = 0; i < ids.numel(); ++i)
    ids.set_item(i, static_cast<double>(rng.below(2) ? hot[rng.below(4)] : static_cast<int64_t>(rng.below(vocab))));
  if (ids.numel() >= 2) {
    ids.set_item(0, 0);
    ids.set_item(ids.numel() - 1, static_cast<double>(vocab - 1));
  }
  return ids;
}

// How many positions each id of the vocab has.
std::vector<int64_t> id_counts(const Tensor& ids, int64_t vocab) {
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  const Tensor host = ids.to(Device::CPU);
  for (int64_t i = 0; i < host.numel(); ++i) ++counts[static_cast<size_t>(host.item(i))];
  return counts;
}

// The GPU adds an id's rows one by one in position order, as the CPU does, for ids with at most this many positions;
// more frequent ids are summed in chunks (embedding.h), so only the former match the CPU bit for bit.
constexpr int64_t kInOrderRun = 128;

// Rows of a [vocab, width] gradient: bitwise equal where the id's count is at most kInOrderRun. Returns how many rows
// were compared that way.
int64_t expect_in_order_rows_bitwise(const Tensor& gpu, const Tensor& cpu, const std::vector<int64_t>& counts) {
  const Tensor g = gpu.to(Device::CPU), c = cpu.to(Device::CPU);
  const int64_t width = g.size(1);
  int64_t compared = 0;
  for (size_t id = 0; id < counts.size(); ++id) {
    if (counts[id] > kInOrderRun) continue;
    ++compared;
    const size_t offset = id * static_cast<size_t>(width) * sizeof(float);
    EXPECT_EQ(std::memcmp(static_cast<const char*>(g.raw_data()) + offset,
                          static_cast<const char*>(c.raw_data()) + offset, static_cast<size_t>(width) * sizeof(float)),
              0)
        << "dweight row " << id << " (" << counts[id] << " positions) differs in bits from the CPU's in-order sum";
  }
  return compared;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() && std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

struct Case {
  int64_t vocab, width;
  Shape ids_shape;
};

TEST(EmbeddingCuda, MatchesFp64ReferenceWithRepeatedIds) {
  HGRN_SKIP_WITHOUT_GPU();
  const Case cases[] = {{41, 96, {1, 1}},       {41, 771, {23, 89}}, {5003, 96, {7, 9}},
                        {5003, 771, {65}},      {41, 200, {63}},     {5003, 200, {2047}}};
  Rng rng(101);
  for (const Case& c : cases) {
    for (DType act : {DType::F32, DType::BF16}) {
      const DType id_dtype = c.ids_shape.size() == 2 ? DType::I32 : DType::I64;
      SCOPED_TRACE(::testing::Message() << "vocab " << c.vocab << " width " << c.width << " ids "
                                        << shape_str(c.ids_shape) << " " << dtype_name(id_dtype) << " out "
                                        << dtype_name(act));
      const int64_t n = shape_numel(c.ids_shape);
      Tensor w = random_tensor(rng, {c.vocab, c.width}, 1.0, DType::F32).to(DType::F64);  // fp32-exact values
      Tensor ids = repeated_ids(rng, c.ids_shape, c.vocab, id_dtype);
      Shape y_shape = c.ids_shape;
      y_shape.push_back(c.width);
      Tensor dy = round_through(random_tensor(rng, y_shape), act);           // what a bf16 run sees
      Tensor g0 = random_tensor(rng, {c.vocab, c.width}, 1.0, DType::F32).to(DType::F64);  // existing gradient

      // fp64 reference: y = W[ids]; dW = g0 + sum over positions of dy.
      Tensor y_ref = Tensor::empty(y_shape, DType::F64), dw_ref = g0.clone();
      for (int64_t r = 0; r < n; ++r) {
        const int64_t id = static_cast<int64_t>(ids.item(r));
        for (int64_t k = 0; k < c.width; ++k) {
          y_ref.set_item(r * c.width + k, w.item(id * c.width + k));
          dw_ref.set_item(id * c.width + k, dw_ref.item(id * c.width + k) + dy.item(r * c.width + k));
        }
      }

      Tape tape;
      Var weight = make_var(to_gpu(w, DType::F32), true, "weight");
      weight->grad = to_gpu(g0, DType::F32);
      Var y = embedding(tape, weight, ids.to(Device::CUDA), act);
      EXPECT_EQ(y->value.dtype(), act);
      EXPECT_EQ(y->value.device(), Device::CUDA);
      // A gather is exact: the only rounding is the fp32 -> bf16 store, which round_through does the same way.
      expect_close(y->value, round_through(y_ref, act), 0.0, 0.0, "y");
      tape.backward(y, to_gpu(dy, act));
      // dW sums up to ~n/8 + n/vocab rows per token in fp32, in position order: typical error ~1e-7 relative, and
      // 1e-3 bounds the worst case of ~300 adds of partial sums ~30 at fp32's 6e-8.
      expect_close(weight->grad, dw_ref, 1e-5, 1e-3, "dweight");

      // The CPU op in fp32 adds the same rows in the same order onto the same start: identical bits for every id
      // but the frequent ones.
      Tape cpu_tape;
      Var cpu_weight = make_var(w.to(DType::F32), true, "weight");
      cpu_weight->grad = g0.to(DType::F32);
      cpu_tape.backward(embedding(cpu_tape, cpu_weight, ids), dy.to(DType::F32));
      EXPECT_GT(expect_in_order_rows_bitwise(weight->grad, cpu_weight->grad, id_counts(ids, c.vocab)), 0);
    }
  }
}

TEST(EmbeddingCuda, BitwiseReproducible) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(102);
  const int64_t vocab = 5003, width = 771;
  Tensor ids = repeated_ids(rng, {3, 683}, vocab, DType::I64).to(Device::CUDA);
  Tensor w = to_gpu(random_tensor(rng, {vocab, width}), DType::F32);
  Tensor dy = to_gpu(random_tensor(rng, {3, 683, width}), DType::BF16);
  Tensor first_y, first_dw;
  for (int run = 0; run < 2; ++run) {
    Tape tape;
    Var weight = make_var(w, true, "weight");  // shares w's storage: the gradient is fresh each run
    Var y = embedding(tape, weight, ids, DType::BF16);
    tape.backward(y, dy);
    if (run == 0) {
      first_y = y->value;
      first_dw = weight->grad;
    } else {
      EXPECT_TRUE(same_bits(y->value, first_y));
      EXPECT_TRUE(same_bits(weight->grad, first_dw));
    }
  }
}

// A model's real shape: 16 x 2048 tokens of a 50304-token vocab, D 768, bf16 activations; checked bit for bit
// against the CPU op where ids are not frequent, and close to it where they are (the fp64 comparisons above cover
// the arithmetic; this covers grid sizes and the sort at scale).
TEST(EmbeddingCuda, RealModelSizeMatchesCpuBitForBit) {
  HGRN_SKIP_WITHOUT_GPU();
  const int64_t vocab = 50304, width = 768, batch = 16, seq = 2048;
  // Cheap deterministic values (an LCG) instead of 63M normal draws.
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) / static_cast<float>(1 << 23);
  };
  std::vector<float> wv(static_cast<size_t>(vocab * width)), dyv(static_cast<size_t>(batch * seq * width));
  for (float& v : wv) v = next();
  for (float& v : dyv) v = static_cast<float>(bf16(next()));  // bf16-exact, so the GPU's dy equals the CPU's
  std::vector<int32_t> idv(static_cast<size_t>(batch * seq));
  for (int32_t& id : idv) {  // Zipf-like: low ids far more frequent, like real token frequencies
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const double u = static_cast<double>(state >> 11) / 9007199254740992.0;
    id = static_cast<int32_t>(std::min<double>(vocab - 1, std::pow(static_cast<double>(vocab), u) - 1));
  }
  Tensor w = Tensor::from_vector(wv, {vocab, width});
  Tensor dy = Tensor::from_vector(dyv, {batch, seq, width});
  Tensor ids = Tensor::from_vector(idv, {batch, seq});

  Tape cpu_tape;
  Var cpu_weight = make_var(w, true, "weight");
  Var cpu_y = embedding(cpu_tape, cpu_weight, ids);
  cpu_tape.backward(cpu_y, dy);

  Tape tape;
  Var weight = make_var(w.to(Device::CUDA), true, "weight");
  Var y = embedding(tape, weight, ids.to(Device::CUDA), DType::BF16);
  tape.backward(y, dy.to(DType::BF16).to(Device::CUDA));
  EXPECT_TRUE(same_bits(y->value, cpu_y->value.to(DType::BF16)));
  const std::vector<int64_t> counts = id_counts(ids, vocab);
  EXPECT_GT(*std::max_element(counts.begin(), counts.end()), 10 * kInOrderRun);  // the chunked sums are exercised
  EXPECT_GT(expect_in_order_rows_bitwise(weight->grad, cpu_weight->grad, counts), 1000);
  // fp32 sums of up to ~2000 values of size ~1 in another grouping: differences of a few ulps of the sum.
  expect_close(weight->grad, cpu_weight->grad, 1e-5, 1e-4, "dweight");
}

// Frequent ids as MQAR's filler gives them (most positions one token) and runs of lengths around the chunk of 128
// sorted positions (127, 128, 129, 256, 257, runs that end exactly at a chunk boundary), with an odd total: every
// case of the chunked sums, against the fp64 reference, and bitwise run to run.
TEST(EmbeddingCuda, FrequentIdsMatchFp64AndRepeat) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(104);
  const int64_t vocab = 97, width = 67;
  for (const std::vector<int64_t>& runs :
       {std::vector<int64_t>{1, 127, 128, 129, 256, 257, 3, 1000, 128, 2},
        std::vector<int64_t>{128, 128, 128, 1, 5000}, std::vector<int64_t>{129}, std::vector<int64_t>{3000, 0, 1}}) {
    std::vector<int32_t> idv;
    for (size_t r = 0; r < runs.size(); ++r) idv.insert(idv.end(), static_cast<size_t>(runs[r]), static_cast<int32_t>(r * 7 % vocab));
    for (size_t i = idv.size(); i > 1; --i) std::swap(idv[i - 1], idv[rng.below(i)]);  // positions shuffled
    const int64_t n = static_cast<int64_t>(idv.size());
    SCOPED_TRACE(::testing::Message() << n << " ids");
    Tensor ids = Tensor::from_vector(idv, {n});
    Tensor dy = round_through(random_tensor(rng, {n, width}), DType::BF16);
    Tensor g0 = random_tensor(rng, {vocab, width}, 1.0, DType::F32).to(DType::F64);
    Tensor dw_ref = g0.clone();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = 0; k < width; ++k) {
        const int64_t at = static_cast<int64_t>(idv[static_cast<size_t>(r)]) * width + k;
        dw_ref.set_item(at, dw_ref.item(at) + dy.item(r * width + k));
      }
    Tensor first;
    for (int run = 0; run < 2; ++run) {
      Tape tape;
      Var weight = make_var(to_gpu(random_tensor(rng, {vocab, width}), DType::F32), true, "weight");
      weight->grad = to_gpu(g0, DType::F32);
      tape.backward(embedding(tape, weight, ids.to(Device::CUDA), DType::BF16), to_gpu(dy, DType::BF16));
      // Sums of up to 5000 terms of size ~1 in fp32, in chunks of 128: errors ~1e-5 of the sum's scale (~70).
      expect_close(weight->grad, dw_ref, 1e-4, 1e-3, "dweight");
      if (run == 0) first = weight->grad;
      else EXPECT_TRUE(same_bits(weight->grad, first));
    }
  }
}

TEST(EmbeddingCuda, WithoutGradientAndWithNoIds) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(103);
  Tensor w = random_tensor(rng, {41, 96}, 1.0, DType::F32);
  Var weight = make_var(w.to(Device::CUDA), true, "weight");
  Tensor ids = Tensor::from_vector<int32_t>({40, 3, 3}, {3});
  Tape no_grad;
  no_grad.set_enabled(false);
  Var y = embedding(no_grad, weight, ids.to(Device::CUDA), DType::F32);
  EXPECT_FALSE(y->requires_grad);
  expect_close(y->value, embedding(no_grad, make_var(w), ids)->value, 0.0, 0.0, "y without a tape");  // a gather

  Tape tape;  // zero tokens: an empty output, and a backward that leaves the gradient zero
  Var empty = embedding(tape, weight, Tensor::empty({0}, DType::I64).to(Device::CUDA), DType::BF16);
  EXPECT_EQ(empty->value.shape(), (Shape{0, 96}));
  tape.backward(empty, Tensor::empty({0, 96}, DType::BF16));
  expect_close(weight->grad, Tensor::zeros({41, 96}, DType::F64), 0.0, 0.0, "dweight of no tokens");
}

// Ids given on the GPU are checked there; ids given on the host (a training batch's) are checked on the host before
// their upload. Both name the first bad id and its position.
TEST(EmbeddingCuda, OutOfRangeIdIsAnErrorNamingIdAndPosition) {
  HGRN_SKIP_WITHOUT_GPU();
  for (Device ids_device : {Device::CUDA, Device::CPU}) {
    SCOPED_TRACE(device_name(ids_device));
    Tape tape;
    Var weight = make_var(Tensor::zeros({41, 8}, DType::F32, Device::CUDA), true, "weight");
    auto message = [&](const Tensor& ids) -> std::string {
      try {
        embedding(tape, weight, ids.to(ids_device), DType::BF16);
      } catch (const Error& e) {
        return e.what();
      }
      return "(no error)";
    };
    // The first bad position is reported, whichever thread finds its id first.
    std::string m = message(Tensor::from_vector<int32_t>({0, 3, 41, 2, -1, 41}, {2, 3}));
    EXPECT_NE(m.find("id 41 at position 2"), std::string::npos) << m;
    EXPECT_NE(m.find("vocab size 41"), std::string::npos) << m;
    m = message(Tensor::from_vector<int64_t>({5, -1}, {2}));
    EXPECT_NE(m.find("id -1 at position 1"), std::string::npos) << m;
    m = message(Tensor::from_vector<int64_t>({int64_t{1} << 40}, {1}));  // would wrap to 0 as an int32
    EXPECT_NE(m.find("id 1099511627776 at position 0"), std::string::npos) << m;
    std::vector<int32_t> many(5000, 1);
    many[4321] = 1000;
    m = message(Tensor::from_vector<int32_t>(many, {5000}));
    EXPECT_NE(m.find("id 1000 at position 4321"), std::string::npos) << m;
    EXPECT_EQ(tape.size(), 0u);
  }
}

// Host ids for a GPU weight give the rows and the weight gradient that the same ids on the GPU give, bit for bit,
// and the caller may overwrite its host buffer as soon as the call returns (the upload went through staging).
TEST(EmbeddingCuda, HostIdsGiveWhatDeviceIdsGive) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(31);
  const int64_t vocab = 1000, width = 72, rows = 3001;
  Tensor w_host = Tensor::empty({vocab, width}, DType::F32);
  for (int64_t i = 0; i < w_host.numel(); ++i) w_host.set_item(i, rng.normal());
  Tensor ids = Tensor::empty({rows}, DType::I32);
  for (int64_t i = 0; i < rows; ++i) ids.set_item(i, static_cast<double>(rng.below(vocab)));
  Tensor dy = Tensor::empty({rows, width}, DType::F32);
  for (int64_t i = 0; i < dy.numel(); ++i) dy.set_item(i, rng.normal());
  const Tensor dy_device = dy.to(Device::CUDA).to(DType::BF16);
  auto run = [&](const Tensor& given_ids, Tensor* host_to_overwrite) {
    Tape tape;
    Var weight = make_var(w_host.to(Device::CUDA), true, "weight");
    Var y = embedding(tape, weight, given_ids, DType::BF16);
    if (host_to_overwrite)
      for (int64_t i = 0; i < rows; ++i) host_to_overwrite->set_item(i, 0.0);
    tape.backward(y, dy_device);
    return std::pair<Tensor, Tensor>{y->value.to(Device::CPU), weight->grad.to(Device::CPU)};
  };
  const auto [y_device_ids, dw_device_ids] = run(ids.to(Device::CUDA), nullptr);
  Tensor scratch_ids = ids.clone();
  const auto [y_host_ids, dw_host_ids] = run(scratch_ids, &scratch_ids);
  ASSERT_EQ(y_host_ids.nbytes(), y_device_ids.nbytes());
  EXPECT_EQ(std::memcmp(y_host_ids.raw_data(), y_device_ids.raw_data(), y_device_ids.nbytes()), 0);
  EXPECT_EQ(std::memcmp(dw_host_ids.raw_data(), dw_device_ids.raw_data(), dw_device_ids.nbytes()), 0);
}

TEST(EmbeddingCuda, RejectsMismatchedDevicesAndDtypes) {
  HGRN_SKIP_WITHOUT_GPU();
  Tape tape;
  Var weight = make_var(Tensor::zeros({5, 2}, DType::F32, Device::CUDA), true, "weight");
  Tensor ids = Tensor::from_vector<int32_t>({0, 1}, {2});
  EXPECT_THROW(embedding(tape, weight, ids.to(Device::CUDA), DType::F64), Error);         // not an activation dtype
  Var bf16_weight = make_var(Tensor::zeros({5, 2}, DType::BF16, Device::CUDA), true, "w");  // parameters are fp32
  EXPECT_THROW(embedding(tape, bf16_weight, ids.to(Device::CUDA), DType::BF16), Error);
  Var cpu_weight = make_var(Tensor::zeros({5, 2}, DType::F32), true, "cpu weight");
  EXPECT_THROW(embedding(tape, cpu_weight, ids.to(Device::CUDA), DType::F32), Error);    // GPU ids, CPU weight
}

TEST(EmbeddingCuda, CpuOutputDtypeMustBeTheWeightDtype) {  // runs without a GPU too
  Tape tape;
  Var weight = make_var(Tensor::zeros({5, 2}, DType::F64), true, "weight");
  Tensor ids = Tensor::from_vector<int32_t>({0, 4}, {2});
  EXPECT_EQ(embedding(tape, weight, ids, DType::F64)->value.dtype(), DType::F64);
  try {
    embedding(tape, weight, ids, DType::F32);
    FAIL() << "a fp32 output from a fp64 CPU weight was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be the weight's"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hgrn
