// The CPU backend: activations in host memory, weights read in place from the
// model's mapping, OpenMP threads (one pool, shared with oneDNN).
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "cpu/cpu_backend.h"
#include "core/backend/registry.h"
#include "core/util/status.h"
#include "cpu/matmul.h"

namespace ember {
namespace {

class CpuWeight final : public DeviceWeight {};

// Attention limits (per-thread stack state of the kernel).
constexpr int kAttnMaxGroup = 16;      // query heads per kv head
constexpr int kAttnMaxHeadDim = 256;

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

class CpuBackend final : public Backend {
 public:
  CpuBackend(int n_threads, bool batch_invariant)
      : n_threads_(n_threads > 0 ? n_threads : omp_get_num_procs()), batch_invariant_(batch_invariant) {}
  ~CpuBackend() override { release_kv(); }

  std::string name() const override { return std::string("cpu/") + cpu::isa_name(); }

  void* alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 64) + 63) / 64 * 64);
    if (!p) fail(StatusCode::kOutOfMemory, "cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free_buffer(void* ptr) override { std::free(ptr); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  std::unique_ptr<DeviceWeight> upload_weight(const WeightDesc& desc) override {
    auto w = std::make_unique<CpuWeight>();
    w->desc = desc;
    return w;
  }

  // The pool is reserved, not committed: anonymous zero pages that become
  // resident as blocks are first written, so an engine with a large budget
  // costs the host only the memory its sequences use.
  void kv_init(const KvGeometry& g) override {
    geom_ = g;
    release_kv();
    const size_t bytes = g.bytes_per_block() * static_cast<size_t>(g.num_blocks);
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fail(StatusCode::kOutOfMemory, "cpu backend: cannot reserve the KV pool (" + std::to_string(bytes) + " bytes)");
    }
    kv_ = static_cast<uint16_t*>(p);
    kv_bytes_ = bytes;
  }

  void kv_copy_blocks(const int32_t* src, const int32_t* dst, int32_t n) override {
    const size_t per_layer_block = block_elems();
    for (int32_t l = 0; l < geom_.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int32_t i = 0; i < n; ++i) {
          std::memcpy(block_ptr(l, kv, dst[i]), block_ptr(l, kv, src[i]), per_layer_block * sizeof(uint16_t));
        }
      }
    }
  }

  bool supports_cache_policies() const override { return true; }
  BackendLimits limits() const override {
    BackendLimits l;
    l.max_head_dim = kAttnMaxHeadDim;
    l.max_gqa_group = kAttnMaxGroup;
    l.head_dim_multiple = 8;
    return l;
  }

  void kv_rope_shift(const int32_t* blocks, int32_t n, int32_t delta, int32_t rot_dim, float freq_base) override {
    // One rotation by `delta` for every slot (RoPE(p+d) = R(d) RoPE(p)); the
    // angles in double so that repeated shifts add only the f16 rounding.
    const int32_t half = rot_dim / 2, hd = geom_.head_dim;
    if (hd > 512 || rot_dim > hd) fail(StatusCode::kInternal, "kv_rope_shift: unsupported head_dim");
    // Per element: out = x * c + swap_pairs(x) * s, with c = (cos, cos) and
    // s = (-sin, +sin) per pair; dims past rot_dim are left as they are.
    alignas(32) float cs[512], sn[512];
    for (int32_t i = 0; i < hd / 2; ++i) {
      double c = 1.0, s = 0.0;
      if (i < half) {
        const double theta = delta * std::pow(static_cast<double>(freq_base), -2.0 * i / rot_dim);
        c = std::cos(theta);
        s = std::sin(theta);
      }
      cs[2 * i] = cs[2 * i + 1] = static_cast<float>(c);
      sn[2 * i] = static_cast<float>(-s);
      sn[2 * i + 1] = static_cast<float>(s);
    }
    const int32_t items = geom_.num_layers * n;
    const size_t rows = static_cast<size_t>(geom_.num_kv_heads) * geom_.block_size;
#pragma omp parallel for num_threads(n_threads_) if (items > 4)
    for (int32_t it = 0; it < items; ++it) {
      const int32_t layer = it / n, block = blocks[it % n];
      if (block < 0 || block >= geom_.num_blocks) continue;
      uint16_t* k = block_ptr(layer, 0, block);
      for (size_t r = 0; r < rows; ++r) {
        uint16_t* kr = k + r * hd;
        int32_t i = 0;
        for (; i + 8 <= hd; i += 8) {
          const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kr + i)));
          const __m256 sw = _mm256_permute_ps(x, 0xB1);  // (x1, x0) in every pair
          const __m256 y = _mm256_fmadd_ps(sw, _mm256_load_ps(sn + i), _mm256_mul_ps(x, _mm256_load_ps(cs + i)));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(kr + i), _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT));
        }
        for (; i + 2 <= hd; i += 2) {
          const float x0 = f16_to_f32(kr[i]), x1 = f16_to_f32(kr[i + 1]);
          kr[i] = _cvtss_sh(x0 * cs[i] + x1 * sn[i], _MM_FROUND_TO_NEAREST_INT);
          kr[i + 1] = _cvtss_sh(x1 * cs[i + 1] + x0 * sn[i + 1], _MM_FROUND_TO_NEAREST_INT);
        }
      }
    }
  }

  void kv_read_block(int32_t block, void* dst) override {
    if (block < 0 || block >= geom_.num_blocks) fail(StatusCode::kInternal, "kv_read_block: block outside the pool");
    const size_t bytes = block_elems() * sizeof(uint16_t);
    auto* out = static_cast<uint8_t*>(dst);
    for (int32_t l = 0; l < geom_.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv, out += bytes) std::memcpy(out, block_ptr(l, kv, block), bytes);
    }
  }

  void kv_write_block(int32_t block, const void* src) override {
    if (block < 0 || block >= geom_.num_blocks) fail(StatusCode::kInternal, "kv_write_block: block outside the pool");
    const size_t bytes = block_elems() * sizeof(uint16_t);
    const auto* in = static_cast<const uint8_t*>(src);
    for (int32_t l = 0; l < geom_.num_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv, in += bytes) std::memcpy(block_ptr(l, kv, block), in, bytes);
    }
  }

  void embed(const DeviceWeight& table, const int32_t* ids, int32_t n, float* out) override {
    const auto& d = table.desc;
    cpu::WeightView w{d.type, d.rows, d.cols, d.host_data};
    for (int32_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= d.rows) fail(StatusCode::kInvalidArgument, "token id out of range");
      cpu::dequantize_rows(w, ids[i], 1, out + static_cast<size_t>(i) * d.cols);
    }
  }

  void rms_norm(const float* x, const DeviceWeight& weight, int32_t rows, int32_t dim, float eps,
                float* out) override {
    const float* w = static_cast<const float*>(weight.desc.host_data);
#pragma omp parallel for num_threads(n_threads_) if (rows > 8)
    for (int32_t r = 0; r < rows; ++r) {
      const float* xr = x + static_cast<size_t>(r) * dim;
      float* o = out + static_cast<size_t>(r) * dim;
      // As ggml_rms_norm: f32 squares summed in double, mean and scale in f32.
      double sum = 0.0;
      for (int32_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i] * xr[i]);
      const float mean = static_cast<float>(sum / dim);
      const float scale = 1.0f / std::sqrt(mean + eps);
      for (int32_t i = 0; i < dim; ++i) o[i] = xr[i] * scale * w[i];
    }
  }

  void matmul(const DeviceWeight& w, const float* x, int32_t M, float* y, bool rows_are_decodes) override {
    const auto& d = w.desc;
    cpu::WeightView view{d.type, d.rows, d.cols, d.host_data};
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    omp_set_num_threads(n_threads_);
    if (batch_invariant_) {
      // Ember's kernels for every M: a row's result never depends on what it
      // is batched with (and on CPUs without native bf16 they also beat the
      // oneDNN f32 path, see docs/BENCHMARKS.md).
      cpu::matmul(view, x, M, y, scratch_, cpu::MatmulPath::kRowInvariant);
      return;
    }
    if (!rows_are_decodes) {
      cpu::matmul(view, x, M, y, scratch_);
      return;
    }
    // The decode kernels compute each row independently of M; keep every
    // chunk within their range so no row falls through to the GEMM path.
    const int64_t chunk = std::max<int64_t>(1, cpu::decode_max_m());
    for (int64_t first = 0; first < M; first += chunk) {
      const int64_t m = std::min<int64_t>(chunk, M - first);
      cpu::matmul(view, x + first * d.cols, m, y + first * d.rows, scratch_);
    }
  }

  void rope(float* x, const int32_t* positions, int32_t rows, int32_t num_heads, int32_t head_dim,
            int32_t rot_dim, float freq_base) override {
    const int32_t half = rot_dim / 2;
    // Angles as llama.cpp's rope cache makes them (float recurrence
    // theta_{i+1} = theta_i * base^(-2/rot_dim) from theta_0 = pos): the
    // rounding then matches the reference's, not just the formula.
    const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(rot_dim));
