#include "cpu/dnnl_matmul.h"

#include "core/util/status.h"

#if EMBER_WITH_ONEDNN

#include <dnnl.hpp>

#include <mutex>
#include <string>
#include <unordered_map>

#include "cpu/cpu_features.h"

namespace ember::cpu::dnnl_mm {
namespace {

using dt = dnnl::memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

struct Key {
  int64_t M, N, K, ldx, ldy;
  int prec;
  bool operator==(const Key& o) const {
    return M == o.M && N == o.N && K == o.K && ldx == o.ldx && ldy == o.ldy && prec == o.prec;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t v : {k.M, k.N, k.K, k.ldx, k.ldy, static_cast<int64_t>(k.prec)})
      h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    return h;
  }
};

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc src, wei, dst;
};

// Prompt lengths vary, so the number of shapes is unbounded: the cache is
// cleared when it grows past this many entries (cheap: creation is ~0.1 ms,
// and oneDNN keeps its own primitive cache underneath).
constexpr size_t kMaxEntries = 256;

std::mutex g_mu;
std::unordered_map<Key, Entry, KeyHash>& cache() {
  static std::unordered_map<Key, Entry, KeyHash> c;
  return c;
}

Entry make_entry(const Key& k) {
  const dt t = k.prec == 1 ? dt::bf16 : dt::f32;
  dnnl::memory::desc src({k.M, k.K}, t, dnnl::memory::dims{k.ldx, 1});
  dnnl::memory::desc wei({k.K, k.N}, t, dnnl::memory::dims{1, k.K});  // W[N,K] row-major = (K x N) "ba"
  dnnl::memory::desc dst({k.M, k.N}, dt::f32, dnnl::memory::dims{k.ldy, 1});
  auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wei, dst), engine());
  return Entry{dnnl::matmul(pd), src, wei, dst};
}

}  // namespace

struct StreamState {
  dnnl::stream stream{engine()};
};
bool available() { return true; }

StreamHolder::StreamHolder() = default;
StreamHolder::~StreamHolder() = default;
StreamHolder::StreamHolder(StreamHolder&&) noexcept = default;
StreamHolder& StreamHolder::operator=(StreamHolder&&) noexcept = default;

void matmul(Precision p, int64_t M, int64_t N, int64_t K, const void* x, int64_t ldx, const void* w, float* y,
            int64_t ldy, StreamHolder& stream) {
  const Key key{M, N, K, ldx, ldy, p == Precision::kBf16 ? 1 : 0};
  try {
    Entry e;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      auto& c = cache();
      auto it = c.find(key);
      if (it == c.end()) {
        if (c.size() >= kMaxEntries) c.clear();
        it = c.emplace(key, make_entry(key)).first;
      }
      e = it->second;  // primitives are ref-counted handles; execute is thread-safe
    }
    if (!stream.state) stream.state = std::make_unique<StreamState>();
    dnnl::memory src(e.src, engine(), const_cast<void*>(x));
    dnnl::memory wei(e.wei, engine(), const_cast<void*>(w));
    dnnl::memory dst(e.dst, engine(), y);
    e.prim.execute(stream.state->stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    stream.state->stream.wait();
  } catch (const dnnl::error& err) {
    fail(err.status == dnnl_unimplemented ? StatusCode::kUnsupported : StatusCode::kInternal,
         std::string("oneDNN matmul (") + (p == Precision::kBf16 ? "bf16" : "f32") + ", M=" + std::to_string(M) +
             " N=" + std::to_string(N) + " K=" + std::to_string(K) + "): " + err.what());
  }
}

bool bf16_supported() {
  static const bool ok = [] {
    try {
      make_entry(Key{16, 16, 32, 32, 16, 1});
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

bool bf16_native() {
  const CpuFeatures& f = cpu_features();
  return (f.avx512bf16 && f.os_avx512) || f.amx_bf16;
}

size_t cache_entries() {
  std::lock_guard<std::mutex> lock(g_mu);
  return cache().size();
}

void clear_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  cache().clear();
}

}  // namespace ember::cpu::dnnl_mm

#else  // !EMBER_WITH_ONEDNN

namespace ember::cpu::dnnl_mm {

struct StreamState {};
bool available() { return false; }
StreamHolder::StreamHolder() = default;
StreamHolder::~StreamHolder() = default;
StreamHolder::StreamHolder(StreamHolder&&) noexcept = default;
StreamHolder& StreamHolder::operator=(StreamHolder&&) noexcept = default;

void matmul(Precision, int64_t, int64_t, int64_t, const void*, int64_t, const void*, float*, int64_t, StreamHolder&) {
  fail(StatusCode::kInternal, "matmul: this build has no oneDNN (EMBER_WITH_ONEDNN=OFF)");
}
bool bf16_supported() { return false; }
bool bf16_native() { return false; }
size_t cache_entries() { return 0; }
void clear_cache() {}

}  // namespace ember::cpu::dnnl_mm

#endif  // EMBER_WITH_ONEDNN
