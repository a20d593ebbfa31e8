// AMX prompt rows for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K weights (CPUs with
// AMX-INT8: Sapphire Rapids and later), compiled with the AVX-512 flags; the
// tile functions add AMX through their target attribute. Called only after
// cpu::amx_prompt_rows(type) (matmul.cpp), which checks that they are turned
// on, the CPU, the OS grant (arch_prctl) and the active variant.
//
// The order (cpu/matmul.h; Matmul.AmxPromptRowsSumWholeBlocksInOrderForAnyBatch
// computes it in scalar code): the activations are quantized per 32-value
// block as for every other variant (quantize_block_q8_scalar's values and
// scales); each output sums its blocks in order, acc = fma(float(s), dw * dx,
// acc) from 0, where s is the block's exact int32 dot product (of q - 8 for
// Q4_0, q - 16 for Q5_0, q for the others), and for Q4_1 / Q5_1 then
// acc = fma(m, sx, acc). A 16 x 16 tile of outputs gets s for all its rows
// and columns from one tdpbssd; nothing about a row depends on the other
// rows of the call, so the results do not depend on M, on the threads, or
// on the weight's layout (GGUF or packed rows).
//
// Per call, for each tile of 16 weight rows and each chunk of 32 blocks: the
// blocks' 16 x 32 values become B tiles (8 rows of 64 bytes: byte 4n + i of
// row r is value 4r + i of weight row n) and their scales vectors, on the
// stack; then every tile of 16 activation rows runs through the chunk, one
// tdpbssd per block (two in flight) and one float step per output, the
// accumulators in registers (in y between chunks). The activation rows are
// read 16 at a time: the caller rounds M up to a multiple of 16, the
// padding rows zeroed. A call of M < 16 rows configures its tiles with M
// rows and runs the float step on 1, 2, 4 or 8 rows, so that a one-row
// prompt chunk costs the B tiles and little else.
//
// Weights in the tile layout (cpu::tile_layout; matmul_internal.h), and
// packed Q4_K / Q6_K groups on AMX CPUs, take this order for every row,
// decode rows included: their B tiles come straight from the layout, and
// calls of fewer rows run the same order on VNNI registers
// (vnni_tile_kernel: one register = one B-tile row, 16 weight rows in its
// lanes), to the same bits. So the choice between the two never shows in a
// stream's tokens.
// (GCC 12's AVX-512 headers: see matmul_avx512.cpp.)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "cpu/matmul_internal.h"

namespace ember::cpu::detail {
namespace {

constexpr int kTileRows = 16;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0 and 3 accumulate (m_rows x 16 int32), 1 and 4 hold activation
// rows (m_rows x 32 int8: one block), 2 and 5 weights (8 x 64 int8: one
// block's B tile). m_rows: 16, or M when a call has fewer rows. `halves`
// (Q6_K): K = 16 instead, tiles 0 / 1 / 2 a block's first half and 3 / 4 / 5
// its second (activations m_rows x 16, weights 4 x 64).
__attribute__((target("amx-tile,amx-int8"))) void configure_tiles(int m_rows, bool halves) {
  TileConfig cfg;
  for (int t : {0, 3}) {
    cfg.rows[t] = static_cast<uint8_t>(m_rows);
    cfg.colsb[t] = 64;
  }
  for (int t : {1, 4}) {
    cfg.rows[t] = static_cast<uint8_t>(m_rows);
    cfg.colsb[t] = halves ? 16 : 32;
  }
  for (int t : {2, 5}) {
    cfg.rows[t] = halves ? 4 : 8;
    cfg.colsb[t] = 64;
  }
  // (GCC 12 does not see that ldtilecfg reads cfg and drops the stores above
  // without this barrier.)
  __asm__ __volatile__("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// The block formats: bytes per GGUF block, where its quants, its fifth bits
// (Q5) and its min (Q4_1 / Q5_1) sit in it, and the values' offset.
template <DType T>
struct Format {
  static constexpr bool kMin = T == DType::Q4_1 || T == DType::Q5_1 || T == DType::Q4_K;
  static constexpr bool kFive = T == DType::Q5_0 || T == DType::Q5_1;
  static constexpr size_t kBlock = T == DType::Q8_0   ? sizeof(BlockQ8_0)
                                   : T == DType::Q4_0 ? sizeof(BlockQ4_0)
                                   : T == DType::Q4_1 ? sizeof(BlockQ4_1)
                                   : T == DType::Q5_0 ? sizeof(BlockQ5_0)
                                                      : sizeof(BlockQ5_1);
  static constexpr size_t kQh = kMin ? 4 : 2;                              // GGUF: qh's offset (Q5)
  static constexpr size_t kQuants = 2 + (kMin ? 2 : 0) + (kFive ? 4 : 0);  // GGUF: qs's offset
  // Q4_0 / Q5_0 values are q - 8 / q - 16; Q4_1 / Q5_1 values q (their min
  // apart), Q8_0 q.
  static constexpr int kOffset = T == DType::Q4_0 ? 8 : T == DType::Q5_0 ? 16 : 0;
};

// Where the 16 weight rows of a tile keep block b: its quants (Q4 / Q5: 16
// nibble bytes; Q8_0: values 0..15 at q, 16..31 at q + hi), its f16 scale
// and min, and its fifth bits, as base + b-dependent offsets (GGUF rows, or
// the packed groups of matmul_internal.h: packed_quant_offset /
// packed_scale_offset). Rows past the weight's end point at row 0 (their
// results are never stored).
template <DType T>
struct TileRows {
  using F = Format<T>;
  const uint8_t* q[kTileRows];
  const uint8_t* sc[kTileRows];  // GGUF: the row; packed: the row's first scale record
  size_t hi;

  TileRows(const DecodeCtx& c, int64_t n0, int cols) {
    for (int n = 0; n < kTileRows; ++n) {
      const int64_t r = n0 + (n < cols ? n : 0);
      if (c.packed) {
        const uint8_t* base = c.packed + static_cast<size_t>(r / kPackRows) * c.packed_group_bytes;
        const int64_t j = r % kPackRows;
        q[n] = base + packed_quant_offset(T, 0, j);
        sc[n] = base + packed_scale_offset(T, c.K, 0, j);
      } else {
        q[n] = c.w + static_cast<size_t>(r) * c.w_row_bytes + F::kQuants;
        sc[n] = c.w + static_cast<size_t>(r) * c.w_row_bytes;
      }
    }
    hi = c.packed ? 64 : 16;
  }
  // Offsets of block b's quants from q[n], and of its scale record from sc[n].
  static size_t q_off(bool packed, int64_t b) {
    if (packed) return packed_quant_offset(T, b / 4, 0) + 16 * static_cast<size_t>(b % 4);
    return static_cast<size_t>(b) * F::kBlock;
  }
  static size_t sc_off(bool packed, int64_t b) {
    if (packed) return static_cast<size_t>((b / 4) * kPackRows) * packed_scale_bytes(T);
    return static_cast<size_t>(b) * F::kBlock;
  }
  // Block b's scale (and min) as f16 bits, and its 32 fifth bits (element i
  // at bit i), from its scale record.
  static uint16_t scale(bool packed, const uint8_t* rec, int64_t b, int which) {
    uint16_t h;
    const size_t at = packed ? 2 * packed_f16_per_block(T) * static_cast<size_t>(b % 4) : 0;
    __builtin_memcpy(&h, rec + at + 2 * static_cast<size_t>(which), 2);
    return h;
  }
  static uint32_t fifth_bits(bool packed, const uint8_t* rec, int64_t b) {
    if (!packed) {
      uint32_t qh;
      __builtin_memcpy(&qh, rec + F::kQh, 4);
      return qh;
    }
    uint64_t m[2];
    __builtin_memcpy(m, rec + 8 * packed_f16_per_block(T), 16);
    const int sh = 16 * static_cast<int>(b % 4);
    return static_cast<uint32_t>((m[0] >> sh) & 0xFFFF) | static_cast<uint32_t>(((m[1] >> sh) & 0xFFFF) << 16);
  }
};

// Row n's 32 values of a block as a 256-bit vector (Format::kOffset taken off).
template <DType T>
inline __m256i block_values(const uint8_t* q, size_t hi, uint32_t fifth) {
  if constexpr (T == DType::Q8_0) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + hi)), 1);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, m4)),
                                        _mm_and_si128(_mm_srli_epi16(raw, 4), m4), 1);
    if constexpr (Format<T>::kFive) v = _mm256_or_si256(v, _mm256_maskz_mov_epi8(fifth, _mm256_set1_epi8(0x10)));
    if constexpr (Format<T>::kOffset != 0) v = _mm256_sub_epi8(v, _mm256_set1_epi8(Format<T>::kOffset));
    return v;
  }
}

