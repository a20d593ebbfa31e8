// The tensor type table and scalar reference dequantizers.
#include "core/tensor/types.h"

#include <array>
#include <cstring>
#include <limits>
#include <string>

#include "core/util/status.h"

namespace ember {
namespace {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---------------------------------------------------------------------------
// Reference dequantizers. They are deliberately plain scalar code: the
// optimized kernels in cpu/ are tested against them. `src` may be unaligned
// (e.g. straight out of a GGUF mapping), so blocks are read with memcpy.
// `n` is a multiple of the type's block size; a trailing partial block is
// ignored.

void dequantize_row_f32(const void* src, float* dst, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_row_f16(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = fp16_to_fp32(h);
  }
}

void dequantize_row_bf16(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    dst[i] = bf16_to_fp32(h);
  }
}

void dequantize_row_q8_0(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / 32;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ8_0 blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ8_0), sizeof(blk));
    const float d = fp16_to_fp32(blk.d);
    for (int j = 0; j < 32; ++j) dst[b * 32 + j] = static_cast<float>(blk.qs[j]) * d;
  }
}

void dequantize_row_q4_0(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / 32;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ4_0 blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ4_0), sizeof(blk));
    const float d = fp16_to_fp32(blk.d);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((blk.qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_row_q4_1(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / 32;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ4_1 blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ4_1), sizeof(blk));
    const float d = fp16_to_fp32(blk.d);
    const float m = fp16_to_fp32(blk.m);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(blk.qs[j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(blk.qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_row_q5_0(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / 32;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ5_0 blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ5_0), sizeof(blk));
    const float d = fp16_to_fp32(blk.d);
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int x0 = ((blk.qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16;
      const int x1 = ((blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_row_q5_1(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / 32;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ5_1 blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ5_1), sizeof(blk));
    const float d = fp16_to_fp32(blk.d);
    const float m = fp16_to_fp32(blk.m);
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int x0 = (blk.qs[j] & 0x0F) | (((qh >> j) & 1u) << 4);
      const int x1 = (blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4);
      y[j] = static_cast<float>(x0) * d + m;
      y[j + 16] = static_cast<float>(x1) * d + m;
    }
  }
}

// Q2_K: x = (d*sc) * q - (dmin*m) per 16 elements, as ggml's dequantize_row_q2_K.
void dequantize_row_q2_K(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK_K;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ2_K blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ2_K), sizeof(blk));
    const float d = fp16_to_fp32(blk.d), dmin = fp16_to_fp32(blk.dmin);
    float* y = dst + b * kQK_K;
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, j = (e % 128) / 32, l = e % 32;
      const uint8_t sc = blk.scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
      y[e] = dl * static_cast<float>((blk.qs[32 * h + l] >> (2 * j)) & 3) - ml;
    }
  }
}

// Q3_K: x = (d*(sc - 32)) * q, as ggml's dequantize_row_q3_K.
void dequantize_row_q3_K(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK_K;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ3_K blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ3_K), sizeof(blk));
    const float d = fp16_to_fp32(blk.d);
    int sc[16];
    q3k_scales(blk.scales, sc);
    float* y = dst + b * kQK_K;
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, j = (e % 128) / 32, l = e % 32;
      const int q = ((blk.qs[32 * h + l] >> (2 * j)) & 3) - (((blk.hmask[l] >> (4 * h + j)) & 1) ? 0 : 4);
      y[e] = d * static_cast<float>(sc[e / 16] - 32) * static_cast<float>(q);
    }
  }
}

// Q4_K / Q5_K: x = (d*sc) * q - (dmin*m), the two products rounded first
// (ggml's dequantize_row_q4_K order).
void dequantize_row_q4_K(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK_K;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ4_K blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ4_K), sizeof(blk));
    const float d = fp16_to_fp32(blk.d), dmin = fp16_to_fp32(blk.dmin);
    float* y = dst + b * kQK_K;
    for (int j = 0; j < 4; ++j) {
      uint8_t sc, m;
      kquant_scale_min(2 * j, blk.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      kquant_scale_min(2 * j + 1, blk.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t* q = blk.qs + 32 * j;
      for (int l = 0; l < 32; ++l) y[64 * j + l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) y[64 * j + 32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequantize_row_q5_K(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK_K;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ5_K blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ5_K), sizeof(blk));
    const float d = fp16_to_fp32(blk.d), dmin = fp16_to_fp32(blk.dmin);
    float* y = dst + b * kQK_K;
    for (int j = 0; j < 4; ++j) {
      uint8_t sc, m;
      kquant_scale_min(2 * j, blk.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      kquant_scale_min(2 * j + 1, blk.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const uint8_t* q = blk.qs + 32 * j;
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] & 0xF) | (((blk.qh[l] >> (2 * j)) & 1) << 4);
        y[64 * j + l] = d1 * static_cast<float>(v) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] >> 4) | (((blk.qh[l] >> (2 * j + 1)) & 1) << 4);
        y[64 * j + 32 + l] = d2 * static_cast<float>(v) - m2;
      }
    }
  }
}

