// world.h: the data-parallel world of a training run: one process per device, launched by mpirun (or srun), or a
// single process without any launcher. Holds the rank, the world size and the collectives the trainer needs.
// This first part runs data parallelism on the CPU through MPI; GPU ranks (NCCL) are refused with a message until
// the NCCL path exists.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hgrn {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes of this node (which GPU to use)
  bool is_root() const { return rank == 0; }
};

// Initialises MPI when the process was started by an MPI launcher (mpirun, srun) and hgrn was built with MPI;
// otherwise the world is a single process. Launched by mpirun with more than one process but built without MPI:
// an Error saying so. Call once, first thing in main; finalisation is registered with atexit.
void init_world(int* argc, char*** argv);
const World& world();

// Sums each tensor (CPU fp32/fp64, in place) across all ranks; with one process it does nothing.
void allreduce_sum(const std::vector<Tensor*>& tensors);
// Sums `values` in place across all ranks.
void allreduce_sum(std::vector<double>& values);
// Every rank passes its own text (a config, a version string); all must be equal, else every rank throws an Error
// that names `what` and the first rank that differs from rank 0.
void require_same_on_all_ranks(const std::string& what, const std::string& text);

}  // namespace hgrn