// The B tile from z[i] = rows i and i + 8's 32 values (the two 256-bit
// halves): tile[r][4n + i] = value 4r + i of row n.
inline void transpose_to_tile(const __m512i* z, int8_t* tile) {
  // 8 x 8 transpose within each 256-bit half.
  __m512i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // u[k] (k < 4) holds words 4*lane + k ... of rows 0..3 per 128-bit lane; u[4 + k] rows 4..7.
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int k = 0; k < 4; ++k) {
    _mm512_store_si512(reinterpret_cast<__m512i*>(tile + 64 * k), _mm512_permutex2var_epi64(u[k], lo, u[4 + k]));
    _mm512_store_si512(reinterpret_cast<__m512i*>(tile + 64 * (k + 4)), _mm512_permutex2var_epi64(u[k], hi, u[4 + k]));
  }
}

// The B tile of a tile's 16 weight rows for block b (tile[r][4n + i] = value
// 4r + i of row n: a 16 x 8 transpose of 32-bit words, rows n and n + 8 in
// the two halves of one register), their scales and (Q4_1 / Q5_1) mins (rows
// past `cols`: 0).
template <DType T>
inline void weight_tile(const TileRows<T>& rows, bool packed, int cols, int64_t b, int8_t* tile, float* dw, float* dm) {
  using TR = TileRows<T>;
  const size_t qo = TR::q_off(packed, b), so = TR::sc_off(packed, b);
  uint32_t fifth[kTileRows] = {};
  if constexpr (Format<T>::kFive) {
    for (int n = 0; n < kTileRows; ++n) fifth[n] = TR::fifth_bits(packed, rows.sc[n] + so, b);
  }
  __m512i z[8];
  for (int i = 0; i < 8; ++i)
    z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(block_values<T>(rows.q[i] + qo, rows.hi, fifth[i])),
                              block_values<T>(rows.q[i + 8] + qo, rows.hi, fifth[i + 8]), 1);
  transpose_to_tile(z, tile);
  const __mmask16 live = static_cast<__mmask16>((1u << cols) - 1);
  alignas(32) uint16_t h[kTileRows];
  for (int n = 0; n < kTileRows; ++n) h[n] = TR::scale(packed, rows.sc[n] + so, b, 0);
  _mm512_store_ps(dw,
                  _mm512_maskz_mov_ps(live, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)))));
  if constexpr (Format<T>::kMin) {
    for (int n = 0; n < kTileRows; ++n) h[n] = TR::scale(packed, rows.sc[n] + so, b, 1);
    _mm512_store_ps(dm,
                    _mm512_maskz_mov_ps(live, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h)))));
  }
}

