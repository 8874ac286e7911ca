// world.h: the data-parallel world of a training run: one process per device, launched by mpirun (or srun), or a
// single process without any launcher. Holds the rank, the world size and the small host-side collectives the
// trainer needs (gradients travel through dist/collectives.h: MPI on the CPU, NCCL between GPUs).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hgrn {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes of this node (which GPU to use)
  int local_size = 1;  // processes on this node
  bool is_root() const { return rank == 0; }
};

// Initialises MPI when the process was started by an MPI launcher (mpirun, srun) and hgrn was built with MPI;
// otherwise the world is a single process. Launched by mpirun with more than one process but built without MPI:
// an Error saying so. Call once, first thing in main; finalisation is registered with atexit.
void init_world(int* argc, char*** argv);
const World& world();
// True when MPI was initialised (more than one process).
bool mpi_active();

// Waiting on the other ranks (every MPI call, every NCCL wait) happens inside a PeerWait. Once set_peer_timeout
// has started the watchdog (several ranks only), a PeerWait that lasts longer than the timeout ends this process:
// a message naming the rank and `what` on stderr, exit status 1, which makes mpirun stop the other ranks. A dead
// peer is usually noticed sooner by the launcher; this catches the ones that hang (stopped, deadlocked, cut off),
// which MPI and NCCL calls would otherwise wait for forever.
class PeerWait {
 public:
  // min_timeout_s: a floor under the timeout for this wait (start-up waits, which include the other ranks' own
  // set-up, get kStartupTimeoutS).
  explicit PeerWait(const char* what, double min_timeout_s = 0);
  ~PeerWait();
  PeerWait(const PeerWait&) = delete;
  PeerWait& operator=(const PeerWait&) = delete;

 private:
  const char* outer_what_;
  long long outer_since_ns_;
  double outer_floor_s_;
};
void set_peer_timeout(double seconds);
constexpr double kStartupTimeoutS = 300;

// Sums `values` in place across all ranks.
void allreduce_sum(std::vector<double>& values);
// The sum over all ranks of each rank's `value`, added in rank order: the same bits on every rank and in every run.
double sum_in_rank_order(double value);
// Rank 0 receives every rank's `mine`, concatenated in rank order; the other ranks receive an empty vector.
std::vector<float> gather_to_root(const std::vector<float>& mine);
// Every rank passes its own text (a config, a version string); all must be equal, else every rank throws an Error
// that names `what` and the first rank that differs from rank 0.
void require_same_on_all_ranks(const std::string& what, const std::string& text);

}  // namespace hgrn
