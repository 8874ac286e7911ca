// hdf5_export.h: model weights as a plain HDF5 file ("hgrn-weights-v1"), for tools that read HDF5 rather than
// safetensors. Layout:
//   /                  attributes format = "hgrn-weights-v1", config = the Hugging Face config.json text
//                      (hf_config_json), both variable-length UTF-8 strings
//   /<fla name>        one dataset per parameter at the root (dots are fine in HDF5 names), in model order, stored
//                      contiguously and little-endian: fp32 as IEEE float32, bf16 as uint16 bit patterns;
//                      attributes shape (int64 array of the dimensions) and dtype ("fp32" or "bf16")
// Readable with h5py: h5py.File(path)["model.embeddings.weight"][()] (bf16: .view(ml_dtypes.bfloat16) or shift the
// uint16 bits left by 16 into float32).
#pragma once
#include <string>

#include "config/config.h"
#include "io/atomic_write.h"
#include "io/safetensors.h"

namespace hgrn {

inline constexpr const char* kHdf5WeightsFormat = "hgrn-weights-v1";

// An earlier HDF5 export, the only thing `export --force` replaces: an HDF5 file whose root attribute format is
// kHdf5WeightsFormat.
OutputKind hdf5_export_kind();

// Writes the file atomically (temporary sibling, fsync, rename). params: hgrn's parameters by fla name (fp32),
// matching model_param_specs(config); dtype F32 or BF16. An existing out_file is refused unless `overwrite`.
// Throws hgrn::Error naming the file and what failed.
// eos_token_id goes into the stored config.json (hf_config_json).
void export_hdf5(const ModelConfig& config, const NamedTensors& params, const std::string& out_file, DType dtype,
                 bool overwrite = false, std::optional<int64_t> eos_token_id = std::nullopt);

}  // namespace hgrn
