// ember — command-line front end over the C ABI.
//   ember generate [-m MODEL] -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S] [--chat]
//   ember chat [-m MODEL]
//   (generate, chat: [--min-p P] [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F]
//    [--penalty-last-n N])
//   ember perplexity [-m MODEL] -f FILE [--ctx C] [--max-tokens N]
//   ember perplexity [-m MODEL] -f FILE --stream --cache full|window:W|sink:S:W|recompute:W
//                    [--max-tokens N] [--series FILE.csv] [--stride K] [--logprobs FILE.csv] [--chunk K]
//   ember bench [-m MODEL] [-p 512] [-n 128] [-t THREADS] [-r REPS] [--json] [--token-times]
//   ember bench --sessions K [-p P] [-n N] [-t THREADS] [--json]
//   ember bench --prefix-cache N [-t THREADS] [-r REPS]
//   ember tokenize [-m MODEL] (-p TEXT | -f FILE) [--special]
//   ember embed [-m MODEL] (-p TEXT | -f FILE) [--pooling mean|last|cls] [--normalize] [--special] [-t THREADS]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "ember/ember.h"
#ifdef EMBER_WITH_SERVER
#ifdef EMBER_WITH_SERVER
#include <dlfcn.h>

#include "apps/server/serve_module.h"
#endif
#endif

