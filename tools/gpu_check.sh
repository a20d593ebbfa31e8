#!/usr/bin/env bash
# The CUDA backend's checks in one command, on a machine with an NVIDIA GPU
# (issue 29; docs/CUDA.md section 7). Run in the repository root:
#
#   tools/gpu_check.sh [--phase all|synthetic|real] [--out DIR] [--quick] [--no-bench] [--profile] [--crash-check]
#                      [--deadline S]
#
# phase synthetic (no model needed; the files are made here):
#   env        driver, GPU, toolkit, compute-sanitizer, the plugin's libraries
#   host       the host-side GPU tests (GpuLayout.*, Plugin.*)
#   ops        CUDA op tests against the scalar references (BackendOps/*.cuda)
#   san-*      compute-sanitizer memcheck / racecheck / synccheck / initcheck on them
#   verify-*   make_synthetic_model --preset smollm2-135m --type T --verify-device cuda
#   bench-8b-* bench_cuda on the synthetic Llama-3-8B shape (Q4_0, Q4_K_M, F16; not with --no-bench)
#   capi-synthetic  with --crash-check: the C ABI suite on a synthetic stand-in model (no shard may die)
#   profile-*  with --profile: ncu's time and DRAM throughput of every kernel of batch-1 decode steps
# phase real (SmolLM2-135M-Instruct Q4_1 in $EMBER_HOME, or joined from the
# two halves tools/gpu_bundle.sh --part A|B carried in .gpu/):
#   capi, integration   the C ABI and integration suites with EMBER_FORCE_DEVICE=cuda
#   agree-smollm2       GPU vs CPU logits (top-1, mean KL, greedy), bench_cuda --agree
#   bench-smollm2       bench_cuda; engine-bench-*: `ember bench` through the C ABI on the GPU
#   llama-*             llama.cpp's CUDA build on the same files (when carried or built), and its
#                       own CUDA-vs-CPU agreement on SmolLM2 (llama-perplexity --kl-divergence)
#
# Every step has a time limit; its log goes to DIR/logs/<step>.log and one line
# to DIR/summary.md (PASS / FAIL rc / SKIP why, seconds). DIR/logs.tgz is
# rewritten after every step, so a run cut off keeps what it did. Exit status:
# 0 all passed, 1 a step failed, 2 no GPU (a dry run: says where it stopped).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
phase=all
out="${OUT:-$root/gpu-check-out}"
quick=0
bench=1
profile=0
crash_check=0
deadline=100000   # seconds after the start past which no new step begins (--deadline)
while (($#)); do
  case "$1" in
    --phase) phase="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --no-bench) bench=0; shift ;;
    --profile) profile=1; shift ;;
    --crash-check) crash_check=1; shift ;;
    --deadline) deadline="$2"; shift 2 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/logs"
logs="$out/logs"
summary="$out/summary.md"
work="${EMBER_GPU_WORK:-/root/ember-gpu}"   # models and stashes; outlives a call on a warm machine
[ -w "$(dirname "$work")" ] || work="$root/.gpu-work"
mkdir -p "$work/models"
t0=$(date +%s)
failed=0
echo "# gpu_check $(date -u +%FT%TZ) phase=$phase host=$(hostname)" >>"$summary"

pack() { tar -C "$out" -czf "$out/logs.tgz.tmp" logs 2>/dev/null && mv "$out/logs.tgz.tmp" "$out/logs.tgz"; }
note() { echo "$*" | tee -a "$summary"; }
# step NAME LIMIT_S CMD...: runs CMD with a limit, logs, one summary line.
late() { (($(date +%s) - t0 > deadline)); }
step() {
  local name="$1" limit="$2"
  shift 2
  if late; then note "| $name | SKIP | 0s | out of time (--deadline $deadline) |"; return 0; fi
  local s=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - s))
  local last
  last="$(grep -v '^\s*$' "$logs/$name.log" | tail -1 | cut -c1-160)"
  if ((rc == 0)); then
    note "| $name | PASS | ${dt}s | $last |"
  else
    ((rc == 124 || rc == 137)) && last="TIMEOUT after ${limit}s; $last"
    note "| $name | FAIL rc=$rc | ${dt}s | $last |"
    failed=1
  fi
  pack
  return $rc
}
skip() { note "| $1 | SKIP | 0s | $2 |"; }

