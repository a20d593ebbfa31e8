#include "core/engine/session.h"

#include <algorithm>
#include <cmath>

#include "core/engine/engine.h"
#include "core/engine/stream.h"
#include "core/model/model.h"
#include "core/tokenizer/tokenizer.h"

namespace ember {

Session::Session(std::shared_ptr<EngineOwner> engine, int32_t n_ctx, const std::string& system_prompt, int32_t priority,
                 CachePolicy policy)
    : engine_(std::move(engine)), kv_manager_((*engine_)->kv()), priority_(priority) {
  const int32_t train = (*engine_)->model().config().n_ctx_train;
  if (n_ctx < 0) fail(StatusCode::kInvalidArgument, "session: n_ctx must be >= 0");
  n_ctx_ = n_ctx == 0 ? train : std::min(n_ctx, train);
  kv_ = kv_manager_.create(policy, n_ctx_, train);
  if (!system_prompt.empty()) {
    messages_.push_back({"system", system_prompt});
    mode_ = Mode::kChat;
  }
}

Session::~Session() {
  std::lock_guard<std::mutex> lock(kv_->mutex());
  kv_manager_.release(*kv_);
}

Engine& Session::engine() const { return **engine_; }

void Session::require_idle_locked() const {
  if (busy_) fail(StatusCode::kBusy, "the session is running a stream");
}

void Session::add_message(const std::string& role, const std::string& content) {
  if (role.empty()) fail(StatusCode::kInvalidArgument, "add_message: empty role");
  const Model& model = engine().model();
  if (!model.chat_template()) fail(StatusCode::kUnsupported, model.chat_template_error());
  std::lock_guard<std::mutex> lock(kv_->mutex());
  require_idle_locked();
  if (mode_ == Mode::kText) {
    fail(StatusCode::kInvalidArgument, "add_message: the session holds raw text; reset it before chatting");
  }
  mode_ = Mode::kChat;
  messages_.push_back({role, content});
}

void Session::set_tools(const std::string& tools_json) {
  const Model& model = engine().model();
  if (!model.chat_template()) fail(StatusCode::kUnsupported, model.chat_template_error());
  std::shared_ptr<const chat::ToolSet> tools;
  if (!tools_json.empty()) tools = chat::parse_tools(tools_json);
  std::lock_guard<std::mutex> lock(kv_->mutex());
  require_idle_locked();
  if (mode_ == Mode::kText) {
    fail(StatusCode::kInvalidArgument, "set_tools: the session holds raw text; tools need a chat session");
  }
  tools_ = std::move(tools);
}

void Session::set_loras(std::shared_ptr<const LoraSet> loras) {
  const Model& model = engine().model();
  if (loras) {
    for (const auto& u : loras->uses()) {
      if (!u.adapter->fits(model)) {
        fail(StatusCode::kInvalidArgument,
             "set_loras: adapter '" + u.adapter->path() + "' was made for another model than the engine's");
      }
    }
  }
  std::lock_guard<std::mutex> lock(kv_->mutex());
  require_idle_locked();
  kv_manager_.set_lora(*kv_, std::move(loras));
}

std::shared_ptr<const LoraSet> Session::loras() const {
  std::lock_guard<std::mutex> lock(kv_->mutex());
  return kv_->lora();
}

void Session::add_text(const std::string& text, bool parse_special) {
  const Tokenizer& tok = engine().model().tokenizer();
  std::lock_guard<std::mutex> lock(kv_->mutex());
  require_idle_locked();
  if (mode_ == Mode::kChat) {
    fail(StatusCode::kInvalidArgument, "add_text: the session holds chat messages; reset it first");
  }
  append_tokens_locked(tok.encode(text, kv_->tokens().empty(), parse_special));
}

void Session::add_tokens(std::vector<int32_t> ids) {
  const int32_t n_vocab = engine().model().config().n_vocab;
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab) {
      fail(StatusCode::kInvalidArgument, "add_tokens: token id " + std::to_string(id) + " out of range");
    }
  }
  std::lock_guard<std::mutex> lock(kv_->mutex());
  require_idle_locked();
  if (mode_ == Mode::kChat) {
    fail(StatusCode::kInvalidArgument, "add_tokens: the session holds chat messages; reset it first");
  }
  append_tokens_locked(ids);
}

