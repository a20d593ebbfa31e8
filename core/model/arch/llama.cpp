#include "core/model/arch/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "core/model/arch/registry.h"
#include "core/util/status.h"

namespace ember {

// Llama (and Mistral, SmolLM, TinyLlama...): the defaults of ModelConfig.
// Llama 3.1/3.2 RoPE scaling is the optional rope_freqs tensor, which the
// generic loader reads.
void load_llama_hparams(const gguf::GgufFile&, const std::string&, ModelConfig&) {}

LlamaForward::LlamaForward(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size)
    : model_(std::move(model)), backend_(backend), block_size_(block_size), groups_(model_->kv_groups()) {
  token_embd_ = backend_.upload_weight(model_->token_embd());
  output_norm_ = backend_.upload_weight(model_->output_norm());
  output_ = backend_.upload_weight(model_->output());
  for (const auto& l : model_->layers()) {
    LayerWeights w;
    w.attn_norm = backend_.upload_weight(l.attn_norm);
    w.wq = backend_.upload_weight(l.wq);
    w.wk = backend_.upload_weight(l.wk);
    w.wv = backend_.upload_weight(l.wv);
    w.wo = backend_.upload_weight(l.wo);
    w.ffn_norm = backend_.upload_weight(l.ffn_norm);
    w.w_gate = backend_.upload_weight(l.w_gate);
    w.w_up = backend_.upload_weight(l.w_up);
    w.w_down = backend_.upload_weight(l.w_down);
    auto optional = [&](const WeightDesc& d) { return d.host_data ? backend_.upload_weight(d) : nullptr; };
    w.bq = optional(l.bq);
    w.bk = optional(l.bk);
    w.bv = optional(l.bv);
    w.q_norm = optional(l.q_norm);
    w.k_norm = optional(l.k_norm);
    w.post_attn_norm = optional(l.post_attn_norm);
    w.post_ffn_norm = optional(l.post_ffn_norm);
    layers_.push_back(std::move(w));
  }
  if (model_->config().rope_freqs) {
    const WeightDesc& f = model_->rope_freqs();
    rope_freqs_.resize(static_cast<size_t>(f.cols));
    std::memcpy(rope_freqs_.data(), f.host_data, rope_freqs_.size() * sizeof(float));
  }
}

LlamaForward::~LlamaForward() { release_buffers(); }

void LlamaForward::release_buffers() {
  for (float** p : {&x_, &h_, &q_, &k_, &v_, &attn_, &gate_, &up_, &sel_, &logits_dev_}) {
    if (*p) backend_.free_buffer(*p);
    *p = nullptr;
  }
  capacity_rows_ = capacity_logits_ = 0;
}

void LlamaForward::ensure_capacity(int32_t rows, int32_t logit_rows) {
  if (rows <= capacity_rows_ && logit_rows <= capacity_logits_) return;
  release_buffers();
  const auto& c = model_->config();
  const size_t r = static_cast<size_t>(std::max(rows, 1));
  const size_t lr = static_cast<size_t>(std::max(logit_rows, 1));
  const size_t q_dim = static_cast<size_t>(c.n_heads) * c.head_dim;
  const size_t kv_dim = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  auto f = [&](size_t n) { return static_cast<float*>(backend_.alloc(n * sizeof(float))); };
  x_ = f(r * c.n_embd);
  h_ = f(r * std::max<size_t>(c.n_embd, q_dim));
  q_ = f(r * q_dim);
  k_ = f(r * kv_dim);
  v_ = f(r * kv_dim);
  attn_ = f(r * q_dim);
  gate_ = f(r * c.n_ff);
  up_ = f(r * c.n_ff);
  sel_ = f(lr * c.n_embd);
  logits_dev_ = f(lr * c.n_vocab);
  capacity_rows_ = static_cast<int32_t>(r);
  capacity_logits_ = static_cast<int32_t>(lr);
}

void LlamaForward::use_kv_layout(const KvLayerGroups& groups, const KvView* view) {
  if (groups.n_layers() != model_->config().n_layers) {
    fail(StatusCode::kInternal, "forward: KV layer groups for another layer count");
  }
  groups_ = groups;
  view_ = view ? *view : KvView{};
}

void LlamaForward::forward(const Batch& batch, float* logits) {
  forward_layers(batch, logits, model_->config().n_layers);
}

void LlamaForward::forward_layers(const Batch& batch, float* logits, int32_t n_layers) {
  const auto& c = model_->config();
  if (n_layers <= 0) fail(StatusCode::kInvalidArgument, "forward: n_layers must be positive");
  n_layers = std::min(n_layers, c.n_layers);
  const int32_t n = batch.n_rows();
  if (n == 0) return;
  const int32_t n_out = static_cast<int32_t>(batch.logit_rows.size());
  ensure_capacity(n, n_out);

  // The pool's layer groups (core/kv_cache/layer_groups.h): a batch carries
  // one block table per group, or one for all layers (a flat pool).
  const int32_t n_groups = batch.seqs.empty() ? 1 : batch.seqs[0].n_groups;
  const bool grouped = n_groups > 1;
  if (grouped && n_groups != groups_.n_groups()) {
    fail(StatusCode::kInternal, "forward: the batch's block tables do not match the model's layer groups");
  }
  // Physical cache slots and per-sequence attention views, per group.
  std::vector<std::vector<int32_t>> phys_slots(static_cast<size_t>(n_groups), std::vector<int32_t>(n));
  std::vector<std::vector<AttentionSeq>> seqs(static_cast<size_t>(n_groups),
                                              std::vector<AttentionSeq>(batch.seqs.size()));
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const auto& bs = batch.seqs[s];
    if (bs.n_groups != n_groups || bs.block_table.size() % static_cast<size_t>(n_groups) != 0) {
      fail(StatusCode::kInternal, "forward: a sequence's block tables do not match the batch's layer groups");
    }
    const int32_t n_tab = static_cast<int32_t>(bs.block_table.size() / static_cast<size_t>(n_groups));
    for (int32_t g = 0; g < n_groups; ++g) {
      const int32_t* table = bs.block_table.data() + static_cast<size_t>(g) * n_tab;
      seqs[g][s] = AttentionSeq{bs.first_row, bs.n_rows, table, n_tab, bs.hole_begin, bs.hole_end};
      for (int32_t r = bs.first_row; r < bs.first_row + bs.n_rows; ++r) {
        const int32_t logical = batch.slots[r];
        const int32_t b = logical / block_size_;
        if (b < 0 || b >= n_tab || table[b] < 0 || (batch.kv_len[r] + block_size_ - 1) / block_size_ > n_tab) {
          fail(StatusCode::kInternal, "forward: a row's cache slot is not covered by its block table");
        }
        phys_slots[g][r] = table[b] * block_size_ + logical % block_size_;
        if (batch.has_tree() && batch.tree_from[r] >= 0) {
          const int32_t cap = n_tab * block_size_;
          const int32_t from = batch.tree_from[r], n_path = batch.kv_len[r] - from;
          if (from < 0 || n_path < 1 || batch.tree_begin[r] < 0 ||
              static_cast<size_t>(batch.tree_begin[r]) + n_path > batch.tree_slots.size()) {
            fail(StatusCode::kInternal, "forward: a tree row's path is out of range");
          }
          for (int32_t i = 0; i < n_path; ++i) {
            const int32_t t = batch.tree_slots[static_cast<size_t>(batch.tree_begin[r]) + i];
            if (t < 0 || t >= cap || table[t / block_size_] < 0) {
              fail(StatusCode::kInternal, "forward: a tree slot is not covered by its block table");
            }
          }
        }
      }
    }
  }

