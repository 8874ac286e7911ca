// checkpoint.cpp: writing, verifying, finding and pruning HDF5 training checkpoints (layout in checkpoint.h).
// A checkpoint file is untrusted input when it is read back: it may be truncated, damaged or written by something
// else, so every count, type and size is checked before it is used to size a buffer, and every byte is checksummed.
#include "io/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "core/checked_math.h"
#include "io/atomic_write.h"
#include "io/crc32.h"
#include "io/hdf5_check.h"

namespace hgrn {

// Checksums are taken over the bytes as they sit in memory after HDF5 has converted them from the file's
// little-endian types; on a big-endian host those bytes would differ from what the writer checksummed.
static_assert(std::endian::native == std::endian::little, "checkpoint checksums assume a little-endian host");

namespace fs = std::filesystem;
using hdf5::Handle;

namespace {

constexpr std::string_view kStepPrefix = "step_";
constexpr std::string_view kExtension = ".h5";
constexpr std::string_view kTempMarker = ".tmp-";
constexpr size_t kStepDigits = 8;

constexpr const char* kCorruptAdvice =
    "; the file is damaged: move it away and resume from an earlier checkpoint (hgrn does this by itself with "
    "checkpoint.resume: auto)";

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// ---------------------------------------------------------------------------------------------------------------
// Shared by writer and reader.

// The HDF5 type a dtype is stored as in the file, and the native type it is read into / written from. bf16 has no
// HDF5 counterpart; its bit patterns are stored as uint16 and the dtype attribute says what they mean.
struct StoredTypes {
  hid_t file_type;
  hid_t memory_type;
};

StoredTypes stored_types(DType dtype) {
  switch (dtype) {
    case DType::F32: return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case DType::F64: return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
    case DType::BF16: return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
    case DType::I32: return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case DType::I64: return {H5T_STD_I64LE, H5T_NATIVE_INT64};
  }
  throw Error("checkpoint: unknown dtype code " + std::to_string(static_cast<int>(dtype)));
}

// A fixed-length, NUL-padded UTF-8 string type just long enough for `length` bytes (HDF5 needs at least one).
// Fixed-length strings keep the bytes inside the file's data region, where the checksum can cover them.
Handle make_string_type(size_t length, const std::string& file, const std::string& object) {
  Handle type(H5_CHECK(H5Tcopy(H5T_C_S1), "checkpoint ", file, ": cannot create the string type for ", object),
              H5Tclose, "string type of " + object + " in " + file);
  H5_CHECK(H5Tset_size(type.id(), std::max<size_t>(length, 1)), "checkpoint ", file,
           ": cannot size the string type for ", object);
  H5_CHECK(H5Tset_strpad(type.id(), H5T_STR_NULLPAD), "checkpoint ", file, ": cannot set string padding for ",
           object);
  H5_CHECK(H5Tset_cset(type.id(), H5T_CSET_UTF8), "checkpoint ", file, ": cannot set the character set for ",
           object);
  return type;
}

// The checksum of the /meta attributes. They are encoded as little-endian 64-bit integers and length-prefixed
// strings in this fixed order, so the value does not depend on how HDF5 lays attributes out:
// format_version, step, tokens_seen, data_cursor, rng_seed, rng_counter, adam_step, world_size, param_count,
// hgrn_version, git_commit, model_signature.
uint32_t meta_checksum(const TrainingState& state, int64_t format_version, int64_t param_count) {
  std::string bytes;
  auto put_integer = [&](uint64_t value) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
  };
  auto put_string = [&](const std::string& value) {
    put_integer(value.size());
    bytes += value;
  };
  put_integer(static_cast<uint64_t>(format_version));
  put_integer(static_cast<uint64_t>(state.step));
  put_integer(static_cast<uint64_t>(state.tokens_seen));
  put_integer(state.data_cursor);
  put_integer(state.rng.seed);
  put_integer(state.rng.counter);
  put_integer(static_cast<uint64_t>(state.adam_step));
  put_integer(static_cast<uint64_t>(state.world_size));
  put_integer(static_cast<uint64_t>(param_count));
  put_string(state.hgrn_version);
  put_string(state.git_commit);
  put_string(state.model_signature);
  return crc32(bytes.data(), bytes.size());
}

// The dataset of layer l's carried state under /recurrent_states.
std::string recurrent_state_name(size_t layer) { return "layer_" + std::to_string(layer); }

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

// ---------------------------------------------------------------------------------------------------------------
// Writing.

// Checks what the writer relies on, so that a bad state is reported in hgrn's words before any file exists.
void check_state_is_writable(const TrainingState& state) {
  HGRN_CHECK(state.step >= 0, "save_checkpoint: step must be >= 0, got ", state.step);
  HGRN_CHECK(state.adam_m.size() == state.params.size() && state.adam_v.size() == state.params.size(),
             "save_checkpoint: ", state.params.size(), " parameters but ", state.adam_m.size(), " first and ",
             state.adam_v.size(), " second AdamW moments (expected one of each per parameter)");
  std::set<std::string> names;
  for (size_t i = 0; i < state.params.size(); ++i) {
    const auto& [name, param] = state.params[i];
    // A '/' would make HDF5 create nested groups, and "." names the group itself.
    HGRN_CHECK(!name.empty() && name != "." && name.find('/') == std::string::npos,
               "save_checkpoint: parameter name '", name, "' cannot be an HDF5 dataset name (empty, '.' or has '/')");
    HGRN_CHECK(names.insert(name).second, "save_checkpoint: parameter '", name, "' appears twice");
    HGRN_CHECK(param.defined(), "save_checkpoint: parameter '", name, "' is an undefined tensor");
    for (const Tensor* moment : {&state.adam_m[i], &state.adam_v[i]}) {
      HGRN_CHECK(moment->defined(), "save_checkpoint: an AdamW moment of '", name, "' is an undefined tensor");
      HGRN_CHECK(moment->shape() == param.shape() && moment->dtype() == param.dtype(), "save_checkpoint: an AdamW ",
                 "moment of '", name, "' is ", dtype_name(moment->dtype()), " ", shape_str(moment->shape()),
                 ", the parameter is ", dtype_name(param.dtype()), " ", shape_str(param.shape()));
    }
  }
  for (size_t l = 0; l < state.recurrent_states.size(); ++l)
    HGRN_CHECK(state.recurrent_states[l].defined(), "save_checkpoint: the recurrent state of layer ", l,
               " is an undefined tensor");
  for (const auto& [name, array] : state.fp8_scaling)
    HGRN_CHECK(array.defined() && array.device() == Device::CPU, "save_checkpoint: the FP8 scaling array '", name,
               "' is undefined or not on the CPU");
  for (const std::string* text : {&state.config_yaml, &state.hgrn_version, &state.git_commit, &state.model_signature})
    HGRN_CHECK(text->find('\0') == std::string::npos,
               "save_checkpoint: text fields must not contain NUL bytes (HDF5 strings are NUL-padded)");
}

class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::string file) : file_(std::move(file)) {}

  void write(const TrainingState& state) {
    Handle access(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "checkpoint ", file_, ": cannot create a property list"),
                  H5Pclose, "file access property list for " + file_);
    // SEMI: closing the file fails while any object in it is still open, instead of silently deferring the
    // close; a successful close below therefore means every byte has been handed to the operating system.
    H5_CHECK(H5Pset_fclose_degree(access.id(), H5F_CLOSE_SEMI), "checkpoint ", file_,
             ": cannot set the file close degree");
    Handle file(H5_CHECK(H5Fcreate(file_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.id()), "cannot create ",
                         "checkpoint file ", file_, kWriteAdvice),
                H5Fclose, "checkpoint file " + file_);
    access.close();
    try {
      write_contents(file.id(), state);
      file.close();
    } catch (...) {
      hdf5::abandon_file(file, file_);  // the objects inside were closed as the exception left write_contents
      throw;
    }
  }

 private:
  void write_contents(hid_t file, const TrainingState& state) {
    const int64_t param_count = static_cast<int64_t>(state.params.size());
    write_meta(file, state, param_count);
    write_config(file, state.config_yaml);

    Handle params = create_group(file, "params", "/params", true);
    for (const auto& [name, tensor] : state.params) write_tensor(params.id(), "/params/", name, tensor);
    params.close();

    Handle adam = create_group(file, "adam", "/adam", false);
    Handle first = create_group(adam.id(), "m", "/adam/m", true);
    Handle second = create_group(adam.id(), "v", "/adam/v", true);
    for (size_t i = 0; i < state.params.size(); ++i) {
      write_tensor(first.id(), "/adam/m/", state.params[i].first, state.adam_m[i]);
      write_tensor(second.id(), "/adam/v/", state.params[i].first, state.adam_v[i]);
    }
    second.close();
    first.close();
    adam.close();

    if (!state.recurrent_states.empty()) {
      Handle states = create_group(file, "recurrent_states", "/recurrent_states", true);
      for (size_t l = 0; l < state.recurrent_states.size(); ++l)
        write_tensor(states.id(), "/recurrent_states/", recurrent_state_name(l), state.recurrent_states[l]);
      states.close();
    }

    if (!state.fp8_scaling.empty()) {
      Handle scaling = create_group(file, "fp8_scaling", "/fp8_scaling", true);
      for (const auto& [name, array] : state.fp8_scaling) write_tensor(scaling.id(), "/fp8_scaling/", name, array);
      scaling.close();
    }

    // Everything else reaches the file before the marker that says the file is whole.
    H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL), "cannot flush checkpoint file ", file_, kWriteAdvice);
    write_integer_attribute(file, "/", "complete", int64_t{1});
    H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL), "cannot flush checkpoint file ", file_, kWriteAdvice);
  }

  Handle create_group(hid_t parent, const char* name, const std::string& object, bool track_order) {
    Handle options(H5_CHECK(H5Pcreate(H5P_GROUP_CREATE), "checkpoint ", file_, ": cannot create a property list"),
                   H5Pclose, "group creation property list for " + object + " in " + file_);
    // HDF5 lists a group's members by name unless told to remember creation order, and the parameter order is the
    // model's order, which the trainer and the optimiser state rely on.
    if (track_order)
      H5_CHECK(H5Pset_link_creation_order(options.id(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED),
               "checkpoint ", file_, ": cannot ask HDF5 to track creation order in ", object);
    Handle group(H5_CHECK(H5Gcreate2(parent, name, H5P_DEFAULT, options.id(), H5P_DEFAULT), "checkpoint ", file_,
                          ": cannot create group ", object, kWriteAdvice),
                 H5Gclose, "group " + object + " in " + file_);
    options.close();
    return group;
  }

  Handle scalar_space(const std::string& object) {
    return Handle(H5_CHECK(H5Screate(H5S_SCALAR), "checkpoint ", file_, ": cannot create a dataspace for ", object),
                  H5Sclose, "dataspace of " + object + " in " + file_);
  }

  template <typename Integer>
  void write_integer_attribute(hid_t owner, const std::string& owner_path, const char* name, Integer value) {
    static_assert(sizeof(Integer) == 8 || sizeof(Integer) == 4);
    const std::string object = owner_path + " attribute " + name;
    hid_t file_type, memory_type;
    if constexpr (std::is_same_v<Integer, int64_t>) {
      file_type = H5T_STD_I64LE, memory_type = H5T_NATIVE_INT64;
    } else if constexpr (std::is_same_v<Integer, uint64_t>) {
      file_type = H5T_STD_U64LE, memory_type = H5T_NATIVE_UINT64;
    } else {
      static_assert(std::is_same_v<Integer, uint32_t>);
      file_type = H5T_STD_U32LE, memory_type = H5T_NATIVE_UINT32;
    }
    Handle space = scalar_space(object);
    Handle attribute(H5_CHECK(H5Acreate2(owner, name, file_type, space.id(), H5P_DEFAULT, H5P_DEFAULT), "checkpoint ",
                              file_, ": cannot create ", object, kWriteAdvice),
                     H5Aclose, object + " in " + file_);
    H5_CHECK(H5Awrite(attribute.id(), memory_type, &value), "checkpoint ", file_, ": cannot write ", object,
             kWriteAdvice);
    attribute.close();
    space.close();
  }

  void write_string_attribute(hid_t owner, const std::string& owner_path, const char* name,
                              const std::string& value) {
    const std::string object = owner_path + " attribute " + name;
    Handle type = make_string_type(value.size(), file_, object);
    Handle space = scalar_space(object);
    Handle attribute(H5_CHECK(H5Acreate2(owner, name, type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT), "checkpoint ",
                              file_, ": cannot create ", object, kWriteAdvice),
                     H5Aclose, object + " in " + file_);
    // c_str() supplies the one NUL byte HDF5 reads for an empty string.
    H5_CHECK(H5Awrite(attribute.id(), type.id(), value.c_str()), "checkpoint ", file_, ": cannot write ", object,
             kWriteAdvice);
    attribute.close();
    space.close();
    type.close();
  }

  void write_meta(hid_t file, const TrainingState& state, int64_t param_count) {
    Handle meta = create_group(file, "meta", "/meta", false);
    hid_t id = meta.id();
    write_integer_attribute(id, "/meta", "format_version", kCheckpointFormatVersion);
    write_integer_attribute(id, "/meta", "step", state.step);
    write_integer_attribute(id, "/meta", "tokens_seen", state.tokens_seen);
    write_integer_attribute(id, "/meta", "data_cursor", state.data_cursor);
    write_integer_attribute(id, "/meta", "rng_seed", state.rng.seed);
    write_integer_attribute(id, "/meta", "rng_counter", state.rng.counter);
    write_integer_attribute(id, "/meta", "adam_step", state.adam_step);
    write_integer_attribute(id, "/meta", "world_size", state.world_size);
    write_integer_attribute(id, "/meta", "param_count", param_count);
    write_string_attribute(id, "/meta", "hgrn_version", state.hgrn_version);
    write_string_attribute(id, "/meta", "git_commit", state.git_commit);
    write_string_attribute(id, "/meta", "model_signature", state.model_signature);
    write_integer_attribute(id, "/meta", "crc32", meta_checksum(state, kCheckpointFormatVersion, param_count));
    meta.close();
  }

  void write_config(hid_t file, const std::string& yaml) {
    const std::string object = "dataset /config";
    Handle type = make_string_type(yaml.size(), file_, object);
    Handle space = scalar_space(object);
    Handle dataset(H5_CHECK(H5Dcreate2(file, "config", type.id(), space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                            "checkpoint ", file_, ": cannot create ", object, kWriteAdvice),
                   H5Dclose, object + " in " + file_);
    H5_CHECK(H5Dwrite(dataset.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, yaml.c_str()), "checkpoint ", file_,
             ": cannot write ", object, kWriteAdvice);
    write_integer_attribute(dataset.id(), "/config", "crc32", crc32(yaml.data(), yaml.size()));
    dataset.close();
    space.close();
    type.close();
  }

  void write_tensor(hid_t group, const std::string& group_path, const std::string& name, const Tensor& tensor) {
    const std::string path = group_path + name;
    const std::string object = "dataset " + path;
    Tensor host = tensor.device() == Device::CPU ? tensor : tensor.to(Device::CPU);
    if (!host.is_contiguous()) host = host.clone();
    const StoredTypes types = stored_types(host.dtype());

    std::vector<hsize_t> dims(host.shape().begin(), host.shape().end());
    Handle space(dims.empty() ? H5_CHECK(H5Screate(H5S_SCALAR), "checkpoint ", file_,
                                         ": cannot create a dataspace for ", object)
                              : H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                         "checkpoint ", file_, ": cannot create a dataspace of shape ",
                                         shape_str(host.shape()), " for ", object),
                 H5Sclose, "dataspace of " + object + " in " + file_);
    // The default layout (contiguous, uncompressed) keeps each tensor's bytes in one run in the file, so any
    // HDF5 reader sees them directly and the checksum covers exactly what is on disk.
    Handle dataset(H5_CHECK(H5Dcreate2(group, name.c_str(), types.file_type, space.id(), H5P_DEFAULT, H5P_DEFAULT,
                                       H5P_DEFAULT),
                            "checkpoint ", file_, ": cannot create ", object, kWriteAdvice),
                   H5Dclose, object + " in " + file_);
    if (host.numel() > 0)
      H5_CHECK(H5Dwrite(dataset.id(), types.memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, host.raw_data()),
               "checkpoint ", file_, ": cannot write ", object, kWriteAdvice);
    const uint32_t checksum = host.numel() > 0 ? crc32(host.raw_data(), host.nbytes()) : crc32(nullptr, 0);
    write_integer_attribute(dataset.id(), path, "crc32", checksum);
    write_string_attribute(dataset.id(), path, "dtype", dtype_name(host.dtype()));
    dataset.close();
    space.close();
  }

  std::string file_;
};