void Session::append_tokens_locked(const std::vector<int32_t>& ids) {
  const size_t n = kv_->tokens().size() + ids.size();
  if (!kv_->bounded() && n > static_cast<size_t>(n_ctx_)) {
    fail(StatusCode::kContextFull,
         std::to_string(n) + " tokens exceed the session's context of " + std::to_string(n_ctx_));
  }
  mode_ = Mode::kText;
  kv_manager_.append(*kv_, ids.data(), ids.size(), /*generated=*/false);
}

void Session::end_turn(const std::string* reply) {
  std::lock_guard<std::mutex> lock(kv_->mutex());
  if (reply && mode_ == Mode::kChat) messages_.push_back({"assistant", *reply});
  busy_ = false;
}

void Session::reset() {
  std::lock_guard<std::mutex> lock(kv_->mutex());
  require_idle_locked();
  kv_manager_.reset(*kv_);
  messages_.clear();
  tools_.reset();
  mode_ = Mode::kEmpty;
}

void Session::cancel_active() {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(kv_->mutex());
    s = active_.lock();
  }
  if (s) s->cancel();
}

size_t Session::token_count() const {
  std::lock_guard<std::mutex> lock(kv_->mutex());
  return kv_->tokens().size();
}

void Session::sync_chat_tokens_locked() {
  const Model& model = engine().model();
  const Tokenizer& tok = model.tokenizer();
  ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  if (tok.bos() >= 0) opts.bos_token = tok.token_to_piece(tok.bos());
  if (tok.eos() >= 0) opts.eos_token = tok.token_to_piece(tok.eos());
  const ChatTemplate& tmpl = *model.chat_template();
  std::string text;
  if (!tools_) {
    text = tmpl.apply(messages_, opts);
  } else {
    // A template that knows tools gets them as its `tools` variable; any
    // other is told about them in a system message (core/chat/tools.h).
    const chat::ToolFormat format = chat::detect_tool_format(tmpl.source());
    if (format != chat::ToolFormat::kGeneric) opts.tools_json = tools_->json;
    text = tmpl.apply(chat::messages_for(messages_, *tools_, format), opts);
  }
  kv_manager_.replace_history(*kv_, tok.encode(text, true, true));
}

void Session::prepare_tool_calls_locked(StreamParams& params) const {
  using Mode = chat::ToolChoice::Mode;
  const chat::ToolChoice& choice = params.tool_choice;
  if (!tools_ || tools_->tools.empty() || mode_ != Session::Mode::kChat) {
    if (choice.mode == Mode::kRequired || choice.mode == Mode::kFunction) {
      fail(StatusCode::kInvalidArgument,
           "stream_start: tool_choice requires a tool but the session has none (tools need a chat session)");
    }
    return;
  }
  if (choice.mode == Mode::kNone) return;
  if (params.constraint.active()) {
    fail(StatusCode::kInvalidArgument,
         "stream_start: a stream that may call tools takes no other constraint (json_schema, grammar, regex, "
         "choices, json_object); set tool_choice to none to use one");
  }
  const Model& model = engine().model();
  params.tool_calls = true;
  params.tool_format = chat::detect_tool_format(model.chat_template()->source());
  if (!grammar::available()) {
    // Calls are still recognised, but nothing holds them to their schema.
    if (choice.mode != Mode::kAuto) {
      fail(StatusCode::kUnsupported,
           "stream_start: a required or named tool_choice needs the grammar engine, which this build lacks");
    }
    return;
  }
  params.constraint.kind = grammar::Constraint::Kind::kStructuralTag;
  params.constraint.text = chat::tool_constraint(*tools_, params.tool_format, choice);
}

std::shared_ptr<Stream> Session::submit_locked(std::shared_ptr<Stream> stream) {
  stream->sched().priority = priority_;
  stream->sched().arrival = engine().next_arrival();
  busy_ = true;
  active_ = stream;
  return stream;
}

