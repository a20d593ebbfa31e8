#!/usr/bin/env python3
"""What a JSON schema costs, Ember against llama.cpp on the same file.

    PYTHONPATH=build/bindings/python python3 tools/bench_structured.py [--model FILE] [--reps 3]
        [--ref-python ~/.cache/ember/refvenv/bin/python] [--threads 2] [--temperature T]

Ember (through its Python binding): the same chat prompts answered greedily
with and without the schema, by 1 session and by 16 sessions at once (one
engine, continuous batching). Reported: generated tokens per second of wall
time from the first token on (decode), the ratio constrained/free, the time
to the first token, and the first stream's start under a new schema (its
compile). The free replies are cut at the constrained replies' lengths so
both decode the same number of tokens.

llama.cpp (llama-cpp-python in the reference venv, tools/setup_reference.sh,
run as a subprocess): the same prompts with LlamaGrammar.from_json_schema
(GBNF, llama.cpp's grammar sampler) and without, one sequence at a time.
Reported the same way (tokens per second after the first token, from the
streamed chunks' times).

Runs alternate constrained and free, `--reps` times; medians are printed.
`--temperature` above 0 samples (top-k 40, top-p 0.95, min-p 0.05, a fixed
seed per prompt, both engines) instead of decoding greedily.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "class": {"enum": ["warrior", "mage", "rogue", "bard"]},
    "likes": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3}},
    "required": ["name", "age", "class", "likes"]}
PROMPTS = ["Describe a fictional hero as JSON.", "Invent a villain and describe them as JSON.",
           "Describe a tavern keeper as JSON.", "Make up a wandering bard as JSON.",
           "Describe a dwarf miner as JSON.", "Describe an elven archer as JSON.",
           "Describe a court wizard as JSON.", "Describe a pirate captain as JSON."]


def ember_run(engine, prompts, schema, max_tokens, temperature=0.0):
    """Starts one stream per prompt at once; returns (decode tok/s, mean ttft ms, lengths)."""
    import ember
    sessions, streams, t_first = [], [], []
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        s = engine.session()
        s.add_message("user", p)
        n = max_tokens[i] if isinstance(max_tokens, list) else max_tokens
        kw = dict(max_tokens=n, temperature=temperature, seed=i + 1)
        if schema is not None:
            kw["json_schema"] = schema
        sessions.append(s)
        streams.append(s.generate(**kw))
    firsts, lengths = [], []
    for st in streams:
        st.read()
        stats = st.stats
        firsts.append(stats.time_to_first_token_ms)
        lengths.append(stats.generated_tokens)
    wall = time.perf_counter() - t0
    # Decode: tokens after each stream's first, over the wall time after the mean first token.
    decode_s = wall - statistics.mean(firsts) / 1e3
    rate = sum(n - 1 for n in lengths) / decode_s
    for st in streams:
        st.close()
    for s in sessions:
        s.close()
    return rate, statistics.mean(firsts), lengths


def bench_ember(model_path, threads, reps, temperature):
    import ember
    out = {}
    with ember.Model(model_path) as model, ember.Engine(model, n_threads=threads) as engine:
        # The first stream under a new schema compiles it (and, the first time, the vocabulary's view).
        s = engine.session()
        s.add_message("user", PROMPTS[0])
        t0 = time.perf_counter()
        st = s.generate(max_tokens=1, temperature=0, json_schema=dict(SCHEMA, title="fresh"))
        out["first_start_ms"] = (time.perf_counter() - t0) * 1e3
        st.read()
        st.close()
        s.close()
        for n in (1, 16):
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
            ember_run(engine, prompts, SCHEMA, 160, temperature)  # warm
            cons, free, ttft_c, ttft_f = [], [], [], []
            for _ in range(reps):
                rate, ttft, lengths = ember_run(engine, prompts, SCHEMA, 160, temperature)
                cons.append(rate)
                ttft_c.append(ttft)
                rate, ttft, _ = ember_run(engine, prompts, None, lengths, temperature)
                free.append(rate)
                ttft_f.append(ttft)
            out[n] = dict(constrained=statistics.median(cons), free=statistics.median(free),
                          ttft_constrained=statistics.median(ttft_c), ttft_free=statistics.median(ttft_f))
    return out


REF_SNIPPET = r'''
import json, statistics, sys, time
from llama_cpp import Llama, LlamaGrammar
model, threads, reps, schema, prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
temperature = float(sys.argv[6])
llm = Llama(model_path=model, n_threads=threads, n_ctx=2048, verbose=False, seed=1)
t0 = time.perf_counter()
grammar = LlamaGrammar.from_json_schema(schema, verbose=False)
compile_ms = (time.perf_counter() - t0) * 1e3
def run(prompt, grammar, max_tokens):
    t0 = time.perf_counter(); first = None; n = 0
    for chunk in llm.create_chat_completion([{"role": "user", "content": prompt}], temperature=temperature,
                                            top_k=40, top_p=0.95, min_p=0.05, seed=1, max_tokens=max_tokens,
                                            grammar=grammar, stream=True):
        if chunk["choices"][0]["delta"].get("content"):
            n += 1
            if first is None: first = time.perf_counter()
    end = time.perf_counter()
    return (n - 1) / (end - first) if n > 1 else 0.0, (first - t0) * 1e3 if first else 0.0, n
cons, free, tc, tf = [], [], [], []
run(prompts[0], grammar, 160)
for _ in range(reps):
    for p in prompts:
        r, t, n = run(p, grammar, 160); cons.append(r); tc.append(t)
        r, t, _ = run(p, None, max(n, 2)); free.append(r); tf.append(t)
print(json.dumps(dict(compile_ms=compile_ms, constrained=statistics.median(cons), free=statistics.median(free),
                      ttft_constrained=statistics.median(tc), ttft_free=statistics.median(tf))))
'''


def bench_ref(ref_python, model_path, threads, reps, temperature):
    r = subprocess.run([ref_python, "-c", REF_SNIPPET, model_path, str(threads), str(reps), json.dumps(SCHEMA),
                        json.dumps(PROMPTS[:4]), str(temperature)], capture_output=True, text=True)
    if r.returncode != 0:
        print("llama.cpp reference failed:\n" + r.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ref-python", default=os.path.join(home, "refvenv", "bin", "python"))
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); above 0: sampled")
    args = ap.parse_args()
    e = bench_ember(args.model, args.threads, args.reps, args.temperature)
    mode = "greedy" if args.temperature <= 0 else f"sampled at temperature {args.temperature}"
    print(f"model {os.path.basename(args.model)}, {args.threads} threads, {mode}, median of {args.reps}")
    print(f"ember: first stream under a new schema starts in {e['first_start_ms']:.1f} ms")
    for n in (1, 16):
        r = e[n]
        print(f"ember {n:2d} session(s): decode {r['constrained']:.1f} tok/s with the schema, {r['free']:.1f} free "
              f"({r['constrained'] / r['free']:.3f}x); TTFT {r['ttft_constrained']:.1f} / {r['ttft_free']:.1f} ms")
    if os.path.exists(args.ref_python):
        ref = bench_ref(args.ref_python, args.model, args.threads, args.reps, args.temperature)
        if ref:
            print(f"llama.cpp  1 sequence: decode {ref['constrained']:.1f} tok/s with the grammar, {ref['free']:.1f} "
                  f"free ({ref['constrained'] / ref['free']:.3f}x); TTFT {ref['ttft_constrained']:.1f} / "
                  f"{ref['ttft_free']:.1f} ms; schema -> grammar {ref['compile_ms']:.1f} ms")
            print(f"ember / llama.cpp, constrained decode at 1 session: {e[1]['constrained'] / ref['constrained']:.2f}x")
    else:
        print(f"no reference venv at {args.ref_python} (tools/setup_reference.sh): llama.cpp not measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
