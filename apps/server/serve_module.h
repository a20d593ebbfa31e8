// `ember serve` as a module, libember_serve.so, beside libember.so: the CLI
// opens it for that command alone, so chat, generate and bench never map
// cpp-httplib, OpenSSL (libcrypto, libssl) and the compression libraries
// they pull in (~3.7 MB resident). Module and CLI are built from one tree;
// the options' size checks that they agree.
#pragma once

#include <cstddef>

#include "apps/server/server.h"

extern "C" {
// Runs ember::server::serve(*options) and returns its exit status; a C++
// exception becomes status 1 with its message in err (NUL-terminated).
typedef int (*ember_serve_module_fn)(const ember::server::ServeOptions* options, size_t options_size, char* err,
                                     size_t err_size);
}

namespace ember::server {
inline constexpr const char* kServeModuleFile = "libember_serve.so";
inline constexpr const char* kServeModuleEntry = "ember_serve_module_v1";
}  // namespace ember::server
