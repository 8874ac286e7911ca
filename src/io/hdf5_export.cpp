// hdf5_export.cpp: writes model weights as an "hgrn-weights-v1" HDF5 file (layout in hdf5_export.h).
#include "io/hdf5_export.h"

#include "io/atomic_write.h"
#include "io/hdf5_check.h"
#include "io/hf_export.h"

namespace hgrn {

using hdf5::Handle;

namespace {

class WeightsWriter {
 public:
  explicit WeightsWriter(std::string file) : file_(std::move(file)) {}

  void write(const std::string& config_json, const NamedTensors& tensors) {
    Handle creation(H5_CHECK(H5Pcreate(H5P_FILE_CREATE), file_, ": cannot create a property list"), H5Pclose,
                    "file creation property list for " + file_);
    // The root group remembers creation order, so readers that honour it (h5py does) list the weights in model
    // order rather than alphabetically.
    H5_CHECK(H5Pset_link_creation_order(creation.id(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), file_,
             ": cannot ask HDF5 to track creation order");
    Handle access(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), file_, ": cannot create a property list"), H5Pclose,
                  "file access property list for " + file_);
    // SEMI: closing fails while an object is still open, so a successful close means everything was handed over.
    H5_CHECK(H5Pset_fclose_degree(access.id(), H5F_CLOSE_SEMI), file_, ": cannot set the file close degree");
    Handle file(H5_CHECK(H5Fcreate(file_.c_str(), H5F_ACC_TRUNC, creation.id(), access.id()), "cannot create HDF5 ",
                         "file ", file_, kWriteAdvice),
                H5Fclose, "HDF5 file " + file_);
    access.close();
    creation.close();
    try {
      write_string_attribute(file.id(), "/", "format", kHdf5WeightsFormat);
      write_string_attribute(file.id(), "/", "config", config_json);
      for (const auto& [name, tensor] : tensors) write_tensor(file.id(), name, tensor);
      H5_CHECK(H5Fflush(file.id(), H5F_SCOPE_GLOBAL), "cannot flush HDF5 file ", file_, kWriteAdvice);
      file.close();
    } catch (...) {
      hdf5::abandon_file(file, file_);  // every object inside was closed as the exception left its function
      throw;
    }
  }

 private:
  void write_string_attribute(hid_t owner, const std::string& owner_path, const char* name, const std::string& value) {
    const std::string object = owner_path + " attribute " + name;
    HGRN_CHECK(value.find('\0') == std::string::npos, file_, ": ", object, " must not contain NUL bytes");
    // Variable-length UTF-8: h5py returns it as a Python str (a fixed-length string would come back as bytes).
    Handle type(H5_CHECK(H5Tcopy(H5T_C_S1), file_, ": cannot create the string type for ", object), H5Tclose,
                "string type of " + object + " in " + file_);
    H5_CHECK(H5Tset_size(type.id(), H5T_VARIABLE), file_, ": cannot size the string type for ", object);
    H5_CHECK(H5Tset_cset(type.id(), H5T_CSET_UTF8), file_, ": cannot set the character set for ", object);
    Handle space(H5_CHECK(H5Screate(H5S_SCALAR), file_, ": cannot create a dataspace for ", object), H5Sclose,
                 "dataspace of " + object + " in " + file_);
    Handle attribute(H5_CHECK(H5Acreate2(owner, name, type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT), file_,
                              ": cannot create ", object, kWriteAdvice),
                     H5Aclose, object + " in " + file_);
    const char* text = value.c_str();
    H5_CHECK(H5Awrite(attribute.id(), type.id(), &text), file_, ": cannot write ", object, kWriteAdvice);
    attribute.close();
    space.close();
    type.close();
  }

  void write_shape_attribute(hid_t dataset, const std::string& path, const Shape& shape) {
    const std::string object = path + " attribute shape";
    const hsize_t rank = shape.size();
    Handle space(H5_CHECK(H5Screate_simple(1, &rank, nullptr), file_, ": cannot create a dataspace for ", object),
                 H5Sclose, "dataspace of " + object + " in " + file_);
    Handle attribute(H5_CHECK(H5Acreate2(dataset, "shape", H5T_STD_I64LE, space.id(), H5P_DEFAULT, H5P_DEFAULT),
                              file_, ": cannot create ", object, kWriteAdvice),
                     H5Aclose, object + " in " + file_);
    if (rank > 0)
      H5_CHECK(H5Awrite(attribute.id(), H5T_NATIVE_INT64, shape.data()), file_, ": cannot write ", object,
               kWriteAdvice);
    attribute.close();
    space.close();
  }

