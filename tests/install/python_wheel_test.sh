#!/usr/bin/env bash
# The Python wheel and sdist (tools/package_python.sh), with this build's
# libember (EMBER_LIB_DIR: no second libember build): the script checks the
# sdist carries the source tree and the wheel's RPATH ($ORIGIN, readelf);
# then the wheel is installed into a fresh venv (no system site packages, no
# index) and used from another directory: its greedy reply must equal the C
# API's, with the package's own libember loaded.
#   python_wheel_test.sh SOURCE_DIR LIB_DIR PYTHON
set -euo pipefail
src=$1 lib=$2 py=$3
# shellcheck source=packages/common.sh
. "$src/tests/install/packages/common.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ember_wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The interpreter that builds the wheel is the one that installs it (its tag).
"$py" -c "import setuptools, wheel" 2>/dev/null || py=/usr/bin/python3

echo "--- tools/package_python.sh (EMBER_LIB_DIR=$lib)"
env -u EMBER_SOURCE_DIR EMBER_LIB_DIR="$lib" PYTHON="$py" bash "$src/tools/package_python.sh" "$tmp/dist" \
  >"$tmp/paths" || fail "package_python.sh"
sdist=$(sed -n 1p "$tmp/paths") wheel=$(sed -n 2p "$tmp/paths")
[ -f "$sdist" ] && [ -f "$wheel" ] || fail "no sdist or wheel: $(cat "$tmp/paths")"
tar -tzf "$sdist" | grep '/ember_src/core/engine/engine.cpp$' >/dev/null || fail "the sdist lacks core/"
tar -tzf "$sdist" | grep '/ember_src/bindings/ember.i$' >/dev/null || fail "the sdist lacks bindings/ember.i"
echo "sdist $(basename "$sdist"): $(tar -tzf "$sdist" | wc -l) files; wheel $(basename "$wheel")"

echo "--- pip install the wheel into a fresh venv"
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-index "$wheel" || fail "pip install $wheel"
find_model
mkdir "$tmp/elsewhere" && cd "$tmp/elsewhere"
check_greedy "wheel" env -u PYTHONPATH -u LD_LIBRARY_PATH "$tmp/venv/bin/python" \
  "$src/tests/install/packages/greedy.py" "$model" "$PACKAGE_TOKENS" "$PACKAGE_PROMPT" "$(dirname "$lib")"
echo PASS
