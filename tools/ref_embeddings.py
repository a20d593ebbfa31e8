#!/usr/bin/env python3
"""llama.cpp's pooled embeddings of a few texts, for tests/integration/embed_test.cpp's goldens.

    ~/.cache/ember/refvenv/bin/python tools/ref_embeddings.py [--model FILE] --out tests/golden/embeddings/NAME.json
    ~/.cache/ember/refvenv/bin/python tools/ref_embeddings.py --synthetic build --out tests/golden/embeddings/synthetic.json

Runs under the reference venv (tools/setup_reference.sh: llama-cpp-python).
For each pooling (mean, last, cls) a context with embedding=True and that
pooling type embeds each text alone (tokenized as llama-cpp-python's embed()
does: the model's BOS, special tokens not parsed), unnormalised. Writes the
texts, their tokens and the vectors (7 significant digits) as JSON, and how
far llama.cpp is from itself: the cosine between those vectors and the same
texts run with flash attention (flash_attn=True: its other attention
numerics), per pooling and text ("self_cosine"; Gemma 3's last-token states
differ by up to ~5e-3 that way).
"""
import argparse
import hashlib
import json
import os

import llama_cpp
import numpy as np
from llama_cpp import Llama

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "A tavern keeper sells ale to the travellers who pass through the village.",
    "def add(a, b):\n    return a + b",
    "Ünïcödé, 日本語 and emoji 🙂 in one line.",
    "Hi",
]
POOLING = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
           "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS}


# Token ids for the synthetic files (tools/make_synthetic_model: a 384-token
# vocabulary), given to both engines as ids.
SYNTHETIC_ARCHS = ["llama3", "qwen2", "gemma3", "mistral", "qwen3"]
SYNTHETIC_INPUTS = [[1, 17, 42, 99, 150, 7, 300, 5], [2, 250, 251, 252], [3] + [(i * 37) % 380 + 1 for i in range(40)]]


def embed_ids(llm, ids):
    """llama-cpp-python's embed() for a list of token ids (it takes text only)."""
    llm._ctx.kv_cache_clear()
    llm._batch.reset()
    llm._batch.add_sequence(ids, 0, True)
    llm._ctx.decode(llm._batch)
    ptr = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
    return [float(f"{ptr[i]:.7g}") for i in range(llm.n_embd())]


def synthetic(build_dir, out_path):
    out = {"command": "tools/ref_embeddings.py --synthetic " + build_dir, "llama_cpp_python": llama_cpp.__version__,
           "inputs": SYNTHETIC_INPUTS, "models": {}}
    for arch in SYNTHETIC_ARCHS:
        path = os.path.join(build_dir, "tests", "synthetic", arch + ".gguf")
        entry = {"sha256": hashlib.sha256(open(path, "rb").read()).hexdigest(), "vectors": {}}
        for name, kind in POOLING.items():
            llm = Llama(model_path=path, embedding=True, pooling_type=kind, n_threads=2, n_ctx=128, verbose=False)
            entry["vectors"][name] = [embed_ids(llm, ids) for ids in SYNTHETIC_INPUTS]
            del llm
        out["models"][arch] = entry
    with open(out_path, "w") as f:
        json.dump(out, f)
        f.write("\n")


def main():
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--synthetic", metavar="BUILD_DIR",
                    help="instead: the synthetic files of every architecture in BUILD_DIR/tests/synthetic, fixed ids")
    args = ap.parse_args()
    if args.synthetic:
        return synthetic(args.synthetic, args.out)
    out = {"model": os.path.basename(args.model), "llama_cpp_python": llama_cpp.__version__,
           "command": "tools/ref_embeddings.py --model " + os.path.basename(args.model), "texts": TEXTS,
           "tokens": [], "vectors": {}, "self_cosine": {}}
    for name, kind in POOLING.items():
        llm = Llama(model_path=args.model, embedding=True, pooling_type=kind, n_threads=2, n_ctx=512, verbose=False)
        if not out["tokens"]:
            out["tokens"] = [llm.tokenize(t.encode("utf-8")) for t in TEXTS]
        out["vectors"][name] = [[float(f"{x:.7g}") for x in llm.embed(t, normalize=False)] for t in TEXTS]
        del llm
        one = Llama(model_path=args.model, embedding=True, pooling_type=kind, n_threads=2, n_ctx=512, flash_attn=True,
                    verbose=False)
        cos = []
        for t, v in zip(TEXTS, out["vectors"][name]):
            a, b = np.array(v, dtype=np.float64), np.array(one.embed(t, normalize=False), dtype=np.float64)
            cos.append(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
        out["self_cosine"][name] = cos
        del one
    with open(args.out, "w") as f:
        json.dump(out, f, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
