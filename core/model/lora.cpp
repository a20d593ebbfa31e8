#include "core/model/lora.h"

#include <cmath>
#include <cstring>
#include <map>

#include "core/gguf/gguf.h"
#include "core/model/model.h"
#include "core/tensor/types.h"
#include "core/util/hash.h"
#include "core/util/status.h"

namespace ember {

namespace {

constexpr const char* kTargetNames[kLoraLayerTargets] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                         "ffn_gate", "ffn_up", "ffn_down"};

const WeightDesc& base_matrix(const LayerWeightDescs& l, int32_t t) {
  switch (static_cast<LoraTarget>(t)) {
    case LoraTarget::kQ: return l.wq;
    case LoraTarget::kK: return l.wk;
    case LoraTarget::kV: return l.wv;
    case LoraTarget::kO: return l.wo;
    case LoraTarget::kGate: return l.w_gate;
    case LoraTarget::kUp: return l.w_up;
    case LoraTarget::kDown: return l.w_down;
  }
  return l.wq;
}

// "blk.N.<target>.weight" -> (N, target), or false.
bool parse_matrix(const std::string& name, int32_t n_layers, int32_t* il, int32_t* target) {
  if (name.rfind("blk.", 0) != 0) return false;
  size_t i = 4, j = i;
  while (j < name.size() && j - i < 6 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return false;
  const int64_t layer = std::stoll(name.substr(i, j - i));
  if (layer >= n_layers) return false;
  const std::string rest = name.substr(j + 1);
  for (int32_t t = 0; t < kLoraLayerTargets; ++t) {
    if (rest == std::string(kTargetNames[t]) + ".weight") {
      *il = static_cast<int32_t>(layer);
      *target = t;
      return true;
    }
  }
  return false;
}

bool finite_values(const gguf::TensorInfo& t) {
  const int64_t n = t.n_elements();
  switch (t.type) {
    case DType::F32: {
      const auto* p = static_cast<const float*>(t.data);
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(p[i])) return false;
      return true;
    }
    case DType::F16: {
      const auto* p = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n; ++i)
        if ((p[i] & 0x7c00) == 0x7c00) return false;  // inf / nan
      return true;
    }
    case DType::BF16: {
      const auto* p = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < n; ++i)
        if ((p[i] & 0x7f80) == 0x7f80) return false;
      return true;
    }
    default: return false;
  }
}

}  // namespace

LoraAdapter::~LoraAdapter() = default;

std::shared_ptr<const LoraAdapter> LoraAdapter::load(const std::string& path, const Model& base) {
  return from_file(gguf::GgufFile::open(path, gguf::GgufFile::Residency::kPrivateCopy), path, base);
}

