#!/usr/bin/env bash
# Builds the reference environment that compares Ember against llama.cpp:
# a venv at $EMBER_HOME/refvenv (default ~/.cache/ember/refvenv) with
# llama-cpp-python built from source (its vendored llama.cpp, native CPU
# flags), numpy, jinja2 and sentencepiece. Slow the first time (~15 min on 2
# cores); does nothing if the venv already imports llama_cpp at the pinned
# version. Not needed for the test suite: golden files are committed.
set -euo pipefail
home="${EMBER_HOME:-$HOME/.cache/ember}"
venv="$home/refvenv"
version="${EMBER_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; then
  exit 0
fi
mkdir -p "$home"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet numpy jinja2 sentencepiece
CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$venv/bin/pip" install --quiet --no-binary llama-cpp-python "llama-cpp-python==$version"
"$venv/bin/python" -c "import llama_cpp; print('setup_reference:', llama_cpp.__version__)"
