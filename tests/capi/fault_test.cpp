// Failures are errors, never crashes or hangs (issue 14, item 5):
// - allocations made to fail by ember_test_inject_alloc_failures (the KV
//   pool's blocks, the backend's buffers and weights, the KV pool itself, the
//   model's copy of its file) come back as EMBER_ERR_OUT_OF_MEMORY, from the
//   call or as the ERROR event of the streams they hit; nothing leaks (the
//   ASan pass runs these tests) and the engine keeps generating exactly what
//   it generates untouched;
// - a model file truncated, overwritten or deleted after ember_model_load
//   changes nothing (the weights live in private memory), while the opt-in
//   shared mapping (EMBER_MODEL_MAP_SHARED) does kill a process then: the
//   negative control, run in a child process.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "capi/capi_test_util.h"

using namespace capi_test;

namespace {

constexpr const char* kPromptA = "The capital of France is";
constexpr const char* kPromptB = "Water boils at a temperature of";
constexpr int32_t kTokens = 8;

// Arms `site` for the scope; disarm() reports how many failures were injected.
class Injection {
 public:
  Injection(int32_t site, int64_t skip, int64_t count) : site_(site) {
    EXPECT_EQ(ember_test_inject_alloc_failures(site, skip, count, nullptr), EMBER_OK) << ember_last_error();
  }
  ~Injection() { disarm(); }
  uint64_t disarm() {
    uint64_t n = 0;
    EXPECT_EQ(ember_test_inject_alloc_failures(site_, 0, 0, &n), EMBER_OK);
    injected_ += n;
    return injected_;
  }

 private:
  int32_t site_;
  uint64_t injected_ = 0;
};

EnginePtr make_manual_engine(ember_model* model) {
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.kv_memory_bytes = kTestKvBytes;
  ep.n_threads = 1;
  ep.manual_step = 1;
  ember_engine* e = nullptr;
  EXPECT_EQ(ember_engine_create(model, &ep, &e), EMBER_OK) << ember_last_error();
  return EnginePtr(e);
}

SessionPtr text_session(ember_engine* engine, const char* prompt) {
  SessionPtr s = make_session(engine);
  if (s) {
    EXPECT_EQ(ember_session_add_text(s.get(), prompt, 0), EMBER_OK) << ember_last_error();
  }
  return s;
}

// Greedy continuation of `prompt` on a fresh session of `engine` (worker mode).
std::string greedy(ember_engine* engine, const char* prompt) {
  SessionPtr s = text_session(engine, prompt);
  if (!s) return {};
  const Collected c = run(s.get(), greedy_params(kTokens));
  EXPECT_EQ(c.error, EMBER_OK) << ember_last_error();
  return c.text;
}

// The untouched references, from an engine no fault ever reached.
const std::string& reference(const char* prompt) {
  static const std::string a = [] {
    EnginePtr e = make_engine(shared_model());
    return greedy(e.get(), kPromptA);
  }();
  static const std::string b = [] {
    EnginePtr e = make_engine(shared_model());
    return greedy(e.get(), kPromptB);
  }();
  return prompt == kPromptA ? a : b;
}

// Steps a manual engine until every stream has ended (bounded: never hangs).
void step_until_ended(ember_engine* engine, const std::vector<ember_stream*>& streams) {
  for (int i = 0; i < 10000; ++i) {
    bool all = true;
    for (ember_stream* s : streams) {
      ember_stream_stats_t st;
      std::memset(&st, 0, sizeof st);
      st.size = sizeof st;
      EXPECT_EQ(ember_stream_stats(s, &st), EMBER_OK);
      all &= st.finished != 0;
    }
    if (all) return;
    size_t n = 0;
    ASSERT_EQ(ember_engine_step(engine, 0, 0, &n), EMBER_OK) << ember_last_error();
  }
  ADD_FAILURE() << "the streams did not end";
}

}  // namespace

