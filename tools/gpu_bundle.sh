#!/usr/bin/env bash
# Prepares, on a machine without a GPU, what tools/gpu_check.sh runs on a lent
# GPU machine (no network there, 64 MiB carried per call), in .gpu/ (ignored):
#
#   .gpu/bundle.tar.xz   build-gpu's binaries (Release, -DEMBER_WITH_ONEDNN=OFF
#                        -DCMAKE_CUDA_ARCHITECTURES=90, stripped): libember,
#                        libember_cuda, the test/bench programs, the CLI, the
#                        integration tests' synthetic models, libgomp
#   .gpu/source_dir      the absolute source path compiled into the tests
#                        (gpu_check.sh links it to the repository there)
#   .gpu/text.txt        the agreement text (a book of ../shared/data)
#   .gpu/smollm2.part    with --part A|B: that half of SmolLM2-135M-Instruct
#                        Q4_1 (too large for one call) and smollm2.sha256
#   .gpu/llama/          with --llama DIR: llama.cpp's CUDA build (llama-bench,
#                        llama-batched-bench) if small enough, else its source
#
#   tools/gpu_bundle.sh [--part A|B] [--no-build] [--llama-src TARBALL] [--llama-bin DIR]
#
# Then: device run with carry [".gpu"], command `bash tools/gpu_check.sh ...`
# (docs/CUDA.md section 7).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
part="" build=1 llama_src="" llama_bin=""
while (($#)); do
  case "$1" in
    --part) part="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --llama-src) llama_src="$2"; shift 2 ;;
    --llama-bin) llama_bin="$2"; shift 2 ;;
    *) echo "gpu_bundle: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
b="$root/build-gpu"
if ((build)); then
  cmake -S "$root" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_WITH_CUDA=ON -DEMBER_WITH_ONEDNN=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DEMBER_BUILD_BINDINGS=OFF >/dev/null
  ninja -C "$b" ember ember_cuda ember_cli test_backend test_capi test_integration make_synthetic_model bench_cuda \
    synthetic_models >/dev/null
fi
g="$root/.gpu"
mkdir -p "$g"
grep -qxF '/.gpu/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu/' >>"$root/.git/info/exclude"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
files=(capi/libember.so capi/libember.so.1 capi/libember.so.1.2.0 capi/libember_cuda.so
       tests/unit/backend/test_backend tests/test_capi tests/test_integration gpu/bench_cuda
       tools/make_synthetic_model apps/cli/ember)
for f in "${files[@]}"; do
  mkdir -p "$stage/$(dirname "$f")"
  cp -P "$b/$f" "$stage/$f"
done
# The fake plugins of the loader tests (Plugin.*).
cp -r "$b/tests/unit/backend/fake_plugins" "$b/tests/unit/backend/fake_deps" "$stage/tests/unit/backend/"
mkdir -p "$stage/lib"
# The integration tests' synthetic models (16 MB that do not compress) are
# remade there by the build's own commands (make_synthetic_model is deterministic).
ninja -C "$b" -t commands synthetic_models | grep 'make_synthetic_model --' |
  sed 's#[^ ]*cmake -E make_directory#mkdir -p#; s#$# \&#' >"$g/synthetic.sh"
echo wait >>"$g/synthetic.sh"
cp "$(g++ -print-file-name=libgomp.so.1)" "$stage/lib/"
find "$stage" -type f \( -perm -u+x -o -name '*.so*' \) ! -name '*.gguf' -exec strip --strip-unneeded {} \; 2>/dev/null || true
tar -C "$stage" -cJf "$g/bundle.tar.xz" .
echo "$root" >"$g/source_dir"
xz -c "$root/../shared/data/pride_and_prejudice.txt" >"$g/text.txt.xz" 2>/dev/null || true
rm -f "$g"/smollm2.part "$g"/smollm2.sha256
if [ -n "$part" ]; then
  model="$("$root/tools/fetch_model.sh" smollm2)"
  size=$(stat -c %s "$model")
  half=$(((size / 2 + 4095) / 4096 * 4096))
  case "$part" in
    A) head -c "$half" "$model" >"$g/smollm2.part" ;;
    B) tail -c +"$((half + 1))" "$model" >"$g/smollm2.part" ;;
    *) echo "gpu_bundle: --part A or B" >&2; exit 2 ;;
  esac
  echo "$part $(sha256sum "$model" | cut -d' ' -f1) $size" >"$g/smollm2.sha256"
fi
rm -rf "$g/llama"
if [ -n "$llama_bin" ]; then
  mkdir -p "$g/llama"
  for t in llama-bench llama-batched-bench; do
    [ -x "$llama_bin/$t" ] && xz -T2 -c "$llama_bin/$t" >"$g/llama/$t.xz"
  done
elif [ -n "$llama_src" ]; then
  mkdir -p "$g/llama"
  cp "$llama_src" "$g/llama/src.tar.xz"
fi
du -sh "$g" "$g"/* "$g"/llama/* 2>/dev/null
echo "gpu_bundle: carry .gpu (with the tracked tree: $(git -C "$root" ls-files -z | du -ch --files0-from=- | tail -1 | cut -f1))"
