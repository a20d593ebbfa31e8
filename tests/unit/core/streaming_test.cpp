// Window/sink cache policies without a model: the layout bookkeeping
// (StreamingLayout), block eviction in the pool, the CPU backend's K-shift
// and attention holes, and the scheduler's view of bounded sequences.
#include "core/kv_cache/streaming.h"
#include "cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "core/backend/backend.h"
#include "core/kv_cache/kv_cache.h"
#include "core/scheduler/scheduler.h"
#include "core/util/status.h"

namespace ember {
namespace {

// Replays a token stream through the layout, `chunk` tokens at a time, and
// checks every invariant after each step: resident tokens never exceed S+W,
// positions stay below S+W (sinks 0..S-1, the window contiguous from S),
// slots are distinct and inside max_slots, and the hole is exactly the
// evicted tokens that shared the sinks' last block.
void replay(int32_t S, int32_t W, int32_t B, int64_t total, int32_t chunk) {
  SCOPED_TRACE("S=" + std::to_string(S) + " W=" + std::to_string(W) + " B=" + std::to_string(B) +
               " chunk=" + std::to_string(chunk));
  StreamingLayout l(S, W, B);
  int64_t n = 0;
  int64_t evictions = 0;
  while (n < total) {
    const int32_t k = static_cast<int32_t>(std::min<int64_t>({chunk, total - n, l.chunk_limit(n)}));
    ASSERT_GE(k, 1);
    const auto e = l.plan(n, k);
    EXPECT_EQ(e.shift, e.hole_tokens + e.dropped_blocks * B);
    EXPECT_LT(e.hole_tokens, B);
    if (e.hole_tokens > 0) {
      EXPECT_FALSE(l.shifted()) << "the hole is evicted once, first";
    }
    const int64_t before = l.n_evicted();
    l.apply(e);
    if (e.any()) ++evictions;
    ASSERT_TRUE(l.consistent());
    EXPECT_EQ(l.n_evicted(), before + e.shift);
    n += k;
    // Window count after appending: at most W, and (when evicting) > W - B.
    const int64_t window = std::max<int64_t>(0, n - S - l.n_evicted());
    EXPECT_LE(window, W);
    if (e.any()) {
      EXPECT_GT(window + e.shift, W);
    }
    EXPECT_LE(l.resident(n), S + W);
    EXPECT_LE(l.kv_len(n), l.max_slots());
    // Every resident token: position and slot.
    std::set<int32_t> slots, positions;
    for (int64_t t = 0; t < n; ++t) {
      if (t >= S && t < S + l.n_evicted()) continue;
      const int32_t pos = l.position_of(t), slot = l.slot_of(t);
      EXPECT_LT(pos, S + W);
      EXPECT_GE(slot, 0);
      EXPECT_LT(slot, l.kv_len(n));
      EXPECT_TRUE(slot < l.hole_begin() || slot >= l.hole_end()) << "token " << t << " in the hole";
      if (t < S) {
        EXPECT_EQ(pos, t);
        EXPECT_EQ(slot, t);
      } else {
        EXPECT_EQ(pos, S + (slot - l.win_begin()));
      }
      EXPECT_TRUE(slots.insert(slot).second);
      EXPECT_TRUE(positions.insert(pos).second);
    }
    EXPECT_EQ(static_cast<int32_t>(slots.size()), l.resident(n));
    // Positions are exactly 0..resident-1: sinks then a contiguous window.
    if (!positions.empty()) {
      EXPECT_EQ(*positions.begin(), 0);
      EXPECT_EQ(*positions.rbegin(), static_cast<int32_t>(positions.size()) - 1);
    }
  }
  if (total > S + W) {
    EXPECT_GT(evictions, 0);
  }
}

TEST(StreamingLayout, TokenByTokenKeepsSinksAndWindow) {
  replay(4, 60, 16, 400, 1);
  replay(4, 1020, 16, 3000, 1);
  replay(0, 64, 16, 300, 1);   // window policy
  replay(16, 48, 16, 300, 1);  // sinks fill whole blocks: no hole
  replay(20, 40, 16, 300, 1);  // sinks spill into a second block
  replay(1, 16, 16, 200, 1);   // the smallest window
}

// Chunks up to chunk_limit() evict at exactly the token indices where
// token-at-a-time appends do, so every token gets the same position and slot.
void same_as_token_by_token(int32_t S, int32_t W, int32_t B, int64_t total, int32_t chunk) {
  SCOPED_TRACE("chunk=" + std::to_string(chunk));
  auto trace = [&](int32_t c) {
    StreamingLayout l(S, W, B);
    std::vector<std::pair<int32_t, int32_t>> out;  // (position, slot) of each token when it was appended
    int64_t n = 0;
    while (n < total) {
      const int32_t k = static_cast<int32_t>(std::min<int64_t>({c, total - n, l.chunk_limit(n)}));
      l.apply(l.plan(n, k));
      for (int64_t t = n; t < n + k; ++t) out.emplace_back(l.position_of(t), l.slot_of(t));
      n += k;
    }
    return out;
  };
  EXPECT_EQ(trace(chunk), trace(1));
}

TEST(StreamingLayout, ChunkingNeverChangesWhatATokenSees) {
  for (int32_t c : {2, 7, 16, 45, 64, 1000}) {
    same_as_token_by_token(4, 60, 16, 700, c);
    same_as_token_by_token(0, 64, 16, 700, c);
    same_as_token_by_token(20, 40, 16, 700, c);
  }
}

TEST(StreamingLayout, ChunkedAppendsUpToTheLimit) {
  replay(4, 60, 16, 500, 45);
  replay(4, 60, 16, 500, 7);
  replay(0, 64, 16, 500, 49);
  replay(8, 100, 4, 700, 97);
}

TEST(StreamingLayout, FirstEvictionDropsTheHoleThenWholeBlocks) {
  StreamingLayout l(4, 60, 16);
  auto e = l.plan(64, 1);        // 4 sinks + 60 window: the 65th token evicts
  EXPECT_EQ(e.hole_tokens, 12);  // tokens 4..15 (the rest of block 0)
  EXPECT_EQ(e.dropped_blocks, 0);
  EXPECT_EQ(e.first_block, 1);
  l.apply(e);
  EXPECT_EQ(l.win_begin(), 16);
  EXPECT_EQ(l.hole_begin(), 4);
  EXPECT_EQ(l.hole_end(), 16);
  EXPECT_EQ(l.position_of(16), 4);  // the first kept window token moves to S
  EXPECT_EQ(l.slot_of(16), 16);
  EXPECT_EQ(l.position_of(64), 52);
  // Next evictions drop the window's first block (table index 1).
  int64_t n = 65;
  while (!l.plan(n, 1).any()) ++n;
  e = l.plan(n, 1);
  EXPECT_EQ(e.hole_tokens, 0);
  EXPECT_EQ(e.dropped_blocks, 1);
  EXPECT_EQ(e.first_block, 1);
  EXPECT_EQ(e.shift, 16);
  l.apply(e);
  EXPECT_EQ(l.dropped_blocks(), 1);
  EXPECT_EQ(l.win_begin(), 16);
  EXPECT_EQ(l.slot_of(32), 16);  // the old slot 32 is now slot 16
  EXPECT_EQ(l.position_of(32), 4);
}

TEST(StreamingLayout, RollbackOnlyInsideTheWindow) {
  StreamingLayout l(4, 60, 16);
  EXPECT_TRUE(l.can_truncate(0));
  l.apply(l.plan(64, 1));  // evicts tokens 4..15
  EXPECT_FALSE(l.can_truncate(10));
  EXPECT_FALSE(l.can_truncate(15));
  EXPECT_TRUE(l.can_truncate(16));
  EXPECT_TRUE(l.can_truncate(64));
}

TEST(StreamingLayout, RejectsBadShapesAndChunks) {
  EXPECT_THROW(StreamingLayout(4, 8, 16), Error);  // window smaller than a block
  EXPECT_THROW(StreamingLayout(-1, 64, 16), Error);
  StreamingLayout l(4, 60, 16);
  EXPECT_EQ(l.chunk_limit(0), 64);  // nothing to evict before the cache is full
  EXPECT_EQ(l.chunk_limit(60), 4);
  EXPECT_EQ(l.chunk_limit(64), 12);  // the first eviction frees the hole (12 tokens)
  EXPECT_EQ(l.max_slots(), 16 + 60);
}

TEST(CachePolicy, Validate) {
  CachePolicy p;
  EXPECT_NO_THROW(p.validate(16, 8192));  // full
  p.kind = CachePolicyKind::kSink;
  p.sink_tokens = 4;
  p.window_tokens = 1020;
  EXPECT_NO_THROW(p.validate(16, 8192));
  p.window_tokens = 8;
  EXPECT_THROW(p.validate(16, 8192), Error);
  p.window_tokens = 8190;
  EXPECT_THROW(p.validate(16, 8192), Error);  // S + W beyond the trained context
  p.kind = CachePolicyKind::kWindow;
  p.window_tokens = 64;
  EXPECT_THROW(p.validate(16, 8192), Error);  // a window keeps no sinks
  p.sink_tokens = 0;
  EXPECT_NO_THROW(p.validate(16, 8192));
}

// ---------------------------------------------------------------- pool + backend

KvGeometry geometry(int32_t blocks, int32_t block_size = 4) {
  KvGeometry g;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 16;
  g.block_size = block_size;
  g.num_blocks = blocks;
  return g;
}

TEST(StreamingPool, DropBlocksReleasesAndRenumbers) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, geometry(8));
  std::vector<int32_t> table;
  ASSERT_TRUE(cache.reserve(table, 5 * 4));
  const std::vector<int32_t> before = table;
  cache.drop_blocks(table, 1, 2);
  ASSERT_EQ(table.size(), 3u);
  EXPECT_EQ(table[0], before[0]);
  EXPECT_EQ(table[1], before[3]);
  EXPECT_EQ(table[2], before[4]);
  EXPECT_EQ(cache.stats().blocks_used, 3u);
  EXPECT_THROW(cache.drop_blocks(table, 2, 2), Error);
  cache.release(table);
  EXPECT_EQ(cache.stats().blocks_used, 0u);
}

