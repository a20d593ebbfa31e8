#!/usr/bin/env python3
"""llama.cpp's greedy continuations with LoRA adapters applied, and without, for tests/golden/lora/.

    PY=/root/.cache/ember/refvenv/bin/python
    $PY tools/ref_lora.py --model BASE.gguf --lora ADAPTER.gguf[:SCALE] [--lora ...] \\
        --prompt "The capital of France is" [--prompt ...] [--n 32] [--out tests/golden/lora/NAME.json] \\
        [--adapter-command "make_synthetic_model --lora-for ..."]

Runs under the reference venv (tools/setup_reference.sh: llama-cpp-python). Each prompt is tokenized
with llama.cpp's tokenizer (the BOS the model's metadata asks for, special tokens not parsed), then
continued greedily (argmax of the last row, EOS ignored, one llama_decode per generated token) twice:
with the adapters set on the context (llama_adapter_lora_init + llama_set_adapters_lora, each at its
scale; llama.cpp multiplies it by adapter.lora.alpha / rank) and on a second context without them
("base_tokens"). Adapter files are GGUF LoRA adapters as llama.cpp's convert_lora_to_gguf.py writes
(tools/make_synthetic_model --lora-for writes random ones). Writes JSON (stdout without --out):

    {"model": basename, "model_sha256": ..., "lora": [{"file": basename, "scale": s, "sha256": ...}],
     "generator": "llama-cpp-python <version>", "command": this run (from the repository root), "n": N,
     "eos": "ignored", "n_threads": 2, "adapter_command": ... (with --adapter-command),
     "prompts": [{"prompt": text, "prompt_tokens": [...], "tokens": [...], "base_tokens": [...],
                  "gaps": [...], "base_gaps": [...], "text": ..., "base_text": ...}]}

"gaps" are llama.cpp's top1 - top2 logit gaps at each generated step (small ones are near-ties that
another engine's rounding may legitimately flip); "text" / "base_text" are the detokenized
continuations, for reading. --verbose shows llama.cpp's log (adapter loading and its warnings).
"""
import argparse
import ctypes
import hashlib
import json
import os
import shlex
import sys

import llama_cpp
import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def short_path(path):
    """path relative to the repository when inside it, else with the home directory as ~."""
    full, home = os.path.abspath(path), os.path.expanduser("~")
    if full.startswith(ROOT + os.sep):
        return os.path.relpath(full, ROOT)
    return "~" + full[len(home):] if full.startswith(home + os.sep) else full


def command_line(args, loras):
    """This run's command, from the repository's root."""
    cmd = ["tools/ref_lora.py", "--model", short_path(args.model)]
    for path, scale in loras:
        cmd += ["--lora", shlex.quote(f"{short_path(path)}:{scale:g}")]
    for text in args.prompt:
        cmd += ["--prompt", shlex.quote(text)]
    cmd += ["--n", str(args.n)]
    if args.out:
        cmd += ["--out", shlex.quote(short_path(args.out))]
    return " ".join(cmd)


def dump(out):
    """JSON with one key per line and each value (token lists included) on its line."""
    def one(v):
        return json.dumps(v, ensure_ascii=False)
    lines = ["{"]
    for i, (k, v) in enumerate(out.items()):
        end = "," if i + 1 < len(out) else ""
        if k in ("lora", "prompts"):
            lines.append(f" {one(k)}: [")
            for j, item in enumerate(v):
                lines.append("  {")
                lines += [f"   {one(kk)}: {one(vv)}" + ("," if n + 1 < len(item) else "")
                          for n, (kk, vv) in enumerate(item.items())]
                lines.append("  }" + ("," if j + 1 < len(v) else ""))
            lines.append(" ]" + end)
        else:
            lines.append(f" {one(k)}: {one(v)}{end}")
    lines.append("}")
    text = "\n".join(lines)
    assert json.loads(text) == out
    return text


def parse_lora(spec):
    """FILE[:SCALE] (a FILE containing ':' needs the :SCALE)."""
    path, scale = spec, 1.0
    if ":" in spec:
        head, tail = spec.rsplit(":", 1)
        try:
            scale = float(tail)
            path = head
        except ValueError:
            pass
    if not os.path.isfile(path):
        sys.exit(f"ref_lora: no adapter file {path!r}")
    return path, scale


