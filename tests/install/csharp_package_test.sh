#!/usr/bin/env bash
# The NuGet package (tools/package_csharp.sh), consumed from a clean
# directory with mono. Checked: the .nupkg is a zip with the nuspec (id,
# version), the OPC parts, lib/netstandard2.0/Ember.dll and
# runtimes/linux-x64/native/{libember_csharp.so,libember.so.1}; it is
# extracted as NuGet extracts packages (packages/ember/VERSION/), and its
# files are laid out as a restore for linux-x64 lays out a program's output
# (Ember.dll and the native libraries next to the program); a program compiled
# there against Ember.dll runs with mono, no LD_LIBRARY_PATH, loads the
# package's libraries and replies as the C API does. Not checked: dotnet
# restore/build (no dotnet CLI in Debian 12), .NET (Core) runtimes.
#   csharp_package_test.sh BUILD_DIR SOURCE_DIR MCS MONO
set -euo pipefail
build=$1 src=$2 mcs=$3 mono=$4
# shellcheck source=packages/common.sh
. "$src/tests/install/packages/common.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ember_nupkg.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

nupkg=$(bash "$src/tools/package_csharp.sh" "$build" "$tmp/out") || fail "package_csharp.sh"
echo "package: $(basename "$nupkg")"
version=$(basename "$nupkg" .nupkg)
version=${version#Ember.}
python3 - "$nupkg" "$version" <<'PY' || fail "the package's contents"
import sys, zipfile, xml.etree.ElementTree as ET
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
need = {"Ember.nuspec", "[Content_Types].xml", "_rels/.rels", "lib/netstandard2.0/Ember.dll",
        "runtimes/linux-x64/native/libember_csharp.so", "runtimes/linux-x64/native/libember.so.1"}
assert need <= names, sorted(need - names)
ns = {"n": "http://schemas.microsoft.com/packaging/2013/05/nuspec.xsd"}
meta = ET.fromstring(z.read("Ember.nuspec")).find("n:metadata", ns)
assert meta.find("n:id", ns).text == "Ember" and meta.find("n:version", ns).text == sys.argv[2], "nuspec id/version"
print("nupkg:", ", ".join(sorted(names)))
PY

# As NuGet extracts it (global packages folder: lower-case id and version).
pkgdir="$tmp/packages/ember/$version"
mkdir -p "$pkgdir"
(cd "$pkgdir" && python3 -m zipfile -e "$nupkg" .)
# The program's output directory, as a restore + build for linux-x64 fills it.
app="$tmp/app"
mkdir "$app"
cp "$pkgdir/lib/netstandard2.0/Ember.dll" "$pkgdir"/runtimes/linux-x64/native/* "$app/"
cp "$src/tests/install/packages/Greedy.cs" "$app/"
cd "$app"
"$mcs" -nologo -warnaserror -out:Greedy.exe -r:Ember.dll Greedy.cs || fail "mcs Greedy.cs against the package's Ember.dll"
loaded=$(env -u LD_LIBRARY_PATH ldd libember_csharp.so | awk '$1 == "libember.so.1" { print $3 }')
[ "$(readlink -f "$loaded")" = "$app/libember.so.1" ] || fail "libember_csharp.so resolves libember.so.1 to [$loaded]"
find_model
check_greedy "NuGet package (mono)" env -u LD_LIBRARY_PATH -u MONO_PATH "$mono" Greedy.exe "$model" "$PACKAGE_TOKENS" \
  "$PACKAGE_PROMPT"
echo PASS