// ---------------------------------------------------------------------------------------------------------------
// Reading.

class CheckpointReader {
 public:
  explicit CheckpointReader(std::string file) : file_(std::move(file)) {}

  TrainingState read() {
    check_file_looks_like_hdf5();
    Handle access(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), "checkpoint ", file_, ": cannot create a property list"),
                  H5Pclose, "file access property list for " + file_);
    H5_CHECK(H5Pset_fclose_degree(access.id(), H5F_CLOSE_SEMI), "checkpoint ", file_,
             ": cannot set the file close degree");
    Handle file(H5_CHECK(H5Fopen(file_.c_str(), H5F_ACC_RDONLY, access.id()), open_failure_message()), H5Fclose,
                "checkpoint file " + file_);
    access.close();

    // The marker first: a file without it is incomplete, whatever else is wrong with it.
    if (!attribute_exists(file.id(), "/", "complete"))
      fail("incomplete: the 'complete' marker is missing (its writer stopped before finishing)", kCorruptAdvice);
    if (read_integer_attribute<int64_t>(file.id(), "/", "complete") != 1)
      fail("incomplete: the 'complete' marker is not 1", kCorruptAdvice);

    TrainingState state;
    const int64_t param_count = read_meta(file.id(), state);
    state.config_yaml = read_config(file.id());

    Handle params = open_group(file.id(), "params", "/params");
    const std::vector<std::string> names = member_names_in_creation_order(params.id(), "/params");
    if (static_cast<int64_t>(names.size()) != param_count)
      fail("group /params holds ", names.size(), " datasets but /meta says param_count = ", param_count,
           kCorruptAdvice);
    for (const std::string& name : names) state.params.emplace_back(name, read_tensor(params.id(), "/params/", name));
    params.close();

    Handle adam = open_group(file.id(), "adam", "/adam");
    state.adam_m = read_moments(adam.id(), "m", state.params);
    state.adam_v = read_moments(adam.id(), "v", state.params);
    adam.close();

    // Optional: present in the checkpoints of data.stateful runs only.
    if (link_exists(file.id(), "recurrent_states", "/recurrent_states")) {
      Handle states = open_group(file.id(), "recurrent_states", "/recurrent_states");
      const std::vector<std::string> layers = member_names_in_creation_order(states.id(), "/recurrent_states");
      for (size_t l = 0; l < layers.size(); ++l) {
        if (layers[l] != recurrent_state_name(l))
          fail("group /recurrent_states holds '", layers[l], "' where '", recurrent_state_name(l), "' belongs",
               kCorruptAdvice);
        state.recurrent_states.push_back(read_tensor(states.id(), "/recurrent_states/", layers[l]));
      }
      states.close();
    }

    // Optional: present in the checkpoints of training.precision fp8 runs only.
    if (link_exists(file.id(), "fp8_scaling", "/fp8_scaling")) {
      Handle scaling = open_group(file.id(), "fp8_scaling", "/fp8_scaling");
      for (const std::string& name : member_names_in_creation_order(scaling.id(), "/fp8_scaling"))
        state.fp8_scaling.emplace_back(name, read_tensor(scaling.id(), "/fp8_scaling/", name));
      scaling.close();
    }

    file.close();
    return state;
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(Args&&... args) const {
    throw Error(detail::concat("checkpoint ", file_, ": ", std::forward<Args>(args)...));
  }

  // Catches the commonest kinds of bad file before HDF5 does, with a plainer message.
  void check_file_looks_like_hdf5() const {
    std::error_code error;
    const fs::file_status status = fs::status(file_, error);
    if (!fs::exists(status)) fail("no such file");
    if (!fs::is_regular_file(status)) fail("not a regular file");
    const uintmax_t size = fs::file_size(file_, error);
    if (error) fail("cannot read its size: ", error.message());
    if (size == 0) fail("truncated to 0 bytes (its writer or a copy stopped before writing anything)", kCorruptAdvice);
    const htri_t is_hdf5 = H5_CHECK(H5Fis_hdf5(file_.c_str()), "checkpoint ", file_,
                                    ": cannot be read as HDF5: not a valid HDF5 file, or unreadable");
    if (is_hdf5 == 0) fail("not a valid HDF5 file (no HDF5 signature at its start)", kCorruptAdvice);
  }

  // Called only while H5Fopen's failure is on HDF5's error stack, to say which of the likely causes it was.
  std::string open_failure_message() const {
    if (hdf5::error_stack_says_truncated())
      return "checkpoint " + file_ +
             ": truncated: the file is shorter than its HDF5 superblock says (a copy or a write was cut short)" +
             kCorruptAdvice;
    return "checkpoint " + file_ + ": not a valid HDF5 file, or its HDF5 structure is damaged" +
           kCorruptAdvice;
  }

  bool link_exists(hid_t parent, const char* name, const std::string& object) const {
    return H5_CHECK(H5Lexists(parent, name, H5P_DEFAULT), "checkpoint ", file_, ": cannot look up ", object,
                    kCorruptAdvice) > 0;
  }

  bool attribute_exists(hid_t owner, const std::string& owner_path, const char* name) const {
    return H5_CHECK(H5Aexists(owner, name), "checkpoint ", file_, ": cannot look up attribute ", name, " of ",
                    owner_path, kCorruptAdvice) > 0;
  }

  Handle open_group(hid_t parent, const char* name, const std::string& object) const {
    if (!link_exists(parent, name, object)) fail("missing object ", object, kCorruptAdvice);
    return Handle(H5_CHECK(H5Gopen2(parent, name, H5P_DEFAULT), "checkpoint ", file_, ": cannot open group ", object,
                           kCorruptAdvice),
                  H5Gclose, "group " + object + " in " + file_);
  }

  Handle open_dataset(hid_t parent, const std::string& name, const std::string& object) const {
    if (!link_exists(parent, name.c_str(), object)) fail("missing object ", object, kCorruptAdvice);
    return Handle(H5_CHECK(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), "checkpoint ", file_, ": cannot open dataset ",
                           object, kCorruptAdvice),
                  H5Dclose, "dataset " + object + " in " + file_);
  }

  // The type or the dataspace of an attribute or a dataset: `get` is H5Aget_type or H5Dget_type, H5Aget_space or
  // H5Dget_space.
  using Getter = hid_t (*)(hid_t);
  Handle type_of(hid_t id, Getter get, const std::string& object) const {
    return Handle(H5_CHECK(get(id), "checkpoint ", file_, ": cannot read the type of ", object, kCorruptAdvice),
                  H5Tclose, "type of " + object + " in " + file_);
  }
  Handle dataspace_of(hid_t id, Getter get, const std::string& object) const {
    return Handle(H5_CHECK(get(id), "checkpoint ", file_, ": cannot read the shape of ", object, kCorruptAdvice),
                  H5Sclose, "dataspace of " + object + " in " + file_);
  }

  // Fails unless the attribute or dataset holds exactly one value, so reading it cannot overrun.
  void check_single_value(hid_t id, Getter get_space, const std::string& object) const {
    Handle space = dataspace_of(id, get_space, object);
    const hssize_t count = H5_CHECK(H5Sget_simple_extent_npoints(space.id()), "checkpoint ", file_,
                                    ": cannot read the size of ", object, kCorruptAdvice);
    if (count != 1) fail(object, " has ", count, " values (expected one)", kCorruptAdvice);
    space.close();
  }

  // Opens a required attribute and checks that it holds exactly one value.
  Handle open_single_value_attribute(hid_t owner, const std::string& owner_path, const char* name) const {
    const std::string object = owner_path + " attribute " + name;
    if (!attribute_exists(owner, owner_path, name)) fail("missing object ", object, kCorruptAdvice);
    Handle attribute(H5_CHECK(H5Aopen(owner, name, H5P_DEFAULT), "checkpoint ", file_, ": cannot open ", object,
                              kCorruptAdvice),
                     H5Aclose, object + " in " + file_);
    check_single_value(attribute.id(), H5Aget_space, object);
    return attribute;
  }

  template <typename Integer>
  Integer read_integer_attribute(hid_t owner, const std::string& owner_path, const char* name) const {
    const std::string object = owner_path + " attribute " + name;
    Handle attribute = open_single_value_attribute(owner, owner_path, name);
    Handle type = type_of(attribute.id(), H5Aget_type, object);
    const H5T_class_t type_class = H5_CHECK(H5Tget_class(type.id()), "checkpoint ", file_,
                                            ": cannot read the type class of ", object, kCorruptAdvice);
    if (type_class != H5T_INTEGER) fail(object, " is not an integer", kCorruptAdvice);
    type.close();
    hid_t memory_type;
    if constexpr (std::is_same_v<Integer, int64_t>)
      memory_type = H5T_NATIVE_INT64;
    else if constexpr (std::is_same_v<Integer, uint64_t>)
      memory_type = H5T_NATIVE_UINT64;
    else
      memory_type = H5T_NATIVE_UINT32;
    Integer value{};
    H5_CHECK(H5Aread(attribute.id(), memory_type, &value), "checkpoint ", file_, ": cannot read ", object,
             kCorruptAdvice);
    attribute.close();
    return value;
  }

  // The bytes of a fixed-length string type's value, without the NUL padding.
  static std::string strip_padding(std::string text) {
    while (!text.empty() && text.back() == '\0') text.pop_back();
    return text;
  }

  // Checks that `type` is a fixed-length string and returns its length in bytes.
  size_t fixed_string_size(hid_t type, const std::string& object) const {
    const H5T_class_t type_class = H5_CHECK(H5Tget_class(type), "checkpoint ", file_,
                                            ": cannot read the type class of ", object, kCorruptAdvice);
    if (type_class != H5T_STRING) fail(object, " is not a string", kCorruptAdvice);
    if (H5_CHECK(H5Tis_variable_str(type), "checkpoint ", file_, ": cannot read the string kind of ", object,
                 kCorruptAdvice) > 0)
      fail(object, " is a variable-length string (hgrn writes fixed-length strings)", kCorruptAdvice);
    return H5_CHECK(H5Tget_size(type), "checkpoint ", file_, ": cannot read the string length of ", object,
                    kCorruptAdvice);
  }

  std::string read_string_attribute(hid_t owner, const std::string& owner_path, const char* name) const {
    const std::string object = owner_path + " attribute " + name;
    Handle attribute = open_single_value_attribute(owner, owner_path, name);
    Handle type = type_of(attribute.id(), H5Aget_type, object);
    std::string text(fixed_string_size(type.id(), object), '\0');
    H5_CHECK(H5Aread(attribute.id(), type.id(), text.data()), "checkpoint ", file_, ": cannot read ", object,
             kCorruptAdvice);
    type.close();
    attribute.close();
    return strip_padding(std::move(text));
  }

  // Reads /meta into `state` and returns param_count.
  int64_t read_meta(hid_t file, TrainingState& state) const {
    Handle meta = open_group(file, "meta", "/meta");
    hid_t id = meta.id();
    const int64_t format_version = read_integer_attribute<int64_t>(id, "/meta", "format_version");
    if (format_version != kCheckpointFormatVersion)
      fail("format_version ", format_version, ", but this hgrn reads format ", kCheckpointFormatVersion,
           " (use the hgrn version that wrote it, or start over with checkpoint.resume: never)");
    state.step = read_integer_attribute<int64_t>(id, "/meta", "step");
    state.tokens_seen = read_integer_attribute<int64_t>(id, "/meta", "tokens_seen");
    state.data_cursor = read_integer_attribute<uint64_t>(id, "/meta", "data_cursor");
    state.rng.seed = read_integer_attribute<uint64_t>(id, "/meta", "rng_seed");
    state.rng.counter = read_integer_attribute<uint64_t>(id, "/meta", "rng_counter");
    state.adam_step = read_integer_attribute<int64_t>(id, "/meta", "adam_step");
    state.world_size = read_integer_attribute<int64_t>(id, "/meta", "world_size");
    const int64_t param_count = read_integer_attribute<int64_t>(id, "/meta", "param_count");
    state.hgrn_version = read_string_attribute(id, "/meta", "hgrn_version");
    state.git_commit = read_string_attribute(id, "/meta", "git_commit");
    state.model_signature = read_string_attribute(id, "/meta", "model_signature");
    const uint32_t stored = read_integer_attribute<uint32_t>(id, "/meta", "crc32");
    meta.close();
    const uint32_t computed = meta_checksum(state, format_version, param_count);
    if (stored != computed)
      fail("checksum mismatch in /meta attributes (stored ", hex32(stored), ", computed ", hex32(computed), ")",
           kCorruptAdvice);
    if (state.step < 0 || state.world_size < 1 || param_count < 0)
      fail("impossible values in /meta: step ", state.step, ", world_size ", state.world_size, ", param_count ",
           param_count, kCorruptAdvice);
    return param_count;
  }

  std::string read_config(hid_t file) const {
    const std::string object = "dataset /config";
    Handle dataset = open_dataset(file, "config", "/config");
    Handle type = type_of(dataset.id(), H5Dget_type, object);
    const size_t size = fixed_string_size(type.id(), object);
    check_single_value(dataset.id(), H5Dget_space, object);
    std::string text(size, '\0');
    H5_CHECK(H5Dread(dataset.id(), type.id(), H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()), "checkpoint ", file_,
             ": cannot read ", object, kCorruptAdvice);
    text = strip_padding(std::move(text));
    verify_checksum(dataset.id(), "/config", text.data(), text.size());
    type.close();
    dataset.close();
    return text;
  }

  void verify_checksum(hid_t dataset, const std::string& path, const void* data, size_t size) const {
    const uint32_t stored = read_integer_attribute<uint32_t>(dataset, path, "crc32");
    const uint32_t computed = crc32(data, size);
    if (stored != computed)
      fail("checksum mismatch in dataset ", path, " (stored ", hex32(stored), ", computed ", hex32(computed),
           ")", kCorruptAdvice);
  }

  std::vector<std::string> member_names_in_creation_order(hid_t group, const std::string& object) const {
    H5G_info_t info;
    H5_CHECK(H5Gget_info(group, &info), "checkpoint ", file_, ": cannot list group ", object, kCorruptAdvice);
    std::vector<std::string> names;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      // First call: the name's length; second: the name (the buffer holds the terminating NUL too).
      const ssize_t length =
          H5_CHECK(H5Lget_name_by_idx(group, ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT),
                   "checkpoint ", file_, ": cannot list group ", object, " in creation order", kCorruptAdvice);
      std::string name(static_cast<size_t>(length) + 1, '\0');
      H5_CHECK(H5Lget_name_by_idx(group, ".", H5_INDEX_CRT_ORDER, H5_ITER_INC, i, name.data(), name.size(),
                                  H5P_DEFAULT),
               "checkpoint ", file_, ": cannot list group ", object, " in creation order", kCorruptAdvice);
      name.resize(static_cast<size_t>(length));
      names.push_back(std::move(name));
    }
    return names;
  }

  Shape dataset_shape(hid_t dataset, const std::string& object) const {
    Handle space = dataspace_of(dataset, H5Dget_space, object);
    const H5S_class_t space_class = H5_CHECK(H5Sget_simple_extent_type(space.id()), "checkpoint ", file_,
                                             ": cannot read the shape of ", object, kCorruptAdvice);
    Shape shape;
    if (space_class == H5S_SIMPLE) {
      const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space.id()), "checkpoint ", file_,
                                ": cannot read the rank of ", object, kCorruptAdvice);
      std::vector<hsize_t> dims(static_cast<size_t>(rank));
      H5_CHECK(H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr), "checkpoint ", file_,
               ": cannot read the dimensions of ", object, kCorruptAdvice);
      shape.assign(dims.begin(), dims.end());
    } else if (space_class != H5S_SCALAR) {
      fail(object, " has a null dataspace", kCorruptAdvice);
    }
    space.close();
    return shape;
  }

  Tensor read_tensor(hid_t group, const std::string& group_path, const std::string& name) const {
    const std::string path = group_path + name;
    const std::string object = "dataset " + path;
    Handle dataset = open_dataset(group, name, path);

    const std::string dtype_text = read_string_attribute(dataset.id(), path, "dtype");
    DType dtype;
    try {
      dtype = dtype_from_name(dtype_text);
    } catch (const std::invalid_argument&) {
      fail(object, " has unknown dtype '", dtype_text, "'", kCorruptAdvice);
    }
    const StoredTypes types = stored_types(dtype);
    Handle type = type_of(dataset.id(), H5Dget_type, object);
    if (H5_CHECK(H5Tequal(type.id(), types.file_type), "checkpoint ", file_, ": cannot compare the type of ", object,
                 kCorruptAdvice) == 0)
      fail(object, " is stored with an HDF5 type that does not match its dtype attribute '", dtype_text, "'",
           kCorruptAdvice);
    type.close();

    const Shape shape = dataset_shape(dataset.id(), object);
    const size_t expected_bytes = static_cast<size_t>(checked_mul(
        shape_numel(shape), static_cast<int64_t>(dtype_size(dtype)), "checkpoint ", file_, ": the size of ", object));
    // Compare with what the file really holds before allocating: a damaged shape must not become a huge allocation.
    if (expected_bytes > 0) {
      const hsize_t stored_bytes = H5_CHECK(H5Dget_storage_size(dataset.id()), "checkpoint ", file_, ": ", object,
                                            " has no stored data", kCorruptAdvice);
      if (stored_bytes != expected_bytes)
        fail(object, " holds ", stored_bytes, " bytes but its shape ", shape_str(shape), " and dtype ",
             dtype_text, " need ", expected_bytes, kCorruptAdvice);
    }
    Tensor tensor = Tensor::empty(shape, dtype);
    if (expected_bytes > 0)
      H5_CHECK(H5Dread(dataset.id(), types.memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.raw_data()),
               "checkpoint ", file_, ": cannot read ", object, kCorruptAdvice);
    verify_checksum(dataset.id(), path, expected_bytes > 0 ? tensor.raw_data() : nullptr, expected_bytes);
    dataset.close();
    return tensor;
  }

  // One AdamW moment per parameter, looked up by the parameter's name and checked against its shape and dtype.
  std::vector<Tensor> read_moments(hid_t adam, const char* which,
                                   const std::vector<std::pair<std::string, Tensor>>& params) const {
    const std::string group_path = std::string("/adam/") + which;
    Handle group = open_group(adam, which, group_path);
    std::vector<Tensor> moments;
    for (const auto& [name, param] : params) {
      Tensor moment = read_tensor(group.id(), group_path + "/", name);
      if (moment.shape() != param.shape() || moment.dtype() != param.dtype())
        fail("dataset ", group_path, "/", name, " is ", dtype_name(moment.dtype()), " ", shape_str(moment.shape()),
             " but its parameter is ", dtype_name(param.dtype()), " ", shape_str(param.shape()), kCorruptAdvice);
      moments.push_back(std::move(moment));
    }
    // Every parameter's moment was found by name above; a larger count means the group holds something else too.
    H5G_info_t info;
    H5_CHECK(H5Gget_info(group.id(), &info), "checkpoint ", file_, ": cannot list group ", group_path,
             kCorruptAdvice);
    if (info.nlinks != params.size())
      fail("group ", group_path, " holds ", info.nlinks, " datasets but there are ", params.size(), " parameters",
           kCorruptAdvice);
    group.close();
    return moments;
  }

  std::string file_;
};

