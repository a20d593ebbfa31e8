#!/usr/bin/env bash
# Runs every test: installs what is missing, fetches the model, builds
# (Release) and runs the whole CTest suite (the pre-AVX2 CPU test under qemu,
# label isa, included), then rebuilds the C ABI and core tests with
# ASan+UBSan and runs them, then a short run of every fuzz target
# (tools/fuzz.sh, EMBER_FUZZ_SECONDS each, default 30; EMBER_SKIP_FUZZ=1 skips).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# ctest runs two test processes at once on 2 cores: OpenMP threads that spin
# at barriers would then starve each other (50x slowdowns seen), so they sleep.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# Weight pages the CPU backend released after packing are also made
# inaccessible, so any reader that forgot its gguf::ImagePin faults in the
# tests instead of reading zeros (core/gguf/gguf.h).
export EMBER_DEBUG_RELEASED_PAGES="${EMBER_DEBUG_RELEASED_PAGES:-1}"
bash "$root/tools/setup.sh"
# Every binding must build and be tested (ON: a missing toolchain fails the configure).
# (Tests and benchmarks ON: a build/ first configured by tools/run.sh has them OFF.)
bash "$root/tools/build.sh" build -DEMBER_WERROR=ON -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_BENCH=ON \
  -DEMBER_BUILD_BINDINGS=ON -DEMBER_BINDINGS_PYTHON=ON -DEMBER_BINDINGS_JAVA=ON -DEMBER_BINDINGS_CSHARP=ON -DEMBER_BINDINGS_GO=ON
(cd "$root/build" && ctest --output-on-failure -j 2 --timeout 900)
# A short soak (docs/RELIABILITY.md, section 3): 200 random requests from 64
# threads on a KV pool small enough to preempt; greedy outputs must equal
# their solo runs (about 30 s).
"$root/build/bench/soak" --requests 200 --concurrency 64
# Sanitizer passes. ASan+UBSan: the C ABI and core tests, every one of them,
# and `ember serve` under the openai-client suite (leaks: each server must exit 0);
# the concurrency tests at a reduced size (EMBER_TEST_REDUCED=1: fewer
# threads, tokens and iterations, the same checks), which keeps the pass
# within minutes on 2 cores. TSan: the C ABI tests (each drives the engine's
# worker thread from the caller's; tests/capi/concurrency_test.cpp many
# threads at once), with tests/capi/tsan.supp, at the reduced size too
# (EMBER_TSAN_REDUCED=0 runs the full size: ~40 min on 2 cores). Not the
# tool-calling tests: 90-210 s each under TSan on an Ice Lake VM (grammar
# compilation), no threads of their own, and run by the main and ASan runs. Both without oneDNN
# (EMBER_WITH_ONEDNN=OFF: that build configuration is checked here too).
if [ "${EMBER_SKIP_SANITIZERS:-0}" != "1" ]; then
  bash "$root/tools/build.sh" build-asan -DEMBER_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DEMBER_WITH_CUDA=OFF -DEMBER_BUILD_BENCH=OFF -DEMBER_BUILD_BINDINGS=OFF -DEMBER_WITH_ONEDNN=OFF
  (cd "$root/build-asan" && EMBER_TEST_REDUCED=1 ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j 2 \
     --timeout 1800 -L 'test_capi|test_core|test_kv_cache|test_gguf|test_tokenizer|test_chat|test_tensor|test_server|server_openai' \
     ${EMBER_ASAN_EXCLUDE:+-E "$EMBER_ASAN_EXCLUDE"})
  cmake -S "$root" -B "$root/build-tsan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_TSAN=ON \
    -DEMBER_WITH_CUDA=OFF -DEMBER_BUILD_BENCH=OFF -DEMBER_BUILD_BINDINGS=OFF -DEMBER_WITH_ONEDNN=OFF >/dev/null
  cmake --build "$root/build-tsan" -j "$(nproc)" --target test_capi
  (cd "$root/build-tsan" && EMBER_TEST_REDUCED="${EMBER_TSAN_REDUCED:-1}" ctest --output-on-failure -j 2 \
     --timeout 1800 -L test_capi -E '_NOT_BUILT|capi_exported_symbols|CapiToolCalling')
fi
# The fuzz runs start from the committed seeds with a fixed mutation seed
# (EMBER_FUZZ_SEED, default 1): on a clean checkout a commit's fuzz run then
# tries the same inputs in the same order (as far as its minute reaches, and
# up to the engine's thread timing in the coverage), so a run of this script
# before a submission predicts the CI's. Exploring is the long campaigns' job
# (tools/fuzz.sh with a random seed, docs/RELIABILITY.md); this run replays the
# seeds and reproducers and mutates from them for half a minute per target.
if [ "${EMBER_SKIP_FUZZ:-0}" != "1" ]; then
  EMBER_FUZZ_SEED="${EMBER_FUZZ_SEED:-1}" EMBER_FUZZ_SKIP_SETUP=1 bash "$root/tools/fuzz.sh" "${EMBER_FUZZ_SECONDS:-30}"
fi
