#!/usr/bin/env python3
"""Tables and plot for the StreamingLLM evidence (docs/BENCHMARKS.md).

Reads the files `ember perplexity --stream ... --series NAME.csv --logprobs
NAME.lp.csv` wrote into one directory (see the command list in
docs/BENCHMARKS.md), prints Markdown tables (perplexity per policy on matched
token sets, the sink-count ablation, latency and memory flatness, the speed
ratio of sink over recompute) and, with --plot, writes a PNG.

  python3 tools/streaming_report.py DIR [--plot docs/img/streaming_ppl.png]

Only the standard library is needed for the tables; the plot needs matplotlib.
"""
import argparse
import csv
import math
import os
import sys


def read_logprobs(path):
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            out[int(row["position"])] = float(row["logprob"])
    return out


def read_series(path):
    with open(path) as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def ppl(lps):
    return math.exp(-sum(lps) / len(lps)) if lps else float("nan")


def subset(lp, positions):
    return [lp[p] for p in positions if p in lp]


def fmt(x):
    if x != x:
        return "–"
    return f"{x:,.2f}" if x < 1000 else f"{x:,.0f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--plot", help="write the figure to this PNG")
    args = ap.parse_args()
    d = args.dir

    def load(name):
        p = os.path.join(d, name + ".lp.csv")
        return read_logprobs(p) if os.path.exists(p) else None

    def series(name):
        p = os.path.join(d, name + ".csv")
        return read_series(p) if os.path.exists(p) else None

    runs = {n: load(n) for n in ["full", "window", "sink1", "sink2", "sink4", "sink8", "recompute", "sink4_long"]}
    have = {n: lp for n, lp in runs.items() if lp}
    if not have:
        sys.exit("no *.lp.csv files in " + d)

    # Table 1: matched token sets. Recompute was scored on every 16th token
    # of the first 8,192; the streaming policies on every token.
    rec = runs.get("recompute")
    stride_pos = sorted(rec) if rec else []
    print("### Perplexity by cache policy (cache of 1,024 tokens)\n")
    cols = [("full", "full (8,192 context)"), ("window", "window:1024"), ("recompute", "recompute:1024"),
            ("sink4", "sink:4:1020")]
    print("| tokens scored | " + " | ".join(c[1] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    ranges = [(1, 1024, "1 – 1,023 (cache not yet full)"), (1024, 8192, "1,024 – 8,191"), (1, 8192, "1 – 8,191")]
    if stride_pos:
        for lo, hi, label in ranges:
            pos = [p for p in stride_pos if lo <= p < hi]
            cells = [fmt(ppl(subset(runs[n], pos))) if runs.get(n) else "–" for n, _ in cols]
            print(f"| every 16th token, {label} ({len(pos)} tokens) | " + " | ".join(cells) + " |")
    for lo, hi, label in [(1, 8192, "1 – 8,191"), (1024, 20000, "1,024 – 19,999"), (1, 20000, "1 – 19,999")]:
        cells = []
        for n, _ in cols:
            lp = runs.get(n)
            if not lp or n == "recompute" or max(lp) < hi - 1:
                cells.append("–")
            else:
                cells.append(fmt(ppl([lp[p] for p in range(lo, hi) if p in lp])))
        print(f"| every token, {label} | " + " | ".join(cells) + " |")
    print()

    # Table 2: sink-count ablation at a cache of 1,024.
    print("### Sink-count ablation (cache of 1,024 = sinks + window)\n")
    abl = [("window", "0 (window:1024)"), ("sink1", "1 (sink:1:1023)"), ("sink2", "2 (sink:2:1022)"),
           ("sink4", "4 (sink:4:1020)"), ("sink8", "8 (sink:8:1016)")]
    print("| sinks | ppl, tokens 1,024 – 19,999 | ppl, tokens 1 – 19,999 |")
    print("|---|---|---|")
    for n, label in abl:
        lp = runs.get(n)
        if not lp:
            print(f"| {label} | – | – |")
            continue
        end = min(20000, max(lp) + 1)
        print(f"| {label} | {fmt(ppl([lp[p] for p in range(1024, end) if p in lp]))} | "
              f"{fmt(ppl([lp[p] for p in range(1, end) if p in lp]))} |")
    print()

    # Latency and memory flatness.
    print("### Latency and memory along the stream\n")
    print("| run | tokens | cpu ms/token, first 1,000 | cpu ms/token, last 1,000 | change | "
          "wall ms/token first / last | RSS MB first / last | KV MB first / last |")
    print("|---|---|---|---|---|---|---|---|")
    for n in ["sink4", "sink4_long", "window", "full"]:
        s = series(n)
        if not s or len(s) < 2:
            continue
        # Rows report the 1,000 tokens before them; compare the first full
        # window-sized row after the cache filled (tokens 1,000-2,000) with the last.
        first = s[1] if n != "full" else s[0]
        last = s[-1] if s[-1]["tokens"] % 1000 == 0 or len(s) < 3 else s[-2]
        change = 100.0 * (last["cpu_ms_per_token"] - first["cpu_ms_per_token"]) / first["cpu_ms_per_token"]
        print(f"| {n} | {int(s[-1]['tokens']):,} | {first['cpu_ms_per_token']:.2f} (at {int(first['tokens']):,}) | "
              f"{last['cpu_ms_per_token']:.2f} (at {int(last['tokens']):,}) | {change:+.1f}% | "
              f"{first['ms_per_token']:.1f} / {last['ms_per_token']:.1f} | {first['rss_mb']:.1f} / {last['rss_mb']:.1f} | "
              f"{first['kv_mb']:.1f} / {last['kv_mb']:.1f} |")
    print()

    rs, ss = series("recompute"), series("sink4")
    if rs and ss:
        rec_cpu = [r["cpu_ms_per_token"] for r in rs if r["tokens"] > 2000]
        snk_cpu = [r["cpu_ms_per_token"] for r in ss if 2000 <= r["tokens"] <= 8192]
        if rec_cpu and snk_cpu:
            a, b = sum(rec_cpu) / len(rec_cpu), sum(snk_cpu) / len(snk_cpu)
            print(f"Speed at W = 1,024 once the cache is full (tokens 2,000 – 8,192): recompute {a:.0f} cpu ms per "
                  f"token, sink {b:.2f} cpu ms per token: sink is {a / b:.0f}x faster.\n")

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
        ax = axes[0]
        seg = 256
        style = {"full": ("full", "black"), "window": ("window:1024", "tab:red"),
                 "sink4": ("sink:4:1020", "tab:blue")}
        for n, (label, color) in style.items():
            lp = runs.get(n)
            if not lp:
                continue
            xs, ys = [], []
            for start in range(1, min(8192, max(lp) + 1), seg):
                vals = [lp[p] for p in range(start, start + seg) if p in lp]
                if len(vals) == seg:
                    xs.append(start + seg)
                    ys.append(ppl(vals))
            ax.plot(xs, ys, label=label, color=color, linewidth=1.4)
        if rec:
            seg_r = 1024
            xs, ys = [], []
            for start in range(0, 8192, seg_r):
                vals = [rec[p] for p in stride_pos if start <= p < start + seg_r]
                if vals:
                    xs.append(start + seg_r)
                    ys.append(ppl(vals))
            ax.plot(xs, ys, "o--", label="recompute:1024 (every 16th token)", color="tab:green", markersize=4)
        ax.axvline(1024, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("tokens of War and Peace")
        ax.set_ylabel(f"perplexity of each {seg}-token segment")
        ax.set_title("Cache of 1,024 tokens, SmolLM2-135M Q4_1")
        ax.legend(fontsize=8)

        ax = axes[1]
        colors = ["tab:red", "tab:orange", "tab:olive", "tab:blue", "tab:purple"]
        for (n, label), color in zip(abl, colors):
            lp = runs.get(n)
            if not lp:
                continue
            xs, ys = [], []
            for start in range(1, max(lp) + 1, 1000):
                vals = [lp[p] for p in range(start, start + 1000) if p in lp]
                if len(vals) == 1000:
                    xs.append(start + 1000)
                    ys.append(ppl(vals))
            ax.plot(xs, ys, label=label + " sinks" if n != "window" else label, color=color, linewidth=1.4)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("perplexity of each 1,000-token segment")
        ax.set_title("Sink-count ablation (cache 1,024)")
        ax.legend(fontsize=8)

        ax = axes[2]
        s = series("sink4_long") or series("sink4")
        if s:
            xs = [r["tokens"] for r in s]
            ax.plot(xs, [r["cpu_ms_per_token"] for r in s], color="tab:blue", label="sink:4:1020 cpu ms/token")
            if series("full"):
                f = series("full")
                ax.plot([r["tokens"] for r in f], [r["cpu_ms_per_token"] for r in f], color="black",
                        label="full cpu ms/token")
            ax.set_xlabel("tokens")
            ax.set_ylabel("cpu ms per token")
            ax.set_ylim(bottom=0)
            ax2 = ax.twinx()
            ax2.plot(xs, [r["rss_mb"] for r in s], color="tab:gray", linestyle="--", label="sink:4:1020 RSS MB")
            ax2.plot(xs, [r["kv_mb"] for r in s], color="tab:cyan", linestyle=":", label="sink:4:1020 KV MB")
            ax2.set_ylabel("MB")
            ax2.set_ylim(bottom=0)
            lines = ax.get_legend_handles_labels()
            lines2 = ax2.get_legend_handles_labels()
            ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="center right")
            ax.set_title("Time and memory per token (1 thread)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
