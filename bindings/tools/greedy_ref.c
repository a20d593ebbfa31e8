/* greedy_ref: the C API's greedy reply to one user message, as token ids on
 * one line. The binding tests compare their own greedy tokens with this
 * program's, so "token-identical to the C API" is checked against a program
 * that uses only ember.h.
 *
 *   greedy_ref MODEL MAX_TOKENS MESSAGE [SYSTEM_PROMPT]
 *
 * With EMBER_REF_TIMING set it also prints, on stderr, "decode_s T tokens N":
 * the wall time from the first text event to the END event as this C
 * consumer sees it (bindings/tools/bench_bindings.py compares the bindings'
 * per-token cost with it). With EMBER_REF_DRAIN set it first waits for the
 * stream to end (ember_stream_wait) and prints "drain_s T tokens N": the time
 * to read the queued events, the C API's own cost per event.
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember/ember.h"

static int check(ember_status st, const char* what) {
  if (st == EMBER_OK) return 0;
  fprintf(stderr, "greedy_ref: %s: %s: %s\n", what, ember_status_string(st), ember_last_error());
  exit(1);
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: greedy_ref MODEL MAX_TOKENS MESSAGE [SYSTEM_PROMPT]\n");
    return 2;
  }
  ember_model* model = NULL;
  check(ember_model_load(argv[1], NULL, &model), "model_load");
  ember_engine_params ep;
  ember_engine_params_init(&ep);
  ep.kv_memory_bytes = 64ull << 20;
  ember_engine* engine = NULL;
  check(ember_engine_create(model, &ep, &engine), "engine_create");
  ember_session_params sp;
  ember_session_params_init(&sp);
  sp.system_prompt = argc > 4 ? argv[4] : NULL;
  ember_session* session = NULL;
  check(ember_session_create(engine, &sp, &session), "session_create");
  check(ember_session_add_message(session, "user", argv[3]), "add_message");
  ember_stream_params p;
  ember_stream_params_init(&p);
  p.max_tokens = atoi(argv[2]);
  p.temperature = 0.0f;
  p.ignore_eos = getenv("EMBER_REF_IGNORE_EOS") ? 1 : 0; /* benchmarks: exactly MAX_TOKENS */
  ember_stream* stream = NULL;
  check(ember_stream_start(session, &p, &stream), "stream_start");
  const int drain = getenv("EMBER_REF_DRAIN") != NULL;
  if (drain) check(ember_stream_wait(stream), "stream_wait");
  int first = 1;
  size_t n_tokens = 0;
  double t_first = 0, t_end = 0;
  struct timespec ts0;
  clock_gettime(CLOCK_MONOTONIC, &ts0);
  const double t_drain = (double)ts0.tv_sec + (double)ts0.tv_nsec * 1e-9;
  for (;;) {
    ember_event ev;
    memset(&ev, 0, sizeof ev);
    ev.size = sizeof ev;
    check(ember_stream_next(stream, &ev, -1), "stream_next");
    if (ev.type == EMBER_EVENT_ERROR) check(ev.status, "stream");
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    if (ev.type == EMBER_EVENT_END) {
      t_end = now;
      break;
    }
    if (n_tokens == 0) t_first = now;
    n_tokens += ev.n_tokens;
    for (size_t i = 0; i < ev.n_tokens; ++i) {
      printf(first ? "%d" : " %d", ev.tokens[i]);
      first = 0;
    }
  }
  printf("\n");
  if (getenv("EMBER_REF_TIMING")) fprintf(stderr, "decode_s %.6f tokens %zu\n", t_end - t_first, n_tokens);
  if (drain) fprintf(stderr, "drain_s %.9f tokens %zu\n", t_end - t_drain, n_tokens);
  ember_stream_destroy(stream);
  ember_session_destroy(session);
  ember_engine_destroy(engine);
  ember_model_destroy(model);
  return 0;
}
