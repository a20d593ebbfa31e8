#!/usr/bin/env python3
"""Structured output, checked from outside: every reply Ember gives under a
JSON schema must parse and validate with Python's `jsonschema` (an
independent validator), for every schema in tests/structured/schemas.json,
greedy and sampled at several temperatures and seeds, on each model given.

    PYTHONPATH=build/bindings/python python3 tests/structured/eval_schemas.py \
        --model ~/.cache/ember/SmolLM2-135M-Instruct.Q4_1.gguf \
        --model ~/.cache/ember/gemma-3-270m-q4_k_m.gguf [--runs greedy,0.8:1,1.0:2] [--json OUT]

(without --model: both of those, from $EMBER_HOME).

Each run is one of `greedy` or `TEMP:SEED`. The replies of one model run
concurrently (16 sessions on one engine: continuous batching, constrained
rows beside each other). Also checked: greedy speculative decoding (n-gram
drafter) gives the same reply as plain greedy, under every schema. Prints one
line per (schema, run) that fails and a summary per model (replies, valid,
ended by EOS, first-start time per schema: its compile time); exits 1 on any
invalid reply, 0 otherwise. A model file that is absent is skipped (exit 77
if none is present, unless $CI is set).
"""
import argparse
import json
import os
import sys
import time

import jsonschema

import ember

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_runs(text):
    runs = []
    for r in text.split(","):
        if r == "greedy":
            runs.append(("greedy", 0.0, 0))
        else:
            t, s = r.split(":")
            runs.append((r, float(t), int(s)))
    return runs


def evaluate(path, cases, runs, max_tokens, concurrency):
    failures = []
    stats = {"model": os.path.basename(path), "replies": 0, "valid": 0, "eos": 0, "spec_equal": 0,
             "first_start_ms": {}}
    with ember.Model(path) as model, ember.Engine(model) as engine:
        jobs = [(c, r) for c in cases for r in runs] + [(c, ("spec", 0.0, 0)) for c in cases]
        for at in range(0, len(jobs), concurrency):
            batch = []
            for case, (run, temp, seed) in jobs[at:at + concurrency]:
                session = engine.session()
                session.add_message("user", case["prompt"])
                kw = dict(max_tokens=max_tokens, temperature=temp, json_schema=case["schema"])
                if temp > 0:
                    kw["seed"] = seed
                if run == "spec":
                    kw["spec_drafter"] = "ngram"
                t0 = time.perf_counter()
                stream = session.generate(**kw)
                ms = (time.perf_counter() - t0) * 1e3
                stats["first_start_ms"].setdefault(case["name"], round(ms, 1))
                batch.append((case, run, session, stream))
            for case, run, session, stream in batch:
                text = stream.read()
                end = stream.end_reason
                stream.close()
                session.close()
                if run == "spec":
                    greedy = stats.setdefault("_greedy", {}).get(case["name"])
                    if greedy is not None and greedy == text:
                        stats["spec_equal"] += 1
                    elif greedy is not None:
                        failures.append(f"{case['name']} spec: speculative greedy {text!r} != plain {greedy!r}")
                    continue
                if run == "greedy":
                    stats.setdefault("_greedy", {})[case["name"]] = text
                stats["replies"] += 1
                stats["eos"] += end == ember.EndReason.EOS
                try:
                    value = json.loads(text)
                    jsonschema.validate(value, case["schema"])
                    stats["valid"] += 1
                except (ValueError, jsonschema.ValidationError) as e:
                    failures.append(f"{case['name']} {run}: {type(e).__name__}: {str(e).splitlines()[0]} "
                                    f"(end {end.value}): {text!r}")
    stats.pop("_greedy", None)
    return stats, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    ap.add_argument("--model", action="append",
                    help="a GGUF file (repeatable; default: SmolLM2 and Gemma 3 in $EMBER_HOME)")
    ap.add_argument("--schemas", default=os.path.join(HERE, "schemas.json"))
    ap.add_argument("--runs", default="greedy,0.8:1,1.0:2")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    if not args.model:
        args.model = [os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"),
                      os.path.join(home, "gemma-3-270m-q4_k_m.gguf")]
    with open(args.schemas) as f:
        cases = json.load(f)
    for c in cases:
        jsonschema.Draft202012Validator.check_schema(c["schema"])
    runs = parse_runs(args.runs)
    present = [m for m in args.model if os.path.exists(os.path.expanduser(m))]
    for m in args.model:
        if m not in present:
            print(f"model not found, skipped: {m}")
    if not present:
        return 1 if os.environ.get("CI") else 77
    summaries, all_failures = [], []
    for m in present:
        t0 = time.perf_counter()
        stats, failures = evaluate(os.path.expanduser(m), cases, runs, args.max_tokens, args.concurrency)
        stats["seconds"] = round(time.perf_counter() - t0, 1)
        summaries.append(stats)
        all_failures += [f"{stats['model']}: {x}" for x in failures]
        starts = sorted(stats["first_start_ms"].values())
        print(f"{stats['model']}: {len(cases)} schemas x {len(runs)} runs: {stats['valid']}/{stats['replies']} valid, "
              f"{stats['eos']} ended by EOS; speculative greedy equal on {stats['spec_equal']}/{len(cases)}; "
              f"first start (compile) median {starts[len(starts) // 2]:.1f} ms, max {starts[-1]:.1f} ms; "
              f"{stats['seconds']} s")
    for f in all_failures:
        print("FAIL " + f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summaries, f, indent=1)
    return 1 if all_failures else 0


if __name__ == "__main__":
    sys.exit(main())
