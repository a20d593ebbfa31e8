/*
 * ember.h — the Ember C ABI (v1). This header is the whole public contract.
 *
 * Rules that hold for every function below:
 *  - Every fallible call returns an ember_status (EMBER_OK == 0). On failure a
 *    message describing the problem is available from ember_last_error() on
 *    the same thread until that thread's next ember_* call.
 *  - No exception, assert or abort ever reaches the host. After any error every
 *    handle stays usable.
 *  - Passing NULL for a required handle or pointer returns
 *    EMBER_ERR_INVALID_ARGUMENT; ember_*_destroy(NULL) is a no-op.
 *  - Text is UTF-8; text arguments that are not valid UTF-8 are rejected with
 *    EMBER_ERR_INVALID_ARGUMENT. Text returned never splits a UTF-8 character.
 *  - Parameter structs start with their own size: fill them with
 *    ember_*_params_init(), then change fields. The library reads only the
 *    bytes the caller's `size` covers; fields are only ever appended, so a
 *    program built against an older header keeps working (missing fields take
 *    their defaults). Since 1.1, ember_*_params_init(p) is a macro calling
 *    ember_*_params_init_sized(p, sizeof(struct)) with the struct size of the
 *    header the caller was built with, so a newer library never writes past
 *    an older program's struct; the 1.0 entry points write only the 1.0
 *    struct's bytes.
 *  - Lifetimes: handles are reference counted internally. Destroying a handle
 *    that others depend on is always safe: a model stays alive while an engine
 *    uses it, an engine while one of its sessions lives, a session while one
 *    of its streams lives. Destroying a handle twice is undefined (as free()).
 *    Borrowed handles (ember_engine_cache, ember_engine_scheduler) are valid
 *    until their engine handle is destroyed and must not be destroyed.
 *  - Threads: each function states its contract. Models are immutable and
 *    shared freely; engine calls are thread-safe; a session runs one stream at
 *    a time; streams of different sessions may be driven from different
 *    threads at once; ember_stream_cancel may be called from any thread.
 */
#ifndef EMBER_EMBER_H
#define EMBER_EMBER_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define EMBER_API __declspec(dllexport)
#else
#define EMBER_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define EMBER_VERSION_MAJOR 1
#define EMBER_VERSION_MINOR 8
#define EMBER_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, as ember_version_number() (1.2: 10200). */
#define EMBER_VERSION_NUMBER (EMBER_VERSION_MAJOR * 10000 + EMBER_VERSION_MINOR * 100 + EMBER_VERSION_PATCH)

/* ---------------------------------------------------------------- status */

/* 32-bit status codes with fixed values; new codes are only ever appended. */
typedef int32_t ember_status;
enum {
  EMBER_OK = 0,
  EMBER_ERR_INVALID_ARGUMENT = 1, /* NULL handle, bad value, invalid UTF-8 */
  EMBER_ERR_NOT_FOUND = 2,        /* missing file, unreadable file, I/O error */
  EMBER_ERR_BAD_FORMAT = 3,       /* corrupt or malformed file */
  EMBER_ERR_UNSUPPORTED = 4,      /* valid but not supported (architecture, type, device) */
  EMBER_ERR_OUT_OF_MEMORY = 5,    /* allocation failed, KV pool exhausted */
  EMBER_ERR_CONTEXT_FULL = 6,     /* the session's context cannot hold the tokens */
  EMBER_ERR_BUSY = 7,             /* the session already runs a stream */
  EMBER_ERR_CANCELLED = 8,        /* the operation was cancelled */
  EMBER_ERR_TIMEOUT = 9,          /* nothing happened before the timeout */
  EMBER_ERR_INTERNAL = 10,        /* a bug in Ember: please report it */
  EMBER_ERR_END_OF_STREAM = 11    /* ember_stream_next after the end event */
};

/* Library version as "MAJOR.MINOR.PATCH". Static storage; never NULL.
 * Thread-safe. */
EMBER_API const char* ember_version(void);

/* The library's version as MAJOR * 10000 + MINOR * 100 + PATCH (e.g. 10100
 * for 1.1.0); compare with EMBER_VERSION_NUMBER from the header the program
 * was built with. Thread-safe. Since 1.1. */
EMBER_API int32_t ember_version_number(void);

/* Message of the last failed ember_* call on this thread ("" if none).
 * Owned by the library; valid until this thread's next ember_* call.
 * Thread-safe (thread-local).
 *
 * Languages whose calls may change OS thread between two foreign calls (Go:
 * a goroutine can move to another thread between two cgo calls; also
 * green-thread runtimes) must read the message on the thread that made the
 * failing call: pin the caller for the duration of the call and of the
 * ember_last_error() read (Go: runtime.LockOSThread() before the call,
 * runtime.UnlockOSThread() after copying the message), or copy the message
 * inside the same foreign call (a C shim that calls the function and then
 * ember_last_error(), as the SWIG bindings in bindings/ember.i do). The
 * status itself is the return value and never depends on the thread. */
EMBER_API const char* ember_last_error(void);

/* Short constant name of a status, e.g. "EMBER_ERR_BUSY"; "unknown status"
 * for values not defined. Static storage. Thread-safe. */
EMBER_API const char* ember_status_string(ember_status status);

/* Log levels passed to the log callback. */
enum { EMBER_LOG_DEBUG = 0, EMBER_LOG_INFO = 1, EMBER_LOG_WARN = 2, EMBER_LOG_ERROR = 3 };
typedef void (*ember_log_callback)(int32_t level, const char* message, void* user_data);

/* Route the library's log messages to `callback` (NULL restores the default:
 * warnings and errors on stderr). The callback may be called from any thread,
 * one call at a time, while the library holds internal locks; when this
 * returns, no call of the previous callback is running. Thread-safe. Never
 * fails.
 * Inside the callback only ember_version, ember_version_number,
 * ember_status_string and ember_last_error may be used. Since 1.1 every other
 * fallible function called from inside it returns EMBER_ERR_BUSY (with a
 * message saying why) instead of deadlocking, and ember_set_log_callback and
 * the ember_*_destroy / ember_stream_release functions are ignored there (the
 * handle stays valid): copy the message and act on it after the callback. */
EMBER_API void ember_set_log_callback(ember_log_callback callback, void* user_data);

/* CPU kernel variants (ember_capabilities_t.cpu_isa). */
enum { EMBER_ISA_SCALAR = 0, EMBER_ISA_AVX2 = 1, EMBER_ISA_AVX512_VNNI = 2 };
/* State of the CUDA plugin (ember_capabilities_t.cuda_plugin). */
enum {
  EMBER_PLUGIN_ABSENT = 0,   /* libember_cuda.so not found on the plugin search path */
  EMBER_PLUGIN_LOADABLE = 1, /* found, loaded, entry point and plugin ABI match */
  EMBER_PLUGIN_BROKEN = 2    /* found but cannot be used; see cuda_plugin_message */
};

typedef struct ember_capabilities_t {
  size_t size;                     /* sizeof(ember_capabilities_t), set by the caller */
  int32_t cpu_isa;                 /* EMBER_ISA_*: the CPU kernels in use */
  const char* cpu_isa_name;        /* "scalar", "avx2", "avx512_vnni"; static */
  int32_t cuda_plugin;             /* EMBER_PLUGIN_* */
  const char* cuda_plugin_path;    /* where the plugin was found, "" if absent; static */
  const char* cuda_plugin_message; /* why it is ABSENT/BROKEN, "" when LOADABLE; static */
  int32_t structured_output;       /* since 1.3: 1 when the library has its grammar engine (XGrammar):
                                      ember_stream_params' json_schema, grammar, regex, choices */
} ember_capabilities_t;