// ---------------------------------------------------------------------------------------------------------------
// Directory scans.

struct CheckpointFile {
  int64_t step;
  fs::path path;
};

// The regular files in dir, or nothing when dir does not exist.
std::vector<fs::directory_entry> regular_files_in(const std::string& dir) {
  std::error_code error;
  if (!fs::exists(dir, error)) return {};
  std::vector<fs::directory_entry> files;
  fs::directory_iterator it(dir, error);
  HGRN_CHECK(!error, "cannot list checkpoint directory ", dir, ": ", error.message());
  for (; it != fs::directory_iterator(); it.increment(error)) {
    HGRN_CHECK(!error, "cannot list checkpoint directory ", dir, ": ", error.message());
    if (it->is_regular_file(error)) files.push_back(*it);
  }
  HGRN_CHECK(!error, "cannot list checkpoint directory ", dir, ": ", error.message());
  return files;
}

// The checkpoints (final names only) in dir, oldest first.
std::vector<CheckpointFile> checkpoints_in(const std::string& dir) {
  std::vector<CheckpointFile> checkpoints;
  for (const fs::directory_entry& entry : regular_files_in(dir))
    if (std::optional<int64_t> step = checkpoint_step_from_file_name(entry.path().filename().string()))
      checkpoints.push_back({*step, entry.path()});
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const CheckpointFile& a, const CheckpointFile& b) { return a.step < b.step; });
  return checkpoints;
}

