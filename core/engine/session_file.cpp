// Session save and restore (ember_session_save / ember_session_load).
//
// File layout (little-endian), version 3 (version 2 lacks the tools; version
// 1 also the generated-token flags: such files load with every token counted
// as prompt):
//
//   header (48 bytes)
//     char[8]  magic "EMBERSES"
//     u32      version (3)
//     u32      reserved (0)
//     u64      model fingerprint (architecture, hyperparameters, tokenizer size
//              and samples of every weight tensor's bytes)
//     u64      payload size in bytes
//     u64      checksum: a 64-bit hash of version, fingerprint, payload size
//              and the payload
//     u64      reserved (0)
//   payload
//     policy (kind, sinks, window), n_ctx, priority, mode
//     messages (role, content), the tools (JSON, "" = none) and the number
//     of tool calls made so far, token history, then one byte per token:
//     1 if a stream generated it (its K/V were computed as a decode)
//     n_processed, evicted tokens, dropped blocks, highest position
//     KV geometry (block size, layers, kv heads, head dim, dtype, bytes/block)
//     the session's KV blocks in table order, raw (every layer, K then V)
//
// Checks on load, in order: magic (not a session file), version, size
// (truncated or trailing bytes), checksum (corrupt), fingerprint (another
// model), then the payload's own consistency and the engine's KV geometry.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/engine/session.h"
#include "core/model/model.h"
#include "core/tensor/types.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/hash.h"
#include "core/util/status.h"

namespace ember {

namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'E', 'R', 'S', 'E', 'S'};
constexpr uint32_t kVersion = 3;  // reads 1 to 3
constexpr size_t kHeaderBytes = 48;

uint64_t model_fingerprint(const Model& model) { return model.fingerprint(); }