namespace {

struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(ember_status st, const char* what) {
  if (st != EMBER_OK) {
    throw CliError(std::string(what) + ": " + ember_last_error() + " (" + ember_status_string(st) + ")");
  }
}

std::string default_model_path() {
  std::string home;
  if (const char* e = std::getenv("EMBER_HOME"); e && *e) {
    home = e;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    home = std::string(h) + "/.cache/ember";
  } else {
    home = ".cache/ember";
  }
  return home + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Minimal option parser: flags with values and boolean switches.
class Args {
 public:
  Args(int argc, char** argv, int first, const std::vector<std::string>& value_opts,
       const std::vector<std::string>& bool_opts) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      bool known = false;
      for (const auto& o : value_opts) {
        if (a == o) {
          if (i + 1 >= argc) throw CliError("option " + a + " needs a value");
          values_[o] = argv[++i];
          all_[o].push_back(values_[o]);
          known = true;
        }
      }
      for (const auto& o : bool_opts) {
        if (a == o) {
          flags_[o] = true;
          known = true;
        }
      }
      if (!known) throw CliError("unknown argument '" + a + "' (see ember --help)");
    }
  }
  bool has(const std::string& k) const { return values_.count(k) || flags_.count(k); }
  // Every value of a repeatable option, in order.
  std::vector<std::string> all(const std::string& k) const {
    auto it = all_.find(k);
    return it == all_.end() ? std::vector<std::string>{} : it->second;
  }
  std::string str(const std::string& k, const std::string& def = "") const {
    auto it = values_.find(k);
    return it == values_.end() ? def : it->second;
  }
  long long integer(const std::string& k, long long def, long long lo, long long hi) const {
    auto it = values_.find(k);
    if (it == values_.end()) return def;
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (errno || !end || *end || it->second.empty())
      throw CliError("option " + k + ": '" + it->second + "' is not an integer");
    if (v < lo || v > hi)
      throw CliError("option " + k + ": " + it->second + " is out of range [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
    return v;
  }
  double real(const std::string& k, double def, double lo, double hi) const {
    auto it = values_.find(k);
    if (it == values_.end()) return def;
    char* end = nullptr;
    double v = std::strtod(it->second.c_str(), &end);
    if (!end || *end || it->second.empty() || !std::isfinite(v))
      throw CliError("option " + k + ": '" + it->second + "' is not a number");
    if (v < lo || v > hi) throw CliError("option " + k + ": " + it->second + " is out of range");
    return v;
  }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> flags_;
  std::map<std::string, std::vector<std::string>> all_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CliError("cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Handles {
  ember_model* model = nullptr;
  ember_engine* engine = nullptr;
  ember_session* session = nullptr;
  std::vector<ember_lora*> loras;
  ~Handles() {
    ember_session_destroy(session);
    for (ember_lora* l : loras) ember_lora_destroy(l);
    ember_engine_destroy(engine);
    ember_model_destroy(model);
  }
};

// A model split across the ranks of an MPI job (`mpirun -np N ember generate
// --tp N ...`): every rank runs the same command; rank 0 does the work and
// alone prints, the others run its forward passes (ember_engine_follow) and
// end when it does.
// (With them, for every command that creates an engine: --kv-type f16|q8_0.)
const std::vector<std::string> kParallelOpts = {"--tp",     "--pp",      "--comm-timeout", "--comm",
                                                "--device", "--tp-mode", "--kv-type"};
struct FollowerDone {  // thrown on ranks > 0 when rank 0 is done (main returns `code`)
  int code;
};
bool split_requested(const Args& a) { return a.integer("--tp", 1, 1, 64) > 1 || a.integer("--pp", 1, 1, 64) > 1; }
// --kv-type f16 (default) | q8_0: the KV cache's element type.
int32_t kv_dtype_of(const Args& a) {
  const std::string t = a.str("--kv-type", "f16");
  if (t != "f16" && t != "q8_0") throw CliError("--kv-type must be f16 or q8_0");
  return t == "q8_0" ? EMBER_KV_Q8_0 : EMBER_KV_F16;
}
void apply_split(const Args& a, ember_engine_params& ep) {
  ep.kv_dtype = kv_dtype_of(a);
  ep.tp_size = static_cast<int32_t>(a.integer("--tp", 1, 1, 64));
  ep.pp_size = static_cast<int32_t>(a.integer("--pp", 1, 1, 64));
  ep.comm_timeout_ms = static_cast<int32_t>(a.integer("--comm-timeout", 60, 1, 86400) * 1000);
  const std::string comm = a.str("--comm", "mpi");
  if (comm != "mpi" && comm != "nccl") throw CliError("--comm must be mpi or nccl");
  ep.comm = comm == "nccl" ? EMBER_COMM_NCCL : EMBER_COMM_MPI;
  const std::string mode = a.str("--tp-mode", "exact");
  if (mode != "exact" && mode != "allreduce") throw CliError("--tp-mode must be exact or allreduce");
  ep.tp_exact = mode == "exact" ? 1 : 0;
  const std::string device = a.str("--device", "");
  if (!device.empty()) {
    if (device != "cpu" && device != "cuda" && device != "auto") throw CliError("--device must be cpu, cuda or auto");
    ep.device = device == "cuda" ? EMBER_DEVICE_CUDA : device == "auto" ? EMBER_DEVICE_AUTO : EMBER_DEVICE_CPU;
  }
}
// On a rank > 0: follows rank 0 until it ends, then unwinds to main.
void follow_unless_rank0(ember_engine* engine) {
  int32_t rank = 0, size = 1;
  check(ember_engine_rank(engine, &rank, &size), "engine rank");
  if (rank == 0) return;
  if (ember_engine_follow(engine) != EMBER_OK) {
    std::fprintf(stderr, "ember: rank %d of %d: %s\n", rank, size, ember_last_error());
    throw FollowerDone{1};
  }
  throw FollowerDone{0};
}

void load(Handles& h, const Args& a, int n_threads = 0, bool with_engine = true) {
  const std::string path = a.str("-m", default_model_path());
  ember_model_params mp;
  ember_model_params_init(&mp);
  // Split: each rank maps the file and touches only its part of it.
  if (split_requested(a)) mp.use_mmap = EMBER_MODEL_MAP_SHARED;
  check(ember_model_load(path.c_str(), &mp, &h.model), "loading the model");
  if (!with_engine) return;
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.n_threads = n_threads;
  if (a.has("--no-batch-invariant")) ep.batch_invariant = 0;  // (bench only: oneDNN for large prefill chunks)
  apply_split(a, ep);
  check(ember_engine_create(h.model, &ep, &h.engine), "creating the engine");
  follow_unless_rank0(h.engine);
  check(ember_session_create(h.engine, nullptr, &h.session), "creating the session");
}

// --lora FILE[:SCALE] (repeatable): the adapters the session decodes with,
// in order; SCALE defaults to 1.
const std::vector<std::string> kLoraOpts = {"--lora"};
void apply_loras(const Args& a, Handles& h) {
  const auto specs = a.all("--lora");
  if (specs.empty()) return;
  std::vector<float> scales;
  for (const std::string& spec : specs) {
    std::string file = spec;
    float scale = 1.0f;
    const size_t colon = spec.rfind(':');
    if (colon != std::string::npos && colon + 1 < spec.size()) {
      char* end = nullptr;
      const double v = std::strtod(spec.c_str() + colon + 1, &end);
      if (end && *end == '\0') {  // FILE:SCALE (a path with a colon and no scale stays whole)
        if (!std::isfinite(v)) throw CliError("--lora " + spec + ": the scale is not a finite number");
        file = spec.substr(0, colon);
        scale = static_cast<float>(v);
      }
    }
    ember_lora* l = nullptr;
    check(ember_lora_load(h.model, file.c_str(), &l), ("loading the adapter " + file).c_str());
    h.loras.push_back(l);
    scales.push_back(scale);
  }
  check(ember_session_set_loras(h.session, h.loras.data(), scales.data(), h.loras.size()), "setting the adapters");
}

ember_model_info_t model_info(const ember_model* model) {
  ember_model_info_t info;
  std::memset(&info, 0, sizeof info);
  info.size = sizeof info;
  check(ember_model_info(model, &info), "model info");
  return info;
}

// A stats struct ready for ember_stream_stats.
ember_stream_stats_t empty_stats() {
  ember_stream_stats_t stats;
  std::memset(&stats, 0, sizeof stats);
  stats.size = sizeof stats;
  return stats;
}

// Runs a stream to its end without reading its events; returns its stats.
ember_stream_stats_t run_to_end(ember_session* session, const ember_stream_params& sp) {
  ember_stream* stream = nullptr;
  check(ember_stream_start(session, &sp, &stream), "starting generation");
  ember_stream_stats_t stats = empty_stats();
  const ember_status waited = ember_stream_wait(stream);
  const ember_status read = waited == EMBER_OK ? ember_stream_stats(stream, &stats) : waited;
  ember_stream_destroy(stream);
  check(read, "generating");
  return stats;
}

// Streams one reply to stdout; returns the stream's stats.
ember_stream_stats_t run_stream(ember_session* session, const ember_stream_params& sp) {
  ember_stream* stream = nullptr;
  check(ember_stream_start(session, &sp, &stream), "starting generation");
  ember_stream_stats_t stats = empty_stats();
  try {
    for (;;) {
      ember_event ev;
      std::memset(&ev, 0, sizeof ev);
      ev.size = sizeof ev;
      check(ember_stream_next(stream, &ev, -1), "generating");
      if (ev.type == EMBER_EVENT_TEXT) {
        std::fwrite(ev.text, 1, ev.text_length, stdout);
        std::fflush(stdout);
      } else if (ev.type == EMBER_EVENT_TOOL_CALL) {
        // One JSON line per call (the id and name need no escaping; the
        // arguments are JSON already).
        std::printf("{\"tool_call\": {\"id\": \"%s\", \"name\": \"%s\", \"arguments\": %s}}\n", ev.tool_call_id,
                    ev.tool_name, ev.tool_arguments);
        std::fflush(stdout);
      } else if (ev.type == EMBER_EVENT_ERROR) {
        throw CliError(std::string("generation failed: ") + ember_last_error());
      } else {
        break;
      }
    }
    check(ember_stream_stats(stream, &stats), "reading stream stats");
  } catch (...) {
    ember_stream_destroy(stream);
    throw;
  }
  ember_stream_destroy(stream);
  return stats;
}

// The speculative options of generate and bench (the draft model's handle
// lives here for as long as the streams that use it).
const std::vector<std::string> kSpecOpts = {"--spec",           "--spec-nodes", "--spec-depth",
                                            "--spec-threshold", "--spec-alpha", "--spec-lookup"};
struct SpecChoice {
  ember_model* draft = nullptr;
  SpecChoice() = default;
  SpecChoice(const SpecChoice&) = delete;
  SpecChoice& operator=(const SpecChoice&) = delete;
  ~SpecChoice() { ember_model_destroy(draft); }
};

// --spec ngram | self[:L] | draft:PATH, and the tree's shape.
void apply_spec(const Args& a, ember_stream_params& sp, SpecChoice& holder) {
  if (!a.has("--spec")) return;
  const std::string v = a.str("--spec");
  if (v == "ngram") {
    sp.spec_drafter = EMBER_SPEC_NGRAM;
  } else if (v == "self" || v.rfind("self:", 0) == 0) {
    sp.spec_drafter = EMBER_SPEC_SELF;
    if (v.size() > 5) {
      char* end = nullptr;
      const long layers = std::strtol(v.c_str() + 5, &end, 10);
      if (!end || *end || layers < 1 || layers > 1024) throw CliError("--spec self:L needs a layer count L >= 1");
      sp.spec_self_layers = static_cast<int32_t>(layers);
    }
  } else if (v.rfind("draft:", 0) == 0 && v.size() > 6) {
    sp.spec_drafter = EMBER_SPEC_DRAFT;
    if (!holder.draft) check(ember_model_load(v.c_str() + 6, nullptr, &holder.draft), "loading the draft model");
    sp.spec_draft_model = holder.draft;
  } else {
    throw CliError("--spec must be ngram, self, self:L or draft:PATH");
  }
  sp.spec_max_nodes = static_cast<int32_t>(a.integer("--spec-nodes", sp.spec_max_nodes, 1, 64));
  sp.spec_max_depth = static_cast<int32_t>(a.integer("--spec-depth", sp.spec_max_depth, 1, 64));
  sp.spec_threshold = static_cast<float>(a.real("--spec-threshold", sp.spec_threshold, 1e-6, 100));
  sp.spec_alpha = static_cast<float>(a.real("--spec-alpha", sp.spec_alpha, 0, 1));
  sp.spec_lookup = static_cast<int32_t>(a.integer("--spec-lookup", sp.spec_lookup, 0, 1));
}

// Structured output: --json-schema FILE | --grammar FILE | --regex RE | --json
// (the texts live here for as long as the streams that use them).
const std::vector<std::string> kConstraintOpts = {"--json-schema", "--grammar", "--regex"};
struct ConstraintText {
  std::string text;
};

void apply_constraint(const Args& a, ember_stream_params& sp, ConstraintText& holder) {
  int n = a.has("--json-schema") + a.has("--grammar") + a.has("--regex") + a.has("--json");
  if (n > 1) throw CliError("at most one of --json-schema, --grammar, --regex and --json");
  if (a.has("--json-schema")) {
    holder.text = read_file(a.str("--json-schema"));
    sp.json_schema = holder.text.c_str();
  } else if (a.has("--grammar")) {
    holder.text = read_file(a.str("--grammar"));
    sp.grammar = holder.text.c_str();
  } else if (a.has("--regex")) {
    holder.text = a.str("--regex");
    sp.regex = holder.text.c_str();
  } else if (a.has("--json")) {
    sp.json_object = 1;
  }
}

// Tool calling: --tools FILE (an OpenAI tool list, JSON) [--tool-choice
// auto|none|required|NAME]; the session must be a chat.
const std::vector<std::string> kToolOpts = {"--tools", "--tool-choice"};
struct ToolText {
  std::string json, name;
};

void apply_tools(const Args& a, ember_session* session, ember_stream_params& sp, ToolText& holder) {
  if (a.has("--tool-choice") && !a.has("--tools")) throw CliError("--tool-choice needs --tools");
  if (!a.has("--tools")) return;
  holder.json = read_file(a.str("--tools"));
  check(ember_session_set_tools(session, holder.json.c_str()), "setting the tools");
  const std::string choice = a.has("--tool-choice") ? a.str("--tool-choice") : "auto";
  if (choice == "auto") {
    sp.tool_choice = EMBER_TOOL_CHOICE_AUTO;
  } else if (choice == "none") {
    sp.tool_choice = EMBER_TOOL_CHOICE_NONE;
  } else if (choice == "required") {
    sp.tool_choice = EMBER_TOOL_CHOICE_REQUIRED;
  } else {
    sp.tool_choice = EMBER_TOOL_CHOICE_FUNCTION;
    holder.name = choice;
    sp.tool_name = holder.name.c_str();
  }
}

std::vector<std::string> with(std::vector<std::string> opts, const std::vector<std::string>& more) {
  opts.insert(opts.end(), more.begin(), more.end());
  return opts;
}

ember_stream_params stream_params(const Args& a) {
  ember_stream_params sp;
  ember_stream_params_init(&sp);
  sp.max_tokens = static_cast<int32_t>(a.integer("-n", 256, 1, 1 << 20));
  sp.temperature = static_cast<float>(a.real("--temp", sp.temperature, 0, 100));
  sp.top_k = static_cast<int32_t>(a.integer("--top-k", sp.top_k, 0, 1 << 24));
  sp.top_p = static_cast<float>(a.real("--top-p", sp.top_p, 1e-6, 1));
  sp.min_p = static_cast<float>(a.real("--min-p", sp.min_p, 0, 1));
  sp.repeat_penalty = static_cast<float>(a.real("--repeat-penalty", sp.repeat_penalty, 1e-3, 100));
  sp.presence_penalty = static_cast<float>(a.real("--presence-penalty", sp.presence_penalty, -100, 100));
  sp.frequency_penalty = static_cast<float>(a.real("--frequency-penalty", sp.frequency_penalty, -100, 100));
  sp.penalty_last_n = static_cast<int32_t>(a.integer("--penalty-last-n", sp.penalty_last_n, -1, 1 << 24));
  sp.seed = static_cast<uint64_t>(a.integer("--seed", static_cast<long long>(sp.seed), 0, (1LL << 62)));
  return sp;
}

int cmd_generate(int argc, char** argv) {
  Args a(argc, argv, 2,
         with({"-m", "-p", "-n", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--presence-penalty",
               "--frequency-penalty", "--penalty-last-n", "--seed", "-t"},
              with(kSpecOpts, with(kConstraintOpts, with(kToolOpts, with(kLoraOpts, kParallelOpts))))),
         {"--chat", "--stats", "--json"});
  if (a.has("--tools") && !a.has("--chat")) throw CliError("--tools needs --chat (tools are for chat sessions)");
  if (!a.has("-p")) throw CliError("generate needs -p PROMPT");
  ember_stream_params sp = stream_params(a);
  SpecChoice spec;
  apply_spec(a, sp, spec);
  ConstraintText constraint;
  apply_constraint(a, sp, constraint);
  Handles h;
  load(h, a, static_cast<int>(a.integer("-t", 0, 0, 1024)));
  apply_loras(a, h);
  const std::string prompt = a.str("-p");
  ToolText tools;
  apply_tools(a, h.session, sp, tools);
  if (a.has("--chat")) {
    check(ember_session_add_message(h.session, "user", prompt.c_str()), "adding the prompt");
  } else {
    check(ember_session_add_text(h.session, prompt.c_str(), 0), "adding the prompt");
  }
  const ember_stream_stats_t st = run_stream(h.session, sp);
  // stdout holds exactly the generated text; a terminal gets its line ended
  // on stderr so the shell prompt starts on a new line.
  std::fflush(stdout);
  if (isatty(fileno(stdout))) std::fputc('\n', stderr);
  if (a.has("--stats")) {
    std::fprintf(stderr,
                 "prompt %zu tokens, generated %zu tokens, ttft %.1f ms, decode %.2f tokens/s; speculation: drafted "
                 "%llu, accepted %llu, passes %llu, mean accepted %.2f\n",
                 st.prompt_tokens, st.generated_tokens, st.time_to_first_token_ms, st.tokens_per_second,
                 static_cast<unsigned long long>(st.drafted_tokens),
                 static_cast<unsigned long long>(st.accepted_tokens), static_cast<unsigned long long>(st.verify_passes),
                 st.mean_accepted_length);
  }
  return 0;
}

int cmd_chat(int argc, char** argv) {
  Args a(argc, argv, 2,
         with({"-m", "-n", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--presence-penalty",
               "--frequency-penalty", "--penalty-last-n", "--seed", "-t", "--system", "--tools", "--tool-choice",
               "--lora"},
              kParallelOpts),
         {});
  ember_stream_params sp = stream_params(a);
  Handles h;
  load(h, a, static_cast<int>(a.integer("-t", 0, 0, 1024)));
  apply_loras(a, h);
  if (a.has("--system"))
    check(ember_session_add_message(h.session, "system", a.str("--system").c_str()), "system prompt");
  ToolText tools;
  apply_tools(a, h.session, sp, tools);
  std::fprintf(stderr,
               "ember chat — type a message; /tool TEXT sends a tool's result, /reset starts over, /exit or "
               "Ctrl-D quits.\n");
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    std::fflush(stderr);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      check(ember_session_reset(h.session), "reset");
      continue;
    }
    if (line.empty()) continue;
    const bool tool_result = line.rfind("/tool ", 0) == 0;
    ember_status st = tool_result ? ember_session_add_message(h.session, "tool", line.c_str() + 6)
                                  : ember_session_add_message(h.session, "user", line.c_str());
    if (st != EMBER_OK) {
      std::fprintf(stderr, "error: %s\n", ember_last_error());
      continue;
    }
    try {
      run_stream(h.session, sp);
    } catch (const CliError& e) {
      std::fprintf(stderr, "\nerror: %s\n", e.what());
    }
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  return 0;
}

std::vector<int32_t> tokenize(ember_model* model, const std::string& text, bool add_special, bool parse_special) {
  size_t n = 0;
  ember_status st = ember_tokenize(model, text.c_str(), add_special, parse_special, nullptr, 0, &n);
  if (st != EMBER_OK && n == 0) check(st, "tokenizing");
  std::vector<int32_t> ids(n);
  check(ember_tokenize(model, text.c_str(), add_special, parse_special, ids.data(), ids.size(), &n), "tokenizing");
  return ids;
}

int cmd_tokenize(int argc, char** argv) {
  Args a(argc, argv, 2, {"-m", "-p", "-f"}, {"--special", "--no-bos"});
  if (a.has("-p") == a.has("-f")) throw CliError("tokenize needs exactly one of -p TEXT or -f FILE");
  const std::string text = a.has("-p") ? a.str("-p") : read_file(a.str("-f"));
  Handles h;
  load(h, a, 0, false);
  const auto ids = tokenize(h.model, text, !a.has("--no-bos"), a.has("--special"));
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

// ember embed: one JSON array of n_embd numbers per input (-p: the text;
// -f: each non-empty line of the file), in input order.
int cmd_embed(int argc, char** argv) {
  Args a(argc, argv, 2, {"-m", "-p", "-f", "-t", "--pooling"}, {"--normalize", "--special"});
  if (a.has("-p") == a.has("-f")) throw CliError("embed needs exactly one of -p TEXT or -f FILE");
  std::vector<std::string> inputs;
  if (a.has("-p")) {
    inputs.push_back(a.str("-p"));
  } else {
    std::istringstream lines(read_file(a.str("-f")));
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) inputs.push_back(line);
    }
    if (inputs.empty()) throw CliError("embed: " + a.str("-f") + " has no non-empty line");
  }
  ember_embed_params ep;
  ember_embed_params_init(&ep);
  const std::string pooling = a.str("--pooling", "mean");
  if (pooling == "mean") {
    ep.pooling = EMBER_POOLING_MEAN;
  } else if (pooling == "last") {
    ep.pooling = EMBER_POOLING_LAST;
  } else if (pooling == "cls") {
    ep.pooling = EMBER_POOLING_CLS;
  } else {
    throw CliError("--pooling must be mean, last or cls");
  }
  ep.normalize = a.has("--normalize") ? 1 : 0;
  ep.parse_special = a.has("--special") ? 1 : 0;
  Handles h;
  load(h, a, a.has("-t") ? std::stoi(a.str("-t")) : 0);
  const size_t n_embd = static_cast<size_t>(model_info(h.model).n_embd);
  // Up to 64 inputs per call: they run in the same engine steps.
  constexpr size_t kPerCall = 64;
  std::vector<float> out;
  for (size_t first = 0; first < inputs.size(); first += kPerCall) {
    const size_t n = std::min(kPerCall, inputs.size() - first);
    std::vector<const char*> texts;
    for (size_t i = 0; i < n; ++i) texts.push_back(inputs[first + i].c_str());
    out.assign(n * n_embd, 0.0f);
    check(ember_engine_embed(h.engine, texts.data(), n, &ep, out.data(), out.size()), "embedding");
    for (size_t i = 0; i < n; ++i) {
      std::fputc('[', stdout);
      for (size_t k = 0; k < n_embd; ++k) {
        std::fprintf(stdout, k ? ", %.7g" : "%.7g", static_cast<double>(out[i * n_embd + k]));
      }
      std::fputs("]\n", stdout);
    }
  }
  return 0;
}

