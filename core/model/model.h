// core::Model: an immutable loaded model — the GGUF (a private copy or a
// mapping, Model::Weights), its Llama-family
// hyperparameters, weight descriptors, tokenizer and chat template. Shared by
// any number of engines and threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/backend/backend.h"
#include "core/kv_cache/layer_groups.h"

namespace ember {

namespace gguf {
class GgufFile;
}
class Tokenizer;
class ChatTemplate;

// How RoPE pairs the dimensions of a head (llama.cpp's rope types).
enum class RopeStyle : uint8_t {
  kNorm,  // adjacent pairs (2i, 2i+1): Llama, Mistral
  kNeox,  // halves (i, i + rot_dim/2): Qwen2, Gemma
};

// Hyperparameters of a decoder-only transformer of the Llama family (Llama,
// Mistral, Qwen2, Gemma 3 are variations of it), read from GGUF metadata by
// the generic loader and the architecture's own hook (core/model/arch/).
struct ModelConfig {
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;
  int32_t n_embd = 0;
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t n_ff = 0;
  int32_t rope_dim = 0;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;

  // Variations (defaults are Llama's).
  RopeStyle rope_style = RopeStyle::kNorm;
  float rope_freq_scale = 1.0f;  // linear RoPE scaling (1 / rope.scaling.factor)
  bool rope_freqs = false;       // rope_freqs.weight: per-dimension frequency divisors (Llama 3.1 scaling)
  // Sliding-window (local) attention: a layer with is_swa[il] attends to the
  // last `sliding_window` positions only and rotates with rope_freq_base_swa.
  int32_t sliding_window = 0;  // 0: every layer is global
  float rope_freq_base_swa = 10000.0f;
  std::vector<uint8_t> is_swa;  // n_layers entries (empty: none)

  bool layer_is_swa(int32_t il) const {
    return sliding_window > 0 && il < static_cast<int32_t>(is_swa.size()) && is_swa[il];
  }
  float layer_rope_base(int32_t il) const { return layer_is_swa(il) ? rope_freq_base_swa : rope_freq_base; }
  // True when K-shift (sink/window sessions) can move this model's keys: one
  // RoPE base and style for every layer, the layout Backend::kv_rope_shift rotates.
  bool plain_rope() const {
    return rope_style == RopeStyle::kNorm && rope_freq_scale == 1.0f && !rope_freqs && sliding_window == 0;
  }
};
using LlamaConfig = ModelConfig;  // (the name before other architectures)

// A layer's weights, as its architecture names them (core/model/arch/); the
// optional ones have host_data == nullptr when the architecture has none.
struct LayerWeightDescs {
  WeightDesc attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
  WeightDesc bq, bk, bv;                     // Qwen2's QKV biases
  WeightDesc q_norm, k_norm;                 // per-head RMS norms of Q and K (Gemma 3, Qwen3)
  WeightDesc post_attn_norm, post_ffn_norm;  // norms after attention and the FFN (Gemma 3)
};

// Reads one tensor of the file: its name, shape [cols, rows], and whether it
// is a norm (f32) or a matmul weight. Throws ember::Error (missing, shape,
// type).
using TensorGetter = std::function<WeightDesc(const std::string& name, int64_t cols, int64_t rows, bool norm)>;

// Which part of a model one rank of a split model holds (issue 31;
// core/model/shard.cpp). Tensor parallel: rank tp_rank of tp holds its
// query heads (n_heads / tp, contiguous), their KV heads (n_kv_heads / tp, or
// the one KV head they read, replicated, when tp exceeds the KV heads), its
// FFN columns (n_ff / tp) and its vocabulary rows of the embedding and output
// head ([vocab_begin, vocab_end), ceil(n_vocab / tp) a rank): Q/K/V, gate and
// up are split by output rows (column parallel), attn_output and ffn_down by
// output rows too (exact) or by input columns (row parallel, their partial
// sums all-reduced). Norms are replicated. Pipeline parallel: layers [first_layer, first_layer +
// n_layers); the embedding only on the first stage, the final norm and the
// output head only on the last.
struct ModelShard {
  int32_t tp = 1, tp_rank = 0;
  // Tensor parallel, how attn_output and ffn_down are split. exact (the
  // default): by output rows, each rank computing its rows of the full dot
  // products after an all-gather of their inputs, so that every value is
  // computed as on one rank, to the bit (4 all-gathers a layer). Otherwise
  // Megatron's row parallelism: by input columns, the partial sums
  // all-reduced (2 all-reduces a layer; the sums' order changes).
  bool exact = true;
  int32_t pp = 1, pp_rank = 0;
  int32_t first_layer = 0, n_layers = 0;   // this stage's layers (n_layers 0: every layer)
  int32_t model_layers = 0;                // the whole model's layers (set by Model::shard)
  int32_t vocab_begin = 0, vocab_end = 0;  // this rank's vocabulary rows (set by Model::shard)
  bool first_stage() const { return pp_rank == 0; }
  bool last_stage() const { return pp_rank == pp - 1; }
};

// Pipeline stage `stage` of `pp`: its first layer and layer count (every
// stage n_layers / pp layers, the first n_layers % pp one more).
std::pair<int32_t, int32_t> pipeline_stage_layers(int32_t n_layers, int32_t pp, int32_t stage);

class Model {
 public:
  // Where the weights live once loaded.
  enum class Weights {
    // In private memory, read from the file once: the file may then be
    // changed, truncated or deleted while the model lives (the host must
    // survive that). Costs the file's size in anonymous memory, which the
    // forward pass reads in full anyway; a weight the CPU backend packed
    // gives its pages back (gguf.h: release_image_pages, ImagePin).
    kPrivateCopy,
    // Read in place from a shared read-only mapping: no copy, pages shared
    // with other processes and reclaimable, but a file truncated while the
    // model lives kills the process with SIGBUS on the next forward pass.
    kSharedMapping,
  };
  // Loads and validates a GGUF model. Throws ember::Error.
  static std::shared_ptr<Model> load(const std::string& path, Weights weights = Weights::kPrivateCopy);
  ~Model();
  // The part of `full` that rank (tp_rank, pp_rank) holds (ModelShard): a
  // Model whose config() has the shard's heads, FFN width and layers (n_embd
  // and n_vocab stay the full model's), whose weights point into `full`'s or,
  // for row-parallel matrices, into copies of its columns. Throws
  // ember::Error(kUnsupported) with the reason for a split the model's shape
  // does not allow (heads % tp, KV heads, FFN or head columns not a whole
  // number of quantization blocks, sliding-window layers under pp).
  static std::shared_ptr<const Model> shard(std::shared_ptr<const Model> full, const ModelShard& spec);
  // What this model is of a split one (tp = pp = 1: the whole model).
  const ModelShard& shard_spec() const { return shard_; }

