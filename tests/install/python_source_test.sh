#!/usr/bin/env bash
# `pip install ./bindings/python` from a fresh copy of the repository (the
# files git tracks or would add; no build tree): setup.py must build libember
# itself (CMake, only the `ember` target) before the extension. Offline: a venv
# over an interpreter with setuptools and wheel (Debian: python3-setuptools
# python3-wheel), --no-build-isolation --no-index. Then, from another
# directory, the installed package's greedy reply must equal the C API's.
# $EMBER_CMAKE_ARGS passes through to that build (CTest gives the main
# build's -DEMBER_WERROR/-DEMBER_WITH_ONEDNN so that ccache reuses its objects).
#   python_source_test.sh SOURCE_DIR PYTHON
set -euo pipefail
src=$1 py=$2
# shellcheck source=packages/common.sh
. "$src/tests/install/packages/common.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ember_pip_source.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$py" -c "import setuptools, wheel" 2>/dev/null || py=/usr/bin/python3

echo "--- a fresh copy of $src without a build tree"
mkdir "$tmp/clone"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -co --exclude-standard | while IFS= read -r f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
     xargs -0 cp --parents -t "$tmp/clone")
else  # not a checkout: everything but the build trees
  tar -C "$src" --exclude='./build*' --exclude='./dist' -cf - . | tar -C "$tmp/clone" -xf -
fi
[ ! -e "$tmp/clone/build" ] || fail "the copy has a build tree"

echo "--- pip install ./bindings/python (builds libember)"
"$py" -m venv --system-site-packages "$tmp/venv"
start=$SECONDS
(cd "$tmp/clone" && env -u EMBER_LIB_DIR -u EMBER_SOURCE_DIR -u PYTHONPATH \
   "$tmp/venv/bin/pip" install -v --no-index --no-build-isolation ./bindings/python >"$tmp/pip.log" 2>&1) ||
  { tail -50 "$tmp/pip.log"; fail "pip install ./bindings/python"; }
grep -q "ember: building libember" "$tmp/pip.log" || fail "setup.py did not build libember"
echo "pip install (libember built from source) took $((SECONDS - start)) s"
find_model
mkdir "$tmp/elsewhere" && cd "$tmp/elsewhere"
check_greedy "pip install from source" env -u PYTHONPATH -u LD_LIBRARY_PATH "$tmp/venv/bin/python" \
  "$src/tests/install/packages/greedy.py" "$model" "$PACKAGE_TOKENS" "$PACKAGE_PROMPT" "$tmp/clone"
echo PASS
