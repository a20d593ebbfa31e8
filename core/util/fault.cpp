#include "core/util/fault.h"

#include <atomic>
#include <mutex>

namespace ember::testing {

namespace {
struct SiteState {
  int64_t skip = 0;
  int64_t count = 0;  // < 0: unlimited
  uint64_t injected = 0;
};
std::atomic<bool> g_armed{false};  // any site armed: the fast path's only read
std::mutex g_mutex;
SiteState g_sites[kAllocSiteCount];

bool any_armed_locked() {
  for (const SiteState& s : g_sites)
    if (s.count != 0) return true;
  return false;
}
}  // namespace

uint64_t arm_alloc_failures(AllocSite site, int64_t skip, int64_t count) {
  std::lock_guard<std::mutex> lock(g_mutex);
  SiteState& s = g_sites[static_cast<int32_t>(site)];
  const uint64_t injected = s.injected;
  s.skip = skip < 0 ? 0 : skip;
  s.count = count;
  s.injected = 0;
  g_armed.store(any_armed_locked(), std::memory_order_release);
  return injected;
}

bool inject_alloc_failure(AllocSite site) {
  if (!g_armed.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  SiteState& s = g_sites[static_cast<int32_t>(site)];
  if (s.count == 0) return false;
  if (s.skip > 0) {
    --s.skip;
    return false;
  }
  if (s.count > 0 && --s.count == 0) g_armed.store(any_armed_locked(), std::memory_order_release);
  ++s.injected;
  return true;
}

}  // namespace ember::testing
