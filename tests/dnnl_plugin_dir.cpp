// Test programs that link the CPU backend statically look for the oneDNN
// plugin (libember_dnnl.so) where the build put it, beside libember.so.
#include "cpu/dnnl_matmul.h"

namespace {
const bool kDnnlPluginDir = (ember::cpu::dnnl_mm::add_plugin_dir(EMBER_DNNL_PLUGIN_DIR), true);
}  // namespace
