// CPU matmul for linear layers: y[M, N] = x[M, K] · W[N, K]^T.
//
// W is a GGUF weight (N rows of K elements, row-major, in its on-disk block
// format: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16
// or F32);
// x and y are f32 row-major.
//
// Two paths, chosen by M:
//  * decode (M <= decode_max_m()): Ember's own SIMD kernels read the weight
//    blocks directly. For quantized weights the activation rows are quantized
//    once per call to 8-bit blocks of 32 (int8 + f32 scale, + block sum for
//    the Q4 offset/min terms; K-quants: llama.cpp's Q8_K blocks of 256 with
//    16-element sums) and the dot products are integer (AVX2
//    maddubs/madd, AVX-512 VNNI dpbusd). Every weight block loaded is used
//    for all M activation rows. OpenMP over output rows. Q4_0 / Q4_1 / Q5_0
//    / Q5_1 / Q8_0 have scalar, AVX2 and AVX-512 kernels (on the tile layout,
//    by default, the AVX2 and AVX-512 ones in an order of their own, each row
//    independent of M: tile_layout); the K-quants scalar, AVX2
//    and AVX-512 ones, all summing in the order llama.cpp's x86 build uses
//    for the rows' kind (RowKind below). (Q4_K / Q6_K weights with rows % 8
//    == 0 are read from their packed copy on AVX2 and AVX-512 CPUs: same
//    results.)
//  * prefill (larger M): W is dequantized (SIMD, in row tiles) into the
//    scratch and multiplied with oneDNN's matmul primitive (bf16 where the
//    CPU has native AVX512_BF16/AMX, f32 otherwise), f32 output.
//
// Thread-safety: matmul() may be called concurrently from several threads as
// long as each uses its own MatmulScratch. The force_isa / set_* knobs are
// process-wide and meant for tests, benchmarks and start-up configuration.
// Errors are reported by throwing ember::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/tensor/types.h"
#include "cpu/cpu_features.h"

namespace ember::cpu {

struct WeightView {
  DType type;
  int64_t rows;  // N (output features)
  int64_t cols;  // K (input features); a multiple of the block size (32; 256 for K-quants)
  const void* data;
  // Optional: the rows packed by pack_weight() (kernels that read them do;
  // the others, and dequantize_rows, use data). Same results either way,
  // except for the tile layout below.
  const void* packed = nullptr;
  // packed holds (pack_weight: is to hold) the tile layout (tile_layout()):
  // every row, decode or prompt, of such a weight is summed in the AMX
  // order, on AMX tiles, VNNI registers or (Q4_0) AVX2 registers alike.
  // Such weights need an AVX2 CPU (the AVX2 or AVX-512 VNNI kernels read
  // them); elsewhere matmul fails with kUnsupported.
  bool packed_tiles = false;
};

// Reusable per-caller buffers (quantized activations, dequantized weight
// tiles, the oneDNN stream). Grows on demand and keeps its memory; not
// thread-safe: one scratch per thread of control that calls matmul().
class MatmulScratch {
 public:
  MatmulScratch();
  ~MatmulScratch();
  MatmulScratch(MatmulScratch&&) noexcept;
  MatmulScratch& operator=(MatmulScratch&&) noexcept;
  MatmulScratch(const MatmulScratch&) = delete;
  MatmulScratch& operator=(const MatmulScratch&) = delete;

  size_t bytes_reserved() const;  // memory currently held
  void release();                 // free everything

  struct Impl;
  Impl& impl();

