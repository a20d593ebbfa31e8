// The CPU backend's kernels (backend_kernels.inc) on AVX2 + FMA + F16C.
// Compiled with the AVX2 flags (cmake/EmberFlags.cmake): nothing here may run
// before isa_supported(Isa::kAvx2) was checked (backend_kernels() does).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu/backend_kernels.h"

namespace ember::cpu::detail {
namespace {

#include "cpu/backend_kernels.inc"
#include "cpu/backend_kernels_avx2_ops.inc"

}  // namespace

const BackendKernels& backend_kernels_avx2() { return kernel_table<Avx2Ops, PairOps<Avx2Ops>>("avx2"); }

}  // namespace ember::cpu::detail
