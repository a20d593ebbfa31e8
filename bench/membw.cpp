// membw: read bandwidth of main memory (a plain program, not a test).
//
//   membw [--size-mib 1024] [--threads 1,2] [--reps 10] [--kernel auto|avx2|scalar] [--streams 1] [--json]
//
// Allocates one large buffer (default 1 GiB, far past any cache; 2 MiB
// aligned and advised for transparent huge pages), writes it once from the
// largest thread count (first touch), then for each thread count reads it
// `--reps` times after one warm-up pass: every thread sums 64-byte lines of
// its contiguous slice (AVX2 loads where the CPU has AVX2, chosen at run
// time; 64-bit scalar loads otherwise). It prints the best and the median
// read bandwidth in GB/s (1e9 bytes per second). --threads defaults to 1 and
// the number of CPUs this process may run on. tools/bench_vs_llamacpp.py
// divides each decode's weight traffic by this figure (--json).
//
// --streams S (AVX2 only) makes every thread read its slice as S equal
// streams at once, one line of each per step, as a kernel reading several
// weight rows or tile groups together does: a check of whether concurrent
// streams per thread reach more bandwidth than one (on the Zen 4 VM of
// docs/BENCHMARKS.md they do not: one thread 34 / 34 / 27 / 30 GB/s at S =
// 1 / 2 / 4 / 8, two threads ~35-37 at every S).
//
// Compiled for plain x86-64 (no -mavx2): the AVX2 loop carries
// __attribute__((target("avx2"))) and only runs after __builtin_cpu_supports.
#include <omp.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MEMBW_X86 1
#endif

namespace {

// Sum of the 64-bit words of [p, p + n), n a multiple of 128.
uint64_t sum_scalar(const uint8_t* p, size_t n) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n / 8; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] += w[i + static_cast<size_t>(j)];
  }
  uint64_t s = 0;
  for (uint64_t x : a) s += x;
  return s;
}

#ifdef MEMBW_X86
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  __m256i a2 = _mm256_setzero_si256(), a3 = _mm256_setzero_si256();
  for (size_t i = 0; i < n; i += 128) {  // two 64-byte lines per iteration
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// Sum of S streams at once: stream j is the n bytes from p + j * (n + 448)
// (7 lines apart beyond n: streams a power of two apart alias in the DRAM
// banks and read slower), one 64-byte line from each stream per step, as a
// kernel reading several weight rows or tile groups at once does. n a
// multiple of 64.
template <int S>
__attribute__((target("avx2"))) uint64_t sum_avx2_streams(const uint8_t* p, size_t n) {
  __m256i a[S];
  for (int j = 0; j < S; ++j) a[j] = _mm256_setzero_si256();
  for (size_t i = 0; i < n; i += 64) {
    for (int j = 0; j < S; ++j) {
      const uint8_t* q = p + static_cast<size_t>(j) * (n + 448) + i;
      a[j] = _mm256_add_epi64(a[j], _mm256_add_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(q)),
                                                     _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 32))));
    }
  }
  __m256i s = a[0];
  for (int j = 1; j < S; ++j) s = _mm256_add_epi64(s, a[j]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

using SumFn = uint64_t (*)(const uint8_t*, size_t);

#ifdef MEMBW_X86
// [p, p + n) read as `streams` equal streams at once (sum_avx2_streams; the
// rest by sum_avx2).
__attribute__((target("avx2"))) uint64_t sum_avx2_split(const uint8_t* p, size_t n, int streams) {
  if (n < static_cast<size_t>(streams) * 4096) return sum_avx2(p, n);
  const size_t part = (n / static_cast<size_t>(streams) / 128 * 128) - 1024;
  uint64_t s = 0;
  switch (streams) {
    case 2: s = sum_avx2_streams<2>(p, part); break;
    case 4: s = sum_avx2_streams<4>(p, part); break;
    case 8: s = sum_avx2_streams<8>(p, part); break;
    case 16: s = sum_avx2_streams<16>(p, part); break;
    default: return sum_avx2(p, n);
  }
  const size_t done = (part + 448) * static_cast<size_t>(streams);
  return s + sum_avx2(p + done, n - done);
}
#endif

[[noreturn]] void usage(const char* msg) {
  if (msg) std::fprintf(stderr, "membw: %s\n", msg);
  std::fprintf(stderr,
               "usage: membw [--size-mib 1024] [--threads 1,2] [--reps 10] [--kernel auto|avx2|scalar] [--streams 1] "
               "[--json]\n");
  std::exit(2);
}

long parse_int(const char* s, long lo, long hi, const char* what) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!end || *end || end == s || v < lo || v > hi) usage((std::string("bad value for ") + what).c_str());
  return v;
}

// The slice [begin, end) of thread `tid` of `nt` over n_units 128-byte units.
void slice(size_t n_units, int tid, int nt, size_t& begin, size_t& end) {
  begin = n_units * static_cast<size_t>(tid) / static_cast<size_t>(nt);
  end = n_units * static_cast<size_t>(tid + 1) / static_cast<size_t>(nt);
}

}  // namespace

