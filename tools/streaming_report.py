#!/usr/bin/env python3
"""Tables and plot for the StreamingLLM evidence (docs/BENCHMARKS.md).

Reads the files `ember perplexity --stream ... --series NAME.csv --logprobs
NAME.lp.csv` wrote into one directory (see the command list in
docs/BENCHMARKS.md), prints Markdown tables (perplexity per policy on matched
token sets, the sink-count ablation, latency and memory flatness, the speed
ratio of sink over recompute) and, with --plot, writes a PNG.

  python3 tools/streaming_report.py DIR [--plot docs/img/streaming_ppl.png]

Run names it knows (NAME.lp.csv / NAME.csv): full, window (window:1024),
recompute (recompute:1024, usually with --stride), sink0, sink1, sink2, sink4,
sink8 (sink:S:1024-S), sink4_k1 (sink:4:1020 fed token by token, for the
speed ratio) and sink4_long (the long latency/memory run). Missing runs are
shown as "–". Token ranges follow the data: the streaming runs' length N, the
full run's length (the model's context) and the recompute stride.

Only the standard library is needed for the tables; the plot needs matplotlib.
"""
import argparse
import csv
import math
import os
import sys

NAMES = ["full", "window", "recompute", "sink0", "sink1", "sink2", "sink4", "sink8", "sink4_k1", "sink4_long"]


def read_logprobs(path):
    out = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            try:
                out[int(row["position"])] = float(row["logprob"])
            except (TypeError, ValueError):  # a truncated last line of an interrupted run
                pass
    return out


def read_series(path):
    rows = []
    with open(path) as f:
        for row in csv.DictReader(f):
            try:
                rows.append({k: float(v) for k, v in row.items()})
            except (TypeError, ValueError):
                pass
    return rows


def ppl(lps):
    return math.exp(-sum(lps) / len(lps)) if lps else float("nan")


def fmt(x):
    if x != x:
        return "–"
    return f"{x:,.2f}" if x < 1000 else f"{x:,.0f}"


