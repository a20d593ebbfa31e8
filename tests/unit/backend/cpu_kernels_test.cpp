// The CPU backend's two kernel variants (cpu/backend_kernels.h): the portable
// one, which runs on CPUs without AVX2, must give the AVX2 one's results bit
// for bit on every kernel, including exp's rescaled and saturated ranges, f16
// rounding ties and subnormals, both attention summation orders and holes.
// (g++ 12 -O3 reports a false free-nonheap-object on the byte pools below.)
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor/types.h"
#include "cpu/backend_kernels.h"
#include "cpu/cpu_features.h"

namespace ember::cpu::detail {
namespace {

uint32_t fbits(float f) { return std::bit_cast<uint32_t>(f); }

class CpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!isa_supported(Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU: nothing to compare the scalar kernels with";
  }
  const BackendKernels& scalar = backend_kernels_scalar();
  const BackendKernels& avx2 = backend_kernels_avx2();
  // The AVX-512 variant where the CPU has it (else AVX2 once more).
  const BackendKernels& avx512 = isa_supported(Isa::kAvx512Vnni) ? backend_kernels_avx512() : backend_kernels_avx2();
  std::mt19937 rng{7};
};

// Values across exp's ranges: ordinary, |x / ln2| > 126 (rescaled), > 192
// (saturated), infinities, zeros, subnormals and f16 edge values.
std::vector<float> nasty(std::mt19937& rng, size_t n) {
  std::vector<float> v;
  const float specials[] = {
      0.f,    -0.f,    1.f,     -1.f,    87.f,     -87.f,    88.7f,    -88.7f,   89.f,
      -89.f,  100.f,   -100.f,  130.f,   -130.f,   200.f,    -200.f,   INFINITY, -INFINITY,
      1e-40f, -1e-40f, 65504.f, 65520.f, -65520.f, 5.96e-8f, 2.98e-8f, 6.1e-5f,  0.5f + 1.f / 4096.f};
  for (float s : specials) v.push_back(s);
  std::normal_distribution<float> d(0.f, 4.f);
  std::uniform_real_distribution<float> wide(-150.f, 150.f);
  while (v.size() < n) v.push_back(v.size() % 3 ? d(rng) : wide(rng));
  v.resize(n);
  return v;
}

// Random cache rows: f16 values times mul, or Q8_0 blocks (scales from mul).
void fill_cache(std::vector<uint8_t>& pool, bool q8, float mul, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::uniform_int_distribution<int> qd(-127, 127);
  if (!q8) {
    for (size_t i = 0; i + 1 < pool.size(); i += 2) {
      const uint16_t h = fp32_to_fp16(d(rng) * mul);
      std::memcpy(&pool[i], &h, 2);
    }
    return;
  }
  for (size_t b = 0; b + 34 <= pool.size(); b += 34) {
    const uint16_t h = fp32_to_fp16(std::fabs(d(rng)) * mul / 64.f + 1e-3f);
    std::memcpy(&pool[b], &h, 2);
    for (int j = 0; j < 32; ++j) pool[b + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(qd(rng)));
  }
}

// A paged K/V pool of random rows holding max_len slots in scattered blocks,
// and the AttendArgs fields that describe it.
struct TestCache {
  size_t row_bytes, block_bytes;
  std::vector<uint8_t> k, v;
  std::vector<int32_t> table;
  TestCache(int32_t kv_heads, int32_t hd, int32_t bs, int32_t max_len, bool q8, std::mt19937& rng) {
    const int32_t n_blocks = (max_len + bs - 1) / bs + 2;
    row_bytes = q8 ? static_cast<size_t>(hd) / 32 * 34 : static_cast<size_t>(hd) * 2;
    block_bytes = static_cast<size_t>(kv_heads) * bs * row_bytes;
    k.resize(block_bytes * n_blocks);
    v.resize(block_bytes * n_blocks);
    fill_cache(k, q8, 3.2f, rng);
    fill_cache(v, q8, 3.2f, rng);
    for (int32_t b = 0; b < n_blocks - 1; ++b) table.push_back((b * 7 + 1) % n_blocks);
  }
  // For kv head kvh of `heads` query heads over `kv_heads`, queries q.
  AttendArgs args(int32_t bs, int32_t heads, int32_t kv_heads, int32_t hd, int32_t kvh, const float* q) const {
    AttendArgs a{};
    a.k_base = k.data();
    a.v_base = v.data();
    a.block_bytes = block_bytes;
    a.row_bytes = row_bytes;
    a.block_size = bs;
    a.block_table = table.data();
    a.q = q;
    a.kvh = kvh;
    a.num_heads = heads;
    a.num_kv_heads = kv_heads;
    a.head_dim = hd;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    return a;
  }
};

TEST_F(CpuKernels, SwiGluAndF16StoreAreBitIdentical) {
  const size_t n = 4096;
  const auto g = nasty(rng, n), u = nasty(rng, n);
  std::vector<float> a(n), b(n);
  scalar.swiglu8(g.data(), u.data(), n, a.data());
  avx2.swiglu8(g.data(), u.data(), n, b.data());
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;  // (inf * 0) NaN payloads may differ
    ASSERT_EQ(fbits(a[i]), fbits(b[i])) << i << ": gate " << g[i] << " up " << u[i];
  }
  std::vector<uint16_t> ha(n + 5), hb(n + 5);
  scalar.f32_to_f16(g.data(), ha.data(), static_cast<int32_t>(n + 5 - 8));  // a tail of 5
  avx2.f32_to_f16(g.data(), hb.data(), static_cast<int32_t>(n + 5 - 8));
  for (size_t i = 0; i < n - 3; ++i) ASSERT_EQ(ha[i], hb[i]) << i << ": " << g[i];
}

