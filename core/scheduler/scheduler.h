// core::Scheduler: iteration-level batch selection (Orca / vLLM v1 style).
// Each step it decides how many tokens each sequence runs: one for a
// decoding sequence, a chunk of a long prompt under the step's token budget
// (Sarathi's chunked prefill), so running streams keep streaming while a
// prompt is prefilled. Higher priority first, then arrival order (fairness
// among equals); at most max_running sequences hold the cache. When the KV
// pool runs out it preempts the lowest-ranked running sequence (its blocks
// are freed and it is re-queued for recompute); a sequence fails only if it
// alone cannot fit in the whole pool.
//
// Speculative rows (a decode's lookahead: a token tree) come last, from what
// the sequences' own tokens left of the token budget and the pool: a tree
// shrinks or is skipped before any sequence waits or is preempted.
//
// The scheduler sees the cache only through KvBudget, so it is tested
// without a model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace ember {

// What the scheduler sees of one sequence.
struct SchedSequence {
  uint64_t id = 0;
  int32_t priority = 0;   // lower value = more urgent (0 interactive, 1 background)
  uint64_t arrival = 0;   // submission order
  size_t n_tokens = 0;    // tokens known: prompt + generated so far
  size_t n_computed = 0;  // tokens whose K/V are in the cache
  bool running = false;   // holds cache blocks
  // Bounded cache policies (window/sink sessions, core/kv_cache/streaming.h):
  size_t max_chunk = 0;     // most tokens per step (0: no limit)
  size_t max_slots = 0;     // most slots it ever holds (0: n_tokens + 1)
  bool preemptible = true;  // false once its cache cannot be recomputed (evicted tokens)
  // Speculative decoding: rows a decode would add after its token this step
  // (a token tree's nodes), if the pool and the token budget allow.
  size_t lookahead = 0;
};

// The narrow cache interface: grow a sequence to n_slots (all or nothing),
// or drop all its blocks (preemption).
class KvBudget {
 public:
  virtual ~KvBudget() = default;
  virtual bool allocate(SchedSequence& seq, size_t n_slots) = 0;
  // True when an allocation for `seq` failed with an error (not for want of
  // blocks): preempting others would not help, the sequence fails.
  virtual bool failed(const SchedSequence& seq) const { return false; }
  // Called before a waiting sequence is sized: it may take cached prefix
  // blocks and raise n_computed (a prefix-cache hit).
  virtual void admit(SchedSequence& seq) {}
  virtual void free(SchedSequence& seq) = 0;
  // Slots a single sequence could hold if it had the whole pool.
  virtual size_t capacity_slots() const = 0;
  // Reserves slots for at most `n` rows after a decode's token (its
  // allocation this step done), never by taking anything from another
  // sequence; returns how many it reserved (fewer when the pool or the
  // sequence's cache policy has less room).
  virtual size_t lookahead(SchedSequence& seq, size_t n) { return 0; }
  // Gives back blocks that optional caches hold (a draft model's KV in the
  // same pool): tried before any sequence is preempted or left waiting.
  // True when it freed something (false once there is nothing left).
  virtual bool reclaim() { return false; }
};

struct SchedulerConfig {
  int32_t max_batch_tokens = 512;
  int32_t max_running = 64;
  // The most prompt tokens background sequences (priority > 0: embeddings,
  // background sessions) run in a step while an interactive sequence
  // decodes in it (0: no limit). A step's time grows with its rows, and an
  // interactive stream gets one token per step: this bounds what background
  // prompts add to the time between its tokens (a 512-token chunk of a
  // 135M model is ~1 s on 2 cores; 16 tokens ~35 ms). Steps without an
  // interactive decode give background prompts the whole budget.
  int32_t background_tokens = 16;
};

struct StepPlan {
  std::vector<std::pair<SchedSequence*, int32_t>> run;  // sequence, tokens this step
  std::vector<SchedSequence*> preempted;                // freed this step, re-queued
  std::vector<SchedSequence*> failed;                   // can never fit
  // Lookahead rows reserved after a planned decode (sequence, rows): what is
  // left of the budget after every sequence's own tokens, in rank order.
  std::vector<std::pair<SchedSequence*, int32_t>> lookahead;
  // Rows of `seq` this step beyond its own tokens (0: none).
  int32_t lookahead_of(const SchedSequence* seq) const {
    for (const auto& l : lookahead) {
      if (l.first == seq) return l.second;
    }
    return 0;
  }
  // The sequences' own tokens (lookahead rows not counted).
  size_t tokens() const {
    size_t n = 0;
    for (const auto& r : run) n += static_cast<size_t>(r.second);
    return n;
  }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config) : config_(config) {}
  const SchedulerConfig& config() const { return config_; }

  // Plans one step over `seqs` (every unfinished sequence). Updates
  // running / n_computed of preempted sequences through `kv`.
  // token_budget > 0 lowers the step's token budget below max_batch_tokens
  // (a host's frame budget in manual mode): prompts are chunked to fit.
  StepPlan schedule(std::vector<SchedSequence*>& seqs, KvBudget& kv, int32_t token_budget = 0);

  uint64_t preemptions() const { return preemptions_; }
  // Times KvBudget::reclaim() freed blocks for a sequence.
  uint64_t reclaims() const { return reclaims_; }

 private:
  SchedulerConfig config_;
  uint64_t preemptions_ = 0;
  uint64_t reclaims_ = 0;
};

}  // namespace ember
