/*
 * bindings/ember.i — the one SWIG interface behind the Python, Java, C# and Go
 * bindings. It exposes a whitelist: a few small C helpers (eb_*) over the C
 * ABI in include/ember/ember.h that turn its out-parameters and params
 * structs into plain arguments and return values, a handful of C ABI
 * functions as they are, and small value types (eb_tokens, eb_floats,
 * eb_event, eb_stats, eb_model_info, eb_sampling, eb_embed_inputs,
 * eb_lora_info, eb_lora_set). Nothing else in ember.h is wrapped.
 *
 * Errors: every helper records a failed ember_status together with a copy of
 * ember_last_error(), taken inside the same native call (so it is right even
 * when the caller's runtime moves between OS threads between calls); the one
 * %exception block below turns it into the language's exception (Python:
 * ember.EmberError and its subclasses; Java: ember.EmberException; C#:
 * Ember.EmberException). Go has no exceptions: its binding pins the goroutine
 * (runtime.LockOSThread) and reads eb_last_status()/eb_last_message() right
 * after the call.
 *
 * The idiomatic classes (Model, Engine, Session, Stream, Lora) are small
 * hand-written files per language over this module; the files SWIG generates
 * are never edited.
 *
 * swig -python -threads  : every call releases the GIL while in native code.
 * swig -java -package ember.lowlevel
 * swig -csharp -namespace Ember.LowLevel -dllimport ember_csharp
 * swig -go -cgo -intgosize 64
 */
%module(package="ember") emberc

%include <stdint.i>

%{
#include <stdlib.h>
#include <string.h>
#include "ember/ember.h"

struct eb_sampling;
static void eb_sampling_set_constraint(struct eb_sampling* s, int32_t kind, const char* text);
struct eb_embed_inputs;
static int eb_embed_inputs_grow(struct eb_embed_inputs* in, int32_t kind);

/* The last failure of a helper on this thread, copied in the same call. */
static _Thread_local int32_t eb_status_ = 0;
static _Thread_local char eb_message_[2048];

static int eb_check(ember_status status) {
  if (status == EMBER_OK) return 0;
  eb_status_ = status;
  const char* m = ember_last_error();
  if (!m || !*m) m = ember_status_string(status);
  strncpy(eb_message_, m, sizeof eb_message_ - 1);
  eb_message_[sizeof eb_message_ - 1] = '\0';
  return 1;
}

static void eb_fail(ember_status status, const char* message) {
  eb_status_ = status;
  strncpy(eb_message_, message, sizeof eb_message_ - 1);
  eb_message_[sizeof eb_message_ - 1] = '\0';
}
%}

/* ------------------------------------------------------------------ errors */

/* Per language: how a recorded failure becomes the language's exception. */
#if defined(SWIGPYTHON)
%{
static void eb_raise(int32_t status, const char* message) {
  PyObject* module = PyImport_ImportModule("ember.emberc");
  PyObject* make = module ? PyObject_GetAttrString(module, "_error_for_status") : NULL;
  PyObject* exc = make ? PyObject_CallFunction(make, "is", (int)status, message) : NULL;
  if (exc) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  } else if (!PyErr_Occurred()) {
    PyErr_SetString(PyExc_RuntimeError, message);
  }
  Py_XDECREF(make);
  Py_XDECREF(module);
}
%}
%define EB_RAISE_AND_RETURN
  eb_raise(eb_status_, eb_message_);
  SWIG_fail;
%enddef
#elif defined(SWIGJAVA)
%{
static void eb_raise(JNIEnv* jenv, int32_t status, const char* message) {
  jclass cls = (*jenv)->FindClass(jenv, "ember/EmberException");
  if (!cls) return; /* NoClassDefFoundError is pending */
  jmethodID ctor = (*jenv)->GetMethodID(jenv, cls, "<init>", "(I[B)V");
  jsize n = (jsize)strlen(message);
  jbyteArray bytes = (*jenv)->NewByteArray(jenv, n);
  if (!ctor || !bytes) return;
  (*jenv)->SetByteArrayRegion(jenv, bytes, 0, n, (const jbyte*)message);
  jobject exc = (*jenv)->NewObject(jenv, cls, ctor, (jint)status, bytes);
  if (exc) (*jenv)->Throw(jenv, (jthrowable)exc);
}
%}
%define EB_RAISE_AND_RETURN
  eb_raise(jenv, eb_status_, eb_message_);
  return $null;
%enddef
#elif defined(SWIGCSHARP)
%insert(runtime) %{
typedef void (SWIGSTDCALL* eb_csharp_raise_t)(int, const char*);
static eb_csharp_raise_t eb_csharp_raise = NULL;
SWIGEXPORT void SWIGSTDCALL eb_csharp_register_raise(eb_csharp_raise_t callback) { eb_csharp_raise = callback; }
%}
%{
static void eb_raise(int32_t status, const char* message) {
  if (eb_csharp_raise) eb_csharp_raise((int)status, message);
}
%}
%pragma(csharp) imclasscode=%{
  internal class EmberExceptionHelper {
    public delegate void RaiseDelegate(int status, global::System.IntPtr message);
    static RaiseDelegate raiseDelegate = new RaiseDelegate(Raise);
    [global::System.Runtime.InteropServices.DllImport("$dllimport", EntryPoint="eb_csharp_register_raise")]
    public static extern void Register(RaiseDelegate callback);
    static void Raise(int status, global::System.IntPtr message) {
      SWIGPendingException.Set(new global::Ember.EmberException(status, global::Ember.Utf8.FromNative(message)));
    }
    static EmberExceptionHelper() { Register(raiseDelegate); }
  }
  internal static EmberExceptionHelper emberExceptionHelper = new EmberExceptionHelper();
%}
%define EB_RAISE_AND_RETURN
  eb_raise(eb_status_, eb_message_);
  return $null;
%enddef
#else
/* Go: the caller reads eb_last_status()/eb_last_message() on the same thread. */
%define EB_RAISE_AND_RETURN
%enddef
#endif

%exception {
  eb_status_ = 0;
  $action
  if (eb_status_ != 0) {
    EB_RAISE_AND_RETURN
  }
}
/* The accessors of the recorded failure must not clear it. */
%exception eb_last_status "$action"
%exception eb_last_message "$action"

