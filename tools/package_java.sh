#!/usr/bin/env bash
# The Java package: a jar that carries libember.so.1 and the JNI library
# libember_java.so (ember/native/linux-x86_64/ inside; ember.Native extracts
# them to a temporary directory and loads them with System.load, so no
# -Djava.library.path), built by Maven offline from the Maven project that
# `cmake --install BUILD --component java` lays out: pom.xml
# (bindings/java/pom.xml.in), the sources (hand-written and SWIG's), the
# native libraries as resources (libember_java.so with RPATH $ORIGIN), and
# .mvn/ (Debian's Maven plugins from /usr/share/maven-repo, so no network).
#
#   bash tools/package_java.sh [BUILD_DIR [OUT]]    (default: build, dist/java)
#
# Writes OUT/ember-VERSION.jar, OUT/ember-VERSION.pom and OUT/maven/, the
# Maven project: `cd OUT/maven && mvn -o install` installs ember:ember:VERSION
# into the local repository (~/.m2/repository). Needs a build with the Java
# binding and tools/setup.sh's maven and libmaven-*-plugin-java packages.
# MAVEN_REPO_LOCAL: the local repository Maven uses here (default: Maven's).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
out="$(mkdir -p "${2:-$root/dist/java}" && cd "${2:-$root/dist/java}" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/ember_pkg_java.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --component java --prefix "$tmp/prefix" >"$tmp/install.log" ||
  { cat "$tmp/install.log" >&2; echo "package_java: install failed (a build with the Java binding?)" >&2; exit 1; }
project="$tmp/prefix/share/ember/java"
[ -f "$project/pom.xml" ] || { echo "package_java: $build has no Java binding (-DEMBER_BINDINGS_JAVA=ON)" >&2; exit 1; }
native="$project/src/main/resources/ember/native/linux-x86_64"
readelf -d "$native/libember_java.so" | grep -E 'R(UN)?PATH' | grep '\[\$ORIGIN\]' >/dev/null ||
  { echo "package_java: libember_java.so's RPATH is not \$ORIGIN" >&2; exit 1; }
version="$(sed -n 's:^  <version>\(.*\)</version>:\1:p' "$project/pom.xml")"

rm -rf "$out/maven"
cp -r "$project" "$out/maven"
mvn_args=(-o -q -B -Dstyle.color=never)
[ -n "${MAVEN_REPO_LOCAL:-}" ] && mvn_args+=("-Dmaven.repo.local=$MAVEN_REPO_LOCAL")
(cd "$tmp/prefix/share/ember/java" && mvn "${mvn_args[@]}" package) || { echo "package_java: mvn package failed" >&2; exit 1; }
jar="$project/target/ember-$version.jar"
for f in ember/Model.class ember/lowlevel/emberc.class ember/native/linux-x86_64/libember.so.1 \
         ember/native/linux-x86_64/libember_java.so; do
  unzip -l "$jar" "$f" >/dev/null || { echo "package_java: the jar lacks $f" >&2; exit 1; }
done
cp "$jar" "$out/ember-$version.jar"
cp "$project/pom.xml" "$out/ember-$version.pom"
echo "$out/ember-$version.jar"
