#!/usr/bin/env python3
"""Distil a small draft model for speculative decoding from SmolLM2-135M-Instruct.

The only model on the package registries with SmolLM2's vocabulary is SmolLM2
itself, so the draft for `--spec draft:PATH` is made here: a small Llama-shaped
model (default 2 layers, 192 wide) with SmolLM2's tokenizer, trained on what
the target itself says (sequence-level distillation: the target's greedy
replies are the labels, so the student learns the target's argmax, which is
what greedy verification accepts).

Steps (each a subcommand; `all` runs them in order):
  data    the target answers prompts built from ../shared/data (rewrite,
          summarise, explain, question passages; free chat; continue code
          from this repository's Python files) through Ember's Python binding,
          many sessions at once; writes corpus.npz (token ids, loss weights).
          The passage and the code file the speculative benchmark uses
          (tools/bench_spec.py) are left out.
  train   JAX on the CPU, AdamW; the input embedding starts from the target's
          token embedding projected to the draft's width (PCA). The output
          head is trained only for the tokens of the corpus: every other
          token's row is zero in the file, which the training loss models
          exactly (one "other" class with logit log(number of such tokens)).
  export  writes a GGUF (llama architecture, the target's tokenizer keys
          copied) with Q8_0 matrices; `check` compares Ember's log
          probabilities on held-out text with the trainer's.
  agree   (not in `all`) the draft's greedy agreement with the target on
          the speculative benchmark's own replies, per task.

Usage (from the repository root, after tools/build.sh):
  python3 -m venv ~/.cache/ember/distillvenv && ~/.cache/ember/distillvenv/bin/pip install jax numpy gguf
  PYTHONPATH=build/bindings/python ~/.cache/ember/distillvenv/bin/python tools/distill_draft.py all
  # (defaults: the draft of docs/BENCHMARKS.md: 3,000 prompts, 16 sessions, ~18 min; 2 layers x 192, 34 min)
  # -> ~/.cache/ember/draft/smollm2-draft.gguf; then
  build/apps/cli/ember generate --spec draft:~/.cache/ember/draft/smollm2-draft.gguf ...
"""
import argparse
import glob
import math
import os
import queue
import random
import re
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
HOME = os.environ.get("EMBER_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "ember")
TARGET = os.path.join(HOME, "SmolLM2-135M-Instruct.Q4_1.gguf")
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_START, IM_END = 1, 2

# --------------------------------------------------------------------------------------------- prompts

REWRITE = [
    "Rewrite the following passage in simple modern English:",
    "Rewrite this passage in plain English:",
    "Rewrite the following text so that a child could understand it:",
    "Paraphrase the following passage:",
    "Rewrite the following passage in the present tense:",
    "Correct any errors in the following passage and rewrite it:",
]
SUMMARISE = [
    "Summarise the following passage in a few sentences:",
    "Summarize this text in one paragraph:",
    "Give a short summary of the following passage:",
    "What happens in this passage? Summarise it briefly:",
]
ASK = [
    "Explain what happens in the following passage:",
    "List the characters mentioned in the following passage and describe each briefly:",
    "What is the main idea of the following passage?",
    "Describe the mood of the following passage:",
    "Write three questions about the following passage, then answer them:",
    "Continue the following passage with a few more sentences:",
]
TOPICS = [
    "sleep", "learning a new language", "saving money", "cooking rice", "growing tomatoes", "running",
    "public speaking", "time management", "writing an essay", "the water cycle", "photosynthesis",
    "volcanoes", "the solar system", "black holes", "the Roman Empire", "the printing press", "climate change",
    "recycling", "meditation", "drinking water", "learning to code", "Python lists", "sorting algorithms",
    "binary numbers", "the internet", "electric cars", "bicycles", "chess", "friendship", "job interviews",
    "studying for exams", "reading books", "dogs", "cats", "birds", "the ocean", "rainforests", "deserts",
    "earthquakes", "vaccines", "the immune system", "the heart", "nutrition", "breakfast", "coffee", "tea",
    "music", "painting", "photography", "gardening", "travel", "camping", "mountains", "rivers", "the moon",
    "gravity", "electricity", "magnets", "computers", "smartphones", "social media", "email etiquette",
    "teamwork", "leadership", "stress", "exercise", "yoga", "swimming", "football", "history", "democracy",
    "economics", "inflation", "taxes", "budgeting", "renting an apartment", "moving house", "cleaning",
]
CHAT = [
    "What are some tips for {}?",
    "Explain {} to a ten-year-old.",
    "Write a short poem about {}.",
    "Give me three interesting facts about {}.",
    "What are the pros and cons of {}?",
    "Write a short story about {}.",
    "How do I get started with {}?",
    "What is the history of {}?",
    "Why is {} important?",
    "Write a short paragraph about {}.",
    "What are common mistakes people make with {}?",
    "Describe {} in three sentences.",
    "Compare {} with something similar.",
    "Write a list of five questions about {}.",
    "What should a beginner know about {}?",
]
# The speculative benchmark's free-chat prompt (tools/bench_spec.py): never trained on.
HELD_OUT_CHAT = "What are five good habits for staying healthy? Explain each briefly."


def chat_text(user):
    return ("<|im_start|>system\n" + SYSTEM + "<|im_end|>\n<|im_start|>user\n" + user +
            "<|im_end|>\n<|im_start|>assistant\n")


def passages(rng, n):
    """n passages of 300-900 characters from ../shared/data, starting at a sentence, whitespace collapsed;
    never from the first 3,000 characters of Pride and Prejudice's text (the benchmark's passage)."""
    books = []
    for name in ("pride_and_prejudice.txt", "war_and_peace.txt", "tinyshakespeare.txt"):
        text = open(os.path.join(DATA, name), encoding="utf-8").read()
        if name.startswith("pride"):
            start = text.index("It is a truth universally acknowledged")
            text = text[start + 3000:]
        books.append(text)
    out = []
    while len(out) < n:
        text = rng.choice(books)
        at = rng.randrange(0, len(text) - 2000)
        dot = text.find(". ", at)
        if dot < 0:
            continue
        chunk = " ".join(text[dot + 2:dot + 2 + rng.randrange(300, 900)].split())
        cut = chunk.rfind(". ")
        if cut > 200:
            chunk = chunk[:cut + 1]
        if len(chunk) > 150:
            out.append(chunk)
    return out


def code_files():
    skip = os.path.join(ROOT, "bench", "spec", "code_prompt.py")
    files = sorted(glob.glob(os.path.join(ROOT, "tools", "*.py")) +
                   glob.glob(os.path.join(ROOT, "bindings", "python", "**", "*.py"), recursive=True) +
                   glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True))
    return [f for f in files if os.path.abspath(f) != skip and "distill_draft" not in f]


