#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang, ASan+UBSan, in build-fuzz/)
# and runs each for N seconds (default 60):
#
#   tools/fuzz.sh [seconds-per-target] [target...]     targets: gguf tokenizer chat tools session spec grammar server
#
# Each target starts from its committed seeds (tests/fuzz/corpus/<target>) and
# the committed crash reproducers (tests/fuzz/regressions/<target>); what it
# learns goes to build-fuzz/corpus/<target> (kept between runs). Limits: 10 s
# per input (-timeout), 2 GiB RSS. A crash, sanitizer report, timeout or
# out-of-memory leaves the input in build-fuzz/artifacts/<target>/ and makes
# the script fail. One line per run is appended to build-fuzz/fuzz-log.tsv
# (date, target, seconds, executions, corpus files, corpus bytes, status).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
secs="${1:-60}"
shift || true
targets=("$@")
explicit=${#targets[@]}
((explicit)) || targets=(gguf tokenizer chat tools session spec grammar server)
bld="$root/build-fuzz"

# fuzz_grammar drives the grammar engine, so the fuzz build includes XGrammar
# when its source is there (tools/setup.sh fetches it; compiled with the
# fuzzer's instrumentation it adds about 2 min to a first build on 2 cores,
# without ccache); without it the build leaves XGrammar and fuzz_grammar out.
# EMBER_FUZZ_SKIP_SETUP=1 / EMBER_FUZZ_SKIP_BUILD=1 skip the setup and the
# build (e.g. for a second run in parallel with one that built).
# EMBER_FUZZ_SEED=N fixes libFuzzer's random seed (tools/test.sh: 1); unset,
# each run draws its own.
[ "${EMBER_FUZZ_SKIP_SETUP:-0}" = "1" ] || bash "$root/tools/setup.sh"
xg_version="$(sed -n 's/^set(EMBER_XGRAMMAR_VERSION \(.*\))$/\1/p' "$root/cmake/EmberXgrammar.cmake")"
xgrammar=OFF
[ -f "${EMBER_HOME:-$HOME/.cache/ember}/deps/xgrammar-$xg_version/include/xgrammar/xgrammar.h" ] && xgrammar=ON
if [ "$xgrammar" = OFF ]; then
  echo "fuzz.sh: no XGrammar source (tools/fetch_xgrammar.sh): building without it, no fuzz_grammar" >&2
  if ((!explicit)); then
    mapfile -t targets < <(printf '%s\n' "${targets[@]}" | grep -vx grammar)
  fi
fi
if [ "${EMBER_FUZZ_SKIP_BUILD:-0}" != "1" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$bld" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_FUZZ=ON \
    -DEMBER_BUILD_TESTS=OFF -DEMBER_BUILD_BENCH=OFF -DEMBER_WITH_CUDA=OFF -DEMBER_WITH_XGRAMMAR=$xgrammar >/dev/null
  cmake --build "$bld" -j "$(nproc)" --target fuzz_all
fi

declare -A max_len=([gguf]=16384 [tokenizer]=4096 [chat]=8192 [tools]=8192 [session]=32768 [spec]=208 [grammar]=8192 [server]=16384)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
# Every UBSan report is fatal except the known ones listed (with their bug) in
# tests/fuzz/ubsan.supp.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/fuzz/ubsan.supp}"
# The engine's OpenMP threads must not spin while the fuzzer waits.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
failed=()
for t in "${targets[@]}"; do
  [ -n "${max_len[$t]:-}" ] || { echo "fuzz.sh: unknown target '$t'" >&2; exit 2; }
  corpus="$bld/corpus/$t" artifacts="$bld/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts" "$root/tests/fuzz/regressions/$t"
  dict=()
  [ -f "$root/tests/fuzz/dict/$t.dict" ] && dict=(-dict="$root/tests/fuzz/dict/$t.dict")
  seed=()
  [ -n "${EMBER_FUZZ_SEED:-}" ] && seed=(-seed="$EMBER_FUZZ_SEED")
  log="$bld/fuzz-$t.log"
  echo "fuzz.sh: $t for ${secs}s (log $log)" >&2
  status=ok
  # The crash reproducers are replayed once, not mutated: some are slow on
  # purpose (a value nested 100,000 deep), and mutating them would take the
  # run's minute.
  mapfile -t repro < <(find "$root/tests/fuzz/regressions/$t" -type f | sort)
  if ((${#repro[@]})); then
    "$bld/tests/fuzz/fuzz_$t" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$artifacts" "${repro[@]}" \
      >"$log" 2>&1 || status=FAILED
  fi
  [ "$status" = ok ] && "$bld/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -max_len="${max_len[$t]}" -print_final_stats=1 -artifact_prefix="$artifacts" "${dict[@]}" "${seed[@]}" \
    "$corpus" "$root/tests/fuzz/corpus/$t" >>"$log" 2>&1 || status=FAILED
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  files=$(find "$corpus" -type f | wc -l)
  bytes=$(find "$corpus" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "$secs" "${execs:-0}" "$files" "$bytes" "$status" \
    >>"$bld/fuzz-log.tsv"
  echo "fuzz.sh: $t: ${execs:-0} executions, corpus $files files / $bytes bytes: $status" >&2
  if [ "$status" != ok ]; then
    failed+=("$t")
    grep -E "ERROR|SUMMARY|fuzz check failed|Test unit written|#[0-9]+ (0x[0-9a-f]+ )?in " "$log" | head -40 >&2 || true
  fi
done
if ((${#failed[@]})); then
  echo "fuzz.sh: FAILED: ${failed[*]} (inputs under $bld/artifacts/)" >&2
  exit 1
fi
