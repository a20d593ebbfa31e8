// Communication between the ranks of a model split across processes or
// devices (issue 31: tensor and pipeline parallelism). The engine talks to
// this interface only; implementations sit on existing libraries: MPI (Open
// MPI from Debian) for CPU ranks, NCCL for CUDA ranks (one GPU = one rank).
//
// Every collective is deterministic and gives every rank the same bits:
// all_reduce sums the ranks' vectors in rank order (rank 0 + rank 1 + ...,
// element by element), whatever the library's own reduction order would be,
// so that tensor-parallel ranks never diverge and a run repeats exactly.
//
// Faults: every call waits at most timeout_ms for its peers; a rank that died
// or hangs makes the call throw ember::Error(kTimeout) naming the operation
// and the ranks still missing where the library can tell. The job must then
// end (abort()): a collective left half done cannot be resumed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ember::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "mpi"

  // data[0..n) summed over the ranks in rank order, in place, on every rank.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // Rank r's `bytes` bytes land at out + r * bytes on every rank.
  virtual void all_gather(const void* in, size_t bytes, void* out) = 0;
  // root's `bytes` bytes at data on every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Point to point (pipeline stages); a send is matched by the recv of the
  // same tag on the peer.
  virtual void send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int peer, int tag) = 0;
  virtual void barrier() = 0;

  // Ends every rank of the job with `code` after a fault (never returns).
  [[noreturn]] virtual void abort(int code) = 0;
};

// The communicator of the MPI job this process runs in (MPI_COMM_WORLD;
// MPI_Init_thread is called if nobody did, MPI_Finalize at exit). Throws
// ember::Error(kUnsupported) in a build without MPI.
std::unique_ptr<Communicator> mpi_communicator(int timeout_ms);

// Whether this build has MPI.
bool mpi_available();

}  // namespace ember::comm