std::shared_ptr<const LoraAdapter> LoraAdapter::from_file(std::unique_ptr<gguf::GgufFile> file,
                                                          const std::string& path, const Model& base) {
  if (!file) fail(StatusCode::kInvalidArgument, "adapter: no file");
  std::shared_ptr<LoraAdapter> a(new LoraAdapter());
  a->path_ = path;
  a->file_ = std::move(file);
  const gguf::GgufFile& f = *a->file_;
  const std::string what = "adapter '" + path + "': ";
  const std::string type = f.get_string("general.type").value_or("");
  if (type != "adapter") {
    fail(StatusCode::kBadFormat, what + "not an adapter (general.type is '" + type.substr(0, 64) + "')");
  }
  const std::string adapter_type = f.get_string("adapter.type").value_or("");
  if (adapter_type != "lora") {
    fail(StatusCode::kUnsupported, what + "adapter type '" + adapter_type.substr(0, 64) + "' is not LoRA");
  }
  a->architecture_ = f.get_string("general.architecture").value_or("");
  if (a->architecture_ != base.architecture()) {
    fail(StatusCode::kInvalidArgument, what + "made for a '" + a->architecture_.substr(0, 64) +
                                           "' model, the base is '" + base.architecture() + "'");
  }
  const double alpha = f.get_float("adapter.lora.alpha").value_or(0.0);
  if (!std::isfinite(alpha) || alpha < 0.0 || alpha > 1e6) {
    fail(StatusCode::kBadFormat, what + "adapter.lora.alpha is out of range");
  }
  a->alpha_ = static_cast<float>(alpha);
  const ModelConfig& c = base.config();
  a->n_layers_ = c.n_layers;
  a->n_embd_ = c.n_embd;
  a->n_vocab_ = c.n_vocab;
  a->pairs_.assign(static_cast<size_t>(c.n_layers) * kLoraLayerTargets, Pair{});

  // Pair up <matrix>.lora_a / .lora_b.
  std::map<std::string, std::pair<const gguf::TensorInfo*, const gguf::TensorInfo*>> found;
  for (const auto& t : f.tensors()) {
    const std::string& n = t.name;
    const bool is_a = n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_a") == 0;
    const bool is_b = n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_b") == 0;
    if (!is_a && !is_b) {
      fail(StatusCode::kBadFormat, what + "tensor '" + n.substr(0, 96) + "' is not a LoRA tensor (.lora_a/.lora_b)");
    }
    auto& e = found[n.substr(0, n.size() - 7)];
    (is_a ? e.first : e.second) = &t;
  }
  if (found.empty()) fail(StatusCode::kBadFormat, what + "holds no LoRA tensors");
  Hasher h(0x6c6f7261ull);
  h.value(a->alpha_);
  for (const auto& [matrix, ab] : found) {
    const std::string m = matrix.substr(0, 96);
    if (!ab.first || !ab.second) fail(StatusCode::kBadFormat, what + "'" + m + "' lacks its lora_a or lora_b");
    int32_t il = -1, target = -1;
    if (!parse_matrix(matrix, c.n_layers, &il, &target)) {
      fail(StatusCode::kUnsupported, what + "'" + m + "' is not a layer matrix this base has (Ember adapts " +
                                         "attn_q/k/v/output and ffn_gate/up/down of blk.0-" +
                                         std::to_string(c.n_layers - 1) + ")");
    }
    const WeightDesc& w = base_matrix(base.layers()[static_cast<size_t>(il)], target);
    const gguf::TensorInfo& ta = *ab.first;
    const gguf::TensorInfo& tb = *ab.second;
    for (const gguf::TensorInfo* t : {&ta, &tb}) {
      if (t->type != DType::F32 && t->type != DType::F16 && t->type != DType::BF16) {
        fail(StatusCode::kUnsupported, what + "tensor '" + t->name.substr(0, 96) + "' has type " +
                                           type_name(static_cast<uint32_t>(t->type)) +
                                           " (LoRA tensors are applied in F32, F16 or BF16)");
      }
      if (t->ne[2] != 1 || t->ne[3] != 1) fail(StatusCode::kBadFormat, what + "'" + m + "': LoRA tensors are 2-D");
    }
    if (ta.ne[1] != tb.ne[0]) {
      fail(StatusCode::kBadFormat, what + "'" + m + "': lora_a's rank " + std::to_string(ta.ne[1]) +
                                       " differs from lora_b's " + std::to_string(tb.ne[0]) +
                                       " (lora_a not transposed?)");
    }
    if (ta.ne[0] != w.cols || tb.ne[1] != w.rows) {
      fail(StatusCode::kInvalidArgument, what + "'" + m + "' is [" + std::to_string(ta.ne[0]) + " -> " +
                                             std::to_string(tb.ne[1]) + "], the base's is [" +
                                             std::to_string(w.cols) + " -> " + std::to_string(w.rows) +
                                             "] (an adapter for another model)");
    }
    const int64_t rank = ta.ne[1];
    if (rank < 1 || rank > kMaxRank) {
      fail(StatusCode::kBadFormat, what + "'" + m + "': rank " + std::to_string(rank) + " is out of range");
    }
    for (const gguf::TensorInfo* t : {&ta, &tb}) {
      if (!finite_values(*t)) {
        fail(StatusCode::kBadFormat, what + "tensor '" + t->name.substr(0, 96) + "' holds a non-finite value");
      }
    }
    Pair& p = a->pairs_[static_cast<size_t>(il) * kLoraLayerTargets + static_cast<size_t>(target)];
    p.a = WeightDesc{ta.type, rank, ta.ne[0], ta.data};
    p.b = WeightDesc{tb.type, tb.ne[1], rank, tb.data};
    p.rank = static_cast<int32_t>(rank);
    p.alpha_scale = a->alpha_ > 0.0f ? a->alpha_ / static_cast<float>(rank) : 1.0f;
    a->max_rank_ = std::max(a->max_rank_, p.rank);
    ++a->n_pairs_;
    h.bytes(matrix.data(), matrix.size());
    h.value(ta.type);
    h.value(rank);
    h.bytes(ta.data, ta.nbytes);
    h.value(tb.type);
    h.bytes(tb.data, tb.nbytes);
  }
  a->key_ = h.digest() | 1;
  return a;
}