/* What this library can use on this machine. The plugin is searched as the
 * engine does (next to libember.so, $EMBER_PLUGIN_DIR, the loader's path),
 * once per process (later calls return the first answer), and loaded (as an
 * engine creation would; it is never unloaded), but no GPU is opened:
 * LOADABLE does not promise that a driver or a GPU is present
 * (ember_engine_create with EMBER_DEVICE_CUDA tells). Strings have static
 * storage. Errors: INVALID_ARGUMENT (NULL, size not set). Thread-safe.
 * Since 1.1. */
EMBER_API ember_status ember_capabilities(ember_capabilities_t* caps);

/* ---------------------------------------------------------------- handles */

typedef struct ember_model ember_model;         /* immutable weights, tokenizer, template */
typedef struct ember_engine ember_engine;       /* a model bound to a device */
typedef struct ember_cache ember_cache;         /* the engine's KV block pool (borrowed) */
typedef struct ember_scheduler ember_scheduler; /* the engine's step scheduler (borrowed) */
typedef struct ember_session ember_session;     /* one conversation */
typedef struct ember_stream ember_stream;       /* one generation on a session */
typedef struct ember_lora ember_lora;           /* a LoRA adapter for a model (since 1.6) */

/* ---------------------------------------------------------------- model */

typedef struct ember_model_params {
  size_t size;      /* sizeof(ember_model_params) */
  int32_t use_mmap; /* how the weights are held once loaded:
                       1 (default) or 0: in private memory, read from the file
                       once; the file may then be changed, truncated or deleted
                       without harm to the host. Costs the file's size in
                       anonymous memory, once: the CPU backend releases a
                       weight's pages when it has packed the weight for its
                       kernels (EMBER_CPU_RELEASE_PACKED=0 keeps both). If a
                       later reader needs those bytes (an engine with
                       batch_invariant = 0, a CUDA engine, a tensor-parallel
                       rank), they are read back from the file, which the
                       model keeps open: a deleted or renamed-over file still
                       reads; one changed in place or truncated since loading
                       fails that engine's requests with BAD_FORMAT, never
                       other weights (until 1.2: 1 mapped the file, 0 read it).
                       EMBER_MODEL_MAP_SHARED (since 1.2): read in place from a
                       shared read-only mapping: no copy, pages shared with
                       other processes and reclaimable by the kernel, but
                       truncating the file while the model lives then kills
                       the process with SIGBUS. Any other value: as 1 */
} ember_model_params;

/* ember_model_params.use_mmap: weights in place in a shared mapping. Since 1.2. */
enum { EMBER_MODEL_MAP_SHARED = 2 };

/* Fills the first `size` bytes of *params with defaults and sets
 * params->size = size; never writes past `size` bytes. Bytes beyond what this
 * library knows (a caller built against a newer header) are zeroed. NULL or a
 * size below sizeof(size_t) is ignored. Thread-safe. Since 1.1. */
EMBER_API void ember_model_params_init_sized(ember_model_params* params, size_t size);
/* The 1.0 entry point, kept for programs built against the 1.0 header: it
 * writes exactly the 1.0 struct's bytes whatever this library's struct has
 * grown to (such a program has no bigger struct). NULL is ignored. The macro
 * below routes programs built against this header to the sized variant with
 * their own sizeof; (ember_*_params_init)(p) still calls this one. */
EMBER_API void(ember_model_params_init)(ember_model_params* params);
#define ember_model_params_init(params) ember_model_params_init_sized((params), sizeof(ember_model_params))

/* Loads a GGUF model. `params` may be NULL (defaults). On success *out_model
 * receives a new handle owned by the caller (release with
 * ember_model_destroy). Errors: INVALID_ARGUMENT (NULL path/out, bad params),
 * NOT_FOUND (missing/unreadable file), BAD_FORMAT (corrupt GGUF, or a
 * file that shrank while it was being read), UNSUPPORTED (architecture or
 * tensor type), OUT_OF_MEMORY (no memory for the weights). By default, once
 * it returns, the file is read again only for released weight pages (see
 * use_mmap). Thread-safe. */
EMBER_API ember_status ember_model_load(const char* path, const ember_model_params* params, ember_model** out_model);

/* Releases the caller's reference. Engines using the model keep it alive.
 * NULL is a no-op. Thread-safe with respect to other handles. */
EMBER_API void ember_model_destroy(ember_model* model);

typedef struct ember_model_info_t {
  size_t size;              /* sizeof(ember_model_info_t), set by the caller */
  const char* architecture; /* e.g. "llama"; owned by the model */
  const char* name;         /* general.name or ""; owned by the model */
  uint64_t n_params;        /* number of weight elements */
  int32_t context_length;   /* trained context length */
  int32_t vocab_size;
  int32_t n_layers;
  int32_t n_embd;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t bos_token; /* -1 when the model has none */
  int32_t eos_token;
} ember_model_info_t;

/* Fills *info (set info->size first). String pointers stay valid while the
 * model lives. Errors: INVALID_ARGUMENT. Thread-safe. */
EMBER_API ember_status ember_model_info(const ember_model* model, ember_model_info_t* info);

/* Tokenizes UTF-8 text. Special tokens (e.g. "<|im_start|>") are recognised
 * only when parse_special != 0; add_special != 0 adds BOS/EOS as the model's
 * metadata says. Writes at most `capacity` ids to `tokens` (may be NULL when
 * capacity is 0) and the full count to *out_count; if the count exceeds
 * capacity the call returns INVALID_ARGUMENT with *out_count set so the caller
 * can retry with a larger buffer. Errors: INVALID_ARGUMENT (NULL, invalid
 * UTF-8, small buffer). Thread-safe. */
EMBER_API ember_status ember_tokenize(const ember_model* model, const char* text, int32_t add_special,
                                      int32_t parse_special, int32_t* tokens, size_t capacity, size_t* out_count);

/* Converts token ids to text. Writes at most `capacity` bytes including a
 * terminating NUL into `text`; *out_length receives the text length without
 * the NUL. If the text does not fit, returns INVALID_ARGUMENT with
 * *out_length set. Bytes that do not form valid UTF-8 become U+FFFD.
 * Errors: INVALID_ARGUMENT (NULL, id out of range, small buffer).
 * Thread-safe. */
EMBER_API ember_status ember_detokenize(const ember_model* model, const int32_t* tokens, size_t n_tokens, char* text,
                                        size_t capacity, size_t* out_length);

/* ---------------------------------------------------------------- engine */

/* Devices. The environment variable EMBER_FORCE_DEVICE (cpu, cuda, cuda:N or
 * auto), when set, overrides the device of every engine the process creates
 * (for running an existing program or test suite on a GPU); an engine then
 * reports the device it actually runs on. EMBER_CUDA_GRAPHS=1 lets a CUDA
 * engine replay its decode-only steps as CUDA graphs (same results). */
enum { EMBER_DEVICE_CPU = 0, EMBER_DEVICE_CUDA = 1, EMBER_DEVICE_AUTO = 2 };
/* The KV cache's element type (ember_engine_params.kv_dtype). Q8_0 (since
 * 1.8): 32 values in 34 bytes (an f16 scale and 32 int8), about half of F16's
 * memory per token, so the same kv_memory_bytes hold ~1.9x the tokens; needs
 * head_dim % 32 == 0 and the CPU device (UNSUPPORTED otherwise). Perplexity
 * within 0.2% of F16's on the books (SmolLM2 +0.03%, Gemma 3 +0.16%;
 * docs/BENCHMARKS.md); decode over long caches is faster (fewer bytes read).
 * Logits are no longer llama.cpp's to the bit, and still never depend on
 * batching. Session files restore only into an engine of the same kv_dtype.
 * Sink/window sessions work, but each K-shift requantizes the kept keys:
 * over long streams F16 keeps perplexity better (+1.3% for Q8_0 over 12k
 * tokens with sink 4 + window 1020). */