# ---- the build: carried as .gpu/bundle.tar.xz, or a build-gpu/ made here
if [ -f "$root/.gpu/bundle.tar.xz" ]; then
  mkdir -p "$root/build-gpu"
  tar -C "$root/build-gpu" -xJf "$root/.gpu/bundle.tar.xz"
fi
b="$root/build-gpu"
if [ ! -x "$b/tests/unit/backend/test_backend" ]; then
  note "gpu_check: no build in $b: run tools/gpu_bundle.sh here first (or build there with -DEMBER_WITH_CUDA=ON)"
  pack
  exit 1
fi
# The tests carry their source path (golden files, synthetic models): link it here.
if [ -f "$root/.gpu/source_dir" ]; then
  src="$(cat "$root/.gpu/source_dir")"
  if [ "$src" != "$root" ] && [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
  fi
fi
[ -f "$root/.gpu/text.txt.xz" ] && xz -dc "$root/.gpu/text.txt.xz" >"$work/text.txt"
export LD_LIBRARY_PATH="$b/capi:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for d in /usr/local/lib/python3*/dist-packages/nvidia/cu*/lib /opt/*/.venv/lib/python3*/site-packages/nvidia/cu*/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$b/lib"   # libgomp, if the system has none
if [ -f "$root/.gpu/synthetic.sh" ] && [ ! -s "$b/tests/synthetic/exit_agrees.gguf" ]; then
  bash "$root/.gpu/synthetic.sh" >"$logs/synthetic-models.log" 2>&1 || note "gpu_check: remaking the synthetic test models failed"
fi
export EMBER_PLUGIN_DIR="$b/capi"
export EMBER_HOME="${EMBER_HOME:-$work/home}"
mkdir -p "$EMBER_HOME"

gpu=1
if ! nvidia-smi -L >/dev/null 2>&1; then
  gpu=0
  nodev="gpu_check: no NVIDIA GPU here (nvidia-smi -L failed): the GPU steps below are skipped; this is a dry run"
fi

# ---- llama.cpp: carried binaries, or its source built in the background (16 cores there)
llama_dir="$work/llama"
mkdir -p "$llama_dir"
if [ -d "$root/.gpu/llama" ]; then
  for f in "$root"/.gpu/llama/*.xz; do
    case "$f" in
      */src.tar.xz)
        if [ ! -x "$llama_dir/build/bin/llama-bench" ] && [ ! -f "$llama_dir/building" ] && ((gpu)); then
          touch "$llama_dir/building"
          tar -C "$llama_dir" -xJf "$f"
          setsid nohup bash -c "cd '$llama_dir' && cmake -S llama.cpp -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DGGML_NATIVE=ON \
            -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF && nice -n 10 ninja -C build -j14 llama-bench llama-batched-bench llama-perplexity; \
            echo \$? > built; rm -f building" >"$llama_dir/build.log" 2>&1 </dev/null &
        fi ;;
      *) mkdir -p "$llama_dir/build/bin"; xz -dc "$f" >"$llama_dir/build/bin/$(basename "$f" .xz)"
         chmod +x "$llama_dir/build/bin/$(basename "$f" .xz)" ;;
    esac
  done
fi

# ---- SmolLM2 from two carried halves (the machine stays warm between calls)
smol="$EMBER_HOME/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$root/.gpu/smollm2.part" ] && [ ! -s "$smol" ]; then
  read -r p sha size <"$root/.gpu/smollm2.sha256"
  cp "$root/.gpu/smollm2.part" "$work/smollm2.part$p"
  echo "$sha $size" >"$work/smollm2.sha256"
  if [ -f "$work/smollm2.partA" ] && [ -f "$work/smollm2.partB" ]; then
    cat "$work/smollm2.partA" "$work/smollm2.partB" >"$smol.tmp"
    if [ "$(sha256sum "$smol.tmp" | cut -d' ' -f1)" = "$sha" ]; then
      mv "$smol.tmp" "$smol"
      note "gpu_check: SmolLM2 joined from its two halves (sha256 ok)"
    else
      note "gpu_check: SmolLM2 halves joined to a wrong sha256; not used"
      rm -f "$smol.tmp"
    fi
  else
    note "gpu_check: SmolLM2 half $p stashed in $work (the other half comes with the next call)"
  fi
fi

