// core::Session: one conversation on an engine — its chat messages or raw
// text, and its sequence in the KV manager (token history, KV blocks, cache
// policy). Persists across turns; one stream at a time; can be saved to and
// restored from a file (core/engine/session_file.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <atomic>

#include "core/chat/chat_template.h"
#include "core/engine/embed.h"
#include "core/chat/tools.h"
#include "core/kv_cache/kv_manager.h"
#include "core/kv_cache/streaming.h"

namespace ember {

class Engine;
class EngineOwner;
class Stream;
struct StreamParams;

// What a session's cache holds (ember_session_cache_info).
struct SessionCacheInfo {
  CachePolicy policy;
  size_t n_tokens = 0;        // tokens in the history
  size_t n_processed = 0;     // history tokens run through the model (resident or evicted)
  size_t resident = 0;        // tokens whose K/V are in the cache now
  uint64_t evicted = 0;       // tokens evicted by the policy
  size_t blocks = 0;          // KV blocks held
  size_t max_blocks = 0;      // the most it can hold (bounded policies; 0 = unbounded)
  int32_t max_position = -1;  // highest RoPE position any of its tokens was given
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  // n_ctx: the context of a full session (0 = the model's); for a
  // window/sink policy with window_tokens == 0 the cache size S + W
  // (W = n_ctx - S). Throws ember::Error.
  Session(std::shared_ptr<EngineOwner> engine, int32_t n_ctx, const std::string& system_prompt, int32_t priority = 0,
          CachePolicy policy = {});
  ~Session();

  void add_message(const std::string& role, const std::string& content);
  // The tools the model may call from now on (core/chat/tools.h: an OpenAI
  // tool list as JSON; "" = none). Chat sessions only. Throws ember::Error.
  void set_tools(const std::string& tools_json);
  // The LoRA adapters (core/model/lora.h) its turns decode with from now
  // on (null: none), between turns. Each must fit the engine's model. A
  // different set recomputes the history under it (from the prefix cache
  // where it can). Throws ember::Error (kBusy: a stream is running;
  // kInvalidArgument: an adapter for another model).
  void set_loras(std::shared_ptr<const LoraSet> loras);
  std::shared_ptr<const LoraSet> loras() const;
  // Numbers the session's tool calls: call_1, call_2, ... (any thread).
  uint64_t next_tool_call_number() { return ++tool_calls_; }
  void add_text(const std::string& text, bool parse_special);
  void add_tokens(std::vector<int32_t> ids);
  void reset();
  size_t token_count() const;
  SessionCacheInfo cache_info() const;
  const CachePolicy& policy() const { return kv_->policy(); }
  int32_t priority() const { return priority_; }

  // Starts a generation (validates `params` first). Throws ember::Error.
  std::shared_ptr<Stream> start(const StreamParams& params);
  // Appends `ids` (completion mode) and scores them under the cache policy
  // through the engine's scheduler: out[i] = log p(ids[i] | every session
  // token before it), NaN for a token with nothing before it. out may be
  // nullptr (ingest only). The last token stays pending (not yet run), so the
  // next call or stream continues from it. Blocks until done.
  void score(const std::vector<int32_t>& ids, float* out);
  // Embedding (core/engine/embed.h): an empty session takes `ids` and
  // runs every one of them through the engine's scheduler; the stream ends
  // when all are computed, its embedding() pooled by `pooling`. Throws
  // ember::Error (kInvalidArgument: the session is not empty).
  std::shared_ptr<Stream> start_embedding(const std::vector<int32_t>& ids, Pooling pooling);
  // Cancels the running stream, if any (used when the session handle goes).
  void cancel_active();

  // Writes the session (history, policy, messages, KV) to `path`. The
  // session must be idle.
  void save(const std::string& path);
  // Restores a saved session on `engine`; priority < 0 keeps the saved one.
  static std::shared_ptr<Session> load(std::shared_ptr<EngineOwner> engine, const std::string& path,
                                       int32_t priority = -1);

  Engine& engine() const;

  // ---- stream and engine side
  // The session's sequence; its mutex guards the whole session.
  KvSequence& kv() { return *kv_; }
  int32_t n_ctx() const { return n_ctx_; }
  // The running stream ended (its sequence already parked by the engine):
  // its reply (chat mode; nullptr = none) joins the messages, and the
  // session is idle again.
  void end_turn(const std::string* reply);

 private:
  enum class Mode : int32_t { kEmpty = 0, kChat = 1, kText = 2 };
  void require_idle_locked() const;
  void append_tokens_locked(const std::vector<int32_t>& ids);
  // Re-renders the conversation with the generation prompt; the longest
  // common prefix with the history stays computed.
  void sync_chat_tokens_locked();
  std::shared_ptr<Stream> submit_locked(std::shared_ptr<Stream> stream);
  // With tools: the stream parses calls, under the tools' constraint.
  void prepare_tool_calls_locked(StreamParams& params) const;

  std::shared_ptr<EngineOwner> engine_;
  KvManager& kv_manager_;
  int32_t n_ctx_;
  int32_t priority_ = 0;
  std::unique_ptr<KvSequence> kv_;
  // Guarded by kv_->mutex():
  bool busy_ = false;
  Mode mode_ = Mode::kEmpty;
  std::vector<ChatMessage> messages_;
  std::shared_ptr<const chat::ToolSet> tools_;
  std::weak_ptr<Stream> active_;
  std::atomic<uint64_t> tool_calls_{0};
};

}  // namespace ember
