// mpi_collectives.cpp: collectives.h for CPU ranks, through MPI (blocking calls: nothing to overlap on the CPU),
// and make_collectives, which picks MPI or NCCL (dist/nccl_collectives.cpp).
#include <algorithm>
#include <chrono>
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

// MPI has no bf16: a sum over 16-bit words that adds in fp32 and rounds each result to bf16, as NCCL's does.
void add_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

class MpiCollectives : public Collectives {
 public:
  MpiCollectives() { MPI_CHECK(MPI_Op_create(&add_bf16, /*commute=*/1, &bf16_sum_)); }
  ~MpiCollectives() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Op_free(&bf16_sum_);
  }
  void after_compute() override {}
  void all_reduce_sum(void* data, int64_t count, DType dtype) override {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), mpi_type(dtype), sum_op(dtype), MPI_COMM_WORLD));
  }
  void all_reduce_max(float* data, int64_t count) override {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD));
  }
  void reduce_scatter_sum(void* data, int64_t count, DType dtype) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    share_.resize(bytes);
    MPI_CHECK(MPI_Reduce_scatter_block(data, share_.data(), mpi_count(count), mpi_type(dtype), sum_op(dtype),
                                       MPI_COMM_WORLD));
    std::memcpy(static_cast<char*>(data) + static_cast<size_t>(world().rank) * bytes, share_.data(), bytes);
  }
  void all_gather(float* data, int64_t count) override {
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, mpi_count(count), MPI_FLOAT, MPI_COMM_WORLD));
  }
  void wait(const char*) override {}
  void record_mark(size_t) override {}
  void wait_mark(size_t, const char*) override {}
  void stamp(size_t id, Stream) override {
    if (stamps_.size() <= id) stamps_.resize(id + 1);
    stamps_[id] = std::chrono::steady_clock::now();
  }
  double stamp_ms(size_t from, size_t to) override {
    HGRN_CHECK(std::max(from, to) < stamps_.size(), "MPI collectives: stamp ", std::max(from, to), " never taken");
    return std::chrono::duration<double, std::milli>(stamps_[to] - stamps_[from]).count();
  }

 private:
  static MPI_Datatype mpi_type(DType dtype) {
    HGRN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "MPI sums fp32 or bf16, not ", dtype_name(dtype));
    return dtype == DType::F32 ? MPI_FLOAT : MPI_UINT16_T;
  }
  MPI_Op sum_op(DType dtype) const { return dtype == DType::F32 ? MPI_SUM : bf16_sum_; }

  MPI_Op bf16_sum_ = MPI_OP_NULL;
  std::vector<char> share_;
  std::vector<std::chrono::steady_clock::time_point> stamps_;
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
