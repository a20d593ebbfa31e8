/*
 * game_loop.c — Ember inside a game's frame loop, in C99 on ember.h alone.
 *
 *   game_loop [-m MODEL] [-t TURNS] [-b BUDGET_MS] [-n MAX_TOKENS] [-w WINDOW]
 *             [-j THREADS] [-r SAVE_TURN] [-s SAVE_DIR] [-a] [-q] [-h]
 *
 * A 60 Hz loop drives a manual-step engine (manual_step = 1): each frame the
 * game gives Ember BUDGET_MS milliseconds (ember_engine_step(engine,
 * BUDGET_MS, 0, ...)) and then polls the NPCs' streams without waiting
 * (ember_stream_next(stream, &event, 0)), so the engine never runs outside
 * the frame and never blocks it. Three NPCs each hold a session with the
 * StreamingLLM cache (EMBER_CACHE_SINK: the first 4 tokens plus the last
 * WINDOW tokens), so an NPC's memory stays bounded however long the game
 * runs. Each turn the player says one line to the group and the three NPCs
 * answer at once, streamed in the same frames. After turn SAVE_TURN the game
 * saves (a small game file plus one ember_session_save file per NPC), quits
 * (everything destroyed, the model too) and loads the save
 * (ember_session_load on a new engine); the conversation then continues.
 *
 * With -a the NPCs act as well as talk: each reply is held to a JSON schema
 * (ember_stream_params.json_schema, structured output since 1.3), an object
 * with one action from the game's list and a line to say, which the game
 * reads without a JSON parser (the grammar guarantees the shape) and prints
 * as "Bram [wave]: ...". A reply cut off before its JSON is complete fails.
 *
 * At the end it prints the time the NPCs took out of each frame in which
 * they were talking (ember_engine_step plus polling and starting streams):
 * mean, p50, p99, the worst frame and the frames over the budget.
 *
 * Exit status: 0 on success; 1 when a call fails, an NPC's cache holds more
 * than its bound, a restored NPC differs from the saved one, or an NPC says
 * nothing after the restore; 2 on bad usage.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ember/ember.h"

#define DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"
#define N_NPCS 3
#define FRAME_HZ 60
#define SINK_TOKENS 4 /* StreamingLLM's attention sinks: the first tokens stay */
#define SAVE_FORMAT "ember-game-save 1"

typedef struct npc {
  const char* name;
  const char* persona; /* the session's system prompt */
  ember_session* session;
  ember_stream* stream; /* the reply being streamed; NULL when silent */
  char* reply;          /* this turn's reply so far */
  size_t reply_length, reply_capacity;
  int replies_after_restore; /* non-empty replies since the game was loaded */
  size_t saved_tokens;       /* history length when the game was saved */
} npc;

/* What the player says, one line a turn, to the group. */
static const char* const k_player_lines[] = {
    "Good evening! I just arrived in town. What is this place?",
    "I am looking for work. Has anyone seen the merchant caravan that went missing?",
    "The caravan was carrying silver from the northern mines. Who would take it?",
    "I found wagon tracks leading into the old forest. Is the forest dangerous?",
    "I will need a sword before I go. What would you recommend?",
    "Do you remember what I told you about the tracks?",
    "Someone in a grey cloak was watching me at the market. Do you know him?",
    "The captain of the guard says the road is closed. Why would he lie?",
    "I think the thieves are hiding in the mill by the river.",
    "Wish me luck. I leave at dawn.",
    "I am back! The mill was empty, but I found this silver coin.",
    "What should I do with the coin?",
};
#define N_PLAYER_LINES (sizeof k_player_lines / sizeof k_player_lines[0])

typedef struct options {
  const char* model_path;
  int turns;
  int budget_ms;
  int max_tokens;
  int window_tokens;
  int threads;
  int save_turn;
  const char* save_dir;
  int actions;
  int quiet;
} options;

/* -a: what an NPC may do, and the schema its replies are held to. The
 * reply is compact JSON in the schema's property order:
 * {"action": "wave", "say": "..."}. */
