#!/usr/bin/env python3
"""Per-token cost of each binding against the C API (a benchmark, not a test).

Every side generates the same greedy reply with ignore_eos (exactly N tokens) on a fresh engine
with the same settings (default threads, KV pool 64 MiB), each in its own process:
  C       bindings/tools/greedy_ref.c (EMBER_REF_TIMING / EMBER_REF_DRAIN)
  python  bindings/tools/bench/bench_python.py
  java    bindings/tools/bench/BenchBinding.java   (build/bindings/java/ember-bench.jar)
  csharp  bindings/tools/bench/BenchBinding.cs     (build/bindings/csharp/BenchBinding.exe)
  go      bindings/tools/bench/go                  (build/bindings/go/bench_go)
CMake builds the last three with the bindings (EMBER_BUILD_BENCH, on by default).

Two numbers per language.
(1) Decode time per token as the consumer sees it: from the first text piece to the end, divided
    by the tokens after the first. Runs are interleaved (each round runs C and every language, in
    a rotated order); reported: the median of the per-round ratios to C (a round's sides run back
    to back, so the machine's slow drifts hit them alike) and the ratio of the medians. Every
    side's tokens must equal the C API's. On a busy machine this carries the machine's noise.
(2) The binding's own cost per token, with the engine out of the way: the stream runs to its end
    first, then its queued events are read through the binding; that time per token, against the
    C API's decode time per token. (C's own figure for the same drain is printed beside it.)
    Repeated in one process: the first repetition is "cold" (JIT and caches), the median of the
    rest "warm".

    python3 bindings/tools/bench_bindings.py [--build build] [--langs python,java,csharp,go] \\
        [--tokens 128] [--runs 5] [--drain-reps 5]
"""
import argparse
import os
import statistics
import subprocess
import sys

PROMPT = "Write a long story about a dragon who learns to paint."
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LANGS = ["python", "java", "csharp", "go"]


def model_path():
    if os.environ.get("EMBER_MODEL"):
        return os.environ["EMBER_MODEL"]
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")


def commands(build):
    """Each side's command line before its arguments, and its environment."""
    b = os.path.join(build, "bindings")
    capi = os.path.join(build, "capi")
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    java = os.path.join(b, "java")
    cs = os.path.join(b, "csharp")
    return {
        "C": ([os.path.join(b, "ember_greedy_ref")], dict(env, EMBER_REF_TIMING="1", EMBER_REF_IGNORE_EOS="1")),
        "python": ([sys.executable, os.path.join(ROOT, "bindings/tools/bench/bench_python.py")],
                   dict(env, PYTHONPATH=os.path.join(b, "python"), PYTHONDONTWRITEBYTECODE="1")),
        "java": (["java", f"-Dember.library.path={java}/libember_java.so", "-cp",
                  f"{java}/ember.jar:{java}/ember-bench.jar", "BenchBinding"], env),
        "csharp": (["mono", os.path.join(cs, "BenchBinding.exe")],
                   dict(env, LD_LIBRARY_PATH=f"{cs}:{capi}")),
        "go": ([os.path.join(b, "go", "bench_go")], env),
    }


def run(cmd, n, mode, reps=1):
    """Runs one side; returns (seconds per measurement list, tokens per measurement, token ids)."""
    argv, env = cmd
    if os.path.basename(argv[0]) == "ember_greedy_ref":
        argv = argv + [model_path(), str(n), PROMPT]
        if mode == "drain":
            env = dict(env, EMBER_REF_DRAIN="1")
        outs = [subprocess.run(argv, env=env, capture_output=True, text=True, check=True) for _ in range(reps)]
    else:
        argv = argv + [model_path(), str(n), PROMPT, mode, str(reps)]
        outs = [subprocess.run(argv, env=env, capture_output=True, text=True, check=True)]
    key = "drain_s" if mode == "drain" else "decode_s"
    seconds, counts = [], []
    for out in outs:
        for line in out.stderr.splitlines():
            f = line.split()
            if len(f) == 4 and f[0] == key and f[2] == "tokens":
                seconds.append(float(f[1]))
                counts.append(int(f[3]))
    if len(seconds) != reps:
        raise SystemExit(f"{argv[0]}: expected {reps} '{key}' lines, got:\n{''.join(o.stderr for o in outs)}")
    return seconds, counts, [int(t) for t in outs[-1].stdout.split()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--langs", default=",".join(LANGS))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--drain-reps", type=int, default=5)
    a = ap.parse_args()
    langs = [x for x in a.langs.split(",") if x]
    for x in langs:
        if x not in LANGS:
            raise SystemExit(f"unknown language {x} (known: {', '.join(LANGS)})")
    cmds = commands(a.build)
    sides = ["C"] + langs

    # (1) decode ms/token, interleaved rounds.
    per_token = {s: [] for s in sides}
    for r in range(a.runs):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        ids = {}
        for s in order:
            sec, cnt, ids[s] = run(cmds[s], a.tokens, "decode")
            per_token[s].append(sec[0] / (cnt[0] - 1))
        for s in langs:
            if ids[s] != ids["C"]:
                raise SystemExit(f"{s}: the binding's tokens differ from the C API's")
        print(f"round {r + 1}: " + ", ".join(f"{s} {per_token[s][-1] * 1e3:.2f}" for s in order) + " ms/token",
              flush=True)

    # (2) drain: the binding's own cost per token.
    drain = {}
    for s in sides:
        sec, cnt, _ = run(cmds[s], a.tokens, "drain", a.drain_reps)
        us = [x / c * 1e6 for x, c in zip(sec, cnt)]
        drain[s] = (us[0], statistics.median(us[1:]) if len(us) > 1 else us[0])

    c_ms = statistics.median(per_token["C"]) * 1e3
    print(f"\ntokens/reply {a.tokens}, rounds {a.runs}, drain repetitions {a.drain_reps}; "
          f"model {os.path.basename(model_path())}")
    print("| side | decode ms/token, median | per round | vs C, median of paired ratios | vs C, ratio of medians "
          "| own cost µs/token, cold / warm | own cost (warm) / C's decode |")
    print("|---|---|---|---|---|---|---|")
    for s in sides:
        m = statistics.median(per_token[s]) * 1e3
        runs = ", ".join(f"{x * 1e3:.2f}" for x in per_token[s])
        paired = statistics.median(x / c for x, c in zip(per_token[s], per_token["C"]))
        vs_paired = "" if s == "C" else f"{(paired - 1) * 100:+.1f}%"
        vs_medians = "" if s == "C" else f"{(m / c_ms - 1) * 100:+.1f}%"
        cold, warm = drain[s]
        print(f"| {s} | {m:.3f} | {runs} | {vs_paired} | {vs_medians} | {cold:.1f} / {warm:.1f} "
              f"| {warm / (c_ms * 1e3) * 100:.3f}% |")


if __name__ == "__main__":
    main()