/* ---------------------------------------------- per-language string tails */

#if defined(SWIGJAVA)
/* Java strings cross as UTF-8 byte arrays: JNI's own string functions use
 * "modified UTF-8", which mangles characters outside the BMP (emoji) and NUL. */
%typemap(jni) const char*, char* "jbyteArray"
%typemap(jtype) const char*, char* "byte[]"
%typemap(jstype) const char*, char* "String"
%typemap(javain) const char*, char* "emberc.utf8Encode($javainput)"
%typemap(javaout) const char*, char* { return emberc.utf8Decode($jnicall); }
%typemap(in) const char*, char* {
  $1 = NULL;
  if ($input) {
    jsize n_ = (*jenv)->GetArrayLength(jenv, $input);
    $1 = ($1_ltype)malloc((size_t)n_ + 1);
    if (!$1) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); eb_raise(jenv, eb_status_, eb_message_); return $null; }
    (*jenv)->GetByteArrayRegion(jenv, $input, 0, n_, (jbyte*)$1);
    ((char*)$1)[n_] = '\0';
  }
}
%typemap(freearg) const char*, char* { free((void*)$1); }
%typemap(out) const char*, char* {
  $result = NULL;
  if ($1) {
    jsize n_ = (jsize)strlen($1);
    $result = (*jenv)->NewByteArray(jenv, n_);
    if ($result) (*jenv)->SetByteArrayRegion(jenv, $result, 0, n_, (const jbyte*)$1);
  }
}
%pragma(java) modulecode=%{
  static byte[] utf8Encode(String s) {
    if (s == null) return null;
    if (s.indexOf('\0') >= 0) throw new ember.EmberException(1, "text contains a NUL character");
    return s.getBytes(java.nio.charset.StandardCharsets.UTF_8);
  }
  static String utf8Decode(byte[] b) {
    return b == null ? null : new String(b, java.nio.charset.StandardCharsets.UTF_8);
  }
%}
#endif

/* C#: Mono marshals strings as UTF-8 on Unix, so the default string maps fit. */

#if defined(SWIGPYTHON)
%pythoncode %{
class EmberError(Exception):
    """A failed Ember call: .status is the ember_status, str(e) the library's message."""

    status = None
    status_name = "EMBER_ERR_UNKNOWN"

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message


class InvalidArgumentError(EmberError, ValueError):
    status, status_name = 1, "EMBER_ERR_INVALID_ARGUMENT"


class NotFoundError(EmberError, FileNotFoundError):
    status, status_name = 2, "EMBER_ERR_NOT_FOUND"

    def __str__(self):
        return self.message


class BadFormatError(EmberError):
    status, status_name = 3, "EMBER_ERR_BAD_FORMAT"


class UnsupportedError(EmberError):
    status, status_name = 4, "EMBER_ERR_UNSUPPORTED"


class OutOfMemoryError(EmberError, MemoryError):
    status, status_name = 5, "EMBER_ERR_OUT_OF_MEMORY"


class ContextFullError(EmberError):
    status, status_name = 6, "EMBER_ERR_CONTEXT_FULL"


class BusyError(EmberError):
    status, status_name = 7, "EMBER_ERR_BUSY"


class CancelledError(EmberError):
    status, status_name = 8, "EMBER_ERR_CANCELLED"


class TimeoutError(EmberError, TimeoutError):
    status, status_name = 9, "EMBER_ERR_TIMEOUT"


class InternalError(EmberError):
    status, status_name = 10, "EMBER_ERR_INTERNAL"


class EndOfStreamError(EmberError):
    status, status_name = 11, "EMBER_ERR_END_OF_STREAM"


_ERRORS = {c.status: c for c in (InvalidArgumentError, NotFoundError, BadFormatError, UnsupportedError,
                                 OutOfMemoryError, ContextFullError, BusyError, CancelledError, TimeoutError,
                                 InternalError, EndOfStreamError)}


def _error_for_status(status, message):
    return _ERRORS.get(status, EmberError)(message, status)
%}
#endif

/* ------------------------------------------------------------ the surface */

/* The C ABI's opaque handles. */
typedef struct ember_model ember_model;
typedef struct ember_engine ember_engine;
typedef struct ember_session ember_session;
typedef struct ember_stream ember_stream;
typedef struct ember_lora ember_lora;

%ignore eb_event::text_;
%ignore eb_event::tokens_;
%ignore eb_event::tool_call_id_;
%ignore eb_event::tool_name_;
%ignore eb_event::tool_arguments_;
%ignore eb_sampling::tool_name_;
%ignore eb_sampling::bias_;
%ignore eb_sampling::n_bias_;
%ignore eb_event::logprobs_;
%ignore eb_event::top_;
%ignore eb_event::n_top_;
%ignore eb_sampling::stop_;
%ignore eb_sampling::n_stop_;
%ignore eb_sampling::constraint_;
%ignore eb_sampling::constraint_kind_;
%ignore eb_sampling::choices_;
%ignore eb_sampling::n_choices_;
%ignore eb_tokens::data;
%ignore eb_floats::data;
%ignore eb_embed_inputs::texts_;
%ignore eb_embed_inputs::tokens_;
%ignore eb_embed_inputs::n_tokens_;
%ignore eb_embed_inputs::n_;
%ignore eb_embed_inputs::cap_;
%ignore eb_embed_inputs::kind_;
%ignore eb_lora_set::loras_;
%ignore eb_lora_set::scales_;
%ignore eb_lora_set::n_;
%ignore eb_lora_set::cap_;

%immutable eb_event::kind;
%immutable eb_event::end_reason;
%immutable eb_event::status;
%immutable eb_tokens::n;
%immutable eb_floats::n;
%immutable eb_model_info::architecture;
%immutable eb_model_info::name;
%immutable eb_lora_info::n_matrices;
%immutable eb_lora_info::max_rank;
%immutable eb_lora_info::alpha;
%immutable eb_lora_info::bytes;

%newobject eb_tokenize;
%newobject eb_detokenize;
%newobject eb_session_score;
%newobject eb_engine_embed;

