// Internal interface between the matmul driver (matmul.cpp) and the per-ISA
// files: the decode kernels (matmul_scalar.cpp, matmul_avx2.cpp,
// matmul_avx512.cpp) and the prefill dequantization (dequant_scalar.cpp,
// dequant_avx2.cpp, dequant_avx512.inc). Not part of the public API.
//
// Included by baseline and ISA files alike: every function defined here is
// in an anonymous namespace, so each file gets its own copy compiled for its
// own ISA, and the linker can never hand a baseline caller an AVX2 copy.
#pragma once

#if defined(__F16C__)
#include <immintrin.h>
#endif
#include <xmmintrin.h>  // _mm_prefetch (SSE: every x86-64 CPU)

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/tensor/types.h"

namespace ember::cpu::detail {

inline constexpr int64_t kQK = 32;  // elements per quant block (Q4_0/Q4_1/Q8_0 and activations)

namespace {

// f16 <-> f32: F16C in files compiled for it, else the portable conversions
// of core/tensor (equal to F16C's bit for bit for every non-NaN value,
// tests/unit/tensor/types_test.cpp Fp16.MatchesF16C).
#if defined(__F16C__)
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f2h(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
#else
inline float h2f(uint16_t h) { return fp16_to_fp32(h); }
inline uint16_t f2h(float f) { return fp32_to_fp16(f); }
#endif
inline uint16_t f2bf(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf2f(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// Element k of a float weight row (the scalar variant's kernels and
// dequantization).
template <DType T>
inline float wval(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::F32) {
    float f;
    std::memcpy(&f, row + 4 * k, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    if constexpr (T == DType::F16)
      return h2f(h);
    else
      return bf2f(h);
  }
}

// Quantized types with blocks of 32 (the scalar and AVX2 variants'
// activations use the natural Q8 layout below, the AVX-512 variant's its
// ActQuad records).
inline bool is_quant(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0 || t == DType::Q5_0 || t == DType::Q5_1;
}
// K-quants (super-blocks of 256; activations quantized to Q8_K, see below).
inline bool is_kquant(DType t) {
  return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}
// K-quants the AVX-512 variant has kernels for (Q2_K / Q3_K run the AVX2
// variant's kernels on AVX-512 CPUs: the same results).
inline bool has_avx512_kquant_kernels(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
// Types with Q8_1-style activations (the sum term s rounded to fp16).
inline bool uses_q8_1(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }
// Elements per weight block.
inline int64_t weight_block_elems(DType t) { return is_kquant(t) ? kQK_K : is_quant(t) ? kQK : 1; }

// Bytes of one weight row of K elements (K a multiple of the block size).
inline size_t weight_row_bytes(DType t, int64_t K) {
  switch (t) {
    case DType::Q4_0: return static_cast<size_t>(K / kQK) * sizeof(BlockQ4_0);
    case DType::Q4_1: return static_cast<size_t>(K / kQK) * sizeof(BlockQ4_1);
    case DType::Q8_0: return static_cast<size_t>(K / kQK) * sizeof(BlockQ8_0);
    case DType::Q5_0: return static_cast<size_t>(K / kQK) * sizeof(BlockQ5_0);
    case DType::Q5_1: return static_cast<size_t>(K / kQK) * sizeof(BlockQ5_1);
    case DType::Q2_K: return static_cast<size_t>(K / kQK_K) * sizeof(BlockQ2_K);
    case DType::Q3_K: return static_cast<size_t>(K / kQK_K) * sizeof(BlockQ3_K);
    case DType::Q4_K: return static_cast<size_t>(K / kQK_K) * sizeof(BlockQ4_K);
    case DType::Q5_K: return static_cast<size_t>(K / kQK_K) * sizeof(BlockQ5_K);
    case DType::Q6_K: return static_cast<size_t>(K / kQK_K) * sizeof(BlockQ6_K);
    case DType::F16:
    case DType::BF16: return static_cast<size_t>(K) * 2;
    case DType::F32: return static_cast<size_t>(K) * 4;
    default: return 0;
  }
}

}  // namespace

// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights packed for the AVX-512 kernels
// (pack_weight), in groups of four rows (the kernel's row tile) so that a
// tile streams one contiguous region: for each quad q of four blocks, the
// quants of rows 0..3 of the group (Q4, Q5: the four blocks' 16 quant bytes,
// 64 bytes per row; Q8_0: their bytes 0..15, then 16..31, 128), then all the
// group's scales in the same order (Q4_0 / Q5_0 / Q8_0: d0..d3; Q4_1 / Q5_1:
// d0 m0 .. d3 m3; f16). Q5_0 / Q5_1 follow their scales with the quad's
// fifth bits as the kernel's two byte masks: u64 lo, bit 16j + i = block j's
// qh bit i (element i), then u64 hi, bit 16j + i = qh bit 16 + i. A last
// partial quad and the rows past N are zero; groups are 64-byte aligned. The
// kernel's registers get the same values in the same lanes as from the GGUF
// layout, without its gathers: results are identical to the bit.
inline constexpr bool packable(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0;
}
// f16 values per block (d; d and m) and whether a block has fifth bits.
inline constexpr size_t packed_f16_per_block(DType t) { return t == DType::Q4_1 || t == DType::Q5_1 ? 2 : 1; }
inline constexpr bool packed_five_bit(DType t) { return t == DType::Q5_0 || t == DType::Q5_1; }
inline constexpr size_t packed_quant_bytes(DType t) { return t == DType::Q8_0 ? 128 : 64; }
inline constexpr size_t packed_scale_bytes(DType t) {
  return 4 * 2 * packed_f16_per_block(t) + (packed_five_bit(t) ? 16 : 0);
}
inline constexpr int64_t kPackRows = 4;
inline int64_t packed_quads(int64_t K) { return (K / kQK + 3) / 4; }
inline size_t packed_group_bytes(DType t, int64_t K) {
  const size_t nq = static_cast<size_t>(packed_quads(K));
  return (nq * kPackRows * (packed_quant_bytes(t) + packed_scale_bytes(t)) + 63) & ~size_t{63};
}
// Offsets within a group of row j's quad q: quants, and scales.
inline size_t packed_quant_offset(DType t, int64_t q, int64_t j) {
  return static_cast<size_t>(q * kPackRows + j) * packed_quant_bytes(t);
}
inline size_t packed_scale_offset(DType t, int64_t K, int64_t q, int64_t j) {
  return static_cast<size_t>(packed_quads(K) * kPackRows) * packed_quant_bytes(t) +
         static_cast<size_t>(q * kPackRows + j) * packed_scale_bytes(t);
}

// The tile layout of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights (pack_weight
// with packed_tiles; AVX-512 VNNI and AVX2 CPUs): groups of 16 rows (the last one padded with
// zero rows), 64-byte aligned; per group first every block's quants, then
// every block's scales. A block's quants are B-tile rows: Q4 / Q5 four
// chunks of 64 bytes, byte 4n + i of chunk k = GGUF quant byte 4k + i of row
// n's block (low nibble value 4k + i, tile row k; high nibble value
// 16 + 4k + i, tile row 4 + k), then for Q5 eight 64-bit masks, bit 4n + i of
// mask r = the fifth bit of value 4r + i of row n; Q8_0 eight chunks, byte
// 4n + i of chunk r = value 4r + i of row n plus 128 (an unsigned VNNI
// operand; tiles take it back). A block's scales: the 16 rows' f16 d, then
// (Q4_1 / Q5_1) their f16 m.
inline constexpr bool tile_packable(DType t) { return packable(t); }
inline constexpr int64_t kTileGroupRows = 16;
inline constexpr bool tile_five_bit(DType t) { return t == DType::Q5_0 || t == DType::Q5_1; }
inline constexpr bool tile_min(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }
inline constexpr size_t tile_quant_bytes(DType t) { return t == DType::Q8_0 ? 512 : tile_five_bit(t) ? 320 : 256; }
inline constexpr size_t tile_scale_bytes(DType t) { return tile_min(t) ? 64 : 32; }
inline size_t tile_group_bytes(DType t, int64_t K) {
  return (static_cast<size_t>(K / kQK) * (tile_quant_bytes(t) + tile_scale_bytes(t)) + 63) & ~size_t{63};
}

// Q4_K weights packed for the AVX2 and AVX-512 kernels (pack_weight; weights whose row
// count is a multiple of 8, the rows llama.cpp repacks to q4_K_8x8), in
// groups of eight rows: for each super-block one PackedQ4Kx8 holding the
// eight rows' d and dmin (as f32), their 6-bit scales and mins unpacked
// (sc[8 * g + r]: group g of row r), and their quants interleaved so that
// one 32-byte load holds four consecutive elements of each of the 8 rows:
// qs[128 * g + 32 * k + 4 * r + j] = element 4k + j of group g of row r
// (low nibble) | element 16 + 4k + j (high nibble), k < 4. A multiply of
// such a register by 4 activation bytes broadcast to every lane sums each
// row's products in its own lanes: the kernels add 8 of them in 16 bits
// before one multiply by the scales, where the GGUF layout needs a scale
// multiply per 32 products. 1216 bytes per 8 x 256 weights (1.06x the
// GGUF rows). The sums are exact integers, then the same float steps as
// the GGUF kernels: the same results to the bit.
struct PackedQ4Kx8 {
  float d[8], dmin[8];
  uint8_t sc[64], mn[64];
  uint8_t qs[1024];
};
static_assert(sizeof(PackedQ4Kx8) == 1216, "packed Q4_K x8 block");
inline constexpr int64_t kKx8PackRows = 8;
inline size_t q4k_x8_group_bytes(int64_t K) { return static_cast<size_t>(K / 256) * sizeof(PackedQ4Kx8); }

// Q6_K weights (rows % 8 == 0) packed for the AVX2 and AVX-512 kernels the same way:
// per super-block of 8 rows their d (f32), their 16 sub-block scales
// (sc[8 * s + r]), then per group g the low 4 bits interleaved as
// PackedQ4Kx8's quants (grp[g].ql[32 * c + 4 * r + j]: element 4c + j,
// high nibble element 16 + 4c + j) and the high 2 bits (grp[g].qh[32 * h +
// 4 * r + j], bits 2c..2c+1: element 16h + 4c + j). A chunk register of 8 rows x 4
// elements then gives, after the scale multiply, exactly lane c of each
// row's ggml_vec_dot_q6_K_q8_K sum (its lanes are 4 consecutive elements of
// every group), so the decode kernel keeps vec_dot's order with the rows in
// lanes, and the prompt kernel (tiled order: one total per super-block)
// adds two chunks in 16 bits before each scale multiply. 1696 bytes per
// 8 x 256 weights (1.01x the GGUF rows).
struct PackedQ6Kx8 {
  float d[8];
  int8_t sc[128];
  struct Group {  // (each group's bits together: one sequential stream)
    uint8_t ql[128];
    uint8_t qh[64];
  } grp[8];
};
static_assert(sizeof(PackedQ6Kx8) == 1696, "packed Q6_K x8 block");
inline size_t q6k_x8_group_bytes(int64_t K) { return static_cast<size_t>(K / 256) * sizeof(PackedQ6Kx8); }
// Bytes of one group of 8 packed rows, 0 for types not packed this way.
inline size_t kx8_group_bytes(DType t, int64_t K) {
  return t == DType::Q4_K ? q4k_x8_group_bytes(K) : t == DType::Q6_K ? q6k_x8_group_bytes(K) : 0;
}

// The order in which a K-quant dot product is summed: one of the computations
// llama.cpp's x86 CPU backend runs for a weight (see kquant_dot_reference).
enum class KOrder : uint8_t {
  kVec = 0,      // ggml_vec_dot_q{2,3,4,5,6}_K_q8_K: a one-row batch (decode)
  kTiled = 1,    // ggml-cpu/tiled (batches of 8+ rows)
  kGemv8x8 = 2,  // repacked q4_K_8x8, ggml_gemv_q4_K_8x8_q8_K (one row): Q4_K
  kGemm8x8 = 3,  // repacked q4_K_8x8, ggml_gemm_q4_K_8x8_q8_K (groups of 4 rows): Q4_K
};
// llama.cpp (x86, AVX2 or AVX-512) repacks a Q4_K weight whose row count is
// a multiple of 8 into q4_K_8x8 and runs every batch of it through the 8x8
// GEMV / GEMM; the other K-quant weights (and Q4_K with other row counts)
// take ggml_vec_dot for batches of fewer than 8 rows and the "tiled" kernels
// for 8 or more. (A llama.cpp build for AVX-512, ggml_cpu_has_avx512, also
// repacks Q2_K into q2_K_8x8; Ember follows the AVX2 build, the reference
// whose attention it matches bit for bit. Commit 6c66e56 had Q2_K's 8x8
// orders, verified against an AVX-512 build, if they are ever wanted.) Ember
// computes decode rows (generated tokens fed back, one per sequence:
// llama.cpp's one-row batches) in the one-row order and every other row in
// the batched order, whatever the batch: a row's result never depends on what
// it is batched with.
namespace {
inline KOrder kquant_order(DType t, int64_t rows, bool decode) {
  if (t == DType::Q4_K && rows % 8 == 0) return decode ? KOrder::kGemv8x8 : KOrder::kGemm8x8;
  return decode ? KOrder::kVec : KOrder::kTiled;
}
}  // namespace

// Software prefetch (into L1, or L2 where DecodeCtx::prefetch_l2 says so) of
// every cache line of the packed super-block kKx8PrefetchAhead blocks past p, for the kernels that stream PackedQ4Kx8 /
// PackedQ6Kx8 groups (a group's blocks, then the next group's: one
// sequential stream per kernel call). The earlier single line one group
// ahead left the hardware prefetchers to do the rest: one Ice Lake-SP core,
// `bench_kernels --isa I --threads 1 --cpu-time --types T --sweep --sweep-m 1
// --sweep-rows decode --sweep-shape 2048x8192` (cold weights), us, before ->
// ahead 2 / 4 / 8 blocks: AVX2 Q4_K 1315-1514 -> 872-1006 / 882-944 /
// 886-1028; AVX-512 Q4_K 879-924 -> 803-817 / 832-844 / 815-823; AVX2 Q6_K
// 1708-1863 -> 1303-1676 / 1453-1628 / 1368-1744; AVX-512 Q6_K 1481-1750 ->
// 1286-2073 / 1240-1469 / 1290-1546 (no prefetch at all: AVX2 Q4_K 1207-1231).
// On AMD Zen 4 the L1 prefetch is the slowest choice and the L2 one the
// fastest (cpu/matmul.cpp kx8_prefetch_l2).
inline constexpr int kKx8PrefetchAhead = 4;
namespace {
template <class P>
inline void prefetch_kx8_ahead(bool l2, const P* p) {
  const char* q = reinterpret_cast<const char*>(p + kKx8PrefetchAhead);
  if (l2) {
    for (size_t l = 0; l < sizeof(P); l += 64) _mm_prefetch(q + l, _MM_HINT_T1);
  } else {
    for (size_t l = 0; l < sizeof(P); l += 64) _mm_prefetch(q + l, _MM_HINT_T0);
  }
}
}  // namespace

// Everything a decode kernel needs. Activations are "prepared" once per call
// by the variant's prepare_acts() into act (layout private to the variant);
// float weight types may read x directly.
struct DecodeCtx {
  DType type;
  const uint8_t* w;    // weight row 0
  size_t w_row_bytes;  // bytes between weight rows
  int64_t K;
  int64_t M;
  const float* x;        // [M][K] f32 activations
  const uint8_t* act;    // prepared activations (nullptr if the kernel reads x)
  size_t act_row_bytes;  // bytes between prepared activation rows
  float* y;              // y[m * ldy + n]
  int64_t ldy;
  const uint8_t* packed = nullptr;  // the packed weight, for a variant that reads it
  size_t packed_group_bytes = 0;
  bool tiles = false;            // packed is the tile layout (the tile kernels read it)
  KOrder korder = KOrder::kVec;  // K-quant weights: which of llama.cpp's sums (kquant_order)
  bool prefetch_l2 = false;      // stream prefetches into L2, not L1 (matmul.cpp kx8_prefetch_l2)
};

// Computes y[0..M)[n0..n1) for the weight rows n0..n1.
using DecodeKernel = void (*)(const DecodeCtx& c, int64_t n0, int64_t n1);
// Bytes of prepared activations per row (0 if the kernel reads x directly).
using ActRowBytesFn = size_t (*)(DType type, int64_t K);
// Prepare M activation rows of x into act (act_row_bytes(type, K) bytes each).
using PrepareActsFn = void (*)(DType type, const float* x, int64_t M, int64_t K, uint8_t* act);
// Dequantize n elements (n a multiple of the type's block size) of contiguous
// weight data to f32 / bf16.
using DequantF32Fn = void (*)(DType type, const void* src, float* dst, int64_t n);
using DequantBf16Fn = void (*)(DType type, const void* src, uint16_t* dst, int64_t n);
// f32 -> bf16 (round to nearest even), n elements.
using F32ToBf16Fn = void (*)(const float* src, uint16_t* dst, int64_t n);

struct IsaImpl {
  const char* name;
  ActRowBytesFn act_row_bytes;
  PrepareActsFn prepare_acts;
  DecodeKernel (*kernel)(DType type);  // nullptr for unsupported types
  DequantF32Fn dequant_f32;
  DequantBf16Fn dequant_bf16;
  F32ToBf16Fn f32_to_bf16;
  bool reads_packed = false;      // its Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 kernels use DecodeCtx::packed when set
  bool reads_packed_kx8 = false;  // its Q4_K / Q6_K kernels read PackedQ4Kx8 / PackedQ6Kx8 groups when set
};

// A variant's prefill dequantization, its IsaImpl's dequant_f32, dequant_bf16
// and f32_to_bf16 (dequant_scalar.cpp, dequant_avx2.cpp; AVX-512's is
// dequant_avx512.inc, compiled with its kernels).
void scalar_dequant_f32(DType type, const void* src, float* dst, int64_t n);
void scalar_dequant_bf16(DType type, const void* src, uint16_t* dst, int64_t n);
void scalar_f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
void avx2_dequant_f32(DType type, const void* src, float* dst, int64_t n);  // only after isa_supported(Isa::kAvx2)
void avx2_dequant_bf16(DType type, const void* src, uint16_t* dst, int64_t n);
void avx2_f32_to_bf16(const float* src, uint16_t* dst, int64_t n);

const IsaImpl& scalar_impl();
const IsaImpl& avx2_impl();
const IsaImpl& avx512_impl();  // only call after isa_supported(Isa::kAvx512Vnni)
// AMX prompt rows (matmul_amx_avx512.cpp; only after amx_prompt_rows(type)
// in matmul.cpp): the types amx_prompt_rows names, GGUF or packed rows.
// Activations for M rows rounded up to a multiple of 16 (the padding zeroed
// by the caller), amx_act_row_bytes each: K int8 values (block b at 32 b),
// then K / 32 f32 scales d, K / 32 f32 sum scales sx (Q4_1 / Q5_1: as the
// Q8_1 activations of the other variants, act_block_scales), then per block
// the int32 sums of its two 16-value halves (the tile layout's kernels take
// the weights' offset off through them); a 64-byte multiple.
namespace {
inline size_t amx_act_row_bytes(int64_t K) {
  return (static_cast<size_t>(K) + 16 * static_cast<size_t>(K / kQK) + 63) & ~size_t{63};
}
}  // namespace
void amx_prepare_acts(const float* x, int64_t M, int64_t K, uint8_t* act);
DecodeKernel amx_kernel_for(DType t);
// Tile-layout weights (DecodeCtx::tiles), the AMX order: on AMX tiles (M
// rows rounded up to 16 as above; only where amx_prompt_rows could hold),
// and on VNNI registers for any M (AVX-512 VNNI), the same bits. Both take
// n0 a multiple of 16 and amx_prepare_acts' rows.
DecodeKernel amx_tile_kernel_for(DType t);
DecodeKernel vnni_tile_kernel_for(DType t);
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 weights in the tile layout on AVX2 CPUs
// (matmul_avx2.cpp; only after isa_supported(Isa::kAvx2)): amx_prepare_acts'
// rows from AVX2 code (the same bytes), and a kernel in the order of
// vnni_tile_kernel, to the bit, 8 weight rows per register. n0 a multiple of
// 16.
inline constexpr bool avx2_tile_type(DType t) { return tile_packable(t); }
void avx2_tile_prepare_acts(const float* x, int64_t M, int64_t K, uint8_t* act);
DecodeKernel avx2_tile_kernel_for(DType t);  // avx2_tile_type(t); nullptr for other types

// K-quants on AVX-512 VNNI CPUs: the AVX2 variant's activations and
// dequantization with these AVX-512 kernels in the AVX2 order (same results).
DecodeKernel avx512_kquant_kernel(DType t);  // only after isa_supported(Isa::kAvx512Vnni)

namespace {

// Natural activation layout shared by the scalar and AVX2 variants, per row:
//   int8  qs[K]            quantized values, block b at qs + 32*b
//   float d[K/32]          block scale (x ~= d * q)
//   float s[K/32]          d * sum(q of the block)
// padded to 64 bytes.
inline size_t q8_natural_row_bytes(int64_t K) {
  const size_t nb = static_cast<size_t>(K / kQK);
  size_t b = static_cast<size_t>(K) + 8 * nb;
  return (b + 63) & ~size_t{63};
}
struct Q8Row {
  const int8_t* qs;
  const float* d;
  const float* s;
};
inline Q8Row q8_natural_row(const uint8_t* act, size_t row_bytes, int64_t K, int64_t m) {
  const uint8_t* base = act + static_cast<size_t>(m) * row_bytes;
  const float* d = reinterpret_cast<const float*>(base + K);
  return {reinterpret_cast<const int8_t*>(base), d, d + K / kQK};
}

// The float arithmetic of one quantized dot product (a weight row of nb
// blocks against a prepared activation row), in the order every variant
// except AVX-512 follows, which is also llama.cpp's AVX2 order
// (ggml_vec_dot_q4_1_q8_1 and friends):
//   per block: 8 integer lanes, lane k = sum of w*a over elements 4k..4k+3,
//              lane_acc[k] = fma(dw*dx, lane_k, lane_acc[k])  (dw*dx exact);
//              Q4_1 also summs += mw * s                        (exact product);
//   result   = ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))  [+ summs for Q4_1].
// Keeping the order identical to the reference makes Ember's logits equal to
// llama.cpp's bit for bit where the rest of the computation matches too.
inline float hsum8_reference(const float l[8]) {
  const float t0 = l[0] + l[4], t1 = l[1] + l[5], t2 = l[2] + l[6], t3 = l[3] + l[7];
  return (t0 + t2) + (t1 + t3);
}
// Q5_0 / Q5_1 follow the same order as Q4_0 / Q4_1 (llama.cpp's
// ggml_vec_dot_q5_0_q8_0 / ggml_vec_dot_q5_1_q8_1 on AVX2).
template <DType T>
inline float quant_dot_reference(const uint8_t* wrow, const Q8Row& a, int64_t nb) {
  static_assert(T == DType::Q4_0 || T == DType::Q4_1 || T == DType::Q8_0 || T == DType::Q5_0 || T == DType::Q5_1);
  constexpr bool kMin = T == DType::Q4_1 || T == DType::Q5_1;  // has a min (and the summs term)
  constexpr size_t kBytes = T == DType::Q4_0   ? sizeof(BlockQ4_0)
                            : T == DType::Q4_1 ? sizeof(BlockQ4_1)
                            : T == DType::Q5_0 ? sizeof(BlockQ5_0)
                            : T == DType::Q5_1 ? sizeof(BlockQ5_1)
                                               : sizeof(BlockQ8_0);
  // offset of the values in a block (after d [, m] [, qh])
  constexpr size_t kQs = T == DType::Q4_1 ? 4 : T == DType::Q5_0 ? 6 : T == DType::Q5_1 ? 8 : 2;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float summs = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = wrow + static_cast<size_t>(b) * kBytes;
    const int8_t* ab = a.qs + b * kQK;
    int w[kQK];
    uint32_t qh = 0;
    if constexpr (T == DType::Q5_0 || T == DType::Q5_1) __builtin_memcpy(&qh, blk + kQs - 4, 4);
    for (int i = 0; i < 16; ++i) {
      if constexpr (T == DType::Q8_0) {
        w[i] = static_cast<int8_t>(blk[kQs + i]);
        w[i + 16] = static_cast<int8_t>(blk[kQs + 16 + i]);
      } else if constexpr (T == DType::Q5_0 || T == DType::Q5_1) {
        const int off = T == DType::Q5_0 ? 16 : 0;
        w[i] = ((blk[kQs + i] & 0x0F) | static_cast<int>(((qh >> i) & 1u) << 4)) - off;
        w[i + 16] = ((blk[kQs + i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4)) - off;
      } else {
        const int off = T == DType::Q4_0 ? 8 : 0;
        w[i] = (blk[kQs + i] & 0x0F) - off;
        w[i + 16] = (blk[kQs + i] >> 4) - off;
      }
    }
    uint16_t h[2];
    __builtin_memcpy(h, blk, kMin ? 4 : 2);
    const float dd = h2f(h[0]) * a.d[b];
    for (int k = 0; k < 8; ++k) {
      int sum = 0;
      for (int i = 4 * k; i < 4 * k + 4; ++i) sum += w[i] * ab[i];
      lanes[k] = __builtin_fmaf(dd, static_cast<float>(sum), lanes[k]);
    }
    if constexpr (kMin) summs += h2f(h[1]) * a.s[b];
  }
  const float r = hsum8_reference(lanes);
  return kMin ? r + summs : r;
}

// An activation block's scale (and sum term) as llama.cpp keeps them: its
// q8_0 / q8_1 blocks store d = amax / 127 in fp16, and q8_1 (the activations
// of Q4_1 weights) also s = d * sum(q) in fp16, computed from the unrounded d.
// Rounding the same way is part of matching llama.cpp's logits bit for bit
// (tools/ref_llamacpp.py logits); the AVX-512 variant's Q4_0 algebra uses
// s = d * sum(q) of the rounded d. A value beyond the fp16 range
// (|x| > 8.3e6) keeps its f32 value instead of becoming inf.
inline float round_act_scale(float v) {
  const float r = h2f(f2h(v));
  return __builtin_isinf(r) ? v : r;
}
inline void act_block_scales(DType type, float amax, int sum, float* d_out, float* s_out) {
  const float d32 = amax / 127.f;
  const float d = round_act_scale(d32);
  *d_out = d;
  *s_out = uses_q8_1(type) ? round_act_scale(d32 * static_cast<float>(sum)) : d * static_cast<float>(sum);
}

// Scalar quantization of one block of 32 floats (Q8_0-style, symmetric,
// round to nearest even), scales as act_block_scales. Shared reference for
// all variants' semantics.
inline void quantize_block_q8_scalar(DType type, const float* x, int8_t* q, float* d_out, float* s_out) {
  float amax = 0.f;
  for (int i = 0; i < kQK; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    amax = a > amax ? a : amax;
  }
  const float id = amax != 0.f ? 127.f / amax : 0.f;
  int sum = 0;
  for (int i = 0; i < kQK; ++i) {
    float v_f = __builtin_nearbyintf(x[i] * id);
    v_f = __builtin_fmaxf(-127.f, __builtin_fminf(127.f, v_f));  // also maps NaN (no UB)
    const int v = static_cast<int>(v_f);
    q[i] = static_cast<int8_t>(v);
    sum += v;
  }
  act_block_scales(type, amax, sum, d_out, s_out);
}

// ---------------------------------------------------------------- K-quants
//
// Activations of K-quant weights are quantized per row to Q8_K blocks of
// 256, exactly as llama.cpp's quantize_row_q8_K_ref (which its x86 build
// uses): the element of largest |x| (first one on ties) gives
// iscale = -127/max, q = min(127, round_half_even(iscale*x)), d = 1/iscale
// (f32, not rounded to fp16; negative when max > 0), and bsums[g] = sum of
// the 16 q of group g. An all-zero block gets d = 0, q = 0, bsums = 0.
struct Q8KBlock {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(Q8KBlock) == 292, "Q8_K block");

inline size_t q8k_row_bytes(int64_t K) {
  const size_t b = static_cast<size_t>(K / kQK_K) * sizeof(Q8KBlock);
  return (b + 63) & ~size_t{63};
}
inline const Q8KBlock* q8k_row(const uint8_t* act, size_t row_bytes, int64_t m) {
  return reinterpret_cast<const Q8KBlock*>(act + static_cast<size_t>(m) * row_bytes);
}

inline void quantize_row_q8k(const float* x, int64_t K, Q8KBlock* y) {
  for (int64_t b = 0; b < K / kQK_K; ++b, x += kQK_K) {
    Q8KBlock& o = y[b];
    float mx = 0.f, amax = 0.f;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = __builtin_fabsf(x[j]);
      if (ax > amax) {
        amax = ax;
        mx = x[j];
      }
    }
    if (amax == 0.f) {
      o.d = 0.f;
      __builtin_memset(o.qs, 0, sizeof(o.qs));
      __builtin_memset(o.bsums, 0, sizeof(o.bsums));
      continue;
    }
    const float iscale = -127.f / mx;
    for (int j = 0; j < kQK_K; ++j) {
      float v = __builtin_nearbyintf(iscale * x[j]);
      v = __builtin_fmaxf(-128.f, __builtin_fminf(127.f, v));  // also maps NaN (no UB)
      o.qs[j] = static_cast<int8_t>(static_cast<int>(v));
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += o.qs[16 * g + i];
      o.bsums[g] = static_cast<int16_t>(sum);
    }
    o.d = 1.f / iscale;
  }
}

// A K-quant super-block unpacked: q[256] unsigned values in element order,
// per-element scale index groups (Q4_K/Q5_K: sc[8], mn[8] per 32 elements;
// Q6_K: sc[16] per 16 elements, values biased by +32; Q3_K: sc[16] signed
// (stored - 32), values biased by +4; Q2_K: sc[16], mn[16] per 16 elements).
template <DType T>
struct KUnpacked {
  uint8_t q[kQK_K];
  int sc[16];
  int mn[16];
  float d, dmin;
};
// Sub-blocks of 16 elements (Q2_K, Q3_K, Q6_K) rather than 32.
inline constexpr bool kquant_sub16(DType t) { return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q6_K; }
// The bias of the unpacked values (subtracted through the activation sums).
inline constexpr int kquant_bias(DType t) { return t == DType::Q6_K ? 32 : t == DType::Q3_K ? 4 : 0; }

template <DType T>
inline void kquant_unpack(const uint8_t* blk, KUnpacked<T>& u) {
  if constexpr (T == DType::Q2_K) {
    BlockQ2_K b;
    __builtin_memcpy(&b, blk, sizeof(b));
    u.d = h2f(b.d);
    u.dmin = h2f(b.dmin);
    for (int i = 0; i < 16; ++i) u.sc[i] = b.scales[i] & 0xF, u.mn[i] = b.scales[i] >> 4;
    for (int e = 0; e < kQK_K; ++e)
      u.q[e] = static_cast<uint8_t>((b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3);
  } else if constexpr (T == DType::Q3_K) {
    BlockQ3_K b;
    __builtin_memcpy(&b, blk, sizeof(b));
    u.d = h2f(b.d);
    u.dmin = 0.f;
    q3k_scales(b.scales, u.sc);
    for (int i = 0; i < 16; ++i) u.sc[i] -= 32;
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, j = (e % 128) / 32, l = e % 32;
      u.q[e] = static_cast<uint8_t>(((b.qs[32 * h + l] >> (2 * j)) & 3) | (((b.hmask[l] >> (4 * h + j)) & 1) << 2));
    }
  } else if constexpr (T == DType::Q6_K) {
    BlockQ6_K b;
    __builtin_memcpy(&b, blk, sizeof(b));
    u.d = h2f(b.d);
    u.dmin = 0.f;
    for (int i = 0; i < 16; ++i) u.sc[i] = b.scales[i];
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* ql = b.ql + 64 * h;
        const uint8_t qh = b.qh[32 * h + l];
        uint8_t* q = u.q + 128 * h;
        q[l] = static_cast<uint8_t>((ql[l] & 0xF) | ((qh & 3) << 4));
        q[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4));
        q[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh >> 4) & 3) << 4));
        q[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4));
      }
  } else {
    static_assert(T == DType::Q4_K || T == DType::Q5_K);
    using B = std::conditional_t<T == DType::Q4_K, BlockQ4_K, BlockQ5_K>;
    B b;
    __builtin_memcpy(&b, blk, sizeof(b));
    u.d = h2f(b.d);
    u.dmin = h2f(b.dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      kquant_scale_min(j, b.scales, &sc, &m);
      u.sc[j] = sc;
      u.mn[j] = m;
    }
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        int lo = b.qs[32 * j + l] & 0xF, hi = b.qs[32 * j + l] >> 4;
        if constexpr (T == DType::Q5_K) {
          lo |= ((b.qh[l] >> (2 * j)) & 1) << 4;
          hi |= ((b.qh[l] >> (2 * j + 1)) & 1) << 4;
        }
        u.q[64 * j + l] = static_cast<uint8_t>(lo);
        u.q[64 * j + 32 + l] = static_cast<uint8_t>(hi);
      }
  }
}