void remove_file(const fs::path& path, const char* what) {
  std::error_code error;
  fs::remove(path, error);
  HGRN_CHECK(!error, "cannot delete ", what, " ", path.string(), ": ", error.message(),
             " (check the run directory's permissions)");
}

}  // namespace

// -----------------------------------------------------------------------------------------------------------------
// Public API.

std::string checkpoint_file_name(int64_t step) {
  HGRN_CHECK(step >= 0, "checkpoint step must be >= 0, got ", step);
  std::string digits = std::to_string(step);
  if (digits.size() < kStepDigits) digits.insert(0, kStepDigits - digits.size(), '0');
  return std::string(kStepPrefix) + digits + std::string(kExtension);
}

std::optional<int64_t> checkpoint_step_from_file_name(const std::string& file_name) {
  std::string_view name(file_name);
  if (!name.starts_with(kStepPrefix) || !name.ends_with(kExtension)) return std::nullopt;
  std::string_view digits = name.substr(kStepPrefix.size(), name.size() - kStepPrefix.size() - kExtension.size());
  // Up to 18 digits always fits an int64_t.
  if (digits.size() < kStepDigits || digits.size() > 18 || !all_digits(digits)) return std::nullopt;
  const int64_t step = std::stoll(std::string(digits));
  // Only the spelling checkpoint_file_name produces: "step_000000042.h5" would be a second name for step 42.
  if (checkpoint_file_name(step) != file_name) return std::nullopt;
  return step;
}

