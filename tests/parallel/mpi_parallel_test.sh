#!/usr/bin/env bash
# A model split across two MPI ranks (issue 31), end to end:
#   bash mpi_parallel_test.sh MPIEXEC PARALLEL_TEST EMBER_CLI MAKE_SYNTHETIC_MODEL WORKDIR
# Pipeline parallel (2 stages) bit-identical to one rank on SmolLM2, Gemma 3
# 270M (sliding-window layers) and synthetic Llama / Gemma 3 models (8 streams
# at once, so steps run in micro-batches); tensor
# parallel, exact (the default), bit-identical too: 2 ranks on Gemma 3 270M
# (its one KV head replicated) and the synthetic model, 3 on SmolLM2; tensor
# parallel with Megatron's all-reduce (another summation order, docs/PARALLEL.md):
# perplexity of a text (README.md) within 0.1% of one rank, top-1 equal on
# >= 90% of its rows, greedy streams mostly equal; both at once (2 stages of
# 2 tensor-parallel ranks, 4 ranks) bit-identical on the synthetic Llama and
# Gemma 3 270M;
# splits the shapes do not allow refused; `mpirun -np 2 ember
# generate --pp 2` printing exactly what `ember generate` prints; a rank that
# hangs ending the job with an error on rank 0 within the timeout.
set -uo pipefail
mpiexec="$1" bin="$2" cli="$3" synth="$4" work="$5"
home="${EMBER_HOME:-$HOME/.cache/ember}"
smollm="$home/SmolLM2-135M-Instruct.Q4_1.gguf"
gemma="$home/gemma-3-270m-q4_k_m.gguf"
# Open MPI refuses root without these (CI runs as root); --oversubscribe: more
# ranks than cores is fine for a test.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_WAIT_POLICY=PASSIVE
run() { timeout 600 "$mpiexec" --oversubscribe -n 2 "$@"; }
run4() { timeout 600 "$mpiexec" --oversubscribe -n 4 "$@"; }
fail=0
check() {  # NAME COMMAND...: runs it, shows its report, records a failure
  local name="$1"
  shift
  echo "== $name"
  if ! "$@"; then
    echo "mpi_parallel_test: $name FAILED" >&2
    fail=1
  fi
}
mkdir -p "$work"
model="$work/parallel_llama.gguf"
"$synth" --layers 6 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 512 --type q8_0 --seed 7 --out "$model" \
  >/dev/null || exit 1

text="$(cd "$(dirname "$0")/../.." && pwd)/README.md"
check "pp 2, synthetic Llama, identical" run "$bin" --model "$model" --pp 2 --prompts 8 --tokens 24 --identical \
  --score-file "$text" --score-tokens 1024
# A synthetic Gemma 3 with a 16-token window: its one global layer on the
# second stage only (the first keeps an empty group), windows passed early.
gemma_synth="$work/parallel_gemma3.gguf"
"$synth" --arch gemma3 --layers 6 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 512 --window 16 --type q8_0 \
  --seed 7 --out "$gemma_synth" >/dev/null || exit 1
check "pp 2, synthetic Gemma 3 (16-token window), identical" run "$bin" --model "$gemma_synth" --pp 2 --prompts 8 \
  --tokens 40 --identical --score-file "$text" --score-tokens 512
check "tp 2 (exact), synthetic Llama, identical" run "$bin" --model "$model" --tp 2 --prompts 24 --tokens 16 \
  --identical --score-file "$text" --score-tokens 1024
check "tp 2 (all-reduce), synthetic Llama" run "$bin" --model "$model" --tp 2 --tp-allreduce --prompts 24 --tokens 16 \
  --min-agreement 0.6 --max-ppl-rel 0.001 --min-top1 0.9 --score-file "$text" --score-tokens 1024
check "tp 2 x 2 ranks refused" run "$bin" --model "$model" --tp 2 --pp 2 --expect-error "MPI job has 2"
# Both: 2 stages of 2 tensor-parallel ranks (4 ranks on 2 cores).
check "tp 2 x pp 2 (exact), synthetic Llama, identical" run4 "$bin" --model "$model" --tp 2 --pp 2 --prompts 8 \
  --tokens 24 --identical --score-file "$text" --score-tokens 1024
check "nccl on the CPU refused" run "$bin" --model "$model" --tp 2 --comm nccl --expect-error "NCCL ranks run on CUDA"
# The NCCL plugin where it was built: without a GPU it must say so (on a
# machine with 2+ GPUs, the same run without --expect-error is the real test).
if [ -f "$(dirname "$(readlink -f "$bin")")/../capi/libember_nccl.so" ]; then
  if nvidia-smi -L 2>/dev/null | grep -q "GPU 1"; then
    check "tp 2 over NCCL, 2 GPUs" run "$bin" --model "$model" --tp 2 --comm nccl --device cuda --prompts 8 \
      --tokens 16 --identical
  else
    check "nccl without 2 GPUs refused" run "$bin" --model "$model" --tp 2 --comm nccl --device cuda \
      --expect-error "nccl: "
  fi
