// Run-time CPU feature detection (cpuid + xgetbv) and the ISA variants the
// CPU kernels are built for. The library's baseline is plain x86-64; code in
// *_avx2.cpp files may only run when isa_supported(Isa::kAvx2), code in
// *_avx512.cpp files only when isa_supported(Isa::kAvx512Vnni).
#pragma once

#include <cstdint>

namespace ember::cpu {

struct CpuFeatures {
  // Instruction-set bits as reported by cpuid.
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
  bool avxvnni = false;
  bool amx_bf16 = false, amx_int8 = false, amx_tile = false;
  // Operating-system support (XCR0): the OS saves the YMM / ZMM+opmask state.
  bool os_avx = false, os_avx512 = false;
  char vendor[13] = {0};
  int family = 0;  // cpuid's display family (base + extended): AMD Zen 4 0x19, Zen 5 0x1a; Intel 6
};

// Detected once (thread-safe static init) and cached.
const CpuFeatures& cpu_features();

// Kernel variants, in increasing order of capability.
enum class Isa : int {
  kScalar = 0,      // portable C++ (baseline x86-64; every CPU)
  kAvx2 = 1,        // AVX2 + FMA + F16C + BMI2
  kAvx512Vnni = 2,  // AVX-512 F/BW/VL/DQ + VNNI (BF16 used when also present)
};

bool isa_supported(Isa isa);         // CPU and OS can run this variant
Isa best_isa();                      // highest supported variant (at most $EMBER_CPU_ISA when set)
const char* isa_to_string(Isa isa);  // "scalar", "avx2", "avx512_vnni"

// True when the AVX-512 variant may also use AVX512_BF16 instructions.
bool has_avx512_bf16();

// An AMD CPU (cpuid vendor "AuthenticAMD").
bool amd_cpu();

// AMD Zen 4 (family 0x19 with AVX-512): its 512-bit instructions run as two
// 256-bit halves, so kernels that win on Intel's 512-bit units by doing
// more work per instruction can lose there (cpu/matmul.cpp: one to three
// rows of K-quants).
bool avx512_double_pumped();

}  // namespace ember::cpu
