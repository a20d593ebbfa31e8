#include "core/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace ember {
namespace {

// A pool of `blocks` blocks of `block_size` slots, tracked per sequence.
class FakeBudget : public KvBudget {
 public:
  FakeBudget(size_t blocks, size_t block_size) : blocks_(blocks), block_size_(block_size) {}
  bool allocate(SchedSequence& s, size_t n_slots) override {
    const size_t need = (n_slots + block_size_ - 1) / block_size_;
    size_t& held = held_[s.id];
    if (need <= held) return true;
    if (need - held > free()) return false;
    held = need;
    return true;
  }
  void free(SchedSequence& s) override { held_.erase(s.id); }
  size_t capacity_slots() const override { return blocks_ * block_size_; }
  // As KvManager::StepBudget: halved until the pool has the slots.
  size_t lookahead(SchedSequence& s, size_t n) override {
    for (; n > 0; n /= 2) {
      if (allocate(s, s.n_computed + 1 + n)) return n;
    }
    return 0;
  }
  size_t free() const {
    size_t used = 0;
    for (const auto& [id, n] : held_) used += n;
    return blocks_ - used;
  }
  size_t held(uint64_t id) const {
    auto it = held_.find(id);
    return it == held_.end() ? 0 : it->second;
  }

 private:
  size_t blocks_, block_size_;
  std::map<uint64_t, size_t> held_;
};

SchedSequence seq(uint64_t id, size_t tokens, int priority = 0) {
  SchedSequence s;
  s.id = id;
  s.arrival = id;
  s.n_tokens = tokens;
  s.priority = priority;
  return s;
}

int32_t tokens_for(const StepPlan& p, uint64_t id) {
  for (const auto& [s, n] : p.run) {
    if (s->id == id) return n;
  }
  return 0;
}

void advance(StepPlan& p) {
  for (auto& [s, n] : p.run) s->n_computed += static_cast<size_t>(n);
}

TEST(Scheduler, ChunksLongPromptUnderBudgetWhileDecodesContinue) {
  Scheduler sched({/*max_batch_tokens=*/64, /*max_running=*/8});
  FakeBudget kv(1000, 16);
  SchedSequence a = seq(1, 10), b = seq(2, 300);
  std::vector<SchedSequence*> all = {&a, &b};
  StepPlan p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 1), 10);
  EXPECT_EQ(tokens_for(p, 2), 54);  // what is left of the budget
  advance(p);
  a.n_tokens++;  // a sampled a token: now decoding
  for (int step = 0; step < 4; ++step) {
    p = sched.schedule(all, kv);
    EXPECT_EQ(tokens_for(p, 1), 1) << "decode runs every step";
    EXPECT_EQ(tokens_for(p, 2), static_cast<int32_t>(std::min<size_t>(63, b.n_tokens - b.n_computed)));
    EXPECT_LE(p.tokens(), 64u);
    advance(p);
    a.n_tokens++;
  }
}

TEST(Scheduler, PriorityFirstThenArrival) {
  Scheduler sched({32, 8});
  FakeBudget kv(1000, 16);
  SchedSequence bg = seq(1, 100, /*priority=*/1), fg = seq(2, 100, 0), fg2 = seq(3, 100, 0);
  std::vector<SchedSequence*> all = {&bg, &fg, &fg2};
  StepPlan p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 2), 32);
  EXPECT_EQ(tokens_for(p, 3), 0);
  EXPECT_EQ(tokens_for(p, 1), 0);
}

// Background prompts (embeddings, background sessions) take at most
// background_tokens a step while an interactive sequence decodes, and the
// whole budget otherwise; a background decode does not hold them back.
TEST(Scheduler, BackgroundPromptsBesideInteractiveDecodesAreBounded) {
  Scheduler sched({/*max_batch_tokens=*/256, /*max_running=*/8, /*background_tokens=*/16});
  FakeBudget kv(1000, 16);
  SchedSequence chat = seq(1, 10, 0), doc1 = seq(2, 3000, 1), doc2 = seq(3, 3000, 1);
  std::vector<SchedSequence*> all = {&chat, &doc1, &doc2};
  StepPlan p = sched.schedule(all, kv);  // the chat's prompt: no decode yet
  EXPECT_EQ(tokens_for(p, 1), 10);
  EXPECT_EQ(tokens_for(p, 2), 246);
  advance(p);
  chat.n_tokens++;  // now decoding
  for (int step = 0; step < 3; ++step) {
    p = sched.schedule(all, kv);
    EXPECT_EQ(tokens_for(p, 1), 1);
    EXPECT_EQ(tokens_for(p, 2) + tokens_for(p, 3), 16) << "step " << step;
    advance(p);
    chat.n_tokens++;
  }
  chat.n_tokens = chat.n_computed;  // the chat ended (nothing pending)
  p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 2) + tokens_for(p, 3), 256);
  // Only background sequences decoding: no bound.
  advance(p);
  SchedSequence bg_chat = seq(4, 5, 1);
  bg_chat.arrival = 0;  // ahead of the documents
  all = {&bg_chat, &doc1, &doc2};
  p = sched.schedule(all, kv);
  advance(p);
  bg_chat.n_tokens++;
  p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 4), 1);
  EXPECT_EQ(tokens_for(p, 2) + tokens_for(p, 3), 255);
  // 0: no bound at all.
  Scheduler unbounded({256, 8, 0});
  FakeBudget kv2(1000, 16);
  SchedSequence c = seq(1, 1, 0), d = seq(2, 300, 1);
  c.running = true;
  kv2.allocate(c, 2);
  c.n_tokens = 2;
  c.n_computed = 1;
  std::vector<SchedSequence*> two = {&c, &d};
  p = unbounded.schedule(two, kv2);
  EXPECT_EQ(tokens_for(p, 1), 1);
  EXPECT_EQ(tokens_for(p, 2), 255);
}

