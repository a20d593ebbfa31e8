#!/usr/bin/env bash
# Regenerates the committed seed corpora (tests/fuzz/corpus/<target>) with the
# fuzz targets themselves (EMBER_FUZZ_WRITE_SEEDS, see tests/fuzz/fuzz_util.h):
#   tests/fuzz/make_corpus.sh [target...]   (after tools/fuzz.sh has built build-fuzz/; default: all)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
targets=("$@")
((${#targets[@]})) || targets=(gguf tokenizer chat tools session spec grammar server)
for t in "${targets[@]}"; do
  dir="$root/tests/fuzz/corpus/$t"
  rm -rf "$dir"
  mkdir -p "$dir"
  EMBER_FUZZ_WRITE_SEEDS="$dir" "$root/build-fuzz/tests/fuzz/fuzz_$t"
done
