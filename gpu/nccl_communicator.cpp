// The NCCL communicator (issue 31): CUDA ranks, one GPU each, in an MPI job.
// The plugin libember_nccl.so (built with the CUDA plugin where NCCL is
// found): MPI starts the ranks, carries NCCL's unique id and the host-memory
// messages (rank 0's commands, small agreements); NCCL carries what lives in
// device memory (the activations' all-reduces, the pipeline's hand-offs).
// Which path a call takes is decided by the pointer (cudaPointerGetAttributes).
//
// Timeouts: NCCL calls are enqueued on this communicator's stream and polled
// (cudaStreamQuery, ncclCommGetAsyncError) against the timeout; a rank that
// hangs or dies makes the call abort the NCCL communicator (ncclCommAbort)
// and throw ember::Error(kTimeout), as the MPI path does.
//
// Ordering with the backend: the CUDA backend runs its kernels on its own
// stream, unknown here, so a device call first waits for the device
// (cudaDeviceSynchronize) and returns once its NCCL work is done.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "core/comm/communicator.h"
#include "core/util/status.h"

namespace ember::comm {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(StatusCode::kInternal, std::string("nccl: ") + what + ": " + cudaGetErrorString(e));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> mpi, int timeout_ms) : mpi_(std::move(mpi)), timeout_ms_(timeout_ms) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      fail(StatusCode::kUnsupported, "nccl: no CUDA device on rank " + std::to_string(mpi_->rank()) +
                                         " (NCCL ranks need one GPU each; use the MPI communicator on CPUs)");
    }
    device_ = mpi_->local_rank() % devices;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id;
    if (mpi_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    mpi_->broadcast(&id, sizeof id, 0);
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_nccl(ncclCommInitRank(&comm_, mpi_->size(), id, mpi_->rank()), "ncclCommInitRank");
  }
  // A group of the parent's ranks (split): its MPI group and NCCL
  // communicator, the parent's device and broken flag.
  NcclCommunicator(std::unique_ptr<Communicator> mpi, ncclComm_t comm, int device, int timeout_ms,
                   std::shared_ptr<bool> broken)
      : mpi_(std::move(mpi)), timeout_ms_(timeout_ms), device_(device), comm_(comm), broken_(std::move(broken)) {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    if (comm_) *broken_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
    // After a fault MPI_Finalize would wait for the lost rank: the process
    // ends without it (mpirun then ends the job), as the MPI path does.
    if (*broken_) static_cast<void>(mpi_.release());
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    begin();
    std::unique_ptr<Communicator> mpi = mpi_->split(color, key);
    ncclComm_t sub = nullptr;
    check_nccl(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
    return std::make_unique<NcclCommunicator>(std::move(mpi), sub, device_, timeout_ms_, broken_);
  }

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  int local_rank() const override { return mpi_->local_rank(); }
  std::string name() const override { return "nccl"; }
  bool device_buffers() const override { return true; }

  // NCCL's sum (its ring or tree order): the same bits on every rank, the
  // same for every run of the same job.
  void all_reduce_sum(float* data, size_t n) override {
    if (!on_device(data)) return mpi_->all_reduce_sum(data, n);
    if (size() == 1 || n == 0) return;
    begin();
    check_nccl(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
    finish("all_reduce");
  }
  void all_gather(const void* in, size_t bytes, void* out) override {
    if (!on_device(in) || !on_device(out)) return mpi_->all_gather(in, bytes, out);
    begin();
    check_nccl(ncclAllGather(in, out, bytes, ncclInt8, comm_, stream_), "ncclAllGather");
    finish("all_gather");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (!on_device(data)) return mpi_->broadcast(data, bytes, root);
    begin();
    check_nccl(ncclBroadcast(data, data, bytes, ncclInt8, root, comm_, stream_), "ncclBroadcast");
    finish("broadcast");
  }
  void broadcast_untimed(void* data, size_t bytes, int root) override {
    mpi_->broadcast_untimed(data, bytes, root);  // (rank 0's commands: host memory)
  }
  void send(const void* data, size_t bytes, int peer, int tag) override {
    if (!on_device(data)) return mpi_->send(data, bytes, peer, tag);
    begin();
    check_nccl(ncclSend(data, bytes, ncclInt8, peer, comm_, stream_), "ncclSend");
    finish("send to rank " + std::to_string(peer));
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    if (!on_device(data)) return mpi_->recv(data, bytes, peer, tag);
    begin();
    check_nccl(ncclRecv(data, bytes, ncclInt8, peer, comm_, stream_), "ncclRecv");
    finish("recv from rank " + std::to_string(peer));
  }
  void barrier() override { mpi_->barrier(); }
  void set_timeout_ms(int timeout_ms) override {
    mpi_->set_timeout_ms(timeout_ms);
    timeout_ms_ = timeout_ms;
  }
  void finalize() override {
    if (comm_) {
      *broken_ ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
      comm_ = nullptr;
    }
    if (!*broken_) mpi_->finalize();
  }
  [[noreturn]] void abort(int code) override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    mpi_->abort(code);
    std::_Exit(code);  // (abort() never returns)
  }

 private:
  void check_nccl(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) {
      *broken_ = true;
      fail(StatusCode::kInternal, std::string("nccl: ") + what + ": " + ncclGetErrorString(r));
    }
  }
  static bool on_device(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // (a plain host pointer on old drivers)
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  void begin() {
    if (*broken_) fail(StatusCode::kInternal, "nccl: the communicator is broken by an earlier fault");
    if (!comm_) fail(StatusCode::kInternal, "nccl: the communicator is finalised");
    check_cuda(cudaDeviceSynchronize(), "waiting for the backend's work");
  }
  // Polls the stream until the enqueued NCCL work is done, an asynchronous
  // NCCL error shows, or the timeout passes (then the communicator aborts).
  void finish(const std::string& what) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, what.c_str());
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) check_nccl(async, what.c_str());
      if (Clock::now() - start > std::chrono::milliseconds(timeout_ms_)) {
        *broken_ = true;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        fail(StatusCode::kTimeout, "nccl: " + what + " on rank " + std::to_string(rank()) + " of " +
                                       std::to_string(size()) + ": no answer from the other ranks within " +
                                       std::to_string(timeout_ms_) + " ms (a rank died or hangs)");
      }
      if (Clock::now() - start > std::chrono::milliseconds(1))
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  std::unique_ptr<Communicator> mpi_;
  int timeout_ms_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  // A fault here or in a communicator split from this one (or the one this
  // was split from): the job cannot go on.
  std::shared_ptr<bool> broken_ = std::make_shared<bool>(false);
};

int32_t create(int32_t timeout_ms, Communicator** out, char* err, size_t err_size) {
  return create_guarded([&] { return new NcclCommunicator(mpi_communicator(timeout_ms), timeout_ms); }, out, err,
                        err_size);
}

const ember_comm_plugin_v1 kTable = {kCommPluginAbi, comm_interface_fingerprint(), create};

}  // namespace
}  // namespace ember::comm

extern "C" __attribute__((visibility("default"))) const ember_comm_plugin_v1* ember_nccl_plugin_v1() {
  return &ember::comm::kTable;
}
