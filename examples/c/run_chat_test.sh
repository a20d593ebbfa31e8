#!/bin/sh
# CTest driver for the C chat example: runs it with a short reply and checks
# that it exits with 0 and prints something. Exits 77 (skipped) when the
# default model is absent, unless $CI is set, where that is a failure.
#   run_chat_test.sh CHAT_EXECUTABLE LIBEMBER
exe=$1
lib=$2
if [ -n "$EMBER_HOME" ]; then
  home=$EMBER_HOME
elif [ -n "$HOME" ]; then
  home=$HOME/.cache/ember
else
  home=.cache/ember
fi
model=$home/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ]; then
  if [ -n "$CI" ]; then
    echo "FAIL: model missing: $model (CI is set)"
    exit 1
  fi
  echo "SKIP: model not found at $model"
  exit 77
fi

out=$(mktemp "${TMPDIR:-/tmp}/ember_chat.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
"$exe" -l "$lib" -m "$model" -n 16 -p "Say hello in one short sentence." >"$out"
rc=$?
echo "--- reply:"
cat "$out"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: chat exited with $rc"
  exit 1
fi
if ! grep -q '[^[:space:]]' "$out"; then
  echo "FAIL: chat printed no reply"
  exit 1
fi
echo "PASS"
