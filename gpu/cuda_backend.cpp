// The CUDA backend (libember_cuda.so): Backend + BackendExtras on one device,
// one non-blocking stream, cuBLAS for prefill GEMMs, our kernels for the rest.
// See docs/CUDA.md for the design; the kernels' host entry points are in
// gpu/kernels.h.
//
// Every op is turned into a small value (an Op below) holding every pointer
// and size its kernels use. Outside a graph region the op runs at once;
// inside one (BackendExtras::graph_begin/graph_end) it is recorded, and
// graph_end either replays the CUDA graph captured for an identical op list
// or captures a new one. Host metadata (token ids, positions, cache slots,
// block tables) goes through a pinned staging arena: outside a region each
// piece is copied at once (identical consecutive pieces, e.g. the same block
// tables for every layer, are copied once); inside a region all of a step's
// metadata is copied with one cudaMemcpyAsync before the graph launches.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/plugin.h"
#include "core/util/status.h"
#include "gpu/kernels.h"

#ifndef EMBER_CUDA_ARCHS
#define EMBER_CUDA_ARCHS "unknown"
#endif

namespace ember::gpu {

// Field-wise equality of the launch descriptors (their padding is never compared).
bool operator==(const DevWeight& a, const DevWeight& b) {
  return a.type == b.type && a.N == b.N && a.K == b.K && a.qs == b.qs && a.sc == b.sc && a.data == b.data &&
         a.stride == b.stride;
}
bool operator==(const KvView& a, const KvView& b) {
  return a.base == b.base && a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.block_size == b.block_size && a.num_blocks == b.num_blocks;
}
bool operator==(const AttnLaunch& a, const AttnLaunch& b) {
  return a.kv == b.kv && a.layer == b.layer && a.q == b.q && a.out == b.out && a.tiles == b.tiles &&
         a.n_tiles == b.n_tiles && a.rows_per_tile == b.rows_per_tile && a.kv_len == b.kv_len &&
         a.block_tables == b.block_tables && a.tree_slots == b.tree_slots && a.window == b.window &&
         a.num_heads == b.num_heads && a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim &&
         a.scale == b.scale && a.n_splits == b.n_splits && a.tiles_per_split == b.tiles_per_split &&
         a.n_rows == b.n_rows && a.part_acc == b.part_acc && a.part_ml == b.part_ml;
}

}  // namespace ember::gpu

