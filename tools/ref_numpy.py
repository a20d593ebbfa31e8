#!/usr/bin/env python3
"""Independent NumPy forward pass of the GGUF llama model, to tell which engine is "right".

  /root/.cache/ember/refvenv/bin/python tools/ref_numpy.py [--tokens 512] [--offset 100000]

Runs the same llama.cpp-tokenized text (see ref_llamacpp.py `logits`) through
  * exact   : float64 on the dequantized weights (the quantized model's "true" output),
  * ggml    : float64, but rounding like llama.cpp's CPU backend: activations quantized to
              Q8_1 blocks before every Q4_1 matmul and to Q8_0 before the Q8_0 output matmul,
              K/V cache, Q (converted for the f16 K·Q dot) and softmax probabilities (converted
              for the f16 V matmul) rounded to f16,
  * f16kv   : exact, but K and V rounded to f16 (what an f32-activation engine with an f16 KV
              cache should produce),
  * q8      : exact, but only the Q8_1/Q8_0 activation quantization of `ggml`,
  * attn16  : exact, but only the f16 K/V/Q/probability rounding of `ggml`,
and compares llama.cpp (llama-cpp-python) and Ember (ember_engine_score) against each.
Prints mean/max KL(row || column) and top-1 agreement for every pair.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llamacpp as R  # noqa: E402


def f16(x):
    return x.astype(np.float16).astype(np.float64)


def quant_blocks(x: np.ndarray, fp16_scale: bool = True) -> np.ndarray:
    """Q8_0/Q8_1 activation quantization of the last axis in blocks of 32 (round to nearest)."""
    shp = x.shape
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1, keepdims=True)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0).astype(np.float32)
    q = np.round(b * inv)  # ggml uses roundf / nearest-int on AVX2 (_mm256_round_ps nearest)
    if fp16_scale:
        d = d.astype(np.float16).astype(np.float32)
    return (q * d).reshape(shp).astype(np.float64)


class Model:
    def __init__(self, path: str):
        from gguf import GGUFReader
        from gguf.quants import dequantize

        r = GGUFReader(path)
        self.kv = {f.name: f for f in r.fields.values()}
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type) if t.tensor_type.name not in ("F32",) else np.array(t.data)
            self.w[t.name] = np.asarray(a, dtype=np.float64)

        def scalar(name):
            f = self.kv[name]
            return f.parts[f.data[0]][0]

        self.n_layer = int(scalar("llama.block_count"))
        self.n_head = int(scalar("llama.attention.head_count"))
        self.n_kv = int(scalar("llama.attention.head_count_kv"))
        self.eps = float(scalar("llama.attention.layer_norm_rms_epsilon"))
        self.base = float(scalar("llama.rope.freq_base"))
        self.n_embd = self.w["token_embd.weight"].shape[1]
        self.hd = self.n_embd // self.n_head

    def rope(self, x: np.ndarray) -> np.ndarray:
        # LLAMA_ROPE_TYPE_NORM: rotate adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/d).
        n, h, d = x.shape
        pos = np.arange(n, dtype=np.float64)[:, None]
        theta = self.base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = pos * theta[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def forward(self, ids: list[int], mode: str) -> np.ndarray:
        W = self.w
        ggml = mode in ("ggml", "attn16")  # f16 Q and softmax probabilities in attention
        q8 = (lambda a: quant_blocks(a)) if mode in ("ggml", "q8") else (lambda a: a)
        kvr = f16 if mode in ("ggml", "f16kv", "attn16") else (lambda a: a)

        def rms(x, g):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * g

        x = W["token_embd.weight"][ids]
        n = len(ids)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        rep = self.n_head // self.n_kv
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = q8(rms(x, W[p + "attn_norm.weight"]))
            q = (h @ W[p + "attn_q.weight"].T).reshape(n, self.n_head, self.hd)
            k = (h @ W[p + "attn_k.weight"].T).reshape(n, self.n_kv, self.hd)
            v = (h @ W[p + "attn_v.weight"].T).reshape(n, self.n_kv, self.hd)
            q, k, v = self.rope(q), kvr(self.rope(k)), kvr(v)
            if ggml:
                q = f16(q)
            out = np.empty((n, self.n_head, self.hd))
            for hh in range(self.n_head):
                kh, vh = k[:, hh // rep], v[:, hh // rep]
                s = (q[:, hh] @ kh.T) / np.sqrt(self.hd) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                s /= s.sum(-1, keepdims=True)
                if ggml:
                    s = f16(s)
                out[:, hh] = s @ vh
            x = x + q8(out.reshape(n, -1)) @ W[p + "attn_output.weight"].T
            h = q8(rms(x, W[p + "ffn_norm.weight"]))
            g = h @ W[p + "ffn_gate.weight"].T
            u = h @ W[p + "ffn_up.weight"].T
            a = g / (1.0 + np.exp(-g)) * u
            x = x + q8(a) @ W[p + "ffn_down.weight"].T
        h = q8(rms(x, W["output_norm.weight"]))
        out_w = W.get("output.weight", W["token_embd.weight"])
        return h @ out_w.T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=R.default_model())
    ap.add_argument("--lib", default=os.path.join(R.ROOT, "build", "capi", "libember.so"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--offset", type=int, default=100000)
    ap.add_argument("--modes", default="exact,ggml,f16kv")
    ap.add_argument("--ember-f32", action="store_true",
                    help="also score with batch_invariant=0 (Ember's f32 oneDNN prefill path)")
    args = ap.parse_args()
    R.header(args)
    llm = R.load_llama(args, n_ctx=2048, logits_all=True)
    ids = R.text_ids(llm, args.offset, args.tokens)
    print(f"text: {R.DATA} from the first paragraph at/after char {args.offset}; {len(ids)} tokens")
    res = {}
    t = time.time()
    res["llama.cpp"] = R.log_softmax(R.llama_logits(llm, ids))
    del llm
    em = R.Ember(args.lib, args.model, args.threads)
    res["ember"] = R.log_softmax(em.score(ids)[0])
    if args.ember_f32:
        res["ember-f32"] = R.log_softmax(R.Ember(args.lib, args.model, args.threads, 0).score(ids)[0])
    print(f"engines: {time.time() - t:.0f}s")
    model = Model(args.model)
    for mode in args.modes.split(","):
        t = time.time()
        res[f"numpy-{mode}"] = R.log_softmax(model.forward(ids, mode))
        print(f"numpy {mode}: {time.time() - t:.0f}s")
        sys.stdout.flush()
    names = list(res)
    print("\nmean KL(row || column) in nats [max], top-1 agreement %:")
    for a in names:
        cells = []
        for b in names:
            if a == b:
                continue
            kl = R.kl_rows(res[a], res[b])
            top = (res[a].argmax(-1) == res[b].argmax(-1)).mean() * 100
            cells.append(f"{b}: {kl.mean():.2e} [{kl.max():.2e}] {top:.1f}%")
        print(f"  {a:12s} -> " + "; ".join(cells))


if __name__ == "__main__":
    main()
