// test_launch_cuda.cpp: kernels launched with programmatic dependent launch (kernels/launch.cuh) still run in stream
// order: long chains of kernels, each reading what the one before it wrote, give exact counts. Were a kernel to read
// before its predecessor finished (a missing griddepcontrol.wait), increments would be lost. Skipped (never passed)
// without a GPU; where PDL is off (before sm_90, HGRN_PROGRAMMATIC_LAUNCH=0) the chains check plain stream order.
#include <gtest/gtest.h>

#include <vector>

#include "gpu_test.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cuda_context.h"
#include "kernels/elementwise.h"
#endif

namespace hgrn {
namespace {

#ifdef HGRN_WITH_CUDA
// x += 1, `steps` times, each step one kernel reading the previous step's x; then x on the host.
std::vector<double> count_up(int64_t n, int steps, DType dtype) {
  Tensor x = Tensor::zeros({n}, dtype, Device::CUDA);
  const Tensor one = Tensor::full({n}, 1.0, dtype, Device::CUDA);
  for (int s = 0; s < steps; ++s) cuda_add(x.raw_data(), one.raw_data(), x.raw_data(), n, dtype);
  return x.to_double_vector();
}
#endif

TEST(KernelLaunchCuda, ChainedKernelsSeeTheirPredecessorsWrites) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  std::cout << "programmatic dependent launch: " << (programmatic_launch_enabled() ? "on" : "off") << "\n";
  // Grids of one block to several waves (4 fp32 values a thread, 256 threads a block); counts exact in fp32 and,
  // up to 256, in bf16.
  struct Case {
    int64_t n;
    int steps;
    DType dtype;
  };
  for (const Case& c : {Case{1, 300, DType::F32}, Case{1003, 1000, DType::F32}, Case{(1 << 22) + 5, 400, DType::F32},
                        Case{(1 << 21) + 1, 256, DType::BF16}}) {
    SCOPED_TRACE(::testing::Message() << c.n << " " << dtype_name(c.dtype) << " values, " << c.steps << " kernels");
    const std::vector<double> x = count_up(c.n, c.steps, c.dtype);
    int64_t wrong = 0, first_wrong = -1;
    for (int64_t i = 0; i < c.n; ++i)
      if (x[i] != c.steps && wrong++ == 0) first_wrong = i;
    EXPECT_EQ(wrong, 0) << "first at " << first_wrong << ": " << x[first_wrong];
  }
#endif
}

}  // namespace
}  // namespace hgrn