TEST(StreamingPool, KShiftRefusesSharedOrIndexedBlocks) {
  auto backend = make_cpu_backend(1);
  KvCache cache(*backend, geometry(8));
  std::vector<int32_t> a;
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(cache.reserve(a, 8));
  cache.commit(a, toks.data(), 8);  // both blocks indexed
  RopeSpec spec;
  spec.rot_dim = 16;
  const std::vector<RopeSpec> layers(static_cast<size_t>(geometry(8).num_layers), spec);
  EXPECT_THROW(cache.shift_keys(a, -4, layers), Error);
  ASSERT_TRUE(cache.prepare_write(a, 0));  // private again, out of the index
  EXPECT_NO_THROW(cache.shift_keys(a, -4, layers));
  std::vector<int32_t> b = cache.match_prefix(toks.data(), 8, 2);
  EXPECT_TRUE(b.empty());  // the shifted blocks are no longer found
  cache.release(a);
}

// Keys rotated to position p, stored (f16), shifted by -d with the backend's
// K-shift, equal keys rotated to p - d directly, up to f16 rounding; repeated
// shifts (what a long stream does) add only rounding, no drift.
TEST(StreamingBackend, KShiftMatchesRopeAtTheNewPosition) {
  const KvGeometry g = geometry(4, 16);
  auto backend = make_cpu_backend(1);
  backend->kv_init(g);
  const int32_t kv_dim = g.num_kv_heads * g.head_dim, rows = g.block_size;
  const float base = 10000.0f;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> raw(static_cast<size_t>(rows) * kv_dim), k(raw.size()), v(raw.size(), 0.0f);
  for (auto& x : raw) x = nd(rng);
  const int32_t start = 1000, step = 16, shifts = 60;
  auto store_at = [&](int32_t block, int32_t first_pos, std::vector<float>& out) {
    out = raw;
    std::vector<int32_t> pos(rows), slots(rows);
    for (int32_t r = 0; r < rows; ++r) {
      pos[r] = first_pos + r;
      slots[r] = block * g.block_size + r;
    }
    backend->rope(out.data(), pos.data(), rows, g.num_kv_heads, g.head_dim, g.head_dim, base);
    for (int32_t l = 0; l < g.num_layers; ++l) backend->kv_store(l, out.data(), v.data(), slots.data(), rows);
  };
  std::vector<float> tmp;
  store_at(0, start, tmp);
  const int32_t block0 = 0;
  for (int i = 0; i < shifts; ++i) backend->kv_rope_shift(&block0, 1, -step, g.head_dim, base);
  std::vector<float> expect;
  store_at(1, start - step * shifts, expect);  // the direct rotation, stored in block 1
  const size_t bpb = g.bytes_per_block();
  std::vector<uint16_t> got0(bpb / 2), got1(bpb / 2);
  backend->kv_read_block(0, got0.data());
  backend->kv_read_block(1, got1.data());
  auto f16 = [](uint16_t h) {  // IEEE half -> float (normal numbers and zero are enough here)
    const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -24) : std::ldexp(1.0f + m / 1024.0f, e - 15);
    return (h & 0x8000) ? -mag : mag;
  };
  double max_err = 0.0, max_abs = 0.0;
  // Layer 0's K: the first num_kv_heads * block_size * head_dim halves.
  for (size_t i = 0; i < static_cast<size_t>(g.num_kv_heads) * g.block_size * g.head_dim; ++i) {
    max_err = std::max(max_err, static_cast<double>(std::fabs(f16(got0[i]) - f16(got1[i]))));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(f16(got1[i]))));
  }
  // f16 has an 11-bit mantissa: one rounding is ~5e-4 relative; 60 shifts
  // stay within a few roundings of the largest value.
  EXPECT_LT(max_err / max_abs, 1e-2) << "max abs error " << max_err;
  RecordProperty("kshift_60_rel_error", std::to_string(max_err / max_abs));
  std::printf("K-shift: 60 shifts of -16 vs direct rotation: max relative error %.2e\n", max_err / max_abs);
}

