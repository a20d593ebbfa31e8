#include "cpu/matmul.h"

#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/util/status.h"
#include "cpu/cpu_features.h"
#include "cpu/dnnl_matmul.h"
#include "cpu/matmul_internal.h"
#include "cpu/scratch_buffer.h"

namespace ember::cpu {
namespace {

// ---------------------------------------------------------------- knobs

std::atomic<int> g_forced_isa{-1};
std::atomic<int64_t> g_decode_max_m{-1};  // < 0: per-type defaults
std::atomic<int> g_prefill_precision{static_cast<int>(PrefillPrecision::kAuto)};

// K-quants on AVX-512 CPUs: the AVX2 variant's Q8_K activations and
// dequantization, the AVX-512 kernels. Q4_K / Q6_K weights whose rows are
// packed in 8-row groups (PackedQ4Kx8 / PackedQ6Kx8) are read from that copy
// for every row kind and M: measured on a Sapphire Rapids Xeon, 2 threads,
// 1B-shape Q4_K_M (`ember bench`), one decode row 21.8 tokens/s from the
// packed groups vs 20.0 from the GGUF rows, 2 sessions 32.6 vs 29.5, 3
// sessions 47.0 vs 40.6 (aggregate). Both compute every row in the order
// DecodeCtx::korder names, to the bit (tests/ops/test_matmul.cpp:
// EmulatedAvx512KQuants, PackedQ4KRowsGiveIdenticalResults).
const detail::IsaImpl& avx512_kquant_impl() {
  static const detail::IsaImpl impl = [] {
    detail::IsaImpl t = detail::avx2_impl();
    t.name = "avx512_vnni";
    t.kernel = detail::avx512_kquant_kernel;
    t.reads_packed_kx8 = true;
    return t;
  }();
  return impl;
}

// The variant computing `type` on `isa`: the AVX-512 variant has no kernels
// for Q2_K / Q3_K (they run the AVX2 kernels on AVX-512 CPUs) and its own
// Q4_K / Q5_K / Q6_K kernels only (AVX2 activations and dequantization).
const detail::IsaImpl& isa_impl(Isa isa, DType type) {
  switch (isa) {
    case Isa::kAvx512Vnni:
      if (detail::is_kquant(type))
        return detail::has_avx512_kquant_kernels(type) ? avx512_kquant_impl() : detail::avx2_impl();
      return detail::avx512_impl();
    case Isa::kAvx2: return detail::avx2_impl();
    case Isa::kScalar: break;
  }
  return detail::scalar_impl();
}

bool use_bf16_prefill() {
  switch (static_cast<PrefillPrecision>(g_prefill_precision.load(std::memory_order_relaxed))) {
    case PrefillPrecision::kF32: return false;
    case PrefillPrecision::kBf16: return dnnl_mm::bf16_supported();
    case PrefillPrecision::kAuto: break;
  }
  return dnnl_mm::bf16_native() && dnnl_mm::bf16_supported();
}

// ---------------------------------------------------------------- helpers

void check_weight(const WeightView& w, const char* what) {
  if (!matmul_supports(w.type))
    fail(StatusCode::kUnsupported,
         std::string(what) + ": unsupported weight type " + type_name(static_cast<uint32_t>(w.type)));
  if (w.rows < 0 || w.cols <= 0)
    fail(StatusCode::kInvalidArgument,
         std::string(what) + ": bad weight shape " + std::to_string(w.rows) + "x" + std::to_string(w.cols));
  const int64_t block = detail::weight_block_elems(w.type);
  if (w.cols % block != 0)
    fail(StatusCode::kInvalidArgument, std::string(what) + ": K=" + std::to_string(w.cols) +
                                           " is not a multiple of the block size " + std::to_string(block));
  if (!w.data && w.rows > 0) fail(StatusCode::kInvalidArgument, std::string(what) + ": null weight data");
  const bool kx8 = (w.type == DType::Q4_K || w.type == DType::Q6_K) && w.rows % detail::kKx8PackRows == 0;
  if (w.packed_tiles && !detail::tile_packable(w.type) && !kx8)
    fail(StatusCode::kInvalidArgument, std::string(what) + ": no tile layout for " +
                                           type_name(static_cast<uint32_t>(w.type)) + " weights of " +
                                           std::to_string(w.rows) + " rows");
  // (the tile kernels: AVX-512 VNNI and AVX2)
  if (w.packed && w.packed_tiles && !isa_supported(Isa::kAvx512Vnni) &&
      !(detail::avx2_tile_type(w.type) && isa_supported(Isa::kAvx2)))
    fail(StatusCode::kUnsupported, std::string(what) + ": this CPU has no kernels for tile-layout " +
                                       type_name(static_cast<uint32_t>(w.type)) + " weights");
}

// Points the kernel at the packed rows when it reads them.
void use_packed(const detail::IsaImpl& impl, const WeightView& w, detail::DecodeCtx& c) {
  if (w.packed && w.packed_tiles) {
    c.packed = static_cast<const uint8_t*>(w.packed);
    c.packed_group_bytes = detail::tile_packable(w.type) ? detail::tile_group_bytes(w.type, w.cols)
                                                         : detail::kx8_group_bytes(w.type, w.cols);
    c.tiles = true;
    return;
  }
  if (w.packed && impl.reads_packed_kx8 && detail::kx8_group_bytes(w.type, w.cols) &&
      w.rows % detail::kKx8PackRows == 0) {
    c.packed = static_cast<const uint8_t*>(w.packed);
    c.packed_group_bytes = detail::kx8_group_bytes(w.type, w.cols);
    return;
  }
  if (!w.packed || !impl.reads_packed || !detail::packable(w.type)) return;
  c.packed = static_cast<const uint8_t*>(w.packed);
  c.packed_group_bytes = detail::packed_group_bytes(w.type, w.cols);
}

bool repack_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("EMBER_CPU_REPACK");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// Prompt rows of Q4_0 / Q8_0 weights through AMX tiles (their own order,
// matmul_amx_avx512.cpp; cpu/matmul.h): possible on CPUs with AMX-INT8 whose
// OS grants the tile state (asked once); on unless EMBER_CPU_AMX=0 or
// set_amx_prompt_rows(false).
bool amx_usable() {
  static const bool ok = [] {
    const CpuFeatures& f = cpu_features();
    if (!f.amx_tile || !f.amx_int8 || !isa_supported(Isa::kAvx512Vnni)) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}
std::atomic<int> g_amx_on{-1};  // set_amx_prompt_rows; -1: EMBER_CPU_AMX decides
bool amx_on() {
  static const bool env = [] {
    const char* e = std::getenv("EMBER_CPU_AMX");
    return !(e && std::string(e) == "0");
  }();
  const int v = g_amx_on.load(std::memory_order_relaxed);
  return v < 0 ? env : v == 1;
}

// K-quant calls of at most this many rows on AVX-512 CPUs take the AVX2
// variant's kernels: the same order (kquant_order) and bits, the same
// activations and packed groups. On Zen 4 (512-bit instructions in two
// halves) they are faster up to 3 rows (`bench_kernels --isa avx2|avx512
// --threads 1 --cpu-time --types q4_K,q6_K --sweep --sweep-m 1,2,3,4,16
// --sweep-shape 2048x8192`, us, AVX-512 -> AVX2: Q4_K M = 1 774 -> 534, 2
// 883 -> 756, 3 904 -> 870, 4 929 -> 808, 16 2377 -> 2884; Q6_K 1210 -> 939,
// 1267 -> 1047, 1484 -> 1234, 1521 -> 1501, 3420 -> 4077); on Ice Lake one
// row was level (1B Q4_K_M decode 21.0 tok/s AVX2, 20.4 AVX-512), so one
// row there. EMBER_CPU_KQUANT_AVX2_ROWS=N sets it (0: never).
int64_t kquant_avx2_rows() {
  static const int64_t rows = [] {
    if (const char* e = std::getenv("EMBER_CPU_KQUANT_AVX2_ROWS")) {
      char* end = nullptr;
      const long v = std::strtol(e, &end, 10);
      if (end != e && *end == '\0' && v >= 0 && v <= 1024) return static_cast<int64_t>(v);
    }
    return int64_t{avx512_double_pumped() ? 3 : 1};
  }();
  return rows;
}

// Whether the kernels that prefetch the next blocks of a packed stream (the
// K-quant 8-row groups, the AVX2 Q4_0 tiles) prefetch into L2, else L1.
// AMD Zen 4, 1B-shape Q4_K_M, `ember bench -p 16 -n 128 -t 2`, decode tok/s
// in three alternations, L1 / L2 / none: 25.2 / 34.6 / 31.0, 25.5 / 32.6 /
// 32.5, 25.8 / 37.7 / 36.0; five more L1 / L2: median 29.7 / 37.8; 16
// sessions (`--sessions 16 -n 64`, steady tok/s) 95.6 / 115.2 / 110.9, 106.2
// / 125.3 / 118.7 (the AVX2 Q4_0 tiles: matmul_avx2.cpp q40_tile_rows).
// There the L1 prefetches hold the loads behind their misses. On Ice Lake L1 was measured against none
// (matmul_internal.h), not against L2, so Intel CPUs keep it; AMD CPUs other than Zen 4 were not measured.
// EMBER_CPU_KX8_PREFETCH=l1|l2 sets it.
bool kx8_prefetch_l2() {
  static const bool l2 = [] {
    if (const char* e = std::getenv("EMBER_CPU_KX8_PREFETCH")) {
      if (std::strcmp(e, "l1") == 0) return false;
      if (std::strcmp(e, "l2") == 0) return true;
    }
    return amd_cpu();
  }();
  return l2;
}

// Tile-layout weights: calls of fewer rows take the VNNI registers (the same
// bits), faster there than the tiles (1B-shape Q4_0, `ember bench -p P -n 1`,
// prefill tok/s VNNI vs tiles: P = 2: 66 vs 40; 8: 168 vs 138; 12: 208 vs
// 174; 16: 219 vs 236; 32: 280 vs 319).
constexpr int64_t kTileRowsMin = 16;

// Tile-layout weights under the AVX2 variant (or the scalar one
// forced after packing) take the AVX2 tile kernel (matmul_avx2.cpp), the
// others the AVX-512 ones: the same bits.
bool avx2_tiles(DType type) { return detail::avx2_tile_type(type) && active_isa() != Isa::kAvx512Vnni; }
// The weights the AVX2 variant packs in the tile layout: Q4_0 with rows % 8
// == 0 (llama.cpp's q4_0_8x8 weights), Q4_1 / Q5_0 / Q5_1 of any shape, Q8_0
// with K <= kAvx2TileQ80MaxK. Longer Q8_0 rows decode faster from the GGUF
// rows (their kernel reads 4 rows and prefetches the next 4: more streams than
// a group of the layout): 1B shape, K = 2048 / 8192, `EMBER_CPU_ISA=avx2
// ember bench -p 1 -n 32 -t 2`, median of 3, 31.8 tok/s on the layout
// against 39.4 on the GGUF rows (prefill 104 against 76 tok/s); Gemma 3
// 270M, K = 640 (its Q8_0 head), the layout 102.4 against 91.8, 16 sessions
// 291.5 against 237.2.
constexpr int64_t kAvx2TileQ80MaxK = 1024;
bool avx2_tile_weight(DType type, int64_t rows, int64_t cols) {
  if (type == DType::Q8_0) return cols <= kAvx2TileQ80MaxK;
  return detail::avx2_tile_type(type) && (type != DType::Q4_0 || rows % 8 == 0);
}

bool amx_rows(DType type, RowKind rows) {
  return rows == RowKind::kPrompt && amx_prompt_rows(type);
}  // not kPromptNoTiles

// Threads worth waking for a decode call that streams `bytes` of weights.
int decode_threads(size_t bytes, int64_t M) {
  const int max_t = omp_get_max_threads();
  if (max_t <= 1) return 1;
  // ~32 KiB of weights (times M) per thread amortizes the fork/join (~2 us).
  const size_t work = bytes * static_cast<size_t>(std::min<int64_t>(M, 4));
  const size_t t = work / (32 * 1024);
  return static_cast<int>(std::clamp<size_t>(t, 1, static_cast<size_t>(max_t)));
}

void run_decode_group(const WeightView* w, float* const* y, int n, const float* x, int64_t M, RowKind rows,
                      MatmulScratch::Impl& s);
void run_prefill(const detail::IsaImpl& impl, const WeightView& w, const float* x, int64_t M, float* y,
                 MatmulScratch::Impl& s);
int64_t decode_chunk_rows(int64_t N, int nt, int64_t granule);

}  // namespace

// ---------------------------------------------------------------- MatmulScratch

struct DecodeChunk {
  int32_t weight;
  int64_t n0, n1;
};

struct MatmulScratch::Impl {
  ScratchBuffer act;                // prepared activations (decode)
  std::vector<DecodeChunk> chunks;  // matmul_group's work list
  ScratchBuffer wtile;              // dequantized weight tile (prefill)
  ScratchBuffer xconv;              // activations converted to bf16 (prefill / dpbf16)
  dnnl_mm::StreamHolder stream;
};

MatmulScratch::MatmulScratch() : impl_(std::make_unique<Impl>()) {}
MatmulScratch::~MatmulScratch() = default;
MatmulScratch::MatmulScratch(MatmulScratch&&) noexcept = default;
MatmulScratch& MatmulScratch::operator=(MatmulScratch&&) noexcept = default;
MatmulScratch::Impl& MatmulScratch::impl() {
  if (!impl_) impl_ = std::make_unique<Impl>();  // after a move-from
  return *impl_;
}
size_t MatmulScratch::bytes_reserved() const {
  if (!impl_) return 0;
  return impl_->act.capacity() + impl_->wtile.capacity() + impl_->xconv.capacity();
}
void MatmulScratch::release() {
  if (!impl_) return;
  impl_->act.release();
  impl_->wtile.release();
  impl_->xconv.release();
}

namespace {

// Rows per work item for a decode call on nt threads: several items per
// thread (multiples of 8 rows; 16 for tile-layout weights, a group), handed
// out dynamically so that a thread slowed down by another process does not
// hold up the call.
int64_t decode_chunk_rows(int64_t N, int nt, int64_t granule) {
  const int64_t chunks_wanted = static_cast<int64_t>(nt) * 4;
  const int64_t chunk = (N + chunks_wanted - 1) / chunks_wanted;
  return std::max<int64_t>(granule, (chunk + granule - 1) / granule * granule);
}

// Many-row calls (prompt chunks, many sessions' decode rows) run in cache
// blocks: a block of weight rows (<= kBlockWeightBytes, L2) against a block
// of activation rows (<= the kernel's act_block_bytes), so that neither
// streams from L3 or DRAM once per row of the other. Every output is still
// computed by the same kernel call on its own row and weight row, so the
// results do not depend on the blocking (or on M).
constexpr size_t kBlockWeightBytes = size_t{192} << 10;
constexpr size_t kBlockActBytes = size_t{96} << 10;
constexpr size_t kBlockActBytesQ4KPrompt = size_t{24} << 10;

// The activation block of a kernel's many-row calls, chosen with the kernel.
// The AVX-512 Q4_K packed prompt tiles (kGemm8x8) take smaller blocks (8 rows
// at K = 4096): `bench_kernels --threads 1 --cpu-time --types q4_K --hot
// --sweep --sweep-m 512 --sweep-shape 1024x4096`, 8 alternations, 27.4 ->
// 25.3 ms (min), 32.7 -> 30.1 (median) on Ice Lake-SP. The Q6_K tiles did not
// change with them; the other kernels were not measured with them.
size_t act_block_bytes(const detail::DecodeCtx& c, const detail::IsaImpl* impl) {
  const bool q4k_prompt_tiles =
      c.packed && c.korder == detail::KOrder::kGemm8x8 && impl == &isa_impl(Isa::kAvx512Vnni, c.type);
  return q4k_prompt_tiles ? kBlockActBytesQ4KPrompt : kBlockActBytes;
}

void run_kernel_blocked(detail::DecodeKernel kernel, const detail::DecodeCtx& c, size_t act_block, int64_t n0,
                        int64_t n1) {
  const size_t arow = c.act ? c.act_row_bytes : static_cast<size_t>(c.K) * sizeof(float);
  int64_t mb = static_cast<int64_t>(act_block / std::max<size_t>(arow, 1)) & ~int64_t{3};
  mb = std::max<int64_t>(mb, 8);
  if (c.M <= mb) {
    kernel(c, n0, n1);
    return;
  }
  const int64_t nb =  // (a multiple of 16: packed groups of 8 and 16 rows stay whole)
      std::max<int64_t>(16,
                        static_cast<int64_t>(kBlockWeightBytes / std::max<size_t>(c.w_row_bytes, 1)) & ~int64_t{15});
  for (int64_t nn = n0; nn < n1; nn += nb) {
    const int64_t ne = std::min(n1, nn + nb);
    for (int64_t m0 = 0; m0 < c.M; m0 += mb) {
      detail::DecodeCtx b = c;
      b.M = std::min(mb, c.M - m0);
      b.x = c.x + m0 * c.K;
      if (c.act) b.act = c.act + static_cast<size_t>(m0) * c.act_row_bytes;
      b.y = c.y + m0 * c.ldy;
      kernel(b, nn, ne);
    }
  }
}

// The AMX kernel takes all M rows at once: it forms each block's weight
// tile once for all of them.
void run_kernel(detail::DecodeKernel kernel, const detail::DecodeCtx& c, bool amx, size_t act_block, int64_t n0,
                int64_t n1) {
  if (amx)
    kernel(c, n0, n1);
  else
    run_kernel_blocked(kernel, c, act_block, n0, n1);
}

void run_decode_group(const WeightView* w, float* const* y, int n, const float* x, int64_t M, RowKind rows,
                      MatmulScratch::Impl& s) {
  const int64_t K = w[0].cols;
  const detail::IsaImpl* impls[kMaxGroup];
  size_t act_off[kMaxGroup], arb[kMaxGroup];
  bool owner[kMaxGroup];  // prepares its activation rows (the others share an earlier weight's)
  bool amx[kMaxGroup];    // the AMX order's activations (AMX prompt rows, tile-layout weights)
  bool tiles[kMaxGroup];  // on AMX tiles (else VNNI registers, or the variant's kernels)
  size_t act_bytes = 0, total_weight_bytes = 0;
  // AMX reads activation rows 16 at a time: the last tile's rows past M are zero.
  const int64_t m_amx = (M + 15) / 16 * 16;
  for (int i = 0; i < n; ++i) {
    impls[i] = &isa_impl(active_isa(), w[i].type);
    if (active_isa() == Isa::kAvx512Vnni && detail::is_kquant(w[i].type) && M <= kquant_avx2_rows())
      impls[i] = &detail::avx2_impl();
    if (w[i].packed && w[i].packed_tiles) {
      amx[i] = true;
      tiles[i] = M >= kTileRowsMin && rows != RowKind::kPromptNoTiles && amx_usable() && !avx2_tiles(w[i].type);
    } else {
      amx[i] = tiles[i] = amx_rows(w[i].type, rows);
    }
    arb[i] = amx[i] ? detail::amx_act_row_bytes(K) : impls[i]->act_row_bytes(w[i].type, K);
    owner[i] = true;
    for (int j = 0; j < i && owner[i]; ++j) {  // same kernels, same format: share the rows
      if (owner[j] && amx[j] == amx[i] && (amx[i] || (impls[j] == impls[i] && w[j].type == w[i].type))) {
        owner[i] = false;
        act_off[i] = act_off[j];
      }
    }
    if (owner[i]) {
      act_off[i] = act_bytes;
      act_bytes += (arb[i] * static_cast<size_t>(amx[i] ? m_amx : M) + 63) & ~size_t{63};
    }
    total_weight_bytes += detail::weight_row_bytes(w[i].type, K) * static_cast<size_t>(w[i].rows);
  }
  uint8_t* act = act_bytes ? static_cast<uint8_t*>(s.act.get(act_bytes)) : nullptr;
  detail::DecodeCtx ctx[kMaxGroup];
  detail::DecodeKernel kernels[kMaxGroup];
  size_t act_block[kMaxGroup];  // (run_kernel_blocked's activation block for kernels[i])
  for (int i = 0; i < n; ++i) {
    uint8_t* a = arb[i] ? act + act_off[i] : nullptr;
    if (a && owner[i] && amx[i])
      std::memset(a + arb[i] * static_cast<size_t>(M), 0, arb[i] * static_cast<size_t>(m_amx - M));
    ctx[i] = detail::DecodeCtx{w[i].type,
                               static_cast<const uint8_t*>(w[i].data),
                               detail::weight_row_bytes(w[i].type, K),
                               K,
                               M,
                               x,
                               a,
                               arb[i],
                               y[i],
                               w[i].rows};
    use_packed(*impls[i], w[i], ctx[i]);
    ctx[i].korder = detail::kquant_order(w[i].type, w[i].rows, rows == RowKind::kDecode);
    ctx[i].prefetch_l2 = kx8_prefetch_l2();
    if (ctx[i].tiles)
      kernels[i] = avx2_tiles(w[i].type) ? detail::avx2_tile_kernel_for(w[i].type)
                   : tiles[i]            ? detail::amx_tile_kernel_for(w[i].type)
                                         : detail::vnni_tile_kernel_for(w[i].type);
    else
      kernels[i] = amx[i] ? detail::amx_kernel_for(w[i].type) : impls[i]->kernel(w[i].type);
    act_block[i] = act_block_bytes(ctx[i], impls[i]);
  }
  // The owners' activation rows m0..m1 (each row is quantized alone: any
  // split of the rows gives the same bytes).
  const auto prepare_rows = [&](int64_t m0, int64_t m1) {
    if (m0 >= m1) return;
    for (int i = 0; i < n; ++i) {
      if (!arb[i] || !owner[i]) continue;
      uint8_t* a = act + act_off[i] + arb[i] * static_cast<size_t>(m0);
      const float* xr = x + m0 * K;
      if (amx[i])
        (avx2_tiles(w[i].type) ? detail::avx2_tile_prepare_acts : detail::amx_prepare_acts)(xr, m1 - m0, K, a);
      else
        impls[i]->prepare_acts(w[i].type, xr, m1 - m0, K, a);
    }
  };
  const int nt = decode_threads(total_weight_bytes, M);
  if (nt <= 1) {
    prepare_rows(0, M);
    for (int i = 0; i < n; ++i) run_kernel(kernels[i], ctx[i], tiles[i], act_block[i], 0, w[i].rows);
    return;
  }
  // Calls of several rows (many sessions' decode rows, a verification
  // tree) quantize their activation rows on every thread of the call, then
  // run the kernels: the caller alone left the other threads waiting, and
  // its stores to the scratch rows the other threads had just read waited on
  // those threads' caches (`perf annotate`: 45% of amx_prepare_acts' samples
  // on one store). `bench_kernels --threads 2 --hot --types q4_1 --no-gemm
  // --sweep --sweep-m 4,6,16 --sweep-rows decode --sweep-shape 576x1536`, us,
  // four alternations, before -> after: 4 rows 24.6-39.3 -> 20.3-32.1, 6 rows
  // 51.5-53.8 -> 28.3-43.5, 16 rows 90.1-125.0 -> 64.4-102.2; at K = 576
  // level. SmolLM2, 16 sessions, steady tok/s, 12 alternations: median 759.5
  // -> 810.4 (the worker's libgomp waits 13.9% -> 7.2% of the samples).
  const bool split_prepare = M >= 2;
  if (!split_prepare) prepare_rows(0, M);
  std::vector<DecodeChunk>& chunks = s.chunks;
  chunks.clear();
  for (int i = 0; i < n; ++i) {
    const int64_t chunk = decode_chunk_rows(w[i].rows, nt, ctx[i].tiles ? detail::kTileGroupRows : 8);
    for (int64_t n0 = 0; n0 < w[i].rows; n0 += chunk) chunks.push_back({i, n0, std::min(w[i].rows, n0 + chunk)});
  }
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
#pragma omp parallel num_threads(nt)
  {
    if (split_prepare) {
      const int64_t t = omp_get_thread_num(), nth = omp_get_num_threads();
      prepare_rows(M * t / nth, M * (t + 1) / nth);
#pragma omp barrier
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < n_chunks; ++c) {
      const DecodeChunk& ch = chunks[static_cast<size_t>(c)];
      run_kernel(kernels[ch.weight], ctx[ch.weight], tiles[ch.weight], act_block[ch.weight], ch.n0, ch.n1);
    }
  }
}

// Target size of one dequantized weight tile: big enough for oneDNN to run
// at full speed, small enough to stay in L3 between dequantization and use.
constexpr size_t kTileBytes = size_t{8} << 20;

void run_prefill(const detail::IsaImpl& impl, const WeightView& w, const float* x, int64_t M, float* y,
                 MatmulScratch::Impl& s) {
  const int64_t N = w.rows, K = w.cols;
  const bool bf16 = use_bf16_prefill();
  const dnnl_mm::Precision prec = bf16 ? dnnl_mm::Precision::kBf16 : dnnl_mm::Precision::kF32;
  const void* xin = x;
  if (bf16) {
    auto* xb = static_cast<uint16_t*>(s.xconv.get(static_cast<size_t>(M * K) * 2));
    const int64_t total = M * K;
    const int64_t step = 1 << 16;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; i += step) impl.f32_to_bf16(x + i, xb + i, std::min(step, total - i));
    xin = xb;
  }
  // Weights usable as they are.
  if ((!bf16 && w.type == DType::F32) || (bf16 && w.type == DType::BF16)) {
    dnnl_mm::matmul(prec, M, N, K, xin, K, w.data, y, N, s.stream);
    return;
  }
  const size_t elem = bf16 ? 2 : 4;
  int64_t tile_rows = static_cast<int64_t>(kTileBytes / (static_cast<size_t>(K) * elem));
  tile_rows = std::max<int64_t>(64, tile_rows & ~int64_t{63});
  if (tile_rows >= N) tile_rows = N;
  void* buf = s.wtile.get(static_cast<size_t>(tile_rows * K) * elem);
  const size_t rb = detail::weight_row_bytes(w.type, K);
  const auto* wb = static_cast<const uint8_t*>(w.data);
  for (int64_t n0 = 0; n0 < N; n0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, N - n0);
    const int64_t step = 16;  // rows per work item
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t nr = std::min(step, rows - r);
      const uint8_t* src = wb + static_cast<size_t>(n0 + r) * rb;
      if (bf16)
        impl.dequant_bf16(w.type, src, static_cast<uint16_t*>(buf) + r * K, nr * K);
      else
        impl.dequant_f32(w.type, src, static_cast<float*>(buf) + r * K, nr * K);
    }
    dnnl_mm::matmul(prec, M, rows, K, xin, K, buf, y + n0, N, s.stream);
  }
}

}  // namespace

