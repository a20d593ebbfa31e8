// Layer groups of the paged pool (core/kv_cache/layer_groups.h): how a
// model's layers are grouped, and a KvManager whose sliding-window groups free
// the blocks their window has left — through growth, prefix hits, rollback,
// eviction and session save/restore.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "core/kv_cache/kv_manager.h"
#include "core/model/batch.h"
#include "core/tensor/types.h"
#include "core/util/status.h"
#include "cpu/cpu_backend.h"

namespace ember {
namespace {

TEST(KvLayerGroups, PlainModelsHaveOneGroupOfEveryLayer) {
  const KvLayerGroups g = KvLayerGroups::from_windows(std::vector<int32_t>(30, 0));
  EXPECT_EQ(g.n_groups(), 1);
  EXPECT_EQ(g.layers_per_group, 30);
  EXPECT_FALSE(g.has_local());
  for (int32_t il = 0; il < 30; ++il) {
    EXPECT_EQ(g.group_of_layer[il], 0);
    EXPECT_EQ(g.index_in_group[il], il);
  }
}

// Gemma 3: five sliding-window layers, then a global one.
std::vector<int32_t> gemma_windows(int32_t n_layers, int32_t window) {
  std::vector<int32_t> w(static_cast<size_t>(n_layers));
  for (int32_t il = 0; il < n_layers; ++il) w[il] = il % 6 < 5 ? window : 0;
  return w;
}

TEST(KvLayerGroups, GemmaLayersGroupByTheGcdOfTheirClasses) {
  const KvLayerGroups g = KvLayerGroups::from_windows(gemma_windows(18, 512));  // 270M: 3 global, 15 local
  ASSERT_EQ(g.n_groups(), 6);
  EXPECT_EQ(g.layers_per_group, 3);
  EXPECT_EQ(g.window[0], 0);
  EXPECT_EQ(g.layers[0], (std::vector<int32_t>{5, 11, 17}));
  EXPECT_EQ(g.layers[1], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(g.layers[2], (std::vector<int32_t>{3, 4, 6}));
  for (int32_t i = 1; i < 6; ++i) EXPECT_EQ(g.window[i], 512);
  EXPECT_TRUE(g.has_local());
  // Every layer exactly once, at the place its group says.
  std::vector<int32_t> seen(18, 0);
  for (int32_t grp = 0; grp < g.n_groups(); ++grp) {
    for (int32_t j = 0; j < g.layers_per_group; ++j) {
      const int32_t il = g.layers[grp][j];
      ++seen[il];
      EXPECT_EQ(g.group_of_layer[il], grp);
      EXPECT_EQ(g.index_in_group[il], j);
    }
  }
  for (int32_t v : seen) EXPECT_EQ(v, 1);
  const KvLayerGroups g1b = KvLayerGroups::from_windows(gemma_windows(26, 512));  // 1B: 4 global, 22 local
  EXPECT_EQ(g1b.layers_per_group, 2);
  EXPECT_EQ(g1b.n_groups(), 13);
}

TEST(KvLayerGroups, FirstNeededBlockFollowsTheWindow) {
  const KvLayerGroups g = KvLayerGroups::from_windows(gemma_windows(6, 512));
  ASSERT_EQ(g.n_groups(), 6);                          // gcd(1, 5) = 1 layer per group
  EXPECT_EQ(g.first_needed_block(0, 100000, 16), 0u);  // global
  const int32_t local = 1;
  EXPECT_EQ(g.first_needed_block(local, 0, 16), 0u);
  EXPECT_EQ(g.first_needed_block(local, 542, 16), 0u);
  // Rows from token n see slots from n + 1 - 512, kept from its 32-slot step.
  for (int64_t n : {544, 600, 1000, 4097}) {
    const int64_t first_slot = (n + 1 - 512) & ~int64_t{31};
    EXPECT_EQ(g.first_needed_block(local, n, 16), static_cast<size_t>(first_slot / 16)) << n;
    EXPECT_LE(static_cast<int64_t>(g.first_needed_block(local, n, 16)) * 16, n + 1 - 512) << n;
  }
}

// Every stage of a pipeline gets the same groups with the same windows (rank
// 0's tables index every rank's pool); each of its layers is in exactly one,
// at the place the group says, with the window it has in the whole model.
void expect_stages_agree(const std::vector<int32_t>& windows, const std::vector<int32_t>& stages) {
  std::vector<KvLayerGroups> g;
  for (size_t s = 0; s < stages.size(); ++s) {
    g.push_back(KvLayerGroups::pipeline_stage(windows, stages, static_cast<int32_t>(s)));
  }
  int32_t first = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    EXPECT_EQ(g[s].window, g[0].window);
    ASSERT_EQ(g[s].n_layers(), stages[s]);
    ASSERT_EQ(g[s].layers.size(), g[s].window.size());
    std::vector<int32_t> seen(static_cast<size_t>(stages[s]), 0);
    for (int32_t grp = 0; grp < g[s].n_groups(); ++grp) {
      const auto& ls = g[s].layers[static_cast<size_t>(grp)];
      ASSERT_LE(static_cast<int32_t>(ls.size()), g[s].layers_per_group);
      for (size_t j = 0; j < ls.size(); ++j) {
        ++seen[static_cast<size_t>(ls[j])];
        EXPECT_EQ(g[s].group_of_layer[ls[j]], grp);
        EXPECT_EQ(g[s].index_in_group[ls[j]], static_cast<int32_t>(j));
        EXPECT_EQ(g[s].window[static_cast<size_t>(grp)], windows[static_cast<size_t>(first + ls[j])]);
      }
    }
    for (int32_t v : seen) EXPECT_EQ(v, 1);
    first += stages[s];
  }
}

TEST(KvLayerGroups, PipelineStagesShareTheirGroups) {
  // Gemma 3 270M in 2 stages: 1 global + 8 local layers, then 2 + 7. Two
  // layers a group on both: 1 global group, 4 local; one unused layer each.
  const auto w18 = gemma_windows(18, 512);
  expect_stages_agree(w18, {9, 9});
  const KvLayerGroups a = KvLayerGroups::pipeline_stage(w18, {9, 9}, 0),
                      b = KvLayerGroups::pipeline_stage(w18, {9, 9}, 1);
  EXPECT_EQ(a.window, (std::vector<int32_t>{0, 512, 512, 512, 512}));
  EXPECT_EQ(a.layers_per_group, 2);
  EXPECT_EQ(a.layers[0], (std::vector<int32_t>{5}));     // model layer 5
  EXPECT_EQ(b.layers[0], (std::vector<int32_t>{2, 8}));  // model layers 11 and 17
  EXPECT_EQ(b.layers[4], (std::vector<int32_t>{7}));     // model layer 16
  EXPECT_EQ(a.pool_layers(), 10);
  EXPECT_EQ(b.pool_layers(), 10);
  // A stage without a class's layer keeps its (empty) groups: 6 layers in 2
  // stages, the one global layer on the second.
  const auto w6 = gemma_windows(6, 64);
  expect_stages_agree(w6, {3, 3});
  const KvLayerGroups e = KvLayerGroups::pipeline_stage(w6, {3, 3}, 0);
  EXPECT_EQ(e.window, (std::vector<int32_t>{0, 64, 64, 64}));
  EXPECT_TRUE(e.layers[0].empty());
  for (const auto& stages :
       std::vector<std::vector<int32_t>>{{5, 5, 4, 4}, {7, 6, 5}, {2, 2, 2, 2, 2, 2, 2, 2, 1, 1}}) {
    expect_stages_agree(w18, stages);
  }
  expect_stages_agree(gemma_windows(26, 512), {7, 7, 6, 6});
  // One stage: the same groups as from_windows.
  const KvLayerGroups one = KvLayerGroups::pipeline_stage(w18, {18}, 0), whole = KvLayerGroups::from_windows(w18);
  EXPECT_EQ(one.window, whole.window);
  EXPECT_EQ(one.layers_per_group, whole.layers_per_group);
  EXPECT_EQ(one.group_of_layer, whole.group_of_layer);
  EXPECT_EQ(one.index_in_group, whole.index_in_group);
  // Plain models: one group of each stage's own layers, nothing unused.
  for (int32_t s = 0; s < 4; ++s) {
    const KvLayerGroups p = KvLayerGroups::pipeline_stage(std::vector<int32_t>(30, 0), {8, 8, 7, 7}, s);
    EXPECT_EQ(p.n_groups(), 1);
    EXPECT_EQ(p.layers_per_group, s < 2 ? 8 : 7);
  }
  EXPECT_THROW(KvLayerGroups::pipeline_stage(w18, {9, 8}, 0), Error);
  EXPECT_THROW(KvLayerGroups::pipeline_stage(w18, {9, 9}, 2), Error);
}

// A pool of 6-layer blocks split as {2, 5} global and {0, 1}, {3, 4} with a
// 32-token window; block size 4.
constexpr int32_t kBlock = 4, kWindow = 32, kKvHeads = 1, kHeadDim = 8;

class GroupedKvTest : public ::testing::Test {
 protected:
  explicit GroupedKvTest(bool prefix_caching = true, int32_t all_layer_blocks = 200) : backend_(make_cpu_backend(1)) {
    make(prefix_caching, all_layer_blocks);
  }
  void make(bool prefix_caching, int32_t all_layer_blocks) {
    const std::vector<int32_t> windows = {kWindow, kWindow, 0, kWindow, kWindow, 0};
    make(prefix_caching, all_layer_blocks, KvLayerGroups::from_windows(windows));
  }
  void make(bool prefix_caching, int32_t all_layer_blocks, KvLayerGroups groups) {
    KvGeometry g;
    g.num_layers = groups.n_layers();
    g.num_kv_heads = kKvHeads;
    g.head_dim = kHeadDim;
    g.block_size = kBlock;
    g.num_blocks = all_layer_blocks;
    kv_.reset();
    kv_ = std::make_unique<KvManager>(*backend_, g, std::move(groups), prefix_caching,
                                      KvManager::Rope{std::vector<RopeSpec>(g.num_layers, RopeSpec{kHeadDim})});
  }
  std::unique_ptr<KvSequence> full() { return kv_->create(CachePolicy{}, 4096, 4096); }
  static std::vector<int32_t> tokens(size_t n, int32_t first = 1000) {
    std::vector<int32_t> t(n);
    std::iota(t.begin(), t.end(), first);
    return t;
  }
  Batch compute(KvSequence& seq, size_t n) {
    EXPECT_TRUE(kv_->grow(seq, n));
    Batch b;
    kv_->add_rows(seq, b, static_cast<int32_t>(n), seq.n_computed() + n - 1);
    stamp(b);
    kv_->commit_computed(seq, n);
    return b;
  }
  // Writes every row's K as its token id (all layers, through the group
  // tables, as the forward pass does).
  void stamp(const Batch& b) {
    const auto& groups = kv_->groups();
    const auto& s = b.seqs.at(0);
    const size_t n_tab = s.block_table.size() / static_cast<size_t>(s.n_groups);
    for (int32_t r = 0; r < b.n_rows(); ++r) {
      std::vector<float> k(kKvHeads * kHeadDim, static_cast<float>(b.tokens[r])), v(k.size(), 0.5f);
      for (int32_t il = 0; il < groups.n_layers(); ++il) {
        const int32_t grp = groups.group_of_layer[il];
        const int32_t block = s.block_table[static_cast<size_t>(grp) * n_tab + b.slots[r] / kBlock];
        ASSERT_GE(block, 0);
        const int32_t phys = block * kBlock + b.slots[r] % kBlock;
        backend_->kv_store(groups.index_in_group[il], k.data(), v.data(), &phys, 1);
      }
    }
  }
  // Checks a batch's tables: one per group, none sharing a block, and each
  // sliding-window group holding exactly the blocks rows from `n` on need
  // (`margin`: and kRollbackSlots more, as a growing sequence keeps).
  void check_tables(const Batch& b, size_t n, bool margin = false) {
    if (margin) n = n > KvLayerGroups::kRollbackSlots ? n - KvLayerGroups::kRollbackSlots : 0;
    const auto& groups = kv_->groups();
    const auto& s = b.seqs.at(0);
    ASSERT_EQ(s.n_groups, groups.n_groups());
    const size_t n_tab = s.block_table.size() / static_cast<size_t>(s.n_groups);
    std::vector<int32_t> used;
    for (int32_t grp = 0; grp < groups.n_groups(); ++grp) {
      const size_t first = groups.first_needed_block(grp, static_cast<int64_t>(n), kBlock);
      for (size_t i = 0; i < n_tab; ++i) {
        const int32_t block = s.block_table[static_cast<size_t>(grp) * n_tab + i];
        if (i < first) {
          EXPECT_EQ(block, kNoBlock) << "group " << grp << " entry " << i;
        } else {
          EXPECT_GE(block, 0) << "group " << grp << " entry " << i;
          used.push_back(block);
        }
      }
    }
    std::sort(used.begin(), used.end());
    EXPECT_EQ(std::adjacent_find(used.begin(), used.end()), used.end()) << "a block in two tables";
  }
  // K of history token t in layer il (0 = global, 0 and 3 local), read back.
  float k_of(KvSequence& seq, int32_t il, size_t t) {
    auto e = kv_->export_blocks(seq);
    std::vector<uint16_t> all(kv_->geometry().bytes_per_block() / 2);
    e->read(t / kBlock, all.data());
    const size_t layer = all.size() / static_cast<size_t>(kv_->groups().n_layers());
    return fp16_to_fp32(all[static_cast<size_t>(il) * layer + (t % kBlock) * kHeadDim]);
  }

