#!/usr/bin/env python3
"""Prefill and decode speed: Ember vs llama.cpp on the same GGUF, same machine, one run.

  /root/.cache/ember/refvenv/bin/python tools/bench_vs_llamacpp.py [-p 512] [-n 128] [-t 2] [-r 3]

Ember: `build/apps/cli/ember bench -p P -n N -t T -r R --json` (random prompt ids, one warm-up
repetition, prefill tokens/s of the P-token prompt, decode tokens/s after the first token).
llama.cpp: llama-cpp-python (built from source) with n_threads=T, n_threads_batch=T, n_batch=512,
n_ubatch=512: per repetition it clears the KV cache, times the eval of P random prompt ids
(logits of the last position only), then N greedy decode steps (argmax of the last logits,
eval of that one token); one warm-up repetition first. Prints both, the ratios and a markdown table.
"""
from __future__ import annotations

import argparse
import ctypes as C
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_model() -> str:
    home = os.environ.get("EMBER_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "ember")
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def bench_ember(args) -> dict:
    cli = os.path.join(ROOT, "build", "apps", "cli", "ember")
    cmd = [cli, "bench", "-m", args.model, "-p", str(args.p), "-n", str(args.n), "-t", str(args.t), "-r",
           str(args.r), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ember bench failed (rc {r.returncode}): {r.stderr}")
    line = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("{")][-1]
    res = json.loads(line)
    res["command"] = " ".join(shlex.quote(c) for c in cmd)
    return res


def bench_llama(args) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=args.model, n_ctx=max(1024, args.p + args.n + 16), n_batch=512, n_ubatch=512,
                n_threads=args.t, n_threads_batch=args.t, logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()
    rng = np.random.default_rng(1234)
    pp, tg = [], []
    for rep in range(args.r + 1):  # repetition 0 warms up
        prompt = [int(x) for x in rng.integers(0, n_vocab, size=args.p)]
        llm.reset()  # the next eval drops the whole KV cache (kv_cache_seq_rm from 0)
        t0 = time.perf_counter()
        llm.eval(prompt)
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
        tok = int(np.argmax(logits))
        t1 = time.perf_counter()
        for _ in range(args.n):
            llm.eval([tok])
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
            tok = int(np.argmax(logits))
        t2 = time.perf_counter()
        if rep == 0:
            continue
        pp.append(args.p / (t1 - t0))
        tg.append(args.n / (t2 - t1))
    sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
    return {"prefill_tokens_per_second": statistics.mean(pp), "prefill_stddev": sd(pp),
            "decode_tokens_per_second": statistics.mean(tg), "decode_stddev": sd(tg), "repetitions": args.r,
            "version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=default_model())
    ap.add_argument("-p", type=int, default=512, help="prompt tokens")
    ap.add_argument("-n", type=int, default=128, help="decoded tokens")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("-r", type=int, default=3, help="timed repetitions (after one warm-up)")
    args = ap.parse_args()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = f"{cpu_model()}, {os.cpu_count()} cores (nproc {len(os.sched_getaffinity(0))})"
    cmd = f"{sys.executable} {os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)} " + " ".join(
        shlex.quote(a) for a in sys.argv[1:])
    print(f"# command: (cd {ROOT} && {cmd.strip()})")
    print(f"# date: {date}\n# machine: {mach}\n# model: {args.model}")
    load0 = loadavg()
    print(f"# load average before: {load0} (other processes share these cores; numbers are only comparable "
          f"when it is low)")
    sys.stdout.flush()
    # Run one after the other, never concurrently, so they do not share the cores.
    em = bench_ember(args)
    print(f"ember:     {em['command']}")
    print(f"           prefill {em['prefill_tokens_per_second']:.1f} ± {em['prefill_stddev']:.1f} tok/s, "
          f"decode {em['decode_tokens_per_second']:.1f} ± {em['decode_stddev']:.1f} tok/s")
    sys.stdout.flush()
    ll = bench_llama(args)
    print(f"llama.cpp: llama-cpp-python {ll['version']} ({ll['system_info']})")
    print(f"           prefill {ll['prefill_tokens_per_second']:.1f} ± {ll['prefill_stddev']:.1f} tok/s, "
          f"decode {ll['decode_tokens_per_second']:.1f} ± {ll['decode_stddev']:.1f} tok/s")
    rp = em["prefill_tokens_per_second"] / ll["prefill_tokens_per_second"]
    rd = em["decode_tokens_per_second"] / ll["decode_tokens_per_second"]
    print(f"ratio ember / llama.cpp: prefill {rp:.2f}x, decode {rd:.2f}x")
    print(f"# load average after: {loadavg()}\n")
    print(f"Machine: {mach}; date: {date}; threads: {args.t}; model: {os.path.basename(args.model)}; "
          f"load average {load0} before, {loadavg()} after\n")
    print(f"| engine | pp{args.p} tok/s | tg{args.n} tok/s |")
    print("|---|---:|---:|")
    print(f"| Ember | {em['prefill_tokens_per_second']:.1f} ± {em['prefill_stddev']:.1f} | "
          f"{em['decode_tokens_per_second']:.1f} ± {em['decode_stddev']:.1f} |")
    print(f"| llama.cpp (llama-cpp-python {ll['version']}) | {ll['prefill_tokens_per_second']:.1f} ± "
          f"{ll['prefill_stddev']:.1f} | {ll['decode_tokens_per_second']:.1f} ± {ll['decode_stddev']:.1f} |")
    print(f"| ratio Ember / llama.cpp | {rp:.2f}x | {rd:.2f}x |")
    print(f"\nCommand: `{cmd.strip()}`")


if __name__ == "__main__":
    main()