// ---------------------------------------------------------------- public API

bool amx_prompt_rows(DType type) {
  return (detail::packable(type) || type == DType::Q4_K || type == DType::Q6_K) && amx_on() &&
         active_isa() == Isa::kAvx512Vnni && amx_usable();
}
bool set_amx_prompt_rows(bool on) {
  g_amx_on.store(on ? 1 : 0, std::memory_order_relaxed);
  return amx_usable();
}

void reset_amx_prompt_rows() { g_amx_on.store(-1, std::memory_order_relaxed); }

bool matmul_supports(DType type) {
  switch (type) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::F16:
    case DType::BF16:
    case DType::F32: return true;
    default: return false;
  }
}

void matmul(const WeightView& w, const float* x, int64_t M, float* y, MatmulScratch& scratch, MatmulPath path,
            RowKind rows) {
  check_weight(w, "matmul");
  if (M < 0) fail(StatusCode::kInvalidArgument, "matmul: negative M");
  if (M == 0 || w.rows == 0) return;
  if (!x || !y) fail(StatusCode::kInvalidArgument, "matmul: null x or y");
  const detail::IsaImpl& impl = isa_impl(active_isa(), w.type);
  // (without oneDNN, every M runs on the row-invariant kernels)
  const bool decode = path == MatmulPath::kRowInvariant || !dnnl_mm::available() ||
                      (path == MatmulPath::kAuto && M <= decode_max_m(w.type));
  if (decode)
    run_decode_group(&w, &y, 1, x, M, rows, scratch.impl());
  else
    run_prefill(impl, w, x, M, y, scratch.impl());
}

