// Model::shard (issue 31): what each rank of a tensor- or pipeline-parallel
// split holds, on the synthetic files (no MPI needed), and the forward
// command's Batch encoding (core/engine/parallel.h).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/engine/parallel.h"
#include "core/gguf/gguf.h"
#include "core/model/model.h"
#include "core/tensor/types.h"
#include "core/util/status.h"

namespace ember {
namespace {

std::string synthetic(const std::string& name) { return std::string(EMBER_SYNTHETIC_DIR) + "/" + name; }

ModelShard tp_rank(int tp, int r) {
  ModelShard s;
  s.tp = tp;
  s.tp_rank = r;
  return s;
}
ModelShard pp_rank(int pp, int r) {
  ModelShard s;
  s.pp = pp;
  s.pp_rank = r;
  return s;
}

// Row `row` of w, dequantized.
std::vector<float> row_of(const WeightDesc& w, int64_t row) {
  std::vector<float> out(static_cast<size_t>(w.cols));
  const size_t rb = row_bytes(w.type, w.cols);
  // (A shard releases the pages of the matrices whose columns it copied:
  // read back under a pin, as every reader of released pages does.)
  const gguf::ImagePin pin(static_cast<const uint8_t*>(w.host_data) + static_cast<size_t>(row) * rb, rb);
  type_traits(w.type)->dequantize_row(static_cast<const uint8_t*>(w.host_data) + static_cast<size_t>(row) * rb,
                                      out.data(), w.cols);
  return out;
}

TEST(ModelShard, TensorParallelSplitsHeadsFfnAndVocabulary) {
  auto full = Model::load(synthetic("llama3.gguf"));  // 4 heads, 2 KV heads, n_ff 512, vocab 384, head_dim 64
  const ModelConfig& c = full->config();
  for (int r = 0; r < 2; ++r) {
    auto s = Model::shard(full, tp_rank(2, r));
    EXPECT_EQ(s->config().n_heads, 2);
    EXPECT_EQ(s->config().n_kv_heads, 1);
    EXPECT_EQ(s->config().n_ff, 256);
    EXPECT_EQ(s->config().n_embd, c.n_embd);
    EXPECT_EQ(s->config().n_vocab, c.n_vocab);
    EXPECT_EQ(s->shard_spec().vocab_begin, r * 192);
    EXPECT_EQ(s->shard_spec().vocab_end, (r + 1) * 192);
    const auto& fl = full->layers()[1];
    const auto& sl = s->layers()[1];
    // Column parallel: rows of the full matrix, in place.
    EXPECT_EQ(sl.wq.rows, 128);
    EXPECT_EQ(row_of(sl.wq, 5), row_of(fl.wq, r * 128 + 5));
    EXPECT_EQ(row_of(sl.wk, 3), row_of(fl.wk, r * 64 + 3));
    EXPECT_EQ(row_of(sl.w_up, 7), row_of(fl.w_up, r * 256 + 7));
    // Exact (the default): attn_output and ffn_down by output rows, whole.
    EXPECT_EQ(sl.wo.rows, 128);
    EXPECT_EQ(sl.wo.cols, 256);
    EXPECT_EQ(sl.w_down.rows, 128);
    EXPECT_EQ(sl.w_down.cols, 512);
    EXPECT_EQ(row_of(sl.wo, 9), row_of(fl.wo, r * 128 + 9));
    EXPECT_EQ(row_of(sl.w_down, 127), row_of(fl.w_down, r * 128 + 127));
    // Row parallel (Megatron): each row's columns of this rank, copied.
    ModelShard mega = tp_rank(2, r);
    mega.exact = false;
    auto sm = Model::shard(full, mega);
    const auto& ml = sm->layers()[1];
    EXPECT_EQ(ml.wo.cols, 128);
    EXPECT_EQ(ml.w_down.cols, 256);
    for (int64_t row : {0, 17, 255}) {
      const auto whole = row_of(fl.wo, row), part = row_of(ml.wo, row);
      EXPECT_EQ(part, std::vector<float>(whole.begin() + r * 128, whole.begin() + (r + 1) * 128));
      const auto dw = row_of(fl.w_down, row), dp = row_of(ml.w_down, row);
      EXPECT_EQ(dp, std::vector<float>(dw.begin() + r * 256, dw.begin() + (r + 1) * 256));
    }
    EXPECT_EQ(s->token_embd().rows, 192);
    EXPECT_EQ(row_of(s->token_embd(), 9), row_of(full->token_embd(), r * 192 + 9));
    EXPECT_EQ(&s->tokenizer(), &full->tokenizer());
  }
}

TEST(ModelShard, KvHeadsReplicatedWhenRanksOutnumberThem) {
  auto full = Model::load(synthetic("llama3.gguf"));  // 2 KV heads
  for (int r = 0; r < 4; ++r) {
    auto s = Model::shard(full, tp_rank(4, r));
    EXPECT_EQ(s->config().n_heads, 1);
    EXPECT_EQ(s->config().n_kv_heads, 1);
    // Query head r reads KV head r / 2 (2 query heads per KV head).
    EXPECT_EQ(row_of(s->layers()[0].wk, 0), row_of(full->layers()[0].wk, (r / 2) * 64));
  }
}

TEST(ModelShard, RefusesShapesThatDoNotSplit) {
  auto full = Model::load(synthetic("llama3.gguf"));
  try {
    Model::shard(full, tp_rank(3, 0));
    FAIL() << "4 heads split 3 ways";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("head_count 4 is not divisible by tp 3"), std::string::npos) << e.what();
  }
  // Q4_K blocks hold 256 columns: attn_output's 256 columns cannot be cut in
  // two by columns (Megatron's split); by output rows (exact) they can.
  auto kq = Model::load(synthetic("llama_q4_k_m.gguf"));
  EXPECT_NO_THROW(Model::shard(kq, tp_rank(2, 0)));
  try {
    ModelShard mega = tp_rank(2, 0);
    mega.exact = false;
    Model::shard(kq, mega);
    FAIL() << "half a Q4_K block";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("blocks"), std::string::npos) << e.what();
  }
  auto gemma = Model::load(synthetic("gemma3.gguf"));
  EXPECT_NO_THROW(Model::shard(gemma, tp_rank(2, 1)));
  EXPECT_THROW(Model::shard(gemma, pp_rank(7, 0)), Error);                              // 6 layers, 7 stages
  EXPECT_THROW(Model::shard(Model::shard(full, tp_rank(2, 0)), tp_rank(2, 0)), Error);  // a shard of a shard
}