// Resident set size of this process in bytes (0 where unknown).
double resident_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * 4096.0;
}

// CPU time of this process (all threads), in seconds: unlike wall time it
// does not count time other processes take on a shared machine.
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct StreamCache {
  std::string kind;  // full, window, sink, recompute
  int32_t sinks = 0, window = 0;
};

StreamCache parse_stream_cache(const std::string& spec) {
  StreamCache c;
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t colon = spec.find(':', start);
    parts.push_back(spec.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  auto num = [&](const std::string& v) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (errno || v.empty() || *end || x < 0 || x > (1 << 24))
      throw CliError("--cache " + spec + ": '" + v + "' is not a valid count");
    return static_cast<int32_t>(x);
  };
  c.kind = parts[0];
  if (c.kind == "full" && parts.size() == 1) return c;
  if ((c.kind == "window" || c.kind == "recompute") && parts.size() == 2) {
    c.window = num(parts[1]);
    if (c.window < 1) throw CliError("--cache " + spec + ": the window must be at least 1 token");
    return c;
  }
  if (c.kind == "sink" && parts.size() == 3) {
    c.sinks = num(parts[1]);
    c.window = num(parts[2]);
    return c;
  }
  throw CliError("--cache must be full, window:W, sink:S:W or recompute:W (got '" + spec + "')");
}

