// mpi_collectives.cpp: collectives.h for CPU ranks, through MPI (blocking calls: nothing to overlap on the CPU),
// and make_collectives, which picks MPI or NCCL (dist/nccl_collectives.cpp).
#include <cstring>
#include <vector>

#include "core/check.h"
#include "dist/collectives.h"
#include "dist/mpi_check.h"
#include "dist/world.h"

namespace hgrn {

std::unique_ptr<Collectives> make_nccl_collectives();  // nccl_collectives.cpp

namespace {

#ifdef HGRN_WITH_MPI
int mpi_count(int64_t count) {
  HGRN_CHECK(count >= 0 && count <= INT32_MAX, "MPI collective over ", count, " values: more than one MPI call carries");
  return static_cast<int>(count);
}

class MpiCollectives : public Collectives {
 public:
  void after_compute() override {}
  void all_reduce_sum(float* data, int64_t count) override {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
  }
  void all_reduce_max(float* data, int64_t count) override {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD));
  }
  void reduce_scatter_sum(float* data, int64_t count) override {
    share_.resize(static_cast<size_t>(count));
    MPI_CHECK(MPI_Reduce_scatter_block(data, share_.data(), mpi_count(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    std::memcpy(data + world().rank * count, share_.data(), static_cast<size_t>(count) * sizeof(float));
  }
  void all_gather(float* data, int64_t count) override {
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, mpi_count(count), MPI_FLOAT, MPI_COMM_WORLD));
  }
  void wait(const char*) override {}
  void record_mark(size_t) override {}
  void wait_mark(size_t, const char*) override {}

 private:
  std::vector<float> share_;
};
#endif

}  // namespace

std::unique_ptr<Collectives> make_collectives(Device device) {
  HGRN_CHECK(mpi_active(), "data-parallel collectives need a run started by mpirun/srun with more than one process");
  if (device == Device::CUDA) return make_nccl_collectives();
#ifdef HGRN_WITH_MPI
  return std::make_unique<MpiCollectives>();
#else
  throw Error("this hgrn was built without MPI");
#endif
}

}  // namespace hgrn
