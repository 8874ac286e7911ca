// dependent_launch.cu: whether this process's kernels launch as programmatic dependents (dependent_launch.cuh).
#include "dependent_launch.cuh"

namespace hgrn {

bool dependent_launch_supported(const void* kernel) {
  static const bool supported = [kernel] {
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    return cuda_device_properties().major >= 9 && attributes.binaryVersion >= 90;
  }();
  return supported;
}

}  // namespace hgrn
