#!/usr/bin/env bash
# `pip install ./bindings/python` works offline and gives a self-contained
# package: a venv in the build tree, the package copied there (pip builds in
# place), then a chat from another directory with nothing but the venv.
#   pip_install_test.sh SOURCE_DIR LIB_DIR WORK_DIR PYTHON
set -euo pipefail
src="$1" lib="$2" work="$3" python="$4"
rm -rf "$work"
mkdir -p "$work"
# An offline build needs setuptools and wheel in the interpreter the venv shares
# (Debian: python3-setuptools python3-wheel, installed by tools/setup.sh).
if ! "$python" -c "import setuptools, wheel" 2>/dev/null; then
  echo "$python lacks setuptools/wheel; using /usr/bin/python3" >&2
  python=/usr/bin/python3
fi
"$python" -m venv --system-site-packages "$work/venv"
cp -r "$src/bindings/python" "$work/pkg"
rm -rf "$work/pkg/build" "$work/pkg/"*.egg-info
EMBER_SOURCE_DIR="$src" EMBER_LIB_DIR="$lib" \
  "$work/venv/bin/pip" install -q --no-build-isolation --no-index "$work/pkg"
cd "$work"
env -u PYTHONPATH -u LD_LIBRARY_PATH "$work/venv/bin/python" - <<'PY'
import os, ember
path = os.environ.get("EMBER_MODEL") or os.path.join(
    os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember"), "SmolLM2-135M-Instruct.Q4_1.gguf")
assert os.path.dirname(ember.__file__).startswith(os.getcwd()), ember.__file__  # the installed package
if not os.path.exists(path):
    raise SystemExit(1 if os.environ.get("CI") else 77)
with ember.Model(path) as model, ember.Engine(model, kv_memory_bytes=16 << 20) as engine:
    with engine.session() as session:
        reply = session.chat("Say hi.", max_tokens=8, temperature=0)
assert isinstance(reply, str) and reply, reply
print("pip-installed ember", ember.__version__, "replied:", repr(reply))
PY