TEST_F(CpuKernels, RopeShiftIsBitIdentical) {
  for (int32_t hd : {64, 80, 128, 10}) {  // 10: the pairwise tail
    const size_t rows = 33;
    std::vector<uint16_t> k(rows * hd);
    std::normal_distribution<float> d(0.f, 2.f);
    for (auto& h : k) h = fp32_to_fp16(d(rng));
    std::vector<float> cs(hd), sn(hd);
    for (int32_t i = 0; i < hd / 2; ++i) {
      const double th = -37.0 * std::pow(10000.0, -2.0 * i / hd);
      cs[2 * i] = cs[2 * i + 1] = static_cast<float>(std::cos(th));
      sn[2 * i] = static_cast<float>(-std::sin(th));
      sn[2 * i + 1] = static_cast<float>(std::sin(th));
    }
    auto ka = k, kb = k;
    scalar.rope_shift_rows(ka.data(), rows, hd, cs.data(), sn.data());
    avx2.rope_shift_rows(kb.data(), rows, hd, cs.data(), sn.data());
    ASSERT_EQ(ka, kb) << "head_dim " << hd;
    ASSERT_NE(ka, k);
  }
}

TEST_F(CpuKernels, AttentionIsBitIdentical) {
  struct Case {
    int32_t heads, kv_heads, hd, bs, kv_len, hole_begin, hole_end;
    bool vec;
  };
  const Case cases[] = {
      {9, 3, 64, 16, 1, 0, 0, false},    {9, 3, 64, 16, 77, 0, 0, false},  {9, 3, 64, 16, 77, 0, 0, true},
      {4, 4, 128, 32, 300, 4, 36, true}, {16, 1, 40, 16, 45, 0, 0, true},  {8, 2, 256, 16, 129, 16, 48, false},
      {2, 1, 8, 16, 33, 0, 0, true},     {4, 1, 256, 16, 200, 0, 0, true}, {4, 1, 256, 16, 200, 3, 7, false},
      {16, 1, 40, 16, 46, 5, 6, false},  {12, 2, 24, 16, 70, 0, 0, true},  {12, 2, 24, 16, 71, 0, 0, false}};
  std::normal_distribution<float> d(0.f, 1.f);
  // qmul 60: score differences past 87 and 130, exp's rescaled and
  // saturated ranges inside the softmax.
  // Both cache row types: f16, and Q8_0 (head_dim a multiple of 32).
  for (bool is_q8 : {false, true})
    for (float qmul : {2.f, 60.f})
      for (const Case& c : cases) {
        if (is_q8 && c.hd % 32 != 0) continue;
        const int32_t n_blocks = (c.kv_len + c.bs - 1) / c.bs + 2;
        const size_t row_bytes = is_q8 ? static_cast<size_t>(c.hd) / 32 * 34 : static_cast<size_t>(c.hd) * 2;
        const size_t block_bytes = static_cast<size_t>(c.kv_heads) * c.bs * row_bytes;
        std::vector<uint8_t> kpool(block_bytes * n_blocks), vpool(block_bytes * n_blocks);
        fill_cache(kpool, is_q8, 3.f, rng);
        fill_cache(vpool, is_q8, 1.f, rng);
        std::vector<int32_t> table;
        for (int32_t b = 0; b < n_blocks - 1; ++b) table.push_back((b * 7 + 1) % n_blocks);  // scattered blocks
        const int32_t rows = 2;
        std::vector<float> q(static_cast<size_t>(rows) * c.heads * c.hd);
        for (auto& x : q) x = d(rng) * qmul;
        const int32_t n_pad = (c.kv_len + 31) & ~31;
        std::vector<float> out_a(q.size(), -1.f), out_b(q.size(), -2.f), out_c(q.size(), -3.f);
        for (int32_t kvh = 0; kvh < c.kv_heads; ++kvh) {
          // By position, not by address: on a CPU without AVX-512, `avx512` is the AVX2 table.
          const BackendKernels* kerns[3] = {&scalar, &avx2, &avx512};
          float* outs[3] = {out_a.data(), out_b.data(), out_c.data()};
          for (int which = 0; which < 3; ++which) {
            const BackendKernels* kern = kerns[which];
            std::vector<float> sc(static_cast<size_t>(c.heads / c.kv_heads) * n_pad),
                acc(32 * static_cast<size_t>(c.hd) * (c.heads / c.kv_heads));
            AttendArgs a{};
            a.k_base = kpool.data();
            a.v_base = vpool.data();
            a.block_bytes = block_bytes;
            a.row_bytes = row_bytes;
            a.block_size = c.bs;
            a.block_table = table.data();
            a.hole_begin = c.hole_begin;
            a.hole_end = c.hole_end;
            a.q = q.data();
            a.row = 1;
            a.kvh = kvh;
            a.num_heads = c.heads;
            a.num_kv_heads = c.kv_heads;
            a.head_dim = c.hd;
            a.kv_len = c.kv_len;
            a.vec_order = c.vec;
            a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
            a.scores = sc.data();
            a.acc = acc.data();
            a.out = outs[which];
            (is_q8 ? kern->attend_group_q8 : kern->attend_group)(a);
          }
        }
        const size_t row1 = static_cast<size_t>(c.heads) * c.hd;
        for (size_t i = row1; i < 2 * row1; ++i) {
          ASSERT_EQ(fbits(out_a[i]), fbits(out_b[i]))
              << "q8 " << is_q8 << " qmul " << qmul << " heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd
              << " kv_len " << c.kv_len << " vec " << c.vec << " at " << i;
          ASSERT_EQ(fbits(out_a[i]), fbits(out_c[i]))
              << "avx512: q8 " << is_q8 << " heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd << " kv_len "
              << c.kv_len << " vec " << c.vec << " at " << i;
        }
      }
}

