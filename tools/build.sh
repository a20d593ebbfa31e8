#!/usr/bin/env bash
# Configures and builds Ember into build/ (Release), or build-$1 with extra
# CMake flags in the remaining arguments. A build dir keeps the options it
# was configured with (CMakeCache.txt): after tools/run.sh (tests, benchmarks
# and bindings OFF) pass -DEMBER_BUILD_TESTS=ON -DEMBER_BUILD_BENCH=ON
# -DEMBER_BUILD_BINDINGS=ON to build them here (tools/test.sh does).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-build}"
shift || true
cmake -S "$root" -B "$root/$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$root/$dir" -j "$(nproc)"
