// test_hdf5_export.cpp: the "hgrn-weights-v1" HDF5 export read back with the HDF5 C API, as any HDF5 tool would:
// file attributes (format, config.json text), one dataset per parameter at the root in model order with its shape
// and dtype attributes, fp32 values bit-exact, bf16 stored as uint16 bit patterns; atomic replacement.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <nlohmann/json.hpp>

#include "export_fixtures.h"
#include "io/hdf5_export.h"
#include "io/hf_export.h"

namespace hgrn {
namespace {

using namespace export_testing;

// Reads a scalar variable-length string attribute of `object` (the file for "/").
std::string read_string_attribute(hid_t object, const char* name) {
  const hid_t attribute = H5Aopen(object, name, H5P_DEFAULT);
  EXPECT_GE(attribute, 0) << name;
  if (attribute < 0) return {};
  const hid_t type = H5Aget_type(attribute);
  EXPECT_EQ(H5Tget_class(type), H5T_STRING) << name;
  EXPECT_TRUE(H5Tis_variable_str(type) > 0) << name;
  EXPECT_EQ(H5Tget_cset(type), H5T_CSET_UTF8) << name;
  const hid_t memory_type = H5Tcopy(H5T_C_S1);
  H5Tset_size(memory_type, H5T_VARIABLE);
  H5Tset_cset(memory_type, H5T_CSET_UTF8);
  char* text = nullptr;
  EXPECT_GE(H5Aread(attribute, memory_type, &text), 0) << name;
  std::string value = text ? text : "";
  H5free_memory(text);
  H5Tclose(memory_type);
  H5Tclose(type);
  H5Aclose(attribute);
  return value;
}

std::vector<int64_t> read_shape_attribute(hid_t dataset) {
  const hid_t attribute = H5Aopen(dataset, "shape", H5P_DEFAULT);
  EXPECT_GE(attribute, 0);
  if (attribute < 0) return {};
  const hid_t space = H5Aget_space(attribute);
  const hssize_t count = H5Sget_simple_extent_npoints(space);
  std::vector<int64_t> shape(static_cast<size_t>(count));
  if (count > 0) EXPECT_GE(H5Aread(attribute, H5T_NATIVE_INT64, shape.data()), 0);
  H5Sclose(space);
  H5Aclose(attribute);
  return shape;
}

// The names of the root's links in creation order (what h5py lists for a file that tracks it).
herr_t collect_name(hid_t, const char* name, const H5L_info_t*, void* names) {
  static_cast<std::vector<std::string>*>(names)->push_back(name);
  return 0;
}

struct DatasetContents {
  std::vector<int64_t> dims, shape_attribute;
  std::string dtype_attribute;
  H5T_class_t type_class;
  size_t type_size;
  std::vector<unsigned char> bytes;  // read in the stored type's native form
};

DatasetContents read_dataset(hid_t file, const std::string& name, bool as_uint16) {
  DatasetContents c;
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  EXPECT_GE(dataset, 0) << name;
  if (dataset < 0) return c;
  const hid_t type = H5Dget_type(dataset);
  c.type_class = H5Tget_class(type);
  c.type_size = H5Tget_size(type);
  const hid_t space = H5Dget_space(dataset);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  c.dims.assign(dims.begin(), dims.end());
  const hssize_t count = H5Sget_simple_extent_npoints(space);
  c.bytes.resize(static_cast<size_t>(count) * (as_uint16 ? 2 : 4));
  EXPECT_GE(H5Dread(dataset, as_uint16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                    c.bytes.data()),
            0)
      << name;
  c.shape_attribute = read_shape_attribute(dataset);
  c.dtype_attribute = read_string_attribute(dataset, "dtype");
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(dataset);
  return c;
}

void expect_file_matches(const std::string& path, const ModelConfig& config, const NamedTensors& params, DType dtype) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0) << path;
  EXPECT_EQ(read_string_attribute(file, "format"), "hgrn-weights-v1");
  EXPECT_EQ(read_string_attribute(file, "config"), hf_config_json(config, dtype));
  EXPECT_EQ(nlohmann::json::parse(read_string_attribute(file, "config"))["model_type"], config.type);

  std::vector<std::string> names;
  H5Literate(file, H5_INDEX_CRT_ORDER, H5_ITER_INC, nullptr, collect_name, &names);
  std::vector<std::string> expected_names;
  for (const auto& entry : params) expected_names.push_back(entry.first);
  EXPECT_EQ(names, expected_names);  // model order, not alphabetical

  const bool bf = dtype == DType::BF16;
  for (const auto& [name, tensor] : params) {
    const DatasetContents c = read_dataset(file, name, bf);
    EXPECT_EQ(c.dims, tensor.shape()) << name;
    EXPECT_EQ(c.shape_attribute, tensor.shape()) << name;
    EXPECT_EQ(c.dtype_attribute, bf ? "bf16" : "fp32") << name;
    EXPECT_EQ(c.type_class, bf ? H5T_INTEGER : H5T_FLOAT) << name;
    EXPECT_EQ(c.type_size, bf ? 2u : 4u) << name;
    const Tensor stored = bf ? tensor.to(DType::BF16) : tensor;
    ASSERT_EQ(c.bytes.size(), stored.nbytes()) << name;
    EXPECT_EQ(std::memcmp(c.bytes.data(), stored.raw_data(), stored.nbytes()), 0) << name;
  }
  EXPECT_GE(H5Fclose(file), 0);
}

