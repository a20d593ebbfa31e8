// Loading the MPI communicator plugin (core/comm/communicator.h): libember
// links no MPI library; libember_mpi.so does, and is opened on first use.
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/backend/plugin.h"
#include "core/comm/communicator.h"
#include "core/util/log.h"
#include "core/util/status.h"

namespace ember::comm {

namespace {

[[noreturn]] void unavailable(const std::string& why) {
  fail(StatusCode::kUnsupported, "model parallel over MPI is not available: " + why);
}

// (Called under shared_mutex(); a process loads one kind.)
const ember_comm_plugin_v1* open_table(const std::string& kind, std::string* where) {
  PluginSearch search;
  search.file_name = kind == "nccl" ? kNcclPluginFile : kMpiPluginFile;
  search.entry_point = kind == "nccl" ? kNcclPluginEntry : kMpiPluginEntry;
  std::string searched, errors;
  for (const std::string& path : plugin_candidates(search, &searched)) {
    dlerror();
    // RTLD_GLOBAL: Open MPI opens its own components, which need libmpi's
    // symbols visible.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!handle) {
      const char* e = dlerror();
      const std::string err = e ? e : "unknown dlopen error";
      if (path == search.file_name && err.rfind(path + ":", 0) == 0) break;  // not on the loader's path
      unavailable("cannot load " + path + ": " + err);
    }
    auto entry = reinterpret_cast<ember_comm_plugin_entry_fn>(dlsym(handle, search.entry_point.c_str()));
    const ember_comm_plugin_v1* t = entry ? entry() : nullptr;
    if (!t || t->abi_version != kCommPluginAbi || t->fingerprint != comm_interface_fingerprint() || !t->create) {
      unavailable(path + " is not a communicator plugin built with this libember; rebuild it from the same tree");
    }
    *where = path;  // (never unloaded)
    return t;
  }
  unavailable(search.file_name + " was not found (searched: " + searched + "). " +
              (kind == "nccl" ? "Build Ember where the CUDA toolkit, NCCL and Open MPI are installed"
                              : "Build Ember where Open MPI is installed (Debian: libopenmpi-dev)") +
              " and keep the plugin next to libember.so, or point EMBER_PLUGIN_DIR at it");
}

std::mutex& shared_mutex() {
  static std::mutex m;
  return m;
}
std::shared_ptr<Communicator>& shared_communicator() {
  static std::shared_ptr<Communicator> shared;
  return shared;
}

}  // namespace

std::shared_ptr<Communicator> load_mpi_communicator(int timeout_ms) { return load_communicator("mpi", timeout_ms); }

std::shared_ptr<Communicator> load_communicator(const std::string& kind, int timeout_ms) {
  if (kind != "mpi" && kind != "nccl") {
    fail(StatusCode::kInvalidArgument, "model parallel: unknown communicator '" + kind + "' (mpi or nccl)");
  }
  if (timeout_ms <= 0) fail(StatusCode::kInvalidArgument, "model parallel: the timeout must be positive");
  std::lock_guard<std::mutex> lock(shared_mutex());
  std::shared_ptr<Communicator>& shared = shared_communicator();  // (until exit: MPI_Finalize then)
  if (shared) {
    if (shared->name() != kind) {
      fail(StatusCode::kInvalidArgument,
           "model parallel: this process already uses the " + shared->name() + " communicator (one kind per process)");
    }
    shared->set_timeout_ms(timeout_ms);
    return shared;
  }
  std::string where;
  const ember_comm_plugin_v1* t = open_table(kind, &where);
  Communicator* c = nullptr;
  char err[1024];
  err[0] = '\0';
  const int32_t rc = t->create(timeout_ms, &c, err, sizeof err);
  err[sizeof err - 1] = '\0';
  if (rc != 0 || !c) {
    fail(rc > 0 ? static_cast<StatusCode>(rc) : StatusCode::kInternal,
         err[0] ? std::string(err) : kind + ": the plugin could not create a communicator");
  }
  log(LogLevel::kInfo, "model parallel: rank %d of %d over %s (%s)", c->rank(), c->size(), kind.c_str(), where.c_str());
  shared.reset(c);
  // At exit, after the handlers registered later (a split engine still alive
  // stops its followers first): MPI_Finalize, which every rank must reach.
  std::atexit([] {
    std::lock_guard<std::mutex> l(shared_mutex());
    try {
      if (shared_communicator()) shared_communicator()->finalize();
    } catch (...) {}
  });
  return shared;
}

}  // namespace ember::comm
