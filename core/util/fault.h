// Allocation-failure injection for tests (SQLite's OOM injection, in the
// small): each allocation site asks inject_alloc_failure() first and, when
// told to, fails exactly as it does when memory really runs out. Disarmed
// (the default) the check is one relaxed atomic load. Tests arm it through
// ember_test_inject_alloc_failures() (include/ember/ember.h).
#pragma once

#include <cstdint>

namespace ember::testing {

enum class AllocSite : int32_t {
  kKvBlock = 0,        // KvCache: a block handed to a sequence (reserve, copy-on-write)
  kBackendBuffer = 1,  // Backend::alloc: activation buffers of the forward pass
  kBackendWeight = 2,  // Backend::upload_weight: a weight made resident on the device
  kKvPool = 3,         // Backend::kv_init: the engine's KV pool
  kModelFile = 4,      // GgufFile::open(kPrivateCopy): the model's private copy of its file
};
constexpr int32_t kAllocSiteCount = 5;

// At `site`, the next `skip` allocations succeed, then the following `count`
// fail (count < 0: every one until re-armed; 0: disarmed). Returns how many
// failures were injected at `site` since it was last armed. Thread-safe.
uint64_t arm_alloc_failures(AllocSite site, int64_t skip, int64_t count);

// True when this allocation at `site` must fail. Thread-safe.
bool inject_alloc_failure(AllocSite site);

}  // namespace ember::testing
