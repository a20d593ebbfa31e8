#!/usr/bin/env python3
"""Interleaved A/B of two Ember builds on the same model, in one run.

Each round runs `ember bench` (prefill + decode), `ember bench --sessions K`
and `ember bench --spec ngram` (speculative decoding on a prompt it can copy
from) once for A and once for B, alternating which goes first, so slow drifts of a
shared machine hit both alike. Reports per build the median of every figure
and the median of the per-round B/A ratios (paired, robust to drift).

    python3 tools/bench_ab.py --a /tmp/before --b build --rounds 8

--a/--b: a directory holding the `ember` CLI (or a build tree: apps/cli/ember)
and the libember.so it should use (next to it, or capi/ in a build tree).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def locate(root):
    for cli, lib in ((os.path.join(root, "apps/cli/ember"), os.path.join(root, "capi")),
                     (os.path.join(root, "ember"), root)):
        if os.path.exists(cli):
            return cli, lib
    sys.exit(f"bench_ab: no ember CLI under {root}")


def run(build, args):
    cli, lib = build
    env = dict(os.environ, LD_LIBRARY_PATH=lib)
    out = subprocess.run([cli, "bench", *args, "--json"], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("-m", "--model", default=os.path.expanduser(
        os.path.join(os.environ.get("EMBER_HOME", "~/.cache/ember"), "SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=16, help="0: no multi-session figures")
    ap.add_argument("--spec", default="ngram", help="speculative drafter for the speculative figure ('': none)")
    args = ap.parse_args()
    builds = {"A": locate(args.a), "B": locate(args.b)}
    single = ["-m", args.model, "-p", "512", "-n", "128", "-t", str(args.threads), "-r", "1"]
    multi = ["-m", args.model, "--sessions", str(args.sessions), "-p", "64", "-n", "64", "-t", str(args.threads)]
    spec = ["-m", args.model, "--spec", args.spec, "--chat", "-n", "128", "-t", str(args.threads), "-r", "1",
            "--prompt", "Repeat this list exactly, three times: apples, pears, plums, cherries, grapes, lemons, "
            "limes, figs, dates, kiwis, melons, peaches."]
    figures = {"prefill tok/s": ("single", "prefill_tokens_per_second"),
               "decode tok/s": ("single", "decode_tokens_per_second"),
               f"{args.sessions} sessions aggregate tok/s": ("multi", "aggregate_tokens_per_second"),
               f"{args.sessions} sessions steady decode tok/s": ("multi", "steady_decode_tokens_per_second")}
    if args.spec:
        figures[f"speculative ({args.spec}) tok/s"] = ("spec", "spec_tokens_per_second")
    if args.sessions <= 0:
        figures = {k: v for k, v in figures.items() if v[0] != "multi"}
    values = {name: {"A": [], "B": []} for name in figures}
    for r in range(args.rounds):
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        for which in order:
            res = {"single": run(builds[which], single)}
            if args.sessions > 0:
                res["multi"] = run(builds[which], multi)
            if args.spec:
                res["spec"] = run(builds[which], spec)
            for name, (kind, key) in figures.items():
                values[name][which].append(res[kind][key])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"| figure | A median | B median | B/A (median of {args.rounds} paired rounds) | B/A min - max |")
    print("|---|---|---|---|---|")
    for name, v in values.items():
        ratios = [b / a for a, b in zip(v["A"], v["B"]) if a > 0]
        print(f"| {name} | {statistics.median(v['A']):.1f} | {statistics.median(v['B']):.1f} | "
              f"{statistics.median(ratios):.3f} | {min(ratios):.3f} - {max(ratios):.3f} |")


if __name__ == "__main__":
    main()
