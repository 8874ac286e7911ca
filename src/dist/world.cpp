// world.cpp: the MPI side of world.h. Everything here is a no-op for a single process, so the same binary runs with
// and without mpirun. MPI_CHECK (dist/mpi_check.h) turns a failing MPI call into an Error naming the rank and call.
#include "dist/world.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <thread>
#include <vector>

#include "core/check.h"
#include "dist/mpi_check.h"

namespace hgrn {

namespace {
World the_world;
bool mpi_is_active = false;

// The launcher's own environment variables say how many processes it started (OpenMPI, MPICH/Hydra, Slurm/PMIx).
int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoi(v);
  }
  return 1;
}

#ifdef HGRN_WITH_MPI
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
// The PeerWait in progress (null: none) and since when, read by the watchdog thread.
std::atomic<const char*> waiting_on{nullptr};
std::atomic<long long> waiting_since_ns{0};
std::atomic<double> waiting_floor_s{0};
std::atomic<double> peer_timeout_s{0};

// The process ids of this node's other ranks, gathered at start-up.
std::vector<int> node_peer_pids;

// Ends this node's other ranks with SIGKILL, which also ends a rank stopped by SIGSTOP (a stopped process would not
// act on the launcher's SIGTERM, and a job that has given up on it must not leave it behind). Only processes still
// running this same executable are signalled, so a process id reused since start-up is left alone. Ranks on other
// nodes are the launcher's (mpirun, srun) to end: this one exits non-zero, which makes it end the job.
void kill_node_peers() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return;
  for (int pid : node_peer_pids) {
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
    if (!ec && exe == self) ::kill(pid, SIGKILL);
  }
}

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void watchdog() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const char* what = waiting_on.load();
    const double waited = static_cast<double>(now_ns() - waiting_since_ns.load()) * 1e-9;
    const double timeout = std::max(peer_timeout_s.load(), waiting_floor_s.load());
    if (what && waited > timeout) {
      std::fprintf(stderr,
                   "hgrn: error: rank %d of %d: %s has waited %.0f s for the other ranks (training.collective_timeout_s "
                   "= %g%s): another rank has probably died or stopped responding; stopping this rank (resume the run "
                   "from its last checkpoint)\n",
                   the_world.rank, the_world.size, what, waited, peer_timeout_s.load(),
                   timeout > peer_timeout_s.load() ? ", at least 300 during start-up" : "");
      std::fflush(stderr);
      kill_node_peers();
      _exit(1);  // the main thread is stuck inside MPI or NCCL: no orderly shutdown is possible
    }
  }
}
}  // namespace

PeerWait::PeerWait(const char* what, double min_timeout_s)
    : outer_what_(waiting_on.load()), outer_since_ns_(waiting_since_ns.load()), outer_floor_s_(waiting_floor_s.load()) {
  if (outer_what_) return;  // nested: the outer wait's clock and floor hold
  waiting_since_ns = now_ns();
  waiting_floor_s = min_timeout_s;
  waiting_on = what;
}

PeerWait::~PeerWait() {
  waiting_on = outer_what_;
  waiting_since_ns = outer_since_ns_;
  waiting_floor_s = outer_floor_s_;
}

void set_peer_timeout(double seconds) {
  HGRN_CHECK(seconds > 0, "the collective timeout must be positive, got ", seconds);
  const bool first = peer_timeout_s.exchange(seconds) == 0;
  if (first && mpi_is_active) std::thread(watchdog).detach();
}

void init_world(int* argc, char*** argv) {
  const int launched = launcher_world_size();
#ifdef HGRN_WITH_MPI
  if (launched > 1) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors become Errors naming the call
    mpi_is_active = true;
    std::atexit(finalize_mpi);
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &the_world.rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &the_world.size));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, the_world.rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &the_world.local_rank));
    MPI_CHECK(MPI_Comm_size(node, &the_world.local_size));
    const int my_pid = static_cast<int>(::getpid());
    std::vector<int> pids(static_cast<size_t>(the_world.local_size));
    MPI_CHECK(MPI_Allgather(&my_pid, 1, MPI_INT, pids.data(), 1, MPI_INT, node));
    for (int pid : pids)
      if (pid != my_pid) node_peer_pids.push_back(pid);
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
bool mpi_active() { return mpi_is_active; }

void allreduce_sum(std::vector<double>& values) {
  if (!mpi_is_active) return;
#ifdef HGRN_WITH_MPI
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                          MPI_COMM_WORLD));
#endif
}

double sum_in_rank_order(double value) {
  if (!mpi_is_active) return value;
  double total = 0;
#ifdef HGRN_WITH_MPI
  std::vector<double> all(static_cast<size_t>(the_world.size));
  MPI_CHECK(MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD));
  for (double v : all) total += v;
#endif
  return total;
}

std::vector<float> gather_to_root(const std::vector<float>& mine) {
  if (!mpi_is_active) return mine;
  std::vector<float> all;
#ifdef HGRN_WITH_MPI
  HGRN_CHECK(mine.size() <= static_cast<size_t>(INT32_MAX), "gather_to_root: ", mine.size(),
             " values are more than one MPI message can carry");
  const int count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(the_world.size)), offsets(counts.size());
  MPI_CHECK(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (the_world.is_root()) {
    int64_t total = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      HGRN_CHECK(total + counts[r] <= INT32_MAX, "gather_to_root: more than 2^31 values in all");
      offsets[r] = static_cast<int>(total);
      total += counts[r];
    }
    all.resize(static_cast<size_t>(total));
  }
  MPI_CHECK(MPI_Gatherv(mine.data(), count, MPI_FLOAT, all.data(), counts.data(), offsets.data(), MPI_FLOAT, 0,
                        MPI_COMM_WORLD));
#endif
  return all;
}

void require_same_on_all_ranks(const std::string& what, const std::string& text) {
  if (!mpi_is_active) return;
#ifdef HGRN_WITH_MPI
  PeerWait peer_wait("the start-up check that all ranks run the same binary and config", kStartupTimeoutS);
  const unsigned long long mine = fingerprint(text);
  std::vector<unsigned long long> all(static_cast<size_t>(the_world.size));
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD));
  for (int r = 1; r < the_world.size; ++r)
    HGRN_CHECK(all[r] == all[0], "rank ", r, " runs with another ", what, " than rank 0: every rank of a run must use "
               "the same binary and config (same file, same --set overrides)");
#endif
}

}  // namespace hgrn
