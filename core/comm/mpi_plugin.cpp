// The entry point of libember_mpi.so: the MPI communicator as a plugin, so
// that libember itself links no MPI library (communicator.h).
#include <cstdio>
#include <exception>

#include "core/comm/communicator.h"
#include "core/util/status.h"

namespace {

int32_t create(int32_t timeout_ms, ember::comm::Communicator** out, char* err, size_t err_size) {
  return ember::comm::create_guarded([&] { return ember::comm::mpi_communicator(timeout_ms).release(); }, out, err,
                                     err_size);
}

const ember_comm_plugin_v1 kTable = {ember::comm::kCommPluginAbi, ember::comm::comm_interface_fingerprint(), create};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ember_comm_plugin_v1* ember_mpi_plugin_v1() { return &kTable; }