// attend_rows (several rows of one sequence's cache: a token tree's rows, a
// prompt chunk's) gives each row attend_group's result alone, to the bit, on
// every variant: shared slots across range boundaries, a hole, tree rows
// mapped past the shared slots, prompt rows whose kv_len grows by one, more
// rows than kAttnMaxRows, and rows that may not share (mixed orders).
TEST_F(CpuKernels, AttentionRowsEqualEachRowAlone) {
  struct Case {
    int32_t heads, kv_heads, hd, bs, prefix, hole_begin, hole_end;
    bool q8, tree, mixed;
    int32_t n_rows;
  };
  const Case cases[] = {
      {9, 3, 64, 16, 2300, 0, 0, false, true, false, 9},    // SmolLM2's shape, past one 2048-slot range
      {9, 3, 64, 16, 77, 0, 0, false, false, false, 11},    // a prompt chunk of 11 rows
      {4, 1, 256, 16, 700, 40, 72, false, true, false, 5},  // Gemma 3's shape, a hole, 512-slot ranges
      {4, 1, 256, 16, 700, 40, 72, false, false, false, 8},
      {8, 2, 64, 32, 1500, 0, 0, true, true, false, 13},   // a Q8_0 cache
      {9, 3, 64, 16, 300, 0, 0, false, true, true, 7},     // mixed orders: no sharing
      {9, 3, 64, 16, 5, 0, 0, false, true, false, 4},      // fewer shared slots than a block of eight
      {16, 1, 64, 16, 200, 0, 0, false, false, false, 8},  // the most queries at once (8 rows x 16)
      {6, 2, 40, 16, 90, 20, 36, false, true, false, 3},   // head_dim not a multiple of 32 or 16
  };
  std::normal_distribution<float> d(0.f, 1.f);
  for (const Case& c : cases) {
    const TestCache cache(c.kv_heads, c.hd, c.bs, c.prefix + c.n_rows + 1, c.q8, rng);
    const int32_t group = c.heads / c.kv_heads;
    std::vector<float> q(static_cast<size_t>(c.n_rows) * c.heads * c.hd);
    for (auto& x : q) x = d(rng) * 4.f;
    // Tree rows: row 0 the root (slots [0, prefix)), row r a node whose path
    // is the slots prefix .. prefix + r - 1 in a scrambled order. Prompt
    // rows: row r sees [0, prefix + r).
    std::vector<int32_t> kv_len(c.n_rows), paths;
    std::vector<size_t> path_at(c.n_rows);
    for (int32_t r = 0; r < c.n_rows; ++r) {
      kv_len[r] = c.prefix + r;
      path_at[r] = paths.size();
      for (int32_t k = 0; k < r; ++k) paths.push_back(c.prefix + (k * 5 + r) % c.n_rows);
    }
    if (!c.tree) kv_len[0] = c.prefix;
    for (int32_t r = 0; r < c.n_rows; ++r) kv_len[r] = std::max(kv_len[r], 1);
    const BackendKernels* kerns[3] = {&scalar, &avx2, &avx512};
    for (const BackendKernels* kern : kerns) {
      for (int32_t kvh = 0; kvh < c.kv_heads; ++kvh) {
        std::vector<float> out_alone(q.size(), -1.f), out_rows(q.size(), -2.f);
        std::vector<std::vector<float>> sc(c.n_rows), acc(c.n_rows), qb(c.n_rows);
        std::vector<AttendArgs> args(c.n_rows);
        for (int32_t r = 0; r < c.n_rows; ++r) {
          AttendArgs& a = args[r];
          a = cache.args(c.bs, c.heads, c.kv_heads, c.hd, kvh, q.data());
          a.hole_begin = c.hole_begin;
          a.hole_end = c.hole_end;
          if (c.tree && r > 0) {
            a.map_from = c.prefix;
            a.slot_map = paths.data() + path_at[r];
          }
          a.row = r;
          a.kv_len = kv_len[r];
          a.vec_order = c.tree && !(c.mixed && r % 3 == 1);
          sc[r].assign(static_cast<size_t>(group) * ((kv_len[r] + 31) & ~31), 0.f);
          acc[r].assign(32 * static_cast<size_t>(c.hd) * group, 0.f);
          qb[r].assign(static_cast<size_t>(group) * kAttnMaxHeadDim, 0.f);
          a.scores = sc[r].data();
          a.acc = acc[r].data();
          a.qbuf = qb[r].data();
          a.out = out_alone.data();
          (c.q8 ? kern->attend_group_q8 : kern->attend_group)(a);
          a.out = out_rows.data();
        }
        (c.q8 ? kern->attend_rows_q8 : kern->attend_rows)(args.data(), c.n_rows);
        for (int32_t r = 0; r < c.n_rows; ++r) {
          for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            const size_t base = (static_cast<size_t>(r) * c.heads + h) * c.hd;
            for (int32_t i = 0; i < c.hd; ++i) {
              ASSERT_EQ(fbits(out_alone[base + i]), fbits(out_rows[base + i]))
                  << kern->name << " heads " << c.heads << "/" << c.kv_heads << " hd " << c.hd << " prefix " << c.prefix
                  << " tree " << c.tree << " row " << r << " head " << h << " dim " << i;
            }
          }
        }
      }
    }
  }
}