def make_prompts(n, seed):
    """(kind, text, chat) triples: half passage tasks, a third free chat, the rest code continuation."""
    rng = random.Random(seed)
    n_code = n // 6
    n_chat = n // 3
    n_pass = n - n_code - n_chat
    out = []
    for p in passages(rng, n_pass):
        r = rng.random()
        instr = rng.choice(REWRITE if r < 0.45 else SUMMARISE if r < 0.75 else ASK)
        out.append(("passage", chat_text(instr + "\n\n" + p), True))
    questions = [c.format(t) for c in CHAT for t in TOPICS]
    rng.shuffle(questions)
    for q in questions[:n_chat]:  # greedy replies: a question asked twice would teach nothing new
        out.append(("chat", chat_text(q[0].upper() + q[1:]), True))
    sources = [open(f, encoding="utf-8").read().splitlines(True) for f in code_files()]
    sources = [s for s in sources if len(s) > 40]
    for _ in range(n_code):
        lines = rng.choice(sources)
        a = rng.randrange(0, max(1, len(lines) - 40))
        b = min(len(lines), a + rng.randrange(15, 60))
        out.append(("code", "".join(lines[a:b]), False))
    rng.shuffle(out)
    return out


# --------------------------------------------------------------------------------------------- data

def cmd_data(args):
    import ember  # the binding: PYTHONPATH=build/bindings/python

    prompts = make_prompts(args.prompts, args.seed)
    model = ember.Model(args.target)
    engine = ember.Engine(model, n_threads=args.threads)
    jobs = queue.Queue()
    for i, p in enumerate(prompts):
        jobs.put((i, p))
    results = [None] * len(prompts)
    done = [0, 0]
    lock = threading.Lock()
    t0 = time.time()

    def worker():
        while True:
            try:
                i, (kind, text, chat) = jobs.get_nowait()
            except queue.Empty:
                return
            ids = model.tokenize(text, parse_special=chat)
            with engine.session() as s:
                s.add_tokens(ids)
                with s.generate(max_tokens=args.max_tokens, temperature=0.0) as st:
                    st.read()
                    out = st.tokens
                    if st.end_reason == ember.EndReason.EOS and chat:
                        out = out + [IM_END]
            results[i] = (kind, ids, out)
            with lock:
                done[0] += 1
                done[1] += len(out)
                if done[0] % 50 == 0:
                    dt = time.time() - t0
                    print("data: %d/%d prompts, %d tokens generated, %.0f tok/s" %
                          (done[0], len(prompts), done[1], done[1] / dt), flush=True)

    errors = []

    def guarded():
        try:
            worker()
        except BaseException as e:  # noqa: BLE001 - reported below, after the other workers stop
            errors.append(e)
            while not jobs.empty():
                jobs.get_nowait()

    threads = [threading.Thread(target=guarded) for _ in range(args.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    seqs, weights, kinds = [], [], []
    for kind, ids, out in results:
        seqs.append(np.array(ids + out, dtype=np.int32))
        # The target's own tokens are the labels that matter (weight 1); the prompt's text is modelled too,
        # more lightly, so that the student learns to read what it will copy from.
        weights.append(np.concatenate([np.full(len(ids), args.prompt_weight, np.float32),
                                       np.ones(len(out), np.float32)]))
        kinds.append(kind)
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    os.makedirs(args.work, exist_ok=True)
    np.savez(os.path.join(args.work, "corpus.npz"), tokens=np.concatenate(seqs), weights=np.concatenate(weights),
             lens=lens, kinds=np.array(kinds))
    print("data: %d sequences, %d tokens (%d generated) in %.0f s" %
          (len(seqs), lens.sum(), done[1], time.time() - t0))


# --------------------------------------------------------------------------------------------- model

def read_target_embedding(path):
    import gguf
    r = gguf.GGUFReader(path)
    t = next(t for t in r.tensors if t.name == "token_embd.weight")
    from gguf.quants import dequantize
    return dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0])).astype(np.float32)