// The weight tiles of a type for the 16 rows from nt (cols of them real):
// src(b, tile, dw, dm) writes block b's B tile, its scales and (Q4_1 / Q5_1 /
// Q4_K) what the activation sum scale is multiplied by.
template <DType T>
struct TileSource {
  TileRows<T> rows;
  bool packed;
  int cols;
  TileSource(const DecodeCtx& c, int64_t nt, int n) : rows(c, nt, n), packed(c.packed != nullptr), cols(n) {}
  void operator()(int64_t b, int8_t* tile, float* dw, float* dm) const {
    weight_tile<T>(rows, packed, cols, b, tile, dw, dm);
  }
};

// A tile-layout block's 8 registers of unsigned values (register r: values
// 4r..4r+3 of the 16 rows): Q4 / Q5 nibbles (and fifth bits), Q8_0 values
// plus 128.
template <DType T>
inline void tile_values(const uint8_t* p, __m512i* w) {
  if constexpr (T == DType::Q8_0) {
    for (int k = 0; k < 8; ++k) w[k] = _mm512_load_si512(p + 64 * k);
  } else {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_load_si512(p + 64 * k);
      w[k] = _mm512_and_si512(v, m4);
      w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if constexpr (tile_five_bit(T)) {
      const __m512i bit4 = _mm512_set1_epi8(0x10);
      for (int k = 0; k < 8; ++k) {
        uint64_t m;
        __builtin_memcpy(&m, p + 256 + 8 * k, 8);
        w[k] = _mm512_or_si512(w[k], _mm512_maskz_mov_epi8(m, bit4));
      }
    }
  }
}

// The unsigned values' offset: Q4_0 8, Q5_0 16, Q8_0 128 (as stored), Q6_K 32.
template <DType T>
inline constexpr int kTileOffset = T == DType::Q4_0   ? 8
                                   : T == DType::Q5_0 ? 16
                                   : T == DType::Q8_0 ? 128
                                   : T == DType::Q6_K ? 32
                                                      : 0;

// Tile-layout weights as B tiles: the values less their offset.
template <DType T>
struct TiledSource {
  const uint8_t* q;
  const uint8_t* sc;
  int cols;
  TiledSource(const DecodeCtx& c, int64_t nt, int n) : cols(n) {
    q = c.packed + static_cast<size_t>(nt / kTileGroupRows) * c.packed_group_bytes;
    sc = q + static_cast<size_t>(c.K / kQK) * tile_quant_bytes(T);
  }
  void operator()(int64_t b, int8_t* tile, float* dw, float* dm) const {
    __m512i w[8];
    tile_values<T>(q + static_cast<size_t>(b) * tile_quant_bytes(T), w);
    const __m512i off = _mm512_set1_epi8(static_cast<char>(kTileOffset<T>));
    for (int k = 0; k < 8; ++k)
      _mm512_store_si512(reinterpret_cast<__m512i*>(tile + 64 * k), _mm512_sub_epi8(w[k], off));
    const __mmask16 live = static_cast<__mmask16>((1u << cols) - 1);
    const uint8_t* s = sc + tile_scale_bytes(T) * static_cast<size_t>(b);
    _mm512_store_ps(dw,
                    _mm512_maskz_mov_ps(live, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(s)))));
    if constexpr (tile_min(T))
      _mm512_store_ps(
          dm, _mm512_maskz_mov_ps(live, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(s + 32)))));
  }
};

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j of a
// Q4_K block's scales[12].
inline void q4k_scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: block b is sub-block b % 8 of super-block b / 8; its values are the
// nibbles q (0..15), its scale d * sc and its min dmin * m (f32 products):
// acc = fma(float(s), (d * sc) * dx, acc), then acc = fma(-(dmin * m), sx,
// acc). Packed rows (PackedQ4Kx8, groups of 8 rows) hold the quants already
// interleaved as a B tile wants them: chunk k of a sub-block is B rows k (low
// nibbles) and 4 + k (high) for the group's 8 rows. GGUF rows are transposed.
template <>
struct TileSource<DType::Q4_K> {
  const DecodeCtx& c;
  int64_t nt;
  int cols;
  TileSource(const DecodeCtx& ctx, int64_t n0, int n) : c(ctx), nt(n0), cols(n) {}
  void operator()(int64_t b, int8_t* tile, float* dw, float* dm) const {
    const int64_t sb = b / 8;
    const int g = static_cast<int>(b % 8);
    const __mmask16 live = static_cast<__mmask16>((1u << cols) - 1);
    if (c.packed) {
      const uint8_t* base = c.packed + static_cast<size_t>(nt / kKx8PackRows) * c.packed_group_bytes;
      const auto* ga = reinterpret_cast<const PackedQ4Kx8*>(base) + sb;
      const auto* gb = cols > 8 ? reinterpret_cast<const PackedQ4Kx8*>(base + c.packed_group_bytes) + sb : ga;
      const __m512i m4 = _mm512_set1_epi8(0x0F);
      for (int k = 0; k < 4; ++k) {
        const __m512i z = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ga->qs + 128 * g + 32 * k))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb->qs + 128 * g + 32 * k)), 1);
        _mm512_store_si512(reinterpret_cast<__m512i*>(tile + 64 * k), _mm512_and_si512(z, m4));
        _mm512_store_si512(reinterpret_cast<__m512i*>(tile + 64 * (k + 4)),
                           _mm512_and_si512(_mm512_srli_epi16(z, 4), m4));
      }
      const __m512 d = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(ga->d)), _mm256_loadu_ps(gb->d), 1);
      const __m512 dmin =
          _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(ga->dmin)), _mm256_loadu_ps(gb->dmin), 1);
      // The 8 + 8 scales (or mins) of sub-block g as floats.
      auto bytes16 = [g](const uint8_t* a, const uint8_t* bb) {
        uint64_t lo, hi;
        __builtin_memcpy(&lo, a + 8 * g, 8);
        __builtin_memcpy(&hi, bb + 8 * g, 8);
        return _mm512_cvtepi32_ps(
            _mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo))));
      };
      _mm512_store_ps(dw, _mm512_maskz_mul_ps(live, d, bytes16(ga->sc, gb->sc)));
      _mm512_store_ps(dm, _mm512_maskz_sub_ps(live, _mm512_setzero_ps(), _mm512_mul_ps(dmin, bytes16(ga->mn, gb->mn))));
      return;
    }
    __m512i z[8];
    alignas(64) float ds[kTileRows], ms[kTileRows];
    for (int n = 0; n < kTileRows; ++n) {
      const int64_t r = nt + (n < cols ? n : 0);
      const uint8_t* blk = c.w + static_cast<size_t>(r) * c.w_row_bytes + static_cast<size_t>(sb) * sizeof(BlockQ4_K);
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * (g / 2)));
      const __m256i v = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0F));
      z[n % 8] = n < 8 ? _mm512_castsi256_si512(v) : _mm512_inserti64x4(z[n % 8], v, 1);
      uint16_t hd, hm;
      __builtin_memcpy(&hd, blk, 2);
      __builtin_memcpy(&hm, blk + 2, 2);
      int sc, mn;
      q4k_scale_min(g, blk + 4, &sc, &mn);
      ds[n] = _cvtsh_ss(hd) * static_cast<float>(sc);
      ms[n] = -(_cvtsh_ss(hm) * static_cast<float>(mn));
    }
    transpose_to_tile(z, tile);
    _mm512_store_ps(dw, _mm512_maskz_mov_ps(live, _mm512_load_ps(ds)));
    _mm512_store_ps(dm, _mm512_maskz_mov_ps(live, _mm512_load_ps(ms)));
  }
};

