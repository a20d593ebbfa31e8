#include "core/model/model.h"

#include <malloc.h>

#include <cmath>

#include "core/chat/chat_template.h"
#include "core/gguf/gguf.h"
#include "core/model/arch/registry.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/hash.h"
#include "core/util/log.h"
#include "core/util/status.h"

namespace ember {

Model::~Model() = default;

// (A shard's are its whole model's.)
const Tokenizer& Model::tokenizer() const { return parent_ ? parent_->tokenizer() : *tokenizer_; }
const ChatTemplate* Model::chat_template() const { return parent_ ? parent_->chat_template() : chat_template_.get(); }

std::shared_ptr<Model> Model::load(const std::string& path, Weights weights) {
  std::shared_ptr<Model> m(new Model());
  m->file_ = gguf::GgufFile::open(path, weights == Weights::kSharedMapping ? gguf::GgufFile::Residency::kSharedMapping
                                                                           : gguf::GgufFile::Residency::kPrivateCopy);
  m->load_config();
  m->load_weights();
  m->tokenizer_ = Tokenizer::from_gguf(*m->file_);
  if (m->tokenizer_->n_vocab() != m->config_.n_vocab) {
    fail(StatusCode::kBadFormat, "model: tokenizer has " + std::to_string(m->tokenizer_->n_vocab()) +
                                     " tokens but token_embd has " + std::to_string(m->config_.n_vocab) + " rows");
  }
  if (auto tmpl = m->file_->get_string("tokenizer.chat_template")) {
    try {
      m->chat_template_ = std::make_unique<ChatTemplate>(ChatTemplate::parse(*tmpl));
    } catch (const Error& e) {
      m->chat_template_error_ = std::string("the model's chat template cannot be applied: ") + e.what();
      log(LogLevel::kWarn, "%s", m->chat_template_error_.c_str());
    }
  } else if (const char* builtin = find_architecture(m->architecture_)->default_chat_template) {
    // As llama.cpp does for a file without one: the architecture's known template.
    m->chat_template_ = std::make_unique<ChatTemplate>(ChatTemplate::parse(builtin));
    log(LogLevel::kInfo, "model: no tokenizer.chat_template in the file; using the %s template",
        m->architecture_.c_str());
  } else {
    m->chat_template_error_ = "the model has no chat template (tokenizer.chat_template)";
  }
  m->fingerprint_ = m->compute_fingerprint();
  // Everything read from the metadata is built: its parsed form goes (the
  // vocabulary's strings alone are ~100 MB for 262k tokens), and the heap
  // pages it held go back to the system.
  m->file_->release_metadata();
  ::malloc_trim(0);
  return m;
}

// (The session file's model fingerprint: its value is stored in session
// files, so it is computed as it always was, bit for bit.)
uint64_t Model::compute_fingerprint() const {
  const Model& model = *this;
  Hasher h(0x656d6265726d6f64ull);
  h.bytes(model.architecture().data(), model.architecture().size());
  const LlamaConfig& c = model.config();
  for (int32_t v :
       {c.n_vocab, c.n_ctx_train, c.n_embd, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff, c.rope_dim}) {
    h.value(v);
  }
  h.value(c.rope_freq_base);
  h.value(c.rms_eps);
  h.value(model.tokenizer().n_vocab());
  // Samples of every weight: same shapes with other values (a fine-tune)
  // still differ.
  auto tensor = [&](const WeightDesc& w) {
    h.value(static_cast<uint32_t>(w.type));
    h.value(w.rows);
    h.value(w.cols);
    if (!w.host_data || w.rows <= 0) return;
    const size_t size = row_bytes(w.type, w.cols) * static_cast<size_t>(w.rows);
    const auto* p = static_cast<const uint8_t*>(w.host_data);
    constexpr size_t kSample = 4096;
    if (size <= 3 * kSample) {
      h.bytes(p, size);
    } else {
      h.bytes(p, kSample);
      h.bytes(p + size / 2 - kSample / 2, kSample);
      h.bytes(p + size - kSample, kSample);
    }
  };
  tensor(model.token_embd());
  tensor(model.output_norm());
  tensor(model.output());
  for (const auto& l : model.layers()) {
    for (const WeightDesc* w : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      tensor(*w);
    }
  }
  return h.digest();
}

std::vector<RopeSpec> Model::rope_specs() const {
  std::vector<RopeSpec> out;
  for (int32_t il = 0; il < config_.n_layers; ++il) out.push_back(rope_spec(il));
  return out;
}

KvGeometry Model::kv_geometry(int32_t block_size) const {
  KvGeometry g;
  g.num_layers = config_.n_layers;
  g.num_kv_heads = config_.n_kv_heads;
  g.head_dim = config_.head_dim;
  g.block_size = block_size;
  return g;
}

namespace {

std::vector<int32_t> layer_windows(const ModelConfig& c) {
  std::vector<int32_t> windows(static_cast<size_t>(c.n_layers), 0);
  for (int32_t il = 0; il < c.n_layers; ++il) {
    if (c.layer_is_swa(il) && c.sliding_window > 0) windows[il] = c.sliding_window;
  }
  return windows;
}

}  // namespace

KvLayerGroups Model::kv_groups() const {
  if (!parent_ || shard_.pp == 1) return KvLayerGroups::from_windows(layer_windows(config_));
  // A pipeline stage: groups every stage shares (rank 0's tables index
  // every rank's pool), from the whole model's layers and the stages' cut.
  std::vector<int32_t> stages;
  for (int32_t s = 0; s < shard_.pp; ++s)
    stages.push_back(pipeline_stage_layers(parent_->config_.n_layers, shard_.pp, s).second);
  return KvLayerGroups::pipeline_stage(layer_windows(parent_->config_), stages, shard_.pp_rank);
}

RopeSpec Model::rope_spec(int32_t il) const {
  const ModelConfig& c = config_;
  RopeSpec r;
  r.rot_dim = c.rope_dim;
  r.freq_base = c.layer_rope_base(il);
  r.freq_scale = c.layer_is_swa(il) ? 1.0f : c.rope_freq_scale;
  r.neox = c.rope_style == RopeStyle::kNeox;
  r.freq_factors = c.rope_freqs ? static_cast<const float*>(rope_freqs_.host_data) : nullptr;
  return r;
}

void Model::load_config() {
  const auto& f = *file_;
  architecture_ = f.get_string("general.architecture").value_or("");
  if (architecture_.empty()) fail(StatusCode::kBadFormat, "model: general.architecture is missing");
  if (!find_architecture(architecture_)) {
    fail(StatusCode::kUnsupported,
         "model: architecture '" + architecture_ + "' is not supported (supported: " + supported_architectures() + ")");
  }
  name_ = f.get_string("general.name").value_or("");
  const std::string a = architecture_ + ".";
  auto req_int = [&](const std::string& key, int64_t lo, int64_t hi) -> int32_t {
    auto v = f.get_int(key);
    if (!v) fail(StatusCode::kBadFormat, "model: required key '" + key + "' is missing");
    if (*v < lo || *v > hi) {
      fail(StatusCode::kBadFormat, "model: '" + key + "' = " + std::to_string(*v) + " is out of range [" +
                                       std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return static_cast<int32_t>(*v);
  };
  auto& c = config_;
  c.n_layers = req_int(a + "block_count", 1, 1024);
  c.n_embd = req_int(a + "embedding_length", 1, 1 << 16);
  c.n_ff = req_int(a + "feed_forward_length", 1, 1 << 18);
  c.n_heads = req_int(a + "attention.head_count", 1, 1024);
  c.n_kv_heads = f.get_int(a + "attention.head_count_kv") ? req_int(a + "attention.head_count_kv", 1, 1024) : c.n_heads;
  c.n_ctx_train = req_int(a + "context_length", 1, 1 << 24);
  if (c.n_heads % c.n_kv_heads != 0)
    fail(StatusCode::kBadFormat, "model: head_count is not a multiple of head_count_kv");
  c.head_dim =
      f.get_int(a + "attention.key_length") ? req_int(a + "attention.key_length", 1, 1024) : c.n_embd / c.n_heads;
  if (!f.get_int(a + "attention.key_length") && c.n_embd % c.n_heads != 0) {
    fail(StatusCode::kBadFormat, "model: embedding_length is not a multiple of head_count");
  }
  c.rope_dim = f.get_int(a + "rope.dimension_count") ? req_int(a + "rope.dimension_count", 2, c.head_dim) : c.head_dim;
  if (c.rope_dim % 2 != 0) fail(StatusCode::kBadFormat, "model: rope.dimension_count must be even");
  c.rope_freq_base = static_cast<float>(f.get_float(a + "rope.freq_base").value_or(10000.0));
  c.rms_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.rope_freq_base > 0.0f) || !(c.rms_eps > 0.0f) || c.rms_eps > 1.0f) {
    fail(StatusCode::kBadFormat, "model: rope.freq_base / layer_norm_rms_epsilon out of range");
  }
  // RoPE scaling: linear (a frequency scale) is what llama.cpp applies for
  // "none"/"linear"; Llama 3.1's scaling comes as the rope_freqs tensor.
  const std::string scaling = f.get_string(a + "rope.scaling.type").value_or("none");
  if (scaling != "none" && scaling != "linear") {
    fail(StatusCode::kUnsupported, "model: rope scaling '" + scaling + "' is not supported yet");
  }
  const double factor = f.get_float(a + "rope.scaling.factor").value_or(0.0);
  if (!(factor >= 0.0) || factor > 1e6) fail(StatusCode::kBadFormat, "model: rope.scaling.factor out of range");
  c.rope_freq_scale = factor == 0.0 ? 1.0f : static_cast<float>(1.0 / factor);
  find_architecture(architecture_)->load_hparams(f, a, c);
  // What each backend supports is checked when an engine loads the model
  // (Backend::limits).
}

namespace {

// Any type with a reference dequantizer; whether a backend's kernels take it
// is checked when the weights are uploaded (Backend::upload_weight).
bool computable(DType t) {
  const TypeTraits* tt = type_traits(t);
  return tt && tt->dequantize_row;
}

}  // namespace

void Model::load_weights() {
  const auto& c = config_;
  const TensorGetter get = [&](const std::string& name, int64_t cols, int64_t rows, bool norm) -> WeightDesc {
    const gguf::TensorInfo* t = file_->find_tensor(name);
    if (!t) fail(StatusCode::kBadFormat, "model: tensor '" + name + "' is missing");
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1) {
      fail(StatusCode::kBadFormat, "model: tensor '" + name + "' has shape [" + std::to_string(t->ne[0]) + ", " +
                                       std::to_string(t->ne[1]) + "], expected [" + std::to_string(cols) + ", " +
                                       std::to_string(rows) + "]");
    }
    if (norm ? t->type != DType::F32 : !computable(t->type)) {
      fail(StatusCode::kUnsupported, "model: tensor '" + name + "' has type " +
                                         type_name(static_cast<uint32_t>(t->type)) + ", which is not supported here");
    }
    n_params_ += static_cast<uint64_t>(t->n_elements());
    return WeightDesc{t->type, rows, cols, t->data};
  };
  const gguf::TensorInfo* embd = file_->find_tensor("token_embd.weight");
  if (!embd) fail(StatusCode::kBadFormat, "model: tensor 'token_embd.weight' is missing");
  config_.n_vocab = static_cast<int32_t>(embd->ne[1]);
  if (embd->ne[1] <= 0 || embd->ne[1] > (1 << 24)) fail(StatusCode::kBadFormat, "model: vocabulary size out of range");
  token_embd_ = get("token_embd.weight", c.n_embd, c.n_vocab, false);
  output_norm_ = get("output_norm.weight", c.n_embd, 1, true);
  if (file_->find_tensor("output.weight")) {
    output_ = get("output.weight", c.n_embd, c.n_vocab, false);
  } else {
    output_ = token_embd_;  // tied embeddings
  }
  if (file_->find_tensor("rope_freqs.weight")) {
    rope_freqs_ = get("rope_freqs.weight", c.rope_dim / 2, 1, true);
    for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
      const float v = static_cast<const float*>(rope_freqs_.host_data)[i];
      if (!(v > 0.0f) || !std::isfinite(v)) fail(StatusCode::kBadFormat, "model: rope_freqs.weight must be positive");
    }
    config_.rope_freqs = true;
  }
  const Architecture& arch = *find_architecture(architecture_);
  layers_.resize(c.n_layers);
  for (int32_t i = 0; i < c.n_layers; ++i) arch.load_layer(get, c, "blk." + std::to_string(i) + ".", layers_[i]);
  shard_.n_layers = c.n_layers;
  shard_.vocab_end = c.n_vocab;
}

}  // namespace ember