def n(x):
    return f"{x:,}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--plot", help="write the figure to this PNG")
    args = ap.parse_args()
    d = args.dir

    def finished(name):
        # A run still going (or killed) has a NAME.out without the final "ppl=" line.
        p = os.path.join(d, name + ".out")
        if not os.path.exists(p):
            return True
        with open(p) as f:
            return "ppl=" in f.read()

    def load(name):
        p = os.path.join(d, name + ".lp.csv")
        if not os.path.exists(p):
            return None
        if not finished(name):
            print(f"({name}: not finished, left out)\n")
            return None
        return read_logprobs(p)

    def series(name):
        p = os.path.join(d, name + ".csv")
        return read_series(p) if os.path.exists(p) and finished(name) else None

    def chunk_of(name):
        # The run's stderr header: "streaming perplexity: ..., stride K, chunk C".
        p = os.path.join(d, name + ".err")
        if os.path.exists(p):
            with open(p) as f:
                for head in [f.readline() for _ in range(3)]:
                    if head.startswith("streaming perplexity:") and "chunk " in head:
                        return int(head.rsplit("chunk ", 1)[1].split()[0])
        return 1

    runs = {name: load(name) for name in NAMES}
    if not any(runs.values()):
        sys.exit("no *.lp.csv files in " + d)

    # N: length of the streaming runs of the table (window / sink4), ctx: of the full run.
    streaming = [runs[k] for k in ("sink4", "window") if runs.get(k)]
    N = min(max(lp) for lp in streaming) + 1 if streaming else 0
    full = runs.get("full")
    ctx = max(full) + 1 if full else 0
    rec = runs.get("recompute")
    rec_pos = sorted(rec) if rec else []
    stride = rec_pos[1] - rec_pos[0] if len(rec_pos) > 1 else 0
    if rec_pos:
        N_rec = rec_pos[-1] + 1
        rec_pos = [p for p in rec_pos if p < N] if N else rec_pos
        if N and N_rec + stride < N:
            print(f"(recompute covers tokens up to {n(N_rec - 1)} only)\n")

    def over(name, positions):
        lp = runs.get(name)
        if not lp or any(p not in lp for p in positions):
            return float("nan")
        return ppl([lp[p] for p in positions])

    # Table 1: policies on the same tokens.
    print("### Perplexity by cache policy (cache of 1,024 tokens)\n")
    cols = [("full", f"full ({n(ctx)}-token context)" if ctx else "full"), ("window", "window:1024"),
            ("recompute", "recompute:1024"), ("sink4", "sink:4:1020")]
    print("| tokens scored | " + " | ".join(c[1] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    if rec_pos:
        ranges = [(1, 1024, "positions 1 – 1,023 (cache not yet full)")]
        if ctx and ctx > 1024:
            ranges.append((1024, ctx, f"positions 1,024 – {n(ctx - 1)}"))
        if N > ctx:
            ranges.append((max(ctx, 1024), N, f"positions {n(max(ctx, 1024))} – {n(N - 1)}"))
        ranges += [(1024, N, f"positions 1,024 – {n(N - 1)}"), (1, N, f"positions 1 – {n(N - 1)}")]
        for lo, hi, label in ranges:
            pos = [p for p in rec_pos if lo <= p < hi]
            cells = [fmt(over(name, pos)) for name, _ in cols]
            print(f"| every {stride}th token, {label} ({n(len(pos))} tokens) | " + " | ".join(cells) + " |")
    ranges = []
    if ctx:
        ranges.append((1, min(ctx, N), f"1 – {n(min(ctx, N) - 1)}"))
    ranges += [(1024, N, f"1,024 – {n(N - 1)}"), (1, N, f"1 – {n(N - 1)}")]
    for lo, hi, label in ranges:
        pos = list(range(lo, hi))
        cells = ["–" if name == "recompute" else fmt(over(name, pos)) for name, _ in cols]
        print(f"| every token, {label} ({n(len(pos))} tokens) | " + " | ".join(cells) + " |")
    print()

    # Table 2: sink-count ablation at a cache of 1,024.
    print("### Sink-count ablation (cache of 1,024 = sinks + window)\n")
    abl = [("window", "0 (window:1024)"), ("sink0", "0 (sink:0:1024)"), ("sink1", "1 (sink:1:1023)"),
           ("sink2", "2 (sink:2:1022)"), ("sink4", "4 (sink:4:1020)"), ("sink8", "8 (sink:8:1016)")]
    abl = [(k, label) for k, label in abl if runs.get(k)]
    if abl:
        end = min(max(runs[k]) + 1 for k, _ in abl)
        half = max(1024, end // 2)
        print(f"| sinks | ppl, tokens 1 – {n(end - 1)} | ppl, tokens 1,024 – {n(end - 1)} | "
              f"ppl, tokens {n(half)} – {n(end - 1)} |")
        print("|---|---|---|---|")
        for k, label in abl:
            print(f"| {label} | {fmt(over(k, range(1, end)))} | {fmt(over(k, range(1024, end)))} | "
                  f"{fmt(over(k, range(half, end)))} |")
        print()

    # Latency and memory along the stream. A series row reports the 1,000
    # tokens before it; the first row (tokens 1 – 1,000) is the cache filling.
    print("### Latency and memory along the stream (per token fed)\n")
    print("| run | tokens | cpu ms/token, tokens 1,001 – 2,000 | cpu ms/token, last 1,000 | change | "
          "cpu ms/token, rows after 1,000: mean (min – max) | mean of the first / last 10 rows (change) | "
          "wall ms/token first / last | RSS MB first / last | KV MB first / last |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in ["sink4", "sink4_k1", "sink4_long", "window", "full"]:
        s = series(name)
        if not s or len(s) < 3:
            continue
        first = s[1]
        last = s[-1] if s[-1]["tokens"] % 1000 == 0 else s[-2]
        rows = [r for r in s[1:] if r["tokens"] % 1000 == 0]
        cpu = [r["cpu_ms_per_token"] for r in rows]
        mean = sum(cpu) / len(cpu)
        change = 100.0 * (last["cpu_ms_per_token"] - first["cpu_ms_per_token"]) / first["cpu_ms_per_token"]
        ten = "–"
        if len(cpu) >= 20:  # less noisy on a shared machine than single rows
            a, b = sum(cpu[:10]) / 10, sum(cpu[-10:]) / 10
            ten = f"{a:.2f} / {b:.2f} ({100.0 * (b - a) / a:+.1f}%)"
        print(f"| {name} | {n(int(s[-1]['tokens']))} | {first['cpu_ms_per_token']:.2f} | "
              f"{last['cpu_ms_per_token']:.2f} (to {n(int(last['tokens']))}) | {change:+.1f}% | "
              f"{mean:.2f} ({min(cpu):.2f} – {max(cpu):.2f}) | {ten} | "
              f"{first['ms_per_token']:.1f} / {last['ms_per_token']:.1f} | {first['rss_mb']:.1f} / {last['rss_mb']:.1f} | "
              f"{first['kv_mb']:.2f} / {last['kv_mb']:.2f} |")
    print()

    for name in ["sink4_long"]:
        s = series(name)
        rows = [r for r in s[1:] if r["tokens"] % 1000 == 0] if s else []
        if len(rows) >= 20:
            # On a shared machine single rows jump when the other core is busy:
            # medians per tenth of the run and a least-squares slope show the trend.
            cut = [i * len(rows) // 10 for i in range(11)]
            tenths = [sorted(r["cpu_ms_per_token"] for r in rows[cut[i]:cut[i + 1]]) for i in range(10)]
            med = [t[len(t) // 2] for t in tenths]
            xs = [r["tokens"] for r in rows]
            ys = [r["cpu_ms_per_token"] for r in rows]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            pairs = sorted((ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)))
            theil = pairs[len(pairs) // 2]  # Theil-Sen: the median pairwise slope, robust to single spikes
            print(f"{name}: median cpu ms/token of each tenth of the run (rows {n(int(xs[0]))} – "
                  f"{n(int(xs[-1]))}): " + ", ".join(f"{m:.2f}" for m in med) +
                  f"; last tenth vs first {100.0 * (med[-1] - med[0]) / med[0]:+.1f}%; least-squares slope "
                  f"{slope * 10000:+.3f} ms per 10,000 tokens ({100.0 * slope * (xs[-1] - xs[0]) / my:+.1f}% "
                  f"over the run); Theil-Sen slope {theil * 10000:+.3f} ms per 10,000 tokens "
                  f"({100.0 * theil * (xs[-1] - xs[0]) / my:+.1f}% over the run). RSS min / max {min(r['rss_mb'] for r in rows):.2f} / "
                  f"{max(r['rss_mb'] for r in rows):.2f} MB, KV {min(r['kv_mb'] for r in rows):.2f} / "
                  f"{max(r['kv_mb'] for r in rows):.2f} MB.\n")

    rs = series("recompute")
    if rs:
        rec_rows = [r for r in rs if r["tokens"] > 2000]  # every rebuild holds the full 1,024-token window
        if rec_rows:
            rc = sum(r["cpu_ms_per_token"] for r in rec_rows) / len(rec_rows)
            rw = sum(r["ms_per_token"] for r in rec_rows) / len(rec_rows)
            print(f"Speed at W = 1,024 once the cache is full: recompute:1024 takes {rc:,.0f} cpu ms "
                  f"({rw:,.0f} wall ms) per scored token.")
            for name in ["sink4_k1", "sink4", "sink4_long"]:
                s = series(name)
                c = chunk_of(name)
                how = f"fed {c} tokens per call (--chunk {c})" if c > 1 else "fed token by token"
                rows = [r for r in s[1:] if r["tokens"] % 1000 == 0] if s else []
                if rows:
                    sc = sum(r["cpu_ms_per_token"] for r in rows) / len(rows)
                    sw = sum(r["ms_per_token"] for r in rows) / len(rows)
                    print(f"sink:4:1020 {how} ({name}, {n(int(s[-1]['tokens']))} tokens): {sc:.2f} cpu ms ({sw:.2f} wall ms) per token, "
                          f"{rc / sc:,.0f}x faster than recompute in cpu time ({rw / sw:,.0f}x in wall time).")
            print()

    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        def segments(lp, seg, hi):
            xs, ys = [], []
            for start in range(1, hi, seg):
                vals = [lp[p] for p in range(start, min(start + seg, hi)) if p in lp]
                if len(vals) == min(seg, hi - start) and len(vals) >= seg // 2:
                    xs.append(start + len(vals) - 1)
                    ys.append(ppl(vals))
            return xs, ys

        fig, grid = plt.subplots(2, 2, figsize=(13, 8.4))
        axes = [grid[0][0], grid[1][0], grid[1][1], grid[0][1]]
        ax = axes[0]
        seg = 500
        style = {"full": ("full (model context)", "black"), "window": ("window:1024", "tab:red"),
                 "sink4": ("sink:4:1020", "tab:blue")}
        for name, (label, color) in style.items():
            lp = runs.get(name)
            if lp:
                ax.plot(*segments(lp, seg, min(N, max(lp) + 1)), label=label, color=color, linewidth=1.3)
        ax.axvline(1024, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("tokens of War and Peace")
        ax.set_ylabel(f"perplexity of each {seg}-token segment")
        ax.set_title("Cache of 1,024 tokens, SmolLM2-135M Q4_1")
        ax.legend(fontsize=7)

        ax = axes[3]
        if rec_pos:
            # Running perplexity over the recompute positions from 1,024 on, every policy on the same tokens.
            pos = [p for p in rec_pos if p >= 1024]
            for name, label, color in [("full", "full", "black"), ("window", "window:1024", "tab:red"),
                                       ("recompute", "recompute:1024", "tab:green"),
                                       ("sink4", "sink:4:1020", "tab:blue")]:
                lp = runs.get(name)
                if not lp:
                    continue
                xs, ys, acc, cnt = [], [], 0.0, 0
                for p in pos:
                    if p not in lp:
                        break
                    acc -= lp[p]
                    cnt += 1
                    xs.append(p)
                    ys.append(math.exp(acc / cnt))
                ax.plot(xs, ys, label=label, color=color, linewidth=1.4,
                        linestyle="--" if name == "recompute" else "-", marker="." if name == "recompute" else None)
            ax.set_xlabel("tokens")
            ax.set_ylabel(f"running perplexity over every {stride}th token from 1,024")
            ax.set_title(f"Same tokens as recompute:1024 ({n(len(pos))} positions)")
            ax.legend(fontsize=8)

        ax = axes[1]
        colors = {"window": "tab:red", "sink0": "tab:pink", "sink1": "tab:orange", "sink2": "tab:olive",
                  "sink4": "tab:blue", "sink8": "tab:purple"}
        for k, label in abl:
            lp = runs[k]
            ax.plot(*segments(lp, 1000, min(N, max(lp) + 1) if N else max(lp) + 1),
                    label=label, color=colors[k], linewidth=1.2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens")
        ax.set_ylabel("perplexity of each 1,000-token segment")
        ax.set_title("Sink-count ablation (cache 1,024)")
        ax.legend(fontsize=7)

        ax = axes[2]

        def tag(name):
            c = chunk_of(name)
            return f", chunk {c}" if c > 1 else ", token by token"

        ax2 = ax.twinx()
        shown = False
        for name, label, color in [("sink4_long", "sink:4:1020", "tab:blue"), ("sink4", "sink:4:1020", "tab:cyan"),
                                   ("full", "full", "black")]:
            s = series(name)
            if not s:
                continue
            xs = [r["tokens"] for r in s]
            ax.plot(xs, [r["cpu_ms_per_token"] for r in s], color=color, linewidth=1.2,
                    label=f"{label} cpu ms/token{tag(name)}")
            if name != "sink4" or series("sink4_long") is None:
                ax2.plot(xs, [r["rss_mb"] for r in s], color=color, linestyle="--", linewidth=1,
                         label=f"{label} RSS MB{tag(name)}")
                ax2.plot(xs, [r["kv_mb"] for r in s], color=color, linestyle=":", linewidth=1,
                         label=f"{label} KV MB")
            shown = True
        if shown:
            ax.set_xlabel("tokens")
            ax.set_ylabel("cpu ms per token fed (1 thread)")
            ax.set_ylim(bottom=0)
            ax2.set_ylabel("MB")
            ax2.set_ylim(bottom=0)
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=6, loc="upper right")
            ax.set_title("Time and memory per token")
        for ax in axes[:2]:
            ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
            ax.tick_params(axis="y", which="minor", labelsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=72)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
