// launch.cu: whether kernels launch with programmatic dependent launch (launch.cuh says when and why).
#include <cstdlib>
#include <cstring>

#include "launch.cuh"

namespace hgrn {

namespace {
// Compiled like every other kernel here: its PTX version tells whether griddepcontrol exists in this build's code for
// the running GPU (a build for sm_80 only runs on a Hopper GPU through PTX compiled for 8.0, without it).
__global__ void probe_kernel() { start_after_previous_kernel(); }
}  // namespace

bool programmatic_launch_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("HGRN_PROGRAMMATIC_LAUNCH");
    if (env && std::strcmp(env, "0") == 0) return false;
    if (cuda_device_properties().major < 9) return false;
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, probe_kernel));
    return attributes.ptxVersion >= 90;
  }();
  return enabled;
}

}  // namespace hgrn
