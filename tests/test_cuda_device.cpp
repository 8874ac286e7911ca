// test_cuda_device.cpp: device memory through Tensor: round trips between host and GPU, and the out-of-memory
// message. Skipped (never passed) where this build has no CUDA or no GPU is visible.
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
