#!/usr/bin/env python3
"""Per-token cost of the Python binding against the C API (a benchmark, not a test).

Two numbers. (1) Both sides generate the same greedy reply with ignore_eos (exactly N tokens)
on a fresh engine with the same settings, and time decode as their consumer
sees it: from the first text event to the END event, divided by the tokens
after the first. C: bindings/tools/greedy_ref.c (EMBER_REF_TIMING). Runs are
interleaved; the medians are compared (on a busy machine this is noisy).
(2) The binding's own cost per token, measured without the engine in the way:
the stream is run to its end first, then its queued events are read through
the binding; that time per token against the C API's decode time per token.

    PYTHONPATH=build/bindings/python python3 bindings/tools/bench_bindings.py \\
        --ref build/bindings/ember_greedy_ref [--tokens 128] [--runs 5]
"""
import argparse
import os
import statistics
import subprocess
import time

import ember

PROMPT = "Write a long story about a dragon who learns to paint."


def model_path():
    if os.environ.get("EMBER_MODEL"):
        return os.environ["EMBER_MODEL"]
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")


def c_run(ref, n):
    env = dict(os.environ, EMBER_REF_TIMING="1", EMBER_REF_IGNORE_EOS="1")
    out = subprocess.run([ref, model_path(), str(n), PROMPT], env=env, capture_output=True, text=True, check=True)
    f = out.stderr.split()
    decode_s, tokens = float(f[f.index("decode_s") + 1]), int(f[f.index("tokens") + 1])
    return decode_s / (tokens - 1), [int(t) for t in out.stdout.split()]


def py_run(n):
    with ember.Model(model_path()) as m, ember.Engine(m, kv_memory_bytes=64 << 20) as e, e.session() as s:
        s.add_message("user", PROMPT)
        with s.generate(max_tokens=n, temperature=0, ignore_eos=True) as st:
            t_first = None
            for _ in st:
                if t_first is None:
                    t_first = time.monotonic()
            t_end = time.monotonic()
            return (t_end - t_first) / (len(st.tokens) - 1), st.tokens


def py_drain(n):
    """The binding's own cost per token: the stream runs to its end first (st.wait()), then the
    queued events are read, so the time is the binding's alone (native event copy, SWIG, Python)."""
    with ember.Model(model_path()) as m, ember.Engine(m, kv_memory_bytes=64 << 20) as e, e.session() as s:
        s.add_message("user", PROMPT)
        with s.generate(max_tokens=n, temperature=0, ignore_eos=True) as st:
            st.wait()
            t0 = time.perf_counter()
            for _ in st:
                pass
            return (time.perf_counter() - t0) / len(st.tokens)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    c, py = [], []
    for i in range(a.runs):  # alternate which side runs first
        if i % 2:
            pt, ptoks = py_run(a.tokens)
            ct, ctoks = c_run(a.ref, a.tokens)
        else:
            ct, ctoks = c_run(a.ref, a.tokens)
            pt, ptoks = py_run(a.tokens)
        assert ctoks == ptoks, "the binding's tokens differ from the C API's"
        c.append(ct)
        py.append(pt)
    cm, pm = statistics.median(c), statistics.median(py)
    print(f"tokens/run {a.tokens}, runs {a.runs}")
    print(f"C API   : {cm * 1e3:.3f} ms/token (runs: {', '.join(f'{x * 1e3:.2f}' for x in c)})")
    print(f"Python  : {pm * 1e3:.3f} ms/token (runs: {', '.join(f'{x * 1e3:.2f}' for x in py)})")
    print(f"overhead: {(pm / cm - 1) * 100:+.2f}% (wall clock, includes machine noise)")
    drain = statistics.median(py_drain(a.tokens) for _ in range(3))
    print(f"Python binding's own cost: {drain * 1e6:.1f} us/token = {drain / cm * 100:.2f}% of the C API's decode time")


if __name__ == "__main__":
    main()