static const char* const k_npc_action_schema =
    "{\"type\": \"object\", \"properties\": {"
    "\"action\": {\"enum\": [\"greet\", \"wave\", \"point_north\", \"trade\", \"draw_sword\", \"shrug\", "
    "\"walk_away\"]}, "
    "\"say\": {\"type\": \"string\", \"maxLength\": 40}}, "
    "\"required\": [\"action\", \"say\"]}";

/* ------------------------------------------------------------------ helpers */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_until_ms(double deadline_ms) {
  struct timespec ts;
  ts.tv_sec = (time_t)(deadline_ms / 1e3);
  ts.tv_nsec = (long)((deadline_ms - (double)ts.tv_sec * 1e3) * 1e6);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}

/* Reports a failed call; returns 0 so callers can `return fail(...)`. */
static int fail(const char* what, ember_status status) {
  fprintf(stderr, "game_loop: %s: %s (%s)\n", what, ember_last_error(), ember_status_string(status));
  return 0;
}

static int append_reply(npc* n, const char* text, size_t length) {
  if (n->reply_length + length + 1 > n->reply_capacity) {
    size_t capacity = 2 * (n->reply_length + length + 1);
    char* grown = (char*)realloc(n->reply, capacity);
    if (grown == NULL) return 0;
    n->reply = grown;
    n->reply_capacity = capacity;
  }
  memcpy(n->reply + n->reply_length, text, length);
  n->reply_length += length;
  n->reply[n->reply_length] = '\0';
  return 1;
}

static int has_text(const char* s, size_t length) {
  size_t i;
  for (i = 0; i < length; ++i) {
    if (s[i] != ' ' && s[i] != '\n' && s[i] != '\t' && s[i] != '\r') return 1;
  }
  return 0;
}

static int compare_doubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* The q-quantile of sorted[0..n), nearest rank below. */
static double quantile(const double* sorted, size_t n, double q) {
  return n == 0 ? 0.0 : sorted[(size_t)(q * (double)(n - 1))];
}

static char* path_join(const char* dir, const char* file) {
  const size_t size = strlen(dir) + 1 + strlen(file) + 1;
  char* path = (char*)malloc(size);
  if (path != NULL) snprintf(path, size, "%s/%s", dir, file);
  return path;
}

/* ------------------------------------------------------------------ the NPCs */

static ember_status create_engine(ember_model* model, const options* o, ember_engine** engine) {
  ember_engine_params params;
  ember_engine_params_init(&params);
  params.manual_step = 1; /* steps run only inside the frame, on this thread */
  params.n_threads = o->threads;
  /* The pool is reserved, not committed; three bounded caches use a few MiB of it. */
  params.kv_memory_bytes = (uint64_t)256 << 20;
  return ember_engine_create(model, &params, engine);
}

static int create_npc(ember_engine* engine, const options* o, npc* n) {
  ember_session_params params;
  ember_status st;
  ember_session_params_init(&params);
  params.system_prompt = n->persona;
  params.cache_policy = EMBER_CACHE_SINK;
  params.sink_tokens = SINK_TOKENS;
  params.window_tokens = o->window_tokens;
  st = ember_session_create(engine, &params, &n->session);
  if (st != EMBER_OK) return fail("creating an NPC session", st);
  return 1;
}

/* The player's line goes into every NPC's conversation; all three answer. */
static int start_turn(npc* npcs, int turn, const options* o) {
  const char* line = k_player_lines[(size_t)turn % N_PLAYER_LINES];
  int i;
  if (!o->quiet) printf("\n[turn %d] Player: %s\n", turn + 1, line);
  for (i = 0; i < N_NPCS; ++i) {
    npc* n = &npcs[i];
    ember_stream_params params;
    ember_status st = ember_session_add_message(n->session, "user", line);
    if (st != EMBER_OK) return fail("adding the player's line", st);
    ember_stream_params_init(&params);
    params.max_tokens = o->max_tokens;
    params.temperature = 0.7f;
    params.seed = 1000u + (uint64_t)turn * N_NPCS + (uint64_t)i; /* a replay says the same */
    if (o->actions) params.json_schema = k_npc_action_schema;
    st = ember_stream_start(n->session, &params, &n->stream);
    if (st != EMBER_OK) return fail("starting an NPC's reply", st);
    n->reply_length = 0;
    if (!append_reply(n, "", 0)) return 0;
  }
  return 1;
}