  AttentionParams ap;
  ap.num_heads = c.n_heads;
  ap.num_kv_heads = c.n_kv_heads;
  ap.head_dim = c.head_dim;
  // With attention_scale the queries are scaled before attention (as
  // llama.cpp's graph does for Gemma) and the softmax takes them as they are.
  ap.scale = c.attention_scale > 0.0f ? 1.0f : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ap.kv_len = batch.kv_len.data();
  ap.decode_rows = batch.decode_rows.size() == static_cast<size_t>(n) ? batch.decode_rows.data() : nullptr;
  if (batch.has_tree()) {
    if (batch.tree_from.size() != static_cast<size_t>(n) || batch.tree_begin.size() != static_cast<size_t>(n)) {
      fail(StatusCode::kInternal, "forward: tree rows out of step with the batch");
    }
    ap.tree_from = batch.tree_from.data();
    ap.tree_begin = batch.tree_begin.data();
    ap.tree_slots = batch.tree_slots.data();
  }
  RopeSpec rope;
  rope.rot_dim = c.rope_dim;
  rope.neox = c.rope_style == RopeStyle::kNeox;
  rope.freq_factors = rope_freqs_.empty() ? nullptr : rope_freqs_.data();
  const bool plain_rope = c.plain_rope();

  // Matmuls run per segment: single-token rows (decodes) together, each
  // multi-token run (a prefill chunk) alone. A row's result then depends only
  // on its own sequence, so a batched sequence computes exactly what it would
  // alone (the matmul kernel is row-independent within one path).
  struct Segment {
    int32_t first, rows;
    bool decodes;
  };
  std::vector<Segment> segments;
  bool prev_single = false;
  for (const auto& bs : batch.seqs) {
    const bool single = bs.n_rows == 1 || bs.decodes;
    if (single && !segments.empty() && prev_single && segments.back().first + segments.back().rows == bs.first_row) {
      segments.back().rows += bs.n_rows;
    } else {
      segments.push_back({bs.first_row, bs.n_rows, single});
    }
    prev_single = single;
  }
  auto matmul = [&](const DeviceWeight& w, const float* in, float* out) {
    const int64_t in_dim = w.desc.cols, out_dim = w.desc.rows;
    for (const auto& seg : segments) {
      backend_.matmul(w, in + seg.first * in_dim, seg.rows, out + seg.first * out_dim, seg.decodes);
    }
  };
  // Weights that read the same input, as one backend call per segment.
  auto matmul_group = [&](std::initializer_list<std::pair<const DeviceWeight*, float*>> group, const float* in) {
    const DeviceWeight* ws[3];
    float* ys[3];
    int32_t g = 0;
    for (const auto& [w, out] : group) ws[g] = w, ys[g++] = out;
    const int64_t in_dim = ws[0]->desc.cols;
    for (const auto& seg : segments) {
      float* outs[3];
      for (int32_t i = 0; i < g; ++i) outs[i] = ys[i] + seg.first * ws[i]->desc.rows;
      backend_.matmul_group(ws, outs, g, in + seg.first * in_dim, seg.rows, seg.decodes);
    }
  };

