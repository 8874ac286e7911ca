// hgrn_binary.h: where the `hgrn` executable under test is, and the one way tests run it (or another shell command)
// and capture its exit status, stdout and stderr. (test_signals.cpp forks and execs it itself: it has to signal the
// child while it runs.)
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace hgrn::testing {

// $HGRN_BINARY (ctest sets it), else `hgrn` next to this test executable.
inline std::string hgrn_binary() {
  if (const char* env = std::getenv("HGRN_BINARY"); env && *env) return env;
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "hgrn").string();
}

// `s` as one word for /bin/sh, whatever characters it holds.
inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct CommandResult {
  int status = -1;  // the exit status, or -1 when the command did not exit normally (a signal)
  std::string out, err;
};

// Runs a shell command; stdout is read from the pipe, stderr through a temporary file (reading both from pipes
// would need polling to avoid a deadlock when one fills up).
inline CommandResult run_command(const std::string& command_line) {
  static int counter = 0;
  const std::string err_path = ::testing::TempDir() + "hgrn_test_stderr_" + std::to_string(::getpid()) + "_" +
                               std::to_string(counter++) + ".txt";
  CommandResult result;
  FILE* pipe = ::popen((command_line + " 2>" + shell_quote(err_path)).c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "popen failed for " << command_line;
    return result;
  }
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.out.append(buffer, n);
  const int raw = ::pclose(pipe);
  result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream err(err_path, std::ios::binary);
  std::ostringstream text;
  text << err.rdbuf();
  result.err = text.str();
  std::filesystem::remove(err_path);
  return result;
}

// Runs `hgrn <args>`, each argument passed as is.
inline CommandResult run_hgrn(const std::vector<std::string>& args) {
  std::string command = shell_quote(hgrn_binary());
  for (const std::string& a : args) command += " " + shell_quote(a);
  return run_command(command);
}

}  // namespace hgrn::testing