// acc[m] = fma(float(c[m]), dw * dx[m], acc[m]) for the first R rows of a
// tile, then (Q4_1 / Q5_1) acc[m] = fma(dm, sx[m], acc[m]), sx the block's
// activation sum scale (rows past M: zero activations or stale sums; their
// results are not stored).
template <int R, bool kMin>
inline void accumulate(__m512* acc, const int32_t* cbuf, const float* dw, const float* dm, const uint8_t* dx,
                       const uint8_t* sx, size_t arb) {
  const __m512 dwv = _mm512_load_ps(dw);
  for (int m = 0; m < R; ++m) {
    float d;
    __builtin_memcpy(&d, dx + static_cast<size_t>(m) * arb, 4);
    acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 16 * m)),
                             _mm512_mul_ps(dwv, _mm512_set1_ps(d)), acc[m]);
    if constexpr (kMin) {
      float sm;
      __builtin_memcpy(&sm, sx + static_cast<size_t>(m) * arb, 4);
      acc[m] = _mm512_fmadd_ps(_mm512_load_ps(dm), _mm512_set1_ps(sm), acc[m]);
    }
  }
}

// Blocks whose weight tiles are formed at once (on the stack: 18 KiB) and
// then run against every tile of activation rows, the accumulators in
// registers; between such chunks they wait in y.
constexpr int64_t kChunkBlocks = 32;

// R: the rows of activation tiles the float step covers (16; fewer when
// the whole call has fewer rows: M <= R).
template <DType T, int R, class Source = TileSource<T>>
__attribute__((target("amx-tile,amx-int8"))) void amx_kernel_rows(const DecodeCtx& c, int64_t n0, int64_t n1) {
  const int64_t K = c.K, nb = K / kQK;
  const size_t arb = c.act_row_bytes;
  configure_tiles(c.M < kTileRows ? static_cast<int>(c.M) : kTileRows, false);
  alignas(64) int8_t btiles[kChunkBlocks][512];
  alignas(64) float dws[kChunkBlocks][kTileRows];
  alignas(64) float dms[kChunkBlocks][kTileRows];
  alignas(64) int32_t cbuf[2][kTileRows * kTileRows] = {};
  for (int64_t nt = n0; nt < n1; nt += kTileRows) {
    const int cols = static_cast<int>(n1 - nt < kTileRows ? n1 - nt : kTileRows);
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    const Source src(c, nt, cols);
    for (int64_t b0 = 0; b0 < nb; b0 += kChunkBlocks) {
      const int64_t nbc = nb - b0 < kChunkBlocks ? nb - b0 : kChunkBlocks;
      for (int64_t j = 0; j < nbc; ++j) src(b0 + j, btiles[j], dws[j], dms[j]);
      for (int64_t m0 = 0; m0 < c.M; m0 += kTileRows) {
        const int rows = static_cast<int>(c.M - m0 < kTileRows ? c.M - m0 : kTileRows);
        float* y = c.y + m0 * c.ldy + nt;
        __m512 acc[R];
        for (int m = 0; m < R; ++m)
          acc[m] = b0 == 0 || m >= rows ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + m * c.ldy);
        const uint8_t* a = c.act + static_cast<size_t>(m0) * arb;
        const uint8_t* dx = a + static_cast<size_t>(K);
        const uint8_t* sx = dx + 4 * static_cast<size_t>(nb);
        constexpr bool kMin = Format<T>::kMin;
        int64_t j = 0;
        for (; j + 2 <= nbc; j += 2) {  // two blocks in flight (accumulator tiles 0 and 3)
          const int64_t b = b0 + j;
          _tile_zero(0);
          _tile_loadd(1, a + 32 * b, static_cast<long>(arb));
          _tile_loadd(2, btiles[j], 64);
          _tile_dpbssd(0, 1, 2);
          _tile_zero(3);
          _tile_loadd(4, a + 32 * (b + 1), static_cast<long>(arb));
          _tile_loadd(5, btiles[j + 1], 64);
          _tile_dpbssd(3, 4, 5);
          _tile_stored(0, cbuf[0], 64);
          accumulate<R, kMin>(acc, cbuf[0], dws[j], dms[j], dx + 4 * b, sx + 4 * b, arb);
          _tile_stored(3, cbuf[1], 64);
          accumulate<R, kMin>(acc, cbuf[1], dws[j + 1], dms[j + 1], dx + 4 * (b + 1), sx + 4 * (b + 1), arb);
        }
        if (j < nbc) {
          const int64_t b = b0 + j;
          _tile_zero(0);
          _tile_loadd(1, a + 32 * b, static_cast<long>(arb));
          _tile_loadd(2, btiles[j], 64);
          _tile_dpbssd(0, 1, 2);
          _tile_stored(0, cbuf[0], 64);
          accumulate<R, kMin>(acc, cbuf[0], dws[j], dms[j], dx + 4 * b, sx + 4 * b, arb);
        }
        for (int m = 0; m < rows; ++m) _mm512_mask_storeu_ps(y + m * c.ldy, mask, acc[m]);
      }
    }
  }
  _tile_release();
}