  const size_t n_embd_all = static_cast<size_t>(n) * c.n_embd;
  backend_.embed(*token_embd_, batch.tokens.data(), n, x_);
  if (c.embd_scale > 0.0f) backend_.scale(x_, n_embd_all, c.embd_scale);
  for (int32_t il = 0; il < n_layers; ++il) {
    const auto& w = layers_[il];
    const bool swa = c.layer_is_swa(il);
    backend_.rms_norm(x_, *w.attn_norm, n, c.n_embd, c.rms_eps, h_);
    matmul_group({{w.wq.get(), q_}, {w.wk.get(), k_}, {w.wv.get(), v_}}, h_);
    if (w.bq) {
      backend_.add_bias(q_, *w.bq, n, c.n_heads * c.head_dim);
      backend_.add_bias(k_, *w.bk, n, c.n_kv_heads * c.head_dim);
      backend_.add_bias(v_, *w.bv, n, c.n_kv_heads * c.head_dim);
    }
    if (w.q_norm) {  // every head's vector is a row of head_dim
      backend_.rms_norm(q_, *w.q_norm, n * c.n_heads, c.head_dim, c.rms_eps, q_);
      backend_.rms_norm(k_, *w.k_norm, n * c.n_kv_heads, c.head_dim, c.rms_eps, k_);
    }
    if (plain_rope) {
      backend_.rope(q_, batch.positions.data(), n, c.n_heads, c.head_dim, c.rope_dim, c.rope_freq_base);
      backend_.rope(k_, batch.positions.data(), n, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_freq_base);
    } else {
      rope.freq_base = c.layer_rope_base(il);
      rope.freq_scale = swa ? 1.0f : c.rope_freq_scale;  // (as Model::rope_spec, which K-shift uses)
      backend_.rope_ext(q_, batch.positions.data(), n, c.n_heads, c.head_dim, rope);
      backend_.rope_ext(k_, batch.positions.data(), n, c.n_kv_heads, c.head_dim, rope);
    }
    if (c.attention_scale > 0.0f)
      backend_.scale(q_, static_cast<size_t>(n) * c.n_heads * c.head_dim, c.attention_scale);
    const int32_t g = grouped ? groups_.group_of_layer[il] : 0;
    const int32_t kv_layer = grouped ? groups_.index_in_group[il] : il;
    if (view_.num_kv_heads > 0) {
      backend_.kv_store_view(view_, kv_layer, k_, v_, phys_slots[g].data(), n);
    } else {
      backend_.kv_store(kv_layer, k_, v_, phys_slots[g].data(), n);
    }
    ap.window = swa ? c.sliding_window : 0;
    backend_.attention(kv_layer, q_, seqs[g].data(), static_cast<int32_t>(seqs[g].size()), ap, attn_);
    matmul(*w.wo, attn_, h_);
    if (w.post_attn_norm) backend_.rms_norm(h_, *w.post_attn_norm, n, c.n_embd, c.rms_eps, h_);
    backend_.add(x_, h_, n_embd_all);
    backend_.rms_norm(x_, *w.ffn_norm, n, c.n_embd, c.rms_eps, h_);
    matmul_group({{w.w_gate.get(), gate_}, {w.w_up.get(), up_}}, h_);
    if (c.ffn_act == FfnActivation::kGelu) {
      backend_.geglu(gate_, up_, static_cast<size_t>(n) * c.n_ff, gate_);
    } else {
      backend_.swiglu(gate_, up_, static_cast<size_t>(n) * c.n_ff, gate_);
    }
    matmul(*w.w_down, gate_, h_);
    if (w.post_ffn_norm) backend_.rms_norm(h_, *w.post_ffn_norm, n, c.n_embd, c.rms_eps, h_);
    backend_.add(x_, h_, n_embd_all);
  }
  if (n_out == 0) return;
  backend_.gather_rows(x_, batch.logit_rows.data(), n_out, c.n_embd, sel_);
  backend_.rms_norm(sel_, *output_norm_, n_out, c.n_embd, c.rms_eps, sel_);
  // Logit rows are one per sequence when generating (decode-like), or every
  // row of one sequence when scoring.
  const bool per_sequence = n_out <= static_cast<int32_t>(batch.seqs.size());
  backend_.matmul(*output_, sel_, n_out, logits_dev_, per_sequence);
  backend_.download(logits, logits_dev_, static_cast<size_t>(n_out) * c.n_vocab * sizeof(float));
}

}  // namespace ember