void matmul_group(const WeightView* w, float* const* y, int n, const float* x, int64_t M, MatmulScratch& scratch,
                  MatmulPath path, RowKind rows) {
  if (n < 1 || n > kMaxGroup || !w || !y)
    fail(StatusCode::kInvalidArgument, "matmul_group: 1 to " + std::to_string(kMaxGroup) + " weights");
  for (int i = 0; i < n; ++i) {
    check_weight(w[i], "matmul_group");
    if (w[i].cols != w[0].cols) fail(StatusCode::kInvalidArgument, "matmul_group: the weights' K differ");
  }
  if (M < 0) fail(StatusCode::kInvalidArgument, "matmul_group: negative M");
  if (M == 0) return;
  if (!x) fail(StatusCode::kInvalidArgument, "matmul_group: null x");
  bool decode = n > 1;
  for (int i = 0; i < n; ++i) {
    if (!y[i]) fail(StatusCode::kInvalidArgument, "matmul_group: null y");
    decode = decode && w[i].rows > 0 &&
             (path == MatmulPath::kRowInvariant || !dnnl_mm::available() ||
              (path == MatmulPath::kAuto && M <= decode_max_m(w[i].type)));
  }
  if (!decode) {
    for (int i = 0; i < n; ++i) matmul(w[i], x, M, y[i], scratch, path, rows);
    return;
  }
  run_decode_group(w, y, n, x, M, rows, scratch.impl());
}

