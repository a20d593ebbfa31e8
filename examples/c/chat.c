/*
 * chat.c — a C99 client of libember that loads the library at run time.
 *
 *   chat [-l LIBRARY] [-m MODEL] [-n MAX_TOKENS] [-p PROMPT]
 *
 * It dlopen()s libember.so, resolves every public symbol with dlsym (so a
 * library missing one is refused up front), loads the model, creates an
 * engine and a session, adds one user message and streams the reply to
 * stdout with ember_stream_next. Diagnostics go to stderr.
 *
 * LIBRARY defaults to EMBER_DEFAULT_LIBRARY (the build tree's libember.so
 * when built with CMake) or "libember.so.1"; MODEL defaults to
 * $EMBER_HOME/SmolLM2-135M-Instruct.Q4_1.gguf ($EMBER_HOME: ~/.cache/ember).
 * Exit status: 0 on success, 1 on any failure, 2 on bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/ember.h"

#ifndef EMBER_DEFAULT_LIBRARY
#define EMBER_DEFAULT_LIBRARY "libember.so.1"
#endif

#define DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

/* The whole public ABI: a library missing any of these is not the libember
 * v1 this program was built for. CMake generates ember_symbols.inc from
 * capi/ember.symbols: one line "name", per symbol. */
static const char* const k_public_symbols[] = {
#include "ember_symbols.inc"
};

/* The functions this program calls, typed. */
typedef struct api {
  const char* (*version)(void);
  const char* (*last_error)(void);
  const char* (*status_string)(ember_status);
  void (*model_params_init)(ember_model_params*);
  ember_status (*model_load)(const char*, const ember_model_params*, ember_model**);
  void (*model_destroy)(ember_model*);
  void (*engine_params_init)(ember_engine_params*);
  ember_status (*engine_create)(ember_model*, const ember_engine_params*, ember_engine**);
  void (*engine_destroy)(ember_engine*);
  void (*session_params_init)(ember_session_params*);
  ember_status (*session_create)(ember_engine*, const ember_session_params*, ember_session**);
  void (*session_destroy)(ember_session*);
  ember_status (*session_add_message)(ember_session*, const char*, const char*);
  void (*stream_params_init)(ember_stream_params*);
  ember_status (*stream_start)(ember_session*, const ember_stream_params*, ember_stream**);
  ember_status (*stream_next)(ember_stream*, ember_event*, int32_t);
  ember_status (*stream_stats)(const ember_stream*, ember_stream_stats_t*);
  void (*stream_destroy)(ember_stream*);
} api;

/* ISO C has no conversion from void* to a function pointer; copying the
 * bytes is the portable way to use what dlsym returns. */
static int resolve(void* lib, const char* name, void* fn_ptr, size_t fn_size) {
  void* sym;
  dlerror();
  sym = dlsym(lib, name);
  if (sym == NULL) {
    const char* why = dlerror();
    fprintf(stderr, "chat: the library does not export %s%s%s\n", name, why ? ": " : "", why ? why : "");
    return 0;
  }
  memcpy(fn_ptr, &sym, fn_size);
  return 1;
}

#define RESOLVE(lib, field, name) resolve((lib), (name), &a->field, sizeof a->field)

static int load_api(void* lib, api* a) {
  size_t i;
  int ok = 1;
  for (i = 0; i < sizeof k_public_symbols / sizeof k_public_symbols[0]; ++i) {
    void* unused;
    ok &= resolve(lib, k_public_symbols[i], &unused, sizeof unused);
  }
  ok &= RESOLVE(lib, version, "ember_version");
  ok &= RESOLVE(lib, last_error, "ember_last_error");
  ok &= RESOLVE(lib, status_string, "ember_status_string");
  ok &= RESOLVE(lib, model_params_init, "ember_model_params_init");
  ok &= RESOLVE(lib, model_load, "ember_model_load");
  ok &= RESOLVE(lib, model_destroy, "ember_model_destroy");
  ok &= RESOLVE(lib, engine_params_init, "ember_engine_params_init");
  ok &= RESOLVE(lib, engine_create, "ember_engine_create");
  ok &= RESOLVE(lib, engine_destroy, "ember_engine_destroy");
  ok &= RESOLVE(lib, session_params_init, "ember_session_params_init");
  ok &= RESOLVE(lib, session_create, "ember_session_create");
  ok &= RESOLVE(lib, session_destroy, "ember_session_destroy");
  ok &= RESOLVE(lib, session_add_message, "ember_session_add_message");
  ok &= RESOLVE(lib, stream_params_init, "ember_stream_params_init");
  ok &= RESOLVE(lib, stream_start, "ember_stream_start");
  ok &= RESOLVE(lib, stream_next, "ember_stream_next");
  ok &= RESOLVE(lib, stream_stats, "ember_stream_stats");
  ok &= RESOLVE(lib, stream_destroy, "ember_stream_destroy");
  return ok;
}

/* Reports a failed call; returns 0 so callers can `return fail(...)`. */
static int fail(const api* a, const char* what, ember_status status) {
  fprintf(stderr, "chat: %s: %s (%s)\n", what, a->last_error(), a->status_string(status));
  return 0;
}

