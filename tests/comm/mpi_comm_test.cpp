// The MPI communicator (core/comm) across real processes: run under
//   mpiexec -n N mpi_comm_test [ops|hang|die|bench]
// ops: every operation's result on every rank, all_reduce's bits equal on
// every rank and equal to the rank-order sum, the same in a split's groups. hang: rank 1 stops answering;
// rank 0 must report the timeout and end the job. die: rank 1 exits without
// a word; the job must end with an error, not hang.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/util/status.h"

namespace {

int failures = 0;
void expect(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAIL: %s\n", rank, what.c_str());
    ++failures;
  }
}

int run_ops(ember::comm::Communicator& c) {
  const int r = c.rank(), n = c.size();
  // all_reduce: values whose float sum depends on the order.
  std::vector<float> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (r + 1) * 1e7f + static_cast<float>(i) * 0.37f + 0.1f * r;
  std::vector<float> want(v.size(), 0.0f);
  for (size_t i = 0; i < v.size(); ++i) {
    float s = 0.0f;
    for (int k = 0; k < n; ++k) {
      const float x = (k + 1) * 1e7f + static_cast<float>(i) * 0.37f + 0.1f * k;
      s = k == 0 ? x : s + x;
    }
    want[i] = s;
  }
  c.all_reduce_sum(v.data(), v.size());
  expect(std::memcmp(v.data(), want.data(), v.size() * sizeof(float)) == 0, "all_reduce_sum != rank-order sum", r);
  std::vector<float> every(v.size() * static_cast<size_t>(n));
  c.all_gather(v.data(), v.size() * sizeof(float), every.data());
  for (int k = 1; k < n; ++k) {
    expect(std::memcmp(every.data(), every.data() + static_cast<size_t>(k) * v.size(), v.size() * sizeof(float)) == 0,
           "all_reduce_sum bits differ between ranks", r);
  }
  // all_gather of ranks' ids.
  int32_t mine = 100 + r;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  c.all_gather(&mine, sizeof(mine), ids.data());
  for (int k = 0; k < n; ++k) expect(ids[static_cast<size_t>(k)] == 100 + k, "all_gather", r);
  // broadcast from the last rank.
  char text[24] = {};
  if (r == n - 1) std::snprintf(text, sizeof text, "from %d", r);
  c.broadcast(text, sizeof text, n - 1);
  expect(std::string(text) == "from " + std::to_string(n - 1), "broadcast", r);
  // A ring of send/recv (pipeline stages pass activations this way).
  if (n > 1) {
    double out = r * 2.5, in = -1;
    if (r % 2 == 0) {
      c.send(&out, sizeof out, (r + 1) % n, 7);
      c.recv(&in, sizeof in, (r + n - 1) % n, 7);
    } else {
      c.recv(&in, sizeof in, (r + n - 1) % n, 7);
      c.send(&out, sizeof out, (r + 1) % n, 7);
    }
    expect(in == ((r + n - 1) % n) * 2.5, "send/recv ring", r);
  }
  // A split: the ranks of one parity, numbered from the highest (key -r).
  {
    auto g = c.split(r % 2, -r);
    std::vector<int> members;
    for (int k = n - 1; k >= 0; --k)
      if (k % 2 == r % 2) members.push_back(k);
    const int gn = static_cast<int>(members.size());
    expect(g->size() == gn, "split: group size", r);
    expect(g->rank() < gn && members[static_cast<size_t>(g->rank())] == r, "split: rank in the group", r);
    std::vector<int32_t> world(static_cast<size_t>(gn));
    const int32_t me = r;
    g->all_gather(&me, sizeof me, world.data());
    for (int k = 0; k < gn; ++k)
      expect(world[static_cast<size_t>(k)] == members[static_cast<size_t>(k)], "split: all_gather", r);
    float sum = static_cast<float>(r);
    g->all_reduce_sum(&sum, 1);
    float want_sum = 0.0f;
    for (int k : members) want_sum += static_cast<float>(k);
    expect(sum == want_sum, "split: all_reduce_sum", r);
    if (gn > 1) {  // the group's first rank to its last, point to point
      int32_t token = g->rank() == 0 ? 4242 : -1;
      if (g->rank() == 0) g->send(&token, sizeof token, gn - 1, 3);
      if (g->rank() == gn - 1) {
        g->recv(&token, sizeof token, 0, 3);
        expect(token == 4242, "split: send/recv", r);
      }
    }
    g->barrier();
  }
  // Bad arguments are errors, not crashes.
  try {
    c.broadcast(text, sizeof text, n);
    expect(false, "broadcast from a rank that does not exist accepted", r);
  } catch (const ember::Error& e) {
    expect(e.code() == ember::StatusCode::kInvalidArgument, "broadcast to rank n: wrong error", r);
  }
  c.barrier();
  if (r == 0) std::printf("mpi_comm_test: %d ranks, %s\n", n, failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}

// bench: the time of one all_reduce_sum and one send/recv pair by size, for
// the performance model in docs/PARALLEL.md (latency and bandwidth of the
// ranks' link; here: shared memory between processes on one machine).
int run_bench(ember::comm::Communicator& c) {
  for (size_t floats :
       {size_t{1}, size_t{576}, size_t{640}, size_t{576 * 16}, size_t{4096}, size_t{4096 * 16}, size_t{1} << 20}) {
    std::vector<float> v(floats, 1.0f);
    const int reps = floats >= (size_t{1} << 20) ? 20 : 2000;
    c.barrier();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) c.all_reduce_sum(v.data(), v.size());
    const double ar = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
    c.barrier();
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {  // rank 0 <-> 1 ping-pong: a one-way send is half of it
      if (c.rank() == 0) {
        c.send(v.data(), floats * sizeof(float), 1, 7);
        c.recv(v.data(), floats * sizeof(float), 1, 8);
      } else if (c.rank() == 1) {
        c.recv(v.data(), floats * sizeof(float), 0, 7);
        c.send(v.data(), floats * sizeof(float), 0, 8);
      }
    }
    const double pp = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
    if (c.rank() == 0) {
      std::printf("mpi_comm_test: %d ranks, %8zu floats (%9zu bytes): all_reduce %9.2f us, send %9.2f us (%.2f GB/s)\n",
                  c.size(), floats, floats * sizeof(float), ar, pp / 2, floats * sizeof(float) / (pp / 2) / 1e3);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ops";
  try {
    auto c = ember::comm::mpi_communicator(mode == "ops" || mode == "bench" ? 30000 : 1500);
    if (mode == "ops") return run_ops(*c);
    if (mode == "bench") return run_bench(*c);
    if (c->rank() == 1) {
      if (mode == "die") std::_Exit(9);
      std::this_thread::sleep_for(std::chrono::seconds(60));  // hang
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c->barrier();
      std::fprintf(stderr, "rank %d: FAIL: the barrier passed without rank 1\n", c->rank());
      return 1;
    } catch (const ember::Error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "rank %d: %s (after %.2f s): ending the job\n", c->rank(), e.what(), s);
      c->abort(3);
    }
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "mpi_comm_test: %s\n", e.what());
    return 1;
  }
}
