#include "core/backend/registry.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "core/backend/plugin.h"
#include "core/util/log.h"

namespace ember {

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
struct Registered {
  BackendFactory factory = nullptr;
  BackendInfoFn info = nullptr;
};
std::map<std::string, Registered>& registry() {
  static std::map<std::string, Registered> r;
  return r;
}
bool is_plugin_device(const std::string& device) { return device == "cuda" || device.rfind("cuda:", 0) == 0; }

Registered find_registered(const std::string& name) {
  Registered found;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = registry().find(name);
    if (it != registry().end()) found = it->second;
  }
  if (!found.factory) {
    fail(StatusCode::kUnsupported, "backend '" + name + "' is not registered in this build");
  }
  return found;
}

std::unique_ptr<Backend> create_registered(const std::string& name, const BackendOptions& options) {
  return find_registered(name).factory(options);
}
}  // namespace

void register_backend(const std::string& name, BackendFactory factory, BackendInfoFn info) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = Registered{factory, info};
}

BackendInfo backend_info(const std::string& name) {
  const Registered r = find_registered(name);
  return r.info ? r.info() : BackendInfo{};
}

CreatedBackend create_backend(const std::string& requested, const BackendOptions& options) {
  // EMBER_FORCE_DEVICE: every engine of the process on one device, whatever
  // its parameters say (runs existing programs and test suites on a GPU).
  std::string device = requested;
  if (const char* forced = std::getenv("EMBER_FORCE_DEVICE"); forced && *forced && device != forced) {
    log(LogLevel::kInfo, "engine: EMBER_FORCE_DEVICE=%s replaces device '%s'", forced, requested.c_str());
    device = forced;
  }
  CreatedBackend out;
  if (device == "auto" || is_plugin_device(device)) {
    try {
      LoadedBackend lb = open_backend_plugin(device == "auto" ? "cuda" : device, options.n_threads);
      out.backend = std::move(lb.backend);
      out.extras = lb.extras;
      out.device = device == "auto" ? "cuda" : device;
      if (out.extras) out.extras->set_batch_invariant(options.batch_invariant);
      if (device == "auto") log(LogLevel::kInfo, "engine: running on %s", out.backend->name().c_str());
      return out;
    } catch (const Error& e) {
      if (device != "auto") throw;
      log(LogLevel::kInfo, "engine: %s; running on the CPU", e.what());
    }
    out.backend = create_registered("cpu", options);
    out.device = "cpu";
    return out;
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (!registry().count(device)) fail(StatusCode::kInvalidArgument, "unknown device '" + device + "'");
  }
  out.backend = create_registered(device, options);
  out.device = device;
  return out;
}

void check_backend_limits(const Backend& backend, int32_t head_dim, int32_t n_heads, int32_t n_kv_heads) {
  const BackendLimits lim = backend.limits();
  const int32_t group = n_kv_heads > 0 ? n_heads / n_kv_heads : 0;
  if (head_dim > lim.max_head_dim || group > lim.max_gqa_group || head_dim % lim.head_dim_multiple != 0) {
    fail(StatusCode::kUnsupported, "model: head_dim " + std::to_string(head_dim) + " / GQA group " +
                                       std::to_string(group) + " is outside what the " + backend.name() +
                                       " backend supports (head_dim <= " + std::to_string(lim.max_head_dim) +
                                       " and a multiple of " + std::to_string(lim.head_dim_multiple) +
                                       ", group <= " + std::to_string(lim.max_gqa_group) + ")");
  }
}

}  // namespace ember
