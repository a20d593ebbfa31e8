// libember's side of oneDNN: libember_dnnl.so (cpu/dnnl/) links oneDNN and
// is opened on the first call that wants it, next to libember.so or in
// $EMBER_PLUGIN_DIR (core/backend/plugin.h). Without it (a build with
// EMBER_WITH_ONEDNN=OFF, or the file missing) available() is false and every
// chunk runs on Ember's own kernels.
#include "cpu/dnnl_matmul.h"

#include <dlfcn.h>

#include <mutex>
#include <string>
#include <vector>

#include "core/backend/plugin.h"
#include "core/util/log.h"
#include "core/util/status.h"
#include "cpu/cpu_features.h"
#include "cpu/dnnl/dnnl_plugin.h"

namespace ember::cpu::dnnl_mm {
namespace {

std::mutex& dirs_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::string>& extra_dirs() {
  static std::vector<std::string> d;
  return d;
}

const ember_dnnl_table_v1* open_table() {
#if EMBER_WITH_ONEDNN
  PluginSearch search;
  search.file_name = kDnnlPluginFile;
  search.entry_point = kDnnlPluginEntry;
  {
    std::lock_guard<std::mutex> lock(dirs_mutex());
    search.dirs = extra_dirs();
  }
  std::string searched;
  for (const std::string& path : plugin_candidates(search, &searched)) {
    dlerror();
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = dlerror();
      const std::string err = e ? e : "unknown dlopen error";
      if (path == search.file_name && err.rfind(path + ":", 0) == 0) break;  // not on the loader's path
      log(LogLevel::kWarn, "oneDNN: cannot load %s (%s); prefill GEMMs run on Ember's kernels", path.c_str(),
          err.c_str());
      return nullptr;
    }
    auto entry = reinterpret_cast<ember_dnnl_plugin_entry_fn>(dlsym(handle, search.entry_point.c_str()));
    const ember_dnnl_table_v1* t = entry ? entry() : nullptr;
    if (!t || t->abi_version != kDnnlPluginAbi || !t->matmul || !t->free_stream || !t->bf16_supported ||
        !t->cache_entries || !t->clear_cache) {
      log(LogLevel::kWarn, "oneDNN: %s is not a plugin built with this libember; prefill GEMMs run on Ember's kernels",
          path.c_str());
      dlclose(handle);
      return nullptr;
    }
    log(LogLevel::kInfo, "oneDNN: %s", path.c_str());
    return t;  // (never unloaded)
  }
  log(LogLevel::kWarn, "oneDNN: %s not found (searched: %s); prefill GEMMs run on Ember's kernels", kDnnlPluginFile,
      searched.c_str());
#endif
  return nullptr;
}

const ember_dnnl_table_v1* table() {
  static const ember_dnnl_table_v1* t = open_table();
  return t;
}

}  // namespace

void add_plugin_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(dirs_mutex());
  extra_dirs().push_back(dir);
}

bool available() { return table() != nullptr; }

struct StreamState {
  void* stream = nullptr;
  ~StreamState() {
    if (stream) table()->free_stream(stream);
  }
};

StreamHolder::StreamHolder() = default;
StreamHolder::~StreamHolder() = default;
StreamHolder::StreamHolder(StreamHolder&&) noexcept = default;
StreamHolder& StreamHolder::operator=(StreamHolder&&) noexcept = default;

void matmul(Precision p, int64_t M, int64_t N, int64_t K, const void* x, int64_t ldx, const void* w, float* y,
            int64_t ldy, StreamHolder& stream) {
  const ember_dnnl_table_v1* t = table();
  if (!t) fail(StatusCode::kInternal, "matmul: oneDNN is not available (libember_dnnl.so not loaded)");
  if (!stream.state) stream.state = std::make_unique<StreamState>();
  char err[512];
  err[0] = '\0';
  const int32_t rc =
      t->matmul(p == Precision::kBf16 ? 1 : 0, M, N, K, x, ldx, w, y, ldy, &stream.state->stream, err, sizeof err);
  err[sizeof err - 1] = '\0';
  if (rc != 0) fail(static_cast<StatusCode>(rc), err[0] ? std::string(err) : std::string("oneDNN matmul failed"));
}

bool bf16_supported() {
  const ember_dnnl_table_v1* t = table();
  return t && t->bf16_supported() != 0;
}

bool bf16_native() {
  const CpuFeatures& f = cpu_features();
  return (f.avx512bf16 && f.os_avx512) || f.amx_bf16;
}

size_t cache_entries() {
  const ember_dnnl_table_v1* t = table();
  return t ? t->cache_entries() : 0;
}

void clear_cache() {
  if (const ember_dnnl_table_v1* t = table()) t->clear_cache();
}

}  // namespace ember::cpu::dnnl_mm
