// test_cuda_device.cpp: device memory through Tensor: round trips between host and GPU, the fp32 -> bf16 cast's
// bits, and the out-of-memory message. Skipped (never passed) where this build has no CUDA or no GPU is visible.
#include <gtest/gtest.h>

#include <cstring>

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