template <DType T, class Source = TileSource<T>>
void amx_kernel(const DecodeCtx& c, int64_t n0, int64_t n1) {
  if (c.M <= 1) return amx_kernel_rows<T, 1, Source>(c, n0, n1);
  if (c.M <= 2) return amx_kernel_rows<T, 2, Source>(c, n0, n1);
  if (c.M <= 4) return amx_kernel_rows<T, 4, Source>(c, n0, n1);
  if (c.M <= 8) return amx_kernel_rows<T, 8, Source>(c, n0, n1);
  return amx_kernel_rows<T, kTileRows, Source>(c, n0, n1);
}

// The same order on VNNI registers, for tile-layout weights: a register of a
// block's quants is one B-tile row (16 rows x 4 values: register r holds
// values 4r..4r+3), as unsigned bytes, times the four activation bytes it
// meets broadcast; each half block's exact sum per row (lanes) starts at
// -offset * the half's activation sum, so the unsigned quants give the
// signed sums (Q4_0: q - 8; Q8_0: stored plus 128; Q6_K: q - 32; Q4_K: q).
// Then the float step as the tiles' accumulate<> (Q6_K: amx_kernel_q6k's).
struct BlockRegs {
  __m512i w[8];
  __m512 dw, dm, sc1, sc2;  // dm: Q4_K's -(dmin * m); sc1 / sc2: Q6_K's half scales
};

template <DType T>
struct RegSource;  // block b's registers for the 16 rows from nt

// The tile layout (Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0).
template <DType T>
struct RegSource {
  const uint8_t* q;
  const uint8_t* sc;
  size_t next;  // to the next group
  RegSource(const DecodeCtx& c, int64_t nt, int) : next(c.packed_group_bytes) {
    q = c.packed + static_cast<size_t>(nt / kTileGroupRows) * c.packed_group_bytes;
    sc = q + static_cast<size_t>(c.K / kQK) * tile_quant_bytes(T);
  }
  void operator()(int64_t b, BlockRegs& r) const {
    const uint8_t* p = q + static_cast<size_t>(b) * tile_quant_bytes(T);
    const uint8_t* s = sc + tile_scale_bytes(T) * static_cast<size_t>(b);
    // The next group's same block (a distance along this group would leave
    // the start of every group unfetched).
    for (size_t l = 0; l < tile_quant_bytes(T); l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + next + l), _MM_HINT_T1);
    if (tile_min(T) || (b & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(s + next), _MM_HINT_T1);
    tile_values<T>(p, r.w);
    r.dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(s)));
    if constexpr (tile_min(T)) r.dm = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(s + 32)));
  }
};

// Two groups of 8 packed K-quant rows (PackedQ4Kx8 / PackedQ6Kx8): rows nt..nt+7
// and nt+8..nt+15 in the two halves of each register (the second group is the
// first again when the weight ends at nt + 8).
template <class P>
struct Kx8Pair {
  const P* ga;
  const P* gb;
  Kx8Pair(const DecodeCtx& c, int64_t nt, int cols) {
    const uint8_t* base = c.packed + static_cast<size_t>(nt / kKx8PackRows) * c.packed_group_bytes;
    ga = reinterpret_cast<const P*>(base);
    gb = cols > kKx8PackRows ? reinterpret_cast<const P*>(base + c.packed_group_bytes) : ga;
  }
  static __m512i pair(const uint8_t* a, const uint8_t* b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
  }
  static __m512 pairf(const float* a, const float* b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
  }
  // 8 + 8 bytes (sub-block g's scales or mins) as floats.
  template <class B>
  static __m512 bytes16(const B* a, const B* b, int g) {
    uint64_t lo, hi;
    __builtin_memcpy(&lo, a + 8 * g, 8);
    __builtin_memcpy(&hi, b + 8 * g, 8);
    const __m128i v = _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
    if constexpr (sizeof(B) == 1 && static_cast<B>(-1) < 0)
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
    else
      return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
  }
};

template <>
struct RegSource<DType::Q4_K> : Kx8Pair<PackedQ4Kx8> {
  using Kx8Pair::Kx8Pair;
  void operator()(int64_t b, BlockRegs& r) const {
    const PackedQ4Kx8& a = ga[b / 8];
    const PackedQ4Kx8& bb = gb[b / 8];
    const int g = static_cast<int>(b % 8);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m512i z = pair(a.qs + 128 * g + 32 * k, bb.qs + 128 * g + 32 * k);
      r.w[k] = _mm512_and_si512(z, m4);
      r.w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    }
    // (TileSource<Q4_K>'s products, to the bit.)
    r.dw = _mm512_mul_ps(pairf(a.d, bb.d), bytes16(a.sc, bb.sc, g));
    r.dm = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(pairf(a.dmin, bb.dmin), bytes16(a.mn, bb.mn, g)));
  }
};