def init_params(cfg, target_path, subset, seed):
    rng = np.random.default_rng(seed)
    d, ff, L = cfg["embd"], cfg["ff"], cfg["layers"]
    hd = d // cfg["heads"]
    kv = cfg["kv_heads"] * hd
    emb = read_target_embedding(target_path)
    emb = emb - emb.mean(0, keepdims=True)
    # PCA of the target's token embedding: the draft's tokens start where the target's are, in fewer dimensions.
    _, _, vt = np.linalg.svd(emb[rng.choice(len(emb), 8192, replace=False)], full_matrices=False)
    proj = emb @ vt[:d].T
    proj /= proj.std() * math.sqrt(d)
    std = 0.02
    # The head starts as the input embedding, scaled so that the top logits reach log(count of the other
    # tokens), the constant logit of their class (see logits_with_other), from the first steps.
    p = {"tok_embd": proj.astype(np.float32), "out": (4.0 * proj[subset]).astype(np.float32),
         "out_norm": np.ones(d, np.float32)}
    for i in range(L):
        p["l%d" % i] = {
            "attn_norm": np.ones(d, np.float32), "ffn_norm": np.ones(d, np.float32),
            "wq": rng.normal(0, std, (d, d)).astype(np.float32),
            "wk": rng.normal(0, std, (kv, d)).astype(np.float32),
            "wv": rng.normal(0, std, (kv, d)).astype(np.float32),
            "wo": rng.normal(0, std / math.sqrt(2 * L), (d, d)).astype(np.float32),
            "wg": rng.normal(0, std, (ff, d)).astype(np.float32),
            "wu": rng.normal(0, std, (ff, d)).astype(np.float32),
            "wd": rng.normal(0, std / math.sqrt(2 * L), (d, ff)).astype(np.float32),
        }
    return p


