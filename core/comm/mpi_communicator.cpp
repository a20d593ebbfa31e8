#include "core/comm/communicator.h"

#include "core/util/status.h"

#if EMBER_WITH_MPI
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
#endif

namespace ember::comm {

#if EMBER_WITH_MPI

namespace {

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fail(StatusCode::kInternal, std::string("mpi: ") + what + ": " + std::string(msg, static_cast<size_t>(len)));
  }
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(int timeout_ms) : timeout_ms_(timeout_ms) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      owns_init_ = true;
    }
    // Errors come back as codes (thrown as ember::Error), never abort here.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The ranks sharing this machine, for local_rank().
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_rank(node, &local_rank_);
      MPI_Comm_free(&node);
    }
  }
  // A group of the parent's ranks (split): shares its timeout and its
  // broken flag, never finalizes MPI.
  MpiCommunicator(MPI_Comm comm, int timeout_ms, int local_rank, std::shared_ptr<bool> broken)
      : comm_(comm), group_(true), timeout_ms_(timeout_ms), local_rank_(local_rank), broken_(std::move(broken)) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override { finalize(); }

  void finalize() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (group_) {
      if (comm_ != MPI_COMM_NULL && !finalized && !*broken_) MPI_Comm_free(&comm_);
      return;
    }
    // After a fault the others may never reach MPI_Finalize (which waits for
    // them): the process then ends without it, and mpirun ends the job.
    if (owns_init_ && !finalized && !*broken_) MPI_Finalize();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) fail(StatusCode::kInvalidArgument, "mpi: split: color must be >= 0");
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "split");
    return std::make_unique<MpiCommunicator>(sub, timeout_ms_, local_rank_, broken_);
  }

  void set_timeout_ms(int timeout_ms) override {
    if (timeout_ms <= 0) fail(StatusCode::kInvalidArgument, "mpi: timeout_ms must be positive");
    timeout_ms_ = timeout_ms;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string name() const override { return "mpi"; }

  void all_reduce_sum(float* data, size_t n) override {
    if (size_ == 1 || n == 0) return;
    gathered_.resize(n * static_cast<size_t>(size_));
    all_gather(data, n * sizeof(float), gathered_.data());
    // Rank order: every rank adds the same values in the same order.
    std::memcpy(data, gathered_.data(), n * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      const float* part = gathered_.data() + static_cast<size_t>(r) * n;
      for (size_t i = 0; i < n; ++i) data[i] += part[i];
    }
  }

  void all_gather(const void* in, size_t bytes, void* out) override {
    MPI_Request req;
    check_mpi(MPI_Iallgather(in, count(bytes), MPI_BYTE, out, count(bytes), MPI_BYTE, comm_, &req), "all_gather");
    wait(req, "all_gather");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    check_rank(root, "broadcast");
    MPI_Request req;
    check_mpi(MPI_Ibcast(data, count(bytes), MPI_BYTE, root, comm_, &req), "broadcast");
    wait(req, "broadcast");
  }

  void send(const void* data, size_t bytes, int peer, int tag) override {
    check_rank(peer, "send");
    MPI_Request req;
    check_mpi(MPI_Isend(data, count(bytes), MPI_BYTE, peer, tag, comm_, &req), "send");
    wait(req, "send to rank " + std::to_string(peer));
  }

  void recv(void* data, size_t bytes, int peer, int tag) override {
    check_rank(peer, "recv");
    MPI_Request req;
    check_mpi(MPI_Irecv(data, count(bytes), MPI_BYTE, peer, tag, comm_, &req), "recv");
    wait(req, "recv from rank " + std::to_string(peer));
  }

  void broadcast_untimed(void* data, size_t bytes, int root) override {
    check_rank(root, "broadcast");
    MPI_Request req;
    check_mpi(MPI_Ibcast(data, count(bytes), MPI_BYTE, root, comm_, &req), "broadcast");
    wait(req, "broadcast", /*forever=*/true);
  }

  void barrier() override {
    MPI_Request req;
    check_mpi(MPI_Ibarrier(comm_, &req), "barrier");
    wait(req, "barrier");
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  static int count(size_t bytes) {
    if (bytes > static_cast<size_t>(INT32_MAX)) fail(StatusCode::kInvalidArgument, "mpi: message above 2 GiB");
    return static_cast<int>(bytes);
  }
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size_)
      fail(StatusCode::kInvalidArgument, std::string("mpi: ") + what + ": no rank " + std::to_string(r));
  }
  // Polls the request until done or timeout_ms passed (then kTimeout: the
  // peer died or hangs). Sleeps between polls once the first millisecond is
  // gone, so a waiting rank does not hold a core.
  void wait(MPI_Request& req, const std::string& what, bool forever = false) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::milliseconds(timeout_ms_);
    for (int polls = 0;; ++polls) {
      int done = 0;
      check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what.c_str());
      if (done) return;
      const auto now = Clock::now();
      if (forever) {
        // Idle: from 50 us to 1 ms between polls.
        std::this_thread::sleep_for(std::chrono::microseconds(now - start > std::chrono::milliseconds(20) ? 1000 : 50));
        continue;
      }
      if (now > deadline) {
        *broken_ = true;
        fail(StatusCode::kTimeout, "mpi: " + what + " on rank " + std::to_string(rank_) + " of " +
                                       std::to_string(size_) + ": no answer from the other ranks within " +
                                       std::to_string(timeout_ms_) + " ms (a rank died or hangs)");
      }
      if (now - start > std::chrono::milliseconds(1)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  MPI_Comm comm_ = MPI_COMM_WORLD;
  bool group_ = false;  // split from another communicator
  int timeout_ms_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool owns_init_ = false;
  // A call timed out (here or in a communicator split from this one, or
  // the one this was split from): the job cannot go on.
  std::shared_ptr<bool> broken_ = std::make_shared<bool>(false);
  std::vector<float> gathered_;
};

}  // namespace

std::unique_ptr<Communicator> mpi_communicator(int timeout_ms) {
  if (timeout_ms <= 0) fail(StatusCode::kInvalidArgument, "mpi: timeout_ms must be positive");
  return std::make_unique<MpiCommunicator>(timeout_ms);
}
bool mpi_available() { return true; }

#else

std::unique_ptr<Communicator> mpi_communicator(int) {
  fail(StatusCode::kUnsupported, "this build has no MPI (Debian: libopenmpi-dev, then reconfigure)");
}
bool mpi_available() { return false; }

#endif

}  // namespace ember::comm