// Streaming perplexity (StreamingLLM's eval_long_ppl): the text goes through
// ONE session a token at a time and every next token is scored under the
// cache policy; recompute:W rebuilds the last W tokens' KV for every token
// (sliding window with re-computation, the quality baseline). `full` keeps
// every token (up to the model's context): a session whose window holds the
// whole text, so nothing is ever evicted -- the computation of a FULL session,
// but its blocks stay pinned between the per-token calls (a FULL session
// parks them in the prefix cache after each call and would recompute its
// partial last block every token). With --stride K only every K-th token is
// scored: recompute:W then skips the others entirely (each scored token is a
// fresh rebuild), the streaming policies still feed every token.
int perplexity_stream(const Args& a, std::vector<int32_t> ids, Handles& h, const ember_model_info_t& info,
                      int threads) {
  const StreamCache cache = parse_stream_cache(a.str("--cache", "full"));
  const bool recompute = cache.kind == "recompute";
  const size_t stride = static_cast<size_t>(a.integer("--stride", 1, 1, 1 << 20));
  // --chunk K: the streaming policies feed K tokens per call (batched steps
  // instead of K decode steps). Every token still sees what it would see fed
  // alone: the scheduler ends each step where the next block eviction is due
  // (StreamingLayout::chunk_limit), and a scored row's arithmetic does not
  // depend on its step, so the log-probs are bit-identical (checked,
  // docs/BENCHMARKS.md; test Streaming.ScoresDoNotDependOnChunking). Not for
  // recompute.
  const size_t chunk = static_cast<size_t>(a.integer("--chunk", 1, 1, 4096));
  if (recompute && chunk != 1) throw CliError("--chunk does not apply to recompute:W");
  if (cache.kind == "full" && ids.size() > static_cast<size_t>(info.context_length)) {
    std::fprintf(stderr, "full cache: scoring the first %d tokens (the model's context)\n", info.context_length);
    ids.resize(static_cast<size_t>(info.context_length));
  }
  if (ids.size() < 2) throw CliError("the text has fewer than 2 tokens");
  // A pool just large enough for the policy, so resident memory reflects it.
  const int32_t block = 16;
  const int32_t head_dim = info.n_embd / info.n_heads;
  const int32_t kv_dtype = kv_dtype_of(a);
  const uint64_t row_bytes =
      kv_dtype == EMBER_KV_Q8_0 ? static_cast<uint64_t>(head_dim) / 32 * 34 : static_cast<uint64_t>(head_dim) * 2;
  const uint64_t bytes_per_block = static_cast<uint64_t>(info.n_layers) * 2 * info.n_kv_heads * block * row_bytes;
  uint64_t slots = 0;
  const int32_t full_window = std::max<int32_t>(block, static_cast<int32_t>(ids.size()));
  if (cache.kind == "full")
    slots = static_cast<uint64_t>(full_window);
  else if (recompute)
    slots = static_cast<uint64_t>(cache.window) + 1;
  else
    slots = (static_cast<uint64_t>(cache.sinks) + block - 1) / block * block + static_cast<uint64_t>(cache.window);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.n_threads = threads;
  ep.kv_block_size = block;
  ep.kv_dtype = kv_dtype;
  ep.kv_memory_bytes = ((slots + block - 1) / block + 2) * bytes_per_block;
  check(ember_engine_create(h.model, &ep, &h.engine), "creating the engine");
  ember_session_params sp;
  ember_session_params_init(&sp);
  if (cache.kind == "window" || cache.kind == "full") {
    sp.cache_policy = EMBER_CACHE_WINDOW;
    sp.window_tokens = cache.kind == "full" ? full_window : cache.window;
  } else if (cache.kind == "sink") {
    sp.cache_policy = EMBER_CACHE_SINK;
    sp.sink_tokens = cache.sinks;
    sp.window_tokens = cache.window;
  }
  check(ember_session_create(h.engine, &sp, &h.session), "creating the session");
  std::FILE* series = nullptr;
  if (a.has("--series")) {
    series = std::fopen(a.str("--series").c_str(), "w");
    if (!series) throw CliError("cannot write '" + a.str("--series") + "'");
    std::fprintf(series, "tokens,ppl,ppl_recent,ms_per_token,cpu_ms_per_token,rss_mb,kv_mb\n");
  }
  std::FILE* dump = nullptr;  // --logprobs: "position,logprob" per scored token
  if (a.has("--logprobs")) {
    dump = std::fopen(a.str("--logprobs").c_str(), "w");
    if (!dump) throw CliError("cannot write '" + a.str("--logprobs") + "'");
    std::fprintf(dump, "position,logprob\n");
  }
  struct Closer {
    std::FILE* f;
    std::FILE* g;
    ~Closer() {
      if (f) std::fclose(f);
      if (g) std::fclose(g);
    }
  } closer{series, dump};
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  std::fprintf(stderr, "streaming perplexity: %zu tokens, cache %s, pool %llu blocks, stride %zu, chunk %zu\n",
               ids.size(), a.str("--cache", "full").c_str(),
               static_cast<unsigned long long>(ep.kv_memory_bytes / bytes_per_block), stride, chunk);
  using clock = std::chrono::steady_clock;
  double nll = 0.0, recent_nll = 0.0;
  size_t count = 0, recent = 0;
  const auto t0 = clock::now();
  auto t_mark = t0;
  const double cpu0 = cpu_seconds();
  double cpu_mark = cpu0;
  size_t fed = 0;  // tokens fed since the last report
  float lp = 0.0f;
  std::vector<float> lps(chunk);
  size_t n_chunk = 0, j_chunk = 0;  // the current --chunk call and the index in it
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool scored = i > 0 && i % stride == 0;
    if (recompute) {
      if (scored) {
        const size_t from = i > static_cast<size_t>(cache.window) ? i - static_cast<size_t>(cache.window) : 0;
        check(ember_session_reset(h.session), "reset");
        check(ember_session_score(h.session, ids.data() + from, i - from, nullptr), "scoring");
        check(ember_session_score(h.session, ids.data() + i, 1, &lp), "scoring");
      }
    } else {
      if (j_chunk == n_chunk) {
        n_chunk = std::min(chunk, ids.size() - i);
        j_chunk = 0;
        check(ember_session_score(h.session, ids.data() + i, n_chunk, lps.data()), "scoring");
      }
      lp = lps[j_chunk++];
    }
    ++fed;
    if (scored) {
      if (!std::isfinite(lp)) throw CliError("token " + std::to_string(i) + " got no log-probability");
      nll -= lp;
      recent_nll -= lp;
      if (dump) std::fprintf(dump, "%zu,%.6f\n", i, lp);
      ++count;
      ++recent;
    }
    if (recent > 0 && (i % 1000 == 0 || i + 1 == ids.size())) {
      const auto now = clock::now();
      // Per token fed (streaming policies) or per token rebuilt (recompute).
      const double per = static_cast<double>(recompute ? recent : fed);
      const double ms = std::chrono::duration<double, std::milli>(now - t_mark).count() / per;
      const double cpu_now = cpu_seconds();
      const double cpu_ms = 1000.0 * (cpu_now - cpu_mark) / per;
      t_mark = now;
      cpu_mark = cpu_now;
      fed = 0;
      check(ember_cache_stats(ember_engine_cache(h.engine), &cs), "cache stats");
      const double rss_mb = resident_bytes() / (1 << 20);
      const double kv_mb = static_cast<double>(cs.blocks_used * cs.bytes_per_block) / (1 << 20);
      const double ppl = std::exp(nll / static_cast<double>(count));
      const double ppl_recent = std::exp(recent_nll / static_cast<double>(recent));
      std::fprintf(stderr, "[%zu/%zu] ppl=%.4f recent=%.4f %.2f ms/token (cpu %.2f) rss=%.1f MB kv=%.2f MB\n", i,
                   ids.size() - 1, ppl, ppl_recent, ms, cpu_ms, rss_mb, kv_mb);
      if (series) {
        std::fprintf(series, "%zu,%.6f,%.6f,%.4f,%.4f,%.2f,%.3f\n", i, ppl, ppl_recent, ms, cpu_ms, rss_mb, kv_mb);
        std::fflush(series);
      }
      recent_nll = 0.0;
      recent = 0;
    }
  }
  const double secs = std::chrono::duration<double>(clock::now() - t0).count();
  if (count == 0) throw CliError("no token was scored (text shorter than --stride?)");
  const double per = static_cast<double>(recompute ? count : ids.size());
  std::fprintf(stderr, "%zu tokens scored in %.1f s: %.2f ms (cpu %.2f ms) per %s\n", count, secs, 1000.0 * secs / per,
               1000.0 * (cpu_seconds() - cpu0) / per, recompute ? "rebuilt token" : "token fed");
  std::printf("ppl=%.4f tokens=%zu\n", std::exp(nll / static_cast<double>(count)), count);
  return 0;
}

