// Batch: the unit of work of one forward pass. Rows are tokens; each row
// belongs to one sequence; a sequence's rows are contiguous. Positions are
// what RoPE sees; slots are where the row's K/V go inside the sequence's
// cache (logical slot s lives in block block_table[s / block_size]).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace ember {

class LoraSet;

struct BatchSeq {
  int32_t first_row = 0;
  int32_t n_rows = 0;
  // The sequence's blocks, covering every slot used: with n_groups > 1 (the
  // pool holds layer groups, core/kv_cache KvLayerGroups) the tables of the
  // groups one after the other, each block_table.size() / n_groups long;
  // entries a sliding-window group has freed are -1.
  std::vector<int32_t> block_table;
  int32_t n_groups = 1;
  // Cache slots [hole_begin, hole_end) are not attended (evicted by a cache
  // policy, see core/kv_cache/streaming.h); empty for most sequences.
  int32_t hole_begin = 0;
  int32_t hole_end = 0;
  // Every row is computed as a one-token decode (speculative verification:
  // each tree row must equal the decode of its token), also in the matmuls.
  bool decodes = false;
  // Its logit rows are scores (ember_engine_score, Session::score: every row
  // from some index on), not a row a token is sampled from. The output head
  // computes scored rows as prompt rows and a sampled-from row as a decode
  // (llama.cpp's batched head for all rows, its one-row head for the last).
  bool scores = false;
  // The LoRA adapters its rows are computed with (null: none).
  std::shared_ptr<const LoraSet> lora;
};

struct Batch {
  std::vector<int32_t> tokens;      // one per row
  std::vector<int32_t> positions;   // RoPE position per row
  std::vector<int32_t> slots;       // logical cache slot per row
  std::vector<int32_t> kv_len;      // row attends to logical slots [0, kv_len)
  std::vector<int32_t> seq_of_row;  // index into seqs
  std::vector<BatchSeq> seqs;
  std::vector<int32_t> logit_rows;   // rows whose logits are wanted, in output order
  // Rows whose hidden state after the final norm (the output head's input,
  // llama.cpp's embeddings) is wanted, in output order.
  std::vector<int32_t> embd_rows;
  std::vector<uint8_t> decode_rows;  // per row: 1 = a generated token fed back (AttentionParams::decode_rows)
  // Token-tree rows (AttentionParams::tree_from/tree_begin/tree_slots): empty
  // when the batch has none, else one tree_from/tree_begin per row (-1: an
  // ordinary row).
  std::vector<int32_t> tree_from, tree_begin, tree_slots;

  int32_t n_rows() const { return static_cast<int32_t>(tokens.size()); }
  bool has_tree() const { return !tree_from.empty(); }
  // Makes row `row` a tree row: it sees cache slots [0, from) and then `path`
  // (its ancestors' slots, root first, then its own); kv_len[row] becomes
  // from + path.size().
  void set_tree_row(int32_t row, int32_t from, const std::vector<int32_t>& path) {
    if (tree_from.empty()) {
      tree_from.assign(tokens.size(), -1);
      tree_begin.assign(tokens.size(), 0);
    }
    tree_from.resize(tokens.size(), -1);
    tree_begin.resize(tokens.size(), 0);
    tree_from[row] = from;
    tree_begin[row] = static_cast<int32_t>(tree_slots.size());
    tree_slots.insert(tree_slots.end(), path.begin(), path.end());
    kv_len[row] = from + static_cast<int32_t>(path.size());
  }
  void clear() { *this = Batch(); }

  // Appends a causal run of `n` tokens for a sequence whose cache already
  // holds `n_past` slots (positions == slots).
  // `decoded` (may be null): per token, 1 if the engine generated it.
  void add_sequence(const int32_t* toks, int32_t n, int32_t n_past, std::vector<int32_t> block_table,
                    bool logits_for_last, bool logits_for_all = false, const uint8_t* decoded = nullptr) {
    BatchSeq s;
    s.first_row = n_rows();
    s.n_rows = n;
    s.block_table = std::move(block_table);
    const int32_t seq_index = static_cast<int32_t>(seqs.size());
    for (int32_t i = 0; i < n; ++i) {
      const int32_t row = n_rows();
      tokens.push_back(toks[i]);
      positions.push_back(n_past + i);
      slots.push_back(n_past + i);
      kv_len.push_back(n_past + i + 1);
      seq_of_row.push_back(seq_index);
      decode_rows.push_back(decoded ? decoded[i] : 0);
      if (logits_for_all || (logits_for_last && i == n - 1)) logit_rows.push_back(row);
    }
    extend_tree_rows();
    seqs.push_back(std::move(s));
  }

  // Appends `n` rows of one sequence with explicit RoPE positions and cache
  // slots (a window/sink sequence): row i attends to slots [0, slots[i] + 1)
  // minus [hole_begin, hole_end). Rows i >= first_logit get logits.
  void add_rows(const int32_t* toks, const int32_t* pos, const int32_t* slot, int32_t n,
                std::vector<int32_t> block_table, int32_t hole_begin, int32_t hole_end, int32_t first_logit,
                const uint8_t* decoded = nullptr) {
    BatchSeq s;
    s.first_row = n_rows();
    s.n_rows = n;
    s.block_table = std::move(block_table);
    s.hole_begin = hole_begin;
    s.hole_end = hole_end;
    const int32_t seq_index = static_cast<int32_t>(seqs.size());
    for (int32_t i = 0; i < n; ++i) {
      const int32_t row = n_rows();
      tokens.push_back(toks[i]);
      positions.push_back(pos[i]);
      slots.push_back(slot[i]);
      kv_len.push_back(slot[i] + 1);
      seq_of_row.push_back(seq_index);
      decode_rows.push_back(decoded ? decoded[i] : 0);
      if (i >= first_logit) logit_rows.push_back(row);
    }
    extend_tree_rows();
    seqs.push_back(std::move(s));
  }

 private:
  void extend_tree_rows() {
    if (tree_from.empty()) return;
    tree_from.resize(tokens.size(), -1);
    tree_begin.resize(tokens.size(), 0);
  }
};

}  // namespace ember
