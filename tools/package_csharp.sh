#!/usr/bin/env bash
# The C# package: OUT/Ember.VERSION.nupkg, a NuGet package (a zip) with
#   Ember.nuspec                             the manifest (bindings/csharp/Ember.nuspec.in)
#   lib/netstandard2.0/Ember.dll             the binding (built by mcs)
#   runtimes/linux-x64/native/libember_csharp.so   SWIG's C glue, RPATH $ORIGIN
#   runtimes/linux-x64/native/libember.so.1  libember
#   [Content_Types].xml, _rels/.rels         the package's OPC parts
# from a build with the C# binding (bash tools/build.sh; tools/setup.sh
# installs mono), through `cmake --install BUILD --component csharp`.
#
#   bash tools/package_csharp.sh [BUILD_DIR [OUT]]    (default: build, dist/csharp)
#
# .NET consumers: dotnet add package Ember --source OUT (not checked: Debian 12
# has no dotnet CLI). Mono: tests/install/csharp_package_test.sh lays the
# package's files out as a restore for linux-x64 does (Ember.dll and the
# native libraries next to the program) and runs a program with mono.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
out="$(mkdir -p "${2:-$root/dist/csharp}" && cd "${2:-$root/dist/csharp}" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ember_pkg_csharp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --component csharp --prefix "$tmp/prefix" >"$tmp/install.log" ||
  { cat "$tmp/install.log" >&2; echo "package_csharp: install failed (a build with the C# binding?)" >&2; exit 1; }
files="$tmp/prefix/share/ember/csharp"
[ -f "$files/Ember.dll" ] || { echo "package_csharp: $build has no C# binding (-DEMBER_BINDINGS_CSHARP=ON)" >&2; exit 1; }
version="$(sed -n 's:.*<version>\(.*\)</version>.*:\1:p' "$files/Ember.nuspec")"
readelf -d "$files/libember_csharp.so" | grep -E 'R(UN)?PATH' | grep '\[\$ORIGIN\]' >/dev/null ||
  { echo "package_csharp: libember_csharp.so's RPATH is not \$ORIGIN" >&2; exit 1; }

pkg="$tmp/pkg"
mkdir -p "$pkg/lib/netstandard2.0" "$pkg/runtimes/linux-x64/native" "$pkg/_rels"
cp "$files/Ember.nuspec" "$pkg/"
cp "$files/Ember.dll" "$pkg/lib/netstandard2.0/"
cp "$files/libember_csharp.so" "$files/libember.so.1" "$pkg/runtimes/linux-x64/native/"
cat >"$pkg/[Content_Types].xml" <<'XML'
<?xml version="1.0" encoding="utf-8"?>
<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">
  <Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml" />
  <Default Extension="nuspec" ContentType="application/octet" />
  <Default Extension="dll" ContentType="application/octet" />
  <Default Extension="so" ContentType="application/octet" />
  <Default Extension="1" ContentType="application/octet" />
</Types>
XML
cat >"$pkg/_rels/.rels" <<'XML'
<?xml version="1.0" encoding="utf-8"?>
<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">
  <Relationship Type="http://schemas.microsoft.com/packaging/2010/07/manifest" Target="/Ember.nuspec" Id="R0" />
</Relationships>
XML
nupkg="$out/Ember.$version.nupkg"
rm -f "$nupkg"
python3 - "$pkg" "$nupkg" <<'PY'
import os, sys, zipfile
root, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            path = os.path.join(d, f)
            z.write(path, os.path.relpath(path, root))
PY
echo "$nupkg"