enum { EMBER_KV_F16 = 0, EMBER_KV_Q8_0 = 1 };

typedef struct ember_engine_params {
  size_t size;              /* sizeof(ember_engine_params) */
  int32_t device;           /* EMBER_DEVICE_*, default CPU. CUDA loads the
                               libember_cuda.so plugin (UNSUPPORTED when it, a
                               driver or a GPU is missing); AUTO uses CUDA when
                               available, else the CPU */
  int32_t n_threads;        /* CPU threads; 0 (default): up to every core, the
                               count adapted to measured speed (fewer when other
                               work holds a core); N > 0: exactly N. Results
                               never depend on the count */
  uint64_t kv_memory_bytes; /* KV pool budget; 0 (default) = 512 MiB. On the CPU
                               the pool is reserved, not committed: memory
                               becomes resident as blocks are first written */
  int32_t kv_block_size;    /* tokens per KV block; default 16 */
  int32_t kv_dtype;         /* EMBER_KV_*; default F16 (Q8_0: half the memory) */
  int32_t max_batch_tokens; /* tokens per engine step; default 512 */
  int32_t max_running;      /* sequences per step; default 64 */
  int32_t prefix_caching;   /* 1 (default): reuse KV of identical prompt prefixes */
  int32_t manual_step;      /* 0 (default): a worker thread runs steps; 1: the host
                               runs them with ember_engine_step (game loops; its
                               CPU prompt rows then never run on AMX tiles, whose
                               cost per call would break the frame budget) */
  int32_t batch_invariant;  /* 1 (default): a stream's tokens never depend on what
                               else runs (batching, chunking, prefix hits); 0 lets
                               the CPU use oneDNN for large prefill chunks */
  int32_t reserved_;        /* (1.0's padding: never read) */
  /* Since 1.7: a model split across the ranks of an MPI job (Open MPI;
   * start the program with `mpirun -np N`, N = tp_size x pp_size). Needs
   * libember_mpi.so next to libember.so (UNSUPPORTED otherwise). Every rank
   * creates its engine with the same parameters; rank 0's engine is used as
   * any other (sessions, streams), the others call ember_engine_follow. Not
   * yet with a split model: speculative decoding, window/sink sessions,
   * session files, LoRA adapters (each refused with UNSUPPORTED). */
  int32_t tp_size;          /* tensor parallel: attention heads and FFN columns
                               split over tp_size ranks (heads, KV heads or
                               tp_size / KV heads, and n_ff divisible);
                               1 (default): not split */
  int32_t pp_size;          /* pipeline parallel: layers split over pp_size ranks,
                               each step's sequences in micro-batches; output
                               bit-identical to one rank. 1 (default). Both
                               above 1 (since 1.8): pp_size stages of tp_size
                               ranks each, ranks stage-major (rank = stage x
                               tp_size + tensor-parallel rank) */
  int32_t comm_timeout_ms;  /* how long a rank waits for the others within a step
                               before the job is declared broken (a rank died or
                               hangs); 0 (default): 60000 */
  int32_t comm;             /* EMBER_COMM_MPI (default): any device (GPU buffers
                               staged through the host); EMBER_COMM_NCCL: CUDA
                               ranks, one GPU each (device CUDA: GPU = the rank's
                               index on its machine), libember_nccl.so, still
                               started by mpirun */
  int32_t tp_exact;         /* 1 (default): tensor parallel bit-identical to one
                               rank (attn_output and ffn_down split by output
                               rows after all-gathers of their inputs: 4
                               all-gathers a layer); 0: Megatron's split by input
                               columns, partial sums all-reduced (2 all-reduces a
                               layer, the sums in another order) */
} ember_engine_params;

enum { EMBER_COMM_MPI = 0, EMBER_COMM_NCCL = 1 };

/* Fills the first `size` bytes of *params with defaults and sets
 * params->size = size; never writes past `size` bytes. Bytes beyond what this
 * library knows (a caller built against a newer header) are zeroed. NULL or a
 * size below sizeof(size_t) is ignored. Thread-safe. Since 1.1. */
EMBER_API void ember_engine_params_init_sized(ember_engine_params* params, size_t size);
/* The 1.0 entry point, kept for programs built against the 1.0 header: it
 * writes exactly the 1.0 struct's bytes whatever this library's struct has
 * grown to (such a program has no bigger struct). NULL is ignored. The macro
 * below routes programs built against this header to the sized variant with
 * their own sizeof; (ember_*_params_init)(p) still calls this one. */
EMBER_API void(ember_engine_params_init)(ember_engine_params* params);
#define ember_engine_params_init(params) ember_engine_params_init_sized((params), sizeof(ember_engine_params))

/* Creates an engine that runs `model` on a device and starts its worker
 * thread. The engine holds its own reference to the model. `params` may be
 * NULL. Errors: INVALID_ARGUMENT, UNSUPPORTED (device not available),
 * OUT_OF_MEMORY. Thread-safe. */
EMBER_API ember_status ember_engine_create(ember_model* model, const ember_engine_params* params,
                                           ember_engine** out_engine);

/* A model split across ranks (ember_engine_params.tp_size / pp_size): this
 * process's rank in the MPI job (0 when not split) and the job's size (1).
 * Either pointer may be NULL. Errors: INVALID_ARGUMENT (NULL engine).
 * Thread-safe. Since 1.7. */
EMBER_API ember_status ember_engine_rank(const ember_engine* engine, int32_t* out_rank, int32_t* out_size);

/* On a rank > 0 of a split model: runs the forward passes rank 0's engine
 * sends until rank 0 destroys it (returns OK), then the caller destroys its
 * own engine and exits. The rank does nothing else meanwhile (no sessions on
 * it). Errors: INVALID_ARGUMENT (NULL, rank 0 or a model not split),
 * TIMEOUT or INTERNAL when a rank failed (the job is then broken: exit
 * non-zero). Since 1.7. */
EMBER_API ember_status ember_engine_follow(ember_engine* engine);

/* Releases the caller's reference; the engine stops once no session uses it
 * (running streams of live sessions keep going). NULL is a no-op. */
EMBER_API void ember_engine_destroy(ember_engine* engine);

typedef struct ember_engine_info_t {
  size_t size;              /* sizeof(ember_engine_info_t), set by the caller */
  int32_t device;           /* EMBER_DEVICE_CPU or EMBER_DEVICE_CUDA: where it runs
                               (an AUTO engine reports what it chose) */
  int32_t gpu_index;        /* CUDA: the GPU's index (0: ember_engine_params selects
                               the first GPU); -1 on the CPU */
  const char* backend_name; /* e.g. "cpu/avx2", "cuda/NVIDIA H100/sm_90"; owned by
                               the engine handle, valid until it is destroyed */
  int32_t manual_step;      /* 1 when created with manual_step = 1 */
} ember_engine_info_t;

/* Where the engine runs. Errors: INVALID_ARGUMENT (NULL, size not set).
 * Thread-safe. Since 1.1. */
EMBER_API ember_status ember_engine_info(const ember_engine* engine, ember_engine_info_t* info);

/* Manual mode only (manual_step = 1): runs engine steps on the calling
 * thread until `max_ms` milliseconds have passed or `max_tokens` tokens were
 * processed (a value <= 0 lifts that limit) or no stream has work left.
 * *out_tokens (may be NULL) receives the tokens processed. Poll streams with
 * ember_stream_next(stream, &event, 0) between calls. Thread-safe (steps
 * are serialised). Errors: INVALID_ARGUMENT (NULL, not in manual mode). */
EMBER_API ember_status ember_engine_step(ember_engine* engine, int32_t max_ms, int32_t max_tokens, size_t* out_tokens);

/* Borrowed views of the engine's KV cache and scheduler; valid until the
 * engine handle is destroyed; never destroy them. NULL on NULL engine. */