%inline %{
/* Failure recorded by the last helper call on this thread (Go reads these). */
int32_t eb_last_status(void) { return eb_status_; }
const char* eb_last_message(void) { return eb_status_ ? eb_message_ : ""; }

/* A growable array of token ids. */
typedef struct eb_tokens {
  int32_t* data;
  int64_t n;
} eb_tokens;

/* A float array (scores). */
typedef struct eb_floats {
  float* data;
  int64_t n;
} eb_floats;

/* One stream event, owned by the language object that pulls events into it. */
typedef struct eb_event {
  int32_t kind;        /* EMBER_EVENT_* */
  int32_t end_reason;  /* EMBER_END_* (END) */
  int32_t status;      /* ERROR */
  char* text_;
  eb_tokens* tokens_;
  char* tool_call_id_;   /* TOOL_CALL */
  char* tool_name_;
  char* tool_arguments_; /* JSON */
  float* logprobs_;      /* with logprobs: one per token */
  ember_token_logprob* top_;
  int32_t n_top_;
} eb_event;

/* Stream statistics (ember_stream_stats_t with fixed-width fields). */
typedef struct eb_stats {
  int64_t prompt_tokens;
  int64_t generated_tokens;
  double time_to_first_token_ms;
  double tokens_per_second;
  double prefill_tokens_per_second;
  int32_t finished;
  int32_t end_reason;
  /* Speculative decoding (0 without it). */
  int64_t drafted_tokens;
  int64_t accepted_tokens;
  int64_t verify_passes;
  double mean_accepted_length;
} eb_stats;

/* Model metadata (ember_model_info_t); strings owned by the model. */
typedef struct eb_model_info {
  const char* architecture;
  const char* name;
  int64_t n_params;
  int32_t context_length;
  int32_t vocab_size;
  int32_t n_layers;
  int32_t n_embd;
  int32_t n_heads;
  int32_t n_kv_heads;
  int32_t bos_token;
  int32_t eos_token;
} eb_model_info;

/* Sampling, stopping and speculative decoding (ember_stream_params); stop
 * strings are copied. spec_draft_model is borrowed: the language layer keeps
 * its Model open across eb_stream_start (the stream then keeps the model
 * loaded itself until it ends). */
typedef struct eb_sampling {
  int32_t max_tokens;
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  float repeat_penalty;
  float presence_penalty;
  float frequency_penalty;
  int32_t penalty_last_n;
  int64_t seed;
  int32_t ignore_eos;
  int32_t spec_drafter; /* SPEC_* */
  int32_t spec_self_layers;
  const ember_model* spec_draft_model;
  float spec_threshold;
  int32_t spec_max_nodes;
  int32_t spec_max_depth;
  float spec_alpha;
  int32_t spec_lookup; /* SELF, DRAFT: 1 = prompt lookup beside the model (default), 0 = the model alone */
  int32_t json_object; /* 1: the reply is a JSON object (structured output) */
  char** stop_;
  int32_t n_stop_;
  /* Structured output (ember_stream_params.json_schema / grammar / regex /
   * choices): at most one, set with set_json_schema, set_grammar, set_regex
   * or add_choice (copied). */
  char* constraint_;
  int32_t constraint_kind_; /* 0 none, 1 json_schema, 2 grammar, 3 regex */
  char** choices_;
  int32_t n_choices_;
  /* Tool calling (ember_stream_params.tool_choice, since 1.4): TOOL_CHOICE_*;
   * FUNCTION names its tool with set_tool_name (copied). */
  int32_t tool_choice;
  int32_t parallel_tool_calls; /* 1 (default): several calls per reply */
  char* tool_name_;
  /* Logits (since 1.4): add_logit_bias (copied); logprobs 1 = each event's
   * tokens carry their log-probabilities, top_logprobs 0..20 alternatives. */
  int32_t logprobs;
  int32_t top_logprobs;
  ember_logit_bias* bias_;
  int32_t n_bias_;
} eb_sampling;

/* The inputs of one embedding call (ember_engine_embed or, for token lists,
 * ember_engine_embed_tokens), copied in order with add_text or add_tokens
 * (one kind per call). */
typedef struct eb_embed_inputs {
  char** texts_;       /* kind_ 1 */
  int32_t** tokens_;   /* kind_ 2 */
  size_t* n_tokens_;
  int64_t n_;
  int64_t cap_;
  int32_t kind_;       /* 0 empty, 1 texts, 2 token lists */
} eb_embed_inputs;

/* LoRA adapter metadata (ember_lora_info_t with fixed-width fields; since 1.6). */
typedef struct eb_lora_info {
  int32_t n_matrices; /* matrices adapted */
  int32_t max_rank;   /* largest rank of its pairs */
  float alpha;        /* adapter.lora.alpha (0: none) */
  int64_t bytes;      /* the adapter's tensors */
} eb_lora_info;

/* The adapters of one ember_session_set_loras call, in order, each with its
 * scale (add). The handles are borrowed: the language layer keeps its Lora
 * objects open across eb_session_set_loras (the session then keeps the
 * adapters alive itself). */
typedef struct eb_lora_set {
  const ember_lora** loras_;
  float* scales_;
  int64_t n_;
  int64_t cap_;
} eb_lora_set;
%}


%extend eb_tokens {
  eb_tokens(int64_t n) {
    eb_tokens* t = (eb_tokens*)calloc(1, sizeof *t);
    if (!t || n < 0) { free(t); eb_fail(n < 0 ? EMBER_ERR_INVALID_ARGUMENT : EMBER_ERR_OUT_OF_MEMORY, "tokens: bad size"); return NULL; }
    t->data = (int32_t*)calloc(n > 0 ? (size_t)n : 1, sizeof(int32_t));
    if (!t->data) { free(t); eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
    t->n = n;
    return t;
  }
  ~eb_tokens() { free($self->data); free($self); }
  int64_t size() { return $self->n; }
  int32_t get(int64_t i) {
    if (i < 0 || i >= $self->n) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "token index out of range"); return 0; }
    return $self->data[i];
  }
  void set(int64_t i, int32_t id) {
    if (i < 0 || i >= $self->n) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "token index out of range"); return; }
    $self->data[i] = id;
  }
}

%extend eb_floats {
  ~eb_floats() { free($self->data); free($self); }
  int64_t size() { return $self->n; }
  float get(int64_t i) {
    if (i < 0 || i >= $self->n) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "index out of range"); return 0; }
    return $self->data[i];
  }
}