/* Reads what an NPC's stream has ready without waiting. Returns 0 on failure;
 * *ended is set when its reply is complete (the stream is then destroyed). */
static int poll_npc(npc* n, int restored, const options* o, int* ended) {
  *ended = 0;
  for (;;) {
    ember_event event;
    ember_status st;
    memset(&event, 0, sizeof event);
    event.size = sizeof event;
    st = ember_stream_next(n->stream, &event, 0);
    if (st == EMBER_ERR_TIMEOUT) return 1; /* nothing more this frame */
    if (st != EMBER_OK) return fail("reading an NPC's reply", st);
    if (event.type == EMBER_EVENT_TEXT) {
      if (!append_reply(n, event.text, event.text_length)) return 0;
      continue;
    }
    if (event.type == EMBER_EVENT_ERROR) return fail("an NPC's reply", event.status);
    /* EMBER_EVENT_END: the reply is part of the NPC's memory now. */
    ember_stream_destroy(n->stream);
    n->stream = NULL;
    *ended = 1;
    if (restored && has_text(n->reply, n->reply_length)) ++n->replies_after_restore;
    if (o->actions) {
      /* Complete JSON ends the reply (EMBER_END_EOS); its action is the
       * first string value, one of the schema's names. */
      static const char k_action_key[] = "{\"action\": \"";
      const char* action = n->reply + sizeof k_action_key - 1;
      const char* end;
      if (event.end_reason != EMBER_END_EOS || strncmp(n->reply, k_action_key, sizeof k_action_key - 1) != 0 ||
          (end = strchr(action, '"')) == NULL) {
        fprintf(stderr, "game_loop: %s's action was cut off (end reason %d): %s\n", n->name, (int)event.end_reason,
                n->reply);
        return 0;
      }
      if (!o->quiet) printf("  %s [%.*s]: %s\n", n->name, (int)(end - action), action, n->reply);
      return 1;
    }
    if (!o->quiet) {
      size_t i;
      for (i = 0; i < n->reply_length; ++i) {
        if (n->reply[i] == '\n' || n->reply[i] == '\r') n->reply[i] = ' '; /* one line per speech bubble */
      }
      printf("  %s: %s\n", n->name, n->reply);
    }
    return 1;
  }
}

/* Memory stays bounded: at most SINK + WINDOW tokens cached, at most the
 * session's own block bound held. */
static int check_memory(const npc* n, const options* o, ember_session_cache_info_t* info) {
  ember_status st;
  memset(info, 0, sizeof *info);
  info->size = sizeof *info;
  st = ember_session_cache_info(n->session, info);
  if (st != EMBER_OK) return fail("reading an NPC's cache", st);
  if (info->cache_policy != EMBER_CACHE_SINK || info->resident_tokens > (size_t)(SINK_TOKENS + o->window_tokens) ||
      info->blocks > info->max_blocks) {
    fprintf(stderr,
            "game_loop: %s's cache is out of bounds: policy %d, %lu tokens cached (bound %d), %lu blocks (%lu)\n",
            n->name, (int)info->cache_policy, (unsigned long)info->resident_tokens, SINK_TOKENS + o->window_tokens,
            (unsigned long)info->blocks, (unsigned long)info->max_blocks);
    return 0;
  }
  return 1;
}

/* ------------------------------------------------------------------ save and load */

static const char* k_file_names[N_NPCS] = {"npc0.ember", "npc1.ember", "npc2.ember"};