std::string checkpoint_temp_file_name(int64_t step) {
  return checkpoint_file_name(step) + std::string(kTempMarker) + std::to_string(::getpid());
}

bool is_checkpoint_temp_file_name(const std::string& file_name) {
  const size_t marker = file_name.rfind(kTempMarker);
  if (marker == std::string::npos) return false;
  return checkpoint_step_from_file_name(file_name.substr(0, marker)).has_value() &&
         all_digits(std::string_view(file_name).substr(marker + kTempMarker.size()));
}

std::string save_checkpoint(const std::string& dir, const TrainingState& state) {
  hdf5::prepare_library();
  HGRN_CHECK(!dir.empty(), "save_checkpoint: the checkpoint directory is empty (set logging.run_dir)");
  check_state_is_writable(state);
  std::error_code error;
  fs::create_directories(dir, error);
  HGRN_CHECK(!error, "cannot create checkpoint directory ", dir, ": ", error.message(), kWriteAdvice);

  const fs::path final_path = fs::path(dir) / checkpoint_file_name(state.step);
  const fs::path temp_path = fs::path(dir) / checkpoint_temp_file_name(state.step);
  // A save that fails with an error leaves nothing behind; one killed outright leaves its temporary file, which
  // prune_checkpoints removes.
  TemporaryPathGuard guard(temp_path.string());
  CheckpointWriter(temp_path.string()).write(state);
  sync_path_to_disk(temp_path.string(), false);  // the bytes reach the disk before the name does
  rename_path(temp_path.string(), final_path.string());
  guard.disarm();
  sync_path_to_disk(dir, true);  // and the rename before save_checkpoint returns
  return final_path.string();
}

