#!/usr/bin/env bash
# The main job on a fresh machine: installs only what the `ember` CLI needs
# (tools/setup.sh --minimal: compiler, CMake, oneDNN, nlohmann-json,
# cpp-httplib, ccache; the default model and XGrammar's source), builds only
# the CLI and libember (the ember_cli target; no test, benchmark or binding),
# then runs `ember` with the given arguments (default: an interactive chat).
# tools/test.sh installs and builds the rest.
#   bash tools/run.sh                       # chat
#   bash tools/run.sh generate -p "Hello" --chat -n 64
# EMBER_BUILD_DIR: the build directory (default build/, shared with
# tools/build.sh and tools/test.sh, whose configuration it keeps).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${EMBER_BUILD_DIR:-$root/build}"
bash "$root/tools/setup.sh" --minimal
# Configured once, without tests, benchmarks and bindings (their packages are
# tools/test.sh's); a build dir configured by tools/test.sh keeps its options.
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_BUILD_TESTS=OFF \
    -DEMBER_BUILD_BENCH=OFF -DEMBER_BUILD_BINDINGS=OFF >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target ember_cli >&2
if [ $# -eq 0 ]; then set -- chat; fi
exec "$build/apps/cli/ember" "$@"
