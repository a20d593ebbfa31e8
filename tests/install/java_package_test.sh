#!/usr/bin/env bash
# The Java package (tools/package_java.sh): the jar built by Maven offline,
# then its Maven project installed offline as a user would (`mvn -o install`,
# into a temporary local repository), then a program in a clean directory
# compiled and run against the installed jar alone: no -Djava.library.path,
# no LD_LIBRARY_PATH. The program checks that libember.so.1 and
# libember_java.so were loaded from the jar's temporary copy, and its greedy
# reply must equal the C API's.
#   java_package_test.sh BUILD_DIR SOURCE_DIR JAVAC JAVA
set -euo pipefail
build=$1 src=$2 javac=$3 java=$4
# shellcheck source=packages/common.sh
. "$src/tests/install/packages/common.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ember_jar.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export MAVEN_REPO_LOCAL=$tmp/m2

jar=$(bash "$src/tools/package_java.sh" "$build" "$tmp/out") || fail "package_java.sh"
version=$(basename "$jar" .jar)
version=${version#ember-}
echo "jar: $(basename "$jar"): $(unzip -l "$jar" | tail -1)"

echo "--- mvn -o install (the package's Maven project, offline)"
(cd "$tmp/out/maven" && mvn -o -q -B -Dstyle.color=never -Dmaven.repo.local="$MAVEN_REPO_LOCAL" install) ||
  fail "mvn -o install"
installed=$MAVEN_REPO_LOCAL/ember/ember/$version/ember-$version.jar
[ -f "$installed" ] && [ -f "$MAVEN_REPO_LOCAL/ember/ember/$version/ember-$version.pom" ] ||
  fail "mvn install put no ember-$version.jar/.pom in the local repository"
unzip -l "$installed" ember/native/linux-x86_64/libember_java.so >/dev/null || fail "the installed jar lacks the JNI library"

mkdir "$tmp/app"
cp "$src/tests/install/packages/Greedy.java" "$tmp/app/"
cd "$tmp/app"
"$javac" -encoding UTF-8 -cp "$installed" -d . Greedy.java || fail "javac Greedy.java against the jar"
find_model
check_greedy "jar" env -u LD_LIBRARY_PATH -u JAVA_TOOL_OPTIONS "$java" -Xcheck:jni -cp "$installed:." Greedy "$model" \
  "$PACKAGE_TOKENS" "$PACKAGE_PROMPT"
echo PASS
