#!/usr/bin/env bash
# Builds the reference environment that compares Ember against llama.cpp:
# a venv at $EMBER_HOME/refvenv (default ~/.cache/ember/refvenv) with
# llama-cpp-python built from source (its vendored llama.cpp for AVX2 + FMA +
# F16C, not the native flags: Ember's reference order is llama.cpp's AVX2
# build; on an AVX-512 CPU a native build sums attention and SiLU in other
# orders, so Ember's logits would not be its bit for bit), numpy, jinja2 and
# sentencepiece. EMBER_REFVENV overrides the venv's path. Slow the first time (~15 min on 2
# cores); does nothing if the venv already imports llama_cpp at the pinned
# version. Not needed for the test suite: golden files are committed.
#
# --native: the rival instead, for speed comparisons (tools/bench_vs_llamacpp.py):
# the same version built for this CPU (GGML_NATIVE: AVX-512 where present), in
# $EMBER_HOME/refvenv-native. Timing Ember against the AVX2 reference on an
# AVX-512 CPU would understate llama.cpp.
set -euo pipefail
home="${EMBER_HOME:-$HOME/.cache/ember}"
native=0
for arg in "$@"; do
  case "$arg" in
    --native) native=1 ;;
    *) echo "setup_reference: unknown argument '$arg' (usage: setup_reference.sh [--native])" >&2; exit 2 ;;
  esac
done
if ((native)); then
  venv="${EMBER_REFVENV:-$home/refvenv-native}"
else
  venv="${EMBER_REFVENV:-$home/refvenv}"
fi
version="${EMBER_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
# llama.cpp's OpenAI server (llama_cpp.server; tools/bench_serve.py runs it):
# the [server] extra's packages, installed beside an existing build too.
server_extra=("uvicorn>=0.22.0" "fastapi>=0.100.0" "pydantic-settings>=2.0.1" "sse-starlette>=1.6.1"
              "starlette-context>=0.3.6,<0.4" "PyYAML>=5.1")
if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; then
  "$venv/bin/python" -c "import llama_cpp.server.app" 2>/dev/null ||
    "$venv/bin/pip" install --quiet "${server_extra[@]}"
  if ((!native)) &&
     "$venv/bin/python" -c "import llama_cpp, sys; sys.exit('AVX512 = 1' not in llama_cpp.llama_print_system_info().decode())" 2>/dev/null; then
    echo "setup_reference: $venv is an AVX-512 build of llama.cpp, not Ember's reference order (AVX2);" \
         "remove it and run this again (or EMBER_REFVENV=<other path>)" >&2
  fi
  exit 0
fi
mkdir -p "$home"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet numpy jinja2 sentencepiece "${server_extra[@]}"
flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF"
# Native, but without AMX: llama.cpp 0.3.36's AMX matmul segfaults on the AVX-512/AMX VMs seen here (in
# ggml_backend_amx_mul_mat, 2026-11-27; the kernel grants the tile state). GGML_NATIVE would turn AMX on
# through -march=native, so on an AVX-512 CPU its features are named one by one instead.
if ((native)); then
  flags="-DGGML_NATIVE=ON"
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON"
    for f in avx512vbmi:VBMI avx512_vnni:VNNI avx512_bf16:BF16; do
      grep -qw "${f%%:*}" /proc/cpuinfo && flags="$flags -DGGML_AVX512_${f##*:}=ON"
    done
    grep -qw avx_vnni /proc/cpuinfo && flags="$flags -DGGML_AVX_VNNI=ON"
    flags="$flags -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  fi
fi
CMAKE_ARGS="$flags -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$venv/bin/pip" install --quiet --no-cache-dir --no-binary llama-cpp-python "llama-cpp-python==$version"
"$venv/bin/python" -c "import llama_cpp; print('setup_reference:', llama_cpp.__version__)"
