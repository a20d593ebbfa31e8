#!/usr/bin/env bash
# Builds the Python package's sdist and wheel (bindings/python) into DIST
# (default dist/python), offline (pip --no-index --no-build-isolation):
#
#   bash tools/package_python.sh [DIST]
#   pip install DIST/ember-*.whl            # anywhere: the wheel carries libember
#   pip install DIST/ember-*.tar.gz         # builds libember from the sdist's source
#
# sdist: bindings/python plus, under ember_src/, the part of the source tree
#   that libember's CMake build reads (CMakeLists.txt, cmake, core, cpu, capi,
#   include, gpu, tools, apps, bindings/ember.i) and XGrammar's source when
#   tools/fetch_xgrammar.sh fetched it, so installing the sdist builds
#   libember itself (bindings/python/setup.py: CMake, only the `ember` target,
#   tests, benchmarks, bindings, CUDA and oneDNN off).
# wheel: built by pip from that sdist; ember/_emberc*.so next to
#   ember/libember.so.1, found through RPATH $ORIGIN (checked here with
#   readelf, and every library they need must resolve).
# EMBER_LIB_DIR: a built libember to put in the wheel instead of building one
#   from the sdist (quick; e.g. build/capi: the wheel then also needs what that
#   libember links, such as Debian's libdnnl3). PYTHON: the interpreter
#   (default: python3 when it has setuptools and wheel, else /usr/bin/python3;
#   Debian: python3-setuptools python3-wheel). Needs swig; without
#   EMBER_LIB_DIR also cmake and a C++20 compiler.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dist="$(mkdir -p "${1:-$root/dist/python}" && cd "${1:-$root/dist/python}" && pwd)"
py="${PYTHON:-python3}"
if ! "$py" -c "import setuptools, wheel" 2>/dev/null; then
  py=/usr/bin/python3
  "$py" -c "import setuptools, wheel" || { echo "package_python: needs setuptools and wheel" >&2; exit 1; }
fi
version="$(sed -n 's/^#define EMBER_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$root/include/ember/ember.h" |
           paste -sd.)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ember_pkg_python.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
stage="$tmp/ember-$version"
mkdir -p "$stage/ember_src"

# The package, then the source tree (tracked and new files, as git lists them;
# a plain copy where this is not a git checkout).
cp -r "$root/bindings/python/setup.py" "$root/bindings/python/pyproject.toml" "$root/bindings/python/MANIFEST.in" \
  "$root/bindings/python/ember" "$stage/"
find "$stage/ember" -name __pycache__ -prune -exec rm -rf {} +
parts=(CMakeLists.txt cmake core cpu capi include gpu tools apps bindings/ember.i)
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -co --exclude-standard -- "${parts[@]}" |
     while IFS= read -r f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
     xargs -0 cp --parents -t "$stage/ember_src")
else
  (cd "$root" && cp -r --parents "${parts[@]}" "$stage/ember_src")
fi
xg_version="$(sed -n 's/^set(EMBER_XGRAMMAR_VERSION \(.*\))/\1/p' "$root/cmake/EmberXgrammar.cmake")"
xg="${EMBER_HOME:-$HOME/.cache/ember}/deps/xgrammar-$xg_version"
if [ -f "$xg/include/xgrammar/xgrammar.h" ]; then
  mkdir -p "$stage/ember_src/deps"
  cp -r "$xg" "$stage/ember_src/deps/"
else
  echo "package_python: no XGrammar source at $xg (tools/fetch_xgrammar.sh): the sdist builds without it" >&2
fi

echo "--- sdist" >&2
rm -f "$dist"/ember-"$version".tar.gz "$dist"/ember-"$version"-*.whl
(cd "$stage" && "$py" setup.py -q sdist -d "$dist" >"$tmp/sdist.log" 2>&1) || { cat "$tmp/sdist.log" >&2; exit 1; }
sdist="$dist/ember-$version.tar.gz"
tar -tzf "$sdist" | grep "ember-$version/ember_src/capi/CMakeLists.txt" >/dev/null || {
  echo "package_python: the sdist lacks the source tree" >&2; exit 1; }

echo "--- wheel (from the sdist${EMBER_LIB_DIR:+, libember from $EMBER_LIB_DIR})" >&2
start=$SECONDS
"$py" -m pip wheel -q --no-deps --no-index --no-build-isolation -w "$dist" "$sdist"
echo "package_python: wheel built in $((SECONDS - start)) s" >&2
wheel="$(ls "$dist"/ember-"$version"-*.whl)"

# The wheel's libraries: _emberc finds libember.so.1 through $ORIGIN, and
# everything either needs resolves.
mkdir -p "$tmp/wheel"
"$py" -m zipfile -e "$wheel" "$tmp/wheel"
ext="$(ls "$tmp"/wheel/ember/_emberc*.so)"
lib="$tmp/wheel/ember/libember.so.1"
[ -f "$lib" ] || { echo "package_python: the wheel lacks ember/libember.so.1" >&2; exit 1; }
readelf -d "$ext" | grep -E 'R(UN)?PATH' | grep '\[\$ORIGIN\]' >/dev/null ||
  { readelf -d "$ext" >&2; echo "package_python: _emberc's RPATH is not \$ORIGIN" >&2; exit 1; }
readelf -d "$ext" | grep 'NEEDED.*\[libember\.so\.1\]' >/dev/null ||
  { echo "package_python: _emberc does not need libember.so.1" >&2; exit 1; }
for so in "$ext" "$lib"; do
  if env -u LD_LIBRARY_PATH ldd "$so" | grep "not found" >/dev/null; then
    ldd "$so" >&2; echo "package_python: unresolved libraries in $(basename "$so")" >&2; exit 1
  fi
done
[ "$(env -u LD_LIBRARY_PATH ldd "$ext" | awk '$1 == "libember.so.1" { print $3 }')" = "$lib" ] ||
  { echo "package_python: _emberc does not load the wheel's libember" >&2; exit 1; }
readelf -d "$ext" | grep -E 'NEEDED|R(UN)?PATH' >&2
echo "$sdist"
echo "$wheel"
