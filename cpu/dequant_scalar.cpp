// Portable prefill dequantization ("scalar" variant): weight rows to f32 or
// bf16 for the GEMM tiles of a prefill (matmul.cpp). Q4_0, Q4_1, Q8_0 and the
// float types by hand, the others through the reference dequantizers.
#include <cstring>

#include "cpu/matmul_internal.h"

namespace ember::cpu::detail {
namespace {

template <typename Out, typename Cvt>
void dequant_generic(DType type, const void* src, Out* dst, int64_t n, Cvt cvt) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (type) {
    case DType::Q4_0: {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(p);
      for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; ++j) {
          dst[j] = cvt(d * static_cast<float>((b[i].qs[j] & 0x0F) - 8));
          dst[j + 16] = cvt(d * static_cast<float>((b[i].qs[j] >> 4) - 8));
        }
      }
      break;
    }
    case DType::Q4_1: {
      const auto* b = reinterpret_cast<const BlockQ4_1*>(p);
      for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 16; ++j) {
          dst[j] = cvt(d * static_cast<float>(b[i].qs[j] & 0x0F) + m);
          dst[j + 16] = cvt(d * static_cast<float>(b[i].qs[j] >> 4) + m);
        }
      }
      break;
    }
    case DType::Q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(p);
      for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 32; ++j) dst[j] = cvt(d * static_cast<float>(b[i].qs[j]));
      }
      break;
    }
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = cvt(wval<DType::F16>(p, i));
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = cvt(wval<DType::BF16>(p, i));
      break;
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) dst[i] = cvt(wval<DType::F32>(p, i));
      break;
    default: break;
  }
}

// Types without a case above (Q5_0, Q5_1, K-quants): the reference dequantizer.
bool dequant_by_reference(DType type) { return type == DType::Q5_0 || type == DType::Q5_1 || is_kquant(type); }

void dequant_f32(DType type, const void* src, float* dst, int64_t n) {
  if (dequant_by_reference(type)) return dequant_reference_f32(type, src, dst, n);
  dequant_generic(type, src, dst, n, [](float v) { return v; });
}
void dequant_bf16(DType type, const void* src, uint16_t* dst, int64_t n) {
  if (dequant_by_reference(type)) return dequant_reference_bf16(type, src, dst, n);
  if (type == DType::BF16) {
    std::memcpy(dst, src, static_cast<size_t>(n) * 2);
    return;
  }
  dequant_generic(type, src, dst, n, [](float v) { return f2bf(v); });
}
void f32_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f2bf(src[i]);
}

}  // namespace

void scalar_dequant_f32(DType type, const void* src, float* dst, int64_t n) { dequant_f32(type, src, dst, n); }
void scalar_dequant_bf16(DType type, const void* src, uint16_t* dst, int64_t n) { dequant_bf16(type, src, dst, n); }
void scalar_f32_to_bf16(const float* src, uint16_t* dst, int64_t n) { f32_to_bf16(src, dst, n); }

}  // namespace ember::cpu::detail
