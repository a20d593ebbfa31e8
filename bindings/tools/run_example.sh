#!/usr/bin/env bash
# Smoke test of an examples/<lang> chat: one message on stdin, a short reply
# expected on stdout. The model is found as the binding tests find it.
#   run_example.sh COMMAND... (the model path is appended)
set -euo pipefail
model="${EMBER_MODEL:-${EMBER_HOME:-$HOME/.cache/ember}/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -f "$model" ]; then
  [ -n "${CI:-}" ] && { echo "model missing: $model" >&2; exit 1; }
  echo "model not found at $model" >&2
  exit 77
fi
out="$(echo "Name three colors." | EMBER_MAX_TOKENS=12 "$@" "$model")"
echo "reply: $out"
[ -n "$(echo "$out" | tr -d '[:space:]')" ] || { echo "empty reply" >&2; exit 1; }