#pragma omp parallel for num_threads(n_threads_) if (rows > 8)
    for (int32_t r = 0; r < rows; ++r) {
      float theta = static_cast<float>(positions[r]);
      for (int32_t i = 0; i < half; ++i, theta *= theta_scale) {
        const float c = std::cos(theta), s = std::sin(theta);
        for (int32_t h = 0; h < num_heads; ++h) {
          float* p = x + (static_cast<size_t>(r) * num_heads + h) * head_dim + 2 * i;
          const float x0 = p[0], x1 = p[1];
          // The reference's compiler contracts these into FMAs, x0's
          // product fused and x1's rounded: the same here.
          p[0] = std::fma(x0, c, -(x1 * s));
          p[1] = std::fma(x0, s, x1 * c);
        }
      }
    }
  }

  void kv_store(int32_t layer, const float* k, const float* v, const int32_t* slots, int32_t rows) override {
    const int32_t nkv = geom_.num_kv_heads, hd = geom_.head_dim, bs = geom_.block_size;
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t block = slots[r] / bs, off = slots[r] % bs;
      if (block < 0 || block >= geom_.num_blocks) fail(StatusCode::kInternal, "kv_store: slot outside the pool");
      for (int32_t h = 0; h < nkv; ++h) {
        const size_t src = (static_cast<size_t>(r) * nkv + h) * hd;
        uint16_t* kd = block_ptr(layer, 0, block) + (static_cast<size_t>(h) * bs + off) * hd;
        uint16_t* vd = block_ptr(layer, 1, block) + (static_cast<size_t>(h) * bs + off) * hd;
        convert_row(k + src, kd, hd);
        convert_row(v + src, vd, hd);
      }
    }
  }

  void attention(int32_t layer, const float* q, const AttentionSeq* seqs, int32_t n_seqs,
                 const AttentionParams& p, float* out) override {
    // Work items: (sequence row, kv head). Each handles the group of query
    // heads that share the kv head, so K/V are read once per group.
    std::vector<std::pair<int32_t, int32_t>> rows;  // (seq index, row)
    for (int32_t s = 0; s < n_seqs; ++s) {
      for (int32_t r = 0; r < seqs[s].n_rows; ++r) rows.emplace_back(s, seqs[s].first_row + r);
    }
    // Checked here, not in the workers: nothing may throw inside an OpenMP region.
    if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0 || p.num_heads / p.num_kv_heads > kAttnMaxGroup ||
        p.head_dim <= 0 || p.head_dim > kAttnMaxHeadDim || p.head_dim % 8 != 0) {
      fail(StatusCode::kUnsupported, "cpu attention: " + std::to_string(p.num_heads) + " heads over " +
                                         std::to_string(p.num_kv_heads) + " kv heads of " + std::to_string(p.head_dim) +
                                         " not supported (head_dim a multiple of 8 up to 256, at most 16 heads per kv head)");
    }
    const int32_t items = static_cast<int32_t>(rows.size()) * p.num_kv_heads;
    std::atomic<bool> out_of_memory{false};  // (the per-thread scratch may fail to grow)