  const std::string& architecture() const { return architecture_; }
  const std::string& name() const { return name_; }
  const ModelConfig& config() const { return config_; }
  uint64_t n_params() const { return n_params_; }
  const Tokenizer& tokenizer() const;
  // nullptr when the model has no template or it cannot be parsed;
  // chat_template_error() then says why.
  const ChatTemplate* chat_template() const;
  const std::string& chat_template_error() const { return chat_template_error_; }

  const WeightDesc& token_embd() const { return token_embd_; }
  const WeightDesc& output_norm() const { return output_norm_; }
  const WeightDesc& output() const { return output_; }  // token_embd when tied
  const std::vector<LayerWeightDescs>& layers() const { return layers_; }
  // A 64-bit fingerprint of the architecture, hyperparameters, tokenizer
  // size and samples of every weight, taken at load (before any weight's
  // pages can be released): what a session file records to be reloaded only
  // into the same model. A shard has its whole model's.
  uint64_t fingerprint() const { return fingerprint_; }
  const WeightDesc& rope_freqs() const { return rope_freqs_; }  // config().rope_freqs
  // How layer il's queries and keys are rotated (its base, NEOX pairs,
  // scaling; the factors point into the model).
  RopeSpec rope_spec(int32_t il) const;
  std::vector<RopeSpec> rope_specs() const;  // every layer's, in order
  // The shape of this model's KV blocks (num_blocks left 0 for the caller).
  KvGeometry kv_geometry(int32_t block_size) const;  // every layer in a block
  // How the paged pool groups the layers (sliding-window layers apart from
  // global ones); one group of every layer for most models.
  KvLayerGroups kv_groups() const;

 private:
  Model() = default;
  void load_config();
  void load_weights();
  uint64_t compute_fingerprint() const;

  std::unique_ptr<gguf::GgufFile> file_;
  std::string architecture_, name_;
  ModelConfig config_;
  uint64_t n_params_ = 0;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::string chat_template_error_;
  WeightDesc token_embd_, output_norm_, output_, rope_freqs_;
  std::vector<LayerWeightDescs> layers_;
  // A shard: the model it is part of (its file and tokenizer) and the
  // columns it copied.
  std::shared_ptr<const Model> parent_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;
  ModelShard shard_;
};

}  // namespace ember