namespace {
// Where a GGUF block of a detail::packable type keeps its parts (BlockQ4_0,
// BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0: f16 scales first, then Q5's
// 32 fifth bits, then the quants) and where a packed quad keeps its masks.
struct PackedBlockLayout {
  size_t blk, sc_len, q_off, q_len, mask_off;
  bool five_bit;
  PackedBlockLayout(DType t, size_t block_bytes)
      : blk(block_bytes),
        sc_len(2 * detail::packed_f16_per_block(t)),
        q_off(sc_len + (detail::packed_five_bit(t) ? 4 : 0)),
        q_len(blk - q_off),
        mask_off(4 * sc_len),
        five_bit(detail::packed_five_bit(t)) {}
};

bool kx8_packable(DType type, int64_t rows, int64_t cols) {
  return (type == DType::Q4_K || type == DType::Q6_K) && rows > 0 && rows % detail::kKx8PackRows == 0 && cols > 0 &&
         cols % 256 == 0 && repack_enabled() && isa_impl(active_isa(), type).reads_packed_kx8;
}

// Rows n0..n0+7 of a Q4_K / Q6_K weight as one PackedQ4Kx8 / PackedQ6Kx8
// per super-block (matmul_internal.h), from each block's unpacked values.
template <DType T>
void pack_kx8_group(const uint8_t* rows, size_t row_bytes, int64_t K, uint8_t* out) {
  using P = std::conditional_t<T == DType::Q4_K, detail::PackedQ4Kx8, detail::PackedQ6Kx8>;
  for (int64_t i = 0; i < K / 256; ++i) {
    P& p = reinterpret_cast<P*>(out)[i];
    std::memset(&p, 0, sizeof(p));
    for (int r = 0; r < 8; ++r) {
      detail::KUnpacked<T> u;
      detail::kquant_unpack<T>(
          rows + static_cast<size_t>(r) * row_bytes + static_cast<size_t>(i) * detail::kquant_block_bytes(T), u);
      p.d[r] = u.d;
      for (int g = 0; g < 8; ++g)
        for (int e = 0; e < 16; ++e) {  // elements e (low nibble) and 16 + e (high) of group g
          const int c = e / 4, j = e % 4;
          const uint8_t lo = u.q[32 * g + e], hi = u.q[32 * g + 16 + e];
          if constexpr (T == DType::Q4_K) {
            p.qs[128 * g + 32 * c + 4 * r + j] = static_cast<uint8_t>(lo | (hi << 4));
          } else {
            p.grp[g].ql[32 * c + 4 * r + j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
            p.grp[g].qh[4 * r + j] |= static_cast<uint8_t>((lo >> 4) << (2 * c));
            p.grp[g].qh[32 + 4 * r + j] |= static_cast<uint8_t>((hi >> 4) << (2 * c));
          }
        }
      if constexpr (T == DType::Q4_K) {
        p.dmin[r] = u.dmin;
        for (int g = 0; g < 8; ++g) {
          p.sc[8 * g + r] = static_cast<uint8_t>(u.sc[g]);
          p.mn[8 * g + r] = static_cast<uint8_t>(u.mn[g]);
        }
      } else {
        for (int sb = 0; sb < 16; ++sb) p.sc[8 * sb + r] = static_cast<int8_t>(u.sc[sb]);
      }
    }
  }
}
}  // namespace

size_t packed_bytes(DType type, int64_t rows, int64_t cols) {
  if (kx8_packable(type, rows, cols))
    return detail::kx8_group_bytes(type, cols) * static_cast<size_t>(rows / detail::kKx8PackRows);
  if (!detail::packable(type) || rows <= 0 || cols <= 0 || cols % detail::kQK != 0 || !repack_enabled()) return 0;
  if (active_isa() != Isa::kAvx512Vnni) return 0;
  const int64_t groups = (rows + detail::kPackRows - 1) / detail::kPackRows;
  return detail::packed_group_bytes(type, cols) * static_cast<size_t>(groups);
}

size_t packed_bytes(DType type, int64_t rows, int64_t cols, bool tiles) {
  if (!tiles) return packed_bytes(type, rows, cols);
  if (type == DType::Q4_K || type == DType::Q6_K)  // the same groups of 8, read in the AMX order
    return active_isa() == Isa::kAvx512Vnni ? packed_bytes(type, rows, cols) : 0;
  if (!detail::tile_packable(type) || rows <= 0 || cols <= 0 || cols % detail::kQK != 0 || !repack_enabled()) return 0;
  if (active_isa() == Isa::kAvx2 ? !avx2_tile_weight(type, rows, cols) : active_isa() != Isa::kAvx512Vnni) return 0;
  const int64_t groups = (rows + detail::kTileGroupRows - 1) / detail::kTileGroupRows;
  return detail::tile_group_bytes(type, cols) * static_cast<size_t>(groups);
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 on every AVX-512 VNNI CPU: AMX tiles
// where granted, VNNI registers elsewhere, faster than the groups of 4 rows
// and 1.0x the GGUF bytes either way (Ice Lake-SP, no AMX, SmolLM2 Q4_1,
// `ember bench -p 512 -n 128 -t 2`, groups of 4 -> tile layout: prefill
// 391 / 398 -> 540 / 695 tok/s, decode 96 / 99 -> 101 / 127, resident
// 182.6 -> 173.6 MiB). Q4_K / Q6_K: where AMX runs only (without it the
// AMX order was no faster than llama.cpp's on Gemma 3, whose order their
// AVX-512 kernels keep).
//
// AVX2 CPUs: the same types (Q4_0: weights whose row count is a multiple of
// 8), read by the AVX2 tile kernel. For Q4_0 this is the order of llama.cpp's
// AVX2 build (it repacks those weights to q4_0_8x8), which the AVX2 variant's
// GGUF kernels (vec_dot's order) do not follow; for the others llama.cpp
// keeps vec_dot's order, as the GGUF kernels (EMBER_CPU_AMX=0) do, and the
// tile kernels are faster (`bench_kernels --isa avx2 --threads 1 --cpu-time
// --hot --sweep --sweep-rows prompt --sweep-shape 2048x640`, 64 rows, GGUF
// rows -> tiles: Q5_0 2741 -> 1365 us, Q8_0 2244 -> 1503 us; 16 rows 675 ->
// 346, 553 -> 376); every AVX2 and AVX-512 CPU then sums these types' rows
// to the same bits (as AMX tiles do).
bool tile_layout(DType type) {
  if (!repack_enabled() || !amx_on()) return false;
  if (active_isa() == Isa::kAvx2) return detail::avx2_tile_type(type);
  if (active_isa() != Isa::kAvx512Vnni) return false;
  if (detail::tile_packable(type)) return true;
  return (type == DType::Q4_K || type == DType::Q6_K) && amx_prompt_rows(type);
}

namespace {
// Row n's GGUF block and its place in a group of the tile layout
// (matmul_internal.h): q, the block's quants there; sc, its scales. GGUF
// quant byte or value 4c + i sits at chunk c, byte 4n + i (Q8_0 values plus
// 128); a Q5 fifth bit of value 4r + i at bit 4n + i of mask r.
struct TileBlock {
  size_t qs, qh;  // GGUF offsets of the quants and of qh (Q5)
  int chunks;
  uint8_t flip;
  explicit TileBlock(DType t)
      : qs(2 + (detail::tile_min(t) ? 2 : 0) + (detail::tile_five_bit(t) ? 4 : 0)),
        qh(detail::tile_min(t) ? 4 : 2),
        chunks(t == DType::Q8_0 ? 8 : 4),
        flip(t == DType::Q8_0 ? 0x80 : 0) {}
};
void tile_put(DType t, const uint8_t* blk, uint8_t* q, uint8_t* sc, int64_t n) {
  const TileBlock L(t);
  for (int c = 0; c < L.chunks; ++c)
    for (int i = 0; i < 4; ++i) q[64 * c + 4 * n + i] = static_cast<uint8_t>(blk[L.qs + 4 * c + i] ^ L.flip);
  if (detail::tile_five_bit(t)) {
    uint32_t qh;
    std::memcpy(&qh, blk + L.qh, 4);
    for (int r = 0; r < 8; ++r)
      for (int i = 0; i < 4; ++i)
        if ((qh >> (4 * r + i)) & 1) q[256 + 8 * r + (4 * n + i) / 8] |= static_cast<uint8_t>(1u << ((4 * n + i) % 8));
  }
  std::memcpy(sc + 2 * n, blk, 2);
  if (detail::tile_min(t)) std::memcpy(sc + 32 + 2 * n, blk + 2, 2);
}
void tile_get(DType t, const uint8_t* q, const uint8_t* sc, int64_t n, uint8_t* blk) {
  const TileBlock L(t);
  for (int c = 0; c < L.chunks; ++c)
    for (int i = 0; i < 4; ++i) blk[L.qs + 4 * c + i] = static_cast<uint8_t>(q[64 * c + 4 * n + i] ^ L.flip);
  if (detail::tile_five_bit(t)) {
    uint32_t qh = 0;
    for (int r = 0; r < 8; ++r)
      for (int i = 0; i < 4; ++i)
        qh |= static_cast<uint32_t>((q[256 + 8 * r + (4 * n + i) / 8] >> ((4 * n + i) % 8)) & 1) << (4 * r + i);
    std::memcpy(blk + L.qh, &qh, 4);
  }
  std::memcpy(blk, sc + 2 * n, 2);
  if (detail::tile_min(t)) std::memcpy(blk + 2, sc + 32 + 2 * n, 2);
}
}  // namespace

void pack_weight(const WeightView& w, void* out) {
  check_weight(w, "pack_weight");
  if (w.packed_tiles && w.type != DType::Q4_K && w.type != DType::Q6_K) {
    if (!out) fail(StatusCode::kInvalidArgument, "pack_weight: null output");
    const int64_t K = w.cols, nb = K / detail::kQK;
    const int64_t groups = (w.rows + detail::kTileGroupRows - 1) / detail::kTileGroupRows;
    const size_t gb = detail::tile_group_bytes(w.type, K), rb = detail::weight_row_bytes(w.type, K);
    const size_t blk = rb / static_cast<size_t>(nb), tq = detail::tile_quant_bytes(w.type);
    const size_t ts = detail::tile_scale_bytes(w.type);
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* base = static_cast<uint8_t*>(out) + static_cast<size_t>(g) * gb;
      std::memset(base, 0, gb);   // padding rows: zero quants and scales
      if (w.type == DType::Q8_0)  // (zero values: 128)
        for (size_t i = 0; i < static_cast<size_t>(nb) * tq; ++i) base[i] = 0x80;
      uint8_t* scales = base + static_cast<size_t>(nb) * tq;
      for (int64_t n = 0; n < detail::kTileGroupRows && g * detail::kTileGroupRows + n < w.rows; ++n) {
        const uint8_t* src =
            static_cast<const uint8_t*>(w.data) + static_cast<size_t>(g * detail::kTileGroupRows + n) * rb;
        for (int64_t b = 0; b < nb; ++b) {
          tile_put(w.type, src + static_cast<size_t>(b) * blk, base + static_cast<size_t>(b) * tq,
                   scales + static_cast<size_t>(b) * ts, n);
        }
      }
    }
    return;
  }
  if (w.type == DType::Q4_K || w.type == DType::Q6_K) {
    if (w.rows % detail::kKx8PackRows != 0)
      fail(StatusCode::kInvalidArgument, "pack_weight: Q4_K / Q6_K rows must be a multiple of 8");
    if (!out) fail(StatusCode::kInvalidArgument, "pack_weight: null output");
    const size_t rb = detail::weight_row_bytes(w.type, w.cols), gb = detail::kx8_group_bytes(w.type, w.cols);
    const int64_t groups = w.rows / detail::kKx8PackRows;
    const auto pack = w.type == DType::Q4_K ? pack_kx8_group<DType::Q4_K> : pack_kx8_group<DType::Q6_K>;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; ++g)
      pack(static_cast<const uint8_t*>(w.data) + static_cast<size_t>(g * detail::kKx8PackRows) * rb, rb, w.cols,
           static_cast<uint8_t*>(out) + static_cast<size_t>(g) * gb);
    return;
  }
  if (!detail::packable(w.type)) fail(StatusCode::kInvalidArgument, "pack_weight: not a packable type");
  if (!out) fail(StatusCode::kInvalidArgument, "pack_weight: null output");
  const int64_t K = w.cols, nb = K / detail::kQK;
  const int64_t groups = (w.rows + detail::kPackRows - 1) / detail::kPackRows;
  const size_t gb = detail::packed_group_bytes(w.type, K), rb = detail::weight_row_bytes(w.type, K);
  const PackedBlockLayout lay(w.type, rb / static_cast<size_t>(nb));
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* base = static_cast<uint8_t*>(out) + static_cast<size_t>(g) * gb;
    std::memset(base, 0, gb);  // padding blocks and rows: zero quants, scales and fifth bits
    for (int64_t j = 0; j < detail::kPackRows && g * detail::kPackRows + j < w.rows; ++j) {
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(g * detail::kPackRows + j) * rb;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* bp = src + static_cast<size_t>(b) * lay.blk;
        const int64_t q = b / 4, jb = b % 4;
        uint8_t* qd = base + detail::packed_quant_offset(w.type, q, j);
        uint8_t* sc = base + detail::packed_scale_offset(w.type, K, q, j);
        std::memcpy(qd + jb * 16, bp + lay.q_off, 16);
        if (lay.q_len == 32) std::memcpy(qd + 64 + jb * 16, bp + lay.q_off + 16, 16);  // Q8_0: bytes 16..31
        std::memcpy(sc + static_cast<size_t>(jb) * lay.sc_len, bp, lay.sc_len);
        if (lay.five_bit) {
          uint32_t qh;
          std::memcpy(&qh, bp + lay.sc_len, 4);
          uint64_t m[2];
          std::memcpy(m, sc + lay.mask_off, 16);
          m[0] |= static_cast<uint64_t>(qh & 0xFFFF) << (16 * jb);
          m[1] |= static_cast<uint64_t>(qh >> 16) << (16 * jb);
          std::memcpy(sc + lay.mask_off, m, 16);
        }
      }
    }
  }
}

