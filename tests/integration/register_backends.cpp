// The integration tests build engines from the core directly (not through
// libember, which registers the CPU backend itself): register it here.
#include "cpu/cpu_backend.h"

namespace {
const bool kRegistered = (ember::register_cpu_backend(), true);
}  // namespace
