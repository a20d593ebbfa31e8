// AVX-512 VNNI variant. Compiled with the AVX-512 flags (see
// cmake/EmberFlags.cmake): nothing here may run before
// isa_supported(Isa::kAvx512Vnni) was checked (matmul.cpp does).
// The kernels live in matmul_avx512_kernels.inc, the prefill dequantization
// in dequant_avx512.inc, so that the tests can also build them against an
// emulation of the intrinsics (matmul_avx512_emu.h).
// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*()
// values, which -Wall reports as (maybe-)uninitialized once inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include "cpu/cpu_features.h"
#include "cpu/matmul_internal.h"

namespace ember::cpu::detail {
namespace avx512k {
namespace {
#include "cpu/matmul_avx512_kernels.inc"

// After the kernels: it uses their helpers.
#include "cpu/dequant_avx512.inc"
}  // namespace
}  // namespace avx512k

const IsaImpl& avx512_impl() { return has_avx512_bf16() ? avx512k::impl_table<true>() : avx512k::impl_table<false>(); }

DecodeKernel avx512_kquant_kernel(DType t) { return avx512k::kquant_kernel(t); }

}  // namespace ember::cpu::detail
