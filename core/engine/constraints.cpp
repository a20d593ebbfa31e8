// Structured output in the engine's step (core/grammar): a stream's matcher
// from its constraint, the decode rows' masks filled during the forward
// pass, and drafted candidates the constraint rejects dropped.
#include <algorithm>
#include <future>

#include "core/engine/engine.h"
#include "core/engine/step_work.h"

namespace ember {

void Engine::prepare_constraint(Stream& stream) {
  const grammar::Constraint& c = stream.constraint();
  if (!c.active()) return;
  grammar::Compiler* compiler;
  {
    std::lock_guard<std::mutex> lock(grammar_mutex_);
    if (!grammar_) grammar_ = std::make_unique<grammar::Compiler>(model_->tokenizer());
    compiler = grammar_.get();
  }
  stream.set_matcher(std::make_unique<grammar::Matcher>(compiler->compile(c)));
}

bool Engine::checks_first(Stream& s) { return s.matcher() && !s.params().logprobs; }

std::future<void> Engine::fill_masks(StepWork& w) {
  std::vector<Stream*> rows;
  for (auto& en : w.entries) {
    if (en.stream->matcher() && !en.tree && !en.stream->score_mode() && en.logit_index >= 0 &&
        !checks_first(*en.stream)) {
      rows.push_back(en.stream);
    }
  }
  if (rows.empty()) return {};
  return std::async(std::launch::async, [rows] {
    for (Stream* s : rows) s->matcher()->fill(s->bitmask());
  });
}

speculative::SpecStep::CandidateFilter Engine::candidate_filter(Stream& s) {
  grammar::Matcher* m = s.matcher();
  if (!m) return {};
  return [m](const std::vector<int32_t>& path, std::vector<speculative::Candidate>& cands) {
    const size_t n = m->accept_all(path);
    if (n != path.size()) {
      cands.clear();
    } else {
      cands.erase(std::remove_if(cands.begin(), cands.end(),
                                 [m](const speculative::Candidate& c) { return !m->allows(c.token); }),
                  cands.end());
    }
    m->rollback(static_cast<int32_t>(n));
  };
}

}  // namespace ember
