// Run-time loading of backend plugins (see plugin.h).
#include "core/backend/plugin.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/util/log.h"
#include "core/util/status.h"

namespace ember {
namespace {

[[noreturn]] void unsupported(const std::string& device, const std::string& why) {
  fail(StatusCode::kUnsupported, "device '" + device + "' is not available: " + why);
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// The directory of the object holding this code: libember.so, or the
// executable when the core is linked statically.
std::string self_dir() {
  Dl_info info;
  std::memset(&info, 0, sizeof(info));
  if (dladdr(reinterpret_cast<void*>(&self_dir), &info) == 0 || info.dli_fname == nullptr) return {};
  return dir_of(info.dli_fname);
}

std::vector<std::string> split_path_list(const char* s) {
  std::vector<std::string> out;
  if (!s) return out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ':' || *p == '\0') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur.push_back(*p);
    }
  }
  return out;
}

// Loads are serialised: dlopen is thread-safe, but the plugin's static
// initialisers (the CUDA runtime's) are best run once at a time.
std::mutex& load_mutex() {
  static std::mutex m;
  return m;
}

// The plugin's interface table after the checks every use needs (entry
// point, ABI version, fingerprint); nullptr with *why set otherwise.
const ember_backend_plugin_v1* plugin_table(void* handle, const std::string& where, const std::string& entry_point,
                                            std::string* why) {
  dlerror();
  void* sym = dlsym(handle, entry_point.c_str());
  if (sym == nullptr) {
    *why = "the plugin " + where + " does not export the entry point '" + entry_point +
           "' (not an Ember backend plugin, or one built for another Ember version)";
    return nullptr;
  }
  const ember_backend_plugin_v1* table = reinterpret_cast<ember_backend_plugin_entry_fn>(sym)();
  if (table == nullptr) {
    *why = "the plugin " + where + " returned no interface table";
    return nullptr;
  }
  if (table->abi_version != kBackendPluginAbi) {
    *why = "the plugin " + where + " has backend ABI version " + std::to_string(table->abi_version) +
           " but this libember needs version " + std::to_string(kBackendPluginAbi) +
           "; install the plugin built with this libember";
    return nullptr;
  }
  if (table->fingerprint != backend_interface_fingerprint()) {
    *why = "the plugin " + where +
           " was built from different interface headers or with a different C++ library "
           "(fingerprint mismatch); rebuild it with this libember";
    return nullptr;
  }
  return table;
}

LoadedBackend create_from_handle(void* handle, const std::string& where, const std::string& device, int n_threads,
                                 const std::string& entry_point) {
  std::string why;
  const ember_backend_plugin_v1* table = plugin_table(handle, where, entry_point, &why);
  if (table == nullptr) {
    dlclose(handle);
    unsupported(device, why);
  }
  if (table->create == nullptr) {
    dlclose(handle);
    unsupported(device, "the plugin " + where + " has no factory");
  }
  Backend* backend = nullptr;
  BackendExtras* extras = nullptr;
  char err[1024];
  err[0] = '\0';
  const int32_t rc = table->create(device.c_str(), n_threads, &backend, &extras, err, sizeof(err));
  err[sizeof(err) - 1] = '\0';
  if (rc != 0 || backend == nullptr) {
    // The handle stays open: the plugin may have started its runtime.
    std::string msg = err[0] ? std::string(err) : std::string("the plugin's factory failed without a message");
    StatusCode code = StatusCode::kUnsupported;
    if (rc == static_cast<int32_t>(StatusCode::kInvalidArgument) ||
        rc == static_cast<int32_t>(StatusCode::kOutOfMemory)) {
      code = static_cast<StatusCode>(rc);
      fail(code, "device '" + device + "': " + msg);
    }
    unsupported(device, msg);
  }
  LoadedBackend out;
  out.backend.reset(backend);
  out.extras = extras;
  out.library = where;
  out.build_info = table->build_info ? table->build_info : "";
  log(LogLevel::kInfo, "device '%s': backend %s from %s (%s)", device.c_str(), out.backend->name().c_str(),
      where.c_str(), out.build_info.c_str());
  return out;
}

}  // namespace

void check_plugin_device_name(const std::string& device) {
  if (device == "cuda") return;
  if (device.rfind("cuda:", 0) == 0) {
    const std::string idx = device.substr(5);
    if (idx.empty() || idx.size() > 4 || idx.find_first_not_of("0123456789") != std::string::npos) {
      fail(StatusCode::kInvalidArgument, "device '" + device + "': expected 'cuda' or 'cuda:N' (N a device index)");
    }
    return;
  }
  fail(StatusCode::kUnsupported, "device '" + device + "' is not supported (known devices: cpu, cuda, cuda:N)");
}

