#!/bin/sh
# CTest driver for the game loop example: a short game whose NPCs evict
# tokens (32-token windows), saved and loaded after turn 2. It must exit 0
# (the program itself fails on an unbounded cache, a restore that differs
# from the save, or an NPC silent after the load), report frame times, and
# every NPC must have evicted tokens. Then the same game saved only after its
# last turn: its dialogue must be the first game's, word for word (the
# restored NPCs went on exactly as if the game had never been quit; sampling
# is seeded per turn and NPC). Then a game whose NPCs choose actions (-a:
# replies held to a JSON schema): every reply must be a complete action with
# a name from the game's list. Exits 77 (skipped) when the default model is
# absent, unless $CI is set.
#   run_game_loop_test.sh GAME_LOOP_EXECUTABLE
exe=$1
model="${EMBER_MODEL:-${EMBER_HOME:-$HOME/.cache/ember}/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -f "$model" ]; then
  if [ -n "$CI" ]; then
    echo "FAIL: model missing: $model (CI is set)"
    exit 1
  fi
  echo "SKIP: model not found at $model"
  exit 77
fi

out=$(mktemp "${TMPDIR:-/tmp}/ember_game_loop.XXXXXX") || exit 1
out2=$(mktemp "${TMPDIR:-/tmp}/ember_game_loop.XXXXXX") || exit 1
out3=$(mktemp "${TMPDIR:-/tmp}/ember_game_loop.XXXXXX") || exit 1
trap 'rm -f "$out" "$out2" "$out3" "$out.dialogue" "$out2.dialogue"' EXIT
"$exe" -m "$model" -t 4 -r 2 -n 8 -w 32 -b 16 >"$out"
rc=$?
cat "$out"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: game_loop exited with $rc"
  exit 1
fi
grep -q "^\[loaded the game" "$out" || { echo "FAIL: the game was not loaded"; exit 1; }
grep -q "^NPC time per frame: mean [0-9.]* ms, p50 [0-9.]* ms, p99 [0-9.]* ms, worst [0-9.]* ms; over budget: [0-9]*" "$out" ||
  { echo "FAIL: no frame times"; exit 1; }
for npc in Bram Elsa Tomas; do
  grep -q "^memory: $npc: .* [1-9][0-9]* evicted" "$out" || { echo "FAIL: $npc evicted nothing"; exit 1; }
done

"$exe" -m "$model" -t 4 -r 4 -n 8 -w 32 -b 16 >"$out2"
rc=$?
if [ "$rc" -ne 0 ]; then
  cat "$out2"
  echo "FAIL: game_loop (saved after the last turn) exited with $rc"
  exit 1
fi
grep -E '^(\[turn |  (Bram|Elsa|Tomas):)' "$out" >"$out.dialogue"
grep -E '^(\[turn |  (Bram|Elsa|Tomas):)' "$out2" >"$out2.dialogue"
[ "$(grep -c '^\[turn ' "$out.dialogue")" -eq 4 ] || { echo "FAIL: expected 4 turns of dialogue"; exit 1; }
if ! diff "$out2.dialogue" "$out.dialogue"; then
  echo "FAIL: the dialogue after the restore differs from the game played without one (diff above)"
  exit 1
fi
"$exe" -m "$model" -t 3 -r 1 -n 64 -w 64 -b 16 -a >"$out3"
rc=$?
cat "$out3"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: game_loop -a exited with $rc"
  exit 1
fi
acted=$(grep -cE '^  (Bram|Elsa|Tomas) \[(greet|wave|point_north|trade|draw_sword|shrug|walk_away)\]: \{"action": "[a-z_]+", "say": ".*"\}$' "$out3")
[ "$acted" -eq 9 ] || { echo "FAIL: expected 9 actions (3 turns x 3 NPCs), got $acted"; exit 1; }
echo "PASS"
