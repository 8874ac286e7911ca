// test_cublaslt_loader.cpp: cuBLASLt is loaded with dlopen on first use (kernels/cublaslt_loader.cpp); this checks,
// without a GPU, that the library is found and a forwarded call reaches it. Skipped where the build has no CUDA.
#include <gtest/gtest.h>

#ifdef HGRN_WITH_CUDA
#include <cublasLt.h>
#endif

namespace hgrn {
namespace {

TEST(CublasLtLoader, LoadsTheLibraryOnFirstUseAndForwardsCalls) {
#ifndef HGRN_WITH_CUDA
  GTEST_SKIP() << "this build has no CUDA backend (skipped, not passed)";
#else
  // A matrix layout is a host-side descriptor that cuBLASLt creates without a device: a layout back means the
  // library was loaded and the forwarder reached it (the forwarders' signatures are checked by the compiler against
  // cublasLt.h). Leaked on purpose: the destroy call is not one hgrn forwards.
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 3, 5, 3), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(layout, nullptr);
#endif
}

}  // namespace
}  // namespace hgrn