# ---- env, and whether there is a GPU at all
step env 30 bash -c 'nvidia-smi; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv;
  nvcc --version | tail -2; compute-sanitizer --version | head -2; nproc; free -g | head -2; df -h / | tail -1;
  ldd "$0"/capi/libember_cuda.so; ldd "$0"/tests/test_integration | grep -i "not found" || true' "$b"
((gpu)) || note "$nodev"

# The suites as they are, every engine on the GPU; sharded over processes (one GPU, many contexts).
suite() {
  local name="$1" bin="$2" shards="$3" limit="$4" pids=() i
  shift 4
  local graphs=0
  [[ $name == *graphs* ]] && graphs=1
  if late; then note "| $name | SKIP | 0s | out of time (--deadline $deadline) |"; return 0; fi
  for ((i = 0; i < shards; i++)); do
    (GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i EMBER_FORCE_DEVICE=cuda EMBER_CUDA_GRAPHS=$graphs \
       timeout -k 5 "$limit" "$bin" "$@" \
       >"$logs/$name-$i.log" 2>&1; echo $? >"$logs/$name-$i.rc") &
    pids+=($!)
  done
  wait "${pids[@]}"
  cat "$logs/$name"-*.log >"$logs/$name.log"
  local bad=0 crashed=""
  for ((i = 0; i < shards; i++)); do
    local rc
    rc="$(cat "$logs/$name-$i.rc")"
    [ "$rc" = 0 ] || bad=1
    ((rc == 124)) && crashed="$crashed shard $i timed out;"
    ((rc > 128)) && crashed="$crashed shard $i died of signal $((rc - 128));"
  done
  local passed failed_tests
  passed=$(grep -c '^\[       OK \]' "$logs/$name.log")
  failed_tests=$(grep '^\[  FAILED  \] [A-Za-z]' "$logs/$name.log" | grep -v ' tests\?, listed below' | sed 's/^\[  FAILED  \] //; s/ (.*//' | sort -u | tr '\n' ' ')
  if ((bad)); then
    note "| $name | FAIL | | $passed passed;${crashed} failed: $failed_tests |"
  else
    note "| $name | PASS | | $passed passed |"
  fi
  pack
  return $bad
}

