// libember_dnnl.so: oneDNN's matmul primitive behind the C table of
// dnnl_plugin.h, for the prefill GEMMs of engines without batch invariance.
// Primitives are cached by shape in a process-wide, mutex-protected cache.
// Nothing is thrown across the table: errors come back as a status code and
// a message.
#include "cpu/dnnl/dnnl_plugin.h"

#include <dnnl.hpp>

#include <cstdio>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "core/util/status.h"

namespace {

using dt = dnnl::memory::data_type;
using ember::StatusCode;

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

struct Stream {
  dnnl::stream stream{engine()};
};

int32_t error(StatusCode code, const std::string& msg, char* err, size_t err_size) {
  if (err && err_size > 0) std::snprintf(err, err_size, "%s", msg.c_str());
  return static_cast<int32_t>(code);
}

int32_t matmul(int32_t bf16, int64_t M, int64_t N, int64_t K, const void* x, int64_t ldx, const void* w, float* y,
               int64_t ldy, void** stream, char* err, size_t err_size) {
  const Key key{M, N, K, ldx, ldy, bf16 ? 1 : 0};
  const std::string what = std::string("oneDNN matmul (") + (bf16 ? "bf16" : "f32") + ", M=" + std::to_string(M) +
                           " N=" + std::to_string(N) + " K=" + std::to_string(K) + "): ";
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
    if (*stream == nullptr) *stream = new Stream;
    Stream& s = *static_cast<Stream*>(*stream);
    dnnl::memory src(e.src, engine(), const_cast<void*>(x));
    dnnl::memory wei(e.wei, engine(), const_cast<void*>(w));
    dnnl::memory dst(e.dst, engine(), y);
    e.prim.execute(s.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    s.stream.wait();
    return 0;
  } catch (const dnnl::error& e) {
    return error(e.status == dnnl_unimplemented ? StatusCode::kUnsupported : StatusCode::kInternal, what + e.what(),
                 err, err_size);
  } catch (const std::bad_alloc&) {
    return error(StatusCode::kOutOfMemory, what + "out of memory", err, err_size);
  } catch (const std::exception& e) {
    return error(StatusCode::kInternal, what + e.what(), err, err_size);
  } catch (...) {
    return error(StatusCode::kInternal, what + "unknown error", err, err_size);
  }
}

void free_stream(void* stream) { delete static_cast<Stream*>(stream); }

int32_t bf16_supported() {
  static const bool ok = [] {
    try {
      make_entry(Key{16, 16, 32, 32, 16, 1});
      return true;
    } catch (...) {
      return false;  // oneDNN 2.6 refuses bf16 on CPUs without AVX-512
    }
  }();
  return ok ? 1 : 0;
}

size_t cache_entries() {
  std::lock_guard<std::mutex> lock(g_mu);
  return cache().size();
}

void clear_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  cache().clear();
}

const ember_dnnl_table_v1 kTable = {
    ember::cpu::dnnl_mm::kDnnlPluginAbi, matmul, free_stream, bf16_supported, cache_entries, clear_cache};

}  // namespace

extern "C" __attribute__((visibility("default"))) const ember_dnnl_table_v1* ember_dnnl_plugin_v1() { return &kTable; }