EMBER_API ember_cache* ember_engine_cache(ember_engine* engine);
EMBER_API ember_scheduler* ember_engine_scheduler(ember_engine* engine);

typedef struct ember_cache_stats_t {
  size_t size;        /* sizeof(ember_cache_stats_t), set by the caller */
  int32_t block_size; /* tokens per block */
  size_t blocks_total;
  size_t blocks_used;   /* referenced by at least one sequence */
  size_t blocks_cached; /* unreferenced but holding reusable prefix KV */
  size_t blocks_free;
  uint64_t prefix_hits; /* blocks reused from the prefix cache */
  uint64_t prefix_misses;
  size_t bytes_per_block;
} ember_cache_stats_t;

/* Snapshot of the pool. Errors: INVALID_ARGUMENT. Thread-safe. */
EMBER_API ember_status ember_cache_stats(const ember_cache* cache, ember_cache_stats_t* stats);

typedef struct ember_scheduler_stats_t {
  size_t size;             /* sizeof(ember_scheduler_stats_t), set by the caller */
  size_t running;          /* sequences in the last step */
  size_t waiting;          /* streams waiting to run */
  uint64_t preempted;      /* preemptions so far */
  size_t last_step_tokens; /* tokens in the last step */
  uint64_t steps;          /* steps run so far */
} ember_scheduler_stats_t;

EMBER_API ember_status ember_scheduler_stats(const ember_scheduler* scheduler, ember_scheduler_stats_t* stats);

/* ---------------------------------------------------------------- session */

typedef struct ember_session_params {
  size_t size;               /* sizeof(ember_session_params) */
  int32_t n_ctx;             /* max tokens held; 0 (default) = the model's context length */
  const char* system_prompt; /* optional first system message (copied); NULL = none */
  int32_t priority;          /* EMBER_PRIORITY_*; default INTERACTIVE */
  int32_t cache_policy;      /* EMBER_CACHE_*; default FULL */
  int32_t sink_tokens;       /* SINK: first tokens kept for ever; default 4 (0 allowed) */
  int32_t window_tokens;     /* WINDOW/SINK: most recent tokens kept; 0 (default) =
                                n_ctx - sink_tokens (the cache then holds n_ctx tokens) */
} ember_session_params;

/* Scheduling priority of a session's streams: interactive streams run before
 * background ones and may preempt them when the KV pool is full. Since 1.5, a
 * background prompt runs at most 16 tokens per engine step while an
 * interactive stream is decoding (the whole step budget otherwise), so it
 * never stalls the interactive stream's tokens. */
enum { EMBER_PRIORITY_INTERACTIVE = 0, EMBER_PRIORITY_BACKGROUND = 1 };

/* Cache policies (fixed at creation).
 *  FULL:   every token stays cached; the session ends at n_ctx tokens
 *          (CONTEXT_FULL).
 *  WINDOW: only the most recent window_tokens tokens stay (plain window
 *          attention; kept for comparison: quality collapses once the first
 *          tokens leave the cache).
 *  SINK:   StreamingLLM: the first sink_tokens tokens (the attention sinks)
 *          plus the most recent window_tokens tokens. The session never runs
 *          out of context and its KV memory stays constant however long it
 *          runs.
 * WINDOW and SINK give the tokens positions inside the cache (sinks 0..S-1,
 * window S..S+W-1), so no position ever reaches S + W; S + W must not exceed
 * the model's context and W must be at least the engine's kv_block_size.
 * Tokens leave the window a KV block at a time (kv_block_size tokens), so the
 * window holds between W - kv_block_size + 1 and W tokens. Such a session
 * keeps its KV blocks between turns (at most S + W tokens' worth; creation
 * fails with OUT_OF_MEMORY if the pool cannot hold them) and, once it has
 * evicted tokens, is never preempted and no longer shares its blocks through
 * the prefix cache. History before the evicted tokens cannot be rewritten:
 * a chat template that re-renders earlier text differently fails with
 * UNSUPPORTED. */
enum { EMBER_CACHE_FULL = 0, EMBER_CACHE_WINDOW = 1, EMBER_CACHE_SINK = 2 };

/* Fills the first `size` bytes of *params with defaults and sets
 * params->size = size; never writes past `size` bytes. Bytes beyond what this
 * library knows (a caller built against a newer header) are zeroed. NULL or a
 * size below sizeof(size_t) is ignored. Thread-safe. Since 1.1. */
EMBER_API void ember_session_params_init_sized(ember_session_params* params, size_t size);
/* The 1.0 entry point, kept for programs built against the 1.0 header: it
 * writes exactly the 1.0 struct's bytes whatever this library's struct has
 * grown to (such a program has no bigger struct). NULL is ignored. The macro
 * below routes programs built against this header to the sized variant with
 * their own sizeof; (ember_*_params_init)(p) still calls this one. */
EMBER_API void(ember_session_params_init)(ember_session_params* params);
#define ember_session_params_init(params) ember_session_params_init_sized((params), sizeof(ember_session_params))

/* Creates an empty conversation on `engine` (which it keeps alive).
 * Errors: INVALID_ARGUMENT (bad params, e.g. an unknown cache policy or a
 * window smaller than a KV block), OUT_OF_MEMORY (the pool cannot hold a
 * WINDOW/SINK cache). Thread-safe. */
EMBER_API ember_status ember_session_create(ember_engine* engine, const ember_session_params* params,
                                            ember_session** out_session);

/* Destroys the session; a stream still running on it is cancelled and keeps
 * the session's state alive until the stream is destroyed. NULL is a no-op. */
EMBER_API void ember_session_destroy(ember_session* session);

/* Appends a chat message (role such as "system", "user", "assistant"; content
 * UTF-8). The model's chat template is applied by the library when the next
 * stream starts. Errors: INVALID_ARGUMENT (NULL, invalid UTF-8, empty role),
 * BUSY (a stream runs), UNSUPPORTED (no usable chat template),
 * CONTEXT_FULL. Thread-safe per session (one caller at a time is simplest).
 * The template is rendered by ember_stream_start, on its caller's thread,
 * within bounds: its loops, output and values are capped, and its recursion
 * uses at most 256 KiB of that thread's stack (less where the thread has less
 * left); a template past them fails there with INVALID_ARGUMENT and a
 * message, never a crash. */
EMBER_API ember_status ember_session_add_message(ember_session* session, const char* role, const char* content);

/* Since 1.4: tool calling. Sets the tools the model may call in this chat
 * session from the next stream on (NULL or "" = none), as an OpenAI Chat
 * Completions tool list, JSON text:
 *   [{"type": "function", "function": {"name": "move_to",
 *     "description": "Walk to a place", "parameters": {JSON Schema}}}, ...]
 * Names are 1-256 characters of A-Z a-z 0-9 _ . -, unique; "parameters" is
 * an object or absent (any JSON object). A template that reads the `tools`
 * variable (Qwen2.5/3, Hermes, Llama 3.1+) gets the list; any other is told
 * about the tools in a system message Ember adds, in the <tool_call> format.
 * Replies then hold each call to its tool's argument schema once it starts
 * (free text before it; see ember_stream_params.tool_choice), and each call
 * comes out as an EMBER_EVENT_TOOL_CALL event instead of text. Send a tool's
 * result back with ember_session_add_message(session, "tool", result).
 * Saved by ember_session_save (files of 1.4 on; earlier ones load with no
 * tools). Errors: INVALID_ARGUMENT (NULL session,
 * invalid JSON or UTF-8, more than 1 MiB, nesting deeper than 128, more than
 * 512 tools, a bad or repeated name; the message says which), BUSY,
 * UNSUPPORTED (no usable chat template). */
EMBER_API ember_status ember_session_set_tools(ember_session* session, const char* tools_json);