int cmd_perplexity(int argc, char** argv) {
  Args a(argc, argv, 2,
         with({"-m", "-f", "--ctx", "--max-tokens", "-t", "--cache", "--series", "--stride", "--logprobs", "--chunk"},
              kParallelOpts),
         {"--stream"});
  if (!a.has("-f")) throw CliError("perplexity needs -f FILE");
  if (!a.has("--stream") &&
      (a.has("--cache") || a.has("--series") || a.has("--stride") || a.has("--logprobs") || a.has("--chunk"))) {
    throw CliError("--cache, --series, --stride, --chunk and --logprobs need --stream");
  }
  if (a.has("--stream")) {
    const std::string text = read_file(a.str("-f"));
    Handles h;
    load(h, a, 0, false);
    const ember_model_info_t info = model_info(h.model);
    std::vector<int32_t> ids = tokenize(h.model, text, true, false);
    const long long max_tokens = a.integer("--max-tokens", 0, 0, 1LL << 40);
    if (max_tokens > 0 && static_cast<size_t>(max_tokens) < ids.size()) ids.resize(static_cast<size_t>(max_tokens));
    return perplexity_stream(a, std::move(ids), h, info, static_cast<int>(a.integer("-t", 0, 0, 1024)));
  }
  const std::string text = read_file(a.str("-f"));
  Handles h;
  load(h, a, static_cast<int>(a.integer("-t", 0, 0, 1024)));
  const int ctx = static_cast<int>(a.integer("--ctx", 512, 16, 1 << 20));
  const ember_model_info_t info = model_info(h.model);
  if (ctx > info.context_length)
    throw CliError("--ctx " + std::to_string(ctx) + " exceeds the model's context " +
                   std::to_string(info.context_length));
  std::vector<int32_t> ids = tokenize(h.model, text, true, false);
  const long long max_tokens = a.integer("--max-tokens", 0, 0, 1LL << 40);
  if (max_tokens > 0 && static_cast<size_t>(max_tokens) < ids.size()) ids.resize(static_cast<size_t>(max_tokens));
  const size_t n_chunks = ids.size() / static_cast<size_t>(ctx);
  if (n_chunks == 0)
    throw CliError("the text has " + std::to_string(ids.size()) + " tokens, fewer than --ctx " + std::to_string(ctx));
  // llama-perplexity's method: each window of ctx tokens is scored on its
  // second half (positions ctx/2 .. ctx-2 predicting the next token).
  const int first = ctx / 2;
  std::vector<float> logprobs(static_cast<size_t>(ctx));
  double nll = 0.0;
  size_t count = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> window(ids.begin() + static_cast<long>(c * ctx),
                                ids.begin() + static_cast<long>((c + 1) * ctx));
    if (info.bos_token >= 0) {
      // As llama-perplexity does when the model adds BOS: the window starts with it.
      int32_t probe[4];
      size_t nb = 0;
      if (ember_tokenize(h.model, "", 1, 0, probe, 4, &nb) == EMBER_OK && nb > 0) window[0] = info.bos_token;
    }
    check(ember_engine_score(h.engine, window.data(), window.size(), logprobs.data(), nullptr), "scoring");
    for (int j = first; j < ctx - 1; ++j) {
      nll -= logprobs[static_cast<size_t>(j)];
      ++count;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[%zu/%zu] ppl=%.4f (%.1f tokens/s)\n", c + 1, n_chunks, std::exp(nll / count),
                 static_cast<double>((c + 1) * ctx) / secs);
  }
  std::printf("ppl=%.4f tokens=%zu\n", std::exp(nll / static_cast<double>(count)), count);
  return 0;
}

// K concurrent sessions with different prompts on one engine: aggregate
// decode tokens/s, time to first token, inter-token latency and the KV
// memory the paged cache used against a contiguous per-sequence allocation.
int bench_sessions(const Args& a, int n_prompt, int n_gen, int threads, int k) {
  const std::string path = a.str("-m", default_model_path());
  ember_model* model = nullptr;
  ember_model_params mp;
  ember_model_params_init(&mp);
  if (split_requested(a)) mp.use_mmap = EMBER_MODEL_MAP_SHARED;
  check(ember_model_load(path.c_str(), &mp, &model), "loading the model");
  const ember_model_info_t info = model_info(model);
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.n_threads = threads;
  if (a.has("--no-batch-invariant")) ep.batch_invariant = 0;
  ep.max_running = std::max(k, 1);
  apply_split(a, ep);
  ember_engine* engine = nullptr;
  ember_status st = ember_engine_create(model, &ep, &engine);
  if (st == EMBER_OK && split_requested(a)) {  // ranks > 0 follow rank 0's run
    int32_t rank = 0;
    ember_engine_rank(engine, &rank, nullptr);
    if (rank > 0) {
      ember_model_destroy(model);
      const ember_status fs = ember_engine_follow(engine);
      if (fs != EMBER_OK) std::fprintf(stderr, "ember: rank %d: %s\n", rank, ember_last_error());
      ember_engine_destroy(engine);
      return fs == EMBER_OK ? 0 : 1;
    }
  }
  // --lora FILE (repeatable): session i decodes with adapter i % count.
  std::vector<ember_lora*> loras;
  for (const std::string& f : a.all("--lora")) {
    if (st != EMBER_OK) break;
    ember_lora* l = nullptr;
    st = ember_lora_load(model, f.c_str(), &l);
    if (st == EMBER_OK) loras.push_back(l);
  }
  ember_model_destroy(model);
  check(st, "creating the engine and loading the adapters");
  std::mt19937 rng(4321);
  std::vector<ember_session*> sessions(static_cast<size_t>(k), nullptr);
  std::vector<ember_stream*> streams(static_cast<size_t>(k), nullptr);
  for (int i = 0; i < k; ++i) {
    check(ember_session_create(engine, nullptr, &sessions[static_cast<size_t>(i)]), "session");
    if (!loras.empty()) {
      check(ember_session_set_loras(sessions[static_cast<size_t>(i)], &loras[static_cast<size_t>(i) % loras.size()],
                                    nullptr, 1),
            "adapter");
    }
    std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(info.vocab_size));
    check(ember_session_add_tokens(sessions[static_cast<size_t>(i)], prompt.data(), prompt.size()), "prompt");
  }
  using clock = std::chrono::steady_clock;
  struct Trace {
    std::vector<std::pair<clock::time_point, size_t>> events;  // (arrival, tokens)
    std::vector<double> gaps_ms;
    size_t tokens = 0;
    double ttft_ms = 0;
  };
  std::vector<Trace> traces(static_cast<size_t>(k));
  const auto t0 = clock::now();
  for (int i = 0; i < k; ++i) {
    ember_stream_params sp;
    ember_stream_params_init(&sp);
    sp.temperature = 0;
    sp.max_tokens = n_gen;
    sp.ignore_eos = 1;
    check(ember_stream_start(sessions[static_cast<size_t>(i)], &sp, &streams[static_cast<size_t>(i)]), "start");
  }
  std::vector<std::thread> readers;
  for (int i = 0; i < k; ++i) {
    readers.emplace_back([&, i] {
      Trace& tr = traces[static_cast<size_t>(i)];
      for (;;) {
        ember_event ev;
        std::memset(&ev, 0, sizeof ev);
        ev.size = sizeof ev;
        if (ember_stream_next(streams[static_cast<size_t>(i)], &ev, -1) != EMBER_OK || ev.type != EMBER_EVENT_TEXT)
          break;
        const auto now = clock::now();
        if (tr.tokens == 0) {
          tr.ttft_ms = std::chrono::duration<double, std::milli>(now - t0).count();
        } else {
          tr.gaps_ms.push_back(std::chrono::duration<double, std::milli>(now - tr.events.back().first).count() /
                               static_cast<double>(ev.n_tokens));
        }
        tr.tokens += ev.n_tokens;
        tr.events.emplace_back(now, ev.n_tokens);
      }
    });
  }
  // The main thread samples the pool while the streams run: the peak of
  // blocks held by the running sequences.
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  size_t peak_blocks = 0, bytes_per_block = 0;
  int32_t block_size = 0;
  std::atomic<int> done{0};
  // Also the streams' generated-token counts (a stream holds back tokens
  // that do not complete a UTF-8 character, e.g. a synthetic model's random
  // bytes, so text events alone can miss the steady state): the first sample
  // with every stream generating and the first with one finished.
  struct Sample {
    clock::time_point t;
    size_t sum = 0, min = 0;
    bool any_finished = false;
  };
  std::vector<Sample> samples;
  std::thread sampler([&] {
    while (done.load() == 0) {
      if (ember_cache_stats(ember_engine_cache(engine), &cs) == EMBER_OK) {
        peak_blocks = std::max(peak_blocks, cs.blocks_used);
        bytes_per_block = cs.bytes_per_block;
        block_size = cs.block_size;
      }
      Sample smp{clock::now(), 0, SIZE_MAX, false};
      for (ember_stream* s : streams) {
        ember_stream_stats_t ss;
        std::memset(&ss, 0, sizeof ss);
        ss.size = sizeof ss;
        if (ember_stream_stats(s, &ss) != EMBER_OK) continue;
        smp.sum += ss.generated_tokens;
        smp.min = std::min(smp.min, ss.generated_tokens);
        smp.any_finished = smp.any_finished || ss.finished || ss.generated_tokens >= static_cast<size_t>(n_gen);
      }
      samples.push_back(smp);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  for (auto& r : readers) r.join();
  done = 1;
  sampler.join();
  const double wall = std::chrono::duration<double>(clock::now() - t0).count();
  size_t total = 0;
  std::vector<double> ttft, gaps;
  // Steady state: from the moment every session has its first token (all
  // decoding) to the moment the first one ends.
  clock::time_point all_started = clock::time_point::min(), first_done = clock::time_point::max();
  for (auto& tr : traces) {
    total += tr.tokens;
    ttft.push_back(tr.ttft_ms);
    gaps.insert(gaps.end(), tr.gaps_ms.begin(), tr.gaps_ms.end());
    if (tr.events.empty()) continue;
    all_started = std::max(all_started, tr.events.front().first);
    first_done = std::min(first_done, tr.events.back().first);
  }
  size_t steady_tokens = 0;
  for (auto& tr : traces) {
    for (auto& [t, n] : tr.events) {
      if (t > all_started && t <= first_done) steady_tokens += n;
    }
  }
  const double steady_secs =
      first_done > all_started ? std::chrono::duration<double>(first_done - all_started).count() : 0;
  double steady = steady_secs > 0 ? static_cast<double>(steady_tokens) / steady_secs : 0;
  if (steady == 0) {  // no text events in a steady window: from the sampled counts
    const Sample* from = nullptr;
    for (const Sample& smp : samples) {
      if (!from && smp.min >= 1 && !smp.any_finished) from = &smp;
      if (from && smp.any_finished) {
        const double secs = std::chrono::duration<double>(smp.t - from->t).count();
        if (secs > 0) steady = static_cast<double>(smp.sum - from->sum) / secs;
        break;
      }
    }
  }
  auto pct = [](std::vector<double> v, double q) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
  };
  const double agg = static_cast<double>(total) / wall;
  for (int i = 0; i < k; ++i) {
    ember_stream_destroy(streams[static_cast<size_t>(i)]);
    ember_session_destroy(sessions[static_cast<size_t>(i)]);
  }
  for (ember_lora* l : loras) ember_lora_destroy(l);
  ember_engine_destroy(engine);
  // KV per token held: paged (peak blocks in use over the tokens the
  // sequences hold) against reserving the model's context per sequence.
  const double tokens_held = static_cast<double>(k) * (n_prompt + n_gen);
  const double paged_mb = static_cast<double>(peak_blocks * bytes_per_block) / (1 << 20);
  const double bytes_per_token = block_size > 0 ? static_cast<double>(bytes_per_block) / block_size : 0;
  const double contiguous_mb = static_cast<double>(k) * info.context_length * bytes_per_token / (1 << 20);
  if (a.has("--json")) {
    std::printf(
        "{\"sessions\": %d, \"n_prompt\": %d, \"n_gen\": %d, \"threads\": %d, \"generated\": %zu, "
        "\"wall_s\": %.3f, \"aggregate_tokens_per_second\": %.2f, \"steady_decode_tokens_per_second\": %.2f, "
        "\"ttft_ms_p50\": %.1f, \"ttft_ms_p99\": %.1f, \"itl_ms_p50\": %.2f, \"itl_ms_p99\": %.2f, "
        "\"kv_peak_mb\": %.2f, \"kv_bytes_per_token_held\": %.1f, \"kv_contiguous_mb\": %.2f}\n",
        k, n_prompt, n_gen, threads, total, wall, agg, steady, pct(ttft, 0.5), pct(ttft, 0.99), pct(gaps, 0.5),
        pct(gaps, 0.99), paged_mb, paged_mb * (1 << 20) / tokens_held, contiguous_mb);
  } else {
    std::printf("sessions=%d prompt=%d gen=%d threads=%d\n", k, n_prompt, n_gen, threads);
    std::printf(
        "generated %zu tokens in %.2f s: aggregate %.2f tokens/s; steady decode (all sessions decoding) %.2f "
        "tokens/s\n",
        total, wall, agg, steady);
    std::printf("time to first token ms: p50 %.1f  p99 %.1f\n", pct(ttft, 0.5), pct(ttft, 0.99));
    std::printf("inter-token latency ms: p50 %.2f  p99 %.2f\n", pct(gaps, 0.5), pct(gaps, 0.99));
    std::printf(
        "KV: peak %.2f MB in use for %.0f tokens held (%.0f bytes per token held; K+V of one token is %.0f "
        "bytes); a contiguous %d-token allocation per sequence would reserve %.2f MB (%.1fx)\n",
        paged_mb, tokens_held, paged_mb * (1 << 20) / tokens_held, bytes_per_token, info.context_length, contiguous_mb,
        paged_mb > 0 ? contiguous_mb / paged_mb : 0.0);
  }
  return 0;
}

// Time to first token with and without the prefix cache: a session whose
// `sys`-token system prompt is already cached (another session ran it)
// against one whose prompt is new. Each repetition uses a fresh random
// prefix; the user turn is 16 tokens.
int bench_prefix(const Args& a, int sys_tokens, int threads, int reps) {
  Handles h;
  load(h, a, threads);
  const ember_model_info_t info = model_info(h.model);
  std::mt19937 rng(777);
  auto random_ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(info.vocab_size));
    return v;
  };
  auto ttft = [&](const std::vector<int32_t>& prefix) {
    ember_session* s = nullptr;
    check(ember_session_create(h.engine, nullptr, &s), "session");
    std::vector<int32_t> ids = prefix;
    const auto user = random_ids(16);
    ids.insert(ids.end(), user.begin(), user.end());
    check(ember_session_add_tokens(s, ids.data(), ids.size()), "prompt");
    ember_stream_params sp;
    ember_stream_params_init(&sp);
    sp.temperature = 0;
    sp.max_tokens = 1;
    sp.ignore_eos = 1;
    const ember_stream_stats_t ss = run_to_end(s, sp);
    ember_session_destroy(s);
    return ss.time_to_first_token_ms;
  };
  std::vector<double> cold, warm;
  for (int r = 0; r < reps + 1; ++r) {  // the first repetition warms up
    const auto prefix = random_ids(sys_tokens);
    const double c = ttft(prefix);  // prefix new: prefilled
    const double w = ttft(prefix);  // prefix cached by the first session
    if (r == 0) continue;
    cold.push_back(c);
    warm.push_back(w);
  }
  std::sort(cold.begin(), cold.end());
  std::sort(warm.begin(), warm.end());
  const double c50 = cold[cold.size() / 2], w50 = warm[warm.size() / 2];
  ember_cache_stats_t cs;
  std::memset(&cs, 0, sizeof cs);
  cs.size = sizeof cs;
  check(ember_cache_stats(ember_engine_cache(h.engine), &cs), "cache stats");
  std::printf("prefix cache: %d-token system prompt + 16-token user turn, %d repetitions, threads=%d\n", sys_tokens,
              reps, threads);
  std::printf("time to first token ms (median): not cached %.1f  cached %.1f  speedup %.1fx\n", c50, w50,
              w50 > 0 ? c50 / w50 : 0.0);
  std::printf("prefix blocks reused %llu, missed %llu\n", static_cast<unsigned long long>(cs.prefix_hits),
              static_cast<unsigned long long>(cs.prefix_misses));
  return 0;
}

