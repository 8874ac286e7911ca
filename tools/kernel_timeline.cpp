// kernel_timeline.cpp: a CUPTI injection library that records when every kernel, memset and memcpy ran on the GPU
// and when the host's launching call was made, for tools/timeline_summary.py to break a training step into kernels,
// launch gaps and host-bound stretches (Nsight Systems is not always at hand; Nsight Compute serialises kernels and
// flushes caches between them, so its per-kernel times are not a step's timeline).
//
// Use: CUDA_INJECTION64_PATH=build/libhgrn_kernel_timeline.so HGRN_TIMELINE_OUT=timeline.csv hgrn bench ...
// The CUDA driver calls InitializeInjection() when it starts; the records are written when the process exits.
// Output lines (times in ns, one clock for host and device):
//   kernel,<start>,<end>,<correlation>,<name>   (also memset / memcpy, with the byte count as the name)
//   api,<start>,<end>,<correlation>,<runtime API function>
#include <cupti.h>

#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

#define CUPTI_CHECK(call)                                                                                          \
  do {                                                                                                             \
    const CUptiResult status_ = (call);                                                                            \
    if (status_ != CUPTI_SUCCESS) {                                                                                \
      const char* what_ = nullptr;                                                                                 \
      cuptiGetResultString(status_, &what_);                                                                       \
      std::fprintf(stderr, "kernel_timeline: %s failed: %s (is libcupti from the same CUDA release as the driver?)\n", \
                   #call, what_ ? what_ : "unknown error");                                                        \
      return;                                                                                                      \
    }                                                                                                              \
  } while (0)

constexpr size_t kBufferBytes = 8u << 20;

std::mutex lines_mutex;
std::vector<std::string> lines;

std::string demangled(const char* name) {
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain ? plain : name;
  std::free(plain);
  for (char& ch : out)
    if (ch == ',') ch = ';';  // one CSV field
  return out;
}

void add(const char* kind, uint64_t start, uint64_t end, uint32_t correlation, const std::string& what) {
  std::lock_guard<std::mutex> lock(lines_mutex);
  lines.push_back(std::string(kind) + "," + std::to_string(start) + "," + std::to_string(end) + "," +
                  std::to_string(correlation) + "," + what);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        add("kernel", k->start, k->end, k->correlationId, demangled(k->name));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        add("memset", m->start, m->end, m->correlationId, std::to_string(m->bytes) + " B");
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        add("memcpy", m->start, m->end, m->correlationId,
            std::to_string(m->bytes) + " B kind " + std::to_string(m->copyKind));
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        const char* name = nullptr;
        cuptiGetCallbackName(record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API
                                                                         : CUPTI_CB_DOMAIN_DRIVER_API,
                             a->cbid, &name);
        add("api", a->start, a->end, a->correlationId, name ? name : std::to_string(a->cbid));
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

void write_out() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("HGRN_TIMELINE_OUT");
  if (!path) path = "kernel_timeline.csv";
  std::FILE* f = std::fopen(path, "w");
  if (!f) {
    std::fprintf(stderr, "kernel_timeline: cannot write %s: set HGRN_TIMELINE_OUT to a writable path\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(lines_mutex);
  for (const std::string& line : lines) std::fprintf(f, "%s\n", line.c_str());
  std::fclose(f);
  std::fprintf(stderr, "kernel_timeline: %zu records in %s\n", lines.size(), path);
}

void start() {
  CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
  std::atexit(write_out);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  start();
  return 1;
}
