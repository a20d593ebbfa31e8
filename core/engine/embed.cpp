// Embeddings through the engine (core/engine/embed.h): one private session
// and one embedding stream per input, all submitted before any is waited
// for, so the scheduler runs them in the same steps.
#include "core/engine/embed.h"

#include <cmath>

#include "core/engine/engine.h"
#include "core/engine/session.h"
#include "core/engine/stream.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status.h"

namespace ember {

Pooling parse_pooling(const std::string& name) {
  if (name == "mean") return Pooling::kMean;
  if (name == "last") return Pooling::kLast;
  if (name == "cls") return Pooling::kCls;
  fail(StatusCode::kInvalidArgument, "embed: pooling must be mean, last or cls (got '" + name + "')");
}

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kMean: return "mean";
    case Pooling::kLast: return "last";
    case Pooling::kCls: return "cls";
  }
  return "?";
}

namespace {
void check_count(size_t n) {
  if (n == 0) fail(StatusCode::kInvalidArgument, "embed: no inputs");
  if (n > EmbedParams::kMaxInputs) {
    fail(StatusCode::kInvalidArgument,
         "embed: " + std::to_string(n) + " inputs (at most " + std::to_string(EmbedParams::kMaxInputs) + " per call)");
  }
}
}  // namespace

std::vector<std::vector<float>> embed_tokens(const std::shared_ptr<EngineOwner>& engine,
                                             const std::vector<std::vector<int32_t>>& inputs, const EmbedParams& p) {
  if (p.pooling != Pooling::kMean && p.pooling != Pooling::kLast && p.pooling != Pooling::kCls) {
    fail(StatusCode::kInvalidArgument, "embed: unknown pooling " + std::to_string(static_cast<int32_t>(p.pooling)));
  }
  check_count(inputs.size());
  const ModelConfig& c = (*engine)->model().config();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].empty()) fail(StatusCode::kInvalidArgument, "embed: input " + std::to_string(i) + " is empty");
    if (inputs[i].size() > static_cast<size_t>(c.n_ctx_train)) {
      fail(StatusCode::kContextFull, "embed: input " + std::to_string(i) + " has " + std::to_string(inputs[i].size()) +
                                         " tokens, more than the model's context of " +
                                         std::to_string(c.n_ctx_train));
    }
    for (int32_t id : inputs[i]) {
      if (id < 0 || id >= c.n_vocab) {
        fail(StatusCode::kInvalidArgument,
             "embed: input " + std::to_string(i) + " has token id " + std::to_string(id) + ", out of range");
      }
    }
  }
  // Every input's stream is running before the first is waited for. If one
  // cannot start, those already running are cancelled (their sessions go).
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::shared_ptr<Stream>> streams;
  struct CancelOnThrow {
    std::vector<std::shared_ptr<Stream>>& streams;
    bool done = false;
    ~CancelOnThrow() {
      if (done) return;
      for (auto& s : streams) s->cancel();
      for (auto& s : streams) s->wait();
    }
  } guard{streams};
  for (const auto& ids : inputs) {
    // Background priority: beside interactive streams that decode, an
    // embedding takes at most EngineParams::background_step_tokens a step.
    auto session = std::make_shared<Session>(engine, 0, "", /*priority=*/1);
    streams.push_back(session->start_embedding(ids, p.pooling));
    sessions.push_back(std::move(session));
  }
  std::vector<std::vector<float>> out;
  out.reserve(inputs.size());
  std::string error;
  StatusCode code = StatusCode::kOk;
  for (auto& s : streams) {
    s->wait();
    StreamEvent ev;
    while (s->next(ev, 0) == StatusCode::kOk) {
      if (ev.type == StreamEvent::kError && code == StatusCode::kOk) {
        code = ev.status;
        error = "embed: " + ev.error;
      } else if (ev.type == StreamEvent::kEnd && ev.end_reason == EndReason::kCancelled && code == StatusCode::kOk) {
        code = StatusCode::kCancelled;
        error = "embed: cancelled";
      }
    }
    out.push_back(s->embedding());
  }
  guard.done = true;
  if (code != StatusCode::kOk) fail(code, error);
  if (p.normalize) {
    for (auto& v : out) {
      double sum = 0.0;
      for (float x : v) sum += static_cast<double>(x) * x;
      const double norm = std::sqrt(sum);
      if (norm > 0.0) {
        for (float& x : v) x = static_cast<float>(x / norm);
      }
    }
  }
  return out;
}

std::vector<std::vector<float>> embed_texts(const std::shared_ptr<EngineOwner>& engine,
                                            const std::vector<std::string>& texts, const EmbedParams& p) {
  const Tokenizer& tok = (*engine)->model().tokenizer();
  check_count(texts.size());
  std::vector<std::vector<int32_t>> inputs;
  inputs.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    if (texts[i].empty()) fail(StatusCode::kInvalidArgument, "embed: text " + std::to_string(i) + " is empty");
    inputs.push_back(tok.encode(texts[i], /*add_special=*/true, p.parse_special));
  }
  return embed_tokens(engine, inputs, p);
}

}  // namespace ember
