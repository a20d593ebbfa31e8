#!/usr/bin/env python3
"""Speculative decoding benchmark: drafter x task, one run.

For each task and each drafter configuration, `ember bench --spec` decodes the
same prompt greedily with and without speculation on one engine (alternating,
-r repetitions after a warm-up) and reports acceptance, mean accepted length,
tokens/s against plain decoding and whether the outputs were identical. A
"chain" row is the same drafter with branching off (threshold > 1: only the
most likely candidate extends a branch) at the same node budget.

Tasks (prompts built from ../shared/data and bench/spec/):
  rewrite    chat: rewrite a passage of Pride and Prejudice in modern English
  summarise  chat: summarise the same passage
  code       completion: continue bench/spec/code_prompt.py
  chat       chat: a free question (nothing to copy from)

Usage:
  tools/bench_spec.py [--ember build/apps/cli/ember] [--threads 2] [--tokens 128] [--reps 2]
                      [--drafters ngram,self:20,draft,distilled] [--nodes 12] [--no-chain]
                      [--tasks rewrite,summarise,code,chat] [--ember-args "..."]

Drafters: ngram, self[:L], draft (a second copy of the target: exactness,
not speed), distilled (the draft tools/distill_draft.py writes to
$EMBER_HOME/draft/smollm2-draft.gguf), or any draft:PATH.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")


def passage():
    """The opening of Pride and Prejudice, about 130 words (SmolLM2-135M ends
    its reply early on much longer passages)."""
    text = open(os.path.join(DATA, "pride_and_prejudice.txt"), encoding="utf-8").read()
    start = text.index("It is a truth universally acknowledged")
    return " ".join(text[start:start + 700].split())


def tasks():
    p = passage()
    code = open(os.path.join(ROOT, "bench", "spec", "code_prompt.py"), encoding="utf-8").read()
    return [
        ("rewrite", True, "Rewrite the following passage in simple modern English:\n\n" + p),
        ("summarise", True, "Summarise the following passage in a few sentences:\n\n" + p),
        ("code", False, code),
        ("chat", True, "What are five good habits for staying healthy? Explain each briefly."),
    ]


def ember_home():
    return os.environ.get("EMBER_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "ember")


def default_model():
    return os.path.join(ember_home(), "SmolLM2-135M-Instruct.Q4_1.gguf")


def distilled_draft():
    """The draft tools/distill_draft.py makes (the drafter name "distilled")."""
    path = os.path.join(ember_home(), "draft", "smollm2-draft.gguf")
    if not os.path.exists(path):
        sys.exit("bench_spec: no distilled draft at %s (make it with tools/distill_draft.py)" % path)
    return path


def run(args, spec, chat, prompt_file, extra):
    cmd = [args.ember, "bench", "-m", args.model, "--spec", spec, "--prompt-file", prompt_file, "-n",
           str(args.tokens), "-t", str(args.threads), "-r", str(args.reps), "--json"] + extra + args.ember_args.split()
    if chat:
        cmd.append("--chat")
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode not in (0, 1) or not out.stdout.strip():
        sys.exit("bench_spec: %s failed: %s" % (" ".join(cmd), out.stderr.strip()))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ember", default=os.path.join(ROOT, "build", "apps", "cli", "ember"))
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--drafters", default="ngram,self:20,draft")
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--no-chain", action="store_true", help="skip the chain rows")
    ap.add_argument("--ember-args", default="",
                    help="more `ember bench` arguments for every run, e.g. \"--spec-depth 12 --spec-alpha 0.1\"")
    ap.add_argument("--tasks", default="rewrite,summarise,code,chat")
    args = ap.parse_args()
    wanted = set(args.tasks.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, chat, prompt in tasks():
            if name not in wanted:
                continue
            pf = os.path.join(tmp, name + ".txt")
            open(pf, "w", encoding="utf-8").write(prompt)
            for d in args.drafters.split(","):
                # (the distilled draft is looked for only when asked for)
                spec = ("draft:" + args.model if d == "draft" else "draft:" + distilled_draft() if d == "distilled"
                        else d)
                shapes = [("tree", ["--spec-nodes", str(args.nodes)])]
                if not args.no_chain:
                    shapes.append(("chain", ["--spec-nodes", str(args.nodes), "--spec-threshold", "2"]))
                for shape, extra in shapes:
                    r = run(args, spec, chat, pf, extra)
                    rows.append((name, d, shape, r))
                    print("%-9s %-8s %-5s plain %6.1f spec %6.1f tok/s  x%.2f  accept %5.1f%%  len %.2f  %s" % (
                        name, d, shape, r["plain_tokens_per_second"], r["spec_tokens_per_second"], r["speedup"],
                        100 * r["acceptance_rate"], r["mean_accepted_length"],
                        "identical" if r["identical"] else "DIFFER"), flush=True)
    print()
    print("| task | drafter | shape | plain tok/s | speculative tok/s | speedup | drafted | accepted | acceptance "
          "| mean accepted length | verify passes | output |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, d, shape, r in rows:
        print("| %s | %s | %s | %.1f | %.1f | %.2fx | %d | %d | %.1f%% | %.2f | %d | %s |" % (
            name, d, shape, r["plain_tokens_per_second"], r["spec_tokens_per_second"], r["speedup"], r["drafted"],
            r["accepted"], 100 * r["acceptance_rate"], r["mean_accepted_length"], r["verify_passes"],
            "identical" if r["identical"] else "DIFFERS"))
    return 0 if all(r["identical"] for _, _, _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
