// core::KvLayerGroups: how the paged KV pool splits a model's layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ember {

// A table entry whose block a sliding-window group has freed.
constexpr int32_t kNoBlock = -1;

// How a model's layers share the pool's blocks. Layers that attend over the
// same span (all of the context, or one sliding window) form a class; each
// class is cut into groups of `layers_per_group` layers (the gcd of the class
// sizes, so no block holds an unused layer), and a block holds one group's
// K/V for block_size slots. A model whose layers all see the whole context
// has one group of every layer: the plain layout, one table per sequence.
// A sliding-window group keeps only the blocks its window can still see
// (vLLM v1's hybrid allocator does the same with its KV cache groups).
struct KvLayerGroups {
  int32_t layers_per_group = 0;
  std::vector<int32_t> window;               // per group: 0 = the whole context, else the window in tokens
  std::vector<int32_t> group_of_layer;       // per model layer
  std::vector<int32_t> index_in_group;       // per model layer: its layer inside the pool's blocks
  std::vector<std::vector<int32_t>> layers;  // per group: its model layers, by index in group

  int32_t n_groups() const { return static_cast<int32_t>(window.size()); }
  int32_t n_layers() const { return static_cast<int32_t>(group_of_layer.size()); }
  // The layers a pool block set (one block of every group) has room for: the
  // model's layers, or more where groups are padded (pipeline_stage).
  int32_t pool_layers() const { return layers_per_group * n_groups(); }
  bool has_local() const;
  // layer_window: per model layer, 0 (whole context) or its sliding window.
  static KvLayerGroups from_windows(const std::vector<int32_t>& layer_window);
  // One pipeline stage's groups, for a model whose layers are cut into
  // stages of stage_layers[s] layers in order (Model::shard). Rank 0's
  // tables index every rank's pool, so every stage must have the same
  // groups with the same windows; a stage's layers of a class fill its
  // groups of that class in order, `layers_per_group` (this stage's) to a
  // group, and a group may hold fewer on one stage than on another, or none
  // (Gemma 3 in 2 stages: 1 global layer on the first, 2 on the second).
  // Chosen to leave the fewest unused layers in the stages' blocks, then
  // the fewest groups. `layers` / `group_of_layer` / `index_in_group` are in
  // the stage's own layer numbers (0 = its first).
  static KvLayerGroups pipeline_stage(const std::vector<int32_t>& layer_window,
                                      const std::vector<int32_t>& stage_layers, int32_t stage);
  // Layers in order, `per_group` to a group (the last may hold fewer), every
  // one over the whole context: another model's layers in a pool whose
  // blocks hold per_group layers.
  static KvLayerGroups chunked(int32_t n_layers, int32_t per_group);
  // The first block `group` must still hold when rows for tokens n, n+1, ...
  // are computed (a sequence whose tokens sit at slots == positions): its
  // window reaches back to slot n + 1 - window, and attention kernels may
  // touch the table from the 32-slot step holding it.
  size_t first_needed_block(int32_t group, int64_t n, int32_t block_size) const;
  // A growing sequence frees only below first_needed_block(n -
  // kRollbackSlots), so a short rollback (a stop string, a re-run last token)
  // resumes without fetching or recomputing anything.
  static constexpr int32_t kRollbackSlots = 64;
};

}  // namespace ember