/* The game's save: its own state (the turn) and one session file per NPC. */
static int save_game(npc* npcs, int next_turn, const char* dir) {
  char* path = path_join(dir, "game.sav");
  FILE* f;
  int i, ok = 1;
  if (path == NULL) return 0;
  f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "game_loop: cannot write %s: %s\n", path, strerror(errno));
    free(path);
    return 0;
  }
  fprintf(f, "%s\nturn %d\n", SAVE_FORMAT, next_turn);
  for (i = 0; i < N_NPCS && ok; ++i) {
    char* npc_path = path_join(dir, k_file_names[i]);
    ember_status st;
    if (npc_path == NULL) {
      ok = 0;
      break;
    }
    st = ember_session_token_count(npcs[i].session, &npcs[i].saved_tokens);
    if (st == EMBER_OK) st = ember_session_save(npcs[i].session, npc_path);
    if (st != EMBER_OK) ok = fail("saving an NPC", st);
    fprintf(f, "npc %s %s\n", npcs[i].name, k_file_names[i]);
    free(npc_path);
  }
  if (fclose(f) != 0) ok = 0;
  free(path);
  return ok;
}

/* Reads the game file and restores each NPC from its session file. */
static int load_game(npc* npcs, ember_engine* engine, const char* dir, int* next_turn) {
  char* path = path_join(dir, "game.sav");
  char line[256];
  FILE* f;
  int i, ok = 1;
  if (path == NULL) return 0;
  f = fopen(path, "r");
  free(path);
  if (f == NULL || fgets(line, sizeof line, f) == NULL || strncmp(line, SAVE_FORMAT, strlen(SAVE_FORMAT)) != 0 ||
      fscanf(f, "turn %d\n", next_turn) != 1) {
    fprintf(stderr, "game_loop: %s/game.sav is not a game save\n", dir);
    if (f != NULL) fclose(f);
    return 0;
  }
  for (i = 0; i < N_NPCS && ok; ++i) {
    char name[64], file[64];
    char* npc_path;
    size_t tokens = 0;
    ember_status st;
    if (fscanf(f, "npc %63s %63s\n", name, file) != 2 || strcmp(name, npcs[i].name) != 0) {
      fprintf(stderr, "game_loop: game.sav: expected NPC %s\n", npcs[i].name);
      ok = 0;
      break;
    }
    npc_path = path_join(dir, file);
    if (npc_path == NULL) {
      ok = 0;
      break;
    }
    st = ember_session_load(engine, npc_path, NULL, &npcs[i].session);
    free(npc_path);
    if (st != EMBER_OK) {
      ok = fail("restoring an NPC", st);
      break;
    }
    st = ember_session_token_count(npcs[i].session, &tokens);
    if (st != EMBER_OK) {
      ok = fail("counting a restored NPC's tokens", st);
    } else if (tokens != npcs[i].saved_tokens) {
      fprintf(stderr, "game_loop: %s was saved with %lu tokens but restored with %lu\n", npcs[i].name,
              (unsigned long)npcs[i].saved_tokens, (unsigned long)tokens);
      ok = 0;
    }
  }
  fclose(f);
  return ok;
}

static void destroy_npcs(npc* npcs) {
  int i;
  for (i = 0; i < N_NPCS; ++i) {
    ember_stream_destroy(npcs[i].stream);
    ember_session_destroy(npcs[i].session);
    npcs[i].stream = NULL;
    npcs[i].session = NULL;
  }
}

/* ------------------------------------------------------------------ the game */

typedef struct frame_stats {
  double* ms; /* NPC time of each frame in which an NPC was talking */
  size_t n, capacity;
  size_t tokens; /* tokens the engine processed in those frames */
  /* The worst frame: which turn, which frame of the turn, how many tokens. */
  double worst_ms;
  int worst_turn, worst_frame_of_turn;
  size_t worst_tokens;
} frame_stats;

