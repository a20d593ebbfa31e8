/*
 * header_c99.c — proves that ember.h is clean C99 (built with -std=c99
 * -Wall -Wextra -Werror -pedantic) and that a C program links against
 * libember directly. Runs without a model: it checks the version, the
 * status names and one error path.
 */
#include "ember/ember.h"

#include <stdio.h>
#include <string.h>

/* The sizes the header promises for ABI types. */
typedef char check_status_is_32_bit[sizeof(ember_status) == 4 ? 1 : -1];
typedef char check_enum_values[EMBER_ERR_END_OF_STREAM == 11 && EMBER_END_CONTEXT_FULL == 5 ? 1 : -1];

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "header_c99: FAILED: %s\n", what);
    ++failures;
  }
}

int main(void) {
  char expected[32];
  ember_model* model = (ember_model*)&failures; /* must be reset to NULL */
  ember_stream_params params;
  ember_event event;
  ember_status st;

  snprintf(expected, sizeof expected, "%d.%d.%d", EMBER_VERSION_MAJOR, EMBER_VERSION_MINOR, EMBER_VERSION_PATCH);
  expect(strcmp(ember_version(), expected) == 0, "ember_version() matches the header");
  expect(strcmp(ember_status_string(EMBER_ERR_BUSY), "EMBER_ERR_BUSY") == 0, "status names");
  expect(strcmp(ember_status_string(-1), "unknown status") == 0, "unknown status name");

  st = ember_model_load(NULL, NULL, &model);
  expect(st == EMBER_ERR_INVALID_ARGUMENT, "NULL path is INVALID_ARGUMENT");
  expect(model == NULL, "out_model is reset on failure");
  expect(ember_last_error()[0] != '\0', "a failed call leaves a message");

  ember_stream_params_init(&params);
  expect(params.size == sizeof params && params.max_tokens == 256, "stream defaults");
  memset(&event, 0, sizeof event);
  event.size = sizeof event;
  expect(ember_stream_next(NULL, &event, 0) == EMBER_ERR_INVALID_ARGUMENT, "NULL stream");

  ember_model_destroy(NULL);
  ember_engine_destroy(NULL);
  ember_session_destroy(NULL);
  ember_stream_destroy(NULL);

  if (failures == 0) printf("header_c99: ok (libember %s)\n", ember_version());
  return failures == 0 ? 0 : 1;
}