TrainingState load_checkpoint(const std::string& path) {
  hdf5::prepare_library();
  return CheckpointReader(path).read();
}

namespace {

struct LoadFailure {
  std::string path, reason;  // the reason names the path too
};

// The newest checkpoint in dir that loads; each newer one that does not is added to `failures`.
std::optional<std::string> newest_loadable_checkpoint(const std::string& dir, std::vector<LoadFailure>& failures) {
  hdf5::prepare_library();
  std::vector<CheckpointFile> checkpoints = checkpoints_in(dir);
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    try {
      load_checkpoint(it->path.string());
      return it->path.string();
    } catch (const Error& error) {
      failures.push_back({it->path.string(), error.what()});
    }
  }
  return std::nullopt;
}

void warn_skipped(const std::vector<LoadFailure>& failures, std::ostream& warnings) {
  for (const LoadFailure& failure : failures)
    warnings << "warning: skipping checkpoint " << failure.path << ": " << failure.reason << "\n";
}

}  // namespace

std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, std::ostream& warnings) {
  std::vector<LoadFailure> failures;
  std::optional<std::string> found = newest_loadable_checkpoint(dir, failures);
  warn_skipped(failures, warnings);
  return found;
}

std::optional<std::string> find_checkpoint_to_resume(const std::string& dir, std::ostream& warnings) {
  std::vector<LoadFailure> failures;
  std::optional<std::string> found = newest_loadable_checkpoint(dir, failures);
  if (!found && !failures.empty()) {
    std::string list;
    for (const LoadFailure& failure : failures) list += "\n  " + failure.reason;
    throw Error("checkpoint.resume is auto, but none of the " + std::to_string(failures.size()) + " checkpoints in " +
                dir + " can be loaded, and starting over would bury them:" + list +
                "\nRestore a good checkpoint into " + dir + ", or move these files away (or use another " +
                "logging.run_dir) to start a new run");
  }
  warn_skipped(failures, warnings);
  return found;
}

