#!/usr/bin/env bash
# tools/distill_draft.py end to end, at a tiny scale: the target answers a few
# prompts through the Python binding, a 1-layer draft trains for a few steps,
# the GGUF it exports must load in Ember with the target's vocabulary and
# compute what the trainer computed (`check`), and greedy speculative decoding
# with it must give the target's own tokens. (The real draft: same script,
# larger settings; docs/BENCHMARKS.md, speculative decoding.)
#   distill_draft_test.sh EMBER_CLI PYTHON_BINDING_DIR SOURCE_DIR
set -u
ember="$1"; pybind="$2"; src="$3"
home="${EMBER_HOME:-$HOME/.cache/ember}"
model="$home/SmolLM2-135M-Instruct.Q4_1.gguf"
venv="${EMBER_DISTILL_VENV:-$home/distillvenv}"
if [ ! -s "$model" ] || ! "$venv/bin/python" -c "import jax, gguf, numpy" 2>/dev/null; then
  [ -n "${CI:-}" ] && { echo "missing: $model or the venv $venv (tools/setup.sh makes both)"; exit 1; }
  echo "model or $venv missing (tools/setup.sh), skipping"; exit 77
fi
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
run() { PYTHONPATH="$pybind" JAX_PLATFORMS=cpu "$venv/bin/python" "$src/tools/distill_draft.py" "$@" --work "$work"; }
set -e
run data --prompts 12 --streams 4 --max-tokens 24 --threads 1
run train --steps 25 --layers 1 --embd 64 --ff 128 --heads 1 --kv-heads 1 --seq 96 --batch 4
run export
run check --threads 1
set +e
fail=0
for p in "The capital of France is" "def fibonacci(n):" "Once upon a time, there was a"; do
  plain="$("$ember" generate -p "$p" -n 20 --temp 0 -t 1 2>/dev/null)"
  spec="$("$ember" generate -p "$p" -n 20 --temp 0 -t 1 --spec "draft:$work/smollm2-draft.gguf" --stats 2>"$work/err")"
  if [ -z "$plain" ] || [ "$plain" != "$spec" ]; then echo "FAIL: '$p': plain '$plain', with the draft '$spec'"; fail=1; fi
  # (a 25-step draft is rarely confident enough to draft: Ember skips it then; the same-weights draft's
  # drafting is tested in test_integration, Speculative.*)
  grep -q "speculation: drafted [0-9]*" "$work/err" || { echo "FAIL: no speculation stats: $(cat "$work/err")"; fail=1; }
done
exit $fail