#pragma omp parallel for num_threads(n_threads_) schedule(dynamic, 1)
    for (int32_t it = 0; it < items; ++it) {
      const auto [s, row] = rows[it / p.num_kv_heads];
      try {
        attend_group(layer, q, seqs[s], row, it % p.num_kv_heads, p, out);
      } catch (...) {
        out_of_memory = true;
      }
    }
    if (out_of_memory) fail(StatusCode::kOutOfMemory, "cpu attention: cannot allocate its scratch");
  }

  // SiLU(gate) * up as llama.cpp computes it: gate / (1 + expf8(0 - gate)),
  // then the product; libm's expf for a tail of fewer than 8.
  void swiglu(const float* gate, const float* up, size_t n, float* out) override {
    const size_t n8 = n & ~size_t{7};
    const __m256 one = _mm256_set1_ps(1.0f);
#pragma omp parallel for num_threads(n_threads_) if (n > 65536)
    for (size_t i = 0; i < n8; i += 8) {
      const __m256 g = _mm256_loadu_ps(gate + i);
      const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, expf8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
      _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    for (size_t i = n8; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }

  void add(float* x, const float* y, size_t n) override {
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
  }

  void gather_rows(const float* x, const int32_t* rows, int32_t n, int32_t dim, float* out) override {
    for (int32_t i = 0; i < n; ++i) {
      std::memcpy(out + static_cast<size_t>(i) * dim, x + static_cast<size_t>(rows[i]) * dim, dim * sizeof(float));
    }
  }

 private:
  void release_kv() {
    if (kv_) munmap(kv_, kv_bytes_);
    kv_ = nullptr;
    kv_bytes_ = 0;
  }
  size_t block_elems() const {
    return static_cast<size_t>(geom_.num_kv_heads) * geom_.block_size * geom_.head_dim;
  }
  // kv: 0 = K, 1 = V.
  uint16_t* block_ptr(int32_t layer, int kv, int32_t block) const {
    const size_t layer_stride = 2 * block_elems() * geom_.num_blocks;
    return kv_ + layer * layer_stride + kv * block_elems() * geom_.num_blocks + block * block_elems();
  }

  static void convert_row(const float* src, uint16_t* dst, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    }
    for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
  }

  // exp of 8 floats by the algorithm of llama.cpp's ggml_v_expf (AVX2): n =
  // round(x / ln 2) through the 1.5 * 2^23 shifter, b = x - n ln 2 in two
  // parts, a degree-5 polynomial j ~ e^b - 1, result 2^n (1 + j); |n| > 126
  // is rescaled through two powers of two, |n| > 192 saturates to 0 or inf.
  // Same operations, same constants, so the same bits as the reference's
  // softmax and SiLU (exp(-inf) is exactly 0).
  static __m256 expf8(__m256 x) {
    const __m256 shifter = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shifter);
    const __m256 n = _mm256_sub_ps(z, shifter);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 hi = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
    const __m256 lo = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
    const __m256 j = _mm256_fmadd_ps(_mm256_fmadd_ps(hi, u, lo), u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (!_mm256_movemask_ps(big)) return _mm256_fmadd_ps(j, k, k);
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32(static_cast<int>(0x82000000u)));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    const __m256 normal = _mm256_fmadd_ps(k, j, k);
    return _mm256_blendv_ps(_mm256_blendv_ps(normal, scaled, big), _mm256_mul_ps(s1, s1), huge);
  }

  // Horizontal sums of 8 lanes in two fixed orders (those of llama.cpp's
  // AVX2 code; hsum8_reference in cpu/matmul_internal.h spells out the first):
  //   hsum8:     ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))
  //   hsum8_hadd: ((l0+l4) + (l1+l5)) + ((l2+l6) + (l3+l7))
  static float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
  }
  static float hsum8_hadd(__m256 v) {
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
  }
  static __m256 round_f16(__m256 v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }

  // Dot product of an f16 cache row with an f16-rounded query, n a multiple
  // of 8, in one of the two orders of llama.cpp's KQ product:
  //  - "tile" (its batched path, llamafile's tinyBLAS): one 8-lane FMA
  //    accumulator over the row, hsum8;
  //  - "vec" (its one-token path, ggml_vec_dot_f16): four accumulators over
  //    32-element steps, reduced (a0+a2) + (a1+a3), then hsum8_hadd, the
  //    elements past the last full step added in double.
  // Products of two f16 values are exact in f32, so only the order of the
  // additions matters, and it is the reference's.
  static float dot_f16(const uint16_t* k, const float* q, int32_t n, bool vec_order) {
    if (!vec_order) {
      __m256 acc = _mm256_setzero_ps();
      for (int32_t i = 0; i < n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i))),
                              _mm256_loadu_ps(q + i), acc);
      return hsum8(acc);
    }
    const int32_t np = n & ~31;
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int32_t i = 0; i < np; i += 32)
      for (int j = 0; j < 4; ++j)
        a[j] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i + 8 * j))),
                               _mm256_loadu_ps(q + i + 8 * j), a[j]);
    double sum = hsum8_hadd(_mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3])));
    for (int32_t i = np; i < n; ++i) sum += static_cast<double>(f16_to_f32(k[i]) * q[i]);
    return static_cast<float>(sum);
  }

  // Attention for one query row and one kv-head group, computed as llama.cpp
  // computes it without flash attention, so that the logits are the
  // reference's to the bit (docs/BENCHMARKS.md, agreement with llama.cpp):
  //   1. the query rounded to f16; scores s_i = dot(K_i, q) * scale in the
  //      vec order for a generated token fed back (AttentionParams::
  //      decode_rows: llama.cpp's one-token decode), the tile order for
  //      prompt and scored rows (its batched evaluation). The order depends
  //      on the row's token alone, never on how the row is batched or chunked;
  //      a sequence recomputed after a preemption gets the same results;
  //   2. softmax over the row: max, e_i = expf8(s_i - max), the sum of each
  //      8-slot chunk (hsum8) accumulated in double, e_i * (float)(1 / sum),
  //      and the probabilities rounded to f16;
  //   3. out[d] = sum_i P_i V_i[d], slot i on accumulator lane i % 8 (tile)
  //      or i % 32 (vec: four 8-lane accumulators per 32-slot step), reduced
  //      in the same trees as the dot products.
  // Slots are numbered by cache slot (block b, offset t: i = b * block_size +
  // t); slots past kv_len or inside the sequence's hole get probability 0,
  // which adds exactly nothing. K rows are read from the f16 cache once per
  // group, V rows once per query head.
  void attend_group(int32_t layer, const float* q, const AttentionSeq& seq, int32_t row, int32_t kvh,
                    const AttentionParams& p, float* out) const {
    constexpr int kMaxGroup = kAttnMaxGroup;
    constexpr int kMaxHeadDim = kAttnMaxHeadDim;
    const int32_t group = p.num_heads / p.num_kv_heads;
    const int32_t hd = p.head_dim, bs = geom_.block_size;
    const int32_t kv_len = p.kv_len[row];
    const bool vec_order = p.decode_rows && p.decode_rows[row];
    const int32_t n_lanes = vec_order ? 32 : 8;
    const int32_t n_pad = (kv_len + 31) & ~31;
    const bool has_hole = seq.hole_end > seq.hole_begin;
    auto masked = [&](int32_t i) { return has_hole && i >= seq.hole_begin && i < seq.hole_end; };
    thread_local std::vector<float> sc, acc;
    if (sc.size() < static_cast<size_t>(group) * n_pad) sc.resize(static_cast<size_t>(group) * n_pad);
    if (acc.size() < static_cast<size_t>(32) * hd) acc.resize(static_cast<size_t>(32) * hd);
    const float* qrow = q + static_cast<size_t>(row) * p.num_heads * hd;
    alignas(32) float qh[kMaxGroup][kMaxHeadDim];
    for (int g = 0; g < group; ++g) {
      const float* src = qrow + static_cast<size_t>(kvh * group + g) * hd;
      for (int32_t i = 0; i < hd; i += 8) _mm256_store_ps(qh[g] + i, round_f16(_mm256_loadu_ps(src + i)));
    }
    auto k_row = [&](int32_t i) {
      return block_ptr(layer, 0, seq.block_table[i / bs]) + (static_cast<size_t>(kvh) * bs + i % bs) * hd;
    };
    auto v_row = [&](int32_t i) {
      return block_ptr(layer, 1, seq.block_table[i / bs]) + (static_cast<size_t>(kvh) * bs + i % bs) * hd;
    };
    // 1. scores
    for (int32_t i = 0; i < n_pad; ++i) {
      if (i >= kv_len || masked(i)) {
        for (int g = 0; g < group; ++g) sc[static_cast<size_t>(g) * n_pad + i] = -INFINITY;
        continue;
      }
      const uint16_t* kr = k_row(i);
      for (int g = 0; g < group; ++g) sc[static_cast<size_t>(g) * n_pad + i] = dot_f16(kr, qh[g], hd, vec_order) * p.scale;
    }
    for (int g = 0; g < group; ++g) {
      float* o = out + (static_cast<size_t>(row) * p.num_heads + kvh * group + g) * hd;
      float* s = sc.data() + static_cast<size_t>(g) * n_pad;
      // 2. softmax, probabilities rounded to f16
      float mx = -INFINITY;
      for (int32_t i = 0; i < kv_len; ++i) mx = std::max(mx, s[i]);
      if (mx == -INFINITY) {  // nothing to attend to
        std::fill(o, o + hd, 0.0f);
        continue;
      }
      const __m256 vmax = _mm256_set1_ps(mx);
      double sum = 0.0;
      for (int32_t i = 0; i < n_pad; i += 8) {
        const __m256 e = expf8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmax));
        _mm256_storeu_ps(s + i, e);
        sum += static_cast<double>(hsum8(e));
      }
      const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
      for (int32_t i = 0; i < n_pad; i += 8) _mm256_storeu_ps(s + i, round_f16(_mm256_mul_ps(_mm256_loadu_ps(s + i), inv)));
      // 3. V, slot i on lane i % n_lanes
      std::fill(acc.begin(), acc.begin() + static_cast<size_t>(n_lanes) * hd, 0.0f);
      for (int32_t i = 0; i < kv_len; ++i) {
        if (s[i] == 0.0f) continue;  // (masked or underflowed: adds exactly nothing)
        const uint16_t* vr = v_row(i);
        float* a = acc.data() + static_cast<size_t>(i % n_lanes) * hd;
        const __m256 w = _mm256_set1_ps(s[i]);
        for (int32_t d = 0; d < hd; d += 8) {
          const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + d)));
          _mm256_storeu_ps(a + d, _mm256_fmadd_ps(w, v, _mm256_loadu_ps(a + d)));
        }
      }
      auto lane = [&](int l, int32_t d) { return _mm256_loadu_ps(acc.data() + static_cast<size_t>(l) * hd + d); };
      for (int32_t d = 0; d < hd; d += 8) {
        __m256 l[8];
        if (!vec_order) {
          for (int k = 0; k < 8; ++k) l[k] = lane(k, d);
        } else {
          for (int k = 0; k < 8; ++k)
            l[k] = _mm256_add_ps(_mm256_add_ps(lane(k, d), lane(16 + k, d)), _mm256_add_ps(lane(8 + k, d), lane(24 + k, d)));
        }
        const __m256 t0 = _mm256_add_ps(l[0], l[4]), t1 = _mm256_add_ps(l[1], l[5]);
        const __m256 t2 = _mm256_add_ps(l[2], l[6]), t3 = _mm256_add_ps(l[3], l[7]);
        const __m256 r = vec_order ? _mm256_add_ps(_mm256_add_ps(t0, t1), _mm256_add_ps(t2, t3))
                                   : _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
        _mm256_storeu_ps(o + d, r);
      }
    }
  }

  int n_threads_;
  bool batch_invariant_;
  KvGeometry geom_;
  uint16_t* kv_ = nullptr;
  size_t kv_bytes_ = 0;
  std::mutex scratch_mutex_;
  cpu::MatmulScratch scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads, bool batch_invariant) {
  return std::make_unique<CpuBackend>(n_threads, batch_invariant);
}

void register_cpu_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_backend("cpu", [](const BackendOptions& o) { return make_cpu_backend(o.n_threads, o.batch_invariant); });
  });
}

}  // namespace ember
