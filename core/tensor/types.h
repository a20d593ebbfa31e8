// The tensor type table: GGML/GGUF type ids, block geometry and a scalar
// reference dequantizer per type. Adding a type (e.g. Q4_K, Q6_K) means
// adding one row to the table in types.cpp plus its block struct and
// reference dequantizer; every consumer goes through type_traits().
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember {

// Numeric values are GGUF's ggml_type ids (stable on disk).
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

// Dequantize n consecutive elements (n a multiple of block_size) to f32.
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);

struct TypeTraits {
  DType type;
  const char* name;
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
  // Scalar reference dequantizer; nullptr when Ember cannot compute with the type
  // (its size is still known, so a GGUF holding it can be validated and reported).
  DequantizeRowFn dequantize_row;
};

// nullptr for an id GGUF does not define.
const TypeTraits* type_traits(uint32_t ggml_type);
inline const TypeTraits* type_traits(DType t) { return type_traits(static_cast<uint32_t>(t)); }
const char* type_name(uint32_t ggml_type);  // "unknown" for unknown ids

// Bytes taken by n elements of a row; n must be a multiple of block_size.
size_t row_bytes(DType t, int64_t n);

// f16 / bf16 scalar conversions (portable, no ISA requirement).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
inline float bf16_to_fp32(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v{static_cast<uint32_t>(h) << 16};
  return v.f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even

// Block layouts, identical to GGUF's on-disk blocks.
#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // 32 x 4-bit, low nibbles = elements 0..15, high = 16..31
};
struct BlockQ4_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 min
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ5_0 {
  uint16_t d;      // f16 scale
  uint8_t qh[4];   // 5th bits: bit j of the little-endian u32 = element j
  uint8_t qs[16];  // low 4 bits, as Q4_0
};
struct BlockQ5_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 min
  uint8_t qh[4];
  uint8_t qs[16];
};

// K-quants: super-blocks of 256 elements.
inline constexpr int kQK_K = 256;
// Q2_K: 16 sub-blocks of 16, each with a 4-bit scale and a 4-bit min;
// x = d*sc*q - dmin*m, q 2 bits. Element 128h + 32j + l is bits 2j..2j+1 of
// qs[32h + l]; sub-block e/16 has scales[e/16] (low nibble scale, high min).
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;     // f16 super-block scale of the scales
  uint16_t dmin;  // f16 super-block scale of the mins
};
// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (stored + 32, packed in
// scales[12], q3k_scales); x = d*(sc - 32)*q, q in -4..3: the low 2 bits as
// Q2_K's qs, minus 4 where the high bit (hmask[l] bit 4h + j for element
// 128h + 32j + l) is clear.
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;  // f16 super-block scale
};
// Q4_K / Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min
// packed in scales[12] (ggml's get_scale_min_k4); x = d*sc*q - dmin*m.
struct BlockQ4_K {
  uint16_t d;          // f16 super-block scale of the scales
  uint16_t dmin;       // f16 super-block scale of the mins
  uint8_t scales[12];  // 6-bit scales and mins
  uint8_t qs[128];     // per 64 elements: 32 bytes, low nibbles first 32, high nibbles next 32
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];   // 5th bit: element 64j+l -> bit 2j of qh[l], 64j+32+l -> bit 2j+1
  uint8_t qs[128];  // low 4 bits, as Q4_K
};
// Q6_K: 16 sub-blocks of 16 with int8 scales; x = d*sc*(q - 32), q 6 bits.
struct BlockQ6_K {
  uint8_t ql[128];  // low 4 bits
  uint8_t qh[64];   // high 2 bits
  int8_t scales[16];
  uint16_t d;  // f16 super-block scale
};
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18, "GGUF Q4_0 block");
static_assert(sizeof(BlockQ4_1) == 20, "GGUF Q4_1 block");
static_assert(sizeof(BlockQ8_0) == 34, "GGUF Q8_0 block");
static_assert(sizeof(BlockQ5_0) == 22, "GGUF Q5_0 block");
static_assert(sizeof(BlockQ5_1) == 24, "GGUF Q5_1 block");
static_assert(sizeof(BlockQ2_K) == 84, "GGUF Q2_K block");
static_assert(sizeof(BlockQ3_K) == 110, "GGUF Q3_K block");
static_assert(sizeof(BlockQ4_K) == 144, "GGUF Q4_K block");
static_assert(sizeof(BlockQ5_K) == 176, "GGUF Q5_K block");
static_assert(sizeof(BlockQ6_K) == 210, "GGUF Q6_K block");

// Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K
// block's scales[12] (ggml's get_scale_min_k4).
inline void kquant_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Unpacks the 16 6-bit scales of a Q3_K block's scales[12] (as stored,
// 0..63; the signed scale is the value - 32), as ggml's kmask decoding.
inline void q3k_scales(const uint8_t* s, int* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = (s[j] & 0xF) | ((s[8 + j] & 3) << 4);
    out[4 + j] = (s[4 + j] & 0xF) | (((s[8 + j] >> 2) & 3) << 4);
    out[8 + j] = (s[j] >> 4) | (((s[8 + j] >> 4) & 3) << 4);
    out[12 + j] = (s[4 + j] >> 4) | (((s[8 + j] >> 6) & 3) << 4);
  }
}

}  // namespace ember
