// test_cuda_device.cpp: device memory through Tensor: round trips between host and GPU, the fp32 -> bf16 cast's
// bits, and the out-of-memory message. Skipped (never passed) where this build has no CUDA or no GPU is visible.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace hgrn {
namespace {

#define SKIP_WITHOUT_GPU()                                                                              \
  do {                                                                                                  \
    if (!cuda_available()) GTEST_SKIP() << "no GPU: this build has no CUDA backend or no device is visible"; \
  } while (0)

TEST(CudaDevice, TensorsRoundTripThroughDeviceMemory) {
  SKIP_WITHOUT_GPU();
  Rng rng(11);
  for (DType dtype : {DType::F32, DType::BF16, DType::F64, DType::I32, DType::I64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor host = Tensor::empty({3, 1000, 7}, dtype);  // odd sizes, not a multiple of any vector width
    for (int64_t i = 0; i < host.numel(); ++i) host.set_item(i, static_cast<double>(rng.below(20000)) - 10000.0);
    Tensor device = Tensor::full(host.shape(), -7.0, dtype, Device::CUDA);  // poisoned: an unwritten copy shows
    device.copy_from(host);
    Tensor device2 = device.clone();  // device-to-device
    Tensor back = device2.to(Device::CPU);
    EXPECT_EQ(back.device(), Device::CPU);
    EXPECT_EQ(std::memcmp(back.raw_data(), host.raw_data(), host.nbytes()), 0);
  }
}

// Uploads go through a pinned staging ring without waiting for the GPU: the caller may overwrite its buffer at once,
// and uploads that wrap around the ring (40 MiB through 16) each arrive intact, also with odd sizes and row copies.
TEST(CudaDevice, UploadsArriveIntactWhenTheCallerReusesItsBuffer) {
  SKIP_WITHOUT_GPU();
  Rng rng(13);
  std::vector<Tensor> devices;
  std::vector<std::vector<int32_t>> wanted;
  Tensor host = Tensor::empty({(int64_t{1} << 20) / 4 + 3}, DType::I32);  // just over 1 MiB: odd tails
  for (int round = 0; round < 40; ++round) {
    std::vector<int32_t> values(static_cast<size_t>(host.numel()));
    for (int32_t& v : values) v = static_cast<int32_t>(rng.below(1u << 31));
    std::memcpy(host.raw_data(), values.data(), host.nbytes());
    devices.push_back(host.to(Device::CUDA));
    std::memset(host.raw_data(), 0xAB, host.nbytes());  // reused at once: the upload must not read it any more
    wanted.push_back(std::move(values));
  }
  // Rows of a wider host tensor into a column block of a device one (the strided upload).
  Tensor wide = Tensor::empty({257, 9}, DType::I32);
  for (int64_t i = 0; i < wide.numel(); ++i) wide.set_item(i, static_cast<double>(i));
  Tensor block = Tensor::full({257, 5}, -1.0, DType::I32, Device::CUDA);
  block.copy_from(wide.columns(2, 5));
  std::memset(wide.raw_data(), 0, wide.nbytes());
  for (size_t round = 0; round < devices.size(); ++round) {
    const Tensor back = devices[round].to(Device::CPU);
    ASSERT_EQ(std::memcmp(back.raw_data(), wanted[round].data(), back.nbytes()), 0) << "upload " << round;
  }
  const Tensor block_back = block.to(Device::CPU);
  for (int64_t r = 0; r < 257; ++r)
    for (int64_t c = 0; c < 5; ++c) ASSERT_EQ(block_back.data<int32_t>()[r * 5 + c], r * 9 + c + 2);
}

// fp32 -> bf16 on the GPU (the weights' compute copies: packs of 4 over the aligned bulk, one at a time over the
// tail and unaligned views) gives the CPU's bits, round to nearest even: random values, exact ties, and sizes and
// offsets that leave tails and misalignment.
TEST(CudaDevice, Fp32ToBf16CastMatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  Rng rng(12);
  const int64_t n = 4099;
  Tensor host = Tensor::empty({n}, DType::F32);
  float* h = host.data<float>();
  for (int64_t i = 0; i < n; ++i) h[i] = static_cast<float>((static_cast<double>(rng.below(1 << 30)) - (1 << 29)) * 1e-6);
  for (int64_t i = 0; i < n; i += 7) {  // exact ties: the low 16 bits 0x8000, both parities of the kept bit
    uint32_t bits;
    std::memcpy(&bits, &h[i], 4);
    bits = (bits & 0xffff0000u) | 0x8000u;
    std::memcpy(&h[i], &bits, 4);
  }
  const Tensor device = host.to(Device::CUDA);
  for (int64_t begin : {int64_t{0}, int64_t{1}, int64_t{4}}) {
    for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{4}, n - 8}) {
      SCOPED_TRACE(::testing::Message() << "elements [" << begin << ", " << begin + count << ")");
      const Tensor want = host.flat_view(begin, count).to(DType::BF16);
      const Tensor got = device.flat_view(begin, count).to(DType::BF16).to(Device::CPU);
      ASSERT_EQ(got.dtype(), DType::BF16);
      EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0);
    }
  }
}

TEST(CudaDevice, OutOfMemorySaysHowMuchAndWhatToChange) {
  SKIP_WITHOUT_GPU();
  try {
    Tensor huge = Tensor::empty({int64_t{1} << 50}, DType::F32, Device::CUDA);  // 4 PiB
    FAIL() << "a 4 PiB allocation cannot succeed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CUDA out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MiB free"), std::string::npos) << msg;
    EXPECT_NE(msg.find("micro_batch_size"), std::string::npos) << msg;
  }
  // The failed request left the device usable.
  Tensor small = Tensor::full({16}, 2.0, DType::F32, Device::CUDA);
  EXPECT_EQ(small.to(Device::CPU).item(15), 2.0);
}

}  // namespace
}  // namespace hgrn