%extend eb_event {
  eb_event() { return (eb_event*)calloc(1, sizeof(eb_event)); }
  ~eb_event() {
    free($self->text_);
    if ($self->tokens_) { free($self->tokens_->data); free($self->tokens_); }
    free($self->tool_call_id_);
    free($self->tool_name_);
    free($self->tool_arguments_);
    free($self->logprobs_);
    free($self->top_);
    free($self);
  }
  /* With logprobs (has_logprobs()): token i's log-probability and its k-th
   * alternative (k < n_top()); INVALID_ARGUMENT without them or out of range. */
  float logprob(int64_t i) {
    if (!$self->logprobs_ || !$self->tokens_ || i < 0 || i >= $self->tokens_->n) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "no log-probability at that index"); return 0; }
    return $self->logprobs_[i];
  }
  int32_t n_top() { return $self->n_top_; }
  int32_t top_token(int64_t i, int32_t k) {
    if (!$self->top_ || !$self->tokens_ || i < 0 || i >= $self->tokens_->n || k < 0 || k >= $self->n_top_) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "no alternative at that index"); return 0; }
    return $self->top_[i * $self->n_top_ + k].token;
  }
  float top_logprob(int64_t i, int32_t k) {
    if (!$self->top_ || !$self->tokens_ || i < 0 || i >= $self->tokens_->n || k < 0 || k >= $self->n_top_) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "no alternative at that index"); return 0; }
    return $self->top_[i * $self->n_top_ + k].logprob;
  }
  int32_t has_logprobs() { return $self->logprobs_ != NULL; }
  const char* text() { return $self->text_ ? $self->text_ : ""; }
  const char* tool_call_id() { return $self->tool_call_id_ ? $self->tool_call_id_ : ""; }
  const char* tool_name() { return $self->tool_name_ ? $self->tool_name_ : ""; }
  const char* tool_arguments() { return $self->tool_arguments_ ? $self->tool_arguments_ : ""; }
  int64_t n_tokens() { return $self->tokens_ ? $self->tokens_->n : 0; }
  int32_t token(int64_t i) {
    if (!$self->tokens_ || i < 0 || i >= $self->tokens_->n) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "token index out of range"); return 0; }
    return $self->tokens_->data[i];
  }
}

%extend eb_stats {
  eb_stats() { return (eb_stats*)calloc(1, sizeof(eb_stats)); }
  ~eb_stats() { free($self); }
}

%extend eb_model_info {
  eb_model_info() { return (eb_model_info*)calloc(1, sizeof(eb_model_info)); }
  ~eb_model_info() { free($self); }
}

%extend eb_lora_info {
  eb_lora_info() { return (eb_lora_info*)calloc(1, sizeof(eb_lora_info)); }
  ~eb_lora_info() { free($self); }
}

%extend eb_lora_set {
  eb_lora_set() {
    eb_lora_set* set = (eb_lora_set*)calloc(1, sizeof(eb_lora_set));
    if (!set) eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory");
    return set;
  }
  ~eb_lora_set() {
    free((void*)$self->loras_);
    free($self->scales_);
    free($self);
  }
  /* Appends an adapter (borrowed) with its scale (checked by ember_session_set_loras). */
  void add(const ember_lora* lora, float scale) {
    if (!lora) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "lora is NULL"); return; }
    if ($self->n_ == $self->cap_) {
      int64_t cap = $self->cap_ ? $self->cap_ * 2 : 4;
      const ember_lora** loras = (const ember_lora**)realloc((void*)$self->loras_, sizeof(ember_lora*) * (size_t)cap);
      if (loras) $self->loras_ = loras;
      float* scales = (float*)realloc($self->scales_, sizeof(float) * (size_t)cap);
      if (scales) $self->scales_ = scales;
      if (!loras || !scales) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return; }
      $self->cap_ = cap;
    }
    $self->loras_[$self->n_] = lora;
    $self->scales_[$self->n_] = scale;
    ++$self->n_;
  }
  int64_t size() { return $self->n_; }
}

%{
/* Room for one more input of `kind`; 0 on failure (recorded). */
static int eb_embed_inputs_grow(eb_embed_inputs* in, int32_t kind) {
  if (in->kind_ && in->kind_ != kind) {
    eb_fail(EMBER_ERR_INVALID_ARGUMENT, "embedding inputs are texts or token lists, not both");
    return 0;
  }
  if (in->n_ >= EMBER_MAX_EMBED_INPUTS) {
    eb_fail(EMBER_ERR_INVALID_ARGUMENT, "more than EMBER_MAX_EMBED_INPUTS (4096) embedding inputs");
    return 0;
  }
  if (in->n_ == in->cap_) {
    int64_t cap = in->cap_ ? in->cap_ * 2 : 8;
    char** texts = (char**)realloc(in->texts_, sizeof(char*) * (size_t)cap);
    if (texts) in->texts_ = texts;
    int32_t** tokens = (int32_t**)realloc(in->tokens_, sizeof(int32_t*) * (size_t)cap);
    if (tokens) in->tokens_ = tokens;
    size_t* lengths = (size_t*)realloc(in->n_tokens_, sizeof(size_t) * (size_t)cap);
    if (lengths) in->n_tokens_ = lengths;
    if (!texts || !tokens || !lengths) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return 0; }
    in->cap_ = cap;
  }
  in->kind_ = kind;
  return 1;
}
%}

%extend eb_embed_inputs {
  eb_embed_inputs() {
    eb_embed_inputs* in = (eb_embed_inputs*)calloc(1, sizeof(eb_embed_inputs));
    if (!in) eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory");
    return in;
  }
  ~eb_embed_inputs() {
    for (int64_t i = 0; i < $self->n_; ++i) {
      if ($self->kind_ == 1) free($self->texts_[i]);
      if ($self->kind_ == 2) free($self->tokens_[i]);
    }
    free($self->texts_);
    free($self->tokens_);
    free($self->n_tokens_);
    free($self);
  }
  /* Appends a UTF-8 text (copied). */
  void add_text(const char* text) {
    if (!text) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "text is NULL"); return; }
    if (!eb_embed_inputs_grow($self, 1)) return;
    char* copy = strdup(text);
    if (!copy) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return; }
    $self->texts_[$self->n_] = copy;
    ++$self->n_;
  }
  /* Appends a token list (copied). */
  void add_tokens(const eb_tokens* tokens) {
    if (!tokens) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "tokens is NULL"); return; }
    if (!eb_embed_inputs_grow($self, 2)) return;
    size_t n = tokens->n > 0 ? (size_t)tokens->n : 0;
    int32_t* copy = (int32_t*)malloc((n ? n : 1) * sizeof(int32_t));
    if (!copy) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return; }
    if (n) memcpy(copy, tokens->data, n * sizeof(int32_t));
    $self->tokens_[$self->n_] = copy;
    $self->n_tokens_[$self->n_] = n;
    ++$self->n_;
  }
  int64_t size() { return $self->n_; }
}

