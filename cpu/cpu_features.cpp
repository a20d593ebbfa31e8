#include "cpu/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace ember::cpu {
namespace {

void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) { __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]); }

uint64_t xgetbv0() {
  uint32_t lo, hi;
  // xgetbv with ecx = 0 (XCR0). Encoded by hand so no -mxsave is needed.
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  uint32_t r[4] = {0, 0, 0, 0};
  cpuid(0, 0, r);
  const uint32_t max_leaf = r[0];
  std::memcpy(f.vendor + 0, &r[1], 4);
  std::memcpy(f.vendor + 4, &r[3], 4);
  std::memcpy(f.vendor + 8, &r[2], 4);
  if (max_leaf < 1) return f;

  cpuid(1, 0, r);
  const uint32_t ecx1 = r[2];
  const int base_family = static_cast<int>((r[0] >> 8) & 0xf);
  f.family = base_family == 0xf ? base_family + static_cast<int>((r[0] >> 20) & 0xff) : base_family;
  f.sse42 = (ecx1 >> 20) & 1;
  f.fma = (ecx1 >> 12) & 1;
  f.f16c = (ecx1 >> 29) & 1;
  f.avx = (ecx1 >> 28) & 1;
  const bool osxsave = (ecx1 >> 27) & 1;
  if (osxsave) {
    const uint64_t xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6) == 0x6;       // XMM | YMM
    f.os_avx512 = (xcr0 & 0xe6) == 0xe6;  // XMM | YMM | opmask | ZMM_Hi256 | Hi16_ZMM
  }
  if (max_leaf >= 7) {
    cpuid(7, 0, r);
    const uint32_t ebx7 = r[1], ecx7 = r[2], edx7 = r[3];
    const uint32_t max_sub7 = r[0];
    f.avx2 = (ebx7 >> 5) & 1;
    f.bmi2 = (ebx7 >> 8) & 1;
    f.avx512f = (ebx7 >> 16) & 1;
    f.avx512dq = (ebx7 >> 17) & 1;
    f.avx512bw = (ebx7 >> 30) & 1;
    f.avx512vl = (ebx7 >> 31) & 1;
    f.avx512vnni = (ecx7 >> 11) & 1;
    f.amx_bf16 = (edx7 >> 22) & 1;
    f.amx_tile = (edx7 >> 24) & 1;
    f.amx_int8 = (edx7 >> 25) & 1;
    if (max_sub7 >= 1) {
      cpuid(7, 1, r);
      f.avxvnni = (r[0] >> 4) & 1;
      f.avx512bf16 = (r[0] >> 5) & 1;
    }
  }
  // Without OS support the instruction bits are meaningless.
  if (!f.os_avx) {
    f.avx = f.avx2 = f.fma = f.f16c = false;
    f.avxvnni = false;
  }
  if (!f.os_avx512) {
    f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = false;
    f.avx512vnni = f.avx512bf16 = false;
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::kScalar:
      // Everything outside the *_avx2 / *_avx512 files is baseline x86-64.
      return true;
    case Isa::kAvx2: return f.avx2 && f.fma && f.f16c && f.bmi2;  // cmake/EmberFlags.cmake EMBER_AVX2_FLAGS
    case Isa::kAvx512Vnni:
      return f.avx2 && f.fma && f.f16c && f.bmi2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni;
  }
  return false;
}

namespace {
// EMBER_CPU_ISA=scalar|avx2|avx512_vnni caps the variant (never above what
// the CPU runs): e.g. avx2 on an AVX-512 machine gives llama.cpp's AVX2
// summation order, which the scalar kernels of a pre-AVX2 CPU share.
Isa isa_cap() {
  static const Isa cap = [] {
    const char* env = std::getenv("EMBER_CPU_ISA");
    if (!env || !*env) return Isa::kAvx512Vnni;
    for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512Vnni}) {
      if (std::strcmp(env, isa_to_string(i)) == 0) return i;
    }
    return Isa::kAvx512Vnni;  // unknown names change nothing
  }();
  return cap;
}
}  // namespace

Isa best_isa() {
  const Isa cap = isa_cap();
  if (cap >= Isa::kAvx512Vnni && isa_supported(Isa::kAvx512Vnni)) return Isa::kAvx512Vnni;
  if (cap >= Isa::kAvx2 && isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

const char* isa_to_string(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Vnni: return "avx512_vnni";
  }
  return "unknown";
}

bool has_avx512_bf16() { return isa_supported(Isa::kAvx512Vnni) && cpu_features().avx512bf16; }

bool amd_cpu() { return std::strcmp(cpu_features().vendor, "AuthenticAMD") == 0; }

bool avx512_double_pumped() { return isa_supported(Isa::kAvx512Vnni) && amd_cpu() && cpu_features().family == 0x19; }

}  // namespace ember::cpu