namespace {
// The inverse of pack_kx8_group for row r of a group: its GGUF super-blocks.
template <DType T>
void unpack_kx8_row(const uint8_t* group, int r, int64_t K, uint8_t* out) {
  using P = std::conditional_t<T == DType::Q4_K, detail::PackedQ4Kx8, detail::PackedQ6Kx8>;
  for (int64_t i = 0; i < K / 256; ++i) {
    const P& p = reinterpret_cast<const P*>(group)[i];
    uint8_t q[256];  // the unpacked values in element order (KUnpacked::q)
    for (int g = 0; g < 8; ++g)
      for (int e = 0; e < 16; ++e) {
        const int c = e / 4, j = e % 4;
        if constexpr (T == DType::Q4_K) {
          const uint8_t b = p.qs[128 * g + 32 * c + 4 * r + j];
          q[32 * g + e] = b & 0xF;
          q[32 * g + 16 + e] = b >> 4;
        } else {
          const uint8_t b = p.grp[g].ql[32 * c + 4 * r + j];
          const int lo_h = (p.grp[g].qh[4 * r + j] >> (2 * c)) & 3, hi_h = (p.grp[g].qh[32 + 4 * r + j] >> (2 * c)) & 3;
          q[32 * g + e] = static_cast<uint8_t>((b & 0xF) | (lo_h << 4));
          q[32 * g + 16 + e] = static_cast<uint8_t>((b >> 4) | (hi_h << 4));
        }
      }
    uint8_t* blk = out + static_cast<size_t>(i) * detail::kquant_block_bytes(T);
    if constexpr (T == DType::Q4_K) {
      BlockQ4_K b;
      b.d = detail::f2h(p.d[r]);
      b.dmin = detail::f2h(p.dmin[r]);
      for (int j = 0; j < 4; ++j) {  // kquant_scale_min's 6-bit fields, put back
        const int s_lo = p.sc[8 * j + r], m_lo = p.mn[8 * j + r];
        const int s_hi = p.sc[8 * (j + 4) + r], m_hi = p.mn[8 * (j + 4) + r];
        b.scales[j] = static_cast<uint8_t>(s_lo | ((s_hi >> 4) << 6));
        b.scales[j + 4] = static_cast<uint8_t>(m_lo | ((m_hi >> 4) << 6));
        b.scales[j + 8] = static_cast<uint8_t>((s_hi & 0xF) | ((m_hi & 0xF) << 4));
      }
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) b.qs[32 * j + l] = static_cast<uint8_t>(q[64 * j + l] | (q[64 * j + 32 + l] << 4));
      std::memcpy(blk, &b, sizeof(b));
    } else {
      BlockQ6_K b;
      b.d = detail::f2h(p.d[r]);
      for (int sb = 0; sb < 16; ++sb) b.scales[sb] = p.sc[8 * sb + r];
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const uint8_t* v = q + 128 * h;
          b.ql[64 * h + l] = static_cast<uint8_t>((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
          b.ql[64 * h + l + 32] = static_cast<uint8_t>((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
          b.qh[32 * h + l] = static_cast<uint8_t>((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                                                  ((v[l + 96] >> 4) << 6));
        }
      std::memcpy(blk, &b, sizeof(b));
    }
  }
}
}  // namespace

void unpack_rows(const WeightView& w, int64_t row_begin, int64_t n_rows, void* out) {
  check_weight(w, "unpack_rows");
  if (!w.packed || !out) fail(StatusCode::kInvalidArgument, "unpack_rows: no packed copy or no output");
  if (row_begin < 0 || n_rows < 0 || row_begin > w.rows - n_rows)
    fail(StatusCode::kInvalidArgument, "unpack_rows: rows out of range");
  const int64_t K = w.cols;
  const size_t rb = detail::weight_row_bytes(w.type, K);
  const auto* packed = static_cast<const uint8_t*>(w.packed);
  auto* dst = static_cast<uint8_t*>(out);
  if (w.packed_tiles && w.type != DType::Q4_K && w.type != DType::Q6_K) {
    const int64_t nb = K / detail::kQK;
    const size_t gb = detail::tile_group_bytes(w.type, K), blk = rb / static_cast<size_t>(nb);
    const size_t tq = detail::tile_quant_bytes(w.type), ts = detail::tile_scale_bytes(w.type);
    for (int64_t i = 0; i < n_rows; ++i) {
      const int64_t r = row_begin + i, n = r % detail::kTileGroupRows;
      const uint8_t* base = packed + static_cast<size_t>(r / detail::kTileGroupRows) * gb;
      const uint8_t* scales = base + static_cast<size_t>(nb) * tq;
      for (int64_t b = 0; b < nb; ++b) {
        tile_get(w.type, base + static_cast<size_t>(b) * tq, scales + static_cast<size_t>(b) * ts, n,
                 dst + static_cast<size_t>(i) * rb + static_cast<size_t>(b) * blk);
      }
    }
    return;
  }
  if (w.type == DType::Q4_K || w.type == DType::Q6_K) {
    const size_t gb = detail::kx8_group_bytes(w.type, K);
    for (int64_t i = 0; i < n_rows; ++i) {
      const int64_t r = row_begin + i;
      const uint8_t* group = packed + static_cast<size_t>(r / detail::kKx8PackRows) * gb;
      const int rr = static_cast<int>(r % detail::kKx8PackRows);
      if (w.type == DType::Q4_K)
        unpack_kx8_row<DType::Q4_K>(group, rr, K, dst + static_cast<size_t>(i) * rb);
      else
        unpack_kx8_row<DType::Q6_K>(group, rr, K, dst + static_cast<size_t>(i) * rb);
    }
    return;
  }
  if (!detail::packable(w.type)) fail(StatusCode::kInvalidArgument, "unpack_rows: not a packable type");
  const int64_t nb = K / detail::kQK;
  const size_t gb = detail::packed_group_bytes(w.type, K);
  const PackedBlockLayout lay(w.type, rb / static_cast<size_t>(nb));
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t r = row_begin + i, j = r % detail::kPackRows;
    const uint8_t* base = packed + static_cast<size_t>(r / detail::kPackRows) * gb;
    uint8_t* row = dst + static_cast<size_t>(i) * rb;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* bp = row + static_cast<size_t>(b) * lay.blk;
      const int64_t q = b / 4, jb = b % 4;
      const uint8_t* qd = base + detail::packed_quant_offset(w.type, q, j);
      const uint8_t* sc = base + detail::packed_scale_offset(w.type, K, q, j);
      std::memcpy(bp + lay.q_off, qd + jb * 16, 16);
      if (lay.q_len == 32) std::memcpy(bp + lay.q_off + 16, qd + 64 + jb * 16, 16);
      std::memcpy(bp, sc + static_cast<size_t>(jb) * lay.sc_len, lay.sc_len);
      if (lay.five_bit) {
        uint64_t m[2];
        std::memcpy(m, sc + lay.mask_off, 16);
        const uint32_t qh = static_cast<uint32_t>((m[0] >> (16 * jb)) & 0xFFFF) |
                            static_cast<uint32_t>((m[1] >> (16 * jb)) & 0xFFFF) << 16;
        std::memcpy(bp + lay.sc_len, &qh, 4);
      }
    }
  }
}

void dequantize_rows(const WeightView& w, int64_t row_begin, int64_t n_rows, float* out) {
  check_weight(w, "dequantize_rows");
  if (row_begin < 0 || n_rows < 0 || row_begin > w.rows || n_rows > w.rows - row_begin)
    fail(StatusCode::kInvalidArgument, "dequantize_rows: rows [" + std::to_string(row_begin) + ", +" +
                                           std::to_string(n_rows) + ") out of range for " + std::to_string(w.rows) +
                                           " rows");
  if (n_rows == 0) return;
  if (!out) fail(StatusCode::kInvalidArgument, "dequantize_rows: null output");
  const size_t rb = detail::weight_row_bytes(w.type, w.cols);
  isa_impl(active_isa(), w.type)
      .dequant_f32(w.type, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(row_begin) * rb, out,
                   n_rows * w.cols);
}

Isa active_isa() {
  const int f = g_forced_isa.load(std::memory_order_relaxed);
  return f >= 0 ? static_cast<Isa>(f) : best_isa();
}
const char* isa_name() { return isa_to_string(active_isa()); }
void force_isa(Isa isa) {
  if (!isa_supported(isa))
    fail(StatusCode::kUnsupported,
         std::string("force_isa: this CPU cannot run the ") + isa_to_string(isa) + " kernels");
  g_forced_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}
void reset_isa() { g_forced_isa.store(-1, std::memory_order_relaxed); }

int64_t decode_max_m(DType type) {
  const int64_t forced = g_decode_max_m.load(std::memory_order_relaxed);
  if (forced >= 0) return forced;
  const bool bf16 = use_bf16_prefill();
  return detail::is_quant(type) || detail::is_kquant(type) ? (bf16 ? 16 : 32) : (bf16 ? 8 : 16);
}
int64_t decode_max_m() {
  int64_t m = std::numeric_limits<int64_t>::max();
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::F16, DType::BF16, DType::F32})
    m = std::min(m, decode_max_m(t));
  return m;
}
void set_decode_max_m(int64_t m) { g_decode_max_m.store(std::max<int64_t>(0, m), std::memory_order_relaxed); }
void reset_decode_max_m() { g_decode_max_m.store(-1, std::memory_order_relaxed); }

void set_prefill_precision(PrefillPrecision p) {
  g_prefill_precision.store(static_cast<int>(p), std::memory_order_relaxed);
}
PrefillPrecision prefill_precision() {
  return static_cast<PrefillPrecision>(g_prefill_precision.load(std::memory_order_relaxed));
}
const char* prefill_precision_name() { return use_bf16_prefill() ? "bf16" : "f32"; }

}  // namespace ember::cpu