%{
static void eb_sampling_set_constraint(eb_sampling* s, int32_t kind, const char* text) {
  char* copy = strdup(text ? text : "");
  if (!copy) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return; }
  free(s->constraint_);
  s->constraint_ = copy;
  s->constraint_kind_ = kind;
}
%}

%extend eb_sampling {
  /* The library's defaults (ember_stream_params_init). */
  eb_sampling() {
    ember_stream_params p;
    ember_stream_params_init(&p);
    eb_sampling* s = (eb_sampling*)calloc(1, sizeof *s);
    if (!s) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
    s->max_tokens = p.max_tokens;
    s->temperature = p.temperature;
    s->top_k = p.top_k;
    s->top_p = p.top_p;
    s->min_p = p.min_p;
    s->repeat_penalty = p.repeat_penalty;
    s->presence_penalty = p.presence_penalty;
    s->frequency_penalty = p.frequency_penalty;
    s->penalty_last_n = p.penalty_last_n;
    s->seed = (int64_t)p.seed;
    s->ignore_eos = p.ignore_eos;
    s->spec_drafter = p.spec_drafter;
    s->spec_self_layers = p.spec_self_layers;
    s->spec_draft_model = p.spec_draft_model;
    s->spec_threshold = p.spec_threshold;
    s->spec_max_nodes = p.spec_max_nodes;
    s->spec_max_depth = p.spec_max_depth;
    s->spec_alpha = p.spec_alpha;
    s->spec_lookup = p.spec_lookup;
    s->tool_choice = p.tool_choice;
    s->parallel_tool_calls = p.parallel_tool_calls;
    return s;
  }
  ~eb_sampling() {
    for (int32_t i = 0; i < $self->n_stop_; ++i) free($self->stop_[i]);
    free($self->stop_);
    for (int32_t i = 0; i < $self->n_choices_; ++i) free($self->choices_[i]);
    free($self->choices_);
    free($self->constraint_);
    free($self->tool_name_);
    free($self->bias_);
    free($self);
  }
  void add_logit_bias(int32_t token, float bias) {
    ember_logit_bias* grown = (ember_logit_bias*)realloc($self->bias_, sizeof(ember_logit_bias) * (size_t)($self->n_bias_ + 1));
    if (!grown) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return; }
    $self->bias_ = grown;
    $self->bias_[$self->n_bias_].token = token;
    $self->bias_[$self->n_bias_].bias = bias;
    ++$self->n_bias_;
  }
  void set_tool_name(const char* name) {
    char* copy = strdup(name ? name : "");
    if (!copy) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return; }
    free($self->tool_name_);
    $self->tool_name_ = copy;
  }
  void set_json_schema(const char* schema) { eb_sampling_set_constraint($self, 1, schema); }
  void set_grammar(const char* grammar) { eb_sampling_set_constraint($self, 2, grammar); }
  void set_regex(const char* regex) { eb_sampling_set_constraint($self, 3, regex); }
  void add_choice(const char* choice) {
    char** grown = (char**)realloc($self->choices_, sizeof(char*) * (size_t)($self->n_choices_ + 2));
    if (!grown) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return; }
    $self->choices_ = grown;
    $self->choices_[$self->n_choices_] = strdup(choice ? choice : "");
    $self->choices_[++$self->n_choices_] = NULL;
  }
  void add_stop(const char* stop) {
    char** grown = (char**)realloc($self->stop_, sizeof(char*) * (size_t)($self->n_stop_ + 2));
    if (!grown) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return; }
    $self->stop_ = grown;
    $self->stop_[$self->n_stop_] = strdup(stop ? stop : "");
    $self->stop_[++$self->n_stop_] = NULL;
  }
}

%inline %{
/* ---- library */
int32_t eb_cpu_isa(void) {
  ember_capabilities_t c;
  c.size = sizeof c;
  return eb_check(ember_capabilities(&c)) ? -1 : c.cpu_isa;
}
const char* eb_cpu_isa_name(void) {
  ember_capabilities_t c;
  c.size = sizeof c;
  return eb_check(ember_capabilities(&c)) ? "" : c.cpu_isa_name;
}
int32_t eb_cuda_plugin(void) {
  ember_capabilities_t c;
  c.size = sizeof c;
  return eb_check(ember_capabilities(&c)) ? -1 : c.cuda_plugin;
}
const char* eb_cuda_plugin_message(void) {
  ember_capabilities_t c;
  c.size = sizeof c;
  return eb_check(ember_capabilities(&c)) ? "" : c.cuda_plugin_message;
}

/* ---- model */
ember_model* eb_model_load(const char* path) {
  ember_model* m = NULL;
  eb_check(ember_model_load(path, NULL, &m));
  return m;
}
void eb_model_info_get(const ember_model* model, eb_model_info* out) {
  ember_model_info_t i;
  memset(&i, 0, sizeof i);
  i.size = sizeof i;
  if (!out) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "info is NULL"); return; }
  if (eb_check(ember_model_info(model, &i))) return;
  out->architecture = i.architecture;
  out->name = i.name;
  out->n_params = (int64_t)i.n_params;
  out->context_length = i.context_length;
  out->vocab_size = i.vocab_size;
  out->n_layers = i.n_layers;
  out->n_embd = i.n_embd;
  out->n_heads = i.n_heads;
  out->n_kv_heads = i.n_kv_heads;
  out->bos_token = i.bos_token;
  out->eos_token = i.eos_token;
}
eb_tokens* eb_tokenize(const ember_model* model, const char* text, int32_t add_special, int32_t parse_special) {
  size_t n = 0;
  ember_status st = ember_tokenize(model, text, add_special, parse_special, NULL, 0, &n);
  if (st != EMBER_OK && n == 0) { eb_check(st); return NULL; }
  eb_tokens* t = (eb_tokens*)calloc(1, sizeof *t);
  if (!t) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
  t->data = (int32_t*)calloc(n ? n : 1, sizeof(int32_t));
  if (!t->data) { free(t); eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
  if (n && eb_check(ember_tokenize(model, text, add_special, parse_special, t->data, n, &n))) {
    free(t->data);
    free(t);
    return NULL;
  }
  t->n = (int64_t)n;
  return t;
}
char* eb_detokenize(const ember_model* model, const eb_tokens* tokens) {
  size_t len = 0;
  char probe[1];
  if (!tokens) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "tokens is NULL"); return NULL; }
  /* A 1-byte buffer: OK for "" (also from ids that render nothing); a failure
   * with len > 0 only asks for a bigger buffer, with len == 0 it is real. */
  ember_status st = ember_detokenize(model, tokens->data, (size_t)tokens->n, probe, sizeof probe, &len);
  if (st != EMBER_OK && len == 0) { eb_check(st); return NULL; }
  char* text = (char*)malloc(len + 1);
  if (!text) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
  if (eb_check(ember_detokenize(model, tokens->data, (size_t)tokens->n, text, len + 1, &len))) {
    free(text);
    return NULL;
  }
  return text;
}