namespace ember {
namespace {

using gpu::DevWeight;
using gpu::KvView;

// ------------------------------------------------------------------ errors

[[noreturn]] void cuda_fail(cudaError_t e, const std::string& what) {
  const StatusCode code = e == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kInternal;
  fail(code, "cuda backend: " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(e, what);
}
const char* cublas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_?";
  }
}
inline void ckb(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  fail(s == CUBLAS_STATUS_ALLOC_FAILED ? StatusCode::kOutOfMemory : StatusCode::kInternal,
       std::string("cuda backend: ") + what + ": " + cublas_name(s));
}

// ------------------------------------------------------------------ memory

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    ck(cudaMalloc(&p_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      bytes_ = o.bytes_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) ck(cudaMallocHost(&p_, bytes), "cudaMallocHost");
  }
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr, o.bytes_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      bytes_ = o.bytes_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  void reset() {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// ------------------------------------------------------------------ weights

struct WeightStorage {
  DevWeight view;
  DeviceBuffer qs, sc, data;
  DeviceBuffer w16;          // f16 copy of a quant weight for cuBLAS (created on first GEMM use)
  bool w16_refused = false;  // not enough memory for it: dequantize tiles per call instead
};

class CudaWeight final : public DeviceWeight {
 public:
  std::shared_ptr<WeightStorage> st;
};

// ------------------------------------------------------------------ ops

enum class GemmPath : int32_t { kGemv = 0, kDirect = 1, kTiles = 2 };

struct EmbedOp {
  DevWeight w;
  const int32_t* ids;
  int32_t n;
  float* out;
  bool operator==(const EmbedOp&) const = default;
};
struct RmsNormOp {
  const float* x;
  const float* w;
  int32_t rows, dim;
  float eps;
  float* out;
  bool operator==(const RmsNormOp&) const = default;
};
struct MatmulOp {
  DevWeight w;
  const float* x;
  int64_t M;
  float* y;
  GemmPath path;
  int8_t* xq;  // gemv, quant weights
  gpu::ActScale* xs;
  const void* a;  // direct GEMM: the weight matrix as cuBLAS reads it
  cudaDataType_t a_type;
  int64_t lda;
  uint16_t* xh;     // f16 / bf16 activations (nullptr: F32 weights read x)
  uint16_t* wtile;  // tiles path: dequantized rows
  int64_t tile_rows;
  bool reuse_xq;  // the previous op quantized the same x into xq (Q, K, V / gate, up)
  bool operator==(const MatmulOp&) const = default;
};
struct RopeOp {
  float* x;
  const int32_t* pos;
  float theta_scale;
  int32_t rows, heads, head_dim, rot_dim;
  float freq_scale = 1.0f;
  const float* factors = nullptr;  // device (staged)
  bool neox = false;
  bool operator==(const RopeOp&) const = default;
};
struct GegluOp {
  const float* gate;
  const float* up;
  size_t n;
  float* out;
  bool operator==(const GegluOp&) const = default;
};
struct ScaleOp {
  float* x;
  size_t n;
  float s;
  bool operator==(const ScaleOp&) const = default;
};
struct AddBiasOp {
  float* x;
  const float* bias;
  int32_t rows, dim;
  bool operator==(const AddBiasOp&) const = default;
};
struct KvStoreOp {
  KvView kv;
  int32_t layer;
  const float* k;
  const float* v;
  const int32_t* slots;
  int32_t rows;
  bool operator==(const KvStoreOp&) const = default;
};
struct AttentionOp {
  gpu::AttnLaunch a;
  bool operator==(const AttentionOp&) const = default;
};
struct SwigluOp {
  const float* gate;
  const float* up;
  size_t n;
  float* out;
  bool operator==(const SwigluOp&) const = default;
};
struct AddOp {
  float* x;
  const float* y;
  size_t n;
  bool operator==(const AddOp&) const = default;
};
struct GatherOp {
  const float* x;
  const int32_t* rows;
  int32_t n, dim;
  float* out;
  bool operator==(const GatherOp&) const = default;
};
struct LoraOp {
  DevWeight a, b;
  float scale;
  const int32_t* rows;  // device (staged)
  int32_t n;
  const float* x;
  float* t;  // n * rank floats of scratch
  float* y;
  bool operator==(const LoraOp&) const = default;
};
struct KvShiftOp {
  KvView kv;
  const int32_t* blocks;
  int32_t n;
  const float* cs;
  const float* sn;
  int32_t rot_dim;
  int32_t layer_stride = 0;
  bool neox = false;
  bool operator==(const KvShiftOp&) const = default;
};
struct KvCopyOp {
  KvView kv;
  const int32_t* src;
  const int32_t* dst;
  int32_t n;
  bool one_at_a_time;
  bool operator==(const KvCopyOp&) const = default;
};
using Op = std::variant<EmbedOp, RmsNormOp, MatmulOp, RopeOp, KvStoreOp, AttentionOp, SwigluOp, AddOp, GatherOp,
                        KvCopyOp, KvShiftOp, GegluOp, ScaleOp, AddBiasOp, LoraOp>;

// Kinds of staged host data (dedup of identical consecutive pieces).
enum StageKind : int {
  kIds = 0,
  kPositions,
  kInvFreq,
  kSlots,
  kAttnMeta,
  kGatherRows,
  kKvCopy,
  kKvShift,
  kSampling,
  kRopeFactors,
  kLoraRows,
  kNumKinds
};

// ------------------------------------------------------------------ staging arena

class Stager {
 public:
  void init(size_t capacity) {
    pinned_ = PinnedBuffer(capacity);
    dev_ = DeviceBuffer(capacity);
    cap_ = capacity;
    if (!event_) ck(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~Stager() {
    if (event_) cudaEventDestroy(event_);
  }

  // Returns the device address that will hold `bytes` of `src`. deferred:
  // the copy happens at the next flush() (graph regions); otherwise now.
  const void* stage(StageKind kind, const void* src, size_t bytes, bool deferred, cudaStream_t stream,
                    std::vector<DeviceBuffer>& dev_graveyard, std::vector<PinnedBuffer>& host_graveyard) {
    if (bytes == 0) return dev_.get();
    Last& last = last_[kind];
    if (last.epoch == epoch_ && last.bytes == bytes && std::memcmp(pinned_.get() + last.off, src, bytes) == 0) {
      return static_cast<uint8_t*>(dev_.get()) + last.off;
    }
    size_t off = round_up(used_, 16);
    if (off + bytes > cap_) {
      if (deferred || bytes > cap_) {
        // Grow. Pending deferred data goes to the old device arena first; in
        // a graph region the old buffers stay alive until the region's work
        // has been enqueued (recorded ops point into them).
        flush(stream);
        const size_t want = std::max(cap_ * 2, round_up(bytes, 1 << 16) * 2);
        if (deferred) {
          dev_graveyard.push_back(std::move(dev_));
          host_graveyard.push_back(std::move(pinned_));
        } else {
          ck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          dev_.reset();
          pinned_.reset();
        }
        pinned_ = PinnedBuffer(want);
        dev_ = DeviceBuffer(want);
        cap_ = want;
      } else {
        // Wrap: every copy issued so far must have left the pinned arena.
        ck(cudaEventSynchronize(event_), "cudaEventSynchronize");
      }
      used_ = flushed_ = 0;
      ++epoch_;
      off = 0;
    }
    std::memcpy(pinned_.get() + off, src, bytes);
    used_ = off + bytes;
    last = Last{off, bytes, epoch_};
    if (!deferred) flush(stream);
    return static_cast<uint8_t*>(dev_.get()) + off;
  }

  // Copies what was staged since the last flush.
  void flush(cudaStream_t stream) {
    if (used_ <= flushed_) return;
    ck(cudaMemcpyAsync(static_cast<uint8_t*>(dev_.get()) + flushed_, pinned_.get() + flushed_, used_ - flushed_,
                       cudaMemcpyHostToDevice, stream),
       "staging copy");
    ck(cudaEventRecord(event_, stream), "cudaEventRecord");
    flushed_ = used_;
  }

  // Starts a graph region: the arena restarts at 0 so that identical steps
  // stage at identical addresses.
  void begin_region() {
    ck(cudaEventSynchronize(event_), "cudaEventSynchronize");
    used_ = flushed_ = 0;
    ++epoch_;
  }

 private:
  struct Last {
    size_t off = 0, bytes = 0;
    uint64_t epoch = ~uint64_t{0};
  };
  PinnedBuffer pinned_;
  DeviceBuffer dev_;
  size_t cap_ = 0, used_ = 0, flushed_ = 0;
  uint64_t epoch_ = 0;
  Last last_[kNumKinds];
  cudaEvent_t event_ = nullptr;
};

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  return std::atoi(v);
}

// ------------------------------------------------------------------ the backend

class CudaBackend final : public Backend, public BackendExtras {
 public:
  explicit CudaBackend(int device) : device_(device) {
    try {
      init();
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    release();
  }

  std::string name() const override {
    return "cuda/" + std::string(prop_.name) + "/sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor);
  }

  // ---------------------------------------------------------------- buffers

  void* alloc(size_t bytes) override {
    Lock lock(this, "alloc");
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(StatusCode::kOutOfMemory, "cuda backend: cannot allocate " + std::to_string(bytes) + " bytes on " +
                                         prop_.name + " (" + cudaGetErrorString(e) + ")");
    }
    return p;
  }
  // Never throws: it runs in destructors, also at process exit after the
  // CUDA runtime began unloading (cudaErrorCudartUnloading), where the
  // memory goes with the context anyway. A sticky device error is reported
  // by the next call that can fail.
  void free_buffer(void* ptr) override {
    if (!ptr) return;
    try {
      Lock lock(this, "free_buffer");
      if (cudaStreamSynchronize(stream_) == cudaSuccess) cudaFree(ptr);
    } catch (...) {
    }
    cudaGetLastError();
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    Lock lock(this, "upload");
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    ck(cudaStreamSynchronize(stream_), "upload (synchronize)");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    Lock lock(this, "download");
    to_host(dst, src, bytes);
  }

  std::unique_ptr<DeviceWeight> upload_weight(const WeightDesc& desc) override {
    Lock lock(this, "upload_weight");
    auto w = std::make_unique<CudaWeight>();
    w->desc = desc;
    const auto key = std::make_tuple(desc.host_data, desc.type, desc.rows, desc.cols);
    if (auto it = weights_.find(key); it != weights_.end()) {
      if (auto st = it->second.lock()) {
        w->st = std::move(st);  // tied embeddings: one device copy
        return w;
      }
    }
    w->st = make_storage(desc);
    weights_[key] = w->st;
    return w;
  }

  // ---------------------------------------------------------------- KV pool

  void kv_init(const KvGeometry& g) override {
    Lock lock(this, "kv_init");
    if (g.head_dim % 8 != 0 || g.head_dim > gpu::kAttnMaxHeadDim || g.head_dim <= 0) {
      fail(StatusCode::kUnsupported,
           "cuda backend: head_dim " + std::to_string(g.head_dim) + " is not supported (a multiple of 8, at most 256)");
    }
    if (g.dtype != DType::F16) fail(StatusCode::kUnsupported, "cuda backend: the KV cache is f16 only (no q8_0 KV yet)");
    graph_clear_locked();
    ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    kv_.reset();
    geom_ = g;
    const size_t bytes = g.bytes_per_block() * static_cast<size_t>(g.num_blocks);
    if (bytes) {
      kv_ = DeviceBuffer(bytes);
      ck(cudaMemsetAsync(kv_.get(), 0, bytes, stream_), "cudaMemset (KV pool)");
      ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    }
  }

  void kv_copy_blocks(const int32_t* src, const int32_t* dst, int32_t n) override {
    Lock lock(this, "kv_copy_blocks");
    if (n <= 0) return;
    std::vector<int32_t> ids(2 * static_cast<size_t>(n));
    bool overlap = false;
    {
      std::vector<int32_t> srcs(src, src + n), dsts(dst, dst + n);
      for (int32_t i = 0; i < n; ++i) {
        if (src[i] < 0 || src[i] >= geom_.num_blocks || dst[i] < 0 || dst[i] >= geom_.num_blocks) {
          fail(StatusCode::kInternal, "kv_copy_blocks: block id outside the pool");
        }
      }
      std::sort(srcs.begin(), srcs.end());
      std::sort(dsts.begin(), dsts.end());
      overlap = std::adjacent_find(dsts.begin(), dsts.end()) != dsts.end();
      for (int32_t d : dsts) overlap = overlap || std::binary_search(srcs.begin(), srcs.end(), d);
    }
    std::copy(src, src + n, ids.begin());
    std::copy(dst, dst + n, ids.begin() + n);
    const auto* dev = static_cast<const int32_t*>(stage(kKvCopy, ids.data(), ids.size() * 4));
    submit(KvCopyOp{kv_view(), dev, dev + n, n, overlap});
  }

  bool supports_cache_policies() const override { return true; }

  void kv_rope_shift(const int32_t* blocks, int32_t n, int32_t delta, int32_t rot_dim, float freq_base) override {
    Lock lock(this, "kv_rope_shift");
    if (rot_dim <= 0 || rot_dim > geom_.head_dim || rot_dim % 2 != 0) {
      fail(StatusCode::kInternal, "kv_rope_shift: unsupported rot_dim");
    }
    if (n <= 0) return;
    // The angles in double, as the CPU backend, so repeated shifts only add the f16 rounding.
    const int32_t half = rot_dim / 2;
    std::vector<float> table(2 * static_cast<size_t>(half));
    for (int32_t i = 0; i < half; ++i) {
      const double theta = delta * std::pow(static_cast<double>(freq_base), -2.0 * i / rot_dim);
      table[i] = static_cast<float>(std::cos(theta));
      table[half + i] = static_cast<float>(std::sin(theta));
    }
    std::vector<int32_t> ids(blocks, blocks + n);
    const auto* b = static_cast<const int32_t*>(stage(kKvShift, ids.data(), ids.size() * 4));
    const auto* t = static_cast<const float*>(stage(kInvFreq, table.data(), table.size() * 4));
    submit(KvShiftOp{kv_view(), b, n, t, t + half, rot_dim});
  }

  // Per-layer tables [layer][cos x half, sin x half] (angles in double as above).
  void kv_rope_shift_layers(const int32_t* blocks, int32_t n, int32_t delta, const RopeSpec* specs,
                            int32_t n_layers) override {
    Lock lock(this, "kv_rope_shift");
    if (n_layers != geom_.num_layers || n_layers <= 0) fail(StatusCode::kInternal, "kv_rope_shift: specs per layer");
    const int32_t rot_dim = specs[0].rot_dim;
    for (int32_t l = 0; l < n_layers; ++l) {
      if (specs[l].rot_dim != rot_dim || specs[l].neox != specs[0].neox || rot_dim <= 0 || rot_dim > geom_.head_dim ||
          rot_dim % 2 != 0) {
        fail(StatusCode::kInternal, "kv_rope_shift: unsupported rot_dim / mixed RoPE styles");
      }
    }
    if (n <= 0) return;
    const int32_t half = rot_dim / 2;
    std::vector<float> table(static_cast<size_t>(n_layers) * 2 * half);
    for (int32_t l = 0; l < n_layers; ++l) {
      const RopeSpec& r = specs[l];
      for (int32_t i = 0; i < half; ++i) {
        double theta = delta * std::pow(static_cast<double>(r.freq_base), -2.0 * i / rot_dim) * r.freq_scale;
        if (r.freq_factors) theta /= r.freq_factors[i];
        table[static_cast<size_t>(l) * 2 * half + i] = static_cast<float>(std::cos(theta));
        table[static_cast<size_t>(l) * 2 * half + half + i] = static_cast<float>(std::sin(theta));
      }
    }
    std::vector<int32_t> ids(blocks, blocks + n);
    const auto* b = static_cast<const int32_t*>(stage(kKvShift, ids.data(), ids.size() * 4));
    const auto* t = static_cast<const float*>(stage(kInvFreq, table.data(), table.size() * 4));
    submit(KvShiftOp{kv_view(), b, n, t, t + half, rot_dim, 2 * half, specs[0].neox});
  }

  // Block `block` of every layer, K then V, to / from host memory
  // (KvGeometry::bytes_per_block() bytes, the CPU backend's order).
  void kv_read_block(int32_t block, void* dst) override {
    Lock lock(this, "kv_read_block");
    block_copy(block, dst, true);
  }
  void kv_write_block(int32_t block, const void* src) override {
    Lock lock(this, "kv_write_block");
    block_copy(block, const_cast<void*>(src), false);
  }

  // ---------------------------------------------------------------- ops

  void embed(const DeviceWeight& table, const int32_t* ids, int32_t n, float* out) override {
    Lock lock(this, "embed");
    const auto& w = view(table);
    for (int32_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= w.N) fail(StatusCode::kInvalidArgument, "token id out of range");
    }
    if (n <= 0) return;
    const auto* d = static_cast<const int32_t*>(stage(kIds, ids, static_cast<size_t>(n) * 4));
    submit(EmbedOp{w, d, n, out});
  }

  void rms_norm(const float* x, const DeviceWeight& weight, int32_t rows, int32_t dim, float eps, float* out) override {
    Lock lock(this, "rms_norm");
    const auto& w = view(weight);
    if (w.type != DType::F32 || w.N * w.K < dim) {
      fail(StatusCode::kInvalidArgument, "rms_norm: the weight must be f32 with at least dim elements");
    }
    if (rows <= 0) return;
    submit(RmsNormOp{x, static_cast<const float*>(w.data), rows, dim, eps, out});
  }

  void matmul(const DeviceWeight& weight, const float* x, int32_t M, float* y, bool rows_are_decodes) override {
    Lock lock(this, "matmul");
    if (M <= 0) return;
    WeightStorage& st = *static_cast<const CudaWeight&>(weight).st;
    const DevWeight& w = st.view;
    MatmulOp op{};
    op.w = w;
    op.x = x;
    op.M = M;
    op.y = y;
    if (rows_are_decodes || batch_invariant_ || M <= gemv_max_m_) {
      op.path = GemmPath::kGemv;
      if (gpu::is_quant(w.type)) {
        const size_t q_bytes = round_up(static_cast<size_t>(M) * w.K, 256);
        auto* base = static_cast<uint8_t*>(scratch(act_, q_bytes + gpu::act_scale_bytes(w.type, M, w.K)));
        op.xq = reinterpret_cast<int8_t*>(base);
        op.xs = reinterpret_cast<gpu::ActScale*>(base + q_bytes);  // K-quants: gpu::KActBlock
        // The scales depend on the weight type (Q4_1's s differs, gpu/layout.h
        // act_block_scale; K-quants read Q8_K): reuse only for the same kind.
        const int kind = gpu::act_kind(w.type);
        op.reuse_xq = last_quant_.x == x && last_quant_.M == M && last_quant_.K == w.K && last_quant_.xq == op.xq &&
                      last_quant_.kind == kind;
      }
      submit(op);
      if (gpu::is_quant(w.type)) last_quant_ = LastQuant{x, M, w.K, op.xq, gpu::act_kind(w.type)};
      return;
    }
    // cuBLAS. Activations in the weight's 16-bit type (F32 weights: f32).
    if (w.type != DType::F32) {
      op.xh = static_cast<uint16_t*>(scratch(xh_, static_cast<size_t>(M) * w.K * 2));
    }
    if (gpu::is_float(w.type)) {
      op.path = GemmPath::kDirect;
      op.a = w.data;
      op.a_type = w.type == DType::F32 ? CUDA_R_32F : w.type == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
      op.lda = w.stride;
    } else if (ensure_w16(st)) {
      op.path = GemmPath::kDirect;
      op.a = st.w16.get();
      op.a_type = CUDA_R_16F;
      op.lda = w.K;
    } else {
      op.path = GemmPath::kTiles;
      int64_t rows = static_cast<int64_t>((64u << 20) / (static_cast<size_t>(w.K) * 2));
      rows = std::max<int64_t>(128, rows / 128 * 128);
      op.tile_rows = std::min<int64_t>(rows, w.N);
      op.wtile = static_cast<uint16_t*>(scratch(wtile_, static_cast<size_t>(op.tile_rows) * w.K * 2));
      op.a_type = CUDA_R_16F;
      op.lda = w.K;
    }
    submit(op);
  }

  void rope(float* x, const int32_t* positions, int32_t rows, int32_t num_heads, int32_t head_dim, int32_t rot_dim,
            float freq_base) override {
    Lock lock(this, "rope");
    if (rot_dim <= 0 || rot_dim > head_dim || rot_dim % 2 != 0) {
      fail(StatusCode::kInvalidArgument, "rope: rot_dim must be even and in (0, head_dim]");
    }
    if (rows <= 0) return;
    // Angles by the CPU backend's (and ggml's) float recurrence.
    const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(rot_dim));
    const auto* p = static_cast<const int32_t*>(stage(kPositions, positions, static_cast<size_t>(rows) * 4));
    submit(RopeOp{x, p, theta_scale, rows, num_heads, head_dim, rot_dim});
  }

  void rope_ext(float* x, const int32_t* positions, int32_t rows, int32_t num_heads, int32_t head_dim,
                const RopeSpec& spec) override {
    Lock lock(this, "rope");
    if (spec.rot_dim <= 0 || spec.rot_dim > head_dim || spec.rot_dim % 2 != 0) {
      fail(StatusCode::kInvalidArgument, "rope: rot_dim must be even and in (0, head_dim]");
    }
    if (rows <= 0) return;
    const float theta_scale = std::pow(spec.freq_base, -2.0f / static_cast<float>(spec.rot_dim));
    const auto* p = static_cast<const int32_t*>(stage(kPositions, positions, static_cast<size_t>(rows) * 4));
    const float* f = spec.freq_factors ? static_cast<const float*>(stage(kRopeFactors, spec.freq_factors,
                                                                         static_cast<size_t>(spec.rot_dim / 2) * 4))
                                       : nullptr;
    submit(RopeOp{x, p, theta_scale, rows, num_heads, head_dim, spec.rot_dim, spec.freq_scale, f, spec.neox});
  }

  void geglu(const float* gate, const float* up, size_t n, float* out) override {
    Lock lock(this, "geglu");
    if (n) submit(GegluOp{gate, up, n, out});
  }
  void scale(float* x, size_t n, float s) override {
    Lock lock(this, "scale");
    if (n) submit(ScaleOp{x, n, s});
  }
  void add_bias(float* x, const DeviceWeight& bias, int32_t rows, int32_t dim) override {
    Lock lock(this, "add_bias");
    const auto& w = view(bias);
    if (w.type != DType::F32 || w.N * w.K < dim) {
      fail(StatusCode::kInvalidArgument, "add_bias: the bias must be f32 with at least dim elements");
    }
    if (rows > 0 && dim > 0) submit(AddBiasOp{x, static_cast<const float*>(w.data), rows, dim});
  }

  void kv_store(int32_t layer, const float* k, const float* v, const int32_t* slots, int32_t rows) override {
    Lock lock(this, "kv_store");
    if (layer < 0 || layer >= geom_.num_layers) fail(StatusCode::kInternal, "kv_store: layer out of range");
    for (int32_t r = 0; r < rows; ++r) {
      if (slots[r] < 0 || slots[r] / geom_.block_size >= geom_.num_blocks) {
        fail(StatusCode::kInternal, "kv_store: slot outside the pool");
      }
    }
    if (rows <= 0) return;
    const auto* s = static_cast<const int32_t*>(stage(kSlots, slots, static_cast<size_t>(rows) * 4));
    submit(KvStoreOp{kv_view(), layer, k, v, s, rows});
  }

  void attention(int32_t layer, const float* q, const AttentionSeq* seqs, int32_t n_seqs, const AttentionParams& p,
                 float* out) override {
    Lock lock(this, "attention");
    if (layer < 0 || layer >= geom_.num_layers) fail(StatusCode::kInternal, "attention: layer out of range");
    if (p.num_kv_heads != geom_.num_kv_heads || p.head_dim != geom_.head_dim || p.num_kv_heads <= 0 ||
        p.num_heads % p.num_kv_heads != 0) {
      fail(StatusCode::kInvalidArgument, "attention: head counts / head_dim do not match the KV pool");
    }
    const int32_t G = p.num_heads / p.num_kv_heads;
    if (G > gpu::kAttnMaxVecs) fail(StatusCode::kUnsupported, "attention: GQA groups above 16 are not supported");
    const int32_t rpt_default = gpu::attn_rows_per_tile(G);
    // A sequence with token-tree rows puts one row in each tile (each row
    // has its own slot map).
    auto has_tree = [&](const AttentionSeq& sq) {
      if (!p.tree_from) return false;
      for (int32_t r = sq.first_row; r < sq.first_row + sq.n_rows; ++r)
        if (p.tree_from[r] >= 0) return true;
      return false;
    };
    // Metadata: [tiles x 8 | kv_len per row | packed block tables | tree slot maps].
    int32_t n_rows = 0, n_tiles = 0, max_rows_in_tile = 1, max_len = 0;
    size_t n_table = 0, n_tree = 0;
    for (int32_t s = 0; s < n_seqs; ++s) {
      const int32_t rpt = has_tree(seqs[s]) ? 1 : rpt_default;
      n_rows = std::max(n_rows, seqs[s].first_row + seqs[s].n_rows);
      n_tiles += (seqs[s].n_rows + rpt - 1) / rpt;
      n_table += static_cast<size_t>(std::max(seqs[s].n_blocks, 0));
      if (p.tree_from) {
        for (int32_t r = seqs[s].first_row; r < seqs[s].first_row + seqs[s].n_rows; ++r)
          if (p.tree_from[r] >= 0) n_tree += static_cast<size_t>(std::max(p.kv_len[r] - p.tree_from[r], 0));
      }
    }
    if (n_tiles == 0) return;
    const size_t tile_ints = static_cast<size_t>(n_tiles) * gpu::kAttnTileInts;
    meta_.assign(tile_ints + static_cast<size_t>(n_rows) + n_table + n_tree, 0);
    int32_t* tiles = meta_.data();
    int32_t* lens = tiles + tile_ints;
    int32_t* tables = lens + n_rows;
    int32_t* tree = tables + n_table;
    int32_t t = 0, off = 0, tree_off = 0;
    for (int32_t s = 0; s < n_seqs; ++s) {
      const AttentionSeq& sq = seqs[s];
      for (int32_t b = 0; b < sq.n_blocks; ++b) {
        // -1: a block a sliding-window layer group has freed (never inside a row's window).
        if (sq.block_table[b] < -1 || sq.block_table[b] >= geom_.num_blocks) {
          fail(StatusCode::kInternal, "attention: block table entry outside the pool");
        }
        tables[off + b] = sq.block_table[b];
      }
      for (int32_t r = sq.first_row; r < sq.first_row + sq.n_rows; ++r) {
        const int32_t len = p.kv_len[r];
        if (len < 0 || static_cast<int64_t>(len) > static_cast<int64_t>(sq.n_blocks) * geom_.block_size) {
          fail(StatusCode::kInternal, "attention: a row's kv_len is not covered by its block table");
        }
        lens[r] = len;
        max_len = std::max(max_len, len);
      }
      const int32_t rpt = has_tree(sq) ? 1 : rpt_default;
      const int64_t cap = static_cast<int64_t>(sq.n_blocks) * geom_.block_size;
      for (int32_t r0 = 0; r0 < sq.n_rows; r0 += rpt) {
        const int32_t nr = std::min(rpt, sq.n_rows - r0);
        int32_t* td = tiles + static_cast<size_t>(t) * gpu::kAttnTileInts;
        td[0] = sq.first_row + r0;
        td[1] = nr;
        td[2] = off;
        td[3] = sq.n_blocks;
        td[4] = sq.hole_begin;
        td[5] = sq.hole_end;
        td[6] = INT32_MAX;
        td[7] = 0;
        const int32_t row = sq.first_row + r0;
        if (p.tree_from && p.tree_from[row] >= 0) {
          const int32_t from = p.tree_from[row], n_path = p.kv_len[row] - from;
          if (n_path < 0) fail(StatusCode::kInternal, "attention: a tree row's path is shorter than empty");
          for (int32_t i = 0; i < n_path; ++i) {
            const int32_t slot = p.tree_slots[p.tree_begin[row] + i];
            if (slot < 0 || slot >= cap) fail(StatusCode::kInternal, "attention: a tree slot outside the block table");
            tree[tree_off + i] = slot;
          }
          td[6] = from;
          td[7] = tree_off;
          tree_off += n_path;
        }
        max_rows_in_tile = std::max(max_rows_in_tile, nr);
        ++t;
      }
      off += sq.n_blocks;
    }
    const auto* dev = static_cast<const int32_t*>(stage(kAttnMeta, meta_.data(), meta_.size() * 4));
    gpu::AttnLaunch a;
    a.kv = kv_view();
    a.layer = layer;
    a.q = q;
    a.out = out;
    a.tiles = reinterpret_cast<const gpu::AttnTileDesc*>(dev);
    a.n_tiles = n_tiles;
    a.rows_per_tile = max_rows_in_tile;
    a.kv_len = dev + tile_ints;
    a.block_tables = a.kv_len + n_rows;
    a.tree_slots = a.block_tables + n_table;
    a.num_heads = p.num_heads;
    a.num_kv_heads = p.num_kv_heads;
    a.head_dim = p.head_dim;
    a.scale = p.scale;
    a.window = p.window;
    a.n_rows = n_rows;
    const gpu::AttnSplit split = batch_invariant_
                                     ? gpu::plan_attention_split_invariant(max_len)
                                     : gpu::plan_attention_split(static_cast<int64_t>(n_tiles) * p.num_kv_heads,
                                                                 max_len, prop_.multiProcessorCount);
    a.n_splits = split.n_splits;
    a.tiles_per_split = split.tiles_per_split;
    if (a.n_splits > 1) {
      const size_t entries = static_cast<size_t>(a.n_splits) * n_rows * p.num_heads;
      const size_t acc_bytes = round_up(entries * p.head_dim * sizeof(float), 256);
      auto* base = static_cast<uint8_t*>(scratch(attn_part_, acc_bytes + entries * sizeof(gpu::MaxSum)));
      a.part_acc = reinterpret_cast<float*>(base);
      a.part_ml = reinterpret_cast<gpu::MaxSum*>(base + acc_bytes);
    }
    submit(AttentionOp{a});
  }

  void swiglu(const float* gate, const float* up, size_t n, float* out) override {
    Lock lock(this, "swiglu");
    if (n) submit(SwigluOp{gate, up, n, out});
  }
  void add(float* x, const float* y, size_t n) override {
    Lock lock(this, "add");
    if (n) submit(AddOp{x, y, n});
  }
  void gather_rows(const float* x, const int32_t* rows, int32_t n, int32_t dim, float* out) override {
    Lock lock(this, "gather_rows");
    for (int32_t i = 0; i < n; ++i) {
      if (rows[i] < 0) fail(StatusCode::kInvalidArgument, "gather_rows: negative row");
    }
    if (n <= 0) return;
    const auto* r = static_cast<const int32_t*>(stage(kGatherRows, rows, static_cast<size_t>(n) * 4));
    submit(GatherOp{x, r, n, dim, out});
  }

  // Each term: its rank-r products on the device (gpu::lora_term), the
  // terms in order on the stream (a row with several adapters adds them in
  // set order). Every row is computed on its own.
  void lora(const LoraTerm* terms, int32_t n_terms, const float* x, float* y) override {
    Lock lock(this, "lora");
    if (n_terms <= 0) return;
    size_t t_floats = 0;
    for (int32_t i = 0; i < n_terms; ++i) {
      const DevWeight& a = view(*terms[i].a);
      const DevWeight& b = view(*terms[i].b);
      if (!gpu::is_float(a.type) || !gpu::is_float(b.type) || b.K != a.N || a.K != view(*terms[0].a).K ||
          terms[i].n_rows < 0) {
        fail(StatusCode::kInternal, "lora: the terms' shapes or types disagree");
      }
      for (int32_t m = 0; m < terms[i].n_rows; ++m) {
        if (terms[i].rows[m] < 0) fail(StatusCode::kInvalidArgument, "lora: negative row");
      }
      t_floats += static_cast<size_t>(terms[i].n_rows) * static_cast<size_t>(a.N);
    }
    auto* t = static_cast<float*>(scratch(lora_t_, std::max<size_t>(t_floats, 1) * sizeof(float)));
    for (int32_t i = 0; i < n_terms; ++i) {
      const LoraTerm& term = terms[i];
      if (term.n_rows == 0) continue;
      const auto* r =
          static_cast<const int32_t*>(stage(kLoraRows, term.rows, static_cast<size_t>(term.n_rows) * 4));
      submit(LoraOp{view(*term.a), view(*term.b), term.scale, r, term.n_rows, x, t, term.y ? term.y : y});
      t += static_cast<size_t>(term.n_rows) * static_cast<size_t>(view(*term.a).N);
    }
  }

  // ---------------------------------------------------------------- extras

  std::string device_description() const override {
    char mem[32];
    std::snprintf(mem, sizeof(mem), "%.1f", static_cast<double>(prop_.totalGlobalMem) / (1u << 30));
    return std::string(prop_.name) + ", sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) + ", " +
           std::to_string(prop_.multiProcessorCount) + " SMs, " + mem + " GiB, device " + std::to_string(device_);
  }

  void set_batch_invariant(bool on) override {
    Lock lock(this, "set_batch_invariant");
    batch_invariant_ = on;
  }

  void synchronize() override {
    Lock lock(this, "synchronize");
    ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  void sample_argmax(const float* logits, int32_t rows, int32_t vocab, int32_t* out_tokens) override {
    Lock lock(this, "sample_argmax");
    if (rows <= 0) return;
    if (vocab <= 0) fail(StatusCode::kInvalidArgument, "sample_argmax: vocab must be positive");
    auto* toks = static_cast<int32_t*>(scratch(tokens_, static_cast<size_t>(rows) * 4));
    ck(gpu::argmax_rows(logits, rows, vocab, toks, stream_), "argmax");
    to_host(out_tokens, toks, static_cast<size_t>(rows) * 4);
  }

  void sample(float* logits, int32_t rows, int32_t vocab, const DeviceSamplingParams* params,
              const DevicePenalties* penalties, int32_t* out_tokens) override {
    Lock lock(this, "sample");
    if (rows <= 0) return;
    if (vocab <= 0) fail(StatusCode::kInvalidArgument, "sample: vocab must be positive");
    std::vector<gpu::PenaltyEntry> entries;
    if (penalties) {
      for (int32_t r = 0; r < rows; ++r) {
        const DevicePenalties& pe = penalties[r];
        if (pe.repeat == 1.0f && pe.frequency == 0.0f && pe.presence == 0.0f) continue;
        for (int32_t i = 0; i < pe.n; ++i) {
          entries.push_back({r, pe.tokens[i], pe.counts[i], pe.repeat, pe.frequency, pe.presence});
        }
      }
    }
    std::vector<gpu::SampleRow> sr(rows);
    const int32_t cap = std::min(vocab, gpu::kMaxTopK);
    for (int32_t r = 0; r < rows; ++r) {
      const DeviceSamplingParams& p = params[r];
      sr[r] = {p.temperature, p.top_k <= 0 || p.top_k > cap ? cap : p.top_k, p.top_p, p.min_p, p.uniform};
    }
    if (!entries.empty()) {
      const auto* e = static_cast<const gpu::PenaltyEntry*>(
          stage(kSampling, entries.data(), entries.size() * sizeof(gpu::PenaltyEntry)));
      ck(gpu::apply_penalties(logits, vocab, e, static_cast<int32_t>(entries.size()), stream_), "penalties");
    }
    const auto* d = static_cast<const gpu::SampleRow*>(stage(kSampling, sr.data(), sr.size() * sizeof(gpu::SampleRow)));
    auto* toks = static_cast<int32_t*>(scratch(tokens_, static_cast<size_t>(rows) * 4));
    ck(gpu::sample_rows(logits, rows, vocab, d, toks, stream_), "sample");
    to_host(out_tokens, toks, static_cast<size_t>(rows) * 4);
  }

  void graph_begin(uint64_t key) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    cudaSetDevice(device_);
    if (recording_) end_region(true);
    stager_.begin_region();
    recording_ = true;
    key_ = key;
    ops_.clear();
  }

  void graph_end() override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    cudaSetDevice(device_);
    if (recording_) end_region(true);
  }