/* Appends raw text to the session (completion mode; no template). Special
 * tokens in the text are recognised when parse_special != 0. BOS is added
 * first when the session is empty and the model asks for it.
 * Errors: INVALID_ARGUMENT, BUSY, CONTEXT_FULL. */
EMBER_API ember_status ember_session_add_text(ember_session* session, const char* text, int32_t parse_special);

/* Appends token ids to the session as they are (completion mode; no
 * template, no BOS added). Errors: INVALID_ARGUMENT (NULL, id out of range),
 * BUSY, CONTEXT_FULL. */
EMBER_API ember_status ember_session_add_tokens(ember_session* session, const int32_t* tokens, size_t n_tokens);

/* Forgets the whole conversation and frees its KV blocks.
 * Errors: INVALID_ARGUMENT, BUSY. */
EMBER_API ember_status ember_session_reset(ember_session* session);

/* Number of tokens the session holds (prompt and replies). */
EMBER_API ember_status ember_session_token_count(const ember_session* session, size_t* out_count);

/* Appends token ids (completion mode, as ember_session_add_tokens) and scores
 * them through the engine under the session's cache policy: logprobs[i]
 * receives log p(tokens[i] | every session token before it), computed with
 * what the policy keeps of that context; NaN for a token with nothing before
 * it (the first token of an empty session). `logprobs` holds n_tokens floats,
 * or is NULL to only feed the tokens. The last token stays pending (its K/V
 * are computed by the next call or stream), so a text can be fed one token at
 * a time at the cost of one decode step each: streaming perplexity. Blocks
 * until done; in manual-step mode it runs the engine's steps itself.
 * Errors: INVALID_ARGUMENT (NULL, id out of range, chat session), BUSY,
 * CONTEXT_FULL (FULL policy), OUT_OF_MEMORY, CANCELLED. Thread-safe per session. */
EMBER_API ember_status ember_session_score(ember_session* session, const int32_t* tokens, size_t n_tokens,
                                           float* logprobs);

typedef struct ember_session_cache_info_t {
  size_t size;             /* sizeof(ember_session_cache_info_t), set by the caller */
  int32_t cache_policy;    /* EMBER_CACHE_* */
  int32_t sink_tokens;     /* S (0 unless SINK) */
  int32_t window_tokens;   /* W (0 for FULL) */
  size_t n_tokens;         /* tokens in the history (as ember_session_token_count) */
  size_t processed_tokens; /* history tokens run through the model so far */
  size_t resident_tokens;  /* tokens whose K/V are cached now (<= S + W when bounded) */
  uint64_t evicted_tokens; /* tokens the policy dropped from the cache */
  size_t blocks;           /* KV blocks the session holds now */
  size_t max_blocks;       /* the most it will ever hold (WINDOW/SINK), 0 for FULL */
  int32_t max_position;    /* highest RoPE position given to any of its tokens
                              (< S + W when bounded); -1 before the first */
} ember_session_cache_info_t;

/* What the session's cache holds. A FULL session holds no blocks between
 * turns (they wait in the prefix cache). Errors: INVALID_ARGUMENT. Thread-safe. */
EMBER_API ember_status ember_session_cache_info(const ember_session* session, ember_session_cache_info_t* info);

/* Saves the session to a file at `path` (replaced atomically): its token
 * history, cache policy, chat messages and KV blocks, in a versioned format
 * with a checksum and a fingerprint of the model. For a FULL session the KV
 * of its prefix still held by the pool is saved. A session restored with
 * ember_session_load continues exactly as this one would (same engine
 * settings). Errors: INVALID_ARGUMENT, BUSY (a stream runs), NOT_FOUND (the
 * file cannot be written). Thread-safe per session. */
EMBER_API ember_status ember_session_save(ember_session* session, const char* path);

/* Restores a session saved by ember_session_save on `engine`, whose model must
 * be the one that saved it. The policy, context, messages and history come
 * from the file; of `params` (may be NULL) only `priority` is read. On success
 * *out_session receives a new handle owned by the caller. Errors:
 * INVALID_ARGUMENT (NULL), NOT_FOUND (missing/unreadable file), BAD_FORMAT
 * (not a session file, truncated, checksum mismatch, inconsistent content),
 * UNSUPPORTED (another model, another kv_block_size, a newer file version),
 * OUT_OF_MEMORY (no room in the KV pool). The message says which.
 * Thread-safe. */
EMBER_API ember_status ember_session_load(ember_engine* engine, const char* path, const ember_session_params* params,
                                          ember_session** out_session);

/* ---------------------------------------------------------------- LoRA */

/* Since 1.6. Loads a LoRA adapter in llama.cpp's GGUF format
 * (convert_lora_to_gguf.py: general.type "adapter", adapter.type "lora",
 * adapter.lora.alpha, <matrix>.lora_a / .lora_b in F32, F16 or BF16) for
 * `model`: it must be made for the model's architecture and shapes. Layer
 * matrices (attn_q/k/v/output, ffn_gate/up/down) are adapted; an adapter of
 * anything else is refused. The file is read once (a private copy). On
 * success *out_lora receives a new handle owned by the caller. Errors:
 * INVALID_ARGUMENT (NULL, an adapter for another model: the message names
 * the first mismatch), NOT_FOUND, BAD_FORMAT (corrupt or truncated, not an
 * adapter, lora_a/lora_b missing or of disagreeing rank, a non-finite
 * value), UNSUPPORTED (a tensor type or matrix Ember does not apply),
 * OUT_OF_MEMORY. Thread-safe. */
EMBER_API ember_status ember_lora_load(const ember_model* model, const char* path, ember_lora** out_lora);

/* Releases the caller's reference. Sessions using the adapter keep it alive
 * until they set other adapters or go, so this is safe at any time. NULL is
 * a no-op. Since 1.6. */
EMBER_API void ember_lora_destroy(ember_lora* lora);

typedef struct ember_lora_info_t {
  size_t size;        /* set by the library: sizeof the struct it filled */
  int32_t n_matrices; /* matrices adapted */
  int32_t max_rank;   /* largest rank of its pairs */
  float alpha;        /* adapter.lora.alpha (0: none; each term is then scaled by its scale alone) */
  uint64_t bytes;     /* the adapter's tensors */
} ember_lora_info_t;

/* Fills `info` (any size; fields beyond the caller's size are not written).
 * Since 1.6. Errors: INVALID_ARGUMENT. */
EMBER_API ember_status ember_lora_info(const ember_lora* lora, ember_lora_info_t* info);

/* Since 1.6. The adapters the session's next turns decode with, in order,
 * each with its scale (`scales` may be NULL: all 1.0); n == 0 sets none. A
 * row computes W x + sum_i scale_i * alpha_i / rank_i * B_i A_i x, as
 * llama.cpp does; sessions with different adapters (or none) still decode
 * in the same engine steps, and a session's tokens never depend on what the
 * others use. Changing the set between turns recomputes the history under
 * the new one (KV computed with the same set and tokens is reused from the
 * prefix cache). Sessions with adapters cannot be saved yet
 * (ember_session_save answers UNSUPPORTED). Errors: INVALID_ARGUMENT (NULL
 * session, a NULL adapter with n > 0, more than 16 adapters, a scale that
 * is not finite or beyond +-1000, an adapter loaded for a model of another
 * shape), BUSY (a stream runs), UNSUPPORTED (a window/sink session that has
 * evicted tokens cannot recompute its history). */
EMBER_API ember_status ember_session_set_loras(ember_session* session, const ember_lora* const* loras,
                                               const float* scales, size_t n);

/* ---------------------------------------------------------------- stream */

/* Since 1.4. A logit bias entry (ember_stream_params.logit_bias). */
typedef struct ember_logit_bias {
  int32_t token;
  float bias;
} ember_logit_bias;

