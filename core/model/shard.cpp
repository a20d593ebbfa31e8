// Model::shard: the part of a model one rank of a tensor- or pipeline-parallel
// split holds (ModelShard in model.h). Column-parallel matrices (output rows)
// are views into the parent's weights; row-parallel ones (input columns) are
// copied, one contiguous run of whole quantization blocks per row.
#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "core/chat/chat_template.h"
#include "core/gguf/gguf.h"
#include "core/model/model.h"
#include "core/tensor/types.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"

namespace ember {

namespace {

[[noreturn]] void refuse(const std::string& why) { fail(StatusCode::kUnsupported, "model parallel: " + why); }

size_t bytes_per_row(const WeightDesc& w) { return row_bytes(w.type, w.cols); }

// Output rows [r0, r0 + n) of w: a view.
WeightDesc rows_of(const WeightDesc& w, int64_t r0, int64_t n) {
  WeightDesc out = w;
  out.rows = n;
  out.host_data = static_cast<const uint8_t*>(w.host_data) + static_cast<size_t>(r0) * bytes_per_row(w);
  return out;
}

// Elements [c0, c0 + n) of a one-row f32 vector (a bias): a view.
WeightDesc bias_part(const WeightDesc& w, int64_t c0, int64_t n) {
  if (!w.host_data) return w;
  WeightDesc out = w;
  out.cols = n;
  out.host_data = static_cast<const float*>(w.host_data) + c0;
  return out;
}

}  // namespace

std::pair<int32_t, int32_t> pipeline_stage_layers(int32_t n_layers, int32_t pp, int32_t stage) {
  // As even as possible, earlier stages one layer more.
  const int32_t base = n_layers / pp, extra = n_layers % pp;
  return {stage * base + std::min(stage, extra), base + (stage < extra ? 1 : 0)};
}

std::shared_ptr<const Model> Model::shard(std::shared_ptr<const Model> full, const ModelShard& spec) {
  if (!full) fail(StatusCode::kInvalidArgument, "model parallel: no model");
  if (full->parent_) fail(StatusCode::kInvalidArgument, "model parallel: the model is already a shard");
  const ModelConfig& c = full->config_;
  const int32_t tp = spec.tp, pp = spec.pp;
  if (tp < 1 || pp < 1 || tp > 64 || pp > 64) refuse("tp and pp must be in [1, 64]");
  if (spec.tp_rank < 0 || spec.tp_rank >= tp || spec.pp_rank < 0 || spec.pp_rank >= pp) refuse("rank out of range");

  std::shared_ptr<Model> m(new Model());
  m->parent_ = full;
  m->fingerprint_ = full->fingerprint_;
  m->architecture_ = full->architecture_;
  m->name_ = full->name_;
  m->config_ = c;
  m->n_params_ = full->n_params_;
  m->output_norm_ = full->output_norm_;
  m->rope_freqs_ = full->rope_freqs_;
  ModelShard& sh = m->shard_;
  sh = spec;
  ModelConfig& mc = m->config_;

  // ---- pipeline: this stage's layers
  if (pp > 1) {
    if (c.n_layers < pp)
      refuse(std::to_string(c.n_layers) + " layers cannot be split into " + std::to_string(pp) + " stages");
    std::tie(sh.first_layer, sh.n_layers) = pipeline_stage_layers(c.n_layers, pp, spec.pp_rank);
  } else {
    sh.first_layer = 0;
    sh.n_layers = c.n_layers;
  }
  sh.model_layers = c.n_layers;
  mc.n_layers = sh.n_layers;
  if (!c.is_swa.empty()) {
    mc.is_swa.assign(c.is_swa.begin() + sh.first_layer, c.is_swa.begin() + sh.first_layer + sh.n_layers);
  }
  m->layers_.assign(full->layers_.begin() + sh.first_layer, full->layers_.begin() + sh.first_layer + sh.n_layers);
  sh.vocab_begin = 0;
  sh.vocab_end = c.n_vocab;
  m->token_embd_ = sh.first_stage() ? full->token_embd_ : WeightDesc{};
  m->output_ = sh.last_stage() ? full->output_ : WeightDesc{};
  if (tp == 1) return m;

  // ---- tensor parallel: heads, FFN columns, vocabulary rows
  const int32_t r = spec.tp_rank;
  if (c.n_heads % tp != 0) {
    refuse("attention.head_count " + std::to_string(c.n_heads) + " is not divisible by tp " + std::to_string(tp));
  }
  if (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0) {
    refuse("attention.head_count_kv " + std::to_string(c.n_kv_heads) + " and tp " + std::to_string(tp) +
           " do not divide one another");
  }
  if (c.n_ff % tp != 0) {
    refuse("feed_forward_length " + std::to_string(c.n_ff) + " is not divisible by tp " + std::to_string(tp));
  }
  const int32_t heads = c.n_heads / tp;
  const int32_t head0 = r * heads;
  // KV heads: split like the query heads, or (fewer KV heads than ranks) the
  // one KV head this rank's query heads read, replicated on tp / n_kv ranks.
  const int32_t group = c.n_heads / c.n_kv_heads;  // query heads per KV head
  const int32_t kv_heads = c.n_kv_heads >= tp ? c.n_kv_heads / tp : 1;
  const int32_t kv0 = c.n_kv_heads >= tp ? r * kv_heads : head0 / group;
  if (c.n_kv_heads < tp && heads > group) refuse("a rank's query heads would read more than one replicated KV head");
  const int32_t ff = c.n_ff / tp, ff0 = r * ff;
  mc.n_heads = heads;
  mc.n_kv_heads = kv_heads;
  mc.n_ff = ff;
  const int64_t hd = c.head_dim;

  // Input columns [c0, c0 + n) of every row: copied.
  auto cols_of = [&](const WeightDesc& w, int64_t c0, int64_t n, const char* what) {
    const TypeTraits* t = type_traits(w.type);
    if (!t || c0 % t->block_size != 0 || n % t->block_size != 0) {
      refuse(std::string(what) + ": a rank's " + std::to_string(n) + " input columns are not whole " +
             type_name(static_cast<uint32_t>(w.type)) + " blocks of " + std::to_string(t ? t->block_size : 0));
    }
    const size_t src_row = bytes_per_row(w), off = row_bytes(w.type, c0), len = row_bytes(w.type, n);
    auto buf = std::make_unique<uint8_t[]>(len * static_cast<size_t>(w.rows));
    gguf::ImagePin pin(w.host_data, src_row * static_cast<size_t>(w.rows));  // (pages another engine released)
    for (int64_t i = 0; i < w.rows; ++i) {
      std::memcpy(buf.get() + static_cast<size_t>(i) * len,
                  static_cast<const uint8_t*>(w.host_data) + static_cast<size_t>(i) * src_row + off, len);
    }
    // The whole matrix was read for this rank's columns: its pages leave
    // this process again (the copy is what is used; gguf.h).
    pin.reset();
    gguf::release_image_pages(w.host_data, src_row * static_cast<size_t>(w.rows));
    WeightDesc out = w;
    out.cols = n;
    out.host_data = buf.get();
    m->owned_.push_back(std::move(buf));
    return out;
  };
  if (spec.exact && c.n_embd % tp != 0) {
    refuse("embedding_length " + std::to_string(c.n_embd) + " is not divisible by tp " + std::to_string(tp) +
           " (the exact split gives each rank n_embd / tp output rows of attn_output and ffn_down)");
  }
  const int64_t out_rows = c.n_embd / tp, out0 = static_cast<int64_t>(r) * out_rows;
  for (auto& l : m->layers_) {
    l.wq = rows_of(l.wq, head0 * hd, heads * hd);
    l.wk = rows_of(l.wk, kv0 * hd, kv_heads * hd);
    l.wv = rows_of(l.wv, kv0 * hd, kv_heads * hd);
    l.bq = bias_part(l.bq, head0 * hd, heads * hd);
    l.bk = bias_part(l.bk, kv0 * hd, kv_heads * hd);
    l.bv = bias_part(l.bv, kv0 * hd, kv_heads * hd);
    l.w_gate = rows_of(l.w_gate, ff0, ff);
    l.w_up = rows_of(l.w_up, ff0, ff);
    if (spec.exact) {  // output rows, every input column: views
      l.wo = rows_of(l.wo, out0, out_rows);
      l.w_down = rows_of(l.w_down, out0, out_rows);
    } else {
      l.wo = cols_of(l.wo, head0 * hd, heads * hd, "attn_output");
      l.w_down = cols_of(l.w_down, ff0, ff, "ffn_down");
    }
  }
  // Vocabulary rows (an embedding lookup and the output head's rows).
  const int32_t per = (c.n_vocab + tp - 1) / tp;
  sh.vocab_begin = std::min(c.n_vocab, r * per);
  sh.vocab_end = std::min(c.n_vocab, (r + 1) * per);
  if (sh.vocab_end <= sh.vocab_begin) refuse("the vocabulary is too small to split " + std::to_string(tp) + " ways");
  // (With pipeline stages: the embedding on the first, the head on the last.)
  if (sh.first_stage()) m->token_embd_ = rows_of(full->token_embd_, sh.vocab_begin, sh.vocab_end - sh.vocab_begin);
  if (sh.last_stage()) m->output_ = rows_of(full->output_, sh.vocab_begin, sh.vocab_end - sh.vocab_begin);
  return m;
}

}  // namespace ember
