// core::LoraAdapter: a LoRA adapter in llama.cpp's GGUF format, loaded
// against a base model, and the sets of adapters a session decodes with.
//
// The file (convert_lora_to_gguf.py's output): general.type = "adapter",
// adapter.type = "lora", general.architecture = the base's,
// adapter.lora.alpha (float; 0 or absent = no alpha scaling), and for each
// adapted matrix W ("blk.N.attn_q.weight" ...) of shape [K, N] (ne) the pair
// "<W>.lora_a" [K, r] and "<W>.lora_b" [r, N], F32, F16 or BF16. The layer
// matrices (attn_q/k/v/output, ffn_gate/up/down) may be adapted; an adapter
// of any other tensor (the output head, the token embeddings) is refused
// with kUnsupported.
//
// A row with adapters {(A_i, s_i)} computes W x + sum_i (s_i * alpha_i / r_i)
// * B_i (A_i x), each term added in set order as llama.cpp does
// (llm_graph_context::build_lora_mm). Adapters are immutable and shared:
// sessions, engines and the host's handle hold them by shared_ptr, so one
// unloaded by the host while sessions use it lives until they let go.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"

namespace ember {

namespace gguf {
class GgufFile;
}
class Model;

// The matrices of a layer an adapter may change.
enum class LoraTarget : int32_t { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int32_t kLoraLayerTargets = 7;

class LoraAdapter {
 public:
  struct Pair {
    WeightDesc a;  // rank rows of K (lora_a)
    WeightDesc b;  // N rows of rank (lora_b)
    int32_t rank = 0;
    // alpha / rank, or 1 when the file has no alpha (llama.cpp's get_scale).
    float alpha_scale = 1.0f;
  };
  static constexpr int32_t kMaxRank = 4096;

  // Loads `path` (a private copy: the file may change afterwards) and checks
  // it against `base`: same architecture, every tensor a known matrix of the
  // base with matching shapes. Throws ember::Error (kBadFormat: corrupt or
  // not an adapter; kInvalidArgument: made for another model; kUnsupported:
  // a tensor type or target Ember does not apply).
  static std::shared_ptr<const LoraAdapter> load(const std::string& path, const Model& base);
  // The same from an opened file (`name` stands for it in messages; the
  // adapter keeps the file). Throws ember::Error as load().
  static std::shared_ptr<const LoraAdapter> from_file(std::unique_ptr<gguf::GgufFile> file, const std::string& name,
                                                      const Model& base);
  ~LoraAdapter();

  // Layer il's pair for `t`, or null when the adapter leaves that matrix alone.
  const Pair* find(int32_t il, LoraTarget t) const;
  // A content hash of the file: the same adapter loaded twice has the same
  // key (prefix-cache keys, device copies are per object).
  uint64_t key() const { return key_; }
  const std::string& path() const { return path_; }
  float alpha() const { return alpha_; }
  int32_t n_pairs() const { return n_pairs_; }
  int32_t max_rank() const { return max_rank_; }
  size_t bytes() const;  // the tensors' size
  // The base's shape this adapter fits (checked when a session uses it).
  bool fits(const Model& base) const;

 private:
  LoraAdapter() = default;
  std::unique_ptr<gguf::GgufFile> file_;
  std::string path_, architecture_;
  int32_t n_layers_ = 0, n_embd_ = 0, n_vocab_ = 0;
  float alpha_ = 0.0f;
  uint64_t key_ = 0;
  int32_t n_pairs_ = 0, max_rank_ = 0;
  std::vector<Pair> pairs_;  // n_layers * kLoraLayerTargets, rank 0 = none
};

// One adapter of a session's set, with its scale (llama.cpp's
// adapter_scale; the term's factor is scale * alpha / rank).
struct LoraUse {
  std::shared_ptr<const LoraAdapter> adapter;
  float scale = 1.0f;
};

// The adapters a sequence decodes with, in order. Immutable once made.
class LoraSet {
 public:
  static constexpr size_t kMaxAdapters = 16;
  static constexpr float kMaxScale = 1000.0f;
  // Validates (at most kMaxAdapters, non-null, finite scales of magnitude
  // <= kMaxScale); uses with scale 0 are dropped. Returns null for an empty
  // set. Throws ember::Error(kInvalidArgument).
  static std::shared_ptr<const LoraSet> make(std::vector<LoraUse> uses);
  const std::vector<LoraUse>& uses() const { return uses_; }
  // Prefix-cache salt: a hash of the adapters' keys and scales (never 0).
  uint64_t key() const { return key_; }

 private:
  std::vector<LoraUse> uses_;
  uint64_t key_ = 0;
};

// The key of a possibly empty set (0: no adapters).
inline uint64_t lora_key(const std::shared_ptr<const LoraSet>& s) { return s ? s->key() : 0; }

}  // namespace ember