/* Since 1.4. A stream's logits processor: changes `logits` (n_vocab floats)
 * in place before a token is chosen from them; `history` holds every token
 * of the session before this row (prompt, earlier replies, this reply so
 * far, and for a speculative tree row the drafted tokens on its path).
 * Called on the thread that runs the engine's steps (its worker, or the
 * ember_engine_step caller in manual-step mode), one row at a time, for
 * every row a token of this stream is chosen from; streams of other
 * sessions wait meanwhile, so keep it short. It must not call Ember
 * functions on this engine (its sessions, streams, steps): that may
 * deadlock. Return 0 to go on; any other value (or a C++ exception escaping
 * it) fails the stream: it ends with an ERROR event, status
 * EMBER_ERR_CANCELLED, and keeps nothing of that row; other streams go on.
 * Setting a token the constraint rejects to a high value does not let it
 * through (the mask comes after). */
typedef int32_t (*ember_logits_processor)(float* logits, int32_t n_vocab, const int32_t* history, size_t n_history,
                                          void* user_data);

typedef struct ember_stream_params {
  size_t size;             /* sizeof(ember_stream_params) */
  int32_t max_tokens;      /* default 256; generation stops after this many */
  float temperature;       /* default 0.8; 0 = greedy */
  int32_t top_k;           /* default 40; 0 = off */
  float top_p;             /* default 0.95; 1 = off */
  float min_p;             /* default 0.05; 0 = off */
  float repeat_penalty;    /* default 1.0 = off */
  float presence_penalty;  /* default 0 */
  float frequency_penalty; /* default 0 */
  int32_t penalty_last_n;  /* default 64 tokens considered by penalties */
  uint64_t seed;           /* default 0xEEEE; same seed + same input = same text */
  const char* const* stop; /* optional NULL-terminated list of stop strings (copied) */
  int32_t ignore_eos;      /* default 0; 1 = do not stop at end-of-generation tokens */
  /* Since 1.2: speculative decoding. A drafter proposes a token tree, the
   * model verifies the whole tree in one pass, and the accepted tokens are
   * emitted together: greedy output is exactly the one without speculation,
   * sampled output has exactly the model's distribution (multi-branch
   * rejection sampling). See docs/API.md, "Speculative decoding". */
  int32_t spec_drafter;                /* EMBER_SPEC_NONE (default), _NGRAM, _SELF, _DRAFT */
  int32_t spec_self_layers;            /* SELF: the model's first L layers draft (0 = 7/8 of them, rounded down;
                                          chosen from measured acceptance, docs/BENCHMARKS.md) */
  const ember_model* spec_draft_model; /* DRAFT: a model with the same vocabulary (INVALID_ARGUMENT if not);
                                          the stream keeps it loaded until it ends */
  float spec_threshold;                /* default 0.3: a draft candidate this likely opens a branch */
  int32_t spec_max_nodes;              /* default 12: drafted tokens per tree, 1..64 */
  int32_t spec_max_depth;              /* default 8: drafted tokens per branch, 1..64 */
  float spec_alpha;                    /* default 0.25: verify when the best branch's confidence falls below
                                          (then adapts: halved after a fully accepted branch, else the
                                          fraction rejected) */
  int32_t spec_lookup;                 /* SELF, DRAFT: default 1 = prompt lookup's candidates beside the
                                          model's; 0 = the model's alone (NGRAM: ignored) */
  /* Since 1.3: structured output. At most one of these (NULL = unset); the
   * reply then matches it: every token the constraint rejects is masked out
   * of each row of logits before sampling (and before speculative
   * verification), and the reply ends (EMBER_END_EOS) once it is complete.
   * The text is copied. A schema, grammar or regex the engine cannot take
   * fails ember_stream_start with INVALID_ARGUMENT and the engine's message;
   * a library built without the grammar engine fails with UNSUPPORTED
   * (ember_capabilities: structured_output). Compiled constraints are cached
   * per engine: a second stream with the same one starts at once. Limits:
   * 1 MiB of text, EMBER_MAX_CHOICES choices of at most 4 KiB each. */
  const char* json_schema;    /* a JSON Schema (JSON text): the reply is compact JSON that validates */
  const char* grammar;        /* a grammar in llama.cpp's GBNF notation (XGrammar's EBNF), rule "root" */
  const char* regex;          /* a regular expression the whole reply matches */
  const char* const* choices; /* NULL-terminated list: the reply is exactly one of them */
  int32_t json_object;        /* 1: any JSON object (OpenAI's response_format "json_object"); default 0 */
  /* Since 1.4: tool calling, for a session with tools (ember_session_set_tools).
   * AUTO: free text, tool calls or both; REQUIRED: at least one call;
   * FUNCTION: exactly one call, of tool_name; NONE: no calls (the tools stay
   * in the prompt). A stream that may call tools takes none of the
   * constraints above (INVALID_ARGUMENT). REQUIRED and FUNCTION need the
   * grammar engine (UNSUPPORTED without it); AUTO without it still reports
   * calls, unconstrained. */
  int32_t tool_choice;         /* EMBER_TOOL_CHOICE_*; default AUTO */
  const char* tool_name;       /* FUNCTION: the tool to call (copied) */
  int32_t parallel_tool_calls; /* default 1: several calls per reply; 0: at most one */
  /* Since 1.4: the logits. Each row a token is chosen from gets, in order:
   * the logit bias, the logits processor, the constraint's mask (structured
   * output, tools), then the sampler (penalties, temperature, top-k/p, min-p).
   * Speculative tree rows get the same, each after its own path. */
  const ember_logit_bias* logit_bias; /* n_logit_bias entries (copied): bias added to the token's logit;
                                         -INFINITY bans the token; ids in [0, vocab), finite or -INFINITY */
  size_t n_logit_bias;                /* at most EMBER_MAX_LOGIT_BIAS */
  int32_t logprobs;     /* 1: each TEXT/TOOL_CALL event carries its tokens' log-probabilities; default 0 */
  int32_t top_logprobs; /* 0..20 (needs logprobs): the most likely tokens of each row, with theirs */
  ember_logits_processor logits_processor; /* NULL = none; see ember_logits_processor */
  void* logits_processor_data;             /* passed to it as user_data */
} ember_stream_params;

/* Log-probabilities are those of the row after the bias, the processor and the
 * constraint, before penalties and temperature (OpenAI's logprobs):
 * log softmax(row)[token]; a banned or masked token has -INFINITY. */
typedef struct ember_token_logprob {
  int32_t token;
  float logprob;
} ember_token_logprob;

#define EMBER_MAX_LOGIT_BIAS 65536

enum {
  EMBER_TOOL_CHOICE_AUTO = 0,
  EMBER_TOOL_CHOICE_NONE = 1,
  EMBER_TOOL_CHOICE_REQUIRED = 2,
  EMBER_TOOL_CHOICE_FUNCTION = 3
};

#define EMBER_MAX_CHOICES 4096

enum {
  EMBER_SPEC_NONE = 0,
  EMBER_SPEC_NGRAM = 1, /* prompt lookup: continuations of the text's own n-grams (no weights) */
  EMBER_SPEC_SELF = 2,  /* self-speculation (no extra weights): the model's first spec_self_layers layers +
                           its head, with prompt lookup beside them; the early exit drafts only where it
                           pays for its partial forward passes (on SmolLM2 it never does: docs/API.md) */
  EMBER_SPEC_DRAFT = 3  /* a draft model (spec_draft_model) on the same device */
};

/* Fills the first `size` bytes of *params with defaults and sets
 * params->size = size; never writes past `size` bytes. Bytes beyond what this
 * library knows (a caller built against a newer header) are zeroed. NULL or a
 * size below sizeof(size_t) is ignored. Thread-safe. Since 1.1. */