template <>
struct RegSource<DType::Q6_K> : Kx8Pair<PackedQ6Kx8> {
  using Kx8Pair::Kx8Pair;
  void operator()(int64_t b, BlockRegs& r) const {
    const PackedQ6Kx8& a = ga[b / 8];
    const PackedQ6Kx8& bb = gb[b / 8];
    const int g = static_cast<int>(b % 8);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    const __m512i qh0 = pair(a.grp[g].qh, bb.grp[g].qh), qh1 = pair(a.grp[g].qh + 32, bb.grp[g].qh + 32);
    for (int k = 0; k < 4; ++k) {
      const __m512i ql = pair(a.grp[g].ql + 32 * k, bb.grp[g].ql + 32 * k);
      const __m512i h0 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh0, 2 * k), m2), 4);
      const __m512i h1 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh1, 2 * k), m2), 4);
      r.w[k] = _mm512_or_si512(_mm512_and_si512(ql, m4), h0);
      r.w[k + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h1);
    }
    r.dw = pairf(a.d, bb.d);
    r.sc1 = bytes16(a.sc, bb.sc, 2 * g);
    r.sc2 = bytes16(a.sc, bb.sc, 2 * g + 1);
  }
};

template <DType T, int MT>
inline void vnni_tile_rows(const DecodeCtx& c, const RegSource<T>& src, int64_t nt, int64_t m0, __mmask16 mask) {
  const int64_t K = c.K, nb = K / kQK;
  const size_t arb = c.act_row_bytes;
  const uint8_t* a = c.act + static_cast<size_t>(m0) * arb;
  constexpr int kShift = kTileOffset<T> == 128 ? 7 : kTileOffset<T> == 32 ? 5 : kTileOffset<T> == 16 ? 4 : 3;
  constexpr bool kOffset = kTileOffset<T> != 0;
  __m512 acc[MT];
  for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    BlockRegs r;
    src(b, r);
    for (int m = 0; m < MT; ++m) {
      const uint8_t* am = a + static_cast<size_t>(m) * arb;
      const uint8_t* v = am + 32 * b;
      const uint8_t* scales = am + static_cast<size_t>(K);
      float dx;
      __builtin_memcpy(&dx, scales + 4 * static_cast<size_t>(b), 4);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      if constexpr (kOffset) {
        int32_t h[2];  // the half blocks' activation sums
        __builtin_memcpy(h, scales + 8 * static_cast<size_t>(nb) + 8 * static_cast<size_t>(b), 8);
        s0 = _mm512_set1_epi32(-static_cast<int32_t>(static_cast<uint32_t>(h[0]) << kShift));
        s1 = _mm512_set1_epi32(-static_cast<int32_t>(static_cast<uint32_t>(h[1]) << kShift));
      }
      for (int k = 0; k < 4; ++k) {
        int32_t lo, hi;
        __builtin_memcpy(&lo, v + 4 * k, 4);
        __builtin_memcpy(&hi, v + 16 + 4 * k, 4);
        s0 = _mm512_dpbusd_epi32(s0, r.w[k], _mm512_set1_epi32(lo));
        s1 = _mm512_dpbusd_epi32(s1, r.w[k + 4], _mm512_set1_epi32(hi));
      }
      const __m512 scale = _mm512_mul_ps(r.dw, _mm512_set1_ps(dx));
      if constexpr (T == DType::Q6_K) {
        const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), r.sc1, _mm512_mul_ps(_mm512_cvtepi32_ps(s1), r.sc2));
        acc[m] = _mm512_fmadd_ps(t, scale, acc[m]);
      } else {
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[m]);
        if constexpr (Format<T>::kMin) {  // Q4_1 / Q5_1: m; Q4_K: -(dmin * m)
          float sx;
          __builtin_memcpy(&sx, scales + 4 * static_cast<size_t>(nb + b), 4);
          acc[m] = _mm512_fmadd_ps(r.dm, _mm512_set1_ps(sx), acc[m]);
        }
      }
    }
  }
  for (int m = 0; m < MT; ++m) _mm512_mask_storeu_ps(c.y + (m0 + m) * c.ldy + nt, mask, acc[m]);
}

template <DType T>
void vnni_tile_kernel(const DecodeCtx& c, int64_t n0, int64_t n1) {
  for (int64_t nt = n0; nt < n1; nt += kTileGroupRows) {
    const int cols = static_cast<int>(n1 - nt < kTileGroupRows ? n1 - nt : kTileGroupRows);
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    const RegSource<T> src(c, nt, cols);
    int64_t m = 0;
    for (; m + 4 <= c.M; m += 4) vnni_tile_rows<T, 4>(c, src, nt, m, mask);
    switch (c.M - m) {
      case 3: vnni_tile_rows<T, 3>(c, src, nt, m, mask); break;
      case 2: vnni_tile_rows<T, 2>(c, src, nt, m, mask); break;
      case 1: vnni_tile_rows<T, 1>(c, src, nt, m, mask); break;
      default: break;
    }
  }
}