run_synthetic() {
  step host 120 "$b/tests/unit/backend/test_backend" --gtest_filter='GpuLayout.*:Plugin.*'
  if ((!gpu)); then
    step ops-dry 60 env EMBER_TEST_BACKENDS=cuda "$b/tests/unit/backend/test_backend" --gtest_filter='*BackendOps*'
    grep -m1 -o 'no NVIDIA driver[^"]*\|no CUDA-capable[^"]*' "$logs/ops-dry.log" | head -1 | sed 's/^/  the plugin says: /' | tee -a "$summary"
    for s in ops san-memcheck san-racecheck san-synccheck san-initcheck verify bench-8b; do skip "$s" "no GPU"; done
    return
  fi
  # The 8B files take a while to write: start them now (CPU only).
  local types8="q4_0 q4_k_m f16" makers=()
  ((quick || !bench)) && types8="q4_0"
  for t in $types8; do
    local f="$work/models/l3-8b-$t.gguf"
    [ -s "$f" ] || { (nice -n 5 "$b/tools/make_synthetic_model" --preset llama3-8b --type "$t" --out "$f.tmp" \
                      >"$logs/make-8b-$t.log" 2>&1 && mv "$f.tmp" "$f") & makers+=($!); }
  done
  step ops 180 env EMBER_TEST_BACKENDS=cuda "$b/tests/unit/backend/test_backend" --gtest_filter='*BackendOps*'
  if grep -q 'SKIPPED.*cuda' "$logs/ops.log"; then
    note "  ops: some cuda cases were SKIPPED (see logs/ops.log)"; failed=1
  fi
  # The sanitizers run side by side (their slow kernels leave the GPU idle most of the time).
  local pids=()
  for tool in memcheck racecheck synccheck initcheck; do
    local extra=()
    [ $tool = memcheck ] && extra=(--leak-check full)
    step "san-$tool" 150 env EMBER_TEST_BACKENDS=cuda compute-sanitizer --tool $tool "${extra[@]}" \
      --error-exitcode 42 --print-limit 20 "$b/tests/unit/backend/test_backend" --gtest_filter='*BackendOps*cuda' &
    pids+=($!)
  done
  # Meanwhile: every weight type on a SmolLM2-shaped synthetic file, GPU vs CPU.
  local types="q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k q4_k_m f16 bf16 f32"
  ((quick)) && types="q4_1 q4_k_m f16"
  step verify 200 bash -c 'set -o pipefail; bad=""; for t in $2; do echo "== $t"
      shape=(); case $t in q*_k*) shape=(--embd 768 --ff 2048 --heads 12 --kv-heads 4) ;; esac  # K-quants: multiples of 256
      "$0"/tools/make_synthetic_model --preset smollm2-135m "${shape[@]}" --type $t --out "$1/syn-$t.gguf" \
        --verify-device cuda 2>&1 |
        tail -6 || bad="$bad $t"; rm -f "$1/syn-$t.gguf"; done; echo "failed types:${bad:- none}"; [ -z "$bad" ]' \
    "$b" "$work/models" "$types"
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  if ((crash_check)); then
    # The C ABI suite on a synthetic SmolLM2-shaped file standing in for the real one: tests
    # that read the real model's text fail by design; what counts is that no shard dies.
    mkdir -p "$work/synhome"
    "$b/tools/make_synthetic_model" --preset smollm2-135m --type q4_1 \
      --out "$work/synhome/SmolLM2-135M-Instruct.Q4_1.gguf" >/dev/null 2>&1
    EMBER_HOME="$work/synhome" suite capi-synthetic "$b/tests/test_capi" 8 150
    grep -q "died of signal\|timed out" "$summary" && failed=1
  fi
  for p in "${makers[@]}"; do wait "$p"; done
  if ((profile)) && [ -s "$work/models/l3-8b-q4_0.gguf" ]; then
    # Where a batch-1 decode step's time goes: every kernel of two eager steps, with its DRAM throughput.
    step profile-8b-q4_0 150 ncu --clock-control none --launch-skip 3000 --launch-count 600 \
      --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      "$b/gpu/bench_cuda" --model "$work/models/l3-8b-q4_0.gguf" --ctx 512 --prefill 64 --batches 1 --steps 8 --graphs off
  fi
  ((bench)) || return 0
  for t in $types8; do
    local f="$work/models/l3-8b-$t.gguf"
    if [ ! -s "$f" ]; then skip "bench-8b-$t" "file not made (logs/make-8b-$t.log)"; continue; fi
    step "bench-8b-$t" 150 "$b/gpu/bench_cuda" --model "$f" --ctx 512 --prefill 512 --batches 1,8,32,64 \
      --json "$logs/bench-8b-$t.json"
  done
  [ -s "$work/models/l3-8b-q4_0.gguf" ] && step bench-8b-q4_0-invariant 120 "$b/gpu/bench_cuda" \
    --model "$work/models/l3-8b-q4_0.gguf" --ctx 512 --prefill 512 --batches 1,32 --graphs on --batch-invariant on
}

run_real() {
  if [ ! -s "$smol" ]; then
    skip real "SmolLM2 not in $EMBER_HOME (carry both halves: tools/gpu_bundle.sh --part A, then --part B)"
    return
  fi
  if ((!gpu)); then
    for s in capi integration agree-smollm2 bench-smollm2 engine-bench; do skip "$s" "no GPU"; done
    return
  fi
  # The two suites and the agreement check side by side (correctness, not timing).
  local text="$work/text.txt" p1 p2
  [ -f "$text" ] || text="$root/README.md"
  suite capi "$b/tests/test_capi" 8 "$((quick ? 120 : 180))" & p1=$!
  suite integration "$b/tests/test_integration" 12 "$((quick ? 150 : 200))" & p2=$!
  step agree-smollm2 120 "$b/gpu/bench_cuda" --model "$smol" --agree 512 --text "$text" --gen 128
  wait $p1 || failed=1
  wait $p2 || failed=1
  step bench-smollm2 120 "$b/gpu/bench_cuda" --model "$smol" --ctx 512 --prefill 512 --batches 1,8,32,64 \
    --json "$logs/bench-smollm2.json"
}

