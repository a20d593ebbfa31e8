// The backend plugin loader (core/backend/plugin.h): every way of not having
// a usable plugin becomes ember::Error(kUnsupported) with a message naming
// the problem; a good plugin gives a working Backend whose exceptions cross
// the library boundary as ember::Error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/backend/plugin.h"
#include "core/backend/registry.h"
#include "core/util/status.h"
#include "cpu/cpu_backend.h"

namespace ember {
namespace {

std::string fake(const char* mode) {
  return std::string(EMBER_FAKE_PLUGIN_DIR) + "/libember_fake_plugin_" + mode + ".so";
}

// Runs f, expects ember::Error with `code`; returns its message.
template <class F>
std::string error_of(F&& f, StatusCode code = StatusCode::kUnsupported) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

class EnvGuard {
 public:
  explicit EnvGuard(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) {
      had_ = true;
      old_ = v;
    }
  }
  ~EnvGuard() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// EMBER_FORCE_DEVICE replaces whatever device an engine asks for (how
// tools/gpu_check.sh runs the unmodified suites on a GPU).
TEST(Plugin, ForceDeviceReplacesTheRequestedDevice) {
  register_cpu_backend();
  EnvGuard guard("EMBER_FORCE_DEVICE");
  setenv("EMBER_FORCE_DEVICE", "cpu", 1);
  CreatedBackend b = create_backend("cuda:3", BackendOptions{1, true});
  EXPECT_EQ(b.device, "cpu");
  ASSERT_NE(b.backend, nullptr);
  EXPECT_EQ(b.extras, nullptr);
  setenv("EMBER_FORCE_DEVICE", "tpu", 1);
  const std::string msg = error_of([] { create_backend("cpu", BackendOptions{}); }, StatusCode::kInvalidArgument);
  EXPECT_NE(msg.find("unknown device 'tpu'"), std::string::npos) << msg;
  unsetenv("EMBER_FORCE_DEVICE");
  EXPECT_EQ(create_backend("cpu", BackendOptions{1, true}).device, "cpu");
}

TEST(Plugin, DeviceNames) {
  EXPECT_NO_THROW(check_plugin_device_name("cuda"));
  EXPECT_NO_THROW(check_plugin_device_name("cuda:0"));
  EXPECT_NO_THROW(check_plugin_device_name("cuda:12"));
  EXPECT_NE(error_of([] { check_plugin_device_name("cuda:x"); }, StatusCode::kInvalidArgument).find("cuda:N"),
            std::string::npos);
  error_of([] { check_plugin_device_name("cuda:"); }, StatusCode::kInvalidArgument);
  EXPECT_NE(error_of([] { check_plugin_device_name("tpu"); }).find("not supported"), std::string::npos);
  error_of([] { check_plugin_device_name(""); });
  // The device name is checked before anything is loaded.
  error_of([] { load_backend_plugin("metal", 0); });
}

TEST(Plugin, AbsentPluginIsUnsupportedWithTheSearchedPlaces) {
  PluginSearch s;
  s.file_name = "libember_no_such_plugin.so";
  s.dirs = {"/nonexistent/ember-plugins"};
  s.next_to_libember = false;
  s.env_dir = false;
  const std::string msg = error_of([&] { open_backend_plugin("cuda", 0, s); });
  EXPECT_NE(msg.find("device 'cuda' is not available"), std::string::npos) << msg;
  EXPECT_NE(msg.find("libember_no_such_plugin.so was not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/nonexistent/ember-plugins"), std::string::npos) << msg;
  EXPECT_NE(msg.find("EMBER_WITH_CUDA"), std::string::npos) << msg;
}

TEST(Plugin, PublicLoaderWithoutPluginOrGpuIsUnsupported) {
  EnvGuard guard("EMBER_PLUGIN_DIR");
  setenv("EMBER_PLUGIN_DIR", "/nonexistent/ember-plugins", 1);
  try {
    auto b = load_backend_plugin("cuda", 0);
    // Only where a real plugin is installed and a GPU is present.
    ASSERT_TRUE(b != nullptr);
    EXPECT_EQ(b->name().rfind("cuda/", 0), 0u) << b->name();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("device 'cuda'"), std::string::npos) << e.what();
  }
}

TEST(Plugin, FileThatDoesNotExist) {
  const std::string msg = error_of([] { open_backend_plugin_file("/nonexistent/libember_cuda.so", "cuda", 0); });
  EXPECT_NE(msg.find("cannot load the plugin /nonexistent/libember_cuda.so"), std::string::npos) << msg;
}

TEST(Plugin, WrongAbiVersion) {
  const std::string msg = error_of([] { open_backend_plugin_file(fake("badabi"), "cuda", 0); });
  EXPECT_NE(msg.find("backend ABI version " + std::to_string(kBackendPluginAbi + 41)), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs version " + std::to_string(kBackendPluginAbi)), std::string::npos) << msg;
}

TEST(Plugin, WrongFingerprint) {
  const std::string msg = error_of([] { open_backend_plugin_file(fake("badprint"), "cuda", 0); });
  EXPECT_NE(msg.find("fingerprint mismatch"), std::string::npos) << msg;
}

TEST(Plugin, MissingEntryPoint) {
  const std::string msg = error_of([] { open_backend_plugin_file(fake("noentry"), "cuda", 0); });
  EXPECT_NE(msg.find("does not export the entry point 'ember_cuda_plugin_v1'"), std::string::npos) << msg;
}

TEST(Plugin, MissingDependencyNamesTheDependency) {
  const std::string msg = error_of([] { open_backend_plugin_file(fake("missingdep"), "cuda", 0); });
  EXPECT_NE(msg.find("libember_fake_dep.so"), std::string::npos) << msg;
  // Found through a search directory: the search stops with the load error.
  PluginSearch s;
  s.file_name = "libember_fake_plugin_missingdep.so";
  s.dirs = {EMBER_FAKE_PLUGIN_DIR};
  s.next_to_libember = s.env_dir = s.default_path = false;
  const std::string msg2 = error_of([&] { open_backend_plugin("cuda", 0, s); });
  EXPECT_NE(msg2.find("libember_fake_dep.so"), std::string::npos) << msg2;
}

TEST(Plugin, NoDeviceIsUnsupportedWithThePluginsMessage) {
  const std::string msg = error_of([] { open_backend_plugin_file(fake("nodevice"), "cuda", 0); });
  EXPECT_NE(msg.find("no CUDA-capable GPU is present (fake)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("device 'cuda' is not available"), std::string::npos) << msg;
}

TEST(Plugin, DeviceIndexOutOfRange) {
  const std::string msg = error_of([] { open_backend_plugin_file(fake("ok"), "cuda:7", 0); });
  EXPECT_NE(msg.find("cuda:7 requested"), std::string::npos) << msg;
}

TEST(Plugin, WorkingPluginAndErrorsAcrossTheBoundary) {
  LoadedBackend lb = open_backend_plugin_file(fake("ok"), "cuda", 0);
  ASSERT_TRUE(lb.backend != nullptr);
  EXPECT_EQ(lb.backend->name(), "fake/ok");
  EXPECT_EQ(lb.extras, nullptr);
  EXPECT_EQ(lb.build_info, "fake plugin for tests");
  // An ember::Error thrown inside the plugin is caught here by type.
  const std::string msg = error_of([&] { lb.backend->alloc(123); }, StatusCode::kOutOfMemory);
  EXPECT_EQ(msg, "fake: cannot allocate 123 bytes");
  error_of([&] { lb.backend->upload_weight(WeightDesc{}); });
  // Loading twice gives two independent backends from the same library.
  LoadedBackend again = open_backend_plugin_file(fake("ok"), "cuda:0", 0);
  EXPECT_NE(again.backend.get(), lb.backend.get());
}

TEST(Plugin, SearchOrderDirsThenEnvironment) {
  EnvGuard guard("EMBER_PLUGIN_DIR");
  PluginSearch s;
  s.file_name = "libember_fake_plugin_ok.so";
  s.next_to_libember = false;
  s.default_path = false;
  // Not found: EMBER_PLUGIN_DIR unset.
  unsetenv("EMBER_PLUGIN_DIR");
  const std::string msg = error_of([&] { open_backend_plugin("cuda", 0, s); });
  EXPECT_NE(msg.find("$EMBER_PLUGIN_DIR (unset)"), std::string::npos) << msg;
  // Found through EMBER_PLUGIN_DIR (a ':'-separated list).
  setenv("EMBER_PLUGIN_DIR", ("/nonexistent:" + std::string(EMBER_FAKE_PLUGIN_DIR)).c_str(), 1);
  LoadedBackend lb = open_backend_plugin("cuda", 0, s);
  ASSERT_TRUE(lb.backend != nullptr);
  EXPECT_EQ(lb.library, std::string(EMBER_FAKE_PLUGIN_DIR) + "/libember_fake_plugin_ok.so");
  // Explicit dirs come first: the "nodevice" plugin under the same name wins.
  s.file_name = "libember_fake_plugin_nodevice.so";
  s.dirs = {EMBER_FAKE_PLUGIN_DIR};
  const std::string msg2 = error_of([&] { open_backend_plugin("cuda", 0, s); });
  EXPECT_NE(msg2.find("no CUDA-capable GPU"), std::string::npos) << msg2;
}

TEST(Plugin, FingerprintIsStable) {
  static_assert(backend_interface_fingerprint() != 0, "computed at compile time");
  EXPECT_EQ(backend_interface_fingerprint(), backend_interface_fingerprint());
}

}  // namespace
}  // namespace ember