TEST(ModelShard, PipelineStagesTakeContiguousLayers) {
  auto full = Model::load(synthetic("llama3.gguf"));  // 6 layers
  const int32_t expect_first[] = {0, 2, 4, 5}, expect_n[] = {2, 2, 1, 1};
  for (int r = 0; r < 4; ++r) {
    auto s = Model::shard(full, pp_rank(4, r));
    EXPECT_EQ(s->shard_spec().first_layer, expect_first[r]);
    EXPECT_EQ(s->config().n_layers, expect_n[r]);
    EXPECT_EQ(s->layers()[0].wq.host_data, full->layers()[static_cast<size_t>(expect_first[r])].wq.host_data);
    EXPECT_EQ(s->token_embd().host_data != nullptr, r == 0);
    EXPECT_EQ(s->output().host_data != nullptr, r == 3);
    EXPECT_EQ(s->kv_geometry(16).num_layers, expect_n[r]);
    EXPECT_EQ(s->config().n_heads, full->config().n_heads);
  }
  EXPECT_THROW(Model::shard(full, pp_rank(7, 0)), Error);  // 6 layers, 7 stages
}

// tp x pp: each stage's layers, then its heads, FFN columns and vocabulary
// rows; the embedding only on the first stage, the head only on the last.
TEST(ModelShard, TensorParallelStagesSplitTheirLayers) {
  auto full = Model::load(synthetic("llama3.gguf"));  // 6 layers, 4 heads, 2 KV heads
  const ModelConfig& c = full->config();
  for (int pr = 0; pr < 2; ++pr) {
    for (int tr = 0; tr < 2; ++tr) {
      ModelShard spec = tp_rank(2, tr);
      spec.pp = 2;
      spec.pp_rank = pr;
      auto s = Model::shard(full, spec);
      const ModelShard& sh = s->shard_spec();
      EXPECT_EQ(sh.first_layer, pr * 3);
      EXPECT_EQ(s->config().n_layers, 3);
      EXPECT_EQ(s->config().n_heads, c.n_heads / 2);
      EXPECT_EQ(s->config().n_kv_heads, c.n_kv_heads / 2);
      EXPECT_EQ(s->config().n_ff, c.n_ff / 2);
      EXPECT_EQ(s->layers()[0].wq.rows, full->layers()[static_cast<size_t>(pr * 3)].wq.rows / 2);
      EXPECT_EQ(s->token_embd().host_data != nullptr, pr == 0);
      EXPECT_EQ(s->output().host_data != nullptr, pr == 1);
      const int32_t per = (c.n_vocab + 1) / 2;
      EXPECT_EQ(sh.vocab_begin, tr * per);
      EXPECT_EQ(pr == 0 ? s->token_embd().rows : s->output().rows, sh.vocab_end - sh.vocab_begin);
      // The first tensor-parallel rank's rows of layer 0's Q are the whole
      // model's first rows of that layer.
      if (tr == 0) {
        EXPECT_EQ(row_of(s->layers()[0].wq, 0), row_of(full->layers()[static_cast<size_t>(pr * 3)].wq, 0));
      }
    }
  }
}

