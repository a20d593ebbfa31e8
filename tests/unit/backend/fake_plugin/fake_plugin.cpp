// A fake backend plugin for plugin_test.cpp, built once per failure mode
// (EMBER_FAKE_<MODE>): OK (a working "fake" backend whose methods throw
// ember::Error across the library boundary), BADABI (wrong ABI version),
// BADPRINT (wrong interface fingerprint), NOENTRY (no entry point),
// NODEVICE (the factory reports that no GPU is present), MISSINGDEP (links a
// library the loader cannot find, so dlopen itself fails).
#include <cstring>
#include <memory>
#include <string>

#include "core/backend/backend.h"
#include "core/backend/plugin.h"
#include "core/util/status.h"

namespace {

class FakeBackend final : public ember::Backend {
 public:
  std::string name() const override { return "fake/ok"; }
  void* alloc(size_t bytes) override {
    throw ember::Error(ember::StatusCode::kOutOfMemory, "fake: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  void free_buffer(void*) override {}
  void upload(void*, const void*, size_t) override {}
  void download(void*, const void*, size_t) override {}
  std::unique_ptr<ember::DeviceWeight> upload_weight(const ember::WeightDesc&) override {
    ember::fail(ember::StatusCode::kUnsupported, "fake: no weights");
  }
  void kv_init(const ember::KvGeometry&) override {}
  void kv_copy_blocks(const int32_t*, const int32_t*, int32_t) override {}
  void embed(const ember::DeviceWeight&, const int32_t*, int32_t, float*) override {}
  void rms_norm(const float*, const ember::DeviceWeight&, int32_t, int32_t, float, float*) override {}
  void matmul(const ember::DeviceWeight&, const float*, int32_t, float*, bool) override {}
  void rope(float*, const int32_t*, int32_t, int32_t, int32_t, int32_t, float) override {}
  void kv_store(int32_t, const float*, const float*, const int32_t*, int32_t) override {}
  void attention(int32_t, const float*, const ember::AttentionSeq*, int32_t, const ember::AttentionParams&,
                 float*) override {}
  void swiglu(const float*, const float*, size_t, float*) override {}
  void add(float*, const float*, size_t) override {}
  void gather_rows(const float*, const int32_t*, int32_t, int32_t, float*) override {}
};

void write(char* err, size_t size, const char* msg) {
  if (!err || !size) return;
  std::strncpy(err, msg, size - 1);
  err[size - 1] = '\0';
}

int32_t create(const char* device, int32_t, ember::Backend** out, ember::BackendExtras** extras, char* err,
               size_t err_size) noexcept {
  *out = nullptr;
  if (extras) *extras = nullptr;
#if defined(EMBER_FAKE_NODEVICE)
  (void)device;
  write(err, err_size, "no CUDA-capable GPU is present (fake)");
  return static_cast<int32_t>(ember::StatusCode::kUnsupported);
#else
  if (std::strcmp(device, "cuda:7") == 0) {
    write(err, err_size, "device cuda:7 requested but 1 CUDA device(s) present");
    return static_cast<int32_t>(ember::StatusCode::kUnsupported);
  }
  *out = new FakeBackend();
  return 0;
#endif
}

#if defined(EMBER_FAKE_MISSINGDEP)
extern "C" int ember_fake_dep_value();
#endif

}  // namespace

#if defined(EMBER_FAKE_NOENTRY)
#define ENTRY_NAME ember_some_other_entry
#else
#define ENTRY_NAME ember_cuda_plugin_v1
#endif

extern "C" __attribute__((visibility("default"))) const ember_backend_plugin_v1* ENTRY_NAME(void) {
#if defined(EMBER_FAKE_MISSINGDEP)
  static const int dep = ember_fake_dep_value();
  (void)dep;
#endif
  static const ember_backend_plugin_v1 table = {
#if defined(EMBER_FAKE_BADABI)
    ember::kBackendPluginAbi + 41,
#else
    ember::kBackendPluginAbi,
#endif
#if defined(EMBER_FAKE_BADPRINT)
    ember::backend_interface_fingerprint() ^ 0x5A5A5A5Au,
#else
    ember::backend_interface_fingerprint(),
#endif
    "fake",
    "fake plugin for tests",
    &create,
  };
  return &table;
}
