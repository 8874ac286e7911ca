// hf_config_reader.h: typed access to a Hugging Face config.json's fields, with messages naming the file and the
// field (io/hf_export.cpp reads the shared fields, each model family its own: models/registry.h).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/check.h"

namespace hgrn {

// Typed access to config.json fields, with messages naming the file and the field.
class HfConfigReader {
 public:
  HfConfigReader(nlohmann::json root, std::string path) : root_(std::move(root)), path_(std::move(path)) {}

  bool has_non_null(const char* key) const { return root_.contains(key) && !root_[key].is_null(); }

  // Absent: the default. Present and null: nullopt (meaning "unset", as in fla's constructor).
  std::optional<int64_t> optional_int(const char* key, std::optional<int64_t> fallback) const {
    if (!root_.contains(key)) return fallback;
    const nlohmann::json& value = root_[key];
    if (value.is_null()) return std::nullopt;
    require(value.is_number_integer(), key, "an integer", value);
    return value.get<int64_t>();
  }
  int64_t integer(const char* key, int64_t fallback) const {
    std::optional<int64_t> value = optional_int(key, fallback);
    require(value.has_value(), key, "an integer", nlohmann::json(nullptr));
    return *value;
  }
  double number(const char* key, double fallback) const {
    if (!root_.contains(key)) return fallback;
    require(root_[key].is_number(), key, "a number", root_[key]);
    return root_[key].get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!root_.contains(key)) return fallback;
    require(root_[key].is_boolean(), key, "true or false", root_[key]);
    return root_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!root_.contains(key)) return fallback;
    require(root_[key].is_string(), key, "a string", root_[key]);
    return root_[key].get<std::string>();
  }

  void require(bool ok, const std::string& key, const std::string& expected, const nlohmann::json& got) const {
    if (!ok) fail(key, "expected " + expected + ", got " + got.dump());
  }
  void require_positive(const std::string& key, int64_t value) const {
    if (value <= 0) fail(key, "expected a positive integer, got " + std::to_string(value));
  }
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw Error(path_ + ": " + key + ": " + problem);
  }

 private:
  nlohmann::json root_;
  std::string path_;
};

}  // namespace hgrn
