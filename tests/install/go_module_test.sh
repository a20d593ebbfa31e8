#!/usr/bin/env bash
# The Go module as installed: `cmake --install` into a temporary prefix puts
# the module (with its SWIG package) in PREFIX/share/ember/go and ember.pc in
# PREFIX/lib/pkgconfig. A program in a clean directory (go.mod: require
# ember, replace ember => the installed module) is built with cgo against
# them through `#cgo pkg-config: ember` alone (PKG_CONFIG_PATH; no CGO_CFLAGS,
# no -L), offline (GOFLAGS=-mod=mod, GOPROXY=off, a fresh GOPATH and cache),
# and run: it must load the installed libember and reply as the C API does.
#   go_module_test.sh BUILD_DIR SOURCE_DIR [CMAKE] [GO]
set -euo pipefail
build=$1 src=$2 cmake=${3:-cmake} go=${4:-go}
# shellcheck source=packages/common.sh
. "$src/tests/install/packages/common.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ember_go_module.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "install"; }
module=$prefix/share/ember/go
[ -f "$module/go.mod" ] && [ -f "$module/internal/emberc/emberc.go" ] || fail "no Go module in $module"
grep -q '#cgo pkg-config: ember' "$module/internal/emberc/cgo.go" || fail "the module does not use pkg-config"
pc=$(find "$prefix" -name ember.pc)
libdir=$(dirname "$(dirname "$pc")")

mkdir "$tmp/app"
cp "$src/tests/install/packages/go/main.go" "$src/tests/install/packages/go/go.mod" "$tmp/app/"
cd "$tmp/app"
export GOFLAGS=-mod=mod GOPROXY=off GO111MODULE=on CGO_ENABLED=1 GOTOOLCHAIN=local GOPATH=$tmp/gopath \
  GOCACHE=$tmp/gocache PKG_CONFIG_PATH=$libdir/pkgconfig
unset CGO_CFLAGS CGO_CPPFLAGS
# Only the run-time search path: where libember is found at build time is ember.pc's business.
export CGO_LDFLAGS="-Wl,-rpath,$libdir"
"$go" mod edit -replace "ember=$module"
start=$SECONDS
"$go" build -o greedy . || fail "go build against the installed module"
echo "go build: $((SECONDS - start)) s"
loaded=$(ldd greedy | awk '$1 == "libember.so.1" { print $3 }')
[ "$(readlink -f "$loaded")" = "$(readlink -f "$libdir/libember.so.1")" ] || fail "greedy loads [$loaded], not $libdir"
find_model
check_greedy "Go module" env -u LD_LIBRARY_PATH ./greedy "$model" "$PACKAGE_TOKENS" "$PACKAGE_PROMPT"
echo PASS
