// registry.cpp: the list of family members. Adding one: its folder under models/, and one line below.
#include "models/registry.h"

#include "models/decoder_lm.h"

namespace hgrn {

const ModelFamily& hgrn2_family();
const ModelFamily& hgrn1_family();
const ModelFamily& gla_family();
const ModelFamily& retnet_family();

namespace {
const std::vector<const ModelFamily*>& families() {
  static const std::vector<const ModelFamily*> all = {
      &hgrn2_family(),
      &hgrn1_family(),
      &gla_family(),
      &retnet_family(),
  };
  return all;
}
}  // namespace

std::vector<std::string> model_type_names() {
  std::vector<std::string> names;
  for (const ModelFamily* family : families()) names.push_back(family->type());
  return names;
}

const ModelFamily& model_family(const std::string& type) {
  std::string known;
  for (const ModelFamily* family : families()) {
    if (family->type() == type) return *family;
    known += (known.empty() ? "" : ", ") + family->type();
  }
  throw Error("unknown model.type '" + type + "' (known: " + known + ")");
}

std::unique_ptr<CausalLM> create_model(const ModelConfig& config, Rng& init_rng, DType dtype) {
  return std::make_unique<DecoderLM>(config, init_rng, dtype);
}

bool lower_bounded(const ModelConfig& config) {
  return config.use_lower_bound && model_family(config.type).has_lower_bounds();
}

std::string model_signature(const ModelConfig& config) {
  return model_family(config.type).signature(config) + " master=fp32";
}

}  // namespace hgrn
