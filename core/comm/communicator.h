// Communication between the ranks of a model split across processes or
// devices (issue 31: tensor and pipeline parallelism). The engine talks to
// this interface only; implementations sit on existing libraries: MPI (Open
// MPI from Debian) for CPU ranks, NCCL for CUDA ranks (one GPU = one rank).
//
// Every collective is deterministic and gives every rank the same bits:
// all_reduce sums the ranks' vectors in rank order (rank 0 + rank 1 + ...,
// element by element) on host memory, whatever the library's own reduction
// order would be, so that tensor-parallel ranks never diverge and a run
// repeats exactly; on device memory (NCCL) in NCCL's order, which is also the
// same on every rank and for every run of the same job.
//
// Faults: every call waits at most timeout_ms for its peers; a rank that died
// or hangs makes the call throw ember::Error(kTimeout) naming the operation
// and the ranks still missing where the library can tell. The job must then
// end (abort()): a collective left half done cannot be resumed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "core/util/status.h"

namespace ember::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's index among the ranks on its machine (which GPU it takes).
  virtual int local_rank() const = 0;
  // Whether device (GPU) pointers may be passed (NCCL); host pointers always
  // may.
  virtual bool device_buffers() const { return false; }
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
  // broadcast without the timeout: a rank waiting for its next piece of work
  // (a follower of rank 0, idle while no request comes) waits for as long as
  // it takes, polling slowly.
  virtual void broadcast_untimed(void* data, size_t bytes, int root) = 0;

  // How long a call waits for its peers (Error(kTimeout) after).
  virtual void set_timeout_ms(int timeout_ms) = 0;
  // Ends the library's part (MPI_Finalize, which waits for every rank's)
  // unless a call timed out; no call may follow. Also done by the destructor.
  virtual void finalize() = 0;
  // Ends every rank of the job with `code` after a fault (never returns).
  [[noreturn]] virtual void abort(int code) = 0;

  // The ranks that pass the same `color`, numbered by `key` (ties: by rank),
  // as a communicator of their own (MPI_Comm_split; NCCL: ncclCommSplit):
  // the tensor-parallel group of one pipeline stage. Called by every rank
  // of this communicator at once (it does not time out: call it after a
  // timed collective has shown every rank alive). Its calls time out as
  // this one's; abort() still ends the whole job; a fault in either marks
  // both broken.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// The communicator of the MPI job this process runs in (MPI_COMM_WORLD;
// MPI_Init_thread is called if nobody did, MPI_Finalize at exit). Throws
// ember::Error(kUnsupported) in a build without MPI. Defined in the MPI
// plugin (libember_mpi.so) and in the ember_comm module its tests link.
std::unique_ptr<Communicator> mpi_communicator(int timeout_ms);

// Whether this build has MPI.
bool mpi_available();

// libember links no MPI library: the MPI communicator lives in the plugin
// libember_mpi.so (built where Open MPI is found), loaded on first use from
// libember's directory, $EMBER_PLUGIN_DIR or the loader's path (as the CUDA
// plugin, core/backend/plugin.h). Throws ember::Error(kUnsupported) saying
// what is missing. One communicator per process, kept until exit (MPI cannot
// be initialised again once finalised): every call returns it, with
// `timeout_ms` set; finalize() runs at exit (atexit, after the split
// engines' stop: core/engine/parallel.cpp).
std::shared_ptr<Communicator> load_mpi_communicator(int timeout_ms);
// The same for "mpi" or "nccl" (libember_nccl.so: CUDA ranks, one GPU each,
// started by MPI; built with the CUDA plugin where NCCL is found). A process
// keeps the kind it first loaded.
std::shared_ptr<Communicator> load_communicator(const std::string& kind, int timeout_ms);

}  // namespace ember::comm

extern "C" {
// What libember_mpi.so's entry point returns (static storage).
typedef struct ember_comm_plugin_v1 {
  uint32_t abi_version;  // ember::comm::kCommPluginAbi
  uint32_t fingerprint;  // ember::comm::comm_interface_fingerprint()
  // Returns 0 and sets *out (owned by the caller), or an ember::StatusCode
  // value with a NUL-terminated message in err. Never throws.
  int32_t (*create)(int32_t timeout_ms, ember::comm::Communicator** out, char* err, size_t err_size);
} ember_comm_plugin_v1;
typedef const ember_comm_plugin_v1* (*ember_comm_plugin_entry_fn)(void);
}

namespace ember::comm {

inline constexpr const char* kMpiPluginEntry = "ember_mpi_plugin_v1";
inline constexpr const char* kMpiPluginFile = "libember_mpi.so";
inline constexpr const char* kNcclPluginEntry = "ember_nccl_plugin_v1";
inline constexpr const char* kNcclPluginFile = "libember_nccl.so";
inline constexpr uint32_t kCommPluginAbi = 2;  // 2: Communicator::split

// A plugin's create(): *out = make() (a Communicator*), or the error's
// status and message in err; never throws.
template <typename Make>
int32_t create_guarded(Make make, Communicator** out, char* err, size_t err_size) noexcept {
  try {
    *out = make();
    return 0;
  } catch (const Error& e) {
    std::snprintf(err, err_size, "%s", e.what());
    return static_cast<int32_t>(e.code());
  } catch (const std::exception& e) {
    std::snprintf(err, err_size, "%s", e.what());
  } catch (...) {
    std::snprintf(err, err_size, "unknown error");
  }
  return static_cast<int32_t>(StatusCode::kInternal);
}
// Guards against a plugin built with another C++ library or interface.
constexpr uint32_t comm_interface_fingerprint() {
  uint32_t h = 2166136261u;
  const uint32_t parts[] = {static_cast<uint32_t>(sizeof(std::string)), static_cast<uint32_t>(sizeof(void*)),
#ifdef __GLIBCXX__
                            static_cast<uint32_t>(_GLIBCXX_RELEASE),
#endif
                            static_cast<uint32_t>(sizeof(ember_comm_plugin_v1))};
  for (uint32_t p : parts) h = (h ^ p) * 16777619u;
  return h;
}

}  // namespace ember::comm