TEST(CapiAllocFailure, UnknownSiteIsInvalidArgument) {
  EXPECT_STATUS(ember_test_inject_alloc_failures(-1, 0, 1, nullptr), EMBER_ERR_INVALID_ARGUMENT);
  EXPECT_STATUS(ember_test_inject_alloc_failures(5, 0, 1, nullptr), EMBER_ERR_INVALID_ARGUMENT);
  uint64_t n = 7;
  EXPECT_STATUS(ember_test_inject_alloc_failures(EMBER_ALLOC_KV_BLOCK, 0, 0, &n), EMBER_OK);
  EXPECT_EQ(n, 0u);
}

TEST(CapiAllocFailure, ModelLoadIsOutOfMemory) {
  EMBER_REQUIRE_MODEL();
  {
    Injection fault(EMBER_ALLOC_MODEL_FILE, 0, 1);
    ember_model* m = nullptr;
    EXPECT_STATUS(ember_model_load(ember::test::default_model_path().c_str(), nullptr, &m), EMBER_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(m, nullptr);
    EXPECT_EQ(fault.disarm(), 1u);
  }
  ember_model* m = nullptr;
  ASSERT_OK(ember_model_load(ember::test::default_model_path().c_str(), nullptr, &m));
  ModelPtr model(m);
  EnginePtr engine = make_engine(model.get());
  EXPECT_EQ(greedy(engine.get(), kPromptA), reference(kPromptA));
}

// Engine creation fails cleanly wherever the allocation fails: the KV pool,
// or any weight (the first, the second, one in the middle, the last), and
// the partly built engine leaves nothing behind (ASan checks).
TEST(CapiAllocFailure, EngineCreationIsOutOfMemory) {
  EMBER_REQUIRE_MODEL();
  ember_model_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  ASSERT_OK(ember_model_info(shared_model(), &info));
  // SmolLM2: token_embd, output_norm, output + 9 weights per layer.
  const int64_t n_weights = 3 + 9 * int64_t{info.n_layers};
  struct Case {
    int32_t site;
    int64_t skip;
  };
  const Case cases[] = {{EMBER_ALLOC_KV_POOL, 0},
                        {EMBER_ALLOC_BACKEND_WEIGHT, 0},
                        {EMBER_ALLOC_BACKEND_WEIGHT, 1},
                        {EMBER_ALLOC_BACKEND_WEIGHT, n_weights / 2},
                        {EMBER_ALLOC_BACKEND_WEIGHT, n_weights - 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE("site " + std::to_string(c.site) + ", after " + std::to_string(c.skip) + " allocations");
    Injection fault(c.site, c.skip, 1);
    ember_engine_params ep;
    ember_engine_params_init(&ep);
    ep.kv_memory_bytes = kTestKvBytes;
    ep.n_threads = 1;
    ember_engine* e = nullptr;
    EXPECT_STATUS(ember_engine_create(shared_model(), &ep, &e), EMBER_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(e, nullptr);
    EXPECT_EQ(fault.disarm(), 1u) << "the failure was not injected where asked";
    ember_engine_destroy(e);
  }
  // One allocation past the last weight: the engine is built.
  {
    Injection fault(EMBER_ALLOC_BACKEND_WEIGHT, n_weights, 1);
    EnginePtr engine = make_engine(shared_model());
    ASSERT_NE(engine, nullptr);
    EXPECT_EQ(fault.disarm(), 0u) << "the model has more weights than counted";
    EXPECT_EQ(greedy(engine.get(), kPromptA), reference(kPromptA));
  }
}

// A KV block allocation failing during a step ends exactly the stream it
// hits with OUT_OF_MEMORY; the other stream of the same step runs to the end
// with exactly its untouched text, and the engine goes on.
TEST(CapiAllocFailure, KvBlockFailureEndsOnlyTheStreamItHits) {
  EMBER_REQUIRE_MODEL();
  const std::string ref_a = reference(kPromptA), ref_b = reference(kPromptB);
  EnginePtr engine = make_manual_engine(shared_model());
  ASSERT_NE(engine, nullptr);
  SessionPtr a = text_session(engine.get(), kPromptA);
  SessionPtr b = text_session(engine.get(), kPromptB);
  const ember_stream_params gp = greedy_params(kTokens);
  ember_stream* sa = nullptr;
  ASSERT_OK(ember_stream_start(a.get(), &gp, &sa));
  StreamPtr stream_a(sa);
  size_t n = 0;
  ASSERT_OK(ember_engine_step(engine.get(), 0, 2, &n));  // A's prefill, and more
  // Every allocation fails from now on: B's prefill cannot get its blocks;
  // A's prompt (6 tokens) and 8 generated tokens fit the block it holds.
  Injection fault(EMBER_ALLOC_KV_BLOCK, 0, -1);
  ember_stream* sb = nullptr;
  ASSERT_OK(ember_stream_start(b.get(), &gp, &sb));
  StreamPtr stream_b(sb);
  step_until_ended(engine.get(), {sa, sb});
  EXPECT_GE(fault.disarm(), 1u);
  const Collected ca = drain(sa);
  const Collected cb = drain(sb);
  EXPECT_EQ(cb.error, EMBER_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(ca.error, EMBER_OK);
  EXPECT_EQ(ca.text, ref_a);
  stream_b.reset();
  // The failed session is intact: run again, it generates its reference.
  ember_stream* again = nullptr;
  ASSERT_OK(ember_stream_start(b.get(), &gp, &again));
  StreamPtr stream_again(again);
  step_until_ended(engine.get(), {again});
  EXPECT_EQ(drain(again).text, ref_b);
}

// The same with the worker thread and a failure in the middle of decoding:
// whichever stream the single failure hits ends with OUT_OF_MEMORY, the other
// one's text is its untouched reference; then both sessions' engine keeps
// generating references. Nothing stays referenced in the pool.
TEST(CapiAllocFailure, KvBlockFailureDuringDecodeLeavesTheOtherStreamExact) {
  EMBER_REQUIRE_MODEL();
  const std::string ref_a = reference(kPromptA), ref_b = reference(kPromptB);
  EnginePtr engine = make_engine(shared_model());
  ASSERT_NE(engine, nullptr);
  // Each prompt needs one block; 40 tokens cross into a second and a third.
  ember_stream_params gp = greedy_params(40);
  SessionPtr a = text_session(engine.get(), kPromptA);
  SessionPtr b = text_session(engine.get(), kPromptB);
  Injection fault(EMBER_ALLOC_KV_BLOCK, 2, 1);  // both prefills succeed; the next block fails
  ember_stream *sa = nullptr, *sb = nullptr;
  ASSERT_OK(ember_stream_start(a.get(), &gp, &sa));
  ASSERT_OK(ember_stream_start(b.get(), &gp, &sb));
  StreamPtr stream_a(sa), stream_b(sb);
  const Collected ca = drain(sa);
  const Collected cb = drain(sb);
  EXPECT_EQ(fault.disarm(), 1u);
  const bool a_failed = ca.error == EMBER_ERR_OUT_OF_MEMORY;
  const bool b_failed = cb.error == EMBER_ERR_OUT_OF_MEMORY;
  EXPECT_NE(a_failed, b_failed) << "exactly one stream must fail (A: " << ca.error << ", B: " << cb.error << ")";
  // The survivor's first kTokens tokens are its 8-token reference (greedy is a prefix).
  const Collected& survivor = a_failed ? cb : ca;
  EXPECT_EQ(survivor.error, EMBER_OK);
  EXPECT_EQ(survivor.text.substr(0, (a_failed ? ref_b : ref_a).size()), a_failed ? ref_b : ref_a);
  stream_a.reset();
  stream_b.reset();
  a.reset();
  b.reset();
  EXPECT_EQ(greedy(engine.get(), kPromptA), ref_a);
  EXPECT_EQ(greedy(engine.get(), kPromptB), ref_b);
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  ASSERT_OK(ember_cache_stats(ember_engine_cache(engine.get()), &cs));
  EXPECT_EQ(cs.blocks_used, 0u) << "a block stayed referenced";
}

// The forward pass's buffers: the step's streams end with OUT_OF_MEMORY,
// the engine stays usable and generates its references again.
TEST(CapiAllocFailure, ForwardBufferFailureIsOutOfMemory) {
  EMBER_REQUIRE_MODEL();
  EnginePtr engine = make_engine(shared_model());
  ASSERT_NE(engine, nullptr);
  {
    Injection fault(EMBER_ALLOC_BACKEND_BUFFER, 3, 1);  // a buffer in the middle of the first forward's set
    SessionPtr s = text_session(engine.get(), kPromptA);
    const Collected c = run(s.get(), greedy_params(kTokens));
    EXPECT_EQ(c.error, EMBER_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(fault.disarm(), 1u);
  }
  EXPECT_EQ(greedy(engine.get(), kPromptA), reference(kPromptA));
  EXPECT_EQ(greedy(engine.get(), kPromptB), reference(kPromptB));
}

// Scoring and session loading take KV blocks outside the step: their call
// returns OUT_OF_MEMORY.
TEST(CapiAllocFailure, ScoreAndSessionLoadAreOutOfMemory) {
  EMBER_REQUIRE_MODEL();
  EnginePtr engine = make_engine(shared_model());
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> tokens = {1, 504, 3458, 282, 4649, 314};
  std::vector<float> lp(tokens.size() - 1);
  {
    Injection fault(EMBER_ALLOC_KV_BLOCK, 0, 1);
    EXPECT_STATUS(ember_engine_score(engine.get(), tokens.data(), tokens.size(), lp.data(), nullptr),
                  EMBER_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(fault.disarm(), 1u);
  }
  ASSERT_OK(ember_engine_score(engine.get(), tokens.data(), tokens.size(), lp.data(), nullptr));

  const char* base = std::getenv("TMPDIR");
  const std::string path =
      std::string(base && *base ? base : "/tmp") + "/ember_fault_session_" + std::to_string(getpid()) + ".bin";
  {
    // Long enough for full KV blocks, which the file carries.
    SessionPtr s = text_session(engine.get(), "One, two, three, four, five, six, seven, eight, nine, ten, eleven");
    const Collected c = run(s.get(), greedy_params(kTokens));
    ASSERT_EQ(c.error, EMBER_OK);
    ASSERT_OK(ember_session_save(s.get(), path.c_str()));
  }
  {
    // The saved prefix sits in the prefix cache: another engine has to load it.
    EnginePtr other = make_engine(shared_model());
    Injection fault(EMBER_ALLOC_KV_BLOCK, 0, 1);
    ember_session* loaded = nullptr;
    EXPECT_STATUS(ember_session_load(other.get(), path.c_str(), nullptr, &loaded), EMBER_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(loaded, nullptr);
    EXPECT_EQ(fault.disarm(), 1u);
    ASSERT_OK(ember_session_load(other.get(), path.c_str(), nullptr, &loaded));
    ember_session_destroy(loaded);
  }
  std::remove(path.c_str());
}

// ---------------------------------------------------------------- the model file

namespace {

std::string temp_copy_of_model() {
  const char* base = std::getenv("TMPDIR");
  const std::string path =
      std::string(base && *base ? base : "/tmp") + "/ember_model_copy_" + std::to_string(getpid()) + ".gguf";
  std::ifstream in(ember::test::default_model_path(), std::ios::binary);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  return out.good() ? path : std::string();
}

// Greedy text of kPromptA on a new engine over `model` (worker mode).
std::string generate_with(ember_model* model) {
  EnginePtr engine = make_engine(model);
  return engine ? greedy(engine.get(), kPromptA) : std::string();
}

}  // namespace

// The default: weights in private memory. Truncating the file, writing other
// bytes over it or deleting it while the model is loaded changes nothing,
// for engines that exist and engines created afterwards.
TEST(CapiModelFile, TruncatedOrReplacedWhileLoadedKeepsGenerating) {
  EMBER_REQUIRE_MODEL();
  const std::string path = temp_copy_of_model();
  ASSERT_FALSE(path.empty());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  ember_model* m = nullptr;
  ASSERT_OK(ember_model_load(path.c_str(), nullptr, &m));
  ModelPtr model(m);
  EnginePtr engine = make_engine(model.get());
  ASSERT_NE(engine, nullptr);
  const std::string before = greedy(engine.get(), kPromptA);
  EXPECT_EQ(before, reference(kPromptA));

  ASSERT_EQ(truncate(path.c_str(), 0), 0);
  EXPECT_EQ(greedy(engine.get(), kPromptA), before) << "after truncation to 0 bytes";
  EXPECT_EQ(generate_with(model.get()), before) << "a new engine after truncation";

  {  // Other bytes of the same size (a copy written over the file in place).
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const std::vector<char> junk(1 << 20, '\x5a');
    for (off_t written = 0; written < st.st_size; written += static_cast<off_t>(junk.size())) {
      out.write(junk.data(), static_cast<std::streamsize>(junk.size()));
    }
  }
  EXPECT_EQ(greedy(engine.get(), kPromptA), before) << "after the file was overwritten";

  ASSERT_EQ(std::remove(path.c_str()), 0);
  EXPECT_EQ(greedy(engine.get(), kPromptA), before) << "after the file was deleted";
  EXPECT_EQ(generate_with(model.get()), before) << "a new engine after deletion";
}

// The negative control: with EMBER_MODEL_MAP_SHARED (weights read in place)
// a truncated file does kill the process, which is why it is not the
// default. In a child process, forked before this process starts threads
// (CTest runs each test in its own process; run alone otherwise).
TEST(CapiModelFile, SharedMappingDiesWhenTheFileIsTruncated) {
  EMBER_REQUIRE_MODEL();
  const std::string path = temp_copy_of_model();
  ASSERT_FALSE(path.empty());
  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child's stderr goes to the parent (a sanitizer's report of the fault).
    dup2(err_pipe[1], 2);
    close(err_pipe[0]);
    alarm(120);  // a hang would end as SIGALRM, not as the expected SIGBUS
    ember_model_params mp;
    ember_model_params_init(&mp);
    mp.use_mmap = EMBER_MODEL_MAP_SHARED;
    ember_model* m = nullptr;
    if (ember_model_load(path.c_str(), &mp, &m) != EMBER_OK) _exit(100);
    ember_engine* e = nullptr;
    ember_engine_params ep;
    ember_engine_params_init(&ep);
    ep.kv_memory_bytes = kTestKvBytes;
    ep.n_threads = 1;
    if (ember_engine_create(m, &ep, &e) != EMBER_OK) _exit(101);
    if (truncate(path.c_str(), 0) != 0) _exit(102);
    ember_session* s = nullptr;
    if (ember_session_create(e, nullptr, &s) != EMBER_OK) _exit(103);
    if (ember_session_add_text(s, kPromptA, 0) != EMBER_OK) _exit(104);
    ember_stream_params sp = greedy_params(kTokens);
    ember_stream* st = nullptr;
    if (ember_stream_start(s, &sp, &st) != EMBER_OK) _exit(105);
    ember_stream_wait(st);
    _exit(0);  // survived: the control failed
  }
  close(err_pipe[1]);
  std::string child_err;
  char buf[4096];
  for (ssize_t n; (n = read(err_pipe[0], buf, sizeof buf)) > 0;) child_err.append(buf, static_cast<size_t>(n));
  close(err_pipe[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::remove(path.c_str());
  const std::string how = WIFEXITED(status) ? "exited with " + std::to_string(WEXITSTATUS(status))
                                            : "killed by signal " + std::to_string(WTERMSIG(status));
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(EMBER_TEST_TSAN)
  // A sanitizer reports the fault ("...Sanitizer: BUS on unknown address")
  // and exits with its own status.
  const bool died_of_sigbus = (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) ||
                              (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) < 100 &&
                               child_err.find("BUS") != std::string::npos);
#else
  const bool died_of_sigbus = WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
#endif
  EXPECT_TRUE(died_of_sigbus) << how << "; the child's stderr:\n" << child_err;
}
