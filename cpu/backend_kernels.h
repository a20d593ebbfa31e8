// Internal interface between the CPU backend (cpu_backend.cpp, compiled for
// baseline x86-64) and its vector kernels: attention, SwiGLU, the f32 -> f16
// KV stores and the K-shift rotation. The kernels are written once
// (backend_kernels.inc) over an 8-lane vector type and a 16-lane one made of
// two 8-lane halves, and compiled three times:
//   backend_kernels_avx512.cpp  AVX2 8-lane operations, 512-bit wide vectors
//   backend_kernels_avx2.cpp    AVX2 + FMA + F16C intrinsics
//   backend_kernels_scalar.cpp  portable C++ (any x86-64 CPU)
// All perform the same IEEE operations in the same order (fused multiply-
// adds as fmaf, the same reduction trees, the same exp polynomial), so their
// results are bit-identical for every non-NaN input; the scalar variant runs
// where the CPU lacks AVX2/FMA/F16C, or under cpu::force_isa(Isa::kScalar).
// Not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::cpu::detail {

// Attention limits (per-thread stack state of attend_group); the backend
// refuses other shapes before calling it.
inline constexpr int kAttnMaxGroup = 16;     // query heads per kv head
inline constexpr int kAttnMaxHeadDim = 256;  // and head_dim a multiple of 8
inline constexpr int kAttnMaxRows = 8;       // rows attend_rows runs together

// One (query row, kv head) item of CpuBackend::attention; see attend_group
// in backend_kernels.inc for the computation (llama.cpp's, to the bit).
struct AttendArgs {
  const uint8_t* k_base;  // the layer's K blocks: block b at k_base + b * block_bytes
  const uint8_t* v_base;  // the layer's V blocks
  size_t block_bytes;     // num_kv_heads * block_size * row_bytes
  size_t row_bytes;       // one head's K or V row: head_dim f16, or head_dim / 32 Q8_0 blocks
  int32_t block_size;
  const int32_t* block_table;    // the sequence's blocks, by cache slot / block_size
  int32_t hole_begin, hole_end;  // skipped cache slots (empty when equal)
  int32_t window_begin;          // slots below it are skipped too (sliding-window layers; else 0)
  // Token-tree rows: index i >= map_from reads slot slot_map[i - map_from]
  // (AttentionParams::tree_*); map_from = INT32_MAX for an ordinary row.
  int32_t map_from = INT32_MAX;
  const int32_t* slot_map = nullptr;
  const float* q;  // [rows][num_heads][head_dim]
  int32_t row, kvh, num_heads, num_kv_heads, head_dim, kv_len;
  bool vec_order;  // the one-token decode order (else the batched "tile" order)
  float scale;
  float* scores;  // scratch: (num_heads / num_kv_heads) * round_up(kv_len, 32) floats
  float* acc;     // scratch: (num_heads / num_kv_heads) * 32 * head_dim floats
  float* out;     // [rows][num_heads][head_dim]
  // attend_rows: scratch for the rounded queries, (num_heads / num_kv_heads)
  // * kAttnMaxHeadDim floats (attend_group keeps them on its stack).
  float* qbuf = nullptr;
  // attend_phase: the softmax's flags, kAttnMaxGroup of them.
  bool* live = nullptr;
};

// The phases of attend_group (see attend_phase).
enum class AttendPhase : int32_t { kQueries, kScores, kSoftmax, kValues, kOutput };

struct BackendKernels {
  const char* name;
  void (*attend_group)(const AttendArgs& a);  // f16 cache rows
  // The same over Q8_0 cache rows (head_dim a multiple of 32): each element
  // read as d * q, in the same orders (not llama.cpp's q8_0 KV arithmetic).
  void (*attend_group_q8)(const AttendArgs& a);
  // out[i] = SiLU(gate[i]) * up[i] for i in [0, n), n a multiple of 8.
  void (*swiglu8)(const float* gate, const float* up, size_t n, float* out);
  // f32 -> f16, round to nearest even.
  void (*f32_to_f16)(const float* src, uint16_t* dst, int32_t n);
  // Rotates `rows` rows of head_dim f16 values in place: per element
  // x * cs + swap_pairs(x) * sn (one K-shift; cs, sn have head_dim entries).
  void (*rope_shift_rows)(uint16_t* k, size_t rows, int32_t head_dim, const float* cs, const float* sn);
  // attend_group for n items, each with its own scratch (qbuf included),
  // results to the bit attend_group's. Items of one sequence's cache (same
  // blocks, hole and kv head), one order and no window read the slots they
  // all see (below every kv_len and map_from) once for all of them, in
  // cache-sized ranges: the rows of a token tree, or of a prompt chunk.
  void (*attend_rows)(const AttendArgs* a, int32_t n);
  void (*attend_rows_q8)(const AttendArgs* a, int32_t n);
  // One phase of attend_group, part `part` of n_parts (scores: ranges of
  // slots; values: ranges of accumulator lanes; the other phases whole), so
  // that the threads can share one item; every part of a phase must end
  // before the next phase starts. Uses qbuf and live. The same bits as
  // attend_group.
  void (*attend_phase)(const AttendArgs& a, AttendPhase phase, int32_t part, int32_t n_parts);
  void (*attend_phase_q8)(const AttendArgs& a, AttendPhase phase, int32_t part, int32_t n_parts);
};

const BackendKernels& backend_kernels_scalar();
const BackendKernels& backend_kernels_avx2();    // only call after isa_supported(Isa::kAvx2)
const BackendKernels& backend_kernels_avx512();  // only call after isa_supported(Isa::kAvx512Vnni)
// The variant for cpu::active_isa() (all three give the same bits).
const BackendKernels& backend_kernels();

}  // namespace ember::cpu::detail