/* ---- engine */
/* kv_dtype: EMBER_KV_F16 or EMBER_KV_Q8_0 (the library refuses other values:
 * INVALID_ARGUMENT; Q8_0 off the CPU or with head_dim % 32 != 0: UNSUPPORTED). */
ember_engine* eb_engine_create(ember_model* model, int32_t device, int32_t n_threads, int32_t manual_step,
                               int64_t kv_memory_bytes, int32_t kv_dtype) {
  ember_engine_params p;
  ember_engine* e = NULL;
  ember_engine_params_init(&p);
  p.device = device;
  p.n_threads = n_threads;
  p.manual_step = manual_step;
  if (kv_memory_bytes < 0) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "kv_memory_bytes must be >= 0"); return NULL; }
  p.kv_memory_bytes = (uint64_t)kv_memory_bytes;
  p.kv_dtype = kv_dtype;
  eb_check(ember_engine_create(model, &p, &e));
  return e;
}
int32_t eb_engine_device(const ember_engine* engine) {
  ember_engine_info_t i;
  i.size = sizeof i;
  return eb_check(ember_engine_info(engine, &i)) ? -1 : i.device;
}
int32_t eb_engine_gpu_index(const ember_engine* engine) {
  ember_engine_info_t i;
  i.size = sizeof i;
  return eb_check(ember_engine_info(engine, &i)) ? -1 : i.gpu_index;
}
const char* eb_engine_backend_name(const ember_engine* engine) {
  ember_engine_info_t i;
  i.size = sizeof i;
  return eb_check(ember_engine_info(engine, &i)) ? "" : i.backend_name;
}
int64_t eb_engine_step(ember_engine* engine, int32_t max_ms, int32_t max_tokens) {
  size_t n = 0;
  eb_check(ember_engine_step(engine, max_ms, max_tokens, &n));
  return (int64_t)n;
}
/* Embeds the inputs (texts: ember_engine_embed, token lists:
 * ember_engine_embed_tokens): size() * n_embd floats, vector i at i * n_embd
 * (n_embd: the engine's model's, eb_model_info.n_embd). No inputs are the
 * library's INVALID_ARGUMENT. */
eb_floats* eb_engine_embed(ember_engine* engine, const eb_embed_inputs* inputs, int32_t n_embd, int32_t pooling,
                           int32_t normalize, int32_t parse_special) {
  ember_embed_params p;
  ember_embed_params_init(&p);
  p.pooling = pooling;
  p.normalize = normalize;
  p.parse_special = parse_special;
  if (!inputs) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "inputs is NULL"); return NULL; }
  if (n_embd <= 0) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "n_embd must be > 0"); return NULL; }
  size_t n = (size_t)inputs->n_;
  size_t total = n * (size_t)n_embd;
  eb_floats* f = (eb_floats*)calloc(1, sizeof *f);
  if (!f) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
  f->data = (float*)malloc((total ? total : 1) * sizeof(float));
  if (!f->data) { free(f); eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
  ember_status st;
  if (inputs->kind_ == 2) {
    st = ember_engine_embed_tokens(engine, (const int32_t* const*)inputs->tokens_, inputs->n_tokens_, n, &p, f->data,
                                   total);
  } else {
    /* texts (or none: the library's "no texts") */
    const char* none = NULL;
    st = ember_engine_embed(engine, n ? (const char* const*)inputs->texts_ : &none, n, &p, f->data, total);
  }
  if (eb_check(st)) {
    free(f->data);
    free(f);
    return NULL;
  }
  f->n = (int64_t)total;
  return f;
}

