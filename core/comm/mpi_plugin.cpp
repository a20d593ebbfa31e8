// The entry point of libember_mpi.so: the MPI communicator as a plugin, so
// that libember itself links no MPI library (communicator.h).
#include <cstdio>
#include <exception>

#include "core/comm/communicator.h"
#include "core/util/status.h"

namespace {

int32_t create(int32_t timeout_ms, ember::comm::Communicator** out, char* err, size_t err_size) {
  try {
    *out = ember::comm::mpi_communicator(timeout_ms).release();
    return 0;
  } catch (const ember::Error& e) {
    std::snprintf(err, err_size, "%s", e.what());
    return static_cast<int32_t>(e.code());
  } catch (const std::exception& e) {
    std::snprintf(err, err_size, "%s", e.what());
  } catch (...) {
    std::snprintf(err, err_size, "unknown error");
  }
  return static_cast<int32_t>(ember::StatusCode::kInternal);
}

const ember_comm_plugin_v1 kTable = {ember::comm::kCommPluginAbi, ember::comm::comm_interface_fingerprint(), create};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ember_comm_plugin_v1* ember_mpi_plugin_v1() { return &kTable; }