int main(int argc, char** argv) {
  size_t size_mib = 1024;
  int reps = 10;
  int streams = 1;
  bool json = false;
  std::string kernel = "auto";
  std::vector<int> threads;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--size-mib") {
      size_mib = static_cast<size_t>(parse_int(value(), 1, 1 << 20, "--size-mib"));
    } else if (a == "--reps") {
      reps = static_cast<int>(parse_int(value(), 1, 1000, "--reps"));
    } else if (a == "--threads") {
      std::string list = value();
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        threads.push_back(static_cast<int>(parse_int(list.substr(pos, comma - pos).c_str(), 1, 4096, "--threads")));
        pos = comma + 1;
      }
    } else if (a == "--streams") {
      streams = static_cast<int>(parse_int(value(), 1, 16, "--streams"));
      if (streams & (streams - 1)) usage("--streams is 1, 2, 4, 8 or 16");
    } else if (a == "--kernel") {
      kernel = value();
      if (kernel != "auto" && kernel != "avx2" && kernel != "scalar") usage("--kernel is auto, avx2 or scalar");
    } else if (a == "--json") {
      json = true;
    } else if (a == "-h" || a == "--help") {
      usage(nullptr);
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  int n_cpus = 1;
  {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n_cpus = std::max(1, CPU_COUNT(&set));
  }
  if (threads.empty()) {
    threads.push_back(1);
    if (n_cpus > 1) threads.push_back(n_cpus);
  }

  bool have_avx2 = false;
#ifdef MEMBW_X86
  __builtin_cpu_init();
  have_avx2 = __builtin_cpu_supports("avx2");
#endif
  if (kernel == "avx2" && !have_avx2) usage("--kernel avx2: this CPU (or build) has no AVX2");
  if (streams > 1 && !(kernel != "scalar" && have_avx2)) usage("--streams needs the AVX2 kernel");
  const bool use_avx2 = kernel == "avx2" || (kernel == "auto" && have_avx2);
  SumFn fn = sum_scalar;
#ifdef MEMBW_X86
  if (use_avx2) fn = sum_avx2;
#endif

  const size_t bytes = size_mib << 20;
  const size_t unit = 128;  // bytes per loop iteration of both kernels
  const size_t n_units = bytes / unit;
  void* mem = nullptr;
  if (posix_memalign(&mem, size_t{2} << 20, bytes) != 0) {
    std::fprintf(stderr, "membw: cannot allocate %zu MiB\n", size_mib);
    return 1;
  }
#ifdef MADV_HUGEPAGE
  madvise(mem, bytes, MADV_HUGEPAGE);  // best effort: fewer TLB misses, as a large weight mmap would hope for
#endif
  auto* buf = static_cast<uint8_t*>(mem);
  const int max_t = *std::max_element(threads.begin(), threads.end());
  // First touch from the threads that will read (NUMA placement), nonzero data.
#pragma omp parallel num_threads(max_t)
  {
    size_t b, e;
    slice(n_units, omp_get_thread_num(), omp_get_num_threads(), b, e);
    for (size_t i = b * unit; i < e * unit; i += 8) {
      const uint64_t v = i * 0x9E3779B97F4A7C15ull;
      std::memcpy(buf + i, &v, 8);
    }
  }

  struct Result {
    int threads;
    double best_gbs, median_gbs;
  };
  std::vector<Result> results;
  uint64_t checksum = 0;
  for (int nt : threads) {
    std::vector<double> secs;
    for (int r = 0; r < reps + 1; ++r) {  // the first pass warms up
      uint64_t total = 0;
      const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt) reduction(+ : total)
      {
        size_t b, e;
        slice(n_units, omp_get_thread_num(), omp_get_num_threads(), b, e);
#ifdef MEMBW_X86
        if (streams > 1) {
          total += sum_avx2_split(buf + b * unit, (e - b) * unit, streams);
        } else {
          total += fn(buf + b * unit, (e - b) * unit);
        }
#else
        total += fn(buf + b * unit, (e - b) * unit);
#endif
      }
      const double dt = omp_get_wtime() - t0;
      checksum += total;
      if (r > 0) secs.push_back(dt);
    }
    std::sort(secs.begin(), secs.end());
    const double gb = static_cast<double>(n_units * unit) / 1e9;
    results.push_back({nt, gb / secs.front(), gb / secs[secs.size() / 2]});
  }
  std::free(mem);

  const char* kname = use_avx2 ? "avx2" : "scalar";
  if (json) {
    std::printf(
        "{\"buffer_bytes\": %zu, \"kernel\": \"%s\", \"reps\": %d, \"cpus\": %d, \"checksum\": %llu, \"results\": [",
        bytes, kname, reps, n_cpus, static_cast<unsigned long long>(checksum));
    for (size_t i = 0; i < results.size(); ++i) {
      std::printf("%s{\"threads\": %d, \"best_gb_per_s\": %.2f, \"median_gb_per_s\": %.2f}", i ? ", " : "",
                  results[i].threads, results[i].best_gbs, results[i].median_gbs);
    }
    std::printf("]}\n");
  } else {
    std::printf("membw: %zu MiB buffer, %s loads, best of %d passes (checksum %llx)\n", size_mib, kname, reps,
                static_cast<unsigned long long>(checksum));
    for (const auto& r : results) {
      std::printf("threads %3d: read %7.2f GB/s (median %.2f)\n", r.threads, r.best_gbs, r.median_gbs);
    }
  }
  return 0;
}