TEST(StreamingBackend, ReadWriteBlockRoundTrip) {
  const KvGeometry g = geometry(4, 8);
  auto backend = make_cpu_backend(1);
  backend->kv_init(g);
  std::vector<uint8_t> in(g.bytes_per_block()), out(g.bytes_per_block());
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 31 + 7);
  backend->kv_write_block(2, in.data());
  backend->kv_read_block(2, out.data());
  EXPECT_EQ(in, out);
  EXPECT_THROW(backend->kv_read_block(4, out.data()), Error);
}

// Attention that skips a hole equals attention over the same keys stored
// without the hole.
TEST(StreamingBackend, AttentionSkipsTheHole) {
  KvGeometry g = geometry(8, 4);
  auto backend = make_cpu_backend(1);
  backend->kv_init(g);
  const int32_t kv_dim = g.num_kv_heads * g.head_dim;
  const int32_t heads = 4;  // two query heads per kv head
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Sequence A: slots 0..1 sinks, 2..3 hole (garbage), 4..10 window, in blocks 0,1,2.
  // Sequence B: the same 9 tokens contiguous in blocks 4,5,6.
  const int32_t n_keep = 9;
  std::vector<float> k(static_cast<size_t>(n_keep) * kv_dim), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  std::vector<int32_t> slots_a, slots_b;
  for (int32_t i = 0; i < n_keep; ++i) {
    const int32_t logical_a = i < 2 ? i : i + 2;
    slots_a.push_back(logical_a);  // blocks 0,1,2 are physical 0,1,2
    slots_b.push_back(4 * 4 + i);  // blocks 4,5,6
  }
  std::vector<float> junk(2 * static_cast<size_t>(kv_dim), 50.0f);  // huge keys in the hole
  const std::vector<int32_t> hole_slots = {2, 3};
  backend->kv_store(0, junk.data(), junk.data(), hole_slots.data(), 2);
  backend->kv_store(0, k.data(), v.data(), slots_a.data(), n_keep);
  backend->kv_store(0, k.data(), v.data(), slots_b.data(), n_keep);
  std::vector<float> q(static_cast<size_t>(2) * heads * g.head_dim);
  for (auto& x : q) x = nd(rng);
  const std::vector<int32_t> table_a = {0, 1, 2}, table_b = {4, 5, 6};
  AttentionSeq sa{0, 1, table_a.data(), 3, 2, 4};
  AttentionSeq sb{1, 1, table_b.data(), 3};
  const std::vector<AttentionSeq> seqs = {sa, sb};
  const std::vector<int32_t> kv_len = {n_keep + 2, n_keep};
  AttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = g.num_kv_heads;
  p.head_dim = g.head_dim;
  p.scale = 0.25f;
  p.kv_len = kv_len.data();
  // Both rows use the same query.
  std::copy(q.begin(), q.begin() + heads * g.head_dim, q.begin() + heads * g.head_dim);
  std::vector<float> out(q.size());
  backend->attention(0, q.data(), seqs.data(), 2, p, out.data());
  for (int32_t i = 0; i < heads * g.head_dim; ++i) {
    EXPECT_NEAR(out[i], out[heads * g.head_dim + i], 1e-5f) << i;
  }
}