  void write_tensor(hid_t file, const std::string& name, const Tensor& tensor) {
    const std::string path = "/" + name;
    const std::string object = "dataset " + path;
    HGRN_CHECK(tensor.dtype() == DType::F32 || tensor.dtype() == DType::BF16, file_, ": ", object,
               ": only fp32 and bf16 weights are written, got ", dtype_name(tensor.dtype()));
    // bf16 has no HDF5 type: its bit patterns are stored as uint16 and the dtype attribute says what they mean.
    const bool is_bf16 = tensor.dtype() == DType::BF16;
    const hid_t file_type = is_bf16 ? H5T_STD_U16LE : H5T_IEEE_F32LE;
    const hid_t memory_type = is_bf16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT;

    std::vector<hsize_t> dims(tensor.shape().begin(), tensor.shape().end());
    Handle space(dims.empty() ? H5_CHECK(H5Screate(H5S_SCALAR), file_, ": cannot create a dataspace for ", object)
                              : H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), file_,
                                         ": cannot create a dataspace of shape ", shape_str(tensor.shape()), " for ",
                                         object),
                 H5Sclose, "dataspace of " + object + " in " + file_);
    Handle dataset(H5_CHECK(H5Dcreate2(file, name.c_str(), file_type, space.id(), H5P_DEFAULT, H5P_DEFAULT,
                                       H5P_DEFAULT),
                            file_, ": cannot create ", object, kWriteAdvice),
                   H5Dclose, object + " in " + file_);
    if (tensor.numel() > 0)
      H5_CHECK(H5Dwrite(dataset.id(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.raw_data()), file_,
               ": cannot write ", object, kWriteAdvice);
    write_shape_attribute(dataset.id(), path, tensor.shape());
    write_string_attribute(dataset.id(), path, "dtype", dtype_name(tensor.dtype()));
    dataset.close();
    space.close();
  }

  std::string file_;
};

// True when `path` is an HDF5 file whose root attribute format reads kHdf5WeightsFormat. Anything unexpected
// (not HDF5, no such attribute, another type) is simply "not ours".
bool holds_weights_format(const std::string& path) {
  if (H5Fis_hdf5(path.c_str()) <= 0) return false;
  try {
    Handle file(H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "cannot open ", path), H5Fclose,
                "HDF5 file " + path);
    if (H5Aexists(file.id(), "format") <= 0) return false;
    Handle attribute(H5_CHECK(H5Aopen(file.id(), "format", H5P_DEFAULT), "cannot open ", path, " attribute format"),
                     H5Aclose, "attribute format of " + path);
    Handle stored(H5_CHECK(H5Aget_type(attribute.id()), "cannot read the type of ", path, " attribute format"),
                  H5Tclose, "type of attribute format of " + path);
    if (H5Tget_class(stored.id()) != H5T_STRING || H5Tis_variable_str(stored.id()) <= 0) return false;
    Handle type(H5_CHECK(H5Tcopy(H5T_C_S1), "cannot create a string type"), H5Tclose, "string type");
    H5_CHECK(H5Tset_size(type.id(), H5T_VARIABLE), "cannot size a string type");
    H5_CHECK(H5Tset_cset(type.id(), H5Tget_cset(stored.id())), "cannot set a character set");
    char* text = nullptr;
    H5_CHECK(H5Aread(attribute.id(), type.id(), &text), "cannot read ", path, " attribute format");
    const bool ours = text != nullptr && std::string(text) == kHdf5WeightsFormat;
    H5free_memory(text);
    return ours;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

OutputKind hdf5_export_kind() {
  return {std::string("an hgrn HDF5 export (an HDF5 file with the root attribute format = ") + kHdf5WeightsFormat +
              ")",
          [](const std::string& path) {
            hdf5::prepare_library();
            return holds_weights_format(path);
          }};
}

void export_hdf5(const ModelConfig& config, const NamedTensors& params, const std::string& out_file, DType dtype,
                 bool overwrite, std::optional<int64_t> eos_token_id) {
  hdf5::prepare_library();
  HGRN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "HDF5 export to ", out_file, ": dtype ", dtype_name(dtype),
             " is not offered (use fp32 or bf16)");
  const std::vector<ParamSpec> specs = model_param_specs(config);
  const std::vector<const Tensor*> ordered =
      match_params_to_specs(specs, params, "the parameters to export to " + out_file);
  NamedTensors converted;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor& tensor = *ordered[i];
    HGRN_CHECK(tensor.device() == Device::CPU && dtype_is_float(tensor.dtype()), "HDF5 export to ", out_file,
               ": parameter ", specs[i].name, " must be a floating-point CPU tensor");
    Tensor stored = tensor.dtype() == dtype ? tensor : tensor.to(dtype);
    if (!stored.is_contiguous()) stored = stored.clone();
    converted.emplace_back(specs[i].name, std::move(stored));
  }

  const std::string config_json = hf_config_json(config, dtype, eos_token_id);
  publish_atomically(out_file, /*is_directory=*/false, overwrite, hdf5_export_kind(),
                     [&](const std::string& temp_path) { WeightsWriter(temp_path).write(config_json, converted); });
}

}  // namespace hgrn