inline constexpr size_t kquant_block_bytes(DType t) {
  return t == DType::Q2_K   ? sizeof(BlockQ2_K)
         : t == DType::Q3_K ? sizeof(BlockQ3_K)
         : t == DType::Q4_K ? sizeof(BlockQ4_K)
         : t == DType::Q5_K ? sizeof(BlockQ5_K)
                            : sizeof(BlockQ6_K);
}

// Whether llama.cpp's AVX2 ggml_vec_dot_q5_K_q8_K's `summs += dmin * isum`
// is a fused multiply-add: GCC contracts it (-ffp-contract=fast, the GNU C
// default, with -mfma), which is how the reference build is compiled.
inline constexpr bool kQ5KSummsFused = true;

// One K-quant dot product (a weight row of nbk super-blocks against a Q8_K
// activation row) in one of llama.cpp's orders (KOrder); every variant
// returns exactly this value. Per super-block the integer part is exact
// whatever the order: with q the unsigned weight values, a the activations,
// per group g of 32 elements
//   gs[g] = sum over its elements of sc * q * a  (sc: the group's scale;
//           Q2_K / Q3_K / Q6_K: each 16-element half's own scale; Q3_K: q - 4),
//   Q6_K: minus 32 * (bsums[2g]*sc[2g] + bsums[2g+1]*sc[2g+1]) (the -32 offset);
//   Q4_K / Q5_K: mg[g] = mn[g] * q8s[g], q8s[g] = bsums[2g] + bsums[2g+1];
//   Q2_K: mg[g] = mn[2g] * bsums[2g] + mn[2g+1] * bsums[2g+1].
// dx: the activation block's d (f32), dw / dmw: the weight's d / dmin (f16).
// The float steps differ:
//  kVec (llama.cpp's AVX2 ggml_vec_dot_q{2,3,4,5,6}_K_q8_K): 8 s32 lanes,
//   lane k collecting elements 4k..4k+3 of every group (Q6_K: minus its two
//   16-element halves' offset terms); lane_acc[k] = fma(dx*dw, float(lane_k),
//   lane_acc[k]), for Q2_K after lane_acc[k] = fma(dmin, float(mg[k]),
//   lane_acc[k]); the min term (Q4_K): 4 f32 lanes, acc_m[k] = fma(dmin,
//   float(mg[2k] + mg[2k+1]), acc_m[k]), summed (m0 + m2) + (m1 + m3);
//   (Q5_K): summs = fma(dmin, float(sum mg), summs); dmin = -(dx * dmw);
//   result = hsum8_reference(lane_acc) + min term.
//  kTiled (ggml-cpu/tiled, its AVX2 and AVX-512 VNNI microtiles alike, as
//   GCC contracts them): per super-block r = float(sum gs) * dw, Q2_K/Q4_K/Q5_K
//   r = fma(-dmw, float(sum mg), r); acc = fma(r, dx, acc); result = acc.
//  kGemv8x8 (ggml_gemv_q4_K_8x8_q8_K): per super-block
//   acc = fma(float(sum gs), dw*dx, acc), accm = fma(float(sum mg), dmw*dx, accm);
//   result = acc - accm.
//  kGemm8x8 (ggml_gemm_q4_K_8x8_q8_K, its AVX2 and AVX-512 paths alike): as
//   kGemv8x8 but one step per pair of groups (64 elements): gs[2p] + gs[2p+1],
//   mg[2p] + mg[2p+1], p = 0..3.
template <DType T>
inline float kquant_dot_reference(const uint8_t* wrow, const Q8KBlock* a, int64_t nbk, KOrder order = KOrder::kVec) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float accm[4] = {0, 0, 0, 0};
  float summs = 0.f, acc = 0.f, acc_min = 0.f;
  KUnpacked<T> u;
  for (int64_t i = 0; i < nbk; ++i) {
    kquant_unpack<T>(wrow + static_cast<size_t>(i) * kquant_block_bytes(T), u);
    const Q8KBlock& y = a[i];
    int sumi[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int gs[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int g = 0; g < 8; ++g)
      for (int k = 0; k < 8; ++k) {
        int s = 0;
        // (Q3_K: the signed values, each lane its own elements' -4 offset)
        for (int e = 32 * g + 4 * k; e < 32 * g + 4 * k + 4; ++e)
          s += (T == DType::Q3_K ? u.q[e] - 4 : u.q[e]) * y.qs[e];
        const int sc = kquant_sub16(T) ? u.sc[(32 * g + 4 * k) / 16] : u.sc[g];
        sumi[k] += sc * s;
        gs[g] += sc * s;
      }
    int mg[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if constexpr (T == DType::Q6_K) {
      for (int k = 0; k < 8; ++k) {
        const int off = 32 * (y.bsums[2 * k] * u.sc[2 * k] + y.bsums[2 * k + 1] * u.sc[2 * k + 1]);
        sumi[k] -= off;
        gs[k] -= off;  // (group k's offset: the same two 16-element halves)
      }
    } else if constexpr (T == DType::Q2_K) {
      for (int g = 0; g < 8; ++g) mg[g] = u.mn[2 * g] * y.bsums[2 * g] + u.mn[2 * g + 1] * y.bsums[2 * g + 1];
    } else if constexpr (T != DType::Q3_K) {
      for (int g = 0; g < 8; ++g) mg[g] = u.mn[g] * static_cast<int16_t>(y.bsums[2 * g] + y.bsums[2 * g + 1]);
    }
    const float dw = u.d, dmw = u.dmin;
    switch (order) {
      case KOrder::kVec: {
        if constexpr (T == DType::Q2_K) {  // the min term first, in the same lanes
          const float dmin = -y.d * dmw;
          for (int k = 0; k < 8; ++k) lanes[k] = __builtin_fmaf(dmin, static_cast<float>(mg[k]), lanes[k]);
        } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
          const float dmin = -y.d * dmw;
          if constexpr (T == DType::Q4_K) {
            for (int k = 0; k < 4; ++k)
              accm[k] = __builtin_fmaf(dmin, static_cast<float>(mg[2 * k] + mg[2 * k + 1]), accm[k]);
          } else {
            int isum = 0;
            for (int g = 0; g < 8; ++g) isum += mg[g];
            summs = kQ5KSummsFused ? __builtin_fmaf(dmin, static_cast<float>(isum), summs)
                                   : summs + dmin * static_cast<float>(isum);
          }
        }
        const float d = y.d * dw;
        for (int k = 0; k < 8; ++k) lanes[k] = __builtin_fmaf(d, static_cast<float>(sumi[k]), lanes[k]);
        break;
      }
      case KOrder::kTiled: {
        int s1 = 0, s2 = 0;
        for (int g = 0; g < 8; ++g) s1 += gs[g], s2 += mg[g];
        float r = static_cast<float>(s1) * dw;
        if constexpr (T != DType::Q6_K && T != DType::Q3_K) r = __builtin_fmaf(-dmw, static_cast<float>(s2), r);
        acc = __builtin_fmaf(r, y.d, acc);
        break;
      }
      case KOrder::kGemv8x8:
      case KOrder::kGemm8x8: {
        const float sd = dw * y.d, sm = dmw * y.d;
        const int steps = order == KOrder::kGemv8x8 ? 1 : 4, per = 8 / steps;
        for (int p = 0; p < steps; ++p) {
          int is = 0, im = 0;
          for (int g = per * p; g < per * (p + 1); ++g) is += gs[g], im += mg[g];
          acc = __builtin_fmaf(static_cast<float>(is), sd, acc);
          acc_min = __builtin_fmaf(static_cast<float>(im), sm, acc_min);
        }
        break;
      }
    }
  }
  switch (order) {
    case KOrder::kVec: {
      const float r = hsum8_reference(lanes);
      if constexpr (T == DType::Q4_K) return r + ((accm[0] + accm[2]) + (accm[1] + accm[3]));
      if constexpr (T == DType::Q5_K) return r + summs;
      return r;
    }
    case KOrder::kTiled: return acc;
    case KOrder::kGemv8x8:
    case KOrder::kGemm8x8: break;
  }
  return acc - acc_min;
}

// Reference dequantization through the type table (used by every variant
// for the types it has no SIMD dequantizer for).
inline void dequant_reference_f32(DType type, const void* src, float* dst, int64_t n) {
  type_traits(type)->dequantize_row(src, dst, n);
}
inline void dequant_reference_bf16(DType type, const void* src, uint16_t* dst, int64_t n) {
  const int64_t bs = weight_block_elems(type);
  const int64_t step = bs >= 256 ? bs : 256;
  float tmp[256];
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; i += step) {
    const int64_t len = n - i < step ? n - i : step;
    type_traits(type)->dequantize_row(p + weight_row_bytes(type, i), tmp, len);
    for (int64_t j = 0; j < len; ++j) dst[i + j] = f2bf(tmp[j]);
  }
}

}  // namespace
}  // namespace ember::cpu::detail
