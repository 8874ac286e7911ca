// hgrn_binary.h: where the `hgrn` executable under test is, for tests that run the command line.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace hgrn::testing {

// $HGRN_BINARY (ctest sets it), else `hgrn` next to this test executable.
inline std::string hgrn_binary() {
  if (const char* env = std::getenv("HGRN_BINARY"); env && *env) return env;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "hgrn").string();
}

}  // namespace hgrn::testing