TEST(Hdf5Export, Fp32FileReadsBackWithTheHdf5CApi) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  const NamedTensors params = random_params(config, 11);
  export_hdf5(config, params, dir / "weights.h5", DType::F32);
  EXPECT_EQ(directory_listing(dir.str()), std::vector<std::string>{"weights.h5"});
  expect_file_matches(dir / "weights.h5", config, params, DType::F32);
}

TEST(Hdf5Export, ComplexHgrnExportsEveryTensor) {
  // The complex HGRU has no Hugging Face form, but the HDF5 file takes any parameter list.
  ScratchDir dir;
  ModelConfig config = small_model_config();
  config.type = "hgrn";
  config.expand_ratio = 1;
  config.complex = true;
  const NamedTensors params = random_params(config, 13);
  export_hdf5(config, params, dir / "weights.h5", DType::F32);
  expect_file_matches(dir / "weights.h5", config, params, DType::F32);
  const hid_t file = H5Fopen((dir / "weights.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_EQ(nlohmann::json::parse(read_string_attribute(file, "config"))["complex"], true);
  EXPECT_GE(H5Fclose(file), 0);
}

TEST(Hdf5Export, GlaAndRetNetExportEveryTensorWithTheirConfig) {
  for (const char* type : {"gla", "retnet"}) {
    SCOPED_TRACE(type);
    ScratchDir dir;
    ModelConfig config = small_model_config();
    config.type = type;
    config.expand_ratio.reset();
    config.num_heads = 2;
    const NamedTensors params = random_params(config, 14);
    export_hdf5(config, params, dir / "weights.h5", DType::F32);
    expect_file_matches(dir / "weights.h5", config, params, DType::F32);
  }
}

TEST(Hdf5Export, Bf16IsStoredAsUint16BitPatterns) {
  ScratchDir dir;
  const ModelConfig config = small_model_config(/*tied=*/true);
  const NamedTensors params = random_params(config, 12);
  export_hdf5(config, params, dir / "weights.h5", DType::BF16);
  expect_file_matches(dir / "weights.h5", config, params, DType::BF16);
}

TEST(Hdf5Export, RefusesToOverwriteUnlessAskedAndFailuresLeaveNothing) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  const std::string path = dir / "weights.h5";
  export_hdf5(config, random_params(config, 1), path, DType::F32);
  try {
    export_hdf5(config, random_params(config, 2), path, DType::F32);
    ADD_FAILURE() << "expected a refusal to overwrite";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refusing to overwrite " + path), std::string::npos) << e.what();
  }
  expect_file_matches(path, config, random_params(config, 1), DType::F32);
  export_hdf5(config, random_params(config, 2), path, DType::F32, /*overwrite=*/true);
  expect_file_matches(path, config, random_params(config, 2), DType::F32);

  NamedTensors wrong = random_params(config, 3);
  wrong.pop_back();
  EXPECT_THROW(export_hdf5(config, wrong, dir / "other.h5", DType::F32), Error);
  EXPECT_THROW(export_hdf5(config, random_params(config, 3), dir / "other.h5", DType::F64), Error);
  EXPECT_EQ(directory_listing(dir.str()), std::vector<std::string>{"weights.h5"});
}

TEST(Hdf5Export, H5pyReadsTheWeights) {
  if (run_command("python3 -c 'import h5py' >/dev/null 2>&1").status != 0)
    GTEST_SKIP() << "python3 with h5py is not available";
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  const NamedTensors params = random_params(config, 13);
  export_hdf5(config, params, dir / "weights.h5", DType::F32);
  const Tensor& embeddings = params.front().second;
  const std::string script =
      "import sys, json, h5py\n"
      "f = h5py.File(sys.argv[1], 'r')\n"
      "assert f.attrs['format'] == 'hgrn-weights-v1'\n"
      "assert json.loads(f.attrs['config'])['model_type'] == 'hgrn2'\n"
      "w = f['model.embeddings.weight'][()]\n"
      "assert w.shape == (32, 16) and w.dtype.name == 'float32'\n"
      "assert list(f['model.embeddings.weight'].attrs['shape']) == [32, 16]\n"
      "assert f['model.embeddings.weight'].attrs['dtype'] == 'fp32'\n"
      "print(repr(float(w[0, 0])))\n";
  write_file(dir / "check.py", script);
  const CommandResult r =
      run_command("python3 " + shell_quote(dir / "check.py") + " " + shell_quote(dir / "weights.h5"));
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(std::stof(r.out), embeddings.data<float>()[0]);
}

}  // namespace
}  // namespace hgrn
