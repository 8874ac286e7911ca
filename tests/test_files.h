// test_files.h: small helpers tests share for files and error messages: whole-file byte reads and writes (to build
// and damage fixtures) and "this call throws an hgrn::Error whose message says all of these things".
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/check.h"

namespace hgrn::testing {

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Runs `body` and expects an hgrn::Error whose message contains every one of `parts`.
template <typename Body>
void expect_error_containing(Body&& body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "expected an hgrn::Error mentioning " << parts.front();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

}  // namespace hgrn::testing
