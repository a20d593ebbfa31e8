// Engine, sessions and streams on the real model.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "core/engine/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "cpu/thread_governor.h"
#include "model_path.h"

namespace ember {
namespace {

std::shared_ptr<Model> shared_model() {
  static std::shared_ptr<Model> m = Model::load(test::default_model_path());
  return m;
}

struct Result {
  std::string text;
  std::vector<int32_t> tokens;
  EndReason reason = EndReason::kNone;
};

Result drain(const std::shared_ptr<Stream>& s) {
  Result r;
  for (;;) {
    StreamEvent ev;
    EXPECT_EQ(s->next(ev, 60000), StatusCode::kOk);
    if (ev.type == StreamEvent::kText) {
      r.text += ev.text;
      r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    } else {
      EXPECT_EQ(ev.type, StreamEvent::kEnd) << ev.error;
      r.reason = ev.end_reason;
      return r;
    }
  }
}

StreamParams greedy(int n) {
  StreamParams p;
  p.sampling.temperature = 0.0f;
  p.max_tokens = n;
  return p;
}

TEST(Engine, GreedyTextCompletionIsDeterministic) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(shared_model(), EngineParams{});
  std::string first;
  for (int run = 0; run < 2; ++run) {
    auto session = std::make_shared<Session>(engine, 0, "");
    session->add_text("The capital of France is", false);
    Result r = drain(session->start(greedy(16)));
    EXPECT_FALSE(r.text.empty());
    EXPECT_EQ(r.tokens.size(), 16u);
    EXPECT_EQ(r.reason, EndReason::kMaxTokens);
    if (run == 0)
      first = r.text;
    else
      EXPECT_EQ(first, r.text);
  }
  EXPECT_NE(first.find("Paris"), std::string::npos) << first;
}

TEST(Engine, ChatReplyEndsAtEndOfTurnAndContinues) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(shared_model(), EngineParams{});
  auto session = std::make_shared<Session>(engine, 0, "");
  session->add_message("user", "What is the capital of France? Answer with one word.");
  Result r = drain(session->start(greedy(64)));
  EXPECT_EQ(r.reason, EndReason::kEos) << r.text;
  EXPECT_NE(r.text.find("Paris"), std::string::npos) << r.text;
  const size_t after_first = session->token_count();
  session->add_message("user", "And of Germany?");
  Result r2 = drain(session->start(greedy(64)));
  EXPECT_FALSE(r2.text.empty());
  EXPECT_GT(session->token_count(), after_first);
  // The continued conversation answers exactly as a fresh session that is
  // given the whole conversation at once.
  auto fresh = std::make_shared<Session>(engine, 0, "");
  fresh->add_message("user", "What is the capital of France? Answer with one word.");
  fresh->add_message("assistant", r.text);
  fresh->add_message("user", "And of Germany?");
  Result r3 = drain(fresh->start(greedy(64)));
  EXPECT_EQ(r2.text, r3.text);
  EXPECT_EQ(session->token_count(), fresh->token_count());
}

TEST(Engine, BatchedEqualsIsolated) {
  EMBER_REQUIRE_MODEL();
  const std::vector<std::string> prompts = {"Once upon a time",  "The quick brown fox", "In 1492, Columbus",
                                            "def fibonacci(n):", "Water boils at",      "My favourite food is"};
  auto engine = Engine::create(shared_model(), EngineParams{});
  auto params_for = [](size_t i) {
    StreamParams p;
    p.max_tokens = 24;
    p.sampling.temperature = i % 2 ? 0.9f : 0.0f;
    p.sampling.seed = 100 + i;
    p.ignore_eos = true;
    return p;
  };
  std::vector<Result> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = std::make_shared<Session>(engine, 0, "");
    s->add_text(prompts[i], false);
    alone.push_back(drain(s->start(params_for(i))));
  }
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::shared_ptr<Stream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    sessions.push_back(std::make_shared<Session>(engine, 0, ""));
    sessions.back()->add_text(prompts[i], false);
  }
  for (size_t i = 0; i < prompts.size(); ++i) streams.push_back(sessions[i]->start(params_for(i)));
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result r = drain(streams[i]);
    EXPECT_EQ(r.tokens, alone[i].tokens) << "prompt " << i;
  }
  EXPECT_GT((*engine)->scheduler_stats().steps, 0u);
}

// The default engine picks its thread count as it goes (cpu/thread_governor.h);
// a stream's tokens and every logit must not depend on it. With the test
// rotation every matmul call runs on the next count (2, 1, 2, ...), against a
// fixed single thread.
TEST(Engine, ResultsDoNotDependOnTheThreadCount) {
  EMBER_REQUIRE_MODEL();
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<float> logits;
  };
  auto run = [](int threads, bool rotate) {
    cpu::ThreadGovernor::set_test_rotate(rotate);
    EngineParams ep;
    ep.n_threads = threads;
    auto engine = Engine::create(shared_model(), ep);
    Run r;
    auto s = std::make_shared<Session>(engine, 0, "");
    s->add_text("Three facts about the ocean:", false);
    StreamParams p = greedy(24);
    p.ignore_eos = true;
    r.tokens = drain(s->start(p)).tokens;
    const std::vector<int32_t> ids =
        (*engine)->model().tokenizer().encode("Water boils at one hundred degrees", false, false);
    const size_t vocab = static_cast<size_t>((*engine)->model().config().n_vocab);
    std::vector<float> logprobs(ids.size() - 1);
    r.logits.resize(ids.size() * vocab);
    (*engine)->score(ids.data(), ids.size(), logprobs.data(), r.logits.data());
    cpu::ThreadGovernor::set_test_rotate(false);
    return r;
  };
  const Run one = run(1, false), rotating = run(2, true);
  EXPECT_EQ(one.tokens, rotating.tokens);
  ASSERT_EQ(one.logits.size(), rotating.logits.size());
  EXPECT_EQ(std::memcmp(one.logits.data(), rotating.logits.data(), one.logits.size() * sizeof(float)), 0);
}