// Q6_K: block b is 32-value group b % 8 of super-block b / 8, two 16-value
// sub-blocks with int8 scales sc1 and sc2; values q - 32. Per block the two
// halves' exact sums s1 and s2 (two tdpbssd of K = 16) make the exact
// integer t = s1 * sc1 + s2 * sc2 (|t| < 2^24: exact in f32), then
// acc = fma(t, d * dx, acc). src(b, tile, d, sc1, sc2): tile rows 0..3 hold
// the first half, 4..7 the second. Packed rows (PackedQ6Kx8, groups of 8)
// are interleaved as a B tile wants them; GGUF rows are transposed.
struct Q6KSource {
  const DecodeCtx& c;
  int64_t nt;
  int cols;
  Q6KSource(const DecodeCtx& ctx, int64_t n0, int n) : c(ctx), nt(n0), cols(n) {}
  void operator()(int64_t b, int8_t* tile, float* dw, float* sc1, float* sc2) const {
    const int64_t sb = b / 8;
    const int g = static_cast<int>(b % 8);
    const __mmask16 live = static_cast<__mmask16>((1u << cols) - 1);
    if (c.packed) {
      const uint8_t* base = c.packed + static_cast<size_t>(nt / kKx8PackRows) * c.packed_group_bytes;
      const auto* ga = reinterpret_cast<const PackedQ6Kx8*>(base) + sb;
      const auto* gb = cols > 8 ? reinterpret_cast<const PackedQ6Kx8*>(base + c.packed_group_bytes) + sb : ga;
      auto pair = [](const uint8_t* a, const uint8_t* bb) {
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bb)), 1);
      };
      const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3), off = _mm512_set1_epi8(32);
      const __m512i qh0 = pair(ga->grp[g].qh, gb->grp[g].qh), qh1 = pair(ga->grp[g].qh + 32, gb->grp[g].qh + 32);
      for (int k = 0; k < 4; ++k) {
        const __m512i ql = pair(ga->grp[g].ql + 32 * k, gb->grp[g].ql + 32 * k);
        const __m512i h0 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh0, 2 * k), m2), 4);
        const __m512i h1 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh1, 2 * k), m2), 4);
        _mm512_store_si512(reinterpret_cast<__m512i*>(tile + 64 * k),
                           _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(ql, m4), h0), off));
        _mm512_store_si512(reinterpret_cast<__m512i*>(tile + 64 * (k + 4)),
                           _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), h1), off));
      }
      _mm512_store_ps(dw, _mm512_maskz_mov_ps(live, _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(ga->d)),
                                                                       _mm256_loadu_ps(gb->d), 1)));
      auto scales = [&](int s) {
        uint64_t lo, hi;
        __builtin_memcpy(&lo, ga->sc + 8 * s, 8);
        __builtin_memcpy(&hi, gb->sc + 8 * s, 8);
        return _mm512_maskz_mov_ps(live, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                             _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo)))));
      };
      _mm512_store_ps(sc1, scales(2 * g));
      _mm512_store_ps(sc2, scales(2 * g + 1));
      return;
    }
    // GGUF: group g is quarter q = g % 4 of half h = g / 4: ql bytes
    // 64 h + 32 (q & 1) + l (nibble q >> 1), qh bytes 32 h + l (bits 2q),
    // scales 8 h + 2 q and + 1.
    const int h = g / 4, q = g % 4;
    __m512i z[8];
    alignas(64) float ds[kTileRows], s1[kTileRows], s2[kTileRows];
    for (int n = 0; n < kTileRows; ++n) {
      const int64_t r = nt + (n < cols ? n : 0);
      const auto* blk = reinterpret_cast<const BlockQ6_K*>(c.w + static_cast<size_t>(r) * c.w_row_bytes) + sb;
      const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h + 32 * (q & 1)));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
      const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (q >> 1)), _mm256_set1_epi8(0x0F));
      const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * q), _mm256_set1_epi8(3)), 4);
      const __m256i v = _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
      z[n % 8] = n < 8 ? _mm512_castsi256_si512(v) : _mm512_inserti64x4(z[n % 8], v, 1);
      uint16_t hd;
      __builtin_memcpy(&hd, &blk->d, 2);
      ds[n] = _cvtsh_ss(hd);
      s1[n] = static_cast<float>(blk->scales[8 * h + 2 * q]);
      s2[n] = static_cast<float>(blk->scales[8 * h + 2 * q + 1]);
    }
    transpose_to_tile(z, tile);
    _mm512_store_ps(dw, _mm512_maskz_mov_ps(live, _mm512_load_ps(ds)));
    _mm512_store_ps(sc1, _mm512_maskz_mov_ps(live, _mm512_load_ps(s1)));
    _mm512_store_ps(sc2, _mm512_maskz_mov_ps(live, _mm512_load_ps(s2)));
  }
};

template <int R>
__attribute__((target("amx-tile,amx-int8"))) void amx_kernel_q6k_rows(const DecodeCtx& c, int64_t n0, int64_t n1) {
  const int64_t K = c.K, nb = K / kQK;
  const size_t arb = c.act_row_bytes;
  configure_tiles(c.M < kTileRows ? static_cast<int>(c.M) : kTileRows, true);
  alignas(64) int8_t btiles[kChunkBlocks][512];
  alignas(64) float dws[kChunkBlocks][kTileRows], sc1[kChunkBlocks][kTileRows], sc2[kChunkBlocks][kTileRows];
  alignas(64) int32_t cbuf[2][kTileRows * kTileRows] = {};
  for (int64_t nt = n0; nt < n1; nt += kTileRows) {
    const int cols = static_cast<int>(n1 - nt < kTileRows ? n1 - nt : kTileRows);
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    const Q6KSource src(c, nt, cols);
    for (int64_t b0 = 0; b0 < nb; b0 += kChunkBlocks) {
      const int64_t nbc = nb - b0 < kChunkBlocks ? nb - b0 : kChunkBlocks;
      for (int64_t j = 0; j < nbc; ++j) src(b0 + j, btiles[j], dws[j], sc1[j], sc2[j]);
      for (int64_t m0 = 0; m0 < c.M; m0 += kTileRows) {
        const int rows = static_cast<int>(c.M - m0 < kTileRows ? c.M - m0 : kTileRows);
        float* y = c.y + m0 * c.ldy + nt;
        __m512 acc[R];
        for (int m = 0; m < R; ++m)
          acc[m] = b0 == 0 || m >= rows ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + m * c.ldy);
        const uint8_t* a = c.act + static_cast<size_t>(m0) * arb;
        const uint8_t* dx = a + static_cast<size_t>(K);
        for (int64_t j = 0; j < nbc; ++j) {
          const int64_t b = b0 + j;
          _tile_zero(0);
          _tile_loadd(1, a + 32 * b, static_cast<long>(arb));
          _tile_loadd(2, btiles[j], 64);
          _tile_dpbssd(0, 1, 2);
          _tile_zero(3);
          _tile_loadd(4, a + 32 * b + 16, static_cast<long>(arb));
          _tile_loadd(5, btiles[j] + 256, 64);
          _tile_dpbssd(3, 4, 5);
          _tile_stored(0, cbuf[0], 64);
          _tile_stored(3, cbuf[1], 64);
          const __m512 dwv = _mm512_load_ps(dws[j]), s1v = _mm512_load_ps(sc1[j]), s2v = _mm512_load_ps(sc2[j]);
          for (int m = 0; m < R; ++m) {
            float d;
            __builtin_memcpy(&d, dx + static_cast<size_t>(m) * arb + 4 * static_cast<size_t>(b), 4);
            // (Exact: integers below 2^24.)
            const __m512 t =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf[0] + 16 * m)), s1v,
                                _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf[1] + 16 * m)), s2v));
            acc[m] = _mm512_fmadd_ps(t, _mm512_mul_ps(dwv, _mm512_set1_ps(d)), acc[m]);
          }
        }
        for (int m = 0; m < rows; ++m) _mm512_mask_storeu_ps(y + m * c.ldy, mask, acc[m]);
      }
    }
  }
  _tile_release();
}