// Sliding-window layers in stages: every stage's KV groups have the windows
// of rank 0's (its tables index every rank's pool), each stage's layers keep
// their own windows, and the stage knows the whole model's layer count.
TEST(ModelShard, PipelineStagesOfSlidingWindowLayersShareKvGroups) {
  auto gemma = Model::load(synthetic("gemma3.gguf"));
  const ModelConfig& c = gemma->config();
  ASSERT_FALSE(c.is_swa.empty());
  for (int32_t pp : {2, 3, 4}) {
    std::vector<KvLayerGroups> groups;
    for (int32_t r = 0; r < pp; ++r) {
      auto s = Model::shard(gemma, pp_rank(pp, r));
      const ModelShard& sh = s->shard_spec();
      EXPECT_EQ(sh.model_layers, c.n_layers);
      groups.push_back(s->kv_groups());
      EXPECT_EQ(groups.back().n_layers(), s->config().n_layers);
      EXPECT_EQ(groups.back().window, groups[0].window) << "pp " << pp << " rank " << r;
      for (int32_t il = 0; il < s->config().n_layers; ++il) {
        EXPECT_EQ(s->config().layer_is_swa(il), c.layer_is_swa(sh.first_layer + il));
        const int32_t w = groups.back().window[static_cast<size_t>(groups.back().group_of_layer[il])];
        EXPECT_EQ(w, c.layer_is_swa(sh.first_layer + il) ? c.sliding_window : 0) << "pp " << pp << " layer " << il;
      }
    }
  }
}

TEST(ParallelWire, BatchRoundTrip) {
  Batch b;
  const int32_t t1[] = {5, 6, 7}, t2[] = {9};
  b.add_sequence(t1, 3, 4, {0, 3}, /*logits_for_last=*/true);
  b.add_sequence(t2, 1, 20, {1, 2}, true);
  b.seqs[1].decodes = true;
  b.seqs[0].hole_begin = 1;
  b.seqs[0].hole_end = 2;
  b.embd_rows = {2};
  b.set_tree_row(3, 18, {18, 19});
  const std::vector<int32_t> w = serialize_batch(b);
  const Batch c = deserialize_batch(w.data(), w.size());
  EXPECT_EQ(c.tokens, b.tokens);
  EXPECT_EQ(c.positions, b.positions);
  EXPECT_EQ(c.slots, b.slots);
  EXPECT_EQ(c.kv_len, b.kv_len);
  EXPECT_EQ(c.seq_of_row, b.seq_of_row);
  EXPECT_EQ(c.logit_rows, b.logit_rows);
  EXPECT_EQ(c.embd_rows, b.embd_rows);
  EXPECT_EQ(c.decode_rows, b.decode_rows);
  EXPECT_EQ(c.tree_from, b.tree_from);
  EXPECT_EQ(c.tree_begin, b.tree_begin);
  EXPECT_EQ(c.tree_slots, b.tree_slots);
  ASSERT_EQ(c.seqs.size(), 2u);
  EXPECT_EQ(c.seqs[0].block_table, b.seqs[0].block_table);
  EXPECT_EQ(c.seqs[0].hole_end, 2);
  EXPECT_TRUE(c.seqs[1].decodes);
  EXPECT_EQ(c.seqs[1].first_row, 3);
  // A cut message is refused, never read past.
  for (size_t n : {size_t{0}, w.size() / 2, w.size() - 1}) EXPECT_THROW(deserialize_batch(w.data(), n), Error);
}

}  // namespace
}  // namespace ember
