#include "core/model/arch/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "core/comm/communicator.h"
#include "core/gguf/gguf.h"
#include "core/util/status.h"

namespace ember {

void load_llama_layer(const TensorGetter& get, const ModelConfig& c, const std::string& p, LayerWeightDescs& l) {
  const int64_t q_dim = static_cast<int64_t>(c.n_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  l.attn_norm = get(p + "attn_norm.weight", c.n_embd, 1, true);
  l.wq = get(p + "attn_q.weight", c.n_embd, q_dim, false);
  l.wk = get(p + "attn_k.weight", c.n_embd, kv_dim, false);
  l.wv = get(p + "attn_v.weight", c.n_embd, kv_dim, false);
  l.wo = get(p + "attn_output.weight", q_dim, c.n_embd, false);
  l.ffn_norm = get(p + "ffn_norm.weight", c.n_embd, 1, true);
  l.w_gate = get(p + "ffn_gate.weight", c.n_embd, c.n_ff, false);
  l.w_up = get(p + "ffn_up.weight", c.n_embd, c.n_ff, false);
  l.w_down = get(p + "ffn_down.weight", c.n_ff, c.n_embd, false);
}

Decoder::Decoder(std::shared_ptr<const Model> model, Backend& backend, int32_t block_size)
    : model_(std::move(model)), backend_(backend), block_size_(block_size), groups_(model_->kv_groups()) {
  // A device backend copies a weight's bytes as it uploads it: pinned (they
  // may have been released by a CPU engine that packed them, gguf.h). The
  // CPU backend reads them in place later and pins what it reads itself.
  const bool reads_at_upload = !backend_.host_memory();
  auto upload = [&](const WeightDesc& d) {
    gguf::ImagePin pin;
    if (reads_at_upload && d.host_data && d.rows > 0)
      pin = gguf::ImagePin(d.host_data, row_bytes(d.type, d.cols) * static_cast<size_t>(d.rows));
    return backend_.upload_weight(d);
  };
  // (A pipeline stage has the embedding only if first, the head only if last.)
  if (model_->token_embd().host_data) token_embd_ = upload(model_->token_embd());
  output_norm_ = upload(model_->output_norm());
  if (model_->output().host_data) output_ = upload(model_->output());
  for (const auto& l : model_->layers()) {
    LayerWeights w;
    w.attn_norm = upload(l.attn_norm);
    w.wq = upload(l.wq);
    w.wk = upload(l.wk);
    w.wv = upload(l.wv);
    w.wo = upload(l.wo);
    w.ffn_norm = upload(l.ffn_norm);
    w.w_gate = upload(l.w_gate);
    w.w_up = upload(l.w_up);
    w.w_down = upload(l.w_down);
    auto optional = [&](const WeightDesc& d) { return d.host_data ? upload(d) : nullptr; };
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

Decoder::~Decoder() { release_buffers(); }

void Decoder::release_buffers() {
  for (float** p :
       {&x_, &h_, &q_, &k_, &v_, &attn_, &gate_, &up_, &sel_, &logits_dev_, &full_in_, &out_part_, &parts_}) {
    if (*p) backend_.free_buffer(*p);
    *p = nullptr;
  }
  capacity_rows_ = capacity_logits_ = 0;
}

void Decoder::ensure_capacity(int32_t rows, int32_t logit_rows) {
  // Host buffers sized for a prompt chunk (SmolLM2: 23 KB a row, 12 MB for
  // 512 rows) go back once kShrinkAfter steps in a row have used a quarter
  // of them or less (decoding after a prompt), down to kKeepRows rows.
  // Device buffers stay: the CUDA backend's graphs hold their addresses.
  constexpr int32_t kKeepRows = 16, kShrinkAfter = 8;
  int32_t keep = 1;
  if (rows <= capacity_rows_ && logit_rows <= capacity_logits_) {
    const bool mostly_idle = capacity_rows_ > kKeepRows && rows <= capacity_rows_ / 4 &&
                             logit_rows <= std::max(capacity_logits_ / 4, 1) && backend_.host_memory();
    small_steps_ = mostly_idle ? small_steps_ + 1 : 0;
    if (small_steps_ < kShrinkAfter) return;
    keep = kKeepRows;
  }
  small_steps_ = 0;
  release_buffers();
  if (keep == kKeepRows) backend_.trim_host_memory();  // once per prompt
  const auto& c = model_->config();
  const size_t r = static_cast<size_t>(std::max(rows, keep));
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
  if (exact_tp()) {
    const size_t tp = static_cast<size_t>(par_.shard.tp), ff = static_cast<size_t>(c.n_ff);
    // A gathered input (all heads, all FFN columns) or output (n_embd).
    const size_t widest = std::max({q_dim * tp, ff * tp, static_cast<size_t>(c.n_embd)});
    full_in_ = f(r * widest);
    out_part_ = f(r * (static_cast<size_t>(c.n_embd) / tp));
    parts_ = f(r * widest);
  }
  capacity_rows_ = static_cast<int32_t>(r);
  capacity_logits_ = static_cast<int32_t>(lr);
}

void Decoder::use_kv_layout(const KvLayerGroups& groups, const KvView* view) {
  if (groups.n_layers() != model_->config().n_layers) {
    fail(StatusCode::kInternal, "forward: KV layer groups for another layer count");
  }
  groups_ = groups;
  view_ = view ? *view : KvView{};
}

void Decoder::forward(const Batch& batch, float* logits, float* embd) {
  run(batch, logits, embd, model_->config().n_layers);
}

void Decoder::prepare(const Batch& batch, Pass& p) {
  const auto& c = model_->config();
  const int32_t n = p.n;
  // The pool's layer groups (core/kv_cache/layer_groups.h): a batch carries
  // one block table per group, or one for all layers (a flat pool).
  const int32_t n_groups = batch.seqs.empty() ? 1 : batch.seqs[0].n_groups;
  p.grouped = n_groups > 1;
  const bool grouped = p.grouped;
  if (grouped && n_groups != groups_.n_groups()) {
    fail(StatusCode::kInternal, "forward: the batch's block tables do not match the model's layer groups");
  }
  // Physical cache slots and per-sequence attention views, per group.
  p.phys_slots.assign(static_cast<size_t>(n_groups), std::vector<int32_t>(n));
  auto& phys_slots = p.phys_slots;
  p.seqs.assign(static_cast<size_t>(n_groups), std::vector<AttentionSeq>(batch.seqs.size()));
  auto& seqs = p.seqs;
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

  AttentionParams& ap = p.ap;
  ap.num_heads = c.n_heads;
  ap.num_kv_heads = c.n_kv_heads;
  ap.head_dim = c.head_dim;
  // (An architecture that scales the queries before attention sets 1.)
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
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
  RopeSpec& rope = p.rope;
  rope.rot_dim = c.rope_dim;
  rope.neox = c.rope_style == RopeStyle::kNeox;
  rope.freq_factors = rope_freqs_.empty() ? nullptr : rope_freqs_.data();

  // LoRA: the rows of each adapter set (sets compared by key: equal sets
  // of different sessions share their terms), their adapters on the backend.
  p.decode.assign(static_cast<size_t>(n), 0);
  for (const auto& bs : batch.seqs) {
    for (int32_t r = bs.first_row; r < bs.first_row + bs.n_rows; ++r) p.decode[r] = decode_row(batch, bs, r);
  }
  p.lora_groups.clear();
  for (const auto& bs : batch.seqs) {
    if (!bs.lora) continue;
    for (int32_t r = bs.first_row; r < bs.first_row + bs.n_rows; ++r) {
      const bool decodes = p.decode[r];
      Pass::LoraGroup* g = nullptr;
      for (auto& e : p.lora_groups) {
        if (e.set->key() == bs.lora->key() && e.decodes == decodes) g = &e;
      }
      if (!g) {
        for (const auto& u : bs.lora->uses()) device_lora(u.adapter);
        p.lora_groups.push_back({bs.lora.get(), decodes, {}});
        g = &p.lora_groups.back();
      }
      g->rows.push_back(r);
    }
  }

  // Matmuls run per segment: decode rows (decode_row) together, each run of
  // a sequence's other rows (a prefill chunk, scored rows) alone. A row's
  // result then depends only on its own token and sequence, so a batched
  // sequence computes exactly what it would alone (the matmul kernel is
  // row-independent within one kind of row).
  auto& segments = p.segments;
  for (const auto& bs : batch.seqs) {
    for (int32_t r = bs.first_row; r < bs.first_row + bs.n_rows; ++r) {
      const bool decodes = p.decode[r];
      Pass::Segment* last = segments.empty() ? nullptr : &segments.back();
      // A sequence's prompt rows extend only its own run.
      const bool same_run =
          last && last->decodes == decodes && last->first + last->rows == r && (decodes || r > bs.first_row);
      if (same_run) {
        ++last->rows;
      } else {
        segments.push_back({r, 1, decodes});
      }
    }
  }
}

// Whether row r (of sequence bs) is computed as a decode: a token the engine
// generated and fed back, or any row of a sequence whose rows are all
// decodes (a verification tree: each row must equal its token's decode).
// Prompt and scored rows are not, however small their chunk: a row's kind
// depends only on its own token, so its results do not depend on how its
// sequence is chunked, batched, found in the prefix cache or recomputed
// after a preemption (the CPU sums the kinds in different orders:
// cpu::RowKind, AttentionParams::decode_rows).
bool Decoder::decode_row(const Batch& batch, const BatchSeq& bs, int32_t r) {
  if (bs.decodes) return true;
  return batch.decode_rows.size() == static_cast<size_t>(batch.n_rows()) && batch.decode_rows[r] != 0;
}

void Decoder::forward_layers(const Batch& batch, float* logits, int32_t n_layers) {
  if (n_layers <= 0) fail(StatusCode::kInvalidArgument, "forward: n_layers must be positive");
  run(batch, logits, nullptr, n_layers);
}

void Decoder::run(const Batch& batch, float* logits, float* embd, int32_t n_layers) {
  const auto& c = model_->config();
  n_layers = std::min(n_layers, c.n_layers);
  const int32_t n = batch.n_rows();
  if (n == 0) return;
  const int32_t n_out = static_cast<int32_t>(batch.logit_rows.size());
  ensure_capacity(n, n_out);
  // Adapters no set holds any more (only this cache does) leave the backend.
  for (auto it = lora_dev_.begin(); it != lora_dev_.end();) {
    it = it->second.adapter.use_count() == 1 ? lora_dev_.erase(it) : std::next(it);
  }
  if (par_.comm) {
    if (n_layers != c.n_layers) fail(StatusCode::kUnsupported, "forward: early exit on a model split across ranks");
    run_split(batch, logits, embd);
    return;
  }
  Pass p;
  p.n = n;
  p.batch = &batch;
  prepare(batch, p);
  backend_.embed(*token_embd_, batch.tokens.data(), n, x_);
  layers(p, n_layers);
  outputs(p, logits, embd);
}

void Decoder::outputs(Pass& p, float* logits, float* embd) {
  const auto& c = model_->config();
  const Batch& batch = *p.batch;
  const int32_t n = p.n;
  const int32_t n_out = static_cast<int32_t>(batch.logit_rows.size());
  const int32_t n_embd_out = static_cast<int32_t>(batch.embd_rows.size());
  if (n_embd_out > 0) {
    if (!embd) fail(StatusCode::kInternal, "forward: embedding rows without an output");
    for (int32_t r : batch.embd_rows) {
      if (r < 0 || r >= n) fail(StatusCode::kInternal, "forward: an embedding row is out of range");
    }
    // The final norm of the wanted rows (h_ is free once the layers are done).
    backend_.gather_rows(x_, batch.embd_rows.data(), n_embd_out, c.n_embd, h_);
    backend_.rms_norm(h_, *output_norm_, n_embd_out, c.n_embd, c.rms_eps, h_);
    backend_.download(embd, h_, static_cast<size_t>(n_embd_out) * c.n_embd * sizeof(float));
  }
  if (n_out == 0) return;
  // The head computes a row a token is sampled from, and every decode row,
  // as a decode; scored rows (BatchSeq::scores) as prompt rows. Either way
  // a row's kind depends only on what it is for, not on its chunk. The
  // decode rows go first, the logits back in output order at the end.
  head_kind_.assign(static_cast<size_t>(n), 1);
  for (const auto& bs : batch.seqs) {
    for (int32_t r = bs.first_row; r < bs.first_row + bs.n_rows; ++r) head_kind_[r] = p.decode[r] || !bs.scores;
  }
  int32_t n_decode = 0;
  head_rows_.clear();
  for (const bool decodes : {true, false}) {
    for (int32_t i = 0; i < n_out; ++i) {
      const int32_t r = batch.logit_rows[i];
      if (r < 0 || r >= n) fail(StatusCode::kInternal, "forward: a logit row is out of range");
      if (static_cast<bool>(head_kind_[r]) == decodes) head_rows_.push_back(i);
    }
    if (decodes) n_decode = static_cast<int32_t>(head_rows_.size());
  }
  bool reordered = false;
  for (int32_t i = 0; i < n_out; ++i) reordered |= head_rows_[i] != i;
  head_src_.resize(n_out);
  for (int32_t i = 0; i < n_out; ++i) head_src_[i] = batch.logit_rows[head_rows_[i]];
  backend_.gather_rows(x_, head_src_.data(), n_out, c.n_embd, sel_);
  backend_.rms_norm(sel_, *output_norm_, n_out, c.n_embd, c.rms_eps, sel_);
  const int64_t vocab_rows = output_->desc.rows;
  if (n_decode > 0) backend_.matmul(*output_, sel_, n_decode, logits_dev_, true);
  if (n_decode < n_out) {
    backend_.matmul(*output_, sel_ + static_cast<size_t>(n_decode) * c.n_embd, n_out - n_decode,
                    logits_dev_ + static_cast<size_t>(n_decode) * vocab_rows, false);
  }
  head_logits(logits, n_out);
  if (!reordered) return;
  // Back to output order: sorted row i is output row head_rows_[i].
  const size_t V = static_cast<size_t>(c.n_vocab);
  head_tmp_.assign(logits, logits + static_cast<size_t>(n_out) * V);
  for (int32_t i = 0; i < n_out; ++i) {
    std::memcpy(logits + static_cast<size_t>(head_rows_[i]) * V, &head_tmp_[static_cast<size_t>(i) * V],
                V * sizeof(float));
  }
}

// The head's n_out rows of logits (logits_dev_, this rank's vocabulary rows)
// to the host; in a tensor-parallel split, to the group's rank 0 alone (rank
// 0 of the job, which samples, or with pipeline stages the last stage's
// first rank, which sends them on); the other ranks' logits are never read.
void Decoder::head_logits(float* logits, int32_t n_out) {
  const auto& c = model_->config();
  const ModelShard& sh = par_.shard;
  if (!par_.comm || sh.tp == 1) {
    backend_.download(logits, logits_dev_, static_cast<size_t>(n_out) * c.n_vocab * sizeof(float));
    return;
  }
  // Rank q holds vocabulary rows [q * per, min(V, (q + 1) * per)); each
  // rank but 0 sends its n_out x len rows to rank 0, which lays them out by
  // row. Point to point: nothing of the vocabulary-wide rows reaches the
  // other ranks (an all-gather would send each of them all of it).
  const size_t per = static_cast<size_t>((c.n_vocab + sh.tp - 1) / sh.tp);
  const size_t rows = static_cast<size_t>(n_out), V = static_cast<size_t>(c.n_vocab);
  constexpr int kLogitsTag = (1 << 20) + 2;  // (the pipeline's outputs use 1 << 20 and + 1)
  if (sh.tp_rank != 0) {
    const size_t local = static_cast<size_t>(sh.vocab_end - sh.vocab_begin);
    scratch_.resize(rows * local);
    backend_.download(scratch_.data(), logits_dev_, scratch_.size() * sizeof(float));
    par_.tp_comm->send(scratch_.data(), scratch_.size() * sizeof(float), 0, kLogitsTag);
    return;
  }
  for (size_t q = 0; q < static_cast<size_t>(sh.tp); ++q) {
    const size_t begin = q * per, len = std::min(per, V - std::min(V, begin));
    scratch_.resize(rows * len);
    if (q == 0) {
      backend_.download(scratch_.data(), logits_dev_, scratch_.size() * sizeof(float));
    } else if (len > 0) {
      par_.tp_comm->recv(scratch_.data(), scratch_.size() * sizeof(float), static_cast<int>(q), kLogitsTag);
    }
    for (size_t r = 0; r < rows; ++r) std::memcpy(logits + r * V + begin, &scratch_[r * len], len * sizeof(float));
  }
}

// ------------------------------------------------------------------ split across ranks

void Decoder::set_parallel(const ParallelContext& ctx) {
  const ModelShard& sh = model_->shard_spec();
  if (ctx.comm && (ctx.shard.tp != sh.tp || ctx.shard.pp != sh.pp || ctx.shard.tp_rank != sh.tp_rank ||
                   ctx.shard.pp_rank != sh.pp_rank)) {
    fail(StatusCode::kInternal, "forward: the parallel context is not this model's shard");
  }
  par_ = ctx;
  par_.shard = sh;
  if (par_.comm && !par_.tp_comm) par_.tp_comm = par_.comm;
  if (par_.comm && sh.tp > 1 && par_.tp_comm->size() != sh.tp) {
    fail(StatusCode::kInternal, "forward: the tensor-parallel group's size is not this model's tp");
  }
  host_buffers_ = backend_.host_memory();
}

void Decoder::all_reduce(float* buf, size_t n) {
  if (!par_.comm || par_.shard.tp == 1) return;
  if (host_buffers_ || par_.tp_comm->device_buffers()) {  // (NCCL takes device memory as it is)
    par_.tp_comm->all_reduce_sum(buf, n);
    return;
  }
  scratch_.resize(n);
  backend_.download(scratch_.data(), buf, n * sizeof(float));
  par_.tp_comm->all_reduce_sum(scratch_.data(), n);
  backend_.upload(buf, scratch_.data(), n * sizeof(float));
}

void Decoder::gather_parts(const float* part, int32_t rows, int32_t dim, float* full) {
  const int32_t tp = par_.shard.tp;
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(dim);
  if (host_buffers_ || par_.tp_comm->device_buffers()) {
    par_.tp_comm->all_gather(part, n * sizeof(float), parts_);
  } else {
    scratch_.resize(n);
    gathered_.resize(n * static_cast<size_t>(tp));
    backend_.download(scratch_.data(), part, n * sizeof(float));
    par_.tp_comm->all_gather(scratch_.data(), n * sizeof(float), gathered_.data());
    backend_.upload(parts_, gathered_.data(), gathered_.size() * sizeof(float));
  }
  // parts_ is [rank][row][dim]; full rows are [row][rank][dim]: one copy of
  // rows of `dim` values each.
  gather_index_.resize(static_cast<size_t>(rows) * static_cast<size_t>(tp));
  for (int32_t b = 0; b < rows; ++b) {
    for (int32_t q = 0; q < tp; ++q) gather_index_[static_cast<size_t>(b) * tp + q] = q * rows + b;
  }
  backend_.gather_rows(parts_, gather_index_.data(), rows * tp, dim, full);
}

void Decoder::exact_matmul(Pass& p, const DeviceWeight& w, const float* part, int32_t part_dim) {
  const int32_t out_dim = model_->config().n_embd / par_.shard.tp;
  gather_parts(part, p.n, part_dim, full_in_);  // the input of one rank: every head / FFN column
  matmul(p, w, full_in_, out_part_);            // this rank's outputs, whole dot products
  gather_parts(out_part_, p.n, out_dim, h_);    // every rank's outputs
}

void Decoder::send_rows(const float* buf, size_t n, int peer, int tag) {
  if (host_buffers_ || par_.comm->device_buffers()) return par_.comm->send(buf, n * sizeof(float), peer, tag);
  scratch_.resize(n);
  backend_.download(scratch_.data(), buf, n * sizeof(float));
  par_.comm->send(scratch_.data(), n * sizeof(float), peer, tag);
}

void Decoder::recv_rows(float* buf, size_t n, int peer, int tag) {
  if (host_buffers_ || par_.comm->device_buffers()) return par_.comm->recv(buf, n * sizeof(float), peer, tag);
  scratch_.resize(n);
  par_.comm->recv(scratch_.data(), n * sizeof(float), peer, tag);
  backend_.upload(buf, scratch_.data(), n * sizeof(float));
}

void Decoder::embed_split(Pass& p) {
  const auto& c = model_->config();
  const ModelShard& sh = par_.shard;
  const int32_t* ids = p.batch->tokens.data();
  local_ids_.resize(static_cast<size_t>(p.n));
  for (int32_t r = 0; r < p.n; ++r) {
    if (ids[r] < 0 || ids[r] >= c.n_vocab) fail(StatusCode::kInvalidArgument, "forward: token id out of range");
    local_ids_[r] = ids[r] >= sh.vocab_begin && ids[r] < sh.vocab_end ? ids[r] - sh.vocab_begin : 0;
  }
  backend_.embed(*token_embd_, local_ids_.data(), p.n, x_);
  // Rows of tokens another rank holds are zero here (x * 0: exact), so the
  // sum over the ranks is each token's row, bit for bit.
  for (int32_t r = 0; r < p.n; ++r) {
    if (ids[r] < sh.vocab_begin || ids[r] >= sh.vocab_end)
      backend_.scale(x_ + static_cast<size_t>(r) * c.n_embd, c.n_embd, 0.0f);
  }
  all_reduce(x_, static_cast<size_t>(p.n) * c.n_embd);
}

namespace {

// Sequences [s0, s1) of `b` as a batch of their own (rows renumbered).
void slice_batch(const Batch& b, size_t s0, size_t s1, Batch& out) {
  out.clear();
  const int32_t r0 = b.seqs[s0].first_row;
  const int32_t r1 = b.seqs[s1 - 1].first_row + b.seqs[s1 - 1].n_rows;
  auto rows = [&](const std::vector<int32_t>& v) { return std::vector<int32_t>(v.begin() + r0, v.begin() + r1); };
  out.tokens = rows(b.tokens);
  out.positions = rows(b.positions);
  out.slots = rows(b.slots);
  out.kv_len = rows(b.kv_len);
  out.seq_of_row = rows(b.seq_of_row);
  for (auto& s : out.seq_of_row) s -= static_cast<int32_t>(s0);
  out.decode_rows.assign(b.decode_rows.begin() + r0, b.decode_rows.begin() + r1);
  out.seqs.assign(b.seqs.begin() + static_cast<std::ptrdiff_t>(s0), b.seqs.begin() + static_cast<std::ptrdiff_t>(s1));
  for (auto& s : out.seqs) s.first_row -= r0;
  for (int32_t r : b.logit_rows) {
    if (r >= r0 && r < r1) out.logit_rows.push_back(r - r0);
  }
  for (int32_t r : b.embd_rows) {
    if (r >= r0 && r < r1) out.embd_rows.push_back(r - r0);
  }
}

// Where a pipeline step cuts its batch: sequence boundaries giving up to
// `parts` runs of about equal rows (one run when the output rows are not in
// row order, which cutting needs).
std::vector<size_t> micro_batch_cuts(const Batch& b, int32_t parts) {
  std::vector<size_t> cuts{0};
  const size_t n_seqs = b.seqs.size();
  if (!std::is_sorted(b.logit_rows.begin(), b.logit_rows.end()) ||
      !std::is_sorted(b.embd_rows.begin(), b.embd_rows.end()) || b.has_tree()) {
    parts = 1;
  }
  parts = std::max(1, std::min<int32_t>(parts, static_cast<int32_t>(n_seqs)));
  const int64_t total = b.n_rows();
  for (int32_t k = 1; k < parts; ++k) {
    const int64_t target = total * k / parts;
    size_t s = cuts.back() + 1;
    while (s < n_seqs && b.seqs[s].first_row < target) ++s;
    if (s < n_seqs && s > cuts.back() && n_seqs - s >= static_cast<size_t>(parts - k)) cuts.push_back(s);
  }
  cuts.push_back(n_seqs);
  return cuts;
}

}  // namespace

void Decoder::run_split(const Batch& batch, float* logits, float* embd) {
  const auto& c = model_->config();
  const ModelShard& sh = par_.shard;
  for (const auto& s : batch.seqs) {
    if (s.lora)
      fail(StatusCode::kUnsupported, "forward: LoRA adapters on a model split across ranks are not supported yet");
  }
  if (sh.pp == 1) {  // tensor parallel
    Pass p;
    p.n = batch.n_rows();
    p.batch = &batch;
    prepare(batch, p);
    embed_split(p);
    layers(p, c.n_layers);
    outputs(p, logits, embd);
    return;
  }
  // Pipeline parallel: the batch in micro-batches, so that stage k works on
  // micro-batch i while stage k + 1 works on i - 1. Ranks are stage-major
  // (rank = pp_rank * tp + tp_rank): each rank sends its rows to the same
  // tensor-parallel rank of the next stage (every rank of a stage has them
  // all), and the last stage's first rank sends the outputs to rank 0.
  const int prev = (sh.pp_rank - 1) * sh.tp + sh.tp_rank, next = (sh.pp_rank + 1) * sh.tp + sh.tp_rank,
            last = (sh.pp - 1) * sh.tp;
  const std::vector<size_t> cuts = micro_batch_cuts(batch, par_.micro_batches > 0 ? par_.micro_batches : sh.pp);
  const size_t n_embd = static_cast<size_t>(c.n_embd), V = static_cast<size_t>(c.n_vocab);
  size_t out_row = 0, embd_row = 0;
  Batch mb;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const bool whole = cuts.size() == 2;
    if (!whole) slice_batch(batch, cuts[i], cuts[i + 1], mb);
    const Batch& b = whole ? batch : mb;
    Pass p;
    p.n = b.n_rows();
    p.batch = &b;
    prepare(b, p);
    const int tag = static_cast<int>(i);
    if (sh.first_stage() && sh.tp > 1) {
      embed_split(p);
    } else if (sh.first_stage()) {
      backend_.embed(*token_embd_, b.tokens.data(), p.n, x_);
    } else {
      recv_rows(x_, static_cast<size_t>(p.n) * n_embd, prev, tag);
    }
    layers(p, c.n_layers);
    if (!sh.last_stage()) {
      send_rows(x_, static_cast<size_t>(p.n) * n_embd, next, tag);
    } else {
      outputs(p, logits + out_row * V, embd ? embd + embd_row * n_embd : nullptr);
    }
    out_row += b.logit_rows.size();
    embd_row += b.embd_rows.size();
  }
  // Rank 0 (which samples) gets the outputs from the last stage; sent once
  // at the end, so no stage ever waits on a send while its peer sends too.
  const size_t n_logits = batch.logit_rows.size() * V, n_embds = batch.embd_rows.size() * n_embd;
  constexpr int kOutputs = 1 << 20;
  if (sh.last_stage() && sh.tp_rank == 0) {
    if (n_logits) par_.comm->send(logits, n_logits * sizeof(float), 0, kOutputs);
    if (n_embds) par_.comm->send(embd, n_embds * sizeof(float), 0, kOutputs + 1);
  } else if (sh.pp_rank == 0 && sh.tp_rank == 0) {
    if (n_logits) par_.comm->recv(logits, n_logits * sizeof(float), last, kOutputs);
    if (n_embds) par_.comm->recv(embd, n_embds * sizeof(float), last, kOutputs + 1);
  }
}

// ------------------------------------------------------------------ blocks

const Decoder::DeviceLora& Decoder::device_lora(const std::shared_ptr<const LoraAdapter>& adapter) {
  auto it = lora_dev_.find(adapter.get());
  if (it != lora_dev_.end()) return it->second;
  if (!adapter->fits(*model_)) {
    fail(StatusCode::kInvalidArgument, "lora: adapter '" + adapter->path() + "' was made for another model");
  }
  DeviceLora d;
  d.adapter = adapter;
  const int32_t n_layers = model_->config().n_layers;
  d.a.resize(static_cast<size_t>(n_layers) * kLoraLayerTargets);
  d.b.resize(d.a.size());
  for (int32_t il = 0; il < n_layers; ++il) {
    for (int32_t t = 0; t < kLoraLayerTargets; ++t) {
      const LoraAdapter::Pair* pair = adapter->find(il, static_cast<LoraTarget>(t));
      if (!pair) continue;
      const size_t i = static_cast<size_t>(il) * kLoraLayerTargets + static_cast<size_t>(t);
      d.a[i] = backend_.upload_weight(pair->a);
      d.b[i] = backend_.upload_weight(pair->b);
    }
  }
  return lora_dev_.emplace(adapter.get(), std::move(d)).first->second;
}

void Decoder::lora(Pass& p, int32_t il, std::initializer_list<std::pair<LoraTarget, float*>> outs, const float* in) {
  if (p.lora_groups.empty()) return;
  auto& terms = p.lora_terms;
  terms.clear();
  for (const auto& [t, out] : outs) {
    const size_t slot = static_cast<size_t>(il) * kLoraLayerTargets + static_cast<size_t>(t);
    for (const auto& g : p.lora_groups) {
      for (const auto& u : g.set->uses()) {
        const LoraAdapter::Pair* pair = u.adapter->find(il, t);
        if (!pair) continue;
        const DeviceLora& d = lora_dev_.at(u.adapter.get());
        terms.push_back(LoraTerm{d.a[slot].get(), d.b[slot].get(), u.scale * pair->alpha_scale, g.rows.data(),
                                 static_cast<int32_t>(g.rows.size()), g.decodes, out});
      }
    }
  }
  if (!terms.empty()) backend_.lora(terms.data(), static_cast<int32_t>(terms.size()), in, nullptr);
}

void Decoder::matmul(Pass& p, const DeviceWeight& w, const float* in, float* out) {
  const int64_t in_dim = w.desc.cols, out_dim = w.desc.rows;
  for (const auto& seg : p.segments) {
    backend_.matmul(w, in + seg.first * in_dim, seg.rows, out + seg.first * out_dim, seg.decodes);
  }
}

namespace {
// Weights that read the same input, as one backend call per segment.
template <typename Segments>
void matmul_group(Backend& backend, const Segments& segments,
                  std::initializer_list<std::pair<const DeviceWeight*, float*>> group, const float* in) {
  const DeviceWeight* ws[3];
  float* ys[3];
  int32_t g = 0;
  for (const auto& [w, out] : group) ws[g] = w, ys[g++] = out;
  const int64_t in_dim = ws[0]->desc.cols;
  for (const auto& seg : segments) {
    float* outs[3];
    for (int32_t i = 0; i < g; ++i) outs[i] = ys[i] + seg.first * ws[i]->desc.rows;
    backend.matmul_group(ws, outs, g, in + seg.first * in_dim, seg.rows, seg.decodes);
  }
}
}  // namespace

void Decoder::norm(Pass& p, const DeviceWeight& w, const float* in, float* out) {
  const auto& c = model_->config();
  backend_.rms_norm(in, w, p.n, c.n_embd, c.rms_eps, out);
}

void Decoder::scale_x(Pass& p, float s) { backend_.scale(x_, static_cast<size_t>(p.n) * model_->config().n_embd, s); }

void Decoder::qkv(Pass& p, const LayerWeights& w) {
  matmul_group(backend_, p.segments, {{w.wq.get(), q_}, {w.wk.get(), k_}, {w.wv.get(), v_}}, h_);
  const int32_t il = layer_index(w);
  lora(p, il, {{LoraTarget::kQ, q_}, {LoraTarget::kK, k_}, {LoraTarget::kV, v_}}, h_);
}

void Decoder::qkv_bias(Pass& p, const LayerWeights& w) {
  const auto& c = model_->config();
  backend_.add_bias(q_, *w.bq, p.n, c.n_heads * c.head_dim);
  backend_.add_bias(k_, *w.bk, p.n, c.n_kv_heads * c.head_dim);
  backend_.add_bias(v_, *w.bv, p.n, c.n_kv_heads * c.head_dim);
}

void Decoder::qk_norm(Pass& p, const LayerWeights& w) {
  const auto& c = model_->config();
  // Every head's vector is a row of head_dim.
  backend_.rms_norm(q_, *w.q_norm, p.n * c.n_heads, c.head_dim, c.rms_eps, q_);
  backend_.rms_norm(k_, *w.k_norm, p.n * c.n_kv_heads, c.head_dim, c.rms_eps, k_);
}

void Decoder::rope(Pass& p, float base, float freq_scale) {
  const auto& c = model_->config();
  const int32_t* pos = p.batch->positions.data();
  if (c.plain_rope()) {
    backend_.rope(q_, pos, p.n, c.n_heads, c.head_dim, c.rope_dim, c.rope_freq_base);
    backend_.rope(k_, pos, p.n, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_freq_base);
  } else {
    p.rope.freq_base = base;
    p.rope.freq_scale = freq_scale;  // (as Model::rope_spec, which K-shift uses)
    backend_.rope_ext(q_, pos, p.n, c.n_heads, c.head_dim, p.rope);
    backend_.rope_ext(k_, pos, p.n, c.n_kv_heads, c.head_dim, p.rope);
  }
}

void Decoder::scale_q(Pass& p, float s) {
  const auto& c = model_->config();
  backend_.scale(q_, static_cast<size_t>(p.n) * c.n_heads * c.head_dim, s);
}

void Decoder::attention(Pass& p, int32_t il, const LayerWeights& w, int32_t window) {
  const int32_t g = p.grouped ? groups_.group_of_layer[il] : 0;
  const int32_t kv_layer = p.grouped ? groups_.index_in_group[il] : il;
  if (view_.num_kv_heads > 0) {
    backend_.kv_store_view(view_, kv_layer, k_, v_, p.phys_slots[g].data(), p.n);
  } else {
    backend_.kv_store(kv_layer, k_, v_, p.phys_slots[g].data(), p.n);
  }
  p.ap.window = window;
  backend_.attention(kv_layer, q_, p.seqs[g].data(), static_cast<int32_t>(p.seqs[g].size()), p.ap, attn_);
  if (exact_tp()) return exact_matmul(p, *w.wo, attn_, model_->config().n_heads * model_->config().head_dim);
  matmul(p, *w.wo, attn_, h_);
  lora(p, il, {{LoraTarget::kO, h_}}, attn_);
  all_reduce(h_, static_cast<size_t>(p.n) * model_->config().n_embd);  // row parallel: partial sums
}

void Decoder::residual(Pass& p) { backend_.add(x_, h_, static_cast<size_t>(p.n) * model_->config().n_embd); }

void Decoder::glu_ffn(Pass& p, const LayerWeights& w, bool gelu) {
  const size_t n_ff = static_cast<size_t>(p.n) * model_->config().n_ff;
  matmul_group(backend_, p.segments, {{w.w_gate.get(), gate_}, {w.w_up.get(), up_}}, h_);
  const int32_t il = layer_index(w);
  lora(p, il, {{LoraTarget::kGate, gate_}, {LoraTarget::kUp, up_}}, h_);
  if (gelu) {
    backend_.geglu(gate_, up_, n_ff, gate_);
  } else {
    backend_.swiglu(gate_, up_, n_ff, gate_);
  }
  if (exact_tp()) return exact_matmul(p, *w.w_down, gate_, model_->config().n_ff);
  matmul(p, *w.w_down, gate_, h_);
  lora(p, il, {{LoraTarget::kDown, h_}}, gate_);
  all_reduce(h_, static_cast<size_t>(p.n) * model_->config().n_embd);  // row parallel: partial sums
}

void Decoder::llama_layer(Pass& p, int32_t il, bool bias, bool head_norm) {
  const auto& c = model_->config();
  const LayerWeights& w = layers_[static_cast<size_t>(il)];
  norm(p, *w.attn_norm, x_, h_);
  qkv(p, w);
  if (bias) qkv_bias(p, w);
  if (head_norm) qk_norm(p, w);
  rope(p, c.rope_freq_base, c.rope_freq_scale);
  attention(p, il, w, 0);
  residual(p);
  norm(p, *w.ffn_norm, x_, h_);
  glu_ffn(p, w, /*gelu=*/false);
  residual(p);
}

}  // namespace ember