std::shared_ptr<Stream> Session::start(const StreamParams& user_params) {
  user_params.validate();
  StreamParams params = user_params;
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard<std::mutex> lock(kv_->mutex());
    require_idle_locked();
    prepare_tool_calls_locked(params);
    if (mode_ == Mode::kChat) sync_chat_tokens_locked();
    const size_t n_tokens = kv_->tokens().size();
    if (n_tokens == 0)
      fail(StatusCode::kInvalidArgument, "stream_start: the session is empty; add a message or text first");
    if (!kv_->bounded() && n_tokens >= static_cast<size_t>(n_ctx_)) {
      fail(StatusCode::kContextFull, "stream_start: the prompt (" + std::to_string(n_tokens) +
                                         " tokens) fills the session's context of " + std::to_string(n_ctx_));
    }
    size_t need_slots = n_tokens + 1;
    if (kv_->bounded()) need_slots = std::min(need_slots, static_cast<size_t>(kv_->layout().max_slots()));
    const size_t bs = static_cast<size_t>(kv_manager_.block_size());
    const size_t need_blocks = (need_slots + bs - 1) / bs;
    if (need_blocks > kv_manager_.total_blocks()) {
      fail(StatusCode::kOutOfMemory, "stream_start: the prompt needs " + std::to_string(need_blocks) +
                                         " KV blocks but the pool has " + std::to_string(kv_manager_.total_blocks()));
    }
    // The last token must be run again to get logits if everything is cached.
    kv_manager_.uncompute(*kv_, n_tokens - 1);
    auto created = std::make_shared<Stream>(shared_from_this(), params);
    if (params.spec.kind != SpecParams::Kind::kNone) engine().prepare_speculation(*created);
    engine().prepare_constraint(*created);
    stream = submit_locked(std::move(created));
  }
  engine().submit(stream);
  return stream;
}

SessionCacheInfo Session::cache_info() const {
  std::lock_guard<std::mutex> lock(kv_->mutex());
  const KvSequence& kv = *kv_;
  SessionCacheInfo info;
  info.policy = kv.policy();
  info.n_tokens = kv.tokens().size();
  info.n_processed = kv.n_computed();
  info.resident = kv.resident();
  info.evicted = static_cast<uint64_t>(kv.layout().n_evicted());
  info.blocks = kv.n_blocks();
  const size_t bs = static_cast<size_t>(kv_manager_.block_size());
  info.max_blocks = kv.bounded() ? (static_cast<size_t>(kv.layout().max_slots()) + bs - 1) / bs : 0;
  info.max_position = kv.max_position();
  return info;
}

std::shared_ptr<Stream> Session::start_embedding(const std::vector<int32_t>& ids, Pooling pooling) {
  const ModelConfig& c = engine().model().config();
  if (ids.empty()) fail(StatusCode::kInvalidArgument, "embed: no tokens");
  for (int32_t id : ids) {
    if (id < 0 || id >= c.n_vocab) {
      fail(StatusCode::kInvalidArgument, "embed: token id " + std::to_string(id) + " out of range");
    }
  }
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard<std::mutex> lock(kv_->mutex());
    require_idle_locked();
    if (mode_ != Mode::kEmpty || !kv_->tokens().empty()) {
      fail(StatusCode::kInvalidArgument, "embed: the session is not empty");
    }
    append_tokens_locked(ids);
    stream = std::make_shared<Stream>(shared_from_this(), StreamParams{});
    stream->enable_embedding(pooling, c.n_embd);
    submit_locked(stream);
  }
  engine().submit(stream);
  return stream;
}

void Session::score(const std::vector<int32_t>& ids, float* out) {
  const int32_t n_vocab = engine().model().config().n_vocab;
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab)
      fail(StatusCode::kInvalidArgument, "score: token id " + std::to_string(id) + " out of range");
  }
  if (out) std::fill(out, out + ids.size(), std::nanf(""));
  if (ids.empty()) return;
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard<std::mutex> lock(kv_->mutex());
    require_idle_locked();
    if (mode_ == Mode::kChat)
      fail(StatusCode::kInvalidArgument, "score: the session holds chat messages; reset it first");
    const size_t first = kv_->tokens().size();
    // Logits are needed from the token before the first scored one (checked
    // before anything changes: a bounded cache may refuse to go back).
    if (out && first > 0) kv_manager_.uncompute(*kv_, first - 1);
    append_tokens_locked(ids);
    const size_t n_tokens = kv_->tokens().size();
    if (kv_->n_computed() + 1 >= n_tokens) return;  // nothing to run (e.g. the very first token)
    stream = std::make_shared<Stream>(shared_from_this(), StreamParams{});
    // Without `out` nothing is scored: logits only from the last token on.
    const size_t score_first = out ? first : n_tokens;
    stream->enable_scoring(score_first, n_tokens - score_first);
    submit_locked(stream);
  }
  engine().submit(stream);
  stream->wait();
  StreamEvent ev;
  while (stream->next(ev, 0) == StatusCode::kOk) {
    if (ev.type == StreamEvent::kError) throw Error(ev.status, "score: " + ev.error);
    if (ev.type == StreamEvent::kEnd && ev.end_reason == EndReason::kCancelled) {
      fail(StatusCode::kCancelled, "score: cancelled");
    }
  }
  if (out) std::copy(stream->scores().begin(), stream->scores().end(), out);
}

}  // namespace ember
