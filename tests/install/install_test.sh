#!/usr/bin/env bash
# The install, end to end: `cmake --install` into a temporary prefix (then
# moved elsewhere), then examples/c built against the installed tree alone,
# twice, and run:
#   1. a CMake project using find_package(Ember) (tests/install/consumer);
#   2. cc $(pkg-config --cflags --libs ember).
# Each build's header_c99 (links libember) must resolve libember inside the
# prefix and pass; each chat (dlopen()s the installed libember) must reply
# with the default model. Without the model the chats are skipped (exit 77
# once everything else passed), unless $CI is set.
#   install_test.sh BUILD_DIR SOURCE_DIR [CMAKE]
set -euo pipefail
build=$1
src=$2
cmake=${3:-cmake}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ember_install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "FAIL: $*"; exit 1; }

echo "--- cmake --install $build --prefix $tmp/staged, then moved to $prefix"
"$cmake" --install "$build" --prefix "$tmp/staged" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "install"; }
# The tree must work where it is moved to: EmberConfig.cmake, ember.pc and the
# CLI's RPATH locate it from their own place.
mv "$tmp/staged" "$prefix"
pc=$(find "$prefix" -name ember.pc)
[ -n "$pc" ] || fail "no ember.pc installed"
libdir=$(dirname "$(dirname "$pc")")
for f in "$prefix/include/ember/ember.h" "$prefix/include/ember/ember.hpp" "$libdir/libember.so" \
         "$libdir/libember.so.1" "$libdir/cmake/Ember/EmberConfig.cmake" \
         "$libdir/cmake/Ember/EmberConfigVersion.cmake" "$libdir/cmake/Ember/EmberTargets.cmake" "$prefix/bin/ember"; do
  [ -e "$f" ] || fail "not installed: ${f#"$prefix"/}"
done

# The libember.so.1 a program loads, as a canonical path ("" if none).
loaded_libember() {
  local p
  p=$(ldd "$1" | awk '$1 == "libember.so.1" { print $3 }')
  [ -n "$p" ] && readlink -f "$p"
}
installed_lib=$(readlink -f "$libdir/libember.so.1")

# The installed CLI finds the installed library (relative RPATH).
"$prefix/bin/ember" --version | grep -q "^ember [0-9]" || fail "installed bin/ember --version"
[ "$(loaded_libember "$prefix/bin/ember")" = "$installed_lib" ] || fail "bin/ember does not load $installed_lib"

# chat.c's list of public symbols, as examples/c/CMakeLists.txt makes it.
mkdir -p "$tmp/gen"
grep -E '^ember_[a-z0-9_]+$' "$src/capi/ember.symbols" | sed 's/.*/"&",/' >"$tmp/gen/ember_symbols.inc"

model="${EMBER_MODEL:-${EMBER_HOME:-$HOME/.cache/ember}/SmolLM2-135M-Instruct.Q4_1.gguf}"
have_model=1
if [ ! -f "$model" ]; then
  [ -n "${CI:-}" ] && fail "model missing: $model (CI is set)"
  have_model=0
fi

# Runs one build's two programs. $1: what built them, $2: their directory.
check_programs() {
  local how=$1 dir=$2 rc=0
  [ "$(loaded_libember "$dir/header_c99")" = "$installed_lib" ] ||
    fail "$how: header_c99 does not load $installed_lib: $(ldd "$dir/header_c99" | grep libember)"
  "$dir/header_c99" || fail "$how: header_c99"
  if [ "$have_model" = 1 ]; then
    "$dir/chat" -m "$model" -n 8 -p "Say hello in one short sentence." >"$tmp/reply" 2>"$tmp/chat.err" || rc=$?
    [ "$rc" = 0 ] || { cat "$tmp/chat.err"; fail "$how: chat exited with $rc"; }
    grep -q "chat: libember" "$tmp/chat.err" || fail "$how: chat did not report the library"
    grep -q '[^[:space:]]' "$tmp/reply" || fail "$how: chat printed no reply"
    echo "$how: chat replied: $(tr '\n' ' ' <"$tmp/reply")"
  fi
}

echo "--- find_package(Ember)"
consumer_args=(-S "$src/tests/install/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DEMBER_EXAMPLES_C="$src/examples/c"
               -DEMBER_SYMBOLS_INC_DIR="$tmp/gen" -DCMAKE_BUILD_TYPE=Release)
"$cmake" "${consumer_args[@]}" -B "$tmp/cmake" >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "configure"; }
grep "Ember [0-9]" "$tmp/cmake.log"
"$cmake" --build "$tmp/cmake" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build"; }
check_programs "find_package" "$tmp/cmake"
# The version file: an ABI this library does not provide is refused.
if "$cmake" "${consumer_args[@]}" -B "$tmp/cmake2" -DEMBER_FIND_VERSION=2.0 >"$tmp/cmake2.log" 2>&1; then
  fail "find_package(Ember 2.0) accepted ABI 1"
fi

echo "--- cc \$(pkg-config --cflags --libs ember)"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pkg-config --modversion ember
pc_libdir=$(pkg-config --variable=libdir ember)
mkdir -p "$tmp/pc"
cc=${CC:-cc}
strict=(-std=c99 -Wall -Wextra -Werror -pedantic)
# shellcheck disable=SC2046  # pkg-config's output is meant to be split
"$cc" "${strict[@]}" -o "$tmp/pc/header_c99" "$src/examples/c/header_c99.c" $(pkg-config --cflags --libs ember) \
  -Wl,-rpath,"$pc_libdir" || fail "pkg-config: header_c99"
# shellcheck disable=SC2046
"$cc" "${strict[@]}" -I"$tmp/gen" -DEMBER_DEFAULT_LIBRARY="\"$pc_libdir/libember.so.1\"" -o "$tmp/pc/chat" \
  "$src/examples/c/chat.c" $(pkg-config --cflags --libs ember) -ldl || fail "pkg-config: chat"
check_programs "pkg-config" "$tmp/pc"

if [ "$have_model" = 0 ]; then
  echo "SKIP: the chats (model not found at $model); the rest passed"
  exit 77
fi
echo "PASS"