void amx_kernel_q6k(const DecodeCtx& c, int64_t n0, int64_t n1) {
  if (c.M <= 1) return amx_kernel_q6k_rows<1>(c, n0, n1);
  if (c.M <= 2) return amx_kernel_q6k_rows<2>(c, n0, n1);
  if (c.M <= 4) return amx_kernel_q6k_rows<4>(c, n0, n1);
  if (c.M <= 8) return amx_kernel_q6k_rows<8>(c, n0, n1);
  return amx_kernel_q6k_rows<kTileRows>(c, n0, n1);
}

}  // namespace

// Rows as amx_act_row_bytes lays them out (matmul_internal.h).

void amx_prepare_acts(const float* x, int64_t M, int64_t K, uint8_t* act) {
  const size_t arb = amx_act_row_bytes(K);
  const int64_t nb = K / kQK;
  for (int64_t m = 0; m < M; ++m) {
    uint8_t* row = act + static_cast<size_t>(m) * arb;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * kQK;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float id = amax != 0.f ? 127.f / amax : 0.f;  // quantize_block_q8_scalar's values
      const __m512 mul = _mm512_set1_ps(id), lim = _mm512_set1_ps(127.f);
      constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      __m512 r0 = _mm512_roundscale_ps(_mm512_mul_ps(v0, mul), kRound);
      __m512 r1 = _mm512_roundscale_ps(_mm512_mul_ps(v1, mul), kRound);
      r0 = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), lim), _mm512_min_ps(lim, r0));
      r1 = _mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), lim), _mm512_min_ps(lim, r1));
      const __m512i i0 = _mm512_cvtps_epi32(r0), i1 = _mm512_cvtps_epi32(r1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 32 * b), _mm512_cvtepi32_epi8(i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 32 * b + 16), _mm512_cvtepi32_epi8(i1));
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
      float d, s;
      act_block_scales(DType::Q4_1, amax, sum, &d, &s);  // (sx: the Q8_1 rule)
      __builtin_memcpy(row + static_cast<size_t>(K) + 4 * static_cast<size_t>(b), &d, 4);
      __builtin_memcpy(row + static_cast<size_t>(K) + 4 * static_cast<size_t>(nb + b), &s, 4);
      const int32_t halves[2] = {_mm512_reduce_add_epi32(i0), _mm512_reduce_add_epi32(i1)};
      __builtin_memcpy(row + static_cast<size_t>(K) + 8 * static_cast<size_t>(nb + b), halves, 8);
    }
  }
}

DecodeKernel amx_kernel_for(DType t) {
  switch (t) {
    case DType::Q4_0: return amx_kernel<DType::Q4_0>;
    case DType::Q4_1: return amx_kernel<DType::Q4_1>;
    case DType::Q5_0: return amx_kernel<DType::Q5_0>;
    case DType::Q5_1: return amx_kernel<DType::Q5_1>;
    case DType::Q8_0: return amx_kernel<DType::Q8_0>;
    case DType::Q4_K: return amx_kernel<DType::Q4_K>;
    case DType::Q6_K: return amx_kernel_q6k;
    default: return nullptr;
  }
}

DecodeKernel amx_tile_kernel_for(DType t) {
  switch (t) {
    case DType::Q4_0: return amx_kernel<DType::Q4_0, TiledSource<DType::Q4_0>>;
    case DType::Q4_1: return amx_kernel<DType::Q4_1, TiledSource<DType::Q4_1>>;
    case DType::Q5_0: return amx_kernel<DType::Q5_0, TiledSource<DType::Q5_0>>;
    case DType::Q5_1: return amx_kernel<DType::Q5_1, TiledSource<DType::Q5_1>>;
    case DType::Q8_0: return amx_kernel<DType::Q8_0, TiledSource<DType::Q8_0>>;
    case DType::Q4_K: return amx_kernel<DType::Q4_K>;  // (TileSource<Q4_K> reads the packed groups)
    case DType::Q6_K: return amx_kernel_q6k;
    default: return nullptr;
  }
}

DecodeKernel vnni_tile_kernel_for(DType t) {
  switch (t) {
    case DType::Q4_0: return vnni_tile_kernel<DType::Q4_0>;
    case DType::Q4_1: return vnni_tile_kernel<DType::Q4_1>;
    case DType::Q5_0: return vnni_tile_kernel<DType::Q5_0>;
    case DType::Q5_1: return vnni_tile_kernel<DType::Q5_1>;
    case DType::Q8_0: return vnni_tile_kernel<DType::Q8_0>;
    case DType::Q4_K: return vnni_tile_kernel<DType::Q4_K>;
    case DType::Q6_K: return vnni_tile_kernel<DType::Q6_K>;
    default: return nullptr;
  }
}

}  // namespace ember::cpu::detail