EMBER_API void ember_stream_params_init_sized(ember_stream_params* params, size_t size);
/* The 1.0 entry point, kept for programs built against the 1.0 header: it
 * writes exactly the 1.0 struct's bytes whatever this library's struct has
 * grown to (such a program has no bigger struct). NULL is ignored. The macro
 * below routes programs built against this header to the sized variant with
 * their own sizeof; (ember_*_params_init)(p) still calls this one. */
EMBER_API void(ember_stream_params_init)(ember_stream_params* params);
#define ember_stream_params_init(params) ember_stream_params_init_sized((params), sizeof(ember_stream_params))

/* Starts generating on the session from everything added so far. The reply
 * is appended to the session when the stream ends, so the next add_message +
 * stream_start continues the conversation on the cached KV.
 * Errors: INVALID_ARGUMENT, BUSY (the session already runs a stream),
 * CONTEXT_FULL (the prompt does not fit the session's context),
 * OUT_OF_MEMORY (it cannot fit the whole KV pool). Thread-safe. */
EMBER_API ember_status ember_stream_start(ember_session* session, const ember_stream_params* params,
                                          ember_stream** out_stream);

enum {
  EMBER_EVENT_TEXT = 0, /* a text piece with its token ids */
  EMBER_EVENT_END = 1,  /* the stream ended; see end_reason */
  EMBER_EVENT_ERROR = 2, /* the stream failed; see status and ember_last_error() */
  EMBER_EVENT_TOOL_CALL = 3 /* since 1.4: a complete tool call (tool_call_id, tool_name, tool_arguments);
                               its text is not sent as TEXT */
};
enum {
  EMBER_END_NONE = 0,
  EMBER_END_EOS = 1,         /* the model emitted an end-of-generation token */
  EMBER_END_STOP_STRING = 2, /* a stop string matched (it is not emitted) */
  EMBER_END_MAX_TOKENS = 3,
  EMBER_END_CANCELLED = 4,
  EMBER_END_CONTEXT_FULL = 5
};

typedef struct ember_event {
  size_t size;      /* sizeof(ember_event), set by the caller */
  int32_t type;     /* EMBER_EVENT_* */
  const char* text; /* TEXT: NUL-terminated UTF-8 piece (never splits a character) */
  size_t text_length;
  const int32_t* tokens; /* TEXT, TOOL_CALL: the token ids this event covers */
  size_t n_tokens;
  int32_t end_reason;  /* END: EMBER_END_* */
  ember_status status; /* ERROR: the failure */
  /* Since 1.4, TOOL_CALL (NULL otherwise): NUL-terminated UTF-8. */
  const char* tool_call_id;   /* "call_<n>", unique in the session */
  const char* tool_name;      /* one of the session's tools */
  const char* tool_arguments; /* compact JSON that validates against the tool's parameters */
  /* Since 1.4, with ember_stream_params.logprobs (NULL / 0 otherwise): */
  const float* logprobs;                   /* n_tokens values: each token's log-probability */
  const ember_token_logprob* top_logprobs; /* n_tokens * n_top_logprobs entries, token-major, most likely first */
  int32_t n_top_logprobs;
} ember_event;

/* Pulls the next event, waiting up to timeout_ms milliseconds (0 = poll,
 * negative = wait forever). Pointers in *event are owned by the stream and
 * valid until the next call on this stream. Returns OK with an event, TIMEOUT
 * when none came in time, END_OF_STREAM when called after the END/ERROR
 * event, BUSY if a callback is set. One thread at a time per stream. */
EMBER_API ember_status ember_stream_next(ember_stream* stream, ember_event* event, int32_t timeout_ms);

/* Push variant for C users: `callback` is called on the engine's worker
 * thread for every event until the END/ERROR event; returning nonzero from it
 * cancels the stream. Set it right after ember_stream_start. Events already
 * queued are delivered first (on the calling thread if the stream has
 * already ended). ember_stream_wait and ember_stream_destroy return only
 * after the END/ERROR callback has returned, so user_data may be freed then;
 * the callback must therefore not wait for or destroy its own stream.
 * Errors: INVALID_ARGUMENT, BUSY (already set), END_OF_STREAM (the END event
 * was already pulled with ember_stream_next). */
typedef int32_t (*ember_stream_callback)(const ember_event* event, void* user_data);
EMBER_API ember_status ember_stream_set_callback(ember_stream* stream, ember_stream_callback callback, void* user_data);

/* Requests cancellation; the stream ends with EMBER_END_CANCELLED soon after.
 * The session keeps what was generated so far and stays usable. Any thread.
 * Cancelling an ended stream is a no-op returning OK. */
EMBER_API ember_status ember_stream_cancel(ember_stream* stream);

/* Blocks until the stream has ended (and, with a callback, until the END/ERROR
 * callback has returned). Unread events stay readable with ember_stream_next.
 * Any thread. */
EMBER_API ember_status ember_stream_wait(ember_stream* stream);

typedef struct ember_stream_stats_t {
  size_t size;          /* sizeof(ember_stream_stats_t), set by the caller */
  size_t prompt_tokens; /* tokens prefilled for this stream */
  size_t generated_tokens; /* tokens the model generated: an end-of-generation
                            * token that ended the stream counts (it is not sent) */
  double time_to_first_token_ms;
  double tokens_per_second; /* decode rate after the first token */
  double prefill_tokens_per_second;
  int32_t finished;   /* 1 once the stream ended */
  int32_t end_reason; /* EMBER_END_* */
  /* Since 1.2: speculative decoding (0 without it). */
  uint64_t drafted_tokens;     /* tokens the drafter proposed (tree nodes) */
  uint64_t accepted_tokens;    /* drafted tokens the model accepted */
  uint64_t verify_passes;      /* model passes that verified a tree */
  double mean_accepted_length; /* accepted_tokens / verify_passes */
} ember_stream_stats_t;

EMBER_API ember_status ember_stream_stats(const ember_stream* stream, ember_stream_stats_t* stats);

/* Cancels the stream if still running, waits for it to stop, and releases it.
 * NULL is a no-op. */
EMBER_API void ember_stream_destroy(ember_stream* stream);

/* Releases the stream without ever blocking: requests cancellation and drops
 * the caller's handle at once, without waiting for the engine (which may be
 * in the middle of a step, or, in manual mode, not stepping at all). The
 * engine finishes the cancelled stream at its next step and then frees it;
 * until then its session reports BUSY. For garbage-collector finalizers and
 * other threads that must never wait for, or run, engine steps. If a callback
 * was set (ember_stream_set_callback), it may still run after this returns:
 * keep its user_data alive until its END/ERROR call. A manual-step engine
 * frees the stream (and the session and engine it keeps alive) at its next
 * ember_engine_step; if none ever runs again, they stay allocated until the
 * process ends. NULL is a no-op. Any thread. Since 1.1. */
EMBER_API void ember_stream_release(ember_stream* stream);

/* ---------------------------------------------------------------- scoring */

/* Scores `tokens` with the model from an empty context on the engine: for
 * each i in [0, n_tokens-1) writes log p(tokens[i+1] | tokens[0..i]) to
 * logprobs[i] (n_tokens - 1 values). If `logits` is non-NULL it receives the
 * raw logits of every position (n_tokens * vocab_size floats). Used by
 * perplexity tools. Errors: INVALID_ARGUMENT, CONTEXT_FULL (more tokens than
 * the context), OUT_OF_MEMORY. Thread-safe. */
EMBER_API ember_status ember_engine_score(ember_engine* engine, const int32_t* tokens, size_t n_tokens, float* logprobs,
                                          float* logits);

/* ---------------------------------------------------------------- embeddings */

/* Since 1.5. How an embedding pools the hidden states of an input's tokens
 * (ember_embed_params.pooling). */
