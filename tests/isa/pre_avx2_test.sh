#!/usr/bin/env bash
# The library on a CPU without AVX2: runs the real model's greedy generation
# under qemu-x86_64 emulating a pre-AVX2 CPU (Nehalem: SSE4.2, no AVX, no
# FMA, no F16C) and requires the same output as the native run, and the same
# per-token log-probabilities, digit for digit.
#   pre_avx2_test.sh EMBER_CLI [QEMU_CPU]        (exit 77: skipped)
set -euo pipefail
cli="$1"
cpu="${2:-Nehalem}"
model="${EMBER_HOME:-$HOME/.cache/ember}/SmolLM2-135M-Instruct.Q4_1.gguf"
command -v qemu-x86_64 >/dev/null || { echo "SKIP: qemu-x86_64 not installed (tools/setup.sh)"; exit 77; }
[ -f "$model" ] || { echo "SKIP: no model at $model (tools/fetch_model.sh)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
emu=(qemu-x86_64 -cpu "$cpu")

# The emulated CPU really lacks AVX2: a program using it must die with SIGILL.
printf 'int main(void){__asm__ volatile("vpaddd %%ymm0, %%ymm0, %%ymm0" ::: "xmm0");return 0;}\n' >"$tmp/avx2.c"
if cc -o "$tmp/avx2" "$tmp/avx2.c" 2>/dev/null; then
  if "${emu[@]}" "$tmp/avx2" 2>/dev/null; then
    echo "FAIL: qemu -cpu $cpu ran an AVX2 instruction; the test would prove nothing"
    exit 1
  fi
fi

# The native runs use the AVX2 kernels even on an AVX-512 CPU, with the tile
# layout off: the scalar kernels an emulated pre-AVX2 CPU runs are
# bit-identical to those (the AVX-512 ones, and the AVX2 ones on the tile
# layout, sum in another order).
export EMBER_CPU_ISA=avx2 EMBER_CPU_AMX=0
prompt="The capital of France is"
"$cli" generate -m "$model" -p "$prompt" -n 8 --temp 0 -t 1 >"$tmp/native.txt" 2>"$tmp/native.err"
"${emu[@]}" "$cli" generate -m "$model" -p "$prompt" -n 8 --temp 0 -t 1 >"$tmp/emu.txt" 2>"$tmp/emu.err" || {
  echo "FAIL: ember generate under qemu -cpu $cpu exited with $?"; cat "$tmp/emu.err"; exit 1; }
echo "native:   $(cat "$tmp/native.txt")"
echo "emulated: $(cat "$tmp/emu.txt")"
cmp -s "$tmp/native.txt" "$tmp/emu.txt" || { echo "FAIL: the generated text differs"; exit 1; }
[ -s "$tmp/native.txt" ] || { echo "FAIL: nothing generated"; exit 1; }

# Per-token log-probabilities of a short text (teacher forced), as printed
# by the CLI: every digit must agree.
printf 'Paris is the capital of France. It is known for the Eiffel Tower.\n' >"$tmp/text.txt"
"$cli" perplexity -m "$model" -f "$tmp/text.txt" --stream --cache full --logprobs "$tmp/native.csv" -t 1 \
  >/dev/null 2>"$tmp/native.err"
"${emu[@]}" "$cli" perplexity -m "$model" -f "$tmp/text.txt" --stream --cache full --logprobs "$tmp/emu.csv" -t 1 \
  >/dev/null 2>"$tmp/emu.err" || { echo "FAIL: perplexity under qemu exited with $?"; cat "$tmp/emu.err"; exit 1; }
lines=$(wc -l <"$tmp/native.csv")
[ "$lines" -gt 10 ] || { echo "FAIL: only $lines log-probability lines"; exit 1; }
cmp -s "$tmp/native.csv" "$tmp/emu.csv" || { echo "FAIL: log-probabilities differ"; diff "$tmp/native.csv" "$tmp/emu.csv" | head; exit 1; }
echo "OK: $lines log-probability lines identical under qemu -cpu $cpu"
