// mpi_check.h: MPI_CHECK, which turns a failing MPI call into an Error that names the rank and the call, and runs it
// inside a PeerWait (world.h), so that a call stuck on a hung peer ends the run after the collective timeout.
// Include only under HGRN_WITH_MPI; the C API alone (the deprecated C++ bindings would need their own library).
#pragma once
#ifdef HGRN_WITH_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <string>

#include "core/check.h"
#include "dist/world.h"

#define MPI_CHECK(call)                                                                                             \
  do {                                                                                                              \
    ::hgrn::PeerWait peer_wait_(#call);                                                                             \
    int rc_ = (call);                                                                                               \
    if (rc_ != MPI_SUCCESS) {                                                                                       \
      char msg_[MPI_MAX_ERROR_STRING];                                                                              \
      int len_ = 0;                                                                                                 \
      MPI_Error_string(rc_, msg_, &len_);                                                                           \
      throw ::hgrn::Error(::hgrn::detail::concat("MPI error on rank ", ::hgrn::world().rank, " in ", #call, ": ", \
                                                 std::string(msg_, len_), " [", __FILE__, ":", __LINE__, "]"));     \
    }                                                                                                               \
  } while (0)
#endif