TEST(Scheduler, CapsRunningSequences) {
  Scheduler sched({512, 2});
  FakeBudget kv(1000, 16);
  SchedSequence a = seq(1, 10), b = seq(2, 10), c = seq(3, 10);
  std::vector<SchedSequence*> all = {&a, &b, &c};
  StepPlan p = sched.schedule(all, kv);
  EXPECT_EQ(p.run.size(), 2u);
  EXPECT_EQ(tokens_for(p, 3), 0);
}

TEST(Scheduler, PreemptsLowestRankedAndResumes) {
  Scheduler sched({512, 8});
  FakeBudget kv(4, 16);  // 64 slots in all
  SchedSequence low = seq(1, 40, 1), high = seq(2, 30, 0);
  std::vector<SchedSequence*> all = {&low};
  StepPlan p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 1), 40);  // 3 blocks
  advance(p);
  low.n_tokens++;
  all = {&low, &high};
  p = sched.schedule(all, kv);  // high needs 2 blocks, 1 free: low is preempted
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0]->id, 1u);
  EXPECT_EQ(low.n_computed, 0u);
  EXPECT_FALSE(low.running);
  EXPECT_EQ(tokens_for(p, 2), 30);
  EXPECT_EQ(sched.preemptions(), 1u);
  advance(p);
  high.n_tokens = high.n_computed;  // high finished
  kv.free(high);
  high.running = false;
  all = {&low};
  p = sched.schedule(all, kv);  // low recomputes its 41 tokens
  EXPECT_EQ(tokens_for(p, 1), 41);
}

// Blocks held by optional caches (a draft model's KV) go before any
// sequence is preempted, and before a sequence is left waiting.
TEST(Scheduler, ReclaimsOptionalCachesBeforePreempting) {
  class CachingBudget : public FakeBudget {
   public:
    using FakeBudget::FakeBudget;
    bool allocate(SchedSequence& s, size_t n_slots) override {
      const size_t need = (n_slots + 15) / 16;
      if (need > held(s.id) && need - held(s.id) > free() - cached_) return false;
      return FakeBudget::allocate(s, n_slots);
    }
    bool reclaim() override {
      ++calls_;
      if (cached_ == 0) return false;
      cached_ = 0;
      return true;
    }
    size_t cached_ = 2;  // blocks a cache holds
    int calls_ = 0;
  };
  Scheduler sched({512, 8});
  CachingBudget kv(6, 16);  // 96 slots, 2 of its 6 blocks cached
  SchedSequence low = seq(1, 40, 1), high = seq(2, 30, 0);
  std::vector<SchedSequence*> all = {&low};
  StepPlan p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 1), 40);  // 3 blocks, 1 left beside the cache
  EXPECT_EQ(kv.calls_, 0);
  advance(p);
  low.n_tokens++;
  all = {&low, &high};
  p = sched.schedule(all, kv);  // high needs 2 blocks: the cache goes, low stays
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_EQ(tokens_for(p, 2), 30);
  EXPECT_EQ(tokens_for(p, 1), 1);
  EXPECT_EQ(sched.preemptions(), 0u);
  EXPECT_EQ(sched.reclaims(), 1u);
  EXPECT_EQ(kv.cached_, 0u);
  // Nothing left to reclaim: the next shortage preempts as before.
  advance(p);
  SchedSequence third = seq(3, 20, 0);
  all = {&low, &high, &third};
  p = sched.schedule(all, kv);
  EXPECT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(sched.reclaims(), 1u);
}