/* ---- session */
/* system_prompt: NULL or "" = none. n_ctx 0 = the model's context. */
ember_session* eb_session_create(ember_engine* engine, const char* system_prompt, int32_t cache_policy,
                                 int32_t sink_tokens, int32_t window_tokens, int32_t n_ctx) {
  ember_session_params p;
  ember_session* s = NULL;
  ember_session_params_init(&p);
  p.system_prompt = system_prompt && *system_prompt ? system_prompt : NULL;
  p.cache_policy = cache_policy;
  p.sink_tokens = sink_tokens;
  p.window_tokens = window_tokens;
  p.n_ctx = n_ctx;
  eb_check(ember_session_create(engine, &p, &s));
  return s;
}
ember_session* eb_session_load(ember_engine* engine, const char* path) {
  ember_session* s = NULL;
  eb_check(ember_session_load(engine, path, NULL, &s));
  return s;
}
void eb_session_save(ember_session* session, const char* path) { eb_check(ember_session_save(session, path)); }
void eb_session_add_message(ember_session* session, const char* role, const char* content) {
  eb_check(ember_session_add_message(session, role, content));
}
/* tools_json: an OpenAI tool list (JSON text); NULL or "" = none. */
void eb_session_set_tools(ember_session* session, const char* tools_json) {
  eb_check(ember_session_set_tools(session, tools_json && *tools_json ? tools_json : NULL));
}
/* ---- LoRA (since 1.6) */
ember_lora* eb_lora_load(const ember_model* model, const char* path) {
  ember_lora* l = NULL;
  eb_check(ember_lora_load(model, path, &l));
  return l;
}
void eb_lora_info_get(const ember_lora* lora, eb_lora_info* out) {
  ember_lora_info_t i;
  memset(&i, 0, sizeof i);
  i.size = sizeof i;
  if (!out) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "info is NULL"); return; }
  if (eb_check(ember_lora_info(lora, &i))) return;
  out->n_matrices = i.n_matrices;
  out->max_rank = i.max_rank;
  out->alpha = i.alpha;
  out->bytes = (int64_t)i.bytes;
}
/* The adapters the session's next turns decode with; NULL or empty = none. */
void eb_session_set_loras(ember_session* session, const eb_lora_set* loras) {
  size_t n = loras ? (size_t)loras->n_ : 0;
  eb_check(ember_session_set_loras(session, n ? (const ember_lora* const*)loras->loras_ : NULL,
                                   n ? loras->scales_ : NULL, n));
}
void eb_session_add_text(ember_session* session, const char* text, int32_t parse_special) {
  eb_check(ember_session_add_text(session, text, parse_special));
}
void eb_session_add_tokens(ember_session* session, const eb_tokens* tokens) {
  if (!tokens) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "tokens is NULL"); return; }
  eb_check(ember_session_add_tokens(session, tokens->data, (size_t)tokens->n));
}
void eb_session_reset(ember_session* session) { eb_check(ember_session_reset(session)); }
int64_t eb_session_token_count(const ember_session* session) {
  size_t n = 0;
  eb_check(ember_session_token_count(session, &n));
  return (int64_t)n;
}
eb_floats* eb_session_score(ember_session* session, const eb_tokens* tokens) {
  if (!tokens) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "tokens is NULL"); return NULL; }
  eb_floats* f = (eb_floats*)calloc(1, sizeof *f);
  if (!f) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
  f->data = (float*)calloc(tokens->n > 0 ? (size_t)tokens->n : 1, sizeof(float));
  if (!f->data) { free(f); eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return NULL; }
  if (eb_check(ember_session_score(session, tokens->data, (size_t)tokens->n, f->data))) {
    free(f->data);
    free(f);
    return NULL;
  }
  f->n = tokens->n;
  return f;
}

/* ---- stream */
ember_stream* eb_stream_start(ember_session* session, const eb_sampling* s) {
  ember_stream_params p;
  ember_stream* st = NULL;
  ember_stream_params_init(&p);
  if (s) {
    p.max_tokens = s->max_tokens;
    p.temperature = s->temperature;
    p.top_k = s->top_k;
    p.top_p = s->top_p;
    p.min_p = s->min_p;
    p.repeat_penalty = s->repeat_penalty;
    p.presence_penalty = s->presence_penalty;
    p.frequency_penalty = s->frequency_penalty;
    p.penalty_last_n = s->penalty_last_n;
    p.seed = (uint64_t)s->seed;
    p.ignore_eos = s->ignore_eos;
    p.spec_drafter = s->spec_drafter;
    p.spec_self_layers = s->spec_self_layers;
    p.spec_draft_model = s->spec_draft_model;
    p.spec_threshold = s->spec_threshold;
    p.spec_max_nodes = s->spec_max_nodes;
    p.spec_max_depth = s->spec_max_depth;
    p.spec_alpha = s->spec_alpha;
    p.json_object = s->json_object;
    if (s->constraint_kind_ == 1) p.json_schema = s->constraint_;
    if (s->constraint_kind_ == 2) p.grammar = s->constraint_;
    if (s->constraint_kind_ == 3) p.regex = s->constraint_;
    if (s->n_choices_ > 0) p.choices = (const char* const*)s->choices_;
    p.spec_lookup = s->spec_lookup;
    p.stop = s->n_stop_ ? (const char* const*)s->stop_ : NULL;
    p.tool_choice = s->tool_choice;
    p.parallel_tool_calls = s->parallel_tool_calls;
    p.tool_name = s->tool_name_;
    p.logit_bias = s->bias_;
    p.n_logit_bias = (size_t)s->n_bias_;
    p.logprobs = s->logprobs;
    p.top_logprobs = s->top_logprobs;
  }
  eb_check(ember_stream_start(session, &p, &st));
  return st;
}
/* Pulls the next event into *out: 1 = an event (TEXT, TOOL_CALL or END), 0 = none within
 * timeout_ms, -1 = the stream had already ended. An ERROR event is filled in
 * and raised (its status and message). */