LoadedBackend open_backend_plugin_file(const std::string& path, const std::string& device, int n_threads,
                                       const std::string& entry_point) {
  check_plugin_device_name(device);
  std::lock_guard<std::mutex> lock(load_mutex());
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    unsupported(device, "cannot load the plugin " + path + ": " + (e ? e : "unknown dlopen error"));
  }
  return create_from_handle(handle, path, device, n_threads, entry_point);
}

std::vector<std::string> plugin_candidates(const PluginSearch& search, std::string* searched) {
  std::vector<std::string> dirs = search.dirs, out;
  auto note = [&](const std::string& s) {
    if (!searched->empty()) *searched += ", ";
    *searched += s;
  };
  if (search.next_to_libember) {
    const std::string d = self_dir();
    if (!d.empty()) dirs.push_back(d);
  }
  if (search.env_dir) {
    const char* env = std::getenv("EMBER_PLUGIN_DIR");
    for (auto& d : split_path_list(env)) dirs.push_back(d);
    if (!env || !*env) note("$EMBER_PLUGIN_DIR (unset)");
  }
  for (const auto& d : dirs) {
    const std::string path = d + "/" + search.file_name;
    note(d);
    if (file_exists(path)) out.push_back(path);
  }
  if (search.default_path) {
    note("the dynamic loader's search path");
    out.push_back(search.file_name);
  }
  return out;
}

LoadedBackend open_backend_plugin(const std::string& device, int n_threads, const PluginSearch& search) {
  check_plugin_device_name(device);
  std::string searched;
  const std::vector<std::string> paths = plugin_candidates(search, &searched);
  if (!paths.empty() && paths.front() != search.file_name) {
    return open_backend_plugin_file(paths.front(), device, n_threads, search.entry_point);
  }
  if (search.default_path) {
    std::lock_guard<std::mutex> lock(load_mutex());
    dlerror();
    void* handle = dlopen(search.file_name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) return create_from_handle(handle, search.file_name, device, n_threads, search.entry_point);
    const char* e = dlerror();
    const std::string err = e ? e : "";
    // "libember_cuda.so: cannot open shared object file" means absent; an
    // error naming another file (e.g. libcublas.so.13) means it was found
    // but a dependency is missing.
    if (!err.empty() && err.rfind(search.file_name + ":", 0) != 0) {
      unsupported(device, "cannot load the plugin " + search.file_name + ": " + err);
    }
  }
  unsupported(device, search.file_name + " was not found (searched: " + searched +
                          "). Build Ember with -DEMBER_WITH_CUDA=ON on a machine with the CUDA toolkit and keep "
                          "the plugin next to libember.so, or point EMBER_PLUGIN_DIR at it");
}

PluginProbe probe_backend_plugin(const PluginSearch& search) {
  PluginProbe r;
  std::vector<std::string> dirs = search.dirs;
  if (search.next_to_libember) {
    const std::string d = self_dir();
    if (!d.empty()) dirs.push_back(d);
  }
  if (search.env_dir) {
    for (auto& d : split_path_list(std::getenv("EMBER_PLUGIN_DIR"))) dirs.push_back(d);
  }
  for (const auto& d : dirs) {
    if (file_exists(d + "/" + search.file_name)) {
      r.path = d + "/" + search.file_name;
      break;
    }
  }
  std::lock_guard<std::mutex> lock(load_mutex());
  dlerror();
  void* handle = nullptr;
  if (!r.path.empty()) {
    handle = dlopen(r.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  } else if (search.default_path) {
    handle = dlopen(search.file_name.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* e = handle ? nullptr : dlerror();
    const std::string err = e ? e : "";
    if (!handle && (err.empty() || err.rfind(search.file_name + ":", 0) == 0)) {
      r.message = search.file_name + " not found next to libember.so, in $EMBER_PLUGIN_DIR or on the loader's path";
      return r;
    }
    r.path = search.file_name;
    if (!handle) {
      r.state = PluginProbe::State::kBroken;
      r.message = "cannot load " + r.path + ": " + err;
      return r;
    }
  } else {
    r.message = search.file_name + " not found";
    return r;
  }
  if (!handle) {
    const char* e = dlerror();
    r.state = PluginProbe::State::kBroken;
    r.message = "cannot load " + r.path + ": " + (e ? e : "unknown dlopen error");
    return r;
  }
  // Never unloaded, like a plugin an engine opens.
  if (!plugin_table(handle, r.path, search.entry_point, &r.message)) {
    r.state = PluginProbe::State::kBroken;
    return r;
  }
  r.state = PluginProbe::State::kLoadable;
  return r;
}

std::unique_ptr<Backend> load_backend_plugin(const std::string& device, int n_threads) {
  return open_backend_plugin(device, n_threads).backend;
}

}  // namespace ember
