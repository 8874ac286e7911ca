// world.cpp: the MPI side of world.h. Everything here is a no-op for a single process, so the same binary runs with
// and without mpirun. MPI_CHECK turns a failing MPI call into an Error that names the rank and the call.
#include "dist/world.h"

#include <cstdlib>
#include <cstring>

#ifdef HGRN_WITH_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: the deprecated C++ bindings would need their own library
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace hgrn {

namespace {
World the_world;
bool mpi_active = false;

// The launcher's own environment variables say how many processes it started (OpenMPI, MPICH/Hydra, Slurm/PMIx).
int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoi(v);
  }
  return 1;
}

#ifdef HGRN_WITH_MPI
#define MPI_CHECK(call)                                                                                       \
  do {                                                                                                        \
    int rc_ = (call);                                                                                         \
    if (rc_ != MPI_SUCCESS) {                                                                                 \
      char msg_[MPI_MAX_ERROR_STRING];                                                                        \
      int len_ = 0;                                                                                           \
      MPI_Error_string(rc_, msg_, &len_);                                                                     \
      throw Error(detail::concat("MPI error on rank ", the_world.rank, " in ", #call, ": ", std::string(msg_, len_), \
                                 " [", __FILE__, ":", __LINE__, "]"));                                        \
    }                                                                                                         \
  } while (0)

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// FNV-1a: a stable fingerprint for comparing texts across ranks without sending them.
uint64_t fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}
#endif
}  // namespace

void init_world(int* argc, char*** argv) {
  const int launched = launcher_world_size();
#ifdef HGRN_WITH_MPI
  if (launched > 1) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors become Errors naming the call
    mpi_active = true;
    std::atexit(finalize_mpi);
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &the_world.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &the_world.size));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, the_world.rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &the_world.local_rank));
    MPI_Comm_free(&node);
  }
#else
  (void)argc;
  (void)argv;
  HGRN_CHECK(launched <= 1, "hgrn was started as one of ", launched,
             " processes (mpirun/srun), but this build has no MPI: install libopenmpi-dev and rebuild "
             "(scripts/setup.sh), or run a single process");
#endif
}

const World& world() { return the_world; }

void allreduce_sum(const std::vector<Tensor*>& tensors) {
  if (!mpi_active || the_world.size == 1) return;
#ifdef HGRN_WITH_MPI
  for (Tensor* t : tensors) {
    HGRN_CHECK(t->device() == Device::CPU && t->is_contiguous(),
               "allreduce: multi-process training reduces CPU tensors through MPI; GPU ranks need the NCCL path, "
               "which this build does not have yet: run one process per GPU only with training.device: cpu");
    MPI_Datatype type;
    switch (t->dtype()) {
      case DType::F32: type = MPI_FLOAT; break;
      case DType::F64: type = MPI_DOUBLE; break;
      default: throw Error(std::string("allreduce: no MPI reduction for ") + dtype_name(t->dtype()));
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t->raw_data(), static_cast<int>(t->numel()), type, MPI_SUM,
                            MPI_COMM_WORLD));
  }
#endif
}

void allreduce_sum(std::vector<double>& values) {
  if (!mpi_active || the_world.size == 1) return;
#ifdef HGRN_WITH_MPI
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                          MPI_COMM_WORLD));
#endif
}

void require_same_on_all_ranks(const std::string& what, const std::string& text) {
  if (!mpi_active || the_world.size == 1) return;
#ifdef HGRN_WITH_MPI
  const unsigned long long mine = fingerprint(text);
  std::vector<unsigned long long> all(static_cast<size_t>(the_world.size));
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD));
  for (int r = 1; r < the_world.size; ++r)
    HGRN_CHECK(all[r] == all[0], "rank ", r, " runs with another ", what, " than rank 0: every rank of a run must use "
               "the same binary and config (same file, same --set overrides)");
#endif
}

}  // namespace hgrn
