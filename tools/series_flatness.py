#!/usr/bin/env python3
"""Flatness of a long streaming run: reads the --series CSV of
`ember perplexity --stream` (tokens, ppl, ppl_recent, ms_per_token,
cpu_ms_per_token, rss_mb, kv_mb; one row per 1,000 tokens) and prints, as
Markdown for docs/BENCHMARKS.md:

  - ms/token (wall and cpu) of the first row after warm-up and of the last;
  - the median ms/token of each tenth of the run (rows after the first 1,000
    tokens), the last tenth against the first and the largest against the
    smallest: the "flat within 5%" check of issue 5;
  - resident memory and KV bytes, min and max over the same rows;
  - a table of the medians per 100,000 tokens.

Usage: tools/series_flatness.py SERIES.csv [--out OUT_FILE_OF_THE_RUN]
(the run's stdout, for its final `ppl=... tokens=...` line).
"""
import argparse
import csv
import re
import statistics as st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("series")
    ap.add_argument("--out", help="the run's stdout (final ppl line)")
    ap.add_argument("--segment", type=int, default=100000, help="tokens per table row")
    a = ap.parse_args()
    rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(open(a.series))]
    if len(rows) < 12:
        raise SystemExit("too few rows for tenths")
    last = rows[-1]
    final = None
    if a.out:
        m = re.search(r"ppl=([0-9.]+) tokens=(\d+)", open(a.out).read())
        final = m.group(0) if m else None
    body = [r for r in rows if r["tokens"] > 1000]
    n = len(body)
    bounds = [round(i * n / 10) for i in range(11)]
    tenths = [body[bounds[i]:bounds[i + 1]] for i in range(10)]
    cpu = [st.median(r["cpu_ms_per_token"] for r in t) for t in tenths]
    wall = [st.median(r["ms_per_token"] for r in t) for t in tenths]
    rss = [r["rss_mb"] for r in body]
    kv = [r["kv_mb"] for r in body]
    first = body[0]
    print(f"- result: `{final}`" if final else f"- stopped at token {int(last['tokens']):,}: running ppl {last['ppl']:.4f}")
    print(f"- wall / cpu ms per token, tokens {int(first['tokens']) - 999:,}-{int(first['tokens']):,}: "
          f"{first['ms_per_token']:.2f} / {first['cpu_ms_per_token']:.2f}; last 1,000 (to {int(last['tokens']):,}): "
          f"{last['ms_per_token']:.2f} / {last['cpu_ms_per_token']:.2f}")
    for name, med in (("cpu", cpu), ("wall", wall)):
        print(f"- median {name} ms/token of each tenth of the run: {', '.join(f'{x:.2f}' for x in med)} "
              f"(last tenth vs first {100 * (med[-1] / med[0] - 1):+.1f}%; max vs min {100 * (max(med) / min(med) - 1):.1f}%)")
    print(f"- RSS min / max: {min(rss):.2f} / {max(rss):.2f} MB; KV {min(kv):.2f} / {max(kv):.2f} MB "
          f"(rows after the first 1,000 tokens)")
    print()
    print("| tokens | median ppl of the 1,000-token rows | median cpu ms/token | median wall ms/token |")
    print("|---|---:|---:|---:|")
    end = int(last["tokens"])
    for lo in range(0, end, a.segment):
        seg = [r for r in rows if lo < r["tokens"] <= lo + a.segment]
        if seg:
            print(f"| {lo:,} – {min(lo + a.segment, end):,} | {st.median(r['ppl_recent'] for r in seg):.2f} | "
                  f"{st.median(r['cpu_ms_per_token'] for r in seg):.2f} | {st.median(r['ms_per_token'] for r in seg):.2f} |")


if __name__ == "__main__":
    main()
