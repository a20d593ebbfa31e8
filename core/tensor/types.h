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
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18, "GGUF Q4_0 block");
static_assert(sizeof(BlockQ4_1) == 20, "GGUF Q4_1 block");
static_assert(sizeof(BlockQ8_0) == 34, "GGUF Q8_0 block");

}  // namespace ember