// ---------------------------------------------------------------- scheduler

class FakeBudget final : public KvBudget {
 public:
  explicit FakeBudget(size_t slots) : slots_(slots) {}
  bool allocate(SchedSequence& seq, size_t n_slots) override {
    const size_t want = seq.max_slots ? std::min(n_slots, seq.max_slots) : n_slots;
    const size_t have = held_[seq.id];
    if (want <= have) return true;
    if (used_ + want - have > slots_) return false;
    used_ += want - have;
    held_[seq.id] = want;
    return true;
  }
  void free(SchedSequence& seq) override {
    used_ -= held_[seq.id];
    held_[seq.id] = 0;
    freed_.insert(seq.id);
  }
  size_t capacity_slots() const override { return slots_; }
  std::set<uint64_t> freed_;

 private:
  size_t slots_, used_ = 0;
  std::map<uint64_t, size_t> held_;
};

TEST(StreamingScheduler, BoundedSequencesChunkAndAreNotPreemptedOnceShifted) {
  Scheduler sched(SchedulerConfig{512, 8});
  FakeBudget kv(100);
  SchedSequence a;  // a shifted sink session, running, wants a long prompt
  a.id = 0;
  a.arrival = 0;
  a.priority = 1;  // background: the natural victim
  a.n_tokens = 10000;
  a.n_computed = 9000;
  a.running = true;
  a.max_chunk = 45;
  a.max_slots = 76;
  a.preemptible = false;
  std::vector<SchedSequence*> seqs = {&a};
  StepPlan plan = sched.schedule(seqs, kv);
  ASSERT_EQ(plan.run.size(), 1u);
  EXPECT_EQ(plan.run[0].second, 45);  // capped chunk
  EXPECT_TRUE(plan.failed.empty());   // 10000 tokens, but it holds at most 76 slots
  // An interactive sequence that cannot fit does not preempt it.
  SchedSequence b;
  b.id = 1;
  b.arrival = 1;
  b.priority = 0;
  b.n_tokens = 60;
  std::vector<SchedSequence*> both = {&a, &b};
  plan = sched.schedule(both, kv);
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(kv.freed_.count(0), 0u);
}

}  // namespace
}  // namespace ember