// Runs a stream to its end collecting its tokens; returns its stats.
ember_stream_stats_t run_collect(ember_session* session, const ember_stream_params& sp, std::vector<int32_t>& tokens) {
  ember_stream* stream = nullptr;
  check(ember_stream_start(session, &sp, &stream), "starting generation");
  ember_stream_stats_t stats = empty_stats();
  ember_status st = EMBER_OK;
  for (;;) {
    ember_event ev;
    std::memset(&ev, 0, sizeof ev);
    ev.size = sizeof ev;
    st = ember_stream_next(stream, &ev, -1);
    if (st != EMBER_OK || ev.type != EMBER_EVENT_TEXT) {
      if (st == EMBER_OK && ev.type == EMBER_EVENT_ERROR) st = ev.status;
      break;
    }
    tokens.insert(tokens.end(), ev.tokens, ev.tokens + ev.n_tokens);
  }
  if (st == EMBER_OK) st = ember_stream_stats(stream, &stats);
  ember_stream_destroy(stream);
  check(st, "generating");
  return stats;
}

// bench --spec: greedy decoding of one prompt with and without speculation
// (same engine, same session settings), alternating, -r times after a
// warm-up; the outputs must be identical.
int bench_spec(const Args& a, int n_gen, int threads, int reps) {
  Handles h;
  load(h, a, threads);
  SpecChoice holder;
  ember_stream_params base;
  ember_stream_params_init(&base);
  base.temperature = 0;
  base.max_tokens = n_gen;
  ember_stream_params spec = base;
  apply_spec(a, spec, holder);
  const std::string prompt = a.has("--prompt-file") ? read_file(a.str("--prompt-file")) : a.str("--prompt", "");
  if (prompt.empty()) throw CliError("bench --spec needs --prompt-file FILE or --prompt TEXT");
  std::vector<double> tb, ts;
  uint64_t drafted = 0, accepted = 0, passes = 0;
  size_t generated = 0;
  bool identical = true;
  for (int r = 0; r < reps + 1; ++r) {  // first repetition warms up
    std::vector<int32_t> out[2];
    ember_stream_stats_t st[2];
    for (int k = 0; k < 2; ++k) {
      check(ember_session_reset(h.session), "reset");
      if (a.has("--chat")) {
        check(ember_session_add_message(h.session, "user", prompt.c_str()), "adding the prompt");
      } else {
        check(ember_session_add_text(h.session, prompt.c_str(), 0), "adding the prompt");
      }
      st[k] = run_collect(h.session, k == 0 ? base : spec, out[k]);
    }
    identical = identical && out[0] == out[1];
    if (r == 0) continue;
    tb.push_back(st[0].tokens_per_second);
    ts.push_back(st[1].tokens_per_second);
    drafted += st[1].drafted_tokens;
    accepted += st[1].accepted_tokens;
    passes += st[1].verify_passes;
    generated += st[1].generated_tokens;
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  const double acc_rate = drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
  const double mean_len = passes ? static_cast<double>(accepted) / static_cast<double>(passes) : 0.0;
  if (a.has("--json")) {
    std::printf(
        "{\"spec\": \"%s\", \"n_gen\": %d, \"threads\": %d, \"repetitions\": %d, \"generated\": %zu, "
        "\"plain_tokens_per_second\": %.2f, \"spec_tokens_per_second\": %.2f, \"speedup\": %.3f, \"drafted\": %llu, "
        "\"accepted\": %llu, \"verify_passes\": %llu, \"acceptance_rate\": %.4f, \"mean_accepted_length\": %.3f, "
        "\"identical\": %s}\n",
        a.str("--spec").c_str(), n_gen, threads, reps, generated / static_cast<size_t>(reps), mean(tb), mean(ts),
        mean(ts) / mean(tb), static_cast<unsigned long long>(drafted), static_cast<unsigned long long>(accepted),
        static_cast<unsigned long long>(passes), acc_rate, mean_len, identical ? "true" : "false");
  } else {
    std::printf(
        "spec %s: plain %.2f tokens/s, speculative %.2f tokens/s (%.2fx); drafted %llu, accepted %llu "
        "(%.1f%%), passes %llu, mean accepted length %.2f; outputs %s\n",
        a.str("--spec").c_str(), mean(tb), mean(ts), mean(ts) / mean(tb), static_cast<unsigned long long>(drafted),
        static_cast<unsigned long long>(accepted), 100.0 * acc_rate, static_cast<unsigned long long>(passes), mean_len,
        identical ? "identical" : "DIFFER");
  }
  return identical ? 0 : 1;
}

double monotonic_s() {  // steady_clock is CLOCK_MONOTONIC on Linux: Python's time.monotonic()
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// bench --token-times: the arrival time of every decoded token, taken on the
// engine's worker thread in the stream callback (an event that covers k
// tokens, e.g. when a UTF-8 character spans tokens, gives the k tokens its
// time). The first token arrives when the prefill ends: that is the decode
// start. A line on stderr marks each repetition's decode start and end, so a
// driver (tools/bench_vs_llamacpp.py --busy-core) can act during the decode.
struct TokenTimes {
  int rep = 0;
  std::vector<double> times;  // monotonic seconds, one per token
};

int32_t record_token_time(const ember_event* ev, void* user) {
  if (ev->type != EMBER_EVENT_TEXT) return 0;
  auto* tt = static_cast<TokenTimes*>(user);
  const double now = monotonic_s();
  if (tt->times.empty()) std::fprintf(stderr, "ember bench: rep %d decode start %.6f\n", tt->rep, now);
  tt->times.insert(tt->times.end(), ev->n_tokens, now);
  return 0;
}

ember_stream_stats_t run_token_times(ember_session* session, const ember_stream_params& sp, TokenTimes& tt) {
  ember_stream* stream = nullptr;
  check(ember_stream_start(session, &sp, &stream), "starting generation");
  ember_status st = ember_stream_set_callback(stream, record_token_time, &tt);
  if (st == EMBER_OK) st = ember_stream_wait(stream);
  ember_stream_stats_t stats = empty_stats();
  if (st == EMBER_OK) st = ember_stream_stats(stream, &stats);
  ember_stream_destroy(stream);
  check(st, "generating");
  if (!tt.times.empty())
    std::fprintf(stderr, "ember bench: rep %d decode end %.6f tokens %zu\n", tt.rep, tt.times.back(), tt.times.size());
  return stats;
}

int cmd_bench(int argc, char** argv) {
  Args a(argc, argv, 2,
         with({"-m", "-p", "-n", "-t", "-r", "--sessions", "--prefix-cache", "--prompt-file", "--prompt", "--lora"},
              with(kSpecOpts, kParallelOpts)),
         {"--json", "--chat", "--token-times", "--no-batch-invariant"});
  const int n_prompt = static_cast<int>(a.integer("-p", 512, 1, 1 << 20));
  const int n_gen = static_cast<int>(a.integer("-n", 128, 1, 1 << 20));
  const int threads = static_cast<int>(a.integer("-t", 0, 0, 1024));
  const int reps = static_cast<int>(a.integer("-r", 3, 1, 100));
  const bool token_times = a.has("--token-times");
  if (token_times && (a.has("--spec") || a.has("--prefix-cache") || a.has("--sessions")))
    throw CliError("--token-times is for the plain bench (not --spec, --prefix-cache or --sessions)");
  if (split_requested(a) && !a.has("--sessions")) throw CliError("bench --tp/--pp needs --sessions K");
  if (a.has("--spec")) return bench_spec(a, n_gen, threads, reps);
  if (a.has("--prefix-cache")) {
    return bench_prefix(a, static_cast<int>(a.integer("--prefix-cache", 1000, 16, 1 << 16)), threads, reps);
  }
  if (a.has("--sessions")) {
    return bench_sessions(a, n_prompt, n_gen, threads, static_cast<int>(a.integer("--sessions", 1, 1, 1024)));
  }
  Handles h;
  load(h, a, threads);
  const ember_model_info_t info = model_info(h.model);
  std::mt19937 rng(1234);
  std::vector<double> pp, tg;
  // --token-times: the last repetition's token arrival times.
  TokenTimes last;
  for (int r = 0; r < reps + 1; ++r) {  // first repetition warms up
    std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(info.vocab_size));
    check(ember_session_reset(h.session), "reset");
    check(ember_session_add_tokens(h.session, prompt.data(), prompt.size()), "adding the prompt");
    ember_stream_params sp;
    ember_stream_params_init(&sp);
    sp.temperature = 0;
    sp.max_tokens = n_gen;
    sp.ignore_eos = 1;
    TokenTimes tt;
    tt.rep = r;
    const ember_stream_stats_t st = token_times ? run_token_times(h.session, sp, tt) : run_to_end(h.session, sp);
    if (r == 0) continue;
    last = std::move(tt);
    pp.push_back(st.prefill_tokens_per_second);
    tg.push_back(st.tokens_per_second);
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  auto sd = [&](const std::vector<double>& v) {
    double m = mean(v), s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return v.size() > 1 ? std::sqrt(s / static_cast<double>(v.size() - 1)) : 0.0;
  };
  // Resident memory now (the model loaded, its weights packed, the KV of one
  // session) against the file's size.
  const double rss_mib = resident_bytes() / (1 << 20);
  struct stat model_stat {};
  const double file_mib =
      ::stat(a.str("-m", default_model_path()).c_str(), &model_stat) == 0 ? model_stat.st_size / 1048576.0 : 0.0;
  if (a.has("--json")) {
    std::printf(
        "{\"model\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, \"threads\": %d, \"prefill_tokens_per_second\": %.2f, "
        "\"prefill_stddev\": %.2f, \"decode_tokens_per_second\": %.2f, \"decode_stddev\": %.2f, \"repetitions\": %d, "
        "\"rss_mib\": %.1f, \"model_file_mib\": %.1f",
        info.name, n_prompt, n_gen, threads, mean(pp), sd(pp), mean(tg), sd(tg), reps, rss_mib, file_mib);
    if (token_times) {
      // Seconds since the decode start (the first token) of the last repetition.
      const double t0 = last.times.empty() ? 0.0 : last.times.front();
      std::printf(", \"decode_start_monotonic_s\": %.6f, \"token_times_s\": [", t0);
      for (size_t i = 0; i < last.times.size(); ++i) std::printf("%s%.6f", i ? ", " : "", last.times[i] - t0);
      std::printf("]");
    }
    std::printf("}\n");
  } else {
    std::printf("model: %s (%llu params)\n", info.name, static_cast<unsigned long long>(info.n_params));
    std::printf("%-12s %12s %10s\n", "test", "tokens/s", "stddev");
    std::printf("pp%-10d %12.2f %10.2f\n", n_prompt, mean(pp), sd(pp));
    std::printf("tg%-10d %12.2f %10.2f\n", n_gen, mean(tg), sd(tg));
    std::printf("resident %.1f MiB (model file %.1f MiB)\n", rss_mib, file_mib);
  }
  return 0;
}

#ifdef EMBER_WITH_SERVER
// The server is libember_serve.so (apps/server/serve_module.h), looked for in
// $EMBER_PLUGIN_DIR, then beside libember.so, and opened for this command
// alone: chat, generate and bench map no HTTP or TLS library.
int run_serve_module(const ember::server::ServeOptions& o) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("EMBER_PLUGIN_DIR")) {
    std::stringstream list(env);
    for (std::string d; std::getline(list, d, ':');)
      if (!d.empty()) dirs.push_back(d);
  }
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ember_version), &info) != 0 && info.dli_fname) {
    const std::string lib = info.dli_fname;
    const size_t slash = lib.rfind('/');
    dirs.push_back(slash == std::string::npos ? std::string(".") : lib.substr(0, slash));
  }
  std::string searched;
  for (const std::string& d : dirs) {
    const std::string path = d + "/" + ember::server::kServeModuleFile;
    searched += (searched.empty() ? "" : ", ") + d;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) continue;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      throw CliError("serve: cannot load " + path + ": " + (e ? e : "unknown error"));
    }
    auto entry = reinterpret_cast<ember_serve_module_fn>(dlsym(h, ember::server::kServeModuleEntry));
    if (!entry) throw CliError("serve: " + path + " is not Ember's server module");
    char err[1024] = {0};
    const int rc = entry(&o, sizeof o, err, sizeof err);
    err[sizeof err - 1] = '\0';
    if (err[0]) throw CliError(err);
    return rc;
  }
  throw CliError(std::string("serve: ") + ember::server::kServeModuleFile + " was not found (searched: " + searched +
                 "); keep it beside libember.so or point EMBER_PLUGIN_DIR at it");
}

