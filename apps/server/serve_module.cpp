// The entry point of libember_serve.so (serve_module.h).
#include "apps/server/serve_module.h"

#include <cstdio>
#include <exception>

extern "C" __attribute__((visibility("default"))) int ember_serve_module_v1(const ember::server::ServeOptions* options,
                                                                            size_t options_size, char* err,
                                                                            size_t err_size) {
  auto say = [&](const char* msg) {
    if (err && err_size > 0) std::snprintf(err, err_size, "%s", msg);
  };
  if (!options || options_size != sizeof(ember::server::ServeOptions)) {
    say("libember_serve.so was built from another Ember tree than this ember; rebuild both");
    return 1;
  }
  try {
    return ember::server::serve(*options);
  } catch (const std::exception& e) {
    say(e.what());
  } catch (...) {
    say("unknown error");
  }
  return 1;
}