int32_t eb_stream_next(ember_stream* stream, eb_event* out, int32_t timeout_ms) {
  ember_event e;
  ember_status st;
  if (!out) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "event is NULL"); return -1; }
  memset(&e, 0, sizeof e);
  e.size = sizeof e;
  st = ember_stream_next(stream, &e, timeout_ms);
  if (st == EMBER_ERR_TIMEOUT) return 0;
  if (st == EMBER_ERR_END_OF_STREAM) return -1;
  if (eb_check(st)) return -1;
  free(out->text_);
  out->text_ = NULL;
  if (out->tokens_) { free(out->tokens_->data); free(out->tokens_); out->tokens_ = NULL; }
  free(out->tool_call_id_);
  free(out->tool_name_);
  free(out->tool_arguments_);
  out->tool_call_id_ = out->tool_name_ = out->tool_arguments_ = NULL;
  free(out->logprobs_);
  free(out->top_);
  out->logprobs_ = NULL;
  out->top_ = NULL;
  out->n_top_ = 0;
  if (e.logprobs) {
    size_t n_top = e.top_logprobs && e.n_top_logprobs > 0 ? (size_t)e.n_top_logprobs : 0;
    out->logprobs_ = (float*)malloc((e.n_tokens ? e.n_tokens : 1) * sizeof(float));
    out->top_ = n_top ? (ember_token_logprob*)malloc((e.n_tokens ? e.n_tokens : 1) * n_top * sizeof(ember_token_logprob)) : NULL;
    if (!out->logprobs_ || (n_top && !out->top_)) { eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory"); return -1; }
    if (e.n_tokens) memcpy(out->logprobs_, e.logprobs, e.n_tokens * sizeof(float));
    if (n_top && e.n_tokens) memcpy(out->top_, e.top_logprobs, e.n_tokens * n_top * sizeof(ember_token_logprob));
    out->n_top_ = (int32_t)n_top;
  }
  if (e.type == EMBER_EVENT_TOOL_CALL) {
    out->tool_call_id_ = strdup(e.tool_call_id ? e.tool_call_id : "");
    out->tool_name_ = strdup(e.tool_name ? e.tool_name : "");
    out->tool_arguments_ = strdup(e.tool_arguments ? e.tool_arguments : "");
    if (!out->tool_call_id_ || !out->tool_name_ || !out->tool_arguments_) {
      eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory");
      return -1;
    }
  }
  out->kind = e.type;
  out->end_reason = e.end_reason;
  out->status = e.status;
  out->text_ = (char*)malloc(e.text_length + 1);
  out->tokens_ = (eb_tokens*)calloc(1, sizeof(eb_tokens));
  if (!out->text_ || !out->tokens_ || !(out->tokens_->data = (int32_t*)calloc(e.n_tokens ? e.n_tokens : 1, sizeof(int32_t)))) {
    eb_fail(EMBER_ERR_OUT_OF_MEMORY, "out of memory");
    return -1;
  }
  if (e.text_length) memcpy(out->text_, e.text, e.text_length);
  out->text_[e.text_length] = '\0';
  if (e.n_tokens) memcpy(out->tokens_->data, e.tokens, e.n_tokens * sizeof(int32_t));
  out->tokens_->n = (int64_t)e.n_tokens;
  if (e.type == EMBER_EVENT_ERROR) eb_check(e.status);
  return 1;
}
void eb_stream_cancel(ember_stream* stream) { eb_check(ember_stream_cancel(stream)); }
void eb_stream_wait(ember_stream* stream) { eb_check(ember_stream_wait(stream)); }
void eb_stream_stats_get(const ember_stream* stream, eb_stats* out) {
  ember_stream_stats_t s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  if (!out) { eb_fail(EMBER_ERR_INVALID_ARGUMENT, "stats is NULL"); return; }
  if (eb_check(ember_stream_stats(stream, &s))) return;
  out->prompt_tokens = (int64_t)s.prompt_tokens;
  out->generated_tokens = (int64_t)s.generated_tokens;
  out->time_to_first_token_ms = s.time_to_first_token_ms;
  out->tokens_per_second = s.tokens_per_second;
  out->prefill_tokens_per_second = s.prefill_tokens_per_second;
  out->finished = s.finished;
  out->end_reason = s.end_reason;
  out->drafted_tokens = (int64_t)s.drafted_tokens;
  out->accepted_tokens = (int64_t)s.accepted_tokens;
  out->verify_passes = (int64_t)s.verify_passes;
  out->mean_accepted_length = s.mean_accepted_length;
}
%}

/* C ABI functions wrapped as they are. */
const char* ember_version(void);
int32_t ember_version_number(void);
const char* ember_status_string(int32_t status);
void ember_model_destroy(ember_model* model);
void ember_engine_destroy(ember_engine* engine);
void ember_session_destroy(ember_session* session);
void ember_stream_destroy(ember_stream* stream);
void ember_stream_release(ember_stream* stream);
void ember_lora_destroy(ember_lora* lora);

/* Constants the language layers use (values fixed by ember.h). */
%constant int32_t DEVICE_CPU = EMBER_DEVICE_CPU;
%constant int32_t DEVICE_CUDA = EMBER_DEVICE_CUDA;
%constant int32_t DEVICE_AUTO = EMBER_DEVICE_AUTO;
%constant int32_t KV_F16 = EMBER_KV_F16;
%constant int32_t KV_Q8_0 = EMBER_KV_Q8_0;
%constant int32_t CACHE_FULL = EMBER_CACHE_FULL;
%constant int32_t CACHE_WINDOW = EMBER_CACHE_WINDOW;
%constant int32_t CACHE_SINK = EMBER_CACHE_SINK;
%constant int32_t SPEC_NONE = EMBER_SPEC_NONE;
%constant int32_t SPEC_NGRAM = EMBER_SPEC_NGRAM;
%constant int32_t SPEC_SELF = EMBER_SPEC_SELF;
%constant int32_t SPEC_DRAFT = EMBER_SPEC_DRAFT;
%constant int32_t EVENT_TEXT = EMBER_EVENT_TEXT;
%constant int32_t EVENT_END = EMBER_EVENT_END;
%constant int32_t EVENT_ERROR = EMBER_EVENT_ERROR;
%constant int32_t EVENT_TOOL_CALL = EMBER_EVENT_TOOL_CALL;
%constant int32_t POOLING_MEAN = EMBER_POOLING_MEAN;
%constant int32_t POOLING_LAST = EMBER_POOLING_LAST;
%constant int32_t POOLING_CLS = EMBER_POOLING_CLS;
%constant int32_t MAX_EMBED_INPUTS = EMBER_MAX_EMBED_INPUTS;
%constant int32_t TOOL_CHOICE_AUTO = EMBER_TOOL_CHOICE_AUTO;
%constant int32_t TOOL_CHOICE_NONE = EMBER_TOOL_CHOICE_NONE;
%constant int32_t TOOL_CHOICE_REQUIRED = EMBER_TOOL_CHOICE_REQUIRED;
%constant int32_t TOOL_CHOICE_FUNCTION = EMBER_TOOL_CHOICE_FUNCTION;
%constant int32_t END_NONE = EMBER_END_NONE;
%constant int32_t END_EOS = EMBER_END_EOS;
%constant int32_t END_STOP_STRING = EMBER_END_STOP_STRING;
%constant int32_t END_MAX_TOKENS = EMBER_END_MAX_TOKENS;
%constant int32_t END_CANCELLED = EMBER_END_CANCELLED;
%constant int32_t END_CONTEXT_FULL = EMBER_END_CONTEXT_FULL;
%constant int32_t ERR_INVALID_ARGUMENT = EMBER_ERR_INVALID_ARGUMENT;
%constant int32_t ERR_NOT_FOUND = EMBER_ERR_NOT_FOUND;
%constant int32_t ERR_BAD_FORMAT = EMBER_ERR_BAD_FORMAT;
%constant int32_t ERR_BUSY = EMBER_ERR_BUSY;
