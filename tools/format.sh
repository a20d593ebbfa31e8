#!/usr/bin/env bash
# Formats Ember's C, C++ and CUDA sources with clang-format (.clang-format at
# the root). --check: report files that differ and exit 1, change nothing.
# Generated code (build trees, SWIG output) and vendored data are not touched.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
fmt="$(command -v clang-format || command -v clang-format-14 || true)"
[ -n "$fmt" ] || { echo "format: clang-format not found (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files -- '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh' '*.inc' | grep -v '^tests/golden/')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! "$fmt" --style=file "$f" | cmp -s - "$f"; then echo "format: $f differs"; bad=1; fi
  done
  exit $bad
fi
"$fmt" --style=file -i "${files[@]}"
