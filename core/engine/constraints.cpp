// Structured output in the engine's step (core/grammar): a stream's matcher
// from its constraint, the decode rows' masks filled during the forward
// pass, and drafted candidates the constraint rejects dropped.
#include <algorithm>
#include <chrono>
#include <cstdint>
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

bool Engine::checks_first(Stream& s) {
  if (!s.matcher() || s.params().logprobs) return false;
  // Greedy: one check (is the argmax allowed?) costs a few microseconds.
  if (s.sampler().greedy()) return true;
  // Sampled: the top-k allowed tokens, some 40-80 checks (~100-200 us),
  // against a mask filled during the forward pass, from microseconds to
  // milliseconds by the grammar's state. The last mask's cost decides; it
  // is measured again every kMaskProbeSteps steps.
  return s.mask_cost_us() > kCheapMaskUs && s.steps_since_mask() < kMaskProbeSteps;
}

void Engine::fill_timed(Stream& s) {
  const auto t0 = std::chrono::steady_clock::now();
  s.matcher()->fill(s.bitmask());
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  s.record_mask(static_cast<uint32_t>(std::min<int64_t>(us.count(), UINT32_MAX)));
}

std::future<void> Engine::fill_masks(StepWork& w) {
  std::vector<Stream*> rows;
  for (auto& en : w.entries) {
    Stream& s = *en.stream;
    if (!s.matcher() || en.tree || s.score_mode() || en.logit_index < 0) continue;
    s.set_checks_first(checks_first(s));
    if (s.checks_first()) {
      s.count_step_without_mask();
    } else {
      rows.push_back(&s);
    }
  }
  if (rows.empty()) return {};
  return std::async(std::launch::async, [rows] {
    for (Stream* s : rows) fill_timed(*s);
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
