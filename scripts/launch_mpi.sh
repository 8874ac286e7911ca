#!/usr/bin/env bash
# launch_mpi.sh: examples of launching a data-parallel hgrn run (one process per device, MPI); HGRN=PATH picks
# the binary (default build/hgrn).
#   scripts/launch_mpi.sh local N CONFIG [--set ...]        one node, N processes
#   scripts/launch_mpi.sh hostfile FILE N CONFIG [--set ...] several nodes listed in an OpenMPI hostfile
#                                                           ("node1 slots=4" per line)
#   Slurm: srun --ntasks=N --ntasks-per-node=4 build/hgrn train --config CONFIG   (srun speaks the same MPI)
# Every rank must get the same config and overrides (hgrn checks and refuses otherwise). GPU ranks (one per GPU,
# chosen by the rank on its node) reduce gradients through NCCL, CPU ranks through MPI. NVLink multicast
# (NCCL_NVLS_ENABLE) is off unless you export it: some machines hang or fail with it on.
set -euo pipefail
cd "$(dirname "$0")/.."
hgrn=${HGRN:-build/hgrn}
root_flag=$([ "$(id -u)" -eq 0 ] && echo --allow-run-as-root || true)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
case "${1:-}" in
  local)
    n=$2; config=$3; shift 3
    exec mpirun $root_flag -np "$n" --bind-to none -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE \
      "$hgrn" train --config "$config" "$@" ;;
  hostfile)
    file=$2; n=$3; config=$4; shift 4
    exec mpirun $root_flag --hostfile "$file" -np "$n" --bind-to none -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE \
      "$hgrn" train --config "$config" "$@" ;;
  *)
    sed -n '2,11p' "$0" >&2
    exit 2 ;;
esac
