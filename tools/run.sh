#!/usr/bin/env bash
# The main job on a fresh machine: installs what is missing, builds, fetches
# the default model, then runs `ember` with the given arguments
# (default: an interactive chat).
#   bash tools/run.sh                       # chat
#   bash tools/run.sh generate -p "Hello" --chat -n 64
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh" build >&2
if [ $# -eq 0 ]; then set -- chat; fi
exec "$root/build/apps/cli/ember" "$@"