static char* default_model_path(void) {
  const char* home = getenv("EMBER_HOME");
  const char* suffix = "";
  char* path;
  size_t size;
  if (home == NULL || *home == '\0') {
    home = getenv("HOME");
    suffix = "/.cache/ember";
    if (home == NULL || *home == '\0') {
      home = ".";
    }
  }
  size = strlen(home) + strlen(suffix) + 1 + strlen(DEFAULT_MODEL_FILE) + 1;
  path = (char*)malloc(size);
  if (path != NULL) {
    snprintf(path, size, "%s%s/%s", home, suffix, DEFAULT_MODEL_FILE);
  }
  return path;
}

/* Streams the reply to stdout. Returns 1 on success. */
static int stream_reply(const api* a, ember_session* session, int32_t max_tokens) {
  ember_stream_params params;
  ember_stream* stream = NULL;
  ember_stream_stats_t stats;
  ember_status st;
  int ok = 1;

  a->stream_params_init(&params);
  params.max_tokens = max_tokens;
  st = a->stream_start(session, &params, &stream);
  if (st != EMBER_OK) return fail(a, "starting the reply", st);

  for (;;) {
    ember_event event;
    memset(&event, 0, sizeof event);
    event.size = sizeof event; /* the library writes only what this covers */
    st = a->stream_next(stream, &event, -1);
    if (st != EMBER_OK) {
      ok = fail(a, "reading the reply", st);
      break;
    }
    if (event.type == EMBER_EVENT_TEXT) {
      fwrite(event.text, 1, event.text_length, stdout);
      fflush(stdout);
    } else if (event.type == EMBER_EVENT_ERROR) {
      ok = fail(a, "generating", event.status);
      break;
    } else {
      break; /* EMBER_EVENT_END */
    }
  }
  fputc('\n', stdout);

  memset(&stats, 0, sizeof stats);
  stats.size = sizeof stats;
  if (ok && a->stream_stats(stream, &stats) == EMBER_OK) {
    fprintf(stderr, "chat: %lu prompt tokens, %lu generated, %.1f tokens/s\n", (unsigned long)stats.prompt_tokens,
            (unsigned long)stats.generated_tokens, stats.tokens_per_second);
  }
  a->stream_destroy(stream);
  return ok;
}

static int run(const api* a, const char* model_path, const char* prompt, int32_t max_tokens) {
  ember_model* model = NULL;
  ember_engine* engine = NULL;
  ember_session* session = NULL;
  ember_engine_params engine_params;
  ember_status st;
  int ok = 0;

  st = a->model_load(model_path, NULL, &model);
  if (st != EMBER_OK) return fail(a, "loading the model", st);

  a->engine_params_init(&engine_params);
  engine_params.kv_memory_bytes = (uint64_t)64 << 20; /* plenty for one short chat */
  st = a->engine_create(model, &engine_params, &engine);
  /* The engine holds its own reference: the model handle can go now. */
  a->model_destroy(model);
  if (st != EMBER_OK) return fail(a, "creating the engine", st);

  st = a->session_create(engine, NULL, &session);
  if (st != EMBER_OK) {
    fail(a, "creating the session", st);
  } else if ((st = a->session_add_message(session, "user", prompt)) != EMBER_OK) {
    fail(a, "adding the message", st);
  } else {
    ok = stream_reply(a, session, max_tokens);
  }
  a->session_destroy(session); /* NULL is a no-op */
  a->engine_destroy(engine);
  return ok;
}

static void usage(void) {
  fprintf(stderr, "usage: chat [-l LIBRARY] [-m MODEL] [-n MAX_TOKENS] [-p PROMPT]\n");
}

int main(int argc, char** argv) {
  const char* library = EMBER_DEFAULT_LIBRARY;
  const char* model_arg = NULL;
  const char* prompt = "Write one short sentence about the sea.";
  long max_tokens = 64;
  char* model_path;
  void* lib;
  api a;
  int i, ok;

  for (i = 1; i < argc; ++i) {
    const char* opt = argv[i];
    if (i + 1 >= argc || strlen(opt) != 2 || opt[0] != '-') {
      usage();
      return 2;
    }
    switch (opt[1]) {
      case 'l': library = argv[++i]; break;
      case 'm': model_arg = argv[++i]; break;
      case 'p': prompt = argv[++i]; break;
      case 'n': {
        char* end = NULL;
        max_tokens = strtol(argv[++i], &end, 10);
        if (end == NULL || *end != '\0' || max_tokens < 1 || max_tokens > 1000000) {
          fprintf(stderr, "chat: -n needs an integer in [1, 1000000]\n");
          return 2;
        }
        break;
      }
      default: usage(); return 2;
    }
  }

  lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "chat: cannot load %s: %s\n", library, dlerror());
    return 1;
  }
  memset(&a, 0, sizeof a);
  if (!load_api(lib, &a)) {
    fprintf(stderr, "chat: %s is not a usable libember (v%d)\n", library, EMBER_VERSION_MAJOR);
    dlclose(lib);
    return 1;
  }
  fprintf(stderr, "chat: libember %s (header %d.%d.%d)\n", a.version(), EMBER_VERSION_MAJOR, EMBER_VERSION_MINOR,
          EMBER_VERSION_PATCH);

  model_path = model_arg ? NULL : default_model_path();
  if (!model_arg && !model_path) {
    fprintf(stderr, "chat: out of memory\n");
    dlclose(lib);
    return 1;
  }
  ok = run(&a, model_arg ? model_arg : model_path, prompt, (int32_t)max_tokens);
  free(model_path);
  dlclose(lib);
  return ok ? 0 : 1;
}
