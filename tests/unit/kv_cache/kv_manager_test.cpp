// KvManager alone (no model): history and computed tokens, the scheduler's
// budget (allocate, preempt, prefix hit), copy-on-write, eviction under each
// cache policy, provisional tokens with commit and rollback, save and load.
#include "core/kv_cache/kv_manager.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "core/model/batch.h"
#include "core/tensor/types.h"
#include "core/util/status.h"
#include "cpu/cpu_backend.h"

namespace ember {
namespace {

constexpr int32_t kBlock = 4;
constexpr int32_t kLayers = 2, kKvHeads = 2, kHeadDim = 8;

KvGeometry geometry(int32_t blocks) {
  KvGeometry g;
  g.num_layers = kLayers;
  g.num_kv_heads = kKvHeads;
  g.head_dim = kHeadDim;
  g.block_size = kBlock;
  g.num_blocks = blocks;
  return g;
}

std::vector<int32_t> iota_tokens(size_t n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

class KvManagerTest : public ::testing::Test {
 protected:
  explicit KvManagerTest(int32_t blocks = 16) : backend_(make_cpu_backend(1)) {
    kv_ = std::make_unique<KvManager>(*backend_, geometry(blocks), /*prefix_caching=*/true,
                                      KvManager::Rope{std::vector<RopeSpec>(kLayers, RopeSpec{kHeadDim})});
  }
  std::unique_ptr<KvSequence> full() { return kv_->create(CachePolicy{}, 1024, 1024); }
  std::unique_ptr<KvSequence> bounded(CachePolicyKind kind, int32_t sinks, int32_t window) {
    CachePolicy p;
    p.kind = kind;
    p.sink_tokens = sinks;
    p.window_tokens = window;
    return kv_->create(p, 1024, 1024);
  }
  // Runs history tokens [n_computed, n_computed + n) as the engine does:
  // grow, rows into a batch, commit. Returns the batch.
  Batch compute(KvSequence& seq, size_t n) {
    EXPECT_TRUE(kv_->grow(seq, n));
    Batch b;
    kv_->add_rows(seq, b, static_cast<int32_t>(n), seq.n_computed() + n - 1);
    kv_->commit_computed(seq, n);
    return b;
  }
  // Physical slot of logical slot `s` of the sequence's table.
  int32_t phys(KvSequence& seq, int32_t s) {
    auto e = kv_->export_blocks(seq);
    return e->blocks().at(static_cast<size_t>(s / kBlock)) * kBlock + s % kBlock;
  }
  // Writes `value` into every K and V element of logical slot `s`.
  void write_slot(KvSequence& seq, int32_t s, float value) {
    const int32_t p = phys(seq, s);
    std::vector<float> k(kKvHeads * kHeadDim, value), v(kKvHeads * kHeadDim, -value);
    for (int32_t l = 0; l < kLayers; ++l) backend_->kv_store(l, k.data(), v.data(), &p, 1);
  }
  // First K element of logical slot `s` (layer 0, head 0) and last V
  // element (last layer, last head).
  std::pair<float, float> read_slot(KvSequence& seq, int32_t s) {
    auto e = kv_->export_blocks(seq);
    const int32_t block = e->blocks().at(static_cast<size_t>(s / kBlock));
    std::vector<uint16_t> raw(kv_->geometry().bytes_per_block() / 2);
    kv_->read_block(block, raw.data());
    const size_t per = static_cast<size_t>(kKvHeads) * kBlock * kHeadDim;
    const size_t off = static_cast<size_t>(s % kBlock) * kHeadDim;
    const float k = fp16_to_fp32(raw[off]);
    const size_t v_last = (static_cast<size_t>(kLayers) * 2 - 1) * per + (kKvHeads - 1) * kBlock * kHeadDim + off;
    return {k, fp16_to_fp32(raw[v_last])};
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvManager> kv_;
};

TEST_F(KvManagerTest, AppendComputeAndRows) {
  auto seq = full();
  const auto t = iota_tokens(10);
  kv_->append(*seq, t.data(), t.size(), false);
  EXPECT_EQ(seq->n_computed(), 0u);
  Batch b = compute(*seq, 10);
  EXPECT_EQ(seq->n_computed(), 10u);
  EXPECT_EQ(seq->n_blocks(), 3u);
  ASSERT_EQ(b.n_rows(), 10);
  for (int32_t i = 0; i < 10; ++i) {
    EXPECT_EQ(b.positions[i], i);
    EXPECT_EQ(b.slots[i], i);
    EXPECT_EQ(b.kv_len[i], i + 1);
  }
  EXPECT_EQ(b.logit_rows, std::vector<int32_t>{9});
  EXPECT_EQ(seq->max_position(), 9);
  // Parked between turns: nothing pinned, the two full blocks indexed.
  kv_->park(*seq);
  EXPECT_EQ(seq->n_blocks(), 0u);
  EXPECT_EQ(seq->n_computed(), 0u);
  EXPECT_EQ(kv_->stats().blocks_cached, 2u);
  EXPECT_EQ(kv_->stats().blocks_used, 0u);
}

TEST_F(KvManagerTest, BudgetAdmitsAPrefixHitAllocatesAndPreempts) {
  auto a = full();
  const auto t = iota_tokens(10);
  kv_->append(*a, t.data(), t.size(), false);
  compute(*a, 10);
  kv_->park(*a);

  auto b = full();
  auto tb = iota_tokens(9);  // same first 8 tokens (two blocks), then one more
  tb.push_back(7);
  tb.push_back(8);
  kv_->append(*b, tb.data(), tb.size(), false);
  SchedSequence s;
  kv_->describe(*b, s);
  auto budget = kv_->step_budget({{b.get(), SIZE_MAX}});
  budget.admit(s);
  EXPECT_EQ(s.n_computed, 8u);
  EXPECT_EQ(b->n_computed(), 8u);
  EXPECT_EQ(kv_->stats().prefix_hits, 2u);
  ASSERT_TRUE(budget.allocate(s, 11));
  EXPECT_EQ(b->n_blocks(), 3u);
  // Preemption frees everything and forgets what was computed.
  budget.free(s);
  EXPECT_EQ(b->n_blocks(), 0u);
  EXPECT_EQ(b->n_computed(), 0u);
  EXPECT_EQ(s.n_computed, 0u);
  EXPECT_TRUE(budget.errors().empty());
  // A reuse limit keeps rows whose logits are wanted out of the hit.
  auto limited = kv_->step_budget({{b.get(), 5}});
  SchedSequence s2;
  kv_->describe(*b, s2);
  limited.admit(s2);
  EXPECT_EQ(b->n_computed(), 4u);
  kv_->release(*b);
}

TEST_F(KvManagerTest, AllocationIsAllOrNothing) {
  auto a = full();
  const auto t = iota_tokens(70);
  kv_->append(*a, t.data(), t.size(), false);
  EXPECT_FALSE(kv_->grow(*a, 70));  // 18 blocks > 16
  EXPECT_EQ(a->n_blocks(), 0u);
  EXPECT_TRUE(kv_->grow(*a, 64));
  EXPECT_EQ(a->n_blocks(), 16u);
  kv_->release(*a);
  EXPECT_EQ(kv_->stats().blocks_free, 16u);
}

TEST_F(KvManagerTest, SharedPrefixIsCopiedBeforeItIsWritten) {
  auto a = full();
  const auto t = iota_tokens(8);
  kv_->append(*a, t.data(), t.size(), false);
  compute(*a, 8);
  write_slot(*a, 5, 3.0f);

  auto b = full();
  auto tb = t;
  tb.push_back(1);
  kv_->append(*b, tb.data(), tb.size(), false);
  SchedSequence s;
  kv_->describe(*b, s);
  auto budget = kv_->step_budget({{b.get(), SIZE_MAX}});
  budget.admit(s);
  ASSERT_EQ(b->n_computed(), 8u);  // both blocks shared with a
  EXPECT_EQ(phys(*a, 5), phys(*b, 5));
  // b rewrites from token 5 on: its second block becomes a private copy.
  kv_->uncompute(*b, 5);
  ASSERT_TRUE(kv_->grow(*b, 4));
  EXPECT_EQ(kv_->stats().cow_copies, 1u);
  EXPECT_NE(phys(*a, 5), phys(*b, 5));
  EXPECT_EQ(phys(*a, 0), phys(*b, 0));      // the first block stays shared
  EXPECT_EQ(read_slot(*b, 5).first, 3.0f);  // the copy holds a's K/V
  write_slot(*b, 5, 9.0f);
  EXPECT_EQ(read_slot(*a, 5).first, 3.0f);  // a is untouched
  kv_->release(*a);
  kv_->release(*b);
}

TEST_F(KvManagerTest, WindowPolicyEvictsAndKeepsPositionsInsideTheWindow) {
  auto seq = bounded(CachePolicyKind::kWindow, 0, 8);
  for (int32_t i = 0; i < 40; ++i) {
    kv_->append(*seq, &i, 1, true);
    compute(*seq, 1);
    ASSERT_LE(seq->resident(), 8u);
    ASSERT_LE(seq->n_blocks(), static_cast<size_t>((seq->layout().max_slots() + kBlock - 1) / kBlock));
  }
  EXPECT_EQ(seq->n_computed(), 40u);
  EXPECT_GT(seq->layout().n_evicted(), 0);
  EXPECT_LT(seq->max_position(), 8);
  EXPECT_TRUE(seq->shifted());
  // Evicted tokens cannot be recomputed: rolling back into them is refused.
  EXPECT_THROW(kv_->uncompute(*seq, 2), Error);
  kv_->release(*seq);
}

TEST_F(KvManagerTest, SinkPolicyKeepsItsSinks) {
  auto seq = bounded(CachePolicyKind::kSink, 2, 8);
  const auto t = iota_tokens(6);
  kv_->append(*seq, t.data(), t.size(), false);
  compute(*seq, 6);
  for (int32_t i = 0; i < 30; ++i) {
    kv_->append(*seq, &i, 1, true);
    Batch b = compute(*seq, 1);
    ASSERT_LT(b.positions[0], 10);
    ASSERT_LE(seq->resident(), 10u);
  }
  EXPECT_EQ(seq->layout().position_of(0), 0);
  EXPECT_EQ(seq->layout().position_of(1), 1);
  EXPECT_GT(seq->layout().n_evicted(), 0);
  EXPECT_LT(seq->max_position(), 10);
  // A sequence that evicted keeps its blocks when preempted (it cannot be
  // recomputed).
  SchedSequence s;
  kv_->describe(*seq, s);
  EXPECT_FALSE(s.preemptible);
  auto budget = kv_->step_budget({{seq.get(), SIZE_MAX}});
  const size_t blocks = seq->n_blocks();
  budget.free(s);
  EXPECT_EQ(seq->n_blocks(), blocks);
  kv_->release(*seq);
}

TEST_F(KvManagerTest, PolicyThatCannotFitThePoolIsRefused) {
  EXPECT_THROW(bounded(CachePolicyKind::kSink, 4, 100), Error);  // 26 blocks > 16
  EXPECT_THROW(bounded(CachePolicyKind::kWindow, 0, 2), Error);  // window < block
}

TEST_F(KvManagerTest, ProvisionalPrefixCommitAndRollback) {
  auto seq = full();
  const auto t = iota_tokens(5);
  kv_->append(*seq, t.data(), t.size(), false);
  compute(*seq, 5);
  ASSERT_TRUE(kv_->append_provisional(*seq, {1, 2, 3, 4}));
  EXPECT_EQ(seq->tokens().size(), 5u);  // not history yet
  EXPECT_EQ(seq->n_blocks(), 3u);       // 9 slots
  Batch b;
  kv_->add_provisional_rows(*seq, b);
  ASSERT_EQ(b.n_rows(), 4);
  EXPECT_EQ(b.positions, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(b.kv_len, (std::vector<int32_t>{6, 7, 8, 9}));
  EXPECT_EQ(b.logit_rows.size(), 4u);
  // Accept two: they join the history as computed generated tokens.
  kv_->commit_provisional(*seq, {0, 1}, true);
  EXPECT_EQ(seq->tokens(), (std::vector<int32_t>{100, 101, 102, 103, 104, 1, 2}));
  EXPECT_EQ(seq->generated().back(), 1);
  EXPECT_EQ(seq->n_computed(), 7u);
  EXPECT_EQ(seq->n_blocks(), 2u);  // the third block was rolled back
  EXPECT_TRUE(seq->provisional().empty());
  // Reject everything.
  ASSERT_TRUE(kv_->append_provisional(*seq, {5, 6, 7}));
  EXPECT_EQ(seq->n_blocks(), 3u);
  kv_->rollback_provisional(*seq);
  EXPECT_EQ(seq->n_blocks(), 2u);
  EXPECT_EQ(seq->tokens().size(), 7u);
  EXPECT_EQ(seq->n_computed(), 7u);
  // Commit needs the history computed first; a pending batch is refused.
  ASSERT_TRUE(kv_->append_provisional(*seq, {9}));
  EXPECT_THROW(kv_->append_provisional(*seq, {9}), Error);
  kv_->rollback_provisional(*seq);
  kv_->release(*seq);
  EXPECT_EQ(kv_->stats().blocks_used, 0u);
}

TEST_F(KvManagerTest, ProvisionalTreePathIsCompacted) {
  auto seq = full();
  const auto t = iota_tokens(3);
  kv_->append(*seq, t.data(), t.size(), false);
  compute(*seq, 3);
  // A tree flattened in creation order: nodes 0..4 at slots 3..7.
  ASSERT_TRUE(kv_->append_provisional(*seq, {10, 11, 12, 13, 14}));
  for (int32_t node = 0; node < 5; ++node) write_slot(*seq, 3 + node, static_cast<float>(node + 1));
  // Keep the path 0 -> 2 -> 4: nodes 2 and 4 move to slots 4 and 5.
  kv_->commit_provisional(*seq, {0, 2, 4}, true);
  EXPECT_EQ(seq->tokens(), (std::vector<int32_t>{100, 101, 102, 10, 12, 14}));
  EXPECT_EQ(seq->n_computed(), 6u);
  EXPECT_EQ(seq->n_blocks(), 2u);
  EXPECT_EQ(read_slot(*seq, 3), std::make_pair(1.0f, -1.0f));
  EXPECT_EQ(read_slot(*seq, 4), std::make_pair(3.0f, -3.0f));
  EXPECT_EQ(read_slot(*seq, 5), std::make_pair(5.0f, -5.0f));
  EXPECT_THROW(
      {
        ASSERT_TRUE(kv_->append_provisional(*seq, {1, 2}));
        kv_->commit_provisional(*seq, {1, 0}, true);  // not a path in creation order
      },
      Error);
  kv_->rollback_provisional(*seq);
  kv_->release(*seq);
}

TEST_F(KvManagerTest, TokenTreeRowsRoomAndTruncation) {
  auto seq = full();
  const auto t = iota_tokens(6);
  kv_->append(*seq, t.data(), t.size(), false);
  compute(*seq, 5);  // token 5 (105) is the pending root
  EXPECT_EQ(kv_->tree_room(*seq), SIZE_MAX);
  ASSERT_TRUE(kv_->reserve_tree(*seq, 4));
  // Root 105; nodes 1 (parent 0), 2 (parent 0), 3 (parent 1), 4 (parent 3).
  const std::vector<int32_t> tokens = {105, 20, 21, 22, 23}, parents = {-1, 0, 0, 1, 3};
  Batch b;
  kv_->add_tree_rows(*seq, b, tokens, parents, {0, 1, 2, 3, 4});
  ASSERT_EQ(b.n_rows(), 5);
  EXPECT_TRUE(b.seqs.back().decodes);
  EXPECT_EQ(b.tokens, tokens);
  EXPECT_EQ(b.positions, (std::vector<int32_t>{5, 6, 6, 7, 8}));  // root + depth
  EXPECT_EQ(b.slots, (std::vector<int32_t>{5, 6, 7, 8, 9}));      // root + node id
  EXPECT_EQ(b.logit_rows.size(), 5u);
  ASSERT_TRUE(b.has_tree());
  EXPECT_EQ(b.tree_from, (std::vector<int32_t>{-1, 6, 6, 6, 6}));
  EXPECT_EQ(b.kv_len, (std::vector<int32_t>{6, 7, 7, 8, 9}));  // chain lengths
  auto path = [&](int32_t row) {
    const auto first = b.tree_slots.begin() + b.tree_begin[static_cast<size_t>(row)];
    return std::vector<int32_t>(first,
                                first + (b.kv_len[static_cast<size_t>(row)] - b.tree_from[static_cast<size_t>(row)]));
  };
  EXPECT_EQ(path(2), (std::vector<int32_t>{7}));
  EXPECT_EQ(path(4), (std::vector<int32_t>{6, 8, 9}));
  // The root computed, the path 0 -> 1 -> 3 kept (provisional 0 and 2).
  kv_->commit_computed(*seq, 1);
  ASSERT_TRUE(kv_->append_provisional(*seq, {20, 21, 22, 23}));
  kv_->commit_provisional(*seq, {0, 2}, true);
  EXPECT_EQ(seq->tokens(), (std::vector<int32_t>{100, 101, 102, 103, 104, 105, 20, 22}));
  EXPECT_EQ(seq->n_computed(), 8u);
  // A stream that ends at token 20 drops 22 again.
  kv_->truncate_history(*seq, 7);
  EXPECT_EQ(seq->tokens().size(), 7u);
  EXPECT_EQ(seq->generated().size(), 7u);
  EXPECT_EQ(seq->n_computed(), 7u);
  // Malformed trees are refused.
  Batch bad;
  EXPECT_THROW(kv_->add_tree_rows(*seq, bad, {1, 2}, {-1, 1}, {1}), Error);
  kv_->release(*seq);

  // A sink/window sequence: a tree never crosses its next eviction.
  auto win = bounded(CachePolicyKind::kWindow, 0, 8);
  const auto u = iota_tokens(7);
  kv_->append(*win, u.data(), u.size(), false);
  compute(*win, 6);
  EXPECT_EQ(kv_->tree_room(*win), 1u);  // slot 7 is the window's last before it evicts
  EXPECT_THROW(kv_->reserve_tree(*win, 2), Error);
  EXPECT_TRUE(kv_->reserve_tree(*win, 1));
  kv_->rollback_provisional(*win);
  kv_->release(*win);
}

TEST_F(KvManagerTest, ReplaceHistoryKeepsTheCommonPrefixComputed) {
  auto seq = full();
  const auto t = iota_tokens(10);
  kv_->append(*seq, t.data(), t.size(), false);
  compute(*seq, 10);
  auto changed = iota_tokens(6);
  changed.push_back(1);
  changed.push_back(2);
  kv_->replace_history(*seq, changed);
  EXPECT_EQ(seq->n_computed(), 6u);
  EXPECT_EQ(seq->tokens(), changed);
  EXPECT_EQ(seq->n_blocks(), 2u);
  kv_->reset(*seq);
  EXPECT_TRUE(seq->tokens().empty());
  EXPECT_EQ(seq->n_blocks(), 0u);
}

TEST_F(KvManagerTest, SaveAndRestoreABoundedSequence) {
  auto seq = bounded(CachePolicyKind::kSink, 2, 8);
  for (int32_t i = 0; i < 20; ++i) {
    kv_->append(*seq, &i, 1, i % 2 == 0);
    compute(*seq, 1);
  }
  write_slot(*seq, 0, 7.0f);
  auto e = kv_->export_blocks(*seq);
  const size_t bpb = kv_->geometry().bytes_per_block();
  std::vector<uint8_t> bytes(e->blocks().size() * bpb);
  for (size_t i = 0; i < e->blocks().size(); ++i) kv_->read_block(e->blocks()[i], bytes.data() + i * bpb);

  auto copy = bounded(CachePolicyKind::kSink, 2, 8);
  KvManager::Saved saved;
  saved.tokens = seq->tokens();
  saved.generated = seq->generated();
  saved.n_computed = e->n_computed();
  saved.n_evicted = seq->layout().n_evicted();
  saved.dropped_blocks = seq->layout().dropped_blocks();
  saved.max_position = seq->max_position();
  saved.blocks = bytes.data();
  saved.n_blocks = e->blocks().size();
  kv_->restore(*copy, saved, [&](const std::string& w) { throw Error(StatusCode::kBadFormat, w); });
  EXPECT_EQ(copy->tokens(), seq->tokens());
  EXPECT_EQ(copy->generated(), seq->generated());
  EXPECT_EQ(copy->n_computed(), seq->n_computed());
  EXPECT_EQ(copy->resident(), seq->resident());
  EXPECT_EQ(copy->max_position(), seq->max_position());
  EXPECT_EQ(read_slot(*copy, 0).first, 7.0f);
  // Both continue identically.
  int32_t next = 99;
  kv_->append(*seq, &next, 1, true);
  kv_->append(*copy, &next, 1, true);
  Batch a = compute(*seq, 1), b = compute(*copy, 1);
  EXPECT_EQ(a.positions, b.positions);
  EXPECT_EQ(a.slots, b.slots);
  EXPECT_EQ(a.seqs[0].hole_begin, b.seqs[0].hole_begin);
  EXPECT_EQ(a.seqs[0].hole_end, b.seqs[0].hole_end);

  // An inconsistent state is reported through `corrupt`.
  auto bad = bounded(CachePolicyKind::kSink, 2, 8);
  saved.n_computed = saved.tokens.size() + 1;
  EXPECT_THROW(kv_->restore(*bad, saved, [&](const std::string& w) { throw Error(StatusCode::kBadFormat, w); }), Error);
  e.reset();
  kv_->release(*seq);
  kv_->release(*copy);
  kv_->release(*bad);
}

}  // namespace
}  // namespace ember
