#!/usr/bin/env python3
"""LoRA adapters per session: 16 sessions over 4 different rank-16 adapters
against 16 sessions without adapters, on one engine, and llama.cpp on the
same work (it applies one adapter set per context, so its sessions run one
adapter at a time, one after another).

    python3 tools/bench_lora.py [--model FILE] [--adapters 4] [--rank 16] [--sessions 16]
        [--prompt 64] [--gen 64] [--reps 3] [--threads 2] [--no-llama]
        [--ref-python ~/.cache/ember/refvenv/bin/python]

The adapters are written by make_synthetic_model --lora-for (F16, seeds 1..N)
into build/bench_lora/. Ember: `ember bench --sessions S --lora A1 ... --json`
(session i decodes with adapter i mod N; greedy, random prompts of --prompt
tokens, --gen tokens each): aggregate tokens/s over the whole run (prefill
included) and steady decode tokens/s (every session decoding), median of
--reps, base and adapters alternated. llama.cpp (llama-cpp-python in the
reference venv, tools/setup_reference.sh): per adapter one Llama with
lora_path, its S/N sessions each a --prompt token prompt and --gen greedy
tokens; generated tokens over the wall time of all sessions.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LLAMA = r"""
import json, random, sys, time
from llama_cpp import Llama
model, adapters, sessions, n_prompt, n_gen, threads = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rng = random.Random(4321)
per = sessions // len(adapters)
total, wall = 0, 0.0
for a in adapters:
    llm = Llama(model_path=model, lora_path=a or None, n_ctx=n_prompt + n_gen + 8, n_threads=threads, n_batch=512,
                verbose=False)
    vocab = llm.n_vocab()
    t0 = time.perf_counter()
    for s in range(per):
        llm.reset()
        prompt = [rng.randrange(vocab) for _ in range(n_prompt)]
        llm.eval(prompt)
        for _ in range(n_gen):
            tok = llm.sample(temp=0.0)
            llm.eval([tok])
            total += 1
    wall += time.perf_counter() - t0
    del llm
print(json.dumps({"generated": total, "wall_s": wall, "tokens_per_second": total / wall}))
"""


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    home = os.environ.get("EMBER_HOME", os.path.expanduser("~/.cache/ember"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--ref-python", default=os.path.join(home, "refvenv", "bin", "python"))
    a = ap.parse_args()
    ember = os.path.join(ROOT, "build", "apps", "cli", "ember")
    maker = os.path.join(ROOT, "build", "tools", "make_synthetic_model")
    out = os.path.join(ROOT, "build", "bench_lora")
    os.makedirs(out, exist_ok=True)
    tag = os.path.splitext(os.path.basename(a.model))[0]
    adapters = []
    for s in range(1, a.adapters + 1):
        f = os.path.join(out, f"{tag}_r{a.rank}_s{s}.gguf")
        if not os.path.exists(f):
            run([maker, "--lora-for", a.model, "--rank", str(a.rank), "--seed", str(s), "--out", f])
        adapters.append(f)
    bench = [ember, "bench", "-m", a.model, "--sessions", str(a.sessions), "-p", str(a.prompt), "-n", str(a.gen),
             "-t", str(a.threads), "--json"]
    lora_args = [x for f in adapters for x in ("--lora", f)]
    base, lora = [], []
    for _ in range(a.reps):
        base.append(json.loads(run(bench)))
        lora.append(json.loads(run(bench + lora_args)))

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    agg_b, agg_l = med(base, "aggregate_tokens_per_second"), med(lora, "aggregate_tokens_per_second")
    st_b, st_l = med(base, "steady_decode_tokens_per_second"), med(lora, "steady_decode_tokens_per_second")
    print(f"model {os.path.basename(a.model)}, {a.sessions} sessions, {a.adapters} adapters of rank {a.rank} "
          f"({os.path.getsize(adapters[0]) / 2**20:.1f} MiB each), prompt {a.prompt}, gen {a.gen}, "
          f"{a.threads} threads, medians of {a.reps}")
    print(f"ember without adapters: aggregate {agg_b:.1f} tok/s, steady decode {st_b:.1f} tok/s")
    print(f"ember with adapters:    aggregate {agg_l:.1f} tok/s, steady decode {st_l:.1f} tok/s")
    steady = f"{st_l / st_b:.3f}" if st_b > 0 else "n/a (no step had every session decoding)"
    print(f"ratio (adapters / none): aggregate {agg_l / agg_b:.3f}, steady decode {steady}")
    if a.no_llama:
        return
    if not os.path.exists(a.ref_python):
        print(f"llama.cpp: no reference venv at {a.ref_python} (tools/setup_reference.sh)")
        return
    ref = json.loads(run([a.ref_python, "-c", LLAMA, a.model, ",".join(adapters), str(a.sessions), str(a.prompt),
                          str(a.gen), str(a.threads)]))
    print(f"llama.cpp with adapters (one adapter at a time, sessions in turn): {ref['tokens_per_second']:.1f} tok/s "
          f"({ref['generated']} tokens in {ref['wall_s']:.1f} s)")
    print(f"ember with adapters / llama.cpp with adapters: aggregate {agg_l / ref['tokens_per_second']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
