#!/usr/bin/env bash
# Fetches XGrammar's C++ source (the engine behind structured output:
# JSON schema, EBNF/GBNF grammars, regex; Apache-2.0) into
# $EMBER_HOME/deps/xgrammar-<version> (default ~/.cache/ember), where Ember's
# CMake finds it (cmake/EmberXgrammar.cmake builds it as a static library
# with the same compiler and sanitizer flags). Its PyPI sdist carries the whole
# C++ source with its third-party folders; the version and the archive's
# SHA-256 are pinned here. Ember's fixes to it (tools/patches/xgrammar-<version>-*.patch,
# applied in name order with git apply) are part of the stamp, so adding or
# changing one refetches. Idempotent: does nothing when the source is there.
#   bash tools/fetch_xgrammar.sh        # prints the source directory
set -euo pipefail
version="0.2.8"
sha256="8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80"
home="${EMBER_HOME:-$HOME/.cache/ember}"
dest="$home/deps/xgrammar-$version"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
patches=()
for p in "$here"/patches/xgrammar-"$version"-*.patch; do
  [ -f "$p" ] && patches+=("$p")
done
stamp="$sha256"
for p in "${patches[@]}"; do
  stamp="$stamp $(basename "$p"):$(sha256sum "$p" | cut -d' ' -f1)"
done
if [ -f "$dest/include/xgrammar/xgrammar.h" ] && [ -f "$dest/.ember-sha256" ] &&
   [ "$(cat "$dest/.ember-sha256")" = "$stamp" ]; then
  echo "$dest"
  exit 0
fi
mkdir -p "$home/deps"
tmp="$(mktemp -d "$home/deps/.xgrammar.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
index="${PIP_INDEX_URL:-https://pypi.org/simple}"
index="${index%/}"
# The sdist's address from the package index (PEP 503 simple page).
url="$(curl -fsSL "$index/xgrammar/" | grep -o "href=\"[^\"]*xgrammar-$version\.tar\.gz[^\"]*\"" | head -1 |
       sed 's/^href="//; s/"$//; s/#.*$//')"
if [ -z "$url" ]; then
  echo "fetch_xgrammar: xgrammar-$version.tar.gz not found on $index/xgrammar/" >&2
  exit 1
fi
case "$url" in http*) ;; *) url="$index/xgrammar/$url" ;; esac
curl -fsSL -o "$tmp/x.tar.gz" "$url"
echo "$sha256  $tmp/x.tar.gz" | sha256sum -c --quiet - || {
  echo "fetch_xgrammar: checksum mismatch for $url" >&2
  exit 1
}
tar -xzf "$tmp/x.tar.gz" -C "$tmp"
for p in "${patches[@]}"; do
  (cd "$tmp/xgrammar-$version" && git apply "$p") || {
    echo "fetch_xgrammar: $(basename "$p") does not apply" >&2
    exit 1
  }
done
rm -rf "$dest"
mv "$tmp/xgrammar-$version" "$dest"
echo "$stamp" > "$dest/.ember-sha256"
echo "$dest"
