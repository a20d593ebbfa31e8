"""The package tests' Python program (tests/install/python_*_test.sh): run by
an installed ember (a venv, from a directory outside the source tree), it
checks that the package and its libember are the installed ones, then prints
the greedy reply's token ids on one line (as bindings/tools/greedy_ref.c).
    python greedy.py MODEL MAX_TOKENS MESSAGE FORBIDDEN_DIR
"""
import os
import sys

import ember

model_path, max_tokens, message, forbidden = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
package = os.path.realpath(os.path.dirname(ember.__file__))
assert package.startswith(os.path.realpath(sys.prefix) + os.sep), f"ember imported from {package}, not the venv"
with open("/proc/self/maps") as f:
    libs = {line.split()[-1] for line in f if "libember.so" in line}
assert libs and all(os.path.realpath(p).startswith(package + os.sep) for p in libs), f"libember loaded from {libs}"
assert not any(os.path.realpath(p).startswith(os.path.realpath(forbidden) + os.sep) for p in libs), libs
with ember.Model(model_path) as model, ember.Engine(model, kv_memory_bytes=64 << 20) as engine:
    with engine.session() as session:
        session.add_message("user", message)
        with session.generate(max_tokens=max_tokens, temperature=0) as stream:
            text = stream.read()
            print(" ".join(str(t) for t in stream.tokens))
print(f"ember {ember.__version__} from {package}: {text!r}", file=sys.stderr)
