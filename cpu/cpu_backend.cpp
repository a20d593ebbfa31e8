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

#include "core/backend/backend.h"
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
          p[0] = x0 * c - x1 * s;
          p[1] = x0 * s + x1 * c;
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

  void swiglu(const float* gate, const float* up, size_t n, float* out) override {
#pragma omp parallel for num_threads(n_threads_) if (n > 65536)
    for (size_t i = 0; i < n; ++i) {
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

  // exp of 8 floats (Cephes' expf: range reduction by ln 2 and a degree-6
  // polynomial; within 2 ulp of expf on [-88, 88], 0 below).
  static __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365447505531f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
  }

  static float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
  }

  static void f16_rows_to_f32(const uint16_t* src, float* dst, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
  }

  // Flash-style attention for one query row and one kv-head group: one pass
  // over the sequence's blocks with an online softmax, a block at a time.
  // A block's K and V are widened to f32 once and shared by the group's
  // query heads; scores, their exp and the V accumulation run 8 lanes wide.
  void attend_group(int32_t layer, const float* q, const AttentionSeq& seq, int32_t row, int32_t kvh,
                    const AttentionParams& p, float* out) const {
    constexpr int kMaxGroup = kAttnMaxGroup;
    constexpr int kMaxHeadDim = kAttnMaxHeadDim;
    const int32_t group = p.num_heads / p.num_kv_heads;
    const int32_t hd = p.head_dim, bs = geom_.block_size;
    const int32_t kv_len = p.kv_len[row];
    const int32_t nv = hd / 8;
    thread_local std::vector<float> kf, vf, sc;
    const size_t tile = static_cast<size_t>(bs) * hd;
    if (kf.size() < tile) {
      kf.resize(tile);
      vf.resize(tile);
    }
    if (sc.size() < static_cast<size_t>(bs) + 8) sc.resize(static_cast<size_t>(bs) + 8);
    float m[kMaxGroup], l[kMaxGroup];
    alignas(32) float acc[kMaxGroup][kMaxHeadDim];
    for (int g = 0; g < group; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.0f;
      std::fill(acc[g], acc[g] + hd, 0.0f);
    }
    const float* qrow = q + static_cast<size_t>(row) * p.num_heads * hd;
    const int32_t n_blocks = (kv_len + bs - 1) / bs;
    for (int32_t b = 0; b < n_blocks; ++b) {
      const int32_t block = seq.block_table[b];
      const uint16_t* kb = block_ptr(layer, 0, block) + static_cast<size_t>(kvh) * bs * hd;
      const uint16_t* vb = block_ptr(layer, 1, block) + static_cast<size_t>(kvh) * bs * hd;
      const int32_t n = std::min(bs, kv_len - b * bs);
      // The block's slots minus the sequence's hole: [0, hi1) and [lo2, n).
      const int32_t base = b * bs;
      const bool has_hole = seq.hole_end > seq.hole_begin;
      const int32_t hi1 = has_hole ? std::clamp(seq.hole_begin - base, 0, n) : n;
      const int32_t lo2 = has_hole ? std::max(hi1, std::clamp(seq.hole_end - base, 0, n)) : n;
      for (int range = 0; range < 2; ++range) {
        const int32_t t0 = range == 0 ? 0 : lo2, t1 = range == 0 ? hi1 : n;
        if (t0 >= t1) continue;
        const int32_t nt = t1 - t0;
        f16_rows_to_f32(kb + static_cast<size_t>(t0) * hd, kf.data(), nt * hd);
        f16_rows_to_f32(vb + static_cast<size_t>(t0) * hd, vf.data(), nt * hd);
        float* s = sc.data();
        for (int g = 0; g < group; ++g) {
          const float* qh = qrow + static_cast<size_t>(kvh * group + g) * hd;
          float block_max = -INFINITY;
          for (int32_t t = 0; t < nt; ++t) {
            const float* kr = kf.data() + static_cast<size_t>(t) * hd;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            int32_t c = 0;
            for (; c + 2 <= nv; c += 2) {
              a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * c), _mm256_loadu_ps(kr + 8 * c), a0);
              a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * c + 8), _mm256_loadu_ps(kr + 8 * c + 8), a1);
            }
            if (c < nv) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * c), _mm256_loadu_ps(kr + 8 * c), a0);
            s[t] = hsum8(_mm256_add_ps(a0, a1)) * p.scale;
            block_max = std::max(block_max, s[t]);
          }
          const float new_m = std::max(m[g], block_max);
          const float correction = std::exp(m[g] - new_m);
          const __m256 vm = _mm256_set1_ps(new_m);
          __m256 wsum = _mm256_setzero_ps();
          for (int32_t t = 0; t < nt; t += 8) {
            const int32_t k = std::min(8, nt - t);
            __m256 w = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
            if (k < 8) {
              alignas(32) static constexpr int32_t kLanes[8] = {0, 1, 2, 3, 4, 5, 6, 7};
              const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_load_si256(reinterpret_cast<const __m256i*>(kLanes)));
              w = _mm256_and_ps(w, _mm256_castsi256_ps(keep));
            }
            _mm256_storeu_ps(s + t, w);
            wsum = _mm256_add_ps(wsum, w);
          }
          l[g] = l[g] * correction + hsum8(wsum);
          m[g] = new_m;
          float* ag = acc[g];
          const __m256 corr = _mm256_set1_ps(correction);
          for (int32_t c0 = 0; c0 < nv; c0 += 8) {  // 8 accumulators (64 dims) at a time
            const int32_t cn = std::min(8, nv - c0);
            __m256 r[8];
            for (int j = 0; j < cn; ++j) r[j] = _mm256_mul_ps(_mm256_load_ps(ag + 8 * (c0 + j)), corr);
            for (int32_t t = 0; t < nt; ++t) {
              const __m256 w = _mm256_set1_ps(s[t]);
              const float* vr = vf.data() + static_cast<size_t>(t) * hd + 8 * c0;
              for (int j = 0; j < cn; ++j) r[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr + 8 * j), r[j]);
            }
            for (int j = 0; j < cn; ++j) _mm256_store_ps(ag + 8 * (c0 + j), r[j]);
          }
        }
      }
    }
    for (int g = 0; g < group; ++g) {
      float* o = out + (static_cast<size_t>(row) * p.num_heads + kvh * group + g) * hd;
      const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
      for (int32_t i = 0; i < hd; ++i) o[i] = acc[g][i] * inv;
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

}  // namespace ember