run_real_engine() {
  [ -s "$smol" ] && ((gpu)) || return 0
  # The engine with CUDA graphs for decode steps (EMBER_CUDA_GRAPHS=1) must give eager's tokens.
  local prompt="The three most useful things to know about GPUs are"
  step engine-generate-eager 60 env EMBER_FORCE_DEVICE=cuda EMBER_CUDA_GRAPHS=0 "$b/apps/cli/ember" generate \
    -m "$smol" -n 128 --temp 0 -p "$prompt"
  step engine-generate-graphs 60 env EMBER_FORCE_DEVICE=cuda EMBER_CUDA_GRAPHS=1 "$b/apps/cli/ember" generate \
    -m "$smol" -n 128 --temp 0 -p "$prompt"
  if cmp -s "$logs/engine-generate-eager.log" "$logs/engine-generate-graphs.log"; then
    note "| engine-graphs-equal-eager | PASS | | 128 greedy tokens identical |"
  else
    note "| engine-graphs-equal-eager | FAIL | | outputs differ (logs/engine-generate-*.log) |"; failed=1
  fi
  suite streaming-graphs "$b/tests/test_integration" 8 90 --gtest_filter='Streaming.*:Batching*:Engine*'
  for s in 1 32; do
    for g in 0 1; do
      step "engine-bench-smollm2-s$s-g$g" 90 env EMBER_FORCE_DEVICE=cuda EMBER_CUDA_GRAPHS=$g "$b/apps/cli/ember" \
        bench -m "$smol" -p 512 -n 128 -r 2 --sessions $s --json
    done
  done
  [ -s "$work/models/l3-8b-q4_0.gguf" ] && step engine-bench-8b-q4_0-s32 120 env EMBER_FORCE_DEVICE=cuda EMBER_CUDA_GRAPHS=1 \
    "$b/apps/cli/ember" bench -m "$work/models/l3-8b-q4_0.gguf" -p 512 -n 64 -r 1 --sessions 32 --json
}

run_llama() {
  local bin="$llama_dir/build/bin"
  if ((!gpu)); then skip llama "no GPU"; return; fi
  if [ -f "$llama_dir/building" ]; then
    note "gpu_check: llama.cpp still building; waiting up to 150 s"
    for _ in $(seq 150); do [ -f "$llama_dir/building" ] || break; sleep 1; done
  fi
  if [ ! -x "$bin/llama-bench" ]; then
    skip llama "no llama.cpp CUDA build (logs: $llama_dir/build.log)"
    [ -f "$llama_dir/build.log" ] && tail -30 "$llama_dir/build.log" >"$logs/llama-build.log"
    return
  fi
  # llama.cpp's own GPU-vs-CPU agreement on SmolLM2 (the reference for Ember's, agree-smollm2):
  # logits of its CPU build (-dev none) saved, then KL and same-top-1 of its CUDA build against them.
  if [ -x "$bin/llama-perplexity" ] && [ -s "$smol" ] && [ -s "$work/text.txt" ]; then
    step llama-kld-cpu 150 "$bin/llama-perplexity" -m "$smol" -f "$work/text.txt" -c 512 --chunks 4 -dev none \
      --kl-divergence-base "$work/smol-cpu.kld"
    [ -s "$work/smol-cpu.kld" ] && step llama-kld-cuda 120 "$bin/llama-perplexity" -m "$smol" -c 512 --chunks 4 \
      -ngl 99 --kl-divergence-base "$work/smol-cpu.kld" --kl-divergence
  fi
  local models=() t
  for t in q4_0 q4_k_m f16; do [ -s "$work/models/l3-8b-$t.gguf" ] && models+=("$work/models/l3-8b-$t.gguf"); done
  [ -s "$smol" ] && models+=("$smol")
  for m in "${models[@]}"; do
    local n
    n="$(basename "$m" .gguf)"
    step "llama-bench-$n" 120 "$bin/llama-bench" -m "$m" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md
    [ -x "$bin/llama-batched-bench" ] && step "llama-batched-$n" 150 "$bin/llama-batched-bench" -m "$m" -ngl 99 \
      -fa on -c 40960 -b 2048 -ub 512 -npp 512 -ntg 64 -npl 1,8,32,64
  done
}

case "$phase" in
  synthetic) run_synthetic ;;
  real) run_real; run_llama; run_real_engine ;;
  all) run_synthetic; run_real; run_llama; run_real_engine ;;
  *) echo "gpu_check: --phase all|synthetic|real" >&2; exit 2 ;;
esac
note "gpu_check: done in $(($(date +%s) - t0)) s; failed=$failed gpu=$gpu"
pack
((gpu)) || exit 2
exit $failed