// attend_phase (one item split over threads: scores by ranges of slots,
// values by ranges of lanes) gives attend_group's result to the bit, for any
// number of parts, the parts of a phase run in any order.
TEST_F(CpuKernels, AttentionPhasesEqualTheItemInOnePiece) {
  struct Case {
    int32_t heads, kv_heads, hd, bs, kv_len, window_begin;
    bool q8, vec;
  };
  const Case cases[] = {
      {9, 3, 64, 16, 4100, 0, false, true},     {9, 3, 64, 16, 2000, 0, false, false},
      {4, 1, 256, 16, 3000, 2400, false, true}, {8, 2, 64, 32, 1500, 0, true, true},
      {2, 1, 8, 16, 40, 0, false, true},
  };
  std::normal_distribution<float> d(0.f, 1.f);
  for (const Case& c : cases) {
    const TestCache cache(c.kv_heads, c.hd, c.bs, c.kv_len, c.q8, rng);
    const int32_t group = c.heads / c.kv_heads;
    std::vector<float> q(static_cast<size_t>(c.heads) * c.hd);
    for (auto& x : q) x = d(rng) * 4.f;
    const BackendKernels* kerns[3] = {&scalar, &avx2, &avx512};
    for (const BackendKernels* kern : kerns) {
      const auto phase = c.q8 ? kern->attend_phase_q8 : kern->attend_phase;
      for (int32_t kvh = 0; kvh < c.kv_heads; ++kvh) {
        std::vector<float> sc(static_cast<size_t>(group) * ((c.kv_len + 31) & ~31));
        std::vector<float> acc(32 * static_cast<size_t>(c.hd) * group),
            qb(static_cast<size_t>(group) * kAttnMaxHeadDim);
        bool live[kAttnMaxGroup];
        std::vector<float> whole(q.size(), -1.f);
        AttendArgs a = cache.args(c.bs, c.heads, c.kv_heads, c.hd, kvh, q.data());
        a.window_begin = c.window_begin;
        a.kv_len = c.kv_len;
        a.vec_order = c.vec;
        a.scores = sc.data();
        a.acc = acc.data();
        a.qbuf = qb.data();
        a.live = live;
        a.out = whole.data();
        (c.q8 ? kern->attend_group_q8 : kern->attend_group)(a);
        for (int32_t parts : {1, 2, 3, 4, 8}) {
          std::vector<float> split(q.size(), -2.f);
          a.out = split.data();
          std::fill(sc.begin(), sc.end(), 7.f);
          std::fill(acc.begin(), acc.end(), 7.f);
          for (AttendPhase ph : {AttendPhase::kQueries, AttendPhase::kScores, AttendPhase::kSoftmax,
                                 AttendPhase::kValues, AttendPhase::kOutput}) {
            const bool split_phase = ph == AttendPhase::kScores || ph == AttendPhase::kValues;
            const int32_t n = split_phase ? parts : 1;
            for (int32_t part = n - 1; part >= 0; --part) phase(a, ph, part, n);  // (last part first)
          }
          for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            for (int32_t i = 0; i < c.hd; ++i) {
              const size_t at = static_cast<size_t>(h) * c.hd + i;
              ASSERT_EQ(fbits(whole[at]), fbits(split[at]))
                  << kern->name << " heads " << c.heads << "/" << c.kv_heads << " kv_len " << c.kv_len << " parts "
                  << parts << " head " << h << " dim " << i;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ember::cpu::detail
