// Engine::StepWork: what the phases of one engine step hand each other
// (core/engine/engine.cpp; the constraint masks in constraints.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/model/batch.h"

namespace ember {

// What the phases of one step hand each other.
struct Engine::StepWork {
  // plan: the live streams (stream i has sched().id == i), the scheduler's
  // plan, and one entry per stream that runs, with its rows in the batch.
  std::vector<Stream*> streams;
  std::vector<SchedSequence*> seqs;
  std::vector<KvManager::BudgetEntry> budget;
  StepPlan plan;
  struct Entry {
    Entry(Stream* s, int32_t c, int32_t li, size_t fl, int32_t n)
        : stream(s), chunk(c), logit_index(li), first_logit(fl), n_logit_rows(n) {}
    Stream* stream;
    int32_t chunk;        // history tokens the pass computes
    int32_t logit_index;  // -1: no logits this step
    size_t first_logit;   // history index of the row at logit_index
    int32_t n_logit_rows;
    int32_t embd_index = -1;  // embedding streams: the first of its rows in batch.embd_rows
    int32_t n_embd_rows = 0;
    bool lookahead = false;  // the plan reserved slots for a tree
    bool tree = false;       // a drafted tree: rows = its nodes (root first)
    // outcome: what apply does to the sequence, and whether the stream ends.
    KvManager::StepOutcome kv;
    EndReason end = EndReason::kNone;
    bool ends = false;
    std::string error;  // the stream fails (its logits processor did) instead of ending
  };
  std::vector<Entry> entries;
  Batch batch;
  int32_t n_logits = 0;
};

}  // namespace ember