 private:
  std::unique_ptr<Impl> impl_;
};

// Bytes of a packed copy of a weight that the active kernels stream faster
// (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 on AVX-512 VNNI CPUs: four blocks' quants in one
// 64-byte load, their scales (and Q5's fifth bits as byte masks) together; Q4_K and Q6_K with rows % 8 == 0 on AVX2 and
// AVX-512 CPUs: eight rows' super-blocks interleaved, 1.06x / 1.01x
// the GGUF rows; about the weight's own size), or 0 when they read the GGUF
// layout as fast (other types, other CPUs, EMBER_CPU_REPACK=0).
size_t packed_bytes(DType type, int64_t rows, int64_t cols);
// The same for the tile layout (`tiles`; 0 for other types, where neither
// the AVX-512 VNNI variant nor the AVX2 variant (Q4_0: weights whose row
// count is a multiple of 8) is active, or with EMBER_CPU_REPACK=0; Q4_K /
// Q6_K: their groups of 8, as above):
// groups of 16 rows, per 32-value block the 16 rows' quants as AMX B tiles
// and VNNI operands want them (Q5: and their fifth bits as byte masks), then
// the blocks' 16 f16 scales (and mins): 1.0x the GGUF rows, padded to 16
// rows.
size_t packed_bytes(DType type, int64_t rows, int64_t cols, bool tiles);
// Whether a weight of this type packed now gets the tile layout: Q4_0,
// Q4_1, Q5_0, Q5_1 and Q8_0 wherever the AVX-512 VNNI variant is active
// (with or without AMX); Q4_K and Q6_K where amx_prompt_rows(type) (AMX
// CPUs), keeping their packed groups of 8 rows (already B tiles: the same
// bytes as packed_bytes(type, rows, cols)), read the same way. Such a
// weight's rows all take the AMX order (below), decode rows included: on
// tiles for calls of many rows (many sessions, a verification tree, a
// prompt chunk) where AMX runs, on VNNI registers for a few rows and on
// CPUs without AMX, to the same bits. EMBER_CPU_AMX=0 (or
// set_amx_prompt_rows(false)) turns it off: the groups of 4 rows above in
// their own order on AVX-512, llama.cpp's orders for K-quants. Where the
// AVX2 variant is active: Q4_0 (weights whose row count is a multiple of 8,
// packed_bytes: for them this is the order of llama.cpp's AVX2 build, which
// repacks them to q4_0_8x8), Q4_1, Q5_0, Q5_1 and Q8_0 (weights of K <= 1024:
// longer rows decode faster from the GGUF rows), read by AVX2
// kernels to the same bits as the AVX-512 ones (1.5-2.2x faster than the GGUF
// rows on prompt rows); EMBER_CPU_AMX=0 turns it off there too, and the AVX2
// variant's GGUF rows then have llama.cpp's AVX2 orders for every type
// (Q4_0: vec_dot's).
bool tile_layout(DType type);
// Writes that copy of w's rows to out (packed_bytes() bytes, 64-byte aligned;
// the tile layout when w.packed_tiles). The layout is a run of groups of 16
// (tiles), 8 (Q4_K/Q6_K) or 4 rows: packing rows [r0, r1) of w (r0 a
// multiple of 16) into out + packed_bytes(type, r0, cols[, tiles]) writes
// the same bytes as packing the whole.
void pack_weight(const WeightView& w, void* out);
// Rows [row_begin, row_begin + n_rows) of a packed weight (w.packed, as
// pack_weight wrote it for w's type and shape) written back in the GGUF
// layout to out: the bytes pack_weight read, exactly. (The embedding lookup
// of a tied table whose GGUF pages were released.)
void unpack_rows(const WeightView& w, int64_t row_begin, int64_t n_rows, void* out);

// True for the weight types matmul() and dequantize_rows() accept.
bool matmul_supports(DType type);

// AMX prompt rows (on by default; EMBER_CPU_AMX=0 or set_amx_prompt_rows(false)
// turns them off): prompt rows (RowKind::kPrompt, not kPromptNoTiles) of
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K weights run on AMX tiles when
// the AVX-512 variant is active on a CPU with AMX-INT8 whose OS grants the
// tile state. Their order: the activations quantized per 32-value block as
// for every variant (also for K-quants: not Q8_K), then per output the
// 32-value blocks in order, acc = fma(float(s), dw * dx, acc) from 0, s the
// block's exact int32 dot product of the values (q - 8 for Q4_0, q - 16 for
// Q5_0, q - 32 for Q6_K, q otherwise), dw the block's scale (Q4_K: d * sc,
// an f32 product); for Q4_1 / Q5_1 / Q4_K then acc = fma(m, sx, acc) with m
// the block's min (Q4_1 / Q5_1: m; Q4_K: -(dmin * mn)) and sx the activation
// block's sum scale (as the Q8_1 activations of the other variants); for
// Q6_K s is the exact s1 * sc1 + s2 * sc2 of the block's two 16-value
// sub-blocks and dw = d. A row never depends on its batch or on M. It is
// not the decode rows' order (except for weights in the tile layout, whose
// decode rows take it too: tile_layout): the engine gives every row its kind by what
// the row is (a generated token fed back: a decode; a prompt or scored row:
// a prompt row, even alone in its chunk; core/model/arch/decoder.cpp
// Decoder::decode_row), so a stream's results never depend on its chunking.
// With AMX off prompt rows take the variant's kernels: llama.cpp's orders on
// the AVX2 and scalar variants and for K-quants everywhere.
// amx_prompt_rows(type): whether this type's prompt rows run on AMX now.
bool amx_prompt_rows(DType type);
// Turns AMX prompt rows on or off for the process (tests, benchmarks);
// returns whether they can run here at all (CPU, OS, active variant aside).
bool set_amx_prompt_rows(bool on);
void reset_amx_prompt_rows();  // back to EMBER_CPU_AMX's choice (default: on)

// Which kernels matmul() uses.
enum class MatmulPath : int {
  kAuto = 0,          // decode kernels up to decode_max_m(), oneDNN above
  kRowInvariant = 1,  // always Ember's kernels: every row is computed exactly as
                      // for M = 1, whatever M is (batch-invariant results)
};

// What the rows of a call are, for K-quant weights (Q2_K ... Q6_K),
// which Ember's kernels sum in the order llama.cpp's x86 CPU backend uses for
// such rows (detail::kquant_order; the other types have one order):
//  * kPrompt: prompt / scored rows, llama.cpp's batched kernels (Q4_K with
//    N % 8 == 0: its repacked q4_K_8x8 GEMM; others: its "tiled" kernels);
//  * kDecode: generated tokens fed back one at a time, llama.cpp's one-row
//    batches (Q4_K with N % 8 == 0: the q4_K_8x8 GEMV; others: ggml_vec_dot).
// Either way every row is computed independently of M and of the other rows.
// (llama.cpp itself picks by batch: GEMM for rows in groups of 4 and GEMV for
// the last M % 4, tiled only for 8+ rows; its batches whose rows all take the
// batched kernels give exactly Ember's kPrompt rows.) oneDNN (the prefill
// path for large M with MatmulPath::kAuto) has no such order.
// kPromptNoTiles: prompt rows as kPrompt, but never on AMX tiles (the
// variant's own kernels): for hosts that price a step by its rows (manual
// steps in a frame budget), where a few AMX prompt rows cost several decode
// steps.
enum class RowKind : int { kPrompt = 0, kDecode = 1, kPromptNoTiles = 2 };

// y[M, N] = x[M, K] · W^T. x must not alias y. M >= 0 (M == 0 is a no-op).
// Uses up to omp_get_max_threads() threads.
void matmul(const WeightView& w, const float* x, int64_t M, float* y, MatmulScratch& scratch,
            MatmulPath path = MatmulPath::kAuto, RowKind rows = RowKind::kPrompt);

// y[i][M, N_i] = x[M, K] · W_i^T for n weights that read the same x (Q, K
// and V; gate and up): when every W_i takes the decode path, their rows are
// one pool of chunks run in one parallel region (one fork/join instead of
// n), the activations prepared once per weight format. Every row is computed
// exactly as matmul() computes it. All W_i must have the same K; y[i] must
// not alias x or each other. 1 <= n <= kMaxGroup.
constexpr int kMaxGroup = 4;
void matmul_group(const WeightView* w, float* const* y, int n, const float* x, int64_t M, MatmulScratch& scratch,
                  MatmulPath path = MatmulPath::kAuto, RowKind rows = RowKind::kPrompt);

// Dequantize rows [row_begin, row_begin + n_rows) of W to f32:
// out[(r - row_begin) * K + k]. Used for embedding lookups. Single-threaded.
void dequantize_rows(const WeightView& w, int64_t row_begin, int64_t n_rows, float* out);

// ---- variant selection (tests, benchmarks, configuration) ----

// The variant matmul() uses now: best_isa() unless forced.
Isa active_isa();
const char* isa_name();  // isa_to_string(active_isa())
// Force a variant; throws ember::Error(kUnsupported) when this CPU cannot run it.
void force_isa(Isa isa);
void reset_isa();  // back to best_isa()

// Largest M handled by the decode kernels for a weight type; larger M goes
// to oneDNN. Defaults were picked by measurement (bench_kernels --sweep):
// where oneDNN runs in f32 (CPUs without native bf16, e.g. AVX2-only), the
// int8 decode kernels (2x the multiply-adds per instruction of f32 FMA) stay
// >= 1.25x faster than dequantize + oneDNN f32 up to M ~ 32..128, so
// quantized types default to 32 and float types to 16. Where oneDNN runs in
// bf16 (AVX512_BF16 / AMX) the defaults are 16 and 8 -- an estimate, not
// measured yet (no such CPU was available): re-run the sweep there.
int64_t decode_max_m(DType type);
// The smallest decode_max_m(type) over all types: a caller that needs every
// row to take the decode path (e.g. rows that are independent decodes and
// must not depend on the batch size) splits M into chunks of this size.
int64_t decode_max_m();
void set_decode_max_m(int64_t m);  // override for all types (0: always oneDNN; INT64_MAX: always decode)
void reset_decode_max_m();         // back to the defaults

// Precision of the oneDNN (prefill) path.
enum class PrefillPrecision : int {
  kAuto = 0,  // bf16 when the CPU has native AVX512_BF16 or AMX-BF16, else f32
  kF32 = 1,
  kBf16 = 2,  // bf16 if oneDNN can build it on this CPU, otherwise f32
};
void set_prefill_precision(PrefillPrecision p);
PrefillPrecision prefill_precision();
// What the prefill path actually uses for this process: "bf16" or "f32".
const char* prefill_precision_name();

}  // namespace ember::cpu