void prune_checkpoints(const std::string& dir, int64_t keep_last, int64_t keep_every) {
  HGRN_CHECK(keep_last >= 1, "prune_checkpoints: keep_last must be >= 1, got ", keep_last);
  HGRN_CHECK(keep_every >= 0, "prune_checkpoints: keep_every must be >= 0, got ", keep_every);
  for (const fs::directory_entry& entry : regular_files_in(dir))
    if (is_checkpoint_temp_file_name(entry.path().filename().string()))
      remove_file(entry.path(), "the unfinished checkpoint");

  const std::vector<CheckpointFile> checkpoints = checkpoints_in(dir);
  const size_t newest_kept_from = checkpoints.size() > static_cast<size_t>(keep_last)
                                      ? checkpoints.size() - static_cast<size_t>(keep_last)
                                      : 0;
  for (size_t i = 0; i < newest_kept_from; ++i) {
    const bool milestone = keep_every > 0 && checkpoints[i].step % keep_every == 0;
    if (!milestone) remove_file(checkpoints[i].path, "old checkpoint");
  }
}

void check_checkpoint_model(const TrainingState& loaded, const std::string& model_signature, const std::string& path) {
  if (loaded.model_signature != model_signature)
    throw Error("checkpoint " + path + " was written for a different model: its model signature is '" +
                loaded.model_signature + "', the config's is '" + model_signature +
                "'. Use the config that wrote this checkpoint (its model section), or to train anew start a new run "
                "with checkpoint.resume: never (or a different logging.run_dir)");
}

