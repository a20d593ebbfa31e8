#!/usr/bin/env bash
# Runs one of the server's Python tests under the venv tools/setup.sh makes
# ($EMBER_HOME/servervenv: the official `openai` client and jsonschema).
#   bash run_python_test.sh TEST.py EMBER_CLI [ARGS...]
set -euo pipefail
venv="${EMBER_HOME:-$HOME/.cache/ember}/servervenv"
if ! "$venv/bin/python" -c "import openai, jsonschema" 2>/dev/null; then
  echo "run_python_test: $venv lacks openai/jsonschema: run bash tools/setup.sh" >&2
  exit 1
fi
test="$1"
shift
exec "$venv/bin/python" "$(dirname "${BASH_SOURCE[0]}")/$test" "$@"