int cmd_serve(int argc, char** argv) {
  // The HTTP threads share the cores with the engine's OpenMP team, whose
  // threads must then sleep at joins rather than spin (64 streams on 2 cores:
  // 182 -> 243 tokens/s, docs/BENCHMARKS.md). libgomp reads OMP_WAIT_POLICY
  // when it is loaded, so the process starts again with it set (unless the
  // user set it); if that fails it goes on as it is.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);
  }
  Args a(argc, argv, 2,
         with({"-m", "--host", "--port", "--parallel", "--queue", "--api-key", "--alias", "-t", "--ctx", "--kv-memory",
               "--pooling", "--timeout", "--max-body"},
              kParallelOpts),
         {"--quiet"});
  ember::server::ServeOptions o;
  o.model_path = a.str("-m", default_model_path());
  o.host = a.str("--host", "127.0.0.1");
  o.port = static_cast<int>(a.integer("--port", 8080, 0, 65535));
  o.parallel = static_cast<int>(a.integer("--parallel", 8, 1, 4096));
  o.queue = static_cast<int>(a.integer("--queue", 64, 0, 65536));
  // The key from the environment keeps it out of `ps`: EMBER_API_KEY.
  const char* env_key = std::getenv("EMBER_API_KEY");
  o.api_key = a.str("--api-key", env_key ? env_key : "");
  o.alias = a.str("--alias");
  o.threads = static_cast<int>(a.integer("-t", 0, 0, 1024));
  o.ctx = static_cast<int>(a.integer("--ctx", 0, 0, 1 << 24));
  o.kv_memory_bytes = static_cast<uint64_t>(a.integer("--kv-memory", 0, 0, 1 << 20)) << 20;
  const std::string pooling = a.str("--pooling", "mean");
  if (pooling == "mean") {
    o.pooling = EMBER_POOLING_MEAN;
  } else if (pooling == "last") {
    o.pooling = EMBER_POOLING_LAST;
  } else if (pooling == "cls") {
    o.pooling = EMBER_POOLING_CLS;
  } else {
    throw CliError("--pooling must be mean, last or cls");
  }
  const std::string device = a.str("--device", "cpu");
  if (device == "cpu") {
    o.device = EMBER_DEVICE_CPU;
  } else if (device == "cuda") {
    o.device = EMBER_DEVICE_CUDA;
  } else if (device == "auto") {
    o.device = EMBER_DEVICE_AUTO;
  } else {
    throw CliError("--device must be cpu, cuda or auto");
  }
  const int timeout = static_cast<int>(a.integer("--timeout", 30, 1, 86400));
  o.read_timeout_s = o.write_timeout_s = timeout;
  o.max_body_bytes = static_cast<size_t>(a.integer("--max-body", 16, 1, 4096)) << 20;
  o.quiet = a.has("--quiet");
  ember_engine_params split;
  ember_engine_params_init(&split);
  apply_split(a, split);
  o.tp = split.tp_size;
  o.pp = split.pp_size;
  o.comm_timeout_ms = split.comm_timeout_ms;
  o.comm = split.comm;
  o.tp_exact = split.tp_exact;
  o.kv_dtype = split.kv_dtype;
  return run_serve_module(o);
}
#endif