  void graph_abort() override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    cudaSetDevice(device_);
    if (recording_) end_region(false);
  }

  void graph_clear() override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    cudaSetDevice(device_);
    graph_clear_locked();
  }

  GraphStats graph_stats() const override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return stats_;
  }

 private:
  // Serialises the backend. In a graph region, an op that cannot be recorded
  // (a download, an upload, a weight upload, ...) first ends the region, so
  // results are always those of eager execution; an exception thrown while
  // recording runs what was recorded before it, without a graph.
  class Lock {
   public:
    Lock(const CudaBackend* b, const char* what)
        : b_(const_cast<CudaBackend*>(b)), lock_(b_->mutex_), exceptions_(std::uncaught_exceptions()) {
      cudaSetDevice(b_->device_);
      if (std::strcmp(what, "matmul") != 0) b_->last_quant_ = LastQuant{};  // e.g. an upload into x
      if (b_->recording_ && !recordable(what) && !(std::strcmp(what, "free_buffer") == 0 && b_->ops_.empty())) {
        b_->end_region(true);
      }
    }
    ~Lock() {
      if (std::uncaught_exceptions() > exceptions_ && b_->recording_) {
        try {
          b_->end_region(false);
        } catch (...) {
          // Already unwinding with the first error.
        }
      }
    }

   private:
    static bool recordable(const char* what) {
      // alloc: cudaMalloc is fine while recording (nothing is being captured).
      for (const char* ok : {"embed", "rms_norm", "matmul", "rope", "kv_store", "attention", "swiglu", "add",
                             "gather_rows", "kv_copy_blocks", "kv_rope_shift", "alloc", "geglu", "scale", "add_bias"}) {
        if (std::strcmp(ok, what) == 0) return true;
      }
      return false;
    }
    CudaBackend* b_;
    std::lock_guard<std::recursive_mutex> lock_;
    int exceptions_;
  };

  void init() {
    ck(cudaSetDevice(device_), "cudaSetDevice");
    ck(cudaGetDeviceProperties(&prop_, device_), "cudaGetDeviceProperties");
    ck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ckb(cublasCreate(&cublas_), "cublasCreate");
    ckb(cublasSetStream(cublas_, stream_), "cublasSetStream");
    cublas_ws_ = DeviceBuffer(32u << 20);  // user workspace: no allocation inside graph capture
    ckb(cublasSetWorkspace(cublas_, cublas_ws_.get(), cublas_ws_.size()), "cublasSetWorkspace");
    ck(gpu::attention_init(), "attention_init");
    stager_.init(1u << 20);
    bounce_ = PinnedBuffer(8u << 20);
    gemv_max_m_ = std::max(1, env_int("EMBER_CUDA_GEMV_MAX_M", gpu::kGemvMaxNR));
    if (const char* p = std::getenv("EMBER_CUDA_F16_WEIGHTS")) f16_policy_ = p;
  }

  void release() {
    for (auto& [key, e] : graphs_) {
      if (e.exec) cudaGraphExecDestroy(e.exec);
    }
    graphs_.clear();
    if (cublas_) cublasDestroy(cublas_);
    cublas_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  void block_copy(int32_t block, void* host, bool to_host_side) {
    if (block < 0 || block >= geom_.num_blocks) fail(StatusCode::kInternal, "kv block outside the pool");
    const KvView v = kv_view();
    const size_t width = static_cast<size_t>(geom_.num_kv_heads) * geom_.block_size * geom_.head_dim * 2;
    // The (layer, K|V) pieces of one block are num_blocks * width bytes apart.
    auto* dev = reinterpret_cast<uint8_t*>(v.base) + static_cast<size_t>(block) * width;
    const size_t pitch = static_cast<size_t>(geom_.num_blocks) * width;
    const size_t height = static_cast<size_t>(geom_.num_layers) * 2;
    if (to_host_side) {
      ck(cudaMemcpy2DAsync(host, width, dev, pitch, width, height, cudaMemcpyDeviceToHost, stream_), "kv_read_block");
    } else {
      ck(cudaMemcpy2DAsync(dev, pitch, host, width, width, height, cudaMemcpyHostToDevice, stream_), "kv_write_block");
    }
    ck(cudaStreamSynchronize(stream_), "kv block copy (synchronize)");
  }

  static const DevWeight& view(const DeviceWeight& w) { return static_cast<const CudaWeight&>(w).st->view; }

  KvView kv_view() const {
    KvView v;
    v.base = static_cast<uint16_t*>(kv_.get());
    v.num_layers = geom_.num_layers;
    v.num_kv_heads = geom_.num_kv_heads;
    v.head_dim = geom_.head_dim;
    v.block_size = geom_.block_size;
    v.num_blocks = geom_.num_blocks;
    if (!v.base) fail(StatusCode::kInternal, "cuda backend: the KV pool is not initialised");
    return v;
  }

  const void* stage(StageKind kind, const void* src, size_t bytes) {
    return stager_.stage(kind, src, bytes, recording_, stream_, dev_graveyard_, host_graveyard_);
  }

  // A scratch buffer of at least `bytes`. While recording, a replaced buffer
  // stays alive until the region has run (recorded ops point into it).
  void* scratch(DeviceBuffer& b, size_t bytes) {
    if (b.size() >= bytes) return b.get();
    const size_t want = round_up(std::max(bytes, b.size() + b.size() / 2), 1u << 20);
    if (recording_) {
      dev_graveyard_.push_back(std::move(b));
    } else {
      ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      b.reset();
    }
    b = DeviceBuffer(want);
    return b.get();
  }

  void bury() {
    if (dev_graveyard_.empty() && host_graveyard_.empty()) return;
    cudaStreamSynchronize(stream_);
    dev_graveyard_.clear();
    host_graveyard_.clear();
  }

  void to_host(void* dst, const void* src, size_t bytes) {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    while (bytes > 0) {
      const size_t n = std::min(bytes, bounce_.size());
      ck(cudaMemcpyAsync(bounce_.get(), s, n, cudaMemcpyDeviceToHost, stream_), "download");
      ck(cudaStreamSynchronize(stream_), "download (synchronize)");
      std::memcpy(d, bounce_.get(), n);
      d += n;
      s += n;
      bytes -= n;
    }
  }

  // ---------------------------------------------------------------- weights

  std::shared_ptr<WeightStorage> make_storage(const WeightDesc& d) {
    if (d.rows < 0 || d.cols <= 0 || (d.rows > 0 && !d.host_data)) {
      fail(StatusCode::kInvalidArgument, "cuda backend: bad weight");
    }
    auto st = std::make_shared<WeightStorage>();
    DevWeight& v = st->view;
    v.type = d.type;
    v.N = d.rows;
    v.K = d.cols;
    const auto* host = static_cast<const uint8_t*>(d.host_data);
    if (gpu::is_quant(d.type)) {
      const int be = gpu::block_elems(d.type);
      if (d.cols % be != 0) {
        fail(StatusCode::kInvalidArgument, std::string("cuda backend: K is not a multiple of ") + std::to_string(be) +
                                               " (" + type_name(static_cast<uint32_t>(d.type)) + ")");
      }
      const int64_t nb = d.cols / be;
      const int64_t total = d.rows * nb;
      st->qs = DeviceBuffer(std::max<size_t>(static_cast<size_t>(total) * gpu::quant_qs_bytes(d.type), 16));
      st->sc = DeviceBuffer(std::max<size_t>(static_cast<size_t>(total) * gpu::quant_header_bytes(d.type), 16));
      v.qs = static_cast<const uint8_t*>(st->qs.get());
      v.sc = static_cast<const uint8_t*>(st->sc.get());
      // Raw GGUF blocks go up in chunks and are split on the device.
      const size_t bb = static_cast<size_t>(gpu::gguf_block_bytes(d.type));
      const int64_t chunk_blocks = std::max<int64_t>(1, static_cast<int64_t>((32u << 20) / bb));
      DeviceBuffer raw(static_cast<size_t>(std::min(chunk_blocks, std::max<int64_t>(total, 1))) * bb);
      for (int64_t b0 = 0; b0 < total; b0 += chunk_blocks) {
        const int64_t nblk = std::min(chunk_blocks, total - b0);
        ck(cudaMemcpyAsync(raw.get(), host + static_cast<size_t>(b0) * bb, static_cast<size_t>(nblk) * bb,
                           cudaMemcpyHostToDevice, stream_),
           "weight upload");
        ck(gpu::split_quant_blocks(d.type, static_cast<const uint8_t*>(raw.get()), nblk,
                                   static_cast<uint8_t*>(st->qs.get()) + b0 * gpu::quant_qs_bytes(d.type),
                                   static_cast<uint8_t*>(st->sc.get()) + b0 * gpu::quant_header_bytes(d.type), stream_),
           "split_quant_blocks");
        ck(cudaStreamSynchronize(stream_), "weight upload (synchronize)");  // raw is reused
      }
    } else if (gpu::is_float(d.type)) {
      const size_t es = static_cast<size_t>(gpu::float_elem_bytes(d.type));
      v.stride = gpu::float_row_stride(d.cols);
      const size_t bytes = static_cast<size_t>(d.rows) * v.stride * es;
      st->data = DeviceBuffer(std::max<size_t>(bytes, 16));
      v.data = st->data.get();
      if (v.stride != d.cols) ck(cudaMemsetAsync(st->data.get(), 0, bytes, stream_), "cudaMemset");
      if (d.rows > 0) {
        ck(cudaMemcpy2DAsync(st->data.get(), v.stride * es, host, d.cols * es, d.cols * es, d.rows,
                             cudaMemcpyHostToDevice, stream_),
           "weight upload");
      }
      ck(cudaStreamSynchronize(stream_), "weight upload (synchronize)");
    } else {
      fail(StatusCode::kUnsupported,
           std::string("cuda backend: weight type ") + type_name(static_cast<uint32_t>(d.type)) + " is not supported");
    }
    return st;
  }

  // The f16 copy of a quant weight for cuBLAS, made on first use when memory
  // allows (EMBER_CUDA_F16_WEIGHTS: auto (default), always, never).
  bool ensure_w16(WeightStorage& st) {
    if (st.w16.get()) return true;
    if (st.w16_refused || f16_policy_ == "never") return false;
    const size_t bytes = static_cast<size_t>(st.view.N) * st.view.K * 2;
    if (f16_policy_ != "always") {
      size_t free_b = 0, total_b = 0;
      ck(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
      const size_t reserve = std::max<size_t>(size_t{1} << 30, total_b / 10);
      if (free_b < reserve || free_b - reserve < bytes) {
        st.w16_refused = true;
        return false;
      }
    }
    DeviceBuffer b;
    try {
      b = DeviceBuffer(bytes);
    } catch (const Error&) {
      cudaGetLastError();
      st.w16_refused = true;
      return false;
    }
    // Runs ahead of the recorded ops (it only depends on the weight).
    ck(gpu::dequantize_to_f16(st.view, 0, st.view.N, static_cast<uint16_t*>(b.get()), stream_), "dequantize_to_f16");
    st.w16 = std::move(b);
    return true;
  }

  // ---------------------------------------------------------------- execution

  void submit(Op op) {
    // Any op may write what the last quantization read: only back-to-back
    // quantized GEMVs over the same input share it.
    last_quant_ = LastQuant{};
    if (recording_) {
      ops_.push_back(std::move(op));
    } else {
      exec(op);
    }
  }

  void gemm(const MatmulOp& op, const void* a, cudaDataType_t a_type, int64_t lda, int64_t rows, float* y,
            const void* b, cudaDataType_t b_type) {
    const float one = 1.0f, zero = 0.0f;
    ckb(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(op.M),
                     static_cast<int>(op.w.K), &one, a, a_type, static_cast<int>(lda), b, b_type,
                     static_cast<int>(op.w.K), &zero, y, CUDA_R_32F, static_cast<int>(op.w.N), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }

  void exec(const Op& any) {
    std::visit([this](const auto& op) { run(op); }, any);
  }

  void run(const EmbedOp& op) { ck(gpu::embed(op.w, op.ids, op.n, op.out, stream_), "embed"); }
  void run(const RmsNormOp& op) { ck(gpu::rms_norm(op.x, op.w, op.rows, op.dim, op.eps, op.out, stream_), "rms_norm"); }
  void run(const MatmulOp& op) {
    if (op.path == GemmPath::kGemv) {
      if (gpu::is_quant(op.w.type) && !op.reuse_xq) {
        ck(gpu::quantize_activations(op.w.type, op.x, op.M, op.w.K, op.xq, op.xs, stream_), "quantize_activations");
      }
      ck(gpu::gemv(op.w, op.x, op.xq, op.xs, op.M, op.y, stream_), "gemv");
      return;
    }
    const void* b = op.x;
    cudaDataType_t b_type = CUDA_R_32F;
    if (op.w.type == DType::BF16) {
      ck(gpu::f32_to_bf16(op.x, op.M * op.w.K, op.xh, stream_), "f32_to_bf16");
      b = op.xh;
      b_type = CUDA_R_16BF;
    } else if (op.w.type != DType::F32) {
      ck(gpu::f32_to_f16(op.x, op.M * op.w.K, op.xh, stream_), "f32_to_f16");
      b = op.xh;
      b_type = CUDA_R_16F;
    }
    if (op.path == GemmPath::kDirect) {
      gemm(op, op.a, op.a_type, op.lda, op.w.N, op.y, b, b_type);
      return;
    }
    for (int64_t n0 = 0; n0 < op.w.N; n0 += op.tile_rows) {
      const int64_t rows = std::min(op.tile_rows, op.w.N - n0);
      ck(gpu::dequantize_to_f16(op.w, n0, rows, op.wtile, stream_), "dequantize_to_f16");
      gemm(op, op.wtile, CUDA_R_16F, op.w.K, rows, op.y + n0, b, b_type);
    }
  }
  void run(const RopeOp& op) {
    ck(gpu::rope(op.x, op.pos, op.theta_scale, op.rows, op.heads, op.head_dim, op.rot_dim, stream_, op.freq_scale,
                 op.factors, op.neox),
       "rope");
  }
  void run(const GegluOp& op) { ck(gpu::geglu(op.gate, op.up, op.n, op.out, stream_), "geglu"); }
  void run(const ScaleOp& op) { ck(gpu::scale(op.x, op.n, op.s, stream_), "scale"); }
  void run(const AddBiasOp& op) { ck(gpu::add_bias(op.x, op.bias, op.rows, op.dim, stream_), "add_bias"); }
  void run(const KvStoreOp& op) {
    ck(gpu::kv_store(op.kv, op.layer, op.k, op.v, op.slots, op.rows, stream_), "kv_store");
  }
  void run(const AttentionOp& op) { ck(gpu::attention(op.a, stream_), "attention"); }
  void run(const SwigluOp& op) { ck(gpu::swiglu(op.gate, op.up, op.n, op.out, stream_), "swiglu"); }
  void run(const AddOp& op) { ck(gpu::add(op.x, op.y, op.n, stream_), "add"); }
  void run(const GatherOp& op) { ck(gpu::gather_rows(op.x, op.rows, op.n, op.dim, op.out, stream_), "gather_rows"); }
  void run(const LoraOp& op) {
    ck(gpu::lora_term(op.a, op.b, op.scale, op.rows, op.n, op.x, op.t, op.y, stream_), "lora");
  }
  void run(const KvShiftOp& op) {
    ck(gpu::kv_rope_shift(op.kv, op.blocks, op.n, op.cs, op.sn, op.rot_dim, stream_, op.layer_stride, op.neox),
       "kv_rope_shift");
  }
  void run(const KvCopyOp& op) {
    if (!op.one_at_a_time) {
      ck(gpu::kv_copy_blocks(op.kv, op.src, op.dst, op.n, stream_), "kv_copy_blocks");
      return;
    }
    for (int32_t i = 0; i < op.n; ++i) {
      ck(gpu::kv_copy_blocks(op.kv, op.src + i, op.dst + i, 1, stream_), "kv_copy_blocks");
    }
  }

  // ---------------------------------------------------------------- graphs

  struct GraphEntry {
    std::vector<Op> ops;
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
  };
  static constexpr size_t kMaxGraphs = 16;

  void run_region(std::vector<Op> ops) {
    ++use_clock_;
    auto it = graphs_.find(key_);
    if (it != graphs_.end() && it->second.exec && it->second.ops == ops) {
      ck(cudaGraphLaunch(it->second.exec, stream_), "cudaGraphLaunch");
      it->second.last_use = use_clock_;
      ++stats_.replays;
      return;
    }
    cudaGraph_t graph = nullptr;
    bool captured = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (captured) {
      try {
        for (const Op& op : ops) exec(op);
      } catch (const Error&) {
        captured = false;
      }
      const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
      if (e != cudaSuccess || graph == nullptr) captured = false;
    }
    cudaGetLastError();  // a failed capture leaves a sticky-free error behind
    if (!captured) {
      if (graph) cudaGraphDestroy(graph);
      for (const Op& op : ops) exec(op);
      ++stats_.eager;
      return;
    }
    GraphEntry& entry = graphs_[key_];
    bool ok = false;
    if (entry.exec) {
      cudaGraphExecUpdateResultInfo info;
      if (cudaGraphExecUpdate(entry.exec, graph, &info) == cudaSuccess) {
        ok = true;
        ++stats_.updates;
      } else {
        cudaGetLastError();
        cudaGraphExecDestroy(entry.exec);
        entry.exec = nullptr;
      }
    }
    if (!ok) {
      const cudaError_t e = cudaGraphInstantiate(&entry.exec, graph, 0);
      if (e != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(graph);
        graphs_.erase(key_);
        for (const Op& op : ops) exec(op);
        ++stats_.eager;
        return;
      }
      ++stats_.captures;
    }
    cudaGraphDestroy(graph);
    entry.ops = std::move(ops);
    entry.last_use = use_clock_;
    ck(cudaGraphLaunch(entry.exec, stream_), "cudaGraphLaunch");
    if (graphs_.size() > kMaxGraphs) {
      auto victim = graphs_.end();
      for (auto g = graphs_.begin(); g != graphs_.end(); ++g) {
        if (g->first != key_ && (victim == graphs_.end() || g->second.last_use < victim->second.last_use)) victim = g;
      }
      if (victim != graphs_.end()) {
        ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        if (victim->second.exec) cudaGraphExecDestroy(victim->second.exec);
        graphs_.erase(victim);
      }
    }
  }

  // Ends a graph region: replays / captures a graph (or, with_graph false,
  // runs the recorded ops one by one).
  void end_region(bool with_graph) {
    recording_ = false;
    std::vector<Op> ops = std::move(ops_);
    ops_.clear();
    try {
      stager_.flush(stream_);
      if (ops.empty()) {
        // nothing recorded (e.g. a region ended by the first op)
      } else if (with_graph) {
        run_region(std::move(ops));
      } else {
        for (const Op& op : ops) exec(op);
        ++stats_.eager;
      }
    } catch (...) {
      bury();
      throw;
    }
    bury();
  }

  void graph_clear_locked() {
    if (recording_) end_region(false);
    if (stream_) cudaStreamSynchronize(stream_);
    for (auto& [key, e] : graphs_) {
      if (e.exec) cudaGraphExecDestroy(e.exec);
    }
    graphs_.clear();
  }

  // ---------------------------------------------------------------- state

  int device_;
  cudaDeviceProp prop_{};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer cublas_ws_;
  mutable std::recursive_mutex mutex_;

  KvGeometry geom_;
  DeviceBuffer kv_;
  std::map<std::tuple<const void*, DType, int64_t, int64_t>, std::weak_ptr<WeightStorage>> weights_;

  Stager stager_;
  PinnedBuffer bounce_;
  DeviceBuffer act_, xh_, wtile_, attn_part_, tokens_, lora_t_;
  std::vector<DeviceBuffer> dev_graveyard_;
  std::vector<PinnedBuffer> host_graveyard_;
  std::vector<int32_t> meta_;

  struct LastQuant {
    const float* x = nullptr;
    int64_t M = 0, K = 0;
    const int8_t* xq = nullptr;
    int kind = -1;  // gpu::act_kind of the weight it was quantized for
  };
  LastQuant last_quant_;
  int gemv_max_m_ = gpu::kGemvMaxNR;
  bool batch_invariant_ = true;
  std::string f16_policy_ = "auto";

  bool recording_ = false;
  uint64_t key_ = 0;
  std::vector<Op> ops_;
  std::unordered_map<uint64_t, GraphEntry> graphs_;
  uint64_t use_clock_ = 0;
  GraphStats stats_;
};

// ------------------------------------------------------------------ plugin entry

void write_err(char* err, size_t size, const std::string& msg) {
  if (!err || size == 0) return;
  const size_t n = std::min(size - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

std::string cuda_version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

int32_t create_cuda_backend(const char* device, int32_t n_threads, Backend** out_backend, BackendExtras** out_extras,
                            char* err, size_t err_size) noexcept {
  try {
    if (!out_backend) return static_cast<int32_t>(StatusCode::kInvalidArgument);
    *out_backend = nullptr;
    if (out_extras) *out_extras = nullptr;
    const std::string dev = device ? device : "cuda";
    int index = 0;
    if (dev.rfind("cuda:", 0) == 0) {
      index = std::atoi(dev.c_str() + 5);
    } else if (dev != "cuda") {
      write_err(err, err_size, "the CUDA plugin does not serve device '" + dev + "'");
      return static_cast<int32_t>(StatusCode::kUnsupported);
    }
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      cudaGetLastError();
      std::string why;
      if (e == cudaErrorInsufficientDriver) {
        int drv = 0;
        cudaDriverGetVersion(&drv);
        why = drv == 0 ? "no NVIDIA driver is installed (libcuda.so.1 was not found)"
                       : "the NVIDIA driver supports CUDA " + cuda_version_string(drv) +
                             " but this plugin needs CUDA " + cuda_version_string(CUDART_VERSION);
      } else if (e == cudaErrorNoDevice || (e == cudaSuccess && count == 0)) {
        why = "no CUDA-capable GPU is present";
      } else {
        why = std::string("the CUDA runtime cannot start: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
      }
      write_err(err, err_size, why);
      return static_cast<int32_t>(StatusCode::kUnsupported);
    }
    if (index < 0 || index >= count) {
      write_err(err, err_size, "device " + dev + " requested but " + std::to_string(count) + " CUDA device(s) present");
      return static_cast<int32_t>(StatusCode::kUnsupported);
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
      cudaGetLastError();
      write_err(err, err_size, "cannot query CUDA device " + std::to_string(index));
      return static_cast<int32_t>(StatusCode::kUnsupported);
    }
    if (prop.major < 8) {
      write_err(err, err_size,
                std::string(prop.name) + " has compute capability " + std::to_string(prop.major) + "." +
                    std::to_string(prop.minor) + "; the CUDA backend needs 8.0 or newer (built for " +
                    EMBER_CUDA_ARCHS + ")");
      return static_cast<int32_t>(StatusCode::kUnsupported);
    }
    auto* b = new CudaBackend(index);
    *out_backend = b;
    if (out_extras) *out_extras = b;
    return 0;
  } catch (const Error& e) {
    write_err(err, err_size, e.what());
    return static_cast<int32_t>(e.code());
  } catch (const std::exception& e) {
    write_err(err, err_size, std::string("CUDA backend: ") + e.what());
    return static_cast<int32_t>(StatusCode::kInternal);
  } catch (...) {
    write_err(err, err_size, "CUDA backend: unknown error");
    return static_cast<int32_t>(StatusCode::kInternal);
  }
}

const std::string& build_info() {
  static const std::string s = "CUDA " + cuda_version_string(CUDART_VERSION) + ", archs " + EMBER_CUDA_ARCHS;
  return s;
}

}  // namespace
}  // namespace ember

extern "C" __attribute__((visibility("default"))) const ember_backend_plugin_v1* ember_cuda_plugin_v1(void) {
  static const ember_backend_plugin_v1 table = {
      ember::kBackendPluginAbi,    ember::backend_interface_fingerprint(), "cuda", ember::build_info().c_str(),
      &ember::create_cuda_backend,
  };
  return &table;
}