static int record_frame(frame_stats* s, double ms, size_t tokens, int turn, int frame_of_turn) {
  if (s->n == s->capacity) {
    size_t capacity = s->capacity ? 2 * s->capacity : 4096;
    double* grown = (double*)realloc(s->ms, capacity * sizeof *grown);
    if (grown == NULL) return 0;
    s->ms = grown;
    s->capacity = capacity;
  }
  s->ms[s->n++] = ms;
  s->tokens += tokens;
  if (ms > s->worst_ms) {
    s->worst_ms = ms;
    s->worst_turn = turn;
    s->worst_frame_of_turn = frame_of_turn;
    s->worst_tokens = tokens;
  }
  return 1;
}

static void print_frame_stats(frame_stats* s, const options* o, double wall_s) {
  const double frame_ms = 1000.0 / FRAME_HZ;
  double sum = 0;
  size_t i, over_budget = 0, over_frame = 0;
  qsort(s->ms, s->n, sizeof *s->ms, compare_doubles);
  for (i = 0; i < s->n; ++i) {
    sum += s->ms[i];
    if (s->ms[i] > (double)o->budget_ms) ++over_budget;
    if (s->ms[i] > frame_ms) ++over_frame;
  }
  printf("\nframes: %lu with NPCs talking, %d Hz, budget %d ms, %d engine thread(s), %lu tokens processed, %.1f s\n",
         (unsigned long)s->n, FRAME_HZ, o->budget_ms, o->threads, (unsigned long)s->tokens, wall_s);
  printf("NPC time per frame: mean %.2f ms, p50 %.2f ms, p99 %.2f ms, worst %.2f ms; over budget: %lu (%.1f%%)\n",
         s->n ? sum / (double)s->n : 0.0, quantile(s->ms, s->n, 0.5), quantile(s->ms, s->n, 0.99), s->worst_ms,
         (unsigned long)over_budget, s->n ? 100.0 * (double)over_budget / (double)s->n : 0.0);
  printf("over a whole %.1f ms frame: %lu (%.1f%%); the worst frame: turn %d, frame %d of the turn, %lu tokens\n",
         frame_ms, (unsigned long)over_frame, s->n ? 100.0 * (double)over_frame / (double)s->n : 0.0, s->worst_turn + 1,
         s->worst_frame_of_turn + 1, (unsigned long)s->worst_tokens);
}

/* Runs turns [first, last) in the frame loop. */
static int play(npc* npcs, ember_engine* engine, int first, int last, int restored, const options* o,
                frame_stats* stats) {
  const double frame_ms = 1000.0 / FRAME_HZ;
  double next_frame = now_ms();
  int turn = first, talking = 0, frame_of_turn = 0, i;
  while (turn < last || talking > 0) {
    const double t0 = now_ms();
    size_t processed = 0;
    ember_status st;
    if (talking == 0) {
      if (!start_turn(npcs, turn, o)) return 0;
      ++turn;
      talking = N_NPCS;
      frame_of_turn = 0;
    }
    /* (The game's own update and rendering would run here.) */
    st = ember_engine_step(engine, o->budget_ms, 0, &processed);
    if (st != EMBER_OK) return fail("stepping the engine", st);
    for (i = 0; i < N_NPCS; ++i) {
      int ended = 0;
      if (npcs[i].stream == NULL) continue;
      if (!poll_npc(&npcs[i], restored, o, &ended)) return 0;
      talking -= ended;
    }
    if (!record_frame(stats, now_ms() - t0, processed, turn - 1, frame_of_turn++)) return 0;
    if (talking == 0) {
      for (i = 0; i < N_NPCS; ++i) {
        ember_session_cache_info_t info;
        if (!check_memory(&npcs[i], o, &info)) return 0;
      }
    }
    /* Wait for the next 60 Hz tick; a late frame moves the schedule on. */
    next_frame += frame_ms;
    if (now_ms() < next_frame) {
      sleep_until_ms(next_frame);
    } else {
      next_frame = now_ms();
    }
  }
  return 1;
}