  // Saves `seq` as a session file would (its all-layer blocks into `bytes`),
  // releases it, and restores the save into a new sequence.
  std::unique_ptr<KvSequence> save_and_restore(std::unique_ptr<KvSequence> seq, std::vector<uint8_t>& bytes) {
    auto e = kv_->export_blocks(*seq);
    const size_t bpb = kv_->geometry().bytes_per_block();
    bytes.assign(e->n_blocks() * bpb, 0);
    for (size_t i = 0; i < e->n_blocks(); ++i) e->read(i, bytes.data() + i * bpb);
    auto copy = full();
    KvManager::Saved saved;
    saved.tokens = seq->tokens();
    saved.generated = seq->generated();
    saved.n_computed = e->n_computed();
    saved.blocks = bytes.data();
    saved.n_blocks = e->n_blocks();
    e.reset();
    kv_->release(*seq);
    kv_->restore(*copy, saved, [&](const std::string& w) { throw Error(StatusCode::kBadFormat, w); });
    return copy;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvManager> kv_;
};

TEST_F(GroupedKvTest, SlidingWindowGroupsFreeWhatTheirWindowLeft) {
  EXPECT_EQ(kv_->groups().n_groups(), 3);
  EXPECT_EQ(kv_->pool_geometry().num_layers, 2);
  EXPECT_EQ(kv_->total_blocks(), 200u);  // in all-layer blocks
  auto seq = full();
  const auto t = tokens(400);
  kv_->append(*seq, t.data(), t.size(), false);
  for (size_t done = 0; done < 400; done += 16) {
    Batch b = compute(*seq, 16);
    check_tables(b, done, true);
  }
  // Global group: 100 blocks; each local group keeps what rows from 400 on
  // need and the rollback margin.
  const size_t local = 100 - kv_->groups().first_needed_block(1, 400 - KvLayerGroups::kRollbackSlots, kBlock);
  EXPECT_EQ(local, 28u);
  EXPECT_EQ(seq->blocks_held(), 100 + 2 * local);
  EXPECT_LT(seq->blocks_held(), 3u * 100 * 6 / 10);  // flat: 300
  EXPECT_EQ(kv_->stats().blocks_used, seq->blocks_held());
  // The last window's K are intact in every layer.
  for (size_t i = 400 - kWindow; i < 400; ++i) {
    for (int32_t il = 0; il < 6; ++il) ASSERT_EQ(k_of(*seq, il, i), static_cast<float>(t[i])) << il << " " << i;
  }
  // Freed local entries read as zeros in an export; global ones keep everything.
  EXPECT_EQ(k_of(*seq, 0, 0), 0.0f);
  EXPECT_EQ(k_of(*seq, 2, 0), static_cast<float>(t[0]));
  kv_->release(*seq);
  EXPECT_EQ(kv_->stats().blocks_used, 0u);
}

TEST_F(GroupedKvTest, APrefixHitTakesTheBlocksItsWindowNeeds) {
  auto a = full();
  const auto t = tokens(400);
  kv_->append(*a, t.data(), t.size(), false);
  for (int i = 0; i < 25; ++i) compute(*a, 16);
  kv_->park(*a);  // everything indexed, then released into the cache
  EXPECT_EQ(kv_->stats().blocks_used, 0u);

  auto b = full();
  auto tb = t;
  tb.push_back(7);
  kv_->append(*b, tb.data(), tb.size(), false);
  SchedSequence s;
  kv_->describe(*b, s);
  auto budget = kv_->step_budget({{b.get(), SIZE_MAX}});
  budget.admit(s);
  EXPECT_EQ(b->n_computed(), 400u);
  ASSERT_TRUE(budget.allocate(s, 401));
  Batch rows;
  kv_->add_rows(*b, rows, 1, 400);
  check_tables(rows, 400);
  for (size_t i = 400 - kWindow; i < 400; ++i) ASSERT_EQ(k_of(*b, 1, i), static_cast<float>(t[i])) << i;
  kv_->release(*b);
}

TEST_F(GroupedKvTest, AHitWhoseWindowBlocksWereEvictedGoesBackToWhatIsComplete) {
  auto a = full();
  const auto t = tokens(400);
  kv_->append(*a, t.data(), t.size(), false);
  for (int i = 0; i < 25; ++i) compute(*a, 16);
  kv_->park(*a);
  // The cache evicts the blocks the local groups freed first, then the parked
  // ones: another sequence takes every free block and 10 cached ones more,
  // evicting blocks the hit would need.
  const KvCacheStats st = kv_->stats();
  ASSERT_EQ(st.blocks_cached, 100u + 2 * 100);
  auto other = full();
  const size_t take = st.blocks_free + 2 * 72 + 10;
  ASSERT_TRUE(kv_->grow(*other, (take + 2) / 3 * kBlock));
  kv_->release(*other);

  auto b = full();
  kv_->append(*b, t.data(), t.size(), false);
  SchedSequence s;
  kv_->describe(*b, s);
  auto budget = kv_->step_budget({{b.get(), SIZE_MAX}});
  budget.admit(s);
  // Whatever the hit, every group holds what rows from there on need.
  const size_t n = b->n_computed();
  EXPECT_LT(n, 400u);
  ASSERT_TRUE(budget.allocate(s, n + 1));
  Batch rows;
  kv_->add_rows(*b, rows, 1, n);
  check_tables(rows, n);
  kv_->release(*b);
}

TEST_F(GroupedKvTest, RollbackWithinTheKeptSlotsAndBeyond) {
  auto seq = full();
  const auto t = tokens(400);
  kv_->append(*seq, t.data(), t.size(), false);
  for (int i = 0; i < 25; ++i) compute(*seq, 16);
  const size_t held = seq->blocks_held();
  kv_->uncompute(*seq, 400 - 40);  // inside kRollbackSlots: nothing to fetch
  EXPECT_EQ(seq->n_computed(), 360u);
  EXPECT_EQ(seq->blocks_held(), held - 3 * 10);  // the last 10 blocks of each group
  {
    Batch rows;
    ASSERT_TRUE(kv_->grow(*seq, 1));
    kv_->add_rows(*seq, rows, 1, 360);
    check_tables(rows, 400, true);
  }
  compute(*seq, 40);
  // Far back: the freed blocks come back from the prefix cache.
  kv_->uncompute(*seq, 200);
  EXPECT_EQ(seq->n_computed(), 200u);
  Batch rows;
  ASSERT_TRUE(kv_->grow(*seq, 1));
  kv_->add_rows(*seq, rows, 1, 200);
  check_tables(rows, 200);
  for (size_t i = 200 - kWindow; i < 200; ++i) ASSERT_EQ(k_of(*seq, 4, i), static_cast<float>(t[i])) << i;
  kv_->release(*seq);
}

class GroupedKvNoCacheTest : public GroupedKvTest {
 protected:
  GroupedKvNoCacheTest() : GroupedKvTest(false) {}
};

TEST_F(GroupedKvNoCacheTest, RollbackPastFreedBlocksRecomputes) {
  auto seq = full();
  const auto t = tokens(400);
  kv_->append(*seq, t.data(), t.size(), false);
  for (int i = 0; i < 25; ++i) compute(*seq, 16);
  kv_->uncompute(*seq, 200);  // the window before 200 is gone and nothing caches it
  EXPECT_EQ(seq->n_computed(), 0u);
  EXPECT_EQ(seq->blocks_held(), 0u);
  for (int i = 0; i < 25; ++i) compute(*seq, 16);
  EXPECT_EQ(seq->n_computed(), 400u);
  kv_->release(*seq);
}

TEST_F(GroupedKvTest, SaveAndRestoreKeepTheAllLayerLayout) {
  auto seq = full();
  const auto t = tokens(300);
  kv_->append(*seq, t.data(), t.size(), false);
  for (int i = 0; i < 18; ++i) compute(*seq, 16);  // 288 computed
  EXPECT_EQ(kv_->geometry().bytes_per_block(), 6u * 2 * kKvHeads * kBlock * kHeadDim * sizeof(uint16_t));
  std::vector<uint8_t> bytes;
  auto copy = save_and_restore(std::move(seq), bytes);
  EXPECT_EQ(copy->n_computed(), 0u);  // parked: an idle full session pins nothing
  EXPECT_EQ(kv_->stats().blocks_used, 0u);
  // Its next turn finds the blocks (the local groups' last windows included).
  SchedSequence s;
  kv_->describe(*copy, s);
  auto budget = kv_->step_budget({{copy.get(), SIZE_MAX}});
  budget.admit(s);
  EXPECT_EQ(copy->n_computed(), 288u);
  ASSERT_TRUE(budget.allocate(s, 289));
  Batch rows;
  kv_->add_rows(*copy, rows, 1, 288);
  check_tables(rows, 288);
  for (size_t i = 0; i < 288; ++i) ASSERT_EQ(k_of(*copy, 5, i), static_cast<float>(t[i])) << i;
  for (size_t i = 288 - kWindow; i < 288; ++i) ASSERT_EQ(k_of(*copy, 3, i), static_cast<float>(t[i])) << i;
  kv_->release(*copy);
}

// The first of 2 pipeline stages of a 6-layer Gemma-like model: 3 local
// layers, and the global group empty on this stage (its layer is on the
// second): tables for every group, each layer's K where its group keeps it,
// the local groups freeing what their window left, session bytes round trip.
class PipelineStageKvTest : public GroupedKvTest {
 protected:
  PipelineStageKvTest() {
    std::vector<int32_t> w(6, kWindow);
    w[5] = 0;
    make(true, 200, KvLayerGroups::pipeline_stage(w, {3, 3}, 0));
  }
};

TEST_F(PipelineStageKvTest, EmptyAndShortGroupsWork) {
  const auto& groups = kv_->groups();
  ASSERT_EQ(groups.n_groups(), 4);
  EXPECT_TRUE(groups.layers[0].empty());
  EXPECT_EQ(kv_->pool_geometry().num_layers, 1);
  auto seq = full();
  const auto t = tokens(200);
  kv_->append(*seq, t.data(), t.size(), false);
  for (size_t done = 0; done < 192; done += 16) check_tables(compute(*seq, 16), done, true);
  for (size_t i = 192 - kWindow; i < 192; ++i) {
    for (int32_t il = 0; il < 3; ++il) ASSERT_EQ(k_of(*seq, il, i), static_cast<float>(t[i])) << il << " " << i;
  }
  std::vector<uint8_t> bytes;
  auto copy = save_and_restore(std::move(seq), bytes);
  SchedSequence s;
  kv_->describe(*copy, s);
  auto budget = kv_->step_budget({{copy.get(), SIZE_MAX}});
  budget.admit(s);
  ASSERT_TRUE(budget.allocate(s, 193));
  for (size_t i = 192 - kWindow; i < 192; ++i) {
    for (int32_t il = 0; il < 3; ++il) ASSERT_EQ(k_of(*copy, il, i), static_cast<float>(t[i])) << il << " " << i;
  }
  kv_->release(*copy);
  EXPECT_EQ(kv_->stats().blocks_used, 0u);
}

}  // namespace
}  // namespace ember
