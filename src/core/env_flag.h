// env_flag.h: the one reading of hgrn's on/off environment switches (HGRN_PROFILE, HGRN_MEMORY_REPORT,
// HGRN_POISON_CUDA_ALLOC): set and neither empty nor "0" means on.
#pragma once
#include <cstdlib>
#include <string>

namespace hgrn {

inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

}  // namespace hgrn
