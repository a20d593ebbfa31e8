#include "core/scheduler/scheduler.h"

#include <algorithm>
#include <climits>

namespace ember {

StepPlan Scheduler::schedule(std::vector<SchedSequence*>& seqs, KvBudget& kv, int32_t token_budget) {
  StepPlan plan;
  // Rank: running decodes keep their place; then priority, then arrival.
  std::stable_sort(seqs.begin(), seqs.end(), [](const SchedSequence* a, const SchedSequence* b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    return a->arrival < b->arrival;
  });
  int32_t budget = config_.max_batch_tokens;
  if (token_budget > 0) budget = std::min(budget, token_budget);
  int32_t running = 0;
  for (const auto* s : seqs) running += s->running ? 1 : 0;
  std::vector<bool> planned(seqs.size(), false);

  // Decodes first (one token each, cheap, latency-critical), then prefill
  // chunks, each pass in rank order; background prompts beside interactive
  // decodes within config_.background_tokens.
  bool interactive_decodes = false;
  int32_t background_left = config_.background_tokens > 0 ? config_.background_tokens : INT32_MAX;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      for (const auto& r : plan.run) interactive_decodes |= r.first->priority <= 0;
    }
    for (size_t i = 0; i < seqs.size() && budget > 0; ++i) {
      SchedSequence& s = *seqs[i];
      if (planned[i] || s.n_tokens <= s.n_computed) continue;
      const size_t pending = s.n_tokens - s.n_computed;
      const bool decode = s.running && pending == 1;
      if ((pass == 0) != decode) continue;
      const bool held_back = !decode && s.priority > 0 && interactive_decodes;
      if (held_back && background_left <= 0) continue;
      if (!s.running && running >= config_.max_running) continue;
      const size_t need_slots = s.max_slots ? std::min(s.n_tokens + 1, s.max_slots) : s.n_tokens + 1;
      if (need_slots > kv.capacity_slots()) {
        if (s.running) kv.free(s);
        s.running = false;
        plan.failed.push_back(&s);
        planned[i] = true;
        continue;
      }
      if (!s.running) kv.admit(s);
      const size_t todo = s.n_tokens - s.n_computed;
      size_t limit = static_cast<size_t>(budget);
      if (s.max_chunk) limit = std::min(limit, s.max_chunk);
      if (held_back) limit = std::min(limit, static_cast<size_t>(background_left));
      const int32_t chunk = static_cast<int32_t>(std::min<size_t>(todo, limit));
      bool ok = kv.allocate(s, s.n_computed + static_cast<size_t>(chunk));
      // Out of blocks: take back what optional caches hold, else preempt
      // the lowest-ranked running sequence that is not already part of this
      // step, and retry.
      while (!ok && !kv.failed(s)) {
        if (kv.reclaim()) {
          ++reclaims_;
          ok = kv.allocate(s, s.n_computed + static_cast<size_t>(chunk));
          continue;
        }
        size_t victim = seqs.size();
        for (size_t j = seqs.size(); j-- > i + 1;) {
          if (seqs[j]->running && seqs[j]->preemptible) {
            victim = j;
            break;
          }
        }
        if (victim == seqs.size()) break;
        if (planned[victim]) {  // give back its share of this step
          for (auto it = plan.run.begin(); it != plan.run.end(); ++it) {
            if (it->first == seqs[victim]) {
              budget += it->second;
              plan.run.erase(it);
              break;
            }
          }
        }
        planned[victim] = true;  // not run again this step
        kv.free(*seqs[victim]);
        seqs[victim]->running = false;
        seqs[victim]->n_computed = 0;
        --running;
        ++preemptions_;
        plan.preempted.push_back(seqs[victim]);
        ok = kv.allocate(s, s.n_computed + static_cast<size_t>(chunk));
      }
      if (!ok) {  // waits for running sequences to finish
        if (!s.running) {
          kv.free(s);
          s.n_computed = 0;
        }
        continue;
      }
      if (!s.running) {
        s.running = true;
        ++running;
      }
      planned[i] = true;
      plan.run.emplace_back(&s, chunk);
      budget -= chunk;
      if (held_back) background_left -= chunk;
    }
  }
  // Speculative rows from what is left, never at another sequence's cost.
  for (const auto& [seq, chunk] : plan.run) {
    if (budget <= 0) break;
    if (seq->lookahead == 0 || chunk != 1 || seq->n_tokens != seq->n_computed + 1) continue;
    const size_t got = kv.lookahead(*seq, std::min(seq->lookahead, static_cast<size_t>(budget)));
    if (got == 0) continue;
    plan.lookahead.emplace_back(seq, static_cast<int32_t>(got));
    budget -= static_cast<int32_t>(got);
  }
  return plan;
}

}  // namespace ember
