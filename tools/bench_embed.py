#!/usr/bin/env python3
"""Embeddings: Ember's throughput against llama.cpp on the same file, and what
embedding a batch of documents costs the chat streams decoding beside it.

    PYTHONPATH=build/bindings/python python3 tools/bench_embed.py [--model FILE] [--docs 32] [--reps 3]
        [--threads 2] [--ref-python ~/.cache/ember/refvenv/bin/python]

Documents: paragraphs of Pride and Prejudice (../shared/data), cut to about
600 characters each. Throughput: input tokens per second of one call
embedding all of them (mean pooling), median of --reps; llama.cpp:
llama-cpp-python's Llama(embedding=True, pooling mean).embed(docs) in the
reference venv (tools/setup_reference.sh), same threads, same documents.

Beside chat: two chat sessions stream 96 greedy tokens each, once alone and
once while another thread embeds the documents on the same engine; reported
per case: the streams' decode rate (tokens after the first over the time after
the first, summed over the streams) and the longest gap between two tokens of
a stream (a stall would show there), and how long the embedding call took.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def documents(n):
    path = os.path.join(ROOT, "..", "shared", "data", "pride_and_prejudice.txt")
    text = open(path, encoding="utf-8").read()
    paras = [" ".join(p.split()) for p in text.split("\n\n")]
    docs, cur = [], ""
    for p in paras:
        if not p:
            continue
        cur = (cur + " " + p).strip()
        if len(cur) >= 600:
            docs.append(cur[:600])
            cur = ""
        if len(docs) == n:
            break
    return docs


def chat_streams(engine, prompts, max_tokens, on_first=None):
    """Streams each prompt in its own thread; returns (decode tok/s summed, longest gap ms)."""
    results = [None] * len(prompts)
    firsts = threading.Barrier(len(prompts) + (1 if on_first else 0))

    def run(i, prompt):
        s = engine.session()
        s.add_message("user", prompt)
        st = s.generate(max_tokens=max_tokens, temperature=0)
        times = []
        first = True
        for _ in st:
            times.append(time.perf_counter())
            if first:
                first = False
                firsts.wait()
        st.close()
        s.close()
        gaps = [b - a for a, b in zip(times, times[1:])]
        results[i] = ((len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0,
                      max(gaps) * 1e3 if gaps else 0.0)

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    extra = None
    if on_first:
        firsts.wait()
        extra = on_first()
    for t in threads:
        t.join()
    return sum(r[0] for r in results), max(r[1] for r in results), extra


REF = r'''
import json, statistics, sys, time
import llama_cpp
from llama_cpp import Llama
model, threads, reps, docs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
llm = Llama(model_path=model, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_threads=threads,
            n_ctx=2048, n_batch=2048, verbose=False)
n = sum(len(llm.tokenize(d.encode())) for d in docs)
llm.embed(docs[:2])
rates = []
for _ in range(reps):
    t0 = time.perf_counter(); llm.embed(docs); rates.append(n / (time.perf_counter() - t0))
print(json.dumps(dict(tokens=n, rate=statistics.median(rates))))
'''


def main():
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ref-python", default=os.path.join(home, "refvenv", "bin", "python"))
    args = ap.parse_args()
    import ember
    docs = documents(args.docs)
    with ember.Model(args.model) as model, ember.Engine(model, n_threads=args.threads) as engine:
        n_tokens = sum(len(model.tokenize(d, add_special=True)) for d in docs)
        engine.embed(docs[:2])
        rates = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            engine.embed(docs)
            rates.append(n_tokens / (time.perf_counter() - t0))
        rate = statistics.median(rates)
        print(f"model {os.path.basename(args.model)}, {args.threads} threads, {len(docs)} documents, "
              f"{n_tokens} tokens, median of {args.reps}")
        print(f"ember: {rate:.0f} tokens/s embedded (mean pooling)")
        prompts = ["Write a short story about a dragon who loves rain.", "Explain how bread is made, step by step."]
        alone = chat_streams(engine, prompts, 96)

        def embed_beside():
            t0 = time.perf_counter()
            engine.embed(docs)
            return (time.perf_counter() - t0) * 1e3

        beside = chat_streams(engine, prompts, 96, on_first=embed_beside)
        print(f"chat, 2 streams alone: decode {alone[0]:.1f} tok/s, longest gap {alone[1]:.1f} ms")
        print(f"chat, 2 streams while {len(docs)} documents are embedded: decode {beside[0]:.1f} tok/s, longest gap "
              f"{beside[1]:.1f} ms; the embedding call took {beside[2]:.0f} ms ({n_tokens / beside[2] * 1e3:.0f} tok/s)")
    if os.path.exists(args.ref_python):
        r = subprocess.run([args.ref_python, "-c", REF, args.model, str(args.threads), str(args.reps),
                            json.dumps(docs)], capture_output=True, text=True)
        if r.returncode != 0:
            print("llama.cpp reference failed:\n" + r.stderr[-2000:], file=sys.stderr)
            return 1
        ref = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"llama.cpp: {ref['rate']:.0f} tokens/s embedded ({ref['tokens']} tokens); "
              f"ember / llama.cpp: {rate / ref['rate']:.2f}x")
    else:
        print(f"no reference venv at {args.ref_python} (tools/setup_reference.sh): llama.cpp not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