enum {
  EMBER_POOLING_MEAN = 0, /* the mean over every token */
  EMBER_POOLING_LAST = 1, /* the last token's */
  EMBER_POOLING_CLS = 2   /* the first token's (BOS where the model adds one) */
};
/* Since 1.5: the most inputs one ember_engine_embed call takes. */
#define EMBER_MAX_EMBED_INPUTS 4096

typedef struct ember_embed_params {
  size_t size;           /* sizeof(ember_embed_params) */
  int32_t pooling;       /* EMBER_POOLING_* (default MEAN) */
  int32_t normalize;     /* 1: each vector scaled to L2 length 1 (default 0) */
  int32_t parse_special; /* texts: 1 = special-token text (e.g. "<|im_start|>") is
                            the special token (default 0, as llama.cpp embeds) */
} ember_embed_params;

/* Defaults into the first `size` bytes of *params (as the other
 * *_params_init_sized). Since 1.5. */
EMBER_API void ember_embed_params_init_sized(ember_embed_params* params, size_t size);
#define ember_embed_params_init(params) ember_embed_params_init_sized((params), sizeof(ember_embed_params))

/* Embeds `n_texts` UTF-8 texts (each tokenized with the model's BOS/EOS as
 * its metadata says, like llama.cpp's embeddings): each vector is the hidden
 * state after the model's final norm (the output head's input), pooled over
 * the text's tokens by params->pooling, optionally L2-normalised. Writes
 * n_texts * n_embd floats to `out` (ember_model_info_t.n_embd; vector i at
 * out + i * n_embd); `out_capacity` is how many floats `out` holds (too few:
 * INVALID_ARGUMENT, nothing written). `params` may be NULL (defaults).
 *
 * Every input runs as its own sequence through the engine's scheduler, in the
 * same steps as the streams generating on the engine, at background priority:
 * its rows are prefill chunks, at most 16 per step while an interactive
 * stream decodes (so embedding never stalls a chat: the time between its
 * tokens grows by the cost of 16 prompt rows at most) and up to the engine's
 * max_batch_tokens otherwise; no prefix-cache hits. A vector does not depend
 * on what else runs or on how the text was chunked.
 * Blocks until all are done; in manual-step mode it runs the engine's steps
 * itself. Errors: INVALID_ARGUMENT (NULL, no texts, more than
 * EMBER_MAX_EMBED_INPUTS, an empty text, invalid UTF-8, unknown pooling, small
 * buffer), CONTEXT_FULL (a text longer than the model's context),
 * OUT_OF_MEMORY (the KV pool cannot hold a text). Thread-safe. Since 1.5. */
EMBER_API ember_status ember_engine_embed(ember_engine* engine, const char* const* texts, size_t n_texts,
                                          const ember_embed_params* params, float* out, size_t out_capacity);

/* As ember_engine_embed, for inputs given as token ids: input i is
 * tokens[i][0 .. n_tokens[i]) (nothing is added; params->parse_special is
 * not used). Errors as ember_engine_embed, and INVALID_ARGUMENT for an id
 * out of range. Thread-safe. Since 1.5. */
EMBER_API ember_status ember_engine_embed_tokens(ember_engine* engine, const int32_t* const* tokens,
                                                 const size_t* n_tokens, size_t n_inputs,
                                                 const ember_embed_params* params, float* out, size_t out_capacity);

/* ---------------------------------------------------------------- limits */

/* Documented maximums (since 1.2 unless noted), each with the error a call
 * that exceeds it returns:
 *  - EMBER_MAX_TEXT_BYTES: bytes of any one text argument (message content
 *    and role, raw text, system prompt, text to tokenize, file paths), more
 *    than the largest context (2^24 tokens) can hold. INVALID_ARGUMENT.
 *  - EMBER_MAX_STOP_STRINGS (since 1.0) stop strings per stream, each
 *    non-empty and at most EMBER_MAX_STOP_STRING_BYTES bytes.
 *    INVALID_ARGUMENT from ember_stream_start.
 *  - EMBER_MAX_TOKENS_PER_STREAM (since 1.0): ember_stream_params.max_tokens
 *    is in [1, this]. INVALID_ARGUMENT from ember_stream_start.
 *  - EMBER_MAX_SESSIONS_PER_ENGINE: live session handles per engine (created
 *    or loaded and not yet destroyed; destroying one frees its place).
 *    OUT_OF_MEMORY from ember_session_create / ember_session_load.
 *  - Tokens per session: n_ctx (a value above the model's context length,
 *    ember_model_info_t.context_length, is clamped to it); a FULL session's
 *    history beyond it
 *    is CONTEXT_FULL (add_message/add_text/add_tokens/score/stream_start), a
 *    stream reaching it ends with EMBER_END_CONTEXT_FULL.
 *  - KV pool (ember_engine_params.kv_memory_bytes): at least one KV block
 *    and at most EMBER_MAX_KV_BLOCKS blocks (INVALID_ARGUMENT from
 *    ember_engine_create; OUT_OF_MEMORY there if the memory cannot be
 *    reserved). A prompt needing more blocks than the whole pool fails
 *    ember_stream_start with OUT_OF_MEMORY, and a WINDOW/SINK session whose
 *    cache exceeds the pool fails ember_session_create with OUT_OF_MEMORY;
 *    a pool merely busy with other streams never fails a stream: it waits
 *    or preempts (ember_scheduler_stats_t.preempted).
 *  - Engine parameters (since 1.0): kv_block_size in [1, 64], max_batch_tokens
 *    in [1, 65536], max_running in [1, 4096], n_threads in [0, 1024].
 *    INVALID_ARGUMENT from ember_engine_create. */
#define EMBER_MAX_TEXT_BYTES 67108864 /* 64 MiB */
#define EMBER_MAX_STOP_STRINGS 64
#define EMBER_MAX_STOP_STRING_BYTES 4096
#define EMBER_MAX_TOKENS_PER_STREAM 16777216 /* 2^24 */
#define EMBER_MAX_SESSIONS_PER_ENGINE 4096
#define EMBER_MAX_KV_BLOCKS 1073741824 /* 2^30 */

/* ---------------------------------------------------------------- testing */

/* Allocation sites for ember_test_inject_alloc_failures. */
enum {
  EMBER_ALLOC_KV_BLOCK = 0,       /* a KV block handed to a sequence (stream prefill/decode,
                                     copy-on-write, session load, scoring) */
  EMBER_ALLOC_BACKEND_BUFFER = 1, /* the backend's activation buffers (forward pass) */
  EMBER_ALLOC_BACKEND_WEIGHT = 2, /* a weight made resident on the backend (engine creation) */
  EMBER_ALLOC_KV_POOL = 3,        /* the engine's KV pool (engine creation) */
  EMBER_ALLOC_MODEL_FILE = 4      /* the model's private copy of its file (ember_model_load) */
};

/* Fault injection for tests of error handling, the host's and Ember's own
 * (as SQLite's sqlite3_test_control); not for production use. At `site`, the
 * next `skip` allocations succeed and the `count` after them fail exactly as
 * if memory had run out (count < 0: every one until re-armed; 0: disarm).
 * The failure surfaces as documented for real ones: OUT_OF_MEMORY from the
 * call, or an ERROR event with status OUT_OF_MEMORY on the streams it hits.
 * *out_injected (may be NULL) receives how many failures were injected at
 * `site` since it was last armed. Process-wide: it affects every engine.
 * CPU backend only (the CUDA plugin allocates on its own).
 * Errors: INVALID_ARGUMENT (unknown site). Thread-safe. Since 1.2. */
EMBER_API ember_status ember_test_inject_alloc_failures(int32_t site, int64_t skip, int64_t count,
                                                        uint64_t* out_injected);

#ifdef __cplusplus
}
#endif

#endif /* EMBER_EMBER_H */