class Writer {
 public:
  template <typename T>
  void value(const T& v) {
    raw(&v, sizeof v);
  }
  void str(const std::string& s) {
    value<uint64_t>(s.size());
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  std::vector<uint8_t>& buffer() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  template <typename T>
  T value() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  std::string str() {
    const uint64_t n = value<uint64_t>();
    if (n > n_ - off_) corrupt("a string runs past the end");
    const auto* b = take(static_cast<size_t>(n));
    return std::string(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
  }
  const uint8_t* take(size_t n) {
    if (n > n_ - off_) corrupt("a field runs past the end");
    const uint8_t* b = p_ + off_;
    off_ += n;
    return b;
  }
  size_t left() const { return n_ - off_; }
  [[noreturn]] void corrupt(const std::string& why) const {
    fail(StatusCode::kBadFormat, "session file '" + path_ + "' is corrupt: " + why);
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
  std::string path_;
};

uint64_t checksum(uint32_t version, uint64_t fingerprint, uint64_t payload_bytes, const uint8_t* payload) {
  Hasher h(0x73657373696f6e31ull);
  h.value(version);
  h.value(fingerprint);
  h.value(payload_bytes);
  h.bytes(payload, static_cast<size_t>(payload_bytes));
  return h.digest();
}

}  // namespace

void Session::save(const std::string& path) {
  Engine& engine = **engine_;
  KvManager& kvm = engine.kv();
  const KvGeometry& g = kvm.geometry();
  std::lock_guard<std::mutex> lock(kv_->mutex());
  require_idle_locked();
  const KvSequence& kv = *kv_;
  if (kv.lora()) {
    // Its K/V hold the adapters' work, which the file cannot name yet.
    fail(StatusCode::kUnsupported, "save: a session with LoRA adapters cannot be saved yet (set none first)");
  }
  const std::unique_ptr<KvManager::Export> exported = kvm.export_blocks(*kv_);
  const CachePolicy& policy = kv.policy();

  Writer w;
  w.value<uint32_t>(static_cast<uint32_t>(policy.kind));
  w.value<int32_t>(policy.sink_tokens);
  w.value<int32_t>(policy.window_tokens);
  w.value<int32_t>(n_ctx_);
  w.value<int32_t>(priority_);
  w.value<int32_t>(static_cast<int32_t>(mode_));
  w.value<uint64_t>(messages_.size());
  for (const auto& m : messages_) {
    w.str(m.role);
    w.str(m.content);
  }
  w.str(tools_ ? tools_->json : std::string());
  w.value<uint64_t>(tool_calls_.load());
  w.value<uint64_t>(kv.tokens().size());
  w.raw(kv.tokens().data(), kv.tokens().size() * sizeof(int32_t));
  w.raw(kv.generated().data(), kv.generated().size());
  w.value<uint64_t>(exported->n_computed());
  w.value<int64_t>(kv.layout().n_evicted());
  w.value<int64_t>(kv.layout().dropped_blocks());
  w.value<int32_t>(kv.max_position());
  w.value<int32_t>(g.block_size);
  w.value<int32_t>(g.num_layers);
  w.value<int32_t>(g.num_kv_heads);
  w.value<int32_t>(g.head_dim);
  w.value<uint32_t>(g.dtype == DType::F16 ? 0u : static_cast<uint32_t>(g.dtype));  // 0: f16, 8: q8_0 (GGML ids)
  const size_t bpb = g.bytes_per_block();
  w.value<uint64_t>(bpb);
  const size_t n_blocks = exported->n_blocks();
  w.value<uint64_t>(n_blocks);
  std::vector<uint8_t>& buf = w.buffer();
  const size_t kv_at = buf.size();
  buf.resize(kv_at + n_blocks * bpb);
  for (size_t i = 0; i < n_blocks; ++i) exported->read(i, buf.data() + kv_at + i * bpb);

  const uint64_t fp = model_fingerprint(engine.model());
  const uint64_t payload = buf.size();
  uint8_t header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  const uint32_t version = kVersion;
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 16, &fp, 8);
  std::memcpy(header + 24, &payload, 8);
  const uint64_t sum = checksum(kVersion, fp, payload, buf.data());
  std::memcpy(header + 32, &sum, 8);

  // Written next to the target and renamed: a crash never leaves half a file
  // under the real name.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(StatusCode::kNotFound, "save: cannot create '" + tmp + "'");
    out.write(reinterpret_cast<const char*>(header), kHeaderBytes);
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      fail(StatusCode::kNotFound, "save: writing '" + tmp + "' failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(StatusCode::kNotFound, "save: cannot rename '" + tmp + "' to '" + path + "'");
  }
}

std::shared_ptr<Session> Session::load(std::shared_ptr<EngineOwner> owner, const std::string& path, int32_t priority) {
  Engine& engine = **owner;
  KvManager& kvm = engine.kv();
  const KvGeometry& g = kvm.geometry();

  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(StatusCode::kNotFound, "load: cannot open session file '" + path + "'");
  const std::streamoff size = in.tellg();
  if (size < 0) fail(StatusCode::kNotFound, "load: cannot read '" + path + "'");
  in.seekg(0);
  std::vector<uint8_t> file(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(file.data()), size)) {
    fail(StatusCode::kNotFound, "load: cannot read '" + path + "'");
  }
  if (file.size() < 8 || std::memcmp(file.data(), kMagic, 8) != 0) {
    fail(StatusCode::kBadFormat, "load: '" + path + "' is not an Ember session file");
  }
  if (file.size() < kHeaderBytes) {
    fail(StatusCode::kBadFormat, "load: session file '" + path + "' is truncated (" + std::to_string(file.size()) +
                                     " bytes, shorter than its header)");
  }
  uint32_t version;
  uint64_t fp, payload, sum;
  std::memcpy(&version, file.data() + 8, 4);
  std::memcpy(&fp, file.data() + 16, 8);
  std::memcpy(&payload, file.data() + 24, 8);
  std::memcpy(&sum, file.data() + 32, 8);
  if (version < 1 || version > kVersion) {
    fail(StatusCode::kUnsupported, "load: session file '" + path + "' has version " + std::to_string(version) +
                                       "; this library reads versions 1 to " + std::to_string(kVersion));
  }
  const uint64_t have = file.size() - kHeaderBytes;
  if (have < payload) {
    fail(StatusCode::kBadFormat, "load: session file '" + path + "' is truncated (" + std::to_string(have) + " of " +
                                     std::to_string(payload) + " payload bytes)");
  }
  if (have > payload) {
    fail(StatusCode::kBadFormat, "load: session file '" + path + "' is corrupt (" + std::to_string(have - payload) +
                                     " unexpected bytes after its payload)");
  }
  const uint8_t* body = file.data() + kHeaderBytes;
  if (checksum(version, fp, payload, body) != sum) {
    fail(StatusCode::kBadFormat, "load: session file '" + path + "' is corrupt (checksum mismatch)");
  }
  const uint64_t ours = model_fingerprint(engine.model());
  if (fp != ours) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " (file %016llx, model %016llx)", static_cast<unsigned long long>(fp),
                  static_cast<unsigned long long>(ours));
    fail(StatusCode::kUnsupported, "load: session file '" + path + "' was saved with a different model" + buf);
  }

  Reader r(body, static_cast<size_t>(payload), path);
  CachePolicy policy;
  const uint32_t kind = r.value<uint32_t>();
  if (kind > 2) r.corrupt("unknown cache policy " + std::to_string(kind));
  policy.kind = static_cast<CachePolicyKind>(kind);
  policy.sink_tokens = r.value<int32_t>();
  policy.window_tokens = r.value<int32_t>();
  const int32_t n_ctx = r.value<int32_t>();
  const int32_t saved_priority = r.value<int32_t>();
  const int32_t mode = r.value<int32_t>();
  if (mode < 0 || mode > 2) r.corrupt("unknown mode");
  if (n_ctx < 0) r.corrupt("negative n_ctx");
  const uint64_t n_messages = r.value<uint64_t>();
  if (n_messages > r.left() / 16) r.corrupt("message count out of range");
  std::vector<ChatMessage> messages;
  for (uint64_t i = 0; i < n_messages; ++i) {
    ChatMessage m;
    m.role = r.str();
    m.content = r.str();
    messages.push_back(std::move(m));
  }
  // Version 3: the tools and how many calls were numbered.
  std::shared_ptr<const chat::ToolSet> tools;
  uint64_t tool_calls = 0;
  if (version >= 3) {
    const std::string tools_json = r.str();
    tool_calls = r.value<uint64_t>();
    if (!tools_json.empty()) {
      try {
        tools = chat::parse_tools(tools_json);
      } catch (const Error& e) {
        r.corrupt("invalid " + e.message());
      }
    }
  }
  const uint64_t n_tokens = r.value<uint64_t>();
  if (n_tokens > r.left() / sizeof(int32_t)) r.corrupt("token count out of range");
  std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
  const uint8_t* token_bytes = r.take(tokens.size() * sizeof(int32_t));
  if (!tokens.empty()) std::memcpy(tokens.data(), token_bytes, tokens.size() * sizeof(int32_t));
  const int32_t n_vocab = engine.model().config().n_vocab;
  for (int32_t t : tokens) {
    if (t < 0 || t >= n_vocab) r.corrupt("token id out of range");
  }
  // Version 2: which tokens were generated (their rows are decodes).
  std::vector<uint8_t> decoded(tokens.size(), 0);
  if (version >= 2) {
    if (decoded.size() > r.left()) r.corrupt("generated-token flags out of range");
    const uint8_t* flags = r.take(decoded.size());
    if (!decoded.empty()) std::memcpy(decoded.data(), flags, decoded.size());
    for (uint8_t d : decoded) {
      if (d > 1) r.corrupt("a generated-token flag is neither 0 nor 1");
    }
  }
  const uint64_t n_processed = r.value<uint64_t>();
  const int64_t n_evicted = r.value<int64_t>();
  const int64_t dropped = r.value<int64_t>();
  const int32_t max_position = r.value<int32_t>();
  const int32_t block_size = r.value<int32_t>();
  const int32_t layers = r.value<int32_t>();
  const int32_t kv_heads = r.value<int32_t>();
  const int32_t head_dim = r.value<int32_t>();
  const uint32_t dtype = r.value<uint32_t>();
  const uint64_t bpb = r.value<uint64_t>();
  const uint64_t n_blocks = r.value<uint64_t>();
  if (layers != g.num_layers || kv_heads != g.num_kv_heads || head_dim != g.head_dim) {
    r.corrupt("its KV geometry does not match the model");
  }
  if (dtype != 0 && dtype != static_cast<uint32_t>(DType::Q8_0)) r.corrupt("unknown KV element type");
  const DType saved_dtype = dtype == 0 ? DType::F16 : DType::Q8_0;
  if (saved_dtype != g.dtype) {
    fail(StatusCode::kUnsupported, "load: session file '" + path + "' was saved with a " +
                                       type_name(static_cast<uint32_t>(saved_dtype)) + " KV cache; this engine uses " +
                                       type_name(static_cast<uint32_t>(g.dtype)));
  }
  if (block_size != g.block_size) {
    fail(StatusCode::kUnsupported, "load: session file '" + path + "' was saved with kv_block_size " +
                                       std::to_string(block_size) + "; this engine uses " +
                                       std::to_string(g.block_size));
  }
  if (bpb != g.bytes_per_block()) r.corrupt("its KV block size in bytes does not match the model");
  if (n_blocks > r.left() / bpb || n_blocks * bpb != r.left()) r.corrupt("KV block data does not match its count");
  if (n_processed > n_tokens) r.corrupt("more tokens processed than in the history");

  // The session validates its policy: for a file, an invalid one is corruption.
  std::shared_ptr<Session> se;
  try {
    se = std::make_shared<Session>(owner, n_ctx, "", priority >= 0 ? priority : saved_priority, policy);
  } catch (const Error& e) {
    if (e.code() != StatusCode::kInvalidArgument) throw;
    r.corrupt("invalid " + e.message());
  }
  std::lock_guard<std::mutex> lock(se->kv_->mutex());
  if (se->kv_->bounded() && (se->kv_->policy().sink_tokens != policy.sink_tokens ||
                             se->kv_->policy().window_tokens != policy.window_tokens)) {
    r.corrupt("inconsistent cache policy");
  }
  se->mode_ = static_cast<Mode>(mode);
  se->messages_ = std::move(messages);
  se->tools_ = std::move(tools);
  se->tool_calls_ = tool_calls;
  KvManager::Saved saved;
  saved.tokens = std::move(tokens);
  saved.generated = std::move(decoded);
  saved.n_computed = static_cast<size_t>(n_processed);
  saved.n_evicted = n_evicted;
  saved.dropped_blocks = dropped;
  saved.max_position = max_position;
  saved.n_blocks = static_cast<size_t>(n_blocks);
  saved.blocks = r.take(static_cast<size_t>(n_blocks * bpb));
  kvm.restore(*se->kv_, std::move(saved), [&](const std::string& why) { r.corrupt(why); });
  return se;
}

}  // namespace ember