fi
if [ -f "$smollm" ]; then
  check "pp 2, SmolLM2, identical" run "$bin" --model "$smollm" --pp 2 --prompts 8 --tokens 24 --identical \
    --score-file "$text" --score-tokens 1024
  # SmolLM2 splits 3 ways (9 heads, 3 KV heads): tensor parallel on 3 ranks.
  check "tp 3 (exact), SmolLM2, identical" timeout 600 "$mpiexec" --oversubscribe -n 3 "$bin" --model "$smollm" \
    --tp 3 --prompts 24 --tokens 16 --identical --score-file "$text" --score-tokens 1024
  check "tp 2, SmolLM2 refused (9 heads)" run "$bin" --model "$smollm" --tp 2 \
    --expect-error "head_count 9 is not divisible by tp 2"
  # The CLI: rank 0 alone prints, the text is the one-rank text.
  one=$("$cli" generate -m "$smollm" -p "The capital of France is" -n 24 --temp 0 -t 1 2>/dev/null)
  two=$(run "$cli" generate -m "$smollm" -p "The capital of France is" -n 24 --temp 0 -t 1 --pp 2 2>/dev/null)
  echo "== cli: one rank: '$one'"
  echo "== cli: pp 2:     '$two'"
  if [ -z "$one" ] || [ "$one" != "$two" ]; then
    echo "mpi_parallel_test: mpirun -np 2 ember generate --pp 2 differs from ember generate" >&2
    fail=1
  fi
  # The server on a split model: rank 0 serves, its greedy completion is the
  # one-process server's.
  serve_completion() {  # COMMAND...: starts it with --port 0, asks one completion, stops it (SIGTERM)
    local log="$work/serve.log" pid url
    rm -f "$log"
    "$@" --port 0 --quiet > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do grep -q "listening on" "$log" 2>/dev/null && break; sleep 0.1; done
    url=$(grep -o "http://[0-9.:]*" "$log" | head -1)
    python3 - "$url" <<'PY' || echo "(no answer: $(tail -3 "$log"))"
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                             data=json.dumps({"prompt": "The capital of France is", "max_tokens": 16,
                                              "temperature": 0}).encode())
print(json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"])
PY
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
  }
  if "$cli" --help 2>&1 | grep -q "  serve "; then
    one=$(serve_completion "$cli" serve -m "$smollm" -t 1)
    two=$(serve_completion timeout 300 "$mpiexec" --oversubscribe -n 2 "$cli" serve -m "$smollm" -t 1 --pp 2)
    echo "== serve: one process: '$one'"
    echo "== serve: --pp 2:      '$two'"
    if [ -z "$one" ] || [ "$one" != "$two" ]; then
      echo "mpi_parallel_test: ember serve --pp 2 under mpirun answers otherwise than one process" >&2
      fail=1
    fi
  fi
  # A rank that hangs (stopped) ends the job with rank 0's error.
  pidfile="$work/parallel_started"
  rm -f "$pidfile"
  start=$(date +%s)
  PARALLEL_TEST_PIDFILE="$pidfile" run "$bin" --model "$smollm" --pp 2 --prompts 8 --tokens 400 \
    --comm-timeout-ms 5000 > "$work/hang.log" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do [ -f "$pidfile" ] && break; sleep 0.1; done
  sleep 1
  # rank 1: the other parallel_test process (rank 0 wrote its pid).
  victim=$(pgrep -x "$(basename "$bin")" | grep -vx "$(cat "$pidfile" 2>/dev/null)" | head -1)
  [ -n "$victim" ] && kill -STOP "$victim"
  wait "$job"
  rc=$?
  secs=$(($(date +%s) - start))
  [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null
  tail -3 "$work/hang.log"
  if [ "$rc" -eq 0 ] || [ "$secs" -gt 60 ] || ! grep -q "no answer from the other ranks" "$work/hang.log"; then
    echo "mpi_parallel_test: a stopped rank: the job ended with $rc after $secs s without rank 0's timeout error" >&2
    fail=1
  else
    echo "== a stopped rank: rank 0 reported the timeout, the job ended with $rc after $secs s"
  fi
else
  echo "mpi_parallel_test: $smollm missing (tools/fetch_model.sh): SmolLM2 runs skipped" >&2
  fail=1
fi
if [ -f "$gemma" ]; then
  check "tp 2 (exact), Gemma 3 270M (1 KV head replicated), identical" run "$bin" --model "$gemma" --tp 2 \
    --prompts 24 --tokens 16 --identical --score-file "$text" --score-tokens 1024
  check "tp 2 (all-reduce), Gemma 3 270M" run "$bin" --model "$gemma" --tp 2 --tp-allreduce --prompts 24 --tokens 16 \
    --min-agreement 0.5 --max-ppl-rel 0.001 --min-top1 0.9 --score-file "$text" --score-tokens 1024
  # Sliding-window layers in stages (KvLayerGroups::pipeline_stage): 1 global
  # + 8 local layers on one rank, 2 + 7 on the other; the perplexity's 1,024
  # tokens pass the 512-token window.
  check "pp 2, Gemma 3 270M (sliding-window layers), identical" run "$bin" --model "$gemma" --pp 2 --prompts 8 \
    --tokens 24 --identical --score-file "$text" --score-tokens 1024
  check "tp 2 x pp 2 (exact), Gemma 3 270M, identical" run4 "$bin" --model "$gemma" --tp 2 --pp 2 --prompts 8 \
    --tokens 16 --identical --score-file "$text" --score-tokens 1024
fi
exit $fail