void check_checkpoint_compatible(const TrainingState& loaded, const std::string& model_signature, int64_t world_size,
                                 const std::vector<std::pair<std::string, Shape>>& param_shapes,
                                 const std::string& path) {
  const std::string advice =
      ". Resume with the config that wrote this checkpoint, or start a new run with checkpoint.resume: never (or a "
      "different logging.run_dir)";
  check_checkpoint_model(loaded, model_signature, path);
  if (loaded.world_size != world_size)
    throw Error("checkpoint " + path + " was written with world size " + std::to_string(loaded.world_size) +
                ", this run has world size " + std::to_string(world_size) +
                " (the data stream and batch split would not continue exactly)" + advice);
  if (loaded.params.size() != param_shapes.size())
    throw Error("checkpoint " + path + " holds " + std::to_string(loaded.params.size()) +
                " parameters, this run's model has " + std::to_string(param_shapes.size()) + advice);
  for (size_t i = 0; i < param_shapes.size(); ++i) {
    const auto& [loaded_name, loaded_tensor] = loaded.params[i];
    const auto& [expected_name, expected_shape] = param_shapes[i];
    if (loaded_name != expected_name)
      throw Error("checkpoint " + path + ": parameter name #" + std::to_string(i) + " is '" + loaded_name +
                  "', this run's model expects '" + expected_name + "'" + advice);
    if (loaded_tensor.shape() != expected_shape)
      throw Error("checkpoint " + path + ": parameter shape of '" + loaded_name + "' is " +
                  shape_str(loaded_tensor.shape()) + ", this run's model expects " + shape_str(expected_shape) +
                  advice);
  }
}

}  // namespace hgrn