def load(model, loras, verbose):
    llm = Llama(model_path=model, n_ctx=512, n_threads=2, n_threads_batch=2, seed=0, logits_all=False,
                verbose=verbose)
    if loras:
        adapters = []
        for path, _ in loras:
            a = llama_cpp.llama_adapter_lora_init(llm._model.model, path.encode("utf-8"))
            if not a:
                sys.exit(f"ref_lora: llama.cpp could not load the adapter {path!r} (run with --verbose)")
            llm._stack.callback(llama_cpp.llama_adapter_lora_free, a)  # before the model is freed
            adapters.append(a)
        arr = (llama_cpp.llama_adapter_lora_p_ctypes * len(adapters))(*adapters)
        scales = (ctypes.c_float * len(loras))(*[s for _, s in loras])
        if llama_cpp.llama_set_adapters_lora(llm._ctx.ctx, arr, len(adapters), scales):
            sys.exit("ref_lora: llama_set_adapters_lora failed")
    return llm


def greedy(llm, prompt, n):
    """Argmax continuation, EOS ignored; returns the ids and the top1-top2 logit gap of each step."""
    llm.reset()
    llm.eval(prompt)
    out, gaps = [], []
    for _ in range(n):
        # logits_all=False: the context keeps the last row only (llm.scores stays empty).
        ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        row = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).astype(np.float32)
        tok = int(np.argmax(row))
        top2 = np.partition(row, -2)[-2:]
        gaps.append(round(float(top2[1] - top2[0]), 4))
        out.append(tok)
        llm.eval([tok])
    return out, gaps


def main():
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--lora", action="append", required=True, metavar="FILE[:SCALE]",
                    help="a GGUF LoRA adapter and its scale (default 1); repeatable")
    ap.add_argument("--prompt", action="append", required=True, help="repeatable")
    ap.add_argument("--n", type=int, default=32, help="greedy tokens per prompt (default 32)")
    ap.add_argument("--out", help="JSON file (default: stdout)")
    ap.add_argument("--adapter-command", help="recorded as adapter_command: the command that regenerates the adapter")
    ap.add_argument("--verbose", action="store_true", help="llama.cpp's log on stderr")
    args = ap.parse_args()
    loras = [parse_lora(s) for s in args.lora]

    out = {"model": os.path.basename(args.model), "model_sha256": sha256(args.model),
           "lora": [{"file": os.path.basename(p), "scale": s, "sha256": sha256(p)} for p, s in loras],
           "generator": f"llama-cpp-python {llama_cpp.__version__}",
           "command": command_line(args, loras),
           "n": args.n, "eos": "ignored", "n_threads": 2}
    if args.adapter_command:
        out["adapter_command"] = args.adapter_command
    out["prompts"] = []

    base = load(args.model, [], args.verbose)
    for text in args.prompt:
        ids = base.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        toks, gaps = greedy(base, ids, args.n)
        out["prompts"].append({"prompt": text, "prompt_tokens": ids, "base_tokens": toks, "base_gaps": gaps,
                               "base_text": base.detokenize(toks).decode("utf-8", "replace")})
    del base
    llm = load(args.model, loras, args.verbose)
    for p in out["prompts"]:
        toks, gaps = greedy(llm, p["prompt_tokens"], args.n)
        p["tokens"], p["gaps"] = toks, gaps
        p["text"] = llm.detokenize(toks).decode("utf-8", "replace")
        diverge = next((i for i, (a, b) in enumerate(zip(toks, p["base_tokens"])) if a != b), None)
        print(f"ref_lora: {p['prompt']!r}: adapter diverges from base at token "
              f"{'never' if diverge is None else diverge}\n  base:    {p['base_text']!r}\n  adapter: {p['text']!r}",
              file=sys.stderr)
    del llm
    # Field order for reading: the prompt, then the adapter's run, then the base's.
    keys = ["prompt", "prompt_tokens", "tokens", "base_tokens", "gaps", "base_gaps", "text", "base_text"]
    out["prompts"] = [{k: p[k] for k in keys} for p in out["prompts"]]
    text = dump(out)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"ref_lora: wrote {args.out}", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()