void usage() {
  std::fprintf(
      stderr,
      "usage: ember <command> [options]\n"
      "  generate   [-m MODEL] -p PROMPT [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S] [--chat]\n"
      "             [--spec ngram|self[:L]|draft:PATH] [--spec-nodes N] [--spec-depth D] [--spec-threshold P]\n"
      "             [--spec-alpha A] [--spec-lookup 0|1] [--stats]\n"
      "             [--json-schema FILE | --grammar FILE | --regex RE | --json]   # structured output: the reply\n"
      "             # matches a JSON schema, a GBNF grammar (root rule \"root\"), a regex, or is a JSON object\n"
      "             [--tools FILE [--tool-choice auto|none|required|NAME]]   # with --chat: tool calling (an\n"
      "             # OpenAI tool list); each call is printed as a JSON line {\"tool_call\": {id, name, arguments}}\n"
      "  chat       [-m MODEL] [--system TEXT] [--tools FILE [--tool-choice C]]   # /tool TEXT: a tool's result\n"
      "  (generate and chat) [--lora FILE[:SCALE]]...   # LoRA adapters (llama.cpp GGUF) for the model, in order;\n"
      "             # SCALE defaults to 1 (the term is SCALE * alpha / rank * B A x)\n"
      "  (generate and chat) [--min-p P] [--repeat-penalty R] [--presence-penalty P] [--frequency-penalty F]\n"
      "             [--penalty-last-n N]   # penalties over the last N tokens (-1: all, 0: off; default 64)\n"
      "  (generate, chat) [--tp N [--tp-mode exact|allreduce]] [--pp N] [--comm-timeout SECONDS]\n"
      "             [--comm mpi|nccl] [--device cpu|cuda]\n"
      "             # a model split across the N ranks of `mpirun -np N ember ...`: tensor (--tp) and/or\n"
      "             # pipeline (--pp) parallel, N = tp x pp; rank 0 prints. nccl: CUDA ranks, one GPU each\n"
      "  (generate, chat, perplexity, bench, serve) [--kv-type f16|q8_0]   # q8_0: half the KV memory per token\n"
      "  perplexity [-m MODEL] -f FILE [--ctx C] [--max-tokens N] [--tp N] [--pp N]\n"
      "  perplexity [-m MODEL] -f FILE --stream --cache full|window:W|sink:S:W|recompute:W\n"
      "             [--max-tokens N] [--series FILE.csv] [--stride K] [--logprobs FILE.csv] [--chunk K]\n"
      "  bench      [-m MODEL] [-p 512] [-n 128] [-t THREADS] [-r REPS] [--sessions K] [--prefix-cache N] [--json]\n"
      "             [--lora FILE]...   # with --sessions: session i decodes with adapter i mod count\n"
      "             [--tp N] [--pp N]  # with --sessions, under mpirun -np N: the model split across the ranks\n"
      "             [--token-times]   # with --json: the last repetition's per-token decode times\n"
      "             [--no-batch-invariant]   # oneDNN for large prefill chunks (results may depend on chunking)\n"
      "  bench      [-m MODEL] --spec ngram|self[:L]|draft:PATH (--prompt-file F | --prompt TEXT) [--chat] [-n N]\n"
      "             [-t THREADS] [-r REPS] [--spec-nodes N] [--spec-depth D] [--spec-threshold P]\n"
      "             [--spec-lookup 0|1] [--json]   # --spec-lookup 0: self/draft without prompt lookup beside them\n"
      "  tokenize   [-m MODEL] (-p TEXT | -f FILE) [--special]\n"
      "  embed      [-m MODEL] (-p TEXT | -f FILE) [--pooling mean|last|cls] [--normalize] [--special] [-t THREADS]\n"
      "             # one JSON array (the model's n_embd numbers) per input: the text, or each non-empty line\n"
#ifdef EMBER_WITH_SERVER
      "  serve      [-m MODEL] [--host 127.0.0.1] [--port 8080] [--parallel 8] [--queue 64] [--api-key KEY]\n"
      "             [--alias NAME] [-t THREADS] [--ctx N] [--kv-memory MIB] [--pooling mean|last|cls]\n"
      "             [--timeout SECONDS] [--max-body MIB] [--device cpu|cuda|auto] [--quiet]\n"
      "             [--tp N] [--pp N] [--comm-timeout SECONDS] [--comm mpi|nccl]  # under mpirun -np N: rank 0 serves\n"
      "             # OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/embeddings,\n"
      "             # /v1/models, /health, /metrics) and a chat page at /; key also from $EMBER_API_KEY\n"
#endif
      "MODEL defaults to $EMBER_HOME/SmolLM2-135M-Instruct.Q4_1.gguf (EMBER_HOME: ~/.cache/ember).\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "generate") return cmd_generate(argc, argv);
    if (cmd == "chat") return cmd_chat(argc, argv);
    if (cmd == "perplexity") return cmd_perplexity(argc, argv);
    if (cmd == "bench") return cmd_bench(argc, argv);
    if (cmd == "tokenize") return cmd_tokenize(argc, argv);
    if (cmd == "embed") return cmd_embed(argc, argv);
#ifdef EMBER_WITH_SERVER
    if (cmd == "serve") return cmd_serve(argc, argv);
#endif
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      usage();
      return 0;
    }
    if (cmd == "--version") {
      std::printf("ember %s\n", ember_version());
      return 0;
    }
    std::fprintf(stderr, "ember: unknown command '%s'\n", cmd.c_str());
    usage();
    return 2;
  } catch (const FollowerDone& f) {
    return f.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ember: %s\n", e.what());
    return 1;
  }
}