TEST(Engine, ScoreMatchesGreedyChoice) {
  EMBER_REQUIRE_MODEL();
  auto model = shared_model();
  auto engine = Engine::create(model, EngineParams{});
  std::vector<int32_t> ids = model->tokenizer().encode("The capital of France is", false, false);
  const int32_t vocab = model->config().n_vocab;
  std::vector<float> logits(ids.size() * vocab), logprobs(ids.size() - 1);
  (*engine)->score(ids.data(), ids.size(), logprobs.data(), logits.data());
  for (float lp : logprobs) {
    EXPECT_LE(lp, 0.0f);
    EXPECT_GT(lp, -40.0f);
  }
  const float* last = logits.data() + (ids.size() - 1) * vocab;
  const int32_t best = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
  auto s = std::make_shared<Session>(engine, 0, "");
  s->add_tokens(ids);
  Result r = drain(s->start(greedy(1)));
  ASSERT_EQ(r.tokens.size(), 1u);
  EXPECT_EQ(r.tokens[0], best);
}

TEST(Engine, CancelFromAnotherThreadLeavesSessionUsable) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(shared_model(), EngineParams{});
  auto session = std::make_shared<Session>(engine, 0, "");
  session->add_text("Tell me a long story about dragons.", false);
  StreamParams p = greedy(100000);
  p.ignore_eos = true;
  auto stream = session->start(p);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stream->cancel();
  });
  Result r = drain(stream);
  t.join();
  EXPECT_EQ(r.reason, EndReason::kCancelled);
  EXPECT_THROW(session->add_message("user", "hi"), Error);  // text mode
  session->add_text(" The end.", false);
  StreamParams p2 = greedy(4);
  p2.ignore_eos = true;
  Result r2 = drain(session->start(p2));
  EXPECT_EQ(r2.tokens.size(), 4u);
}

TEST(Engine, BusyAndContextErrors) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(shared_model(), EngineParams{});
  auto session = std::make_shared<Session>(engine, 32, "");
  EXPECT_THROW(session->start(greedy(4)), Error);  // empty
  session->add_text("Hello there", false);
  StreamParams p = greedy(100000);
  p.ignore_eos = true;
  auto s = session->start(p);
  try {
    session->start(greedy(4));
    FAIL() << "second start should be busy";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kBusy);
  }
  Result r = drain(s);
  EXPECT_EQ(r.reason, EndReason::kContextFull);
  EXPECT_EQ(session->token_count(), 32u);
  try {
    session->add_text(std::string(400, 'a'), false);
    FAIL() << "should be context full";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kContextFull);
  }
}

TEST(Engine, StopStringIsNotEmitted) {
  EMBER_REQUIRE_MODEL();
  auto engine = Engine::create(shared_model(), EngineParams{});
  auto session = std::make_shared<Session>(engine, 0, "");
  session->add_text("1, 2, 3, 4, 5, 6,", false);
  StreamParams p = greedy(64);
  p.stop = {" 9"};
  Result r = drain(session->start(p));
  EXPECT_EQ(r.reason, EndReason::kStopString) << r.text;
  EXPECT_EQ(r.text.find(" 9"), std::string::npos) << r.text;
  EXPECT_NE(r.text.find("8"), std::string::npos) << r.text;
}

// A failure inside the worker's step reaches every stream of the step as an
// ERROR event (a consumer blocked in next(-1) wakes up), and the engine goes
// on serving new streams.
TEST(Engine, AFailedStepEndsItsStreamsWithAnErrorAndTheEngineGoesOn) {
  EMBER_REQUIRE_MODEL();
  EngineParams ep;
  ep.n_threads = 1;
  ep.kv_memory_bytes = 48ull << 20;
  auto engine = Engine::create(shared_model(), ep);
  static std::atomic<int> steps{0};
  steps = 0;
  testing::g_step_fault_hook = [] {
    if (++steps == 3) throw std::runtime_error("injected fault");
  };
  struct Unhook {
    ~Unhook() { testing::g_step_fault_hook = nullptr; }
  } unhook;
  auto a = std::make_shared<Session>(engine, 0, "");
  auto b = std::make_shared<Session>(engine, 0, "");
  a->add_text("Once upon a time", false);
  b->add_text("The weather today", false);
  auto sa = a->start(greedy(64));
  auto sb = b->start(greedy(64));
  for (auto* s : {&sa, &sb}) {
    StreamEvent ev;
    do {
      ASSERT_EQ((*s)->next(ev, -1), StatusCode::kOk);
    } while (ev.type == StreamEvent::kText);
    EXPECT_EQ(ev.type, StreamEvent::kError);
    EXPECT_EQ(ev.status, StatusCode::kInternal);
    EXPECT_NE(ev.error.find("injected fault"), std::string::npos) << ev.error;
  }
  testing::g_step_fault_hook = nullptr;
  // Both sessions are idle again and the engine still works.
  Result r = drain(a->start(greedy(4)));
  EXPECT_EQ(r.tokens.size(), 4u);
}

}  // namespace
}  // namespace ember
