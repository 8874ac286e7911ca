// trace.cpp: NVTX push/pop (the header-only NVTX 3 from the CUDA Toolkit); nothing in a CPU-only build.
#include "core/trace.h"

#ifdef HGRN_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace hgrn {

#ifdef HGRN_WITH_CUDA
void trace_push(const std::string& name) { nvtxRangePushA(name.c_str()); }
void trace_pop() { nvtxRangePop(); }
#else
void trace_push(const std::string&) {}
void trace_pop() {}
#endif

}  // namespace hgrn