static void print_memory(npc* npcs, const options* o) {
  int i;
  for (i = 0; i < N_NPCS; ++i) {
    ember_session_cache_info_t info;
    if (!check_memory(&npcs[i], o, &info)) continue;
    printf("memory: %s: %lu tokens of conversation, %lu cached (bound %d), %lu evicted, %lu KV blocks (bound %lu)\n",
           npcs[i].name, (unsigned long)info.n_tokens, (unsigned long)info.resident_tokens,
           SINK_TOKENS + o->window_tokens, (unsigned long)info.evicted_tokens, (unsigned long)info.blocks,
           (unsigned long)info.max_blocks);
  }
}

static int run(const options* o, npc* npcs) {
  ember_model* model = NULL;
  ember_engine* engine = NULL;
  frame_stats stats;
  ember_status st;
  double t_start, t;
  int i, next_turn = 0, ok = 0;

  memset(&stats, 0, sizeof stats);
  st = ember_model_load(o->model_path, NULL, &model);
  if (st != EMBER_OK) return fail("loading the model", st);
  st = create_engine(model, o, &engine);
  if (st != EMBER_OK) {
    ember_model_destroy(model);
    return fail("creating the engine", st);
  }
  for (i = 0; i < N_NPCS; ++i) {
    if (!create_npc(engine, o, &npcs[i])) goto done;
  }

  t_start = now_ms();
  if (!play(npcs, engine, 0, o->save_turn, 0, o, &stats)) goto done;

  /* Save, quit (everything goes, the model too) and load. */
  t = now_ms();
  if (!save_game(npcs, o->save_turn, o->save_dir)) goto done;
  printf("\n[saved the game after turn %d to %s in %.1f ms]\n", o->save_turn, o->save_dir, now_ms() - t);
  destroy_npcs(npcs);
  ember_engine_destroy(engine);
  ember_model_destroy(model);
  engine = NULL;
  model = NULL;

  t = now_ms();
  st = ember_model_load(o->model_path, NULL, &model);
  if (st != EMBER_OK) {
    fail("reloading the model", st);
    goto done;
  }
  st = create_engine(model, o, &engine);
  if (st != EMBER_OK) {
    fail("recreating the engine", st);
    goto done;
  }
  if (!load_game(npcs, engine, o->save_dir, &next_turn)) goto done;
  printf("[loaded the game (model, engine, %d NPCs) in %.1f ms; the conversation continues]\n", N_NPCS, now_ms() - t);

  if (!play(npcs, engine, next_turn, o->turns, 1, o, &stats)) goto done;
  for (i = 0; i < N_NPCS; ++i) {
    if (next_turn < o->turns && npcs[i].replies_after_restore == 0) {
      fprintf(stderr, "game_loop: %s said nothing after the game was loaded\n", npcs[i].name);
      goto done;
    }
  }
  print_frame_stats(&stats, o, (now_ms() - t_start) / 1e3);
  print_memory(npcs, o);
  ok = 1;

done:
  destroy_npcs(npcs);
  ember_engine_destroy(engine);
  ember_model_destroy(model);
  free(stats.ms);
  return ok;
}

/* ------------------------------------------------------------------ main */

static char* default_model_path(void) {
  const char* home = getenv("EMBER_HOME");
  const char* suffix = "";
  if (home == NULL || *home == '\0') {
    home = getenv("HOME");
    suffix = "/.cache/ember";
    if (home == NULL || *home == '\0') home = ".";
  }
  {
    const size_t size = strlen(home) + strlen(suffix) + 1 + strlen(DEFAULT_MODEL_FILE) + 1;
    char* path = (char*)malloc(size);
    if (path != NULL) snprintf(path, size, "%s%s/%s", home, suffix, DEFAULT_MODEL_FILE);
    return path;
  }
}

static int parse_int(const char* s, int lo, int hi, int* out) {
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return 0;
  *out = (int)v;
  return 1;
}

