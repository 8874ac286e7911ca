// export_fixtures.h: what the safetensors, Hugging Face export and HDF5 export tests share: a scratch directory per
// test, a small HGRN2 config, random parameters for it, file helpers, and (from hgrn_binary.h) running the hgrn
// binary and other commands.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/rng.h"
#include "hgrn_binary.h"
#include "scratch_dir.h"
#include "io/safetensors.h"
#include "models/params.h"

namespace hgrn::export_testing {

namespace fs = std::filesystem;

using hgrn::testing::ScratchDir;

// D = 16, two layers, 4 heads of key width 4, MLP 24, vocabulary 32: every tensor kind of spec section 5.3, small.
inline ModelConfig small_model_config(bool tied = false) {
  ModelConfig m;
  m.hidden_size = 16;
  m.num_hidden_layers = 2;
  m.expand_ratio = 4;
  m.vocab_size = 32;
  m.intermediate_size = 24;
  m.tie_word_embeddings = tied;
  return m;
}

// fp32 parameters of model_param_specs(config), every one random (lower bounds and norms too, so that a swapped or
// misnamed tensor cannot go unnoticed).
inline NamedTensors random_params(const ModelConfig& config, uint64_t seed = 1) {
  Rng rng(seed);
  NamedTensors params;
  for (const ParamSpec& spec : model_param_specs(config)) {
    Tensor t = Tensor::empty(spec.shape, DType::F32);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(0.5 * rng.normal());
    params.emplace_back(spec.name, t);
  }
  return params;
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The names in a directory, sorted.
inline std::vector<std::string> directory_listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Running commands and the binary under test (one implementation, in hgrn_binary.h).
using hgrn::testing::CommandResult;
using hgrn::testing::hgrn_binary;
using hgrn::testing::run_command;
using hgrn::testing::run_hgrn;
using hgrn::testing::shell_quote;

}  // namespace hgrn::export_testing