TEST(Scheduler, FailsOnlyWhatCannotFitTheWholePool) {
  Scheduler sched({512, 8});
  FakeBudget kv(2, 16);  // 32 slots
  SchedSequence big = seq(1, 40), small = seq(2, 10);
  std::vector<SchedSequence*> all = {&big, &small};
  StepPlan p = sched.schedule(all, kv);
  ASSERT_EQ(p.failed.size(), 1u);
  EXPECT_EQ(p.failed[0]->id, 1u);
  EXPECT_EQ(tokens_for(p, 2), 10);
}

// An allocation that fails with an error (KvBudget::failed) is not a full
// pool: nobody is preempted for it.
TEST(Scheduler, AFailedAllocationPreemptsNobody) {
  class FailingBudget : public FakeBudget {
   public:
    using FakeBudget::FakeBudget;
    bool allocate(SchedSequence& s, size_t n_slots) override {
      if (s.id == failing_) {
        failed_ = true;
        return false;
      }
      return FakeBudget::allocate(s, n_slots);
    }
    bool failed(const SchedSequence& s) const override { return failed_ && s.id == failing_; }
    uint64_t failing_ = 0;
    bool failed_ = false;
  };
  Scheduler sched({512, 8});
  FailingBudget kv(100, 16);
  SchedSequence a = seq(1, 20), b = seq(2, 20);
  std::vector<SchedSequence*> all = {&a, &b};
  StepPlan p = sched.schedule(all, kv);
  advance(p);
  a.n_tokens++;
  b.n_tokens++;
  kv.failing_ = 1;  // a ranks first; b would be its victim
  p = sched.schedule(all, kv);
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_EQ(sched.preemptions(), 0u);
  EXPECT_EQ(tokens_for(p, 1), 0);
  EXPECT_EQ(tokens_for(p, 2), 1);
  EXPECT_TRUE(b.running);
}

// A speculative tree's rows (a decode's lookahead) come from what the
// sequences' own tokens leave of the pool and the token budget: a prefill
// that arrives takes the blocks and the tree shrinks, or is skipped; nobody
// is preempted or left waiting for it.
TEST(Scheduler, TreeKvGivesWayToAnotherSequencesPrefill) {
  Scheduler sched({64, 8});
  FakeBudget kv(5, 16);  // 80 slots
  SchedSequence spec = seq(1, 30);
  std::vector<SchedSequence*> all = {&spec};
  StepPlan p = sched.schedule(all, kv);
  advance(p);
  spec.n_tokens++;
  // Alone: the decode and a tree of 12 nodes (31 + 12 slots: 3 blocks).
  spec.lookahead = 12;
  p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 1), 1);
  EXPECT_EQ(p.lookahead_of(&spec), 12);
  EXPECT_EQ(kv.held(1), 3u);
  // Held only for the step (the engine's apply releases what the tree left):
  kv.free(spec);
  ASSERT_TRUE(kv.allocate(spec, spec.n_computed + 1));
  // A prompt of 40 tokens arrives: 3 blocks beside the decode's 2 leave no
  // room for a tree.
  SchedSequence prompt = seq(2, 40);
  all = {&spec, &prompt};
  p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 2), 40);
  EXPECT_EQ(tokens_for(p, 1), 1);
  EXPECT_EQ(p.lookahead_of(&spec), 1) << "31 + 1 slots still fit its 2 blocks";
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_EQ(sched.preemptions(), 0u);
  // The token budget bounds trees too: what the rows of the step left.
  Scheduler tight({20, 8});
  FakeBudget big(100, 16);
  SchedSequence a = seq(1, 30), b = seq(2, 100);
  all = {&a};
  p = tight.schedule(all, big);
  advance(p);
  p = tight.schedule(all, big);
  advance(p);
  a.n_tokens = a.n_computed + 1;
  a.lookahead = 12;
  all = {&a, &b};
  p = tight.schedule(all, big);
  EXPECT_EQ(tokens_for(p, 1), 1);
  EXPECT_EQ(tokens_for(p, 2), 19);
  EXPECT_EQ(p.lookahead_of(&a), 0) << "the prompt's chunk took the rest of the budget";
}

TEST(Scheduler, WaitsWhenNothingCanBePreempted) {
  Scheduler sched({16, 8});
  FakeBudget kv(3, 16);
  SchedSequence a = seq(1, 40), b = seq(2, 20);
  std::vector<SchedSequence*> all = {&a, &b};
  // Step 1: a takes the whole budget (16 tokens, 1 block). b waits (budget).
  StepPlan p = sched.schedule(all, kv);
  EXPECT_EQ(tokens_for(p, 1), 16);
  EXPECT_EQ(tokens_for(p, 2), 0);
  EXPECT_TRUE(p.failed.empty());
}

}  // namespace
}  // namespace ember