// Q6_K: x = (d*sc) * (q - 32), as ggml's dequantize_row_q6_K.
void dequantize_row_q6_K(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK_K;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ6_K blk;
    std::memcpy(&blk, p + b * sizeof(BlockQ6_K), sizeof(blk));
    const float d = fp16_to_fp32(blk.d);
    float* y = dst + b * kQK_K;
    for (int h = 0; h < 2; ++h) {  // halves of 128 elements
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      const int8_t* sc = blk.scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[128 * h + l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[128 * h + l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[128 * h + l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[128 * h + l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The type table, indexed by GGUF ggml_type id. Ids GGUF does not define
// (4, 5: removed Q4_2/Q4_3; 16..23, 29: IQ* types Ember does not know) have
// no row (name == nullptr) and are rejected by the GGUF reader.
//
// To add a type (e.g. Q4_K or Q6_K): define its Block struct in types.h
// (with a static_assert on its size), write dequantize_row_<type>() above,
// and replace the nullptr in its row below. Everything else (GGUF
// validation, the model loader, the ops) reads this table.

constexpr uint32_t kMaxTypeId = 32;

struct Table {
  std::array<TypeTraits, kMaxTypeId> rows{};
  constexpr void set(DType t, const char* name, uint32_t bs, uint32_t ts, DequantizeRowFn fn) {
    rows[static_cast<uint32_t>(t)] = TypeTraits{t, name, bs, ts, fn};
  }
};

constexpr Table make_table() {
  Table t;
  //     type         name     block  bytes  reference dequantizer
  t.set(DType::F32, "f32", 1, 4, dequantize_row_f32);
  t.set(DType::F16, "f16", 1, 2, dequantize_row_f16);
  t.set(DType::Q4_0, "q4_0", 32, 18, dequantize_row_q4_0);
  t.set(DType::Q4_1, "q4_1", 32, 20, dequantize_row_q4_1);
  t.set(DType::Q5_0, "q5_0", 32, 22, dequantize_row_q5_0);
  t.set(DType::Q5_1, "q5_1", 32, 24, dequantize_row_q5_1);
  t.set(DType::Q8_0, "q8_0", 32, 34, dequantize_row_q8_0);
  t.set(DType::Q8_1, "q8_1", 32, 36, nullptr);
  t.set(DType::Q2_K, "q2_K", 256, 84, dequantize_row_q2_K);
  t.set(DType::Q3_K, "q3_K", 256, 110, dequantize_row_q3_K);
  t.set(DType::Q4_K, "q4_K", 256, 144, dequantize_row_q4_K);
  t.set(DType::Q5_K, "q5_K", 256, 176, dequantize_row_q5_K);
  t.set(DType::Q6_K, "q6_K", 256, 210, dequantize_row_q6_K);
  t.set(DType::Q8_K, "q8_K", 256, 292, nullptr);
  t.set(DType::I8, "i8", 1, 1, nullptr);
  t.set(DType::I16, "i16", 1, 2, nullptr);
  t.set(DType::I32, "i32", 1, 4, nullptr);
  t.set(DType::I64, "i64", 1, 8, nullptr);
  t.set(DType::F64, "f64", 1, 8, nullptr);
  t.set(DType::BF16, "bf16", 1, 2, dequantize_row_bf16);
  return t;
}

constexpr Table kTable = make_table();

}  // namespace

const TypeTraits* type_traits(uint32_t ggml_type) {
  if (ggml_type >= kMaxTypeId) return nullptr;
  const TypeTraits& row = kTable.rows[ggml_type];
  return row.name != nullptr ? &row : nullptr;
}

const char* type_name(uint32_t ggml_type) {
  const TypeTraits* t = type_traits(ggml_type);
  return t ? t->name : "unknown";
}

size_t row_bytes(DType t, int64_t n) {
  const TypeTraits* tt = type_traits(t);
  if (tt == nullptr) {
    fail(StatusCode::kInvalidArgument, "row_bytes: unknown type id " + std::to_string(static_cast<uint32_t>(t)));
  }
  if (n < 0 || n % tt->block_size != 0) {
    fail(StatusCode::kInvalidArgument, "row_bytes: " + std::to_string(n) + " elements is not a multiple of the " +
                                           tt->name + " block size " + std::to_string(tt->block_size));
  }
  const uint64_t blocks = static_cast<uint64_t>(n) / tt->block_size;
  if (blocks > std::numeric_limits<size_t>::max() / tt->type_size) {
    fail(StatusCode::kInvalidArgument,
         "row_bytes: size of " + std::to_string(n) + " " + tt->name + " elements overflows");
  }
  return static_cast<size_t>(blocks * tt->type_size);
}

// ---------------------------------------------------------------------------
// IEEE binary16 <-> binary32, integer-only so the result never depends on the
// FP environment or the ISA.

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);  // +-0
    // Subnormal: value = mant * 2^-24. Normalize so the implicit bit is set.
    uint32_t e = 113;  // biased f32 exponent of 2^-14
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    mant &= 0x3FFu;
    return bits_f32(sign | (e << 23) | (mant << 13));
  }
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (mant << 13));  // inf / nan (payload kept)
  return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    // NaN: keep the top payload bits and force quiet so it cannot become inf.
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  }
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {
    // Normal half. Round to nearest even at bit 13; a carry propagates into
    // the exponent, which is exactly right.
    const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25 rounds to (signed) zero
  // Subnormal half: units of 2^-24.
  const uint32_t e = a >> 23;                      // 102..112
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;  // with implicit bit
  const uint32_t shift = 126 - e;                  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may become 0x400, the smallest normal
  return static_cast<uint16_t>(sign | q);
}

uint16_t fp32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t r = x + 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(r >> 16);
}

}  // namespace ember