static void usage(void) {
  fprintf(stderr,
          "usage: game_loop [-m MODEL] [-t TURNS] [-b BUDGET_MS] [-n MAX_TOKENS] [-w WINDOW] [-j THREADS]\n"
          "                 [-r SAVE_TURN] [-s SAVE_DIR] [-a] [-q] [-h]\n"
          "  -t turns (default 30), -b the engine's milliseconds per 60 Hz frame (16),\n"
          "  -n tokens per NPC reply (32), -w each NPC's window of cached tokens after 4 sinks (256),\n"
          "  -j engine threads (1), -r save, quit and load after this turn (TURNS / 2),\n"
          "  -s where the save goes (default: a temporary directory, removed at the end), -q no dialogue,\n"
          "  -a the NPCs choose actions: replies held to a JSON schema ({\"action\": ..., \"say\": ...})\n");
}

int main(int argc, char** argv) {
  npc npcs[N_NPCS] = {
      {"Bram", "You are Bram, the town's gruff blacksmith. Answer in one or two short sentences.", NULL, NULL, NULL, 0,
       0, 0, 0},
      {"Elsa", "You are Elsa, the cheerful innkeeper who hears every rumour. Answer in one or two short sentences.",
       NULL, NULL, NULL, 0, 0, 0, 0},
      {"Tomas", "You are Tomas, a suspicious town guard. Answer in one or two short sentences.", NULL, NULL, NULL, 0, 0,
       0, 0},
  };
  options o;
  char* model_path = NULL;
  char temp_dir[] = "/tmp/ember_game_loop.XXXXXX";
  int c, i, ok, own_dir = 0;

  memset(&o, 0, sizeof o);
  o.turns = 30;
  o.budget_ms = 16;
  o.max_tokens = 32;
  o.window_tokens = 256;
  o.threads = 1;
  o.save_turn = -1;
  while ((c = getopt(argc, argv, "m:t:b:n:w:j:r:s:aqh")) != -1) {
    int valid = 1;
    switch (c) {
      case 'm': o.model_path = optarg; break;
      case 't': valid = parse_int(optarg, 1, 100000, &o.turns); break;
      case 'b': valid = parse_int(optarg, 1, 1000, &o.budget_ms); break;
      case 'n': valid = parse_int(optarg, 1, 4096, &o.max_tokens); break;
      case 'w': valid = parse_int(optarg, 16, 8192, &o.window_tokens); break;
      case 'j': valid = parse_int(optarg, 0, 256, &o.threads); break;
      case 'r': valid = parse_int(optarg, 0, 100000, &o.save_turn); break;
      case 's': o.save_dir = optarg; break;
      case 'a': o.actions = 1; break;
      case 'q': o.quiet = 1; break;
      case 'h': usage(); return 0;
      default: valid = 0; break;
    }
    if (!valid) {
      usage();
      return 2;
    }
  }
  if (optind != argc) {
    usage();
    return 2;
  }
  if (o.save_turn < 0) o.save_turn = o.turns / 2;
  if (o.save_turn > o.turns) o.save_turn = o.turns;
  if (o.model_path == NULL) {
    model_path = default_model_path();
    if (model_path == NULL) return 1;
    o.model_path = model_path;
  }
  if (o.save_dir == NULL) {
    if (mkdtemp(temp_dir) == NULL) {
      fprintf(stderr, "game_loop: cannot create a temporary directory: %s\n", strerror(errno));
      free(model_path);
      return 1;
    }
    o.save_dir = temp_dir;
    own_dir = 1;
  }
  printf("game_loop: libember %s, %d turns, %d NPCs, budget %d ms per %d Hz frame, window %d + %d sink tokens\n",
         ember_version(), o.turns, N_NPCS, o.budget_ms, FRAME_HZ, o.window_tokens, SINK_TOKENS);

  ok = run(&o, npcs);

  for (i = 0; i < N_NPCS; ++i) free(npcs[i].reply);
  if (own_dir) {
    char* path = path_join(temp_dir, "game.sav");
    if (path != NULL) remove(path);
    free(path);
    for (i = 0; i < N_NPCS; ++i) {
      path = path_join(temp_dir, k_file_names[i]);
      if (path != NULL) remove(path);
      free(path);
    }
    rmdir(temp_dir);
  }
  free(model_path);
  return ok ? 0 : 1;
}