def make_forward(cfg):
    import jax
    import jax.numpy as jnp

    d, L, H, KV = cfg["embd"], cfg["layers"], cfg["heads"], cfg["kv_heads"]
    hd = d // H
    eps = 1e-5
    inv = cfg["rope_base"] ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)

    def rms(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w

    def rope(x, cos, sin):  # x [B, T, h, hd]; adjacent pairs (ggml's "normal" rope, as llama GGUFs use)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).reshape(x.shape)

    def hidden(p, tok):
        B, T = tok.shape
        ang = np.arange(T)[:, None] * inv[None, :]
        cos = jnp.asarray(np.cos(ang), jnp.float32)[None, :, None, :]
        sin = jnp.asarray(np.sin(ang), jnp.float32)[None, :, None, :]
        mask = jnp.asarray(np.tril(np.ones((T, T), bool)))
        x = p["tok_embd"][tok]
        for i in range(L):
            w = p["l%d" % i]
            h = rms(x, w["attn_norm"])
            q = rope((h @ w["wq"].T).reshape(B, T, H, hd), cos, sin)
            k = rope((h @ w["wk"].T).reshape(B, T, KV, hd), cos, sin)
            v = (h @ w["wv"].T).reshape(B, T, KV, hd)
            q = q.reshape(B, T, KV, H // KV, hd)
            s = jnp.einsum("btkgd,bskd->bkgts", q, k) / math.sqrt(hd)
            s = jnp.where(mask, s, -1e30)
            a = jax.nn.softmax(s, -1)
            o = jnp.einsum("bkgts,bskd->btkgd", a, v).reshape(B, T, d)
            x = x + o @ w["wo"].T
            h = rms(x, w["ffn_norm"])
            x = x + (jax.nn.silu(h @ w["wg"].T) * (h @ w["wu"].T)) @ w["wd"].T
        return rms(x, p["out_norm"])

    return hidden


def logits_with_other(h, out, other_logit):
    """Logits over the corpus tokens plus one class standing for every other token (their rows are zero in
    the file: each has logit 0, together log(count))."""
    import jax.numpy as jnp
    z = h @ out.T
    return jnp.concatenate([z, jnp.full(z.shape[:-1] + (1,), other_logit, z.dtype)], -1)


# --------------------------------------------------------------------------------------------- train

def load_corpus(work):
    c = np.load(os.path.join(work, "corpus.npz"))
    tokens, weights, lens = c["tokens"], c["weights"], c["lens"]  # (each c[...] reads the file again)
    offs = np.concatenate([[0], np.cumsum(lens)])
    seqs = [(tokens[offs[i]:offs[i + 1]], weights[offs[i]:offs[i + 1]]) for i in range(len(lens))]
    return seqs, c["kinds"]


def cmd_train(args):
    import jax
    import jax.numpy as jnp

    seqs, _ = load_corpus(args.work)
    rng = random.Random(args.seed)
    order = list(range(len(seqs)))
    rng.shuffle(order)
    n_val = max(8, len(seqs) // 50)
    val, train = [seqs[i] for i in order[:n_val]], [seqs[i] for i in order[n_val:]]
    counts = np.bincount(np.concatenate([s for s, _ in seqs]), minlength=49152)
    subset = np.nonzero(counts)[0].astype(np.int32)
    n_other = 49152 - len(subset)
    other_logit = float(math.log(max(n_other, 1)))
    remap = np.full(49152, len(subset), np.int32)
    remap[subset] = np.arange(len(subset), dtype=np.int32)
    cfg = dict(layers=args.layers, embd=args.embd, ff=args.ff, heads=args.heads, kv_heads=args.kv_heads,
               rope_base=100000.0)
    print("train: %d sequences (%d held out), %d distinct tokens, config %s" %
          (len(train), len(val), len(subset), cfg), flush=True)
    params = jax.tree_util.tree_map(jnp.asarray, init_params(cfg, args.target, subset, args.seed))
    hidden = make_forward(cfg)
    T, B = args.seq, args.batch

    def batch(pool, r):
        toks = np.zeros((B, T + 1), np.int32)
        wts = np.zeros((B, T), np.float32)
        for b in range(B):
            s, w = pool[r.randrange(len(pool))]
            if len(s) > T + 1:
                # Keep the reply: windows end at most at the sequence's end, start where the reply is in view.
                a = r.randrange(0, len(s) - T)
                s, w = s[a:a + T + 1], w[a:a + T + 1]
            toks[b, :len(s)] = s
            wts[b, :len(s) - 1] = w[1:]
        return toks, wts

    def loss_fn(p, toks, wts):
        h = hidden(p, toks[:, :-1])
        z = logits_with_other(h, p["out"], other_logit)
        tgt = jnp.asarray(remap)[toks[:, 1:]]
        lp = jax.nn.log_softmax(z, -1)
        nll = -jnp.take_along_axis(lp, tgt[..., None], -1)[..., 0]
        hit = (jnp.argmax(z, -1) == tgt).astype(jnp.float32)
        return jnp.sum(nll * wts) / jnp.sum(wts), (jnp.sum(hit * (wts == 1)) / jnp.maximum(jnp.sum(wts == 1), 1))

    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    eval_fn = jax.jit(loss_fn)
    b1, b2, wd = 0.9, 0.98, 0.01
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)

    @jax.jit
    def update(p, m, v, g, lr, t):
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        p = jax.tree_util.tree_map(lambda p, m, v: p - lr * (m / c1 / (jnp.sqrt(v / c2) + 1e-8) + wd * p * (p.ndim > 1)),
                                   p, m, v)
        return p, m, v

    def evaluate():
        r = random.Random(1)
        tot = [0.0, 0.0]
        for _ in range(4):
            tk, wt = batch(val, r)
            l, acc = eval_fn(params, tk, wt)
            tot[0] += float(l) / 4
            tot[1] += float(acc) / 4
        return tot

    budget = args.minutes * 60.0
    t0 = time.time()
    step = 0
    warm = 50
    while True:
        el = time.time() - t0
        if el > budget or (args.steps and step >= args.steps):
            break
        frac = el / budget
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
        tk, wt = batch(train, rng)
        (l, acc), g = grad_fn(params, tk, wt)
        step += 1
        params, m, v = update(params, m, v, g, lr, step)
        if step % 50 == 0 or step == 1:
            msg = "train: step %d, %.0f s, lr %.2g, loss %.3f, reply top-1 %.1f%%" % (step, el, lr, float(l),
                                                                                      100 * float(acc))
            if step % 200 == 0:
                vl, va = evaluate()
                msg += " | held out: loss %.3f, reply top-1 %.1f%%" % (vl, 100 * va)
            print(msg, flush=True)
    vl, va = evaluate()
    print("train: %d steps in %.0f s; held out: loss %.3f, reply top-1 %.1f%%" % (step, time.time() - t0, vl,
                                                                                  100 * va), flush=True)
    flat = {"subset": subset, "cfg": np.array([cfg[k] for k in ("layers", "embd", "ff", "heads", "kv_heads")])}
    for k, val_ in params.items():
        if isinstance(val_, dict):
            for k2, a in val_.items():
                flat[k + "." + k2] = np.asarray(a)
        else:
            flat[k] = np.asarray(val_)
    np.savez(os.path.join(args.work, "params.npz"), **flat)


# --------------------------------------------------------------------------------------------- export

def load_params(work):
    f = np.load(os.path.join(work, "params.npz"))
    L, d, ff, H, KV = [int(x) for x in f["cfg"]]
    cfg = dict(layers=L, embd=d, ff=ff, heads=H, kv_heads=KV, rope_base=100000.0)
    p = {"tok_embd": f["tok_embd"], "out": f["out"], "out_norm": f["out_norm"]}
    for i in range(L):
        p["l%d" % i] = {k.split(".", 1)[1]: f[k] for k in f.files if k.startswith("l%d." % i)}
    return cfg, p, f["subset"]


def to_jax(p):
    import jax
    import jax.numpy as jnp
    return jax.tree_util.tree_map(jnp.asarray, p)


def copy_tokenizer(reader, writer):
    import gguf
    T = gguf.GGUFValueType
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == T.ARRAY:
            sub = f.types[1]
            if sub == T.STRING:
                writer.add_array(key, [bytes(f.parts[i]).decode("utf-8") for i in f.data])
            else:
                writer.add_array(key, [f.parts[i][0].item() for i in f.data])
        elif t == T.STRING:
            writer.add_string(key, bytes(f.parts[f.data[0]]).decode("utf-8"))
        elif t == T.BOOL:
            writer.add_bool(key, bool(f.parts[f.data[0]][0]))
        elif t == T.UINT32:
            writer.add_uint32(key, int(f.parts[f.data[0]][0]))
        elif t == T.INT32:
            writer.add_int32(key, int(f.parts[f.data[0]][0]))
        elif t == T.FLOAT32:
            writer.add_float32(key, float(f.parts[f.data[0]][0]))
        else:
            sys.exit("distill_draft: tokenizer key %s has a type this script does not copy (%s)" % (key, t))


def cmd_export(args):
    import gguf
    from gguf.quants import quantize

    cfg, p, subset = load_params(args.work)
    d, L = cfg["embd"], cfg["layers"]
    out = args.out or os.path.join(args.work, "smollm2-draft.gguf")
    reader = gguf.GGUFReader(args.target)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("SmolLM2-135M-Instruct draft (Ember tools/distill_draft.py)")
    w.add_block_count(L)
    w.add_context_length(8192)
    w.add_embedding_length(d)
    w.add_feed_forward_length(cfg["ff"])
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv_heads"])
    w.add_rope_freq_base(cfg["rope_base"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(49152)
    w.add_rope_dimension_count(d // cfg["heads"])
    qt = gguf.GGMLQuantizationType.Q8_0 if args.type == "q8_0" else gguf.GGMLQuantizationType.F16
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if args.type == "q8_0" else gguf.LlamaFileType.MOSTLY_F16)
    copy_tokenizer(reader, w)

    def mat(name, a):
        a = np.ascontiguousarray(a, np.float32)
        if qt == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, quantize(a, qt), raw_shape=quantize(a, qt).shape, raw_dtype=qt)

    head = np.zeros((49152, d), np.float32)
    head[subset] = p["out"]
    mat("token_embd.weight", p["tok_embd"])
    w.add_tensor("output_norm.weight", np.asarray(p["out_norm"], np.float32))
    mat("output.weight", head)
    names = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output", "wg": "ffn_gate",
             "wu": "ffn_up", "wd": "ffn_down"}
    for i in range(L):
        lw = p["l%d" % i]
        w.add_tensor("blk.%d.attn_norm.weight" % i, np.asarray(lw["attn_norm"], np.float32))
        w.add_tensor("blk.%d.ffn_norm.weight" % i, np.asarray(lw["ffn_norm"], np.float32))
        for k, n in names.items():
            mat("blk.%d.%s.weight" % (i, n), lw[k])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("export: %s (%.1f MiB)" % (out, os.path.getsize(out) / 2 ** 20))


def cmd_check(args):
    """Ember's log probabilities of held-out text under the exported draft against the trainer's."""
    import jax.numpy as jnp
    import ember

    cfg, p, subset = load_params(args.work)
    n_other = 49152 - len(subset)
    hidden = make_forward(cfg)
    path = args.out or os.path.join(args.work, "smollm2-draft.gguf")
    model = ember.Model(path)
    target = ember.Model(args.target)
    if model.tokenize("Hello, world! <|im_end|>", parse_special=True) != target.tokenize("Hello, world! <|im_end|>",
                                                                                         parse_special=True):
        sys.exit("check: the draft tokenizes differently from the target")
    text = passages(random.Random(12345), 1)[0]
    ids = model.tokenize(text)[:96]
    with ember.Engine(model, n_threads=args.threads) as eng, eng.session() as s:
        got = np.array(s.score(ids)[1:])
    h = hidden(to_jax(p), jnp.asarray(np.array(ids)[None, :]))
    z = np.asarray(h[0] @ jnp.asarray(p["out"]).T, np.float64)
    zmax = np.maximum(z.max(-1), 0.0)
    lse = zmax + np.log(np.exp(z - zmax[:, None]).sum(-1) + n_other * np.exp(-zmax))
    remap = {int(t): i for i, t in enumerate(subset)}
    want = np.array([z[i, remap[t]] - lse[i] if t in remap else -lse[i] for i, t in enumerate(ids[1:])])
    diff = np.abs(got - want)
    print("check: %d tokens, mean |log p(Ember) - log p(trainer)| = %.4f, max %.4f (Q8_0 weights)" %
          (len(diff), diff.mean(), diff.max()))
    # Q8_0 rounding moves a 2-layer draft's log probabilities by ~0.1 on average (F16: ~0.001); a wrong
    # export (a transposed matrix, another rope) moves them by nats.
    if diff.mean() > args.tolerance:
        sys.exit("check: the exported model does not compute what was trained")


def cmd_agree(args):
    """The trained draft's greedy agreement with the target on the speculative benchmark's own replies
    (tools/bench_spec.py's tasks): the target's 128-token greedy reply, then the trainer's forward pass of the draft
    over prompt + reply; the share of reply tokens where the draft's argmax is the target's token."""
    import jax.numpy as jnp
    import ember
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_spec

    cfg, p, subset = load_params(args.work)
    other = math.log(49152 - len(subset))
    hidden = make_forward(cfg)
    params = to_jax(p)
    target = ember.Model(args.target)
    with ember.Engine(target, n_threads=args.threads) as eng:
        for name, chat, prompt in bench_spec.tasks():
            ids = target.tokenize(chat_text(prompt) if chat else prompt, parse_special=chat)
            with eng.session() as s:
                s.add_tokens(ids)
                with s.generate(max_tokens=128, temperature=0.0) as st:
                    st.read()
                    reply = st.tokens
            seq = np.array(ids + reply)
            z = np.asarray(hidden(params, jnp.asarray(seq[None, :-1]))[0] @ params["out"].T)
            best = np.where(z.max(-1) > other, subset[z.argmax(-1)], -1)  # -1: a token outside the corpus wins
            n = len(ids) - 1
            print("agree: %-9s reply top-1 %.1f%% over %d tokens" % (name, 100 * np.mean(best[n:] == seq[n + 1:]),
                                                                  len(reply)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["data", "train", "export", "check", "agree", "all"])
    ap.add_argument("--work", default=os.path.join(HOME, "draft"))
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--out", default=None, help="the GGUF to write (default WORK/smollm2-draft.gguf)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    # data
    ap.add_argument("--prompts", type=int, default=3000)
    ap.add_argument("--streams", type=int, default=16, help="sessions generating at once")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--prompt-weight", type=float, default=0.25)
    # model and training
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=192)
    ap.add_argument("--ff", type=int, default=576)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--minutes", type=float, default=34)
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: the time budget only)")
    # export
    ap.add_argument("--type", choices=["q8_0", "f16"], default="q8_0")
    ap.add_argument("--tolerance", type=float, default=0.2, help="check: largest mean |log p difference|")
    args = ap.parse_args()
    steps = ["data", "train", "export", "check"] if args.step == "all" else [args.step]
    for s in steps:
        globals()["cmd_" + s](args)


if __name__ == "__main__":
    main()