const LoraAdapter::Pair* LoraAdapter::find(int32_t il, LoraTarget t) const {
  const size_t i = static_cast<size_t>(il) * kLoraLayerTargets + static_cast<size_t>(t);
  if (il < 0 || i >= pairs_.size() || pairs_[i].rank == 0) return nullptr;
  return &pairs_[i];
}

size_t LoraAdapter::bytes() const {
  size_t n = 0;
  for (const auto& p : pairs_) {
    if (p.rank == 0) continue;
    n += static_cast<size_t>(p.a.rows) * row_bytes(p.a.type, p.a.cols);
    n += static_cast<size_t>(p.b.rows) * row_bytes(p.b.type, p.b.cols);
  }
  return n;
}

bool LoraAdapter::fits(const Model& base) const {
  const ModelConfig& c = base.config();
  if (base.architecture() != architecture_ || c.n_layers != n_layers_ || c.n_embd != n_embd_ ||
      c.n_vocab != n_vocab_) {
    return false;
  }
  for (int32_t il = 0; il < n_layers_; ++il) {
    for (int32_t t = 0; t < kLoraLayerTargets; ++t) {
      const Pair* p = find(il, static_cast<LoraTarget>(t));
      if (!p) continue;
      const WeightDesc& w = base_matrix(base.layers()[static_cast<size_t>(il)], t);
      if (p->a.cols != w.cols || p->b.rows != w.rows) return false;
    }
  }
  return true;
}

std::shared_ptr<const LoraSet> LoraSet::make(std::vector<LoraUse> uses) {
  if (uses.size() > kMaxAdapters) {
    fail(StatusCode::kInvalidArgument,
         "loras: at most " + std::to_string(kMaxAdapters) + " adapters per session, got " + std::to_string(uses.size()));
  }
  auto set = std::shared_ptr<LoraSet>(new LoraSet());
  Hasher h(0x6c6f72617365ull);
  for (auto& u : uses) {
    if (!u.adapter) fail(StatusCode::kInvalidArgument, "loras: a null adapter");
    if (!std::isfinite(u.scale) || std::fabs(u.scale) > kMaxScale) {
      fail(StatusCode::kInvalidArgument, "loras: scale " + std::to_string(u.scale) + " is not a finite number in [-" +
                                             std::to_string(static_cast<int>(kMaxScale)) + ", " +
                                             std::to_string(static_cast<int>(kMaxScale)) + "]");
    }
    if (u.scale == 0.0f) continue;  // adds nothing (llama.cpp skips it too)
    h.value(u.adapter->key());
    uint32_t bits;
    std::memcpy(&bits, &u.scale, sizeof bits);
    h.value(bits);
    set->uses_.push_back(std::move(u));
  }
  if (set->uses_.empty()) return nullptr;
  set->key_ = h.digest() | 1;
  return set;
}

}  // namespace ember
