#!/usr/bin/env python3
"""llama.cpp's log-probabilities of a greedy continuation, decoded token by
token (as a stream generates), for tests/capi/logits_test.cpp's golden values.

    ~/.cache/ember/refvenv/bin/python tools/ref_logprobs.py [--model FILE] [--prompt TEXT] [-n 12]

Runs under the reference venv (tools/setup_reference.sh). Prints the greedy
tokens and, for each, log softmax of the row it was chosen from, from
llama.cpp's incremental decode (prompt in one batch, then one token per
decode); a batch of the whole sequence gives slightly different values
(llama.cpp's own numerics differ between the two; Ember's streams match the
incremental ones, its scoring the batch ones).
"""
import argparse
import os

import numpy as np
from llama_cpp import Llama


def main():
    home = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompt", default="The capital of France is Paris. The capital of Italy is")
    ap.add_argument("-n", type=int, default=12)
    args = ap.parse_args()
    llm = Llama(model_path=args.model, n_threads=1, logits_all=True, verbose=False)
    llm.eval(llm.tokenize(args.prompt.encode(), add_bos=True))
    tokens, logprobs = [], []
    for _ in range(args.n):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        token = int(row.argmax())
        lse = np.log(np.exp(row - row.max()).sum()) + row.max()
        tokens.append(token)
        logprobs.append(float(row[token] - lse))
        llm.eval([token])
    print("tokens:", ", ".join(str(t) for t in tokens))
    print("logprobs:", ", ".join(f"{x:.6f}f" for x in logprobs))


if __name__ == "__main__":
    main()
