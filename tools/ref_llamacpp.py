#!/usr/bin/env python3
"""Compares Ember against llama.cpp (llama-cpp-python) on the same GGUF model.

Run with the reference venv (llama-cpp-python built from source, numpy, jinja2):

  PY=/root/.cache/ember/refvenv/bin/python
  $PY tools/ref_llamacpp.py logits      # per-position top-1 agreement and KL(llama || ember)
  $PY tools/ref_llamacpp.py greedy      # 64-token greedy continuations of 24 prompts
  $PY tools/ref_llamacpp.py perplexity  # llama-perplexity method, 512-token windows
  $PY tools/ref_llamacpp.py selfcheck   # llama.cpp vs itself with flash attention: the noise floor
  $PY tools/ref_llamacpp.py golden      # writes tests/golden/reference/*.txt

Inputs are always tokenized with llama.cpp's tokenizer so both engines see the
same ids; Ember is driven through the C ABI (build/capi/libember.so) with
ctypes, except `perplexity`, which also runs the `ember perplexity` CLI.
Options: --model PATH (default $EMBER_HOME/SmolLM2-135M-Instruct.Q4_1.gguf,
EMBER_HOME defaults to ~/.cache/ember), --lib PATH, --threads N (default 2).
"""
from __future__ import annotations

import argparse
import ctypes as C
import datetime
import hashlib
import os
import platform
import re
import shlex
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = "/work/shared/data/pride_and_prejudice.txt"
GOLDEN_DIR = os.path.join(ROOT, "tests", "golden", "reference")


def default_model() -> str:
    home = os.environ.get("EMBER_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "ember")
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")


def command_line() -> str:
    exe = sys.executable
    script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)
    return " ".join([shlex.quote(exe), shlex.quote(script)] + [shlex.quote(a) for a in sys.argv[1:]])


def machine() -> str:
    model = platform.processor() or "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{model}, nproc={os.cpu_count()} (os.cpu_count), affinity={len(os.sched_getaffinity(0))}"


def header(args) -> None:
    import llama_cpp

    print(f"# command: (cd {ROOT} && {command_line()})")
    print(f"# date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}")
    print(f"# machine: {machine()}")
    print(f"# model: {args.model}")
    print(f"# llama-cpp-python {llama_cpp.__version__}; ember lib {args.lib}; threads {args.threads}")
    print(f"# llama.cpp build: {llama_system_info()}")
    sys.stdout.flush()


def llama_system_info() -> str:
    """The reference build's CPU features. Ember's reference order is llama.cpp's AVX2 build
    (tools/setup_reference.sh); an AVX-512 build sums attention (16-lane tinyBLAS, its AVX-512 expf) in
    other orders."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip().rstrip("|").strip()
    return info + ("  [AVX-512 build: not Ember's reference order]" if "AVX512 = 1" in info else "")


# ----------------------------------------------------------------- llama.cpp


def load_llama(args, n_ctx: int, logits_all: bool, n_batch: int = 512, two_seqs: bool = False):
    """two_seqs: a context for llama_prompt_eval's padding sequence (2 sequences, one unified KV cache).
    args.kv_type q8_0 (perplexity): a q8_0 K and V cache, with flash attention (a quantized V needs it)."""
    import llama_cpp
    from llama_cpp import Llama

    orig = llama_cpp.llama_context_default_params

    def params():
        p = orig()
        if two_seqs:
            p.n_seq_max = 2
            p.kv_unified = True
        return p

    llama_cpp.llama_cpp.llama_context_default_params = params
    try:
        kv = {}
        if getattr(args, "kv_type", "f16") == "q8_0":
            kv = dict(type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0, flash_attn=True)
        return Llama(model_path=args.model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, logits_all=logits_all,
                     n_threads=args.threads, n_threads_batch=args.threads, verbose=False, **kv)
    finally:
        llama_cpp.llama_cpp.llama_context_default_params = orig


def llama_prompt_eval(llm, prompt: list[int]) -> None:
    """Evaluates a prompt (from an empty cache) in one llama_decode whose rows all take llama.cpp's batched
    kernels, as Ember computes prompt rows.

    llama.cpp picks K-quant kernels by batch: a repacked Q4_K weight runs rows in groups of 4 through its
    q4_K_8x8 GEMM and the last M % 4 rows through its GEMV, and Q5_K/Q6_K weights take the "tiled" kernels
    only for batches of 8+ rows (ggml_vec_dot below). Ember computes a row the same way whatever its batch
    (docs/BENCHMARKS.md): every prompt row in the batched order. So the prompt's batch is padded with a
    second sequence (tokens of the prompt itself, its own positions, invisible to sequence 0) to a multiple
    of 4 rows, at least 8, every row an output (llama.cpp computes only output rows in the last layer), and
    the padding sequence is then removed from the cache (its cells are freed and the cache head moves back,
    so sequence 0's next tokens take the following cells, as without padding). Needs a context from
    load_llama(..., two_seqs=True)."""
    import llama_cpp

    n = len(prompt)
    pad = 0 if n == 1 else max(8, (n + 3) // 4 * 4) - n
    llm.reset()
    if pad == 0 or llama_cpp.llama_n_seq_max(llm._ctx.ctx) < 2:  # (a one-sequence context: unpadded)
        llm.eval(prompt)
        return
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    b = llm._batch
    b.set_batch(batch=prompt, n_past=0, logits_all=True)
    for i in range(pad):
        j = n + i
        b.batch.token[j] = prompt[i % n]
        b.batch.pos[j] = i
        b.batch.seq_id[j][0] = 1
        b.batch.n_seq_id[j] = 1
        b.batch.logits[j] = True
    b.batch.n_tokens = n + pad
    llm._ctx.decode(b)
    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=((n + pad) * llm._n_vocab,))
    llm.scores[:n, :] = logits.reshape(n + pad, llm._n_vocab)[:n]
    llm.input_ids[:n] = prompt
    llm.n_tokens = n
    llm._ctx.kv_cache_seq_rm(1, -1, -1)


def llama_tokenize(llm, text: str, special: bool = False) -> list[int]:
    # add_bos=True means "add what the model's metadata asks for" (SmolLM2: nothing).
    return llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)


def llama_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)


def llama_greedy(llm, prompt: list[int], n: int, rows: list | None = None) -> tuple[list[int], list[float]]:
    """Greedy continuation (argmax, EOS ignored) by incremental decode, one token per llama_decode.

    The prompt is evaluated by llama_prompt_eval (every prompt row in llama.cpp's batched kernels).
    Returns the ids and llama's top1-top2 logit gap per step; appends each step's logits to `rows`."""
    llama_prompt_eval(llm, prompt)
    out, gaps = [], []
    for _ in range(n):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        if rows is not None:
            rows.append(row)
        tok = int(np.argmax(row))
        top2 = np.partition(row, -2)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        out.append(tok)
        llm.eval([tok])
    return out, gaps


# ----------------------------------------------------------------- Ember (ctypes)


class ModelInfo(C.Structure):
    _fields_ = [("size", C.c_size_t), ("architecture", C.c_char_p), ("name", C.c_char_p), ("n_params", C.c_uint64),
                ("context_length", C.c_int32), ("vocab_size", C.c_int32), ("n_layers", C.c_int32),
                ("n_embd", C.c_int32), ("n_heads", C.c_int32), ("n_kv_heads", C.c_int32),
                ("bos_token", C.c_int32), ("eos_token", C.c_int32)]


class EngineParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("device", C.c_int32), ("n_threads", C.c_int32),
                ("kv_memory_bytes", C.c_uint64), ("kv_block_size", C.c_int32), ("kv_dtype", C.c_int32),
                ("max_batch_tokens", C.c_int32), ("max_running", C.c_int32)]


class EngineParamsV2(C.Structure):  # with the fields appended later in ember.h
    _fields_ = EngineParams._fields_ + [("prefix_caching", C.c_int32), ("manual_step", C.c_int32),
                                        ("batch_invariant", C.c_int32)]


class StreamParams(C.Structure):
    _fields_ = [("size", C.c_size_t), ("max_tokens", C.c_int32), ("temperature", C.c_float), ("top_k", C.c_int32),
                ("top_p", C.c_float), ("min_p", C.c_float), ("repeat_penalty", C.c_float),
                ("presence_penalty", C.c_float), ("frequency_penalty", C.c_float), ("penalty_last_n", C.c_int32),
                ("seed", C.c_uint64), ("stop", C.POINTER(C.c_char_p)), ("ignore_eos", C.c_int32)]


class Event(C.Structure):
    _fields_ = [("size", C.c_size_t), ("type", C.c_int32), ("text", C.c_char_p), ("text_length", C.c_size_t),
                ("tokens", C.POINTER(C.c_int32)), ("n_tokens", C.c_size_t), ("end_reason", C.c_int32),
                ("status", C.c_int32)]


class Ember:
    def __init__(self, lib_path: str, model_path: str, n_threads: int, batch_invariant: int | None = None):
        if not os.path.exists(lib_path):
            sys.exit(f"error: {lib_path} does not exist; build Ember first (bash tools/build.sh build)")
        L = self.L = C.CDLL(lib_path)
        vp = C.c_void_p
        L.ember_last_error.restype = C.c_char_p
        L.ember_version.restype = C.c_char_p
        L.ember_model_load.argtypes = [C.c_char_p, vp, C.POINTER(vp)]
        L.ember_model_info.argtypes = [vp, C.POINTER(ModelInfo)]
        L.ember_engine_score.argtypes = [vp, C.POINTER(C.c_int32), C.c_size_t, C.POINTER(C.c_float),
                                         C.POINTER(C.c_float)]
        L.ember_tokenize.argtypes = [vp, C.c_char_p, C.c_int32, C.c_int32, C.POINTER(C.c_int32), C.c_size_t,
                                     C.POINTER(C.c_size_t)]
        L.ember_session_create.argtypes = [vp, vp, C.POINTER(vp)]
        L.ember_session_destroy.argtypes = [vp]
        L.ember_session_add_tokens.argtypes = [vp, C.POINTER(C.c_int32), C.c_size_t]
        L.ember_stream_start.argtypes = [vp, C.POINTER(StreamParams), C.POINTER(vp)]
        L.ember_stream_next.argtypes = [vp, C.POINTER(Event), C.c_int32]
        L.ember_stream_destroy.argtypes = [vp]
        L.ember_engine_destroy.argtypes = [vp]
        L.ember_model_destroy.argtypes = [vp]
        self.model, self.engine = vp(), vp()
        self._check(L.ember_model_load(model_path.encode(), None, C.byref(self.model)), "ember_model_load")
        info = ModelInfo()
        info.size = C.sizeof(ModelInfo)
        self._check(L.ember_model_info(self.model, C.byref(info)), "ember_model_info")
        self.vocab = info.vocab_size
        # Parameter structs are filled here, not with ember_*_params_init: the library's init
        # functions write the library's full (possibly newer, larger) struct, while `size`
        # tells the library how many bytes this caller's struct has (the rest take defaults).
        common = dict(device=0, n_threads=n_threads, kv_memory_bytes=0, kv_block_size=16, kv_dtype=0,
                      max_batch_tokens=512, max_running=64)
        if batch_invariant is None:
            ep = EngineParams(size=C.sizeof(EngineParams), **common)
        else:  # batch_invariant=0: the CPU may run large prefill chunks in f32 through oneDNN
            ep = EngineParamsV2(size=C.sizeof(EngineParamsV2), prefix_caching=1, manual_step=0,
                                batch_invariant=batch_invariant, **common)
        L.ember_engine_create.argtypes = [vp, C.c_void_p, C.POINTER(vp)]
        self._check(L.ember_engine_create(self.model, C.c_void_p(C.addressof(ep)), C.byref(self.engine)),
                    "ember_engine_create")
        self.version = L.ember_version().decode()

    def _check(self, st: int, what: str) -> None:
        if st != 0:
            raise RuntimeError(f"{what} failed: status {st}: {self.L.ember_last_error().decode(errors='replace')}")

    def tokenize(self, text: str, parse_special: bool = False) -> list[int]:
        n = C.c_size_t(0)
        b = text.encode("utf-8")
        self.L.ember_tokenize(self.model, b, 1, int(parse_special), None, 0, C.byref(n))
        buf = (C.c_int32 * max(1, n.value))()
        self._check(self.L.ember_tokenize(self.model, b, 1, int(parse_special), buf, n.value, C.byref(n)),
                    "ember_tokenize")
        return list(buf[: n.value])

    def score(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        arr = (C.c_int32 * len(ids))(*ids)
        lp = np.zeros(max(1, len(ids) - 1), dtype=np.float32)
        logits = np.zeros((len(ids), self.vocab), dtype=np.float32)
        self._check(self.L.ember_engine_score(self.engine, arr, len(ids), lp.ctypes.data_as(C.POINTER(C.c_float)),
                                              logits.ctypes.data_as(C.POINTER(C.c_float))), "ember_engine_score")
        return logits, lp

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        L = self.L
        sess, stream = C.c_void_p(), C.c_void_p()
        self._check(L.ember_session_create(self.engine, None, C.byref(sess)), "ember_session_create")
        try:
            arr = (C.c_int32 * len(prompt))(*prompt)
            self._check(L.ember_session_add_tokens(sess, arr, len(prompt)), "ember_session_add_tokens")
            sp = StreamParams(size=C.sizeof(StreamParams), max_tokens=n, temperature=0.0, top_k=40, top_p=0.95,
                              min_p=0.05, repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                              penalty_last_n=64, seed=0xEEEE, stop=None, ignore_eos=1)
            self._check(L.ember_stream_start(sess, C.byref(sp), C.byref(stream)), "ember_stream_start")
            out: list[int] = []
            try:
                while True:
                    ev = Event()
                    ev.size = C.sizeof(Event)
                    self._check(L.ember_stream_next(stream, C.byref(ev), -1), "ember_stream_next")
                    if ev.type == 0:
                        out.extend(ev.tokens[i] for i in range(ev.n_tokens))
                    elif ev.type == 2:
                        raise RuntimeError(f"stream error {ev.status}: {L.ember_last_error().decode()}")
                    else:
                        break
            finally:
                L.ember_stream_destroy(stream)
            return out
        finally:
            L.ember_session_destroy(sess)


# ----------------------------------------------------------------- math


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_rows(lp_ref: np.ndarray, lp_test: np.ndarray) -> np.ndarray:
    """KL(ref || test) per row over the full vocabulary, in nats."""
    return (np.exp(lp_ref) * (lp_ref - lp_test)).sum(axis=-1)


def text_ids(llm, offset: int, n_tokens: int) -> list[int]:
    with open(DATA, encoding="utf-8") as f:
        text = f.read()
    # Start at a paragraph boundary at or after `offset` and take generously many characters.
    start = text.find("\n\n", offset)
    start = offset if start < 0 else start + 2
    chunk = text[start: start + n_tokens * 8]
    ids = llama_tokenize(llm, chunk)
    if len(ids) < n_tokens:
        sys.exit(f"error: only {len(ids)} tokens at offset {offset}")
    return ids[:n_tokens]


# ----------------------------------------------------------------- logits


def cmd_logits(args) -> None:
    header(args)
    llm = load_llama(args, n_ctx=2048, logits_all=True, n_batch=args.llama_batch)
    ids = text_ids(llm, args.offset, args.tokens)
    print(f"text: {DATA} from the first paragraph at/after char {args.offset}; {len(ids)} tokens "
          f"(llama.cpp tokenizer); llama.cpp n_batch {args.llama_batch}")
    t0 = time.time()
    ref = llama_logits(llm, ids)
    t1 = time.time()
    em = Ember(args.lib, args.model, args.threads, args.batch_invariant)
    ours, our_lp = em.score(ids)
    t2 = time.time()
    print(f"llama.cpp eval {t1 - t0:.1f}s, ember score {t2 - t1:.1f}s (ember {em.version})")
    lr, lo = log_softmax(ref), log_softmax(ours)
    kl = kl_rows(lr, lo)
    top_r, top_o = lr.argmax(-1), lo.argmax(-1)
    agree = top_r == top_o
    n = len(ids)
    print(f"positions: {n}")
    print(f"top-1 agreement: {agree.sum()}/{n} = {100.0 * agree.mean():.2f}%")
    print(f"KL(llama || ember): mean {kl.mean():.6f}  median {np.median(kl):.6f}  p99 {np.quantile(kl, 0.99):.6f}  "
          f"max {kl.max():.6f} (position {int(kl.argmax())})")
    # Log-prob of the actual next token, both engines.
    nxt = np.array(ids[1:])
    lp_ref_next = lr[np.arange(n - 1), nxt]
    lp_our_next = lo[np.arange(n - 1), nxt]
    d = np.abs(lp_ref_next - lp_our_next)
    print(f"|logprob(next token)| difference: mean {d.mean():.5f}  max {d.max():.5f}; "
          f"ember_engine_score logprobs vs its own logits: max diff {np.abs(our_lp - lp_our_next).max():.2e}")
    dl = np.abs(ref - ours)
    print(f"raw logit |diff|: mean {dl.mean():.5f}  max {dl.max():.4f}")
    nll_r, nll_o = -lp_ref_next.mean(), -lp_our_next.mean()
    print(f"ppl over these {n - 1} predictions: llama.cpp {np.exp(nll_r):.4f}  ember {np.exp(nll_o):.4f}")
    print("KL by position range (detects position-dependent errors):")
    for a in range(0, n, 128):
        b = min(n, a + 128)
        print(f"  [{a:5d},{b:5d}) mean KL {kl[a:b].mean():.6f}  max {kl[a:b].max():.6f}  "
              f"top-1 {100.0 * agree[a:b].mean():6.2f}%")
    bad = np.nonzero(~agree)[0]
    if len(bad):
        print(f"top-1 disagreements ({len(bad)}): position, llama top-1 (logit gap to its 2nd), ember top-1, KL")
        for p in bad[:40]:
            srt = np.sort(ref[p])[-2:]
            print(f"  pos {p:5d}: llama {top_r[p]:6d} (gap {srt[1] - srt[0]:.4f}, ember's pick is "
                  f"{ref[p, top_r[p]] - ref[p, top_o[p]]:.4f} below)  ember {top_o[p]:6d}  KL {kl[p]:.6f}")
    # Tokenizer parity on the same text (informational; all comparisons above use llama.cpp's ids).
    text = llm.detokenize(ids).decode("utf-8", errors="replace")
    ours_ids = em.tokenize(text)
    same = ours_ids == llama_tokenize(llm, text)
    print(f"tokenizer parity on this text: {'identical' if same else 'DIFFERENT'} "
          f"({len(ours_ids)} ember ids vs {len(llama_tokenize(llm, text))} llama ids)")


# ----------------------------------------------------------------- greedy

PROMPTS: list[tuple[str, str, str]] = [
    # (name, kind, text); kind "chat" = the model's chat template with one user message
    ("story_plain", "plain", "Once upon a time, in a small village at the edge of a great forest, there lived"),
    ("fox_plain", "plain", "The quick brown fox"),
    ("history_plain", "plain", "In 1492, Columbus sailed across the Atlantic Ocean. His voyage"),
    ("science_plain", "plain", "Photosynthesis is the process by which plants"),
    ("python_plain", "plain", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("cpp_plain", "plain", "#include <iostream>\n\nint main() {\n"),
    ("json_plain", "plain", "{\"name\": \"Alice\", \"age\": 30, \"skills\": ["),
    ("math_plain", "plain", "Question: What is 12 times 7?\nAnswer:"),
    ("list_plain", "plain", "Shopping list:\n1. Milk\n2. Eggs\n3."),
    ("counting_plain", "plain", "1, 2, 3, 4, 5, 6,"),
    ("french_plain", "plain", "La ville de Paris est célèbre pour"),
    ("german_plain", "plain", "Der Berliner Fernsehturm ist"),
    ("spanish_plain", "plain", "Había una vez un niño que"),
    ("austen_plain", "plain", "It is a truth universally acknowledged, that"),
    ("recipe_plain", "plain", "To make a simple tomato sauce, first"),
    ("chat_capital", "chat", "What is the capital of France?"),
    ("chat_story", "chat", "Write a short story about a robot who learns to paint."),
    ("chat_code", "chat", "Write a Python function that checks whether a string is a palindrome."),
    ("chat_math", "chat", "If a train travels 60 km in 45 minutes, what is its average speed in km/h?"),
    ("chat_list", "chat", "List five fruits that are high in vitamin C."),
    ("chat_explain", "chat", "Explain in simple terms how a refrigerator works."),
    ("chat_french", "chat", "Peux-tu me donner trois conseils pour apprendre une langue ?"),
    ("chat_chinese", "chat", "请用一句话介绍一下太阳系。"),
    ("chat_haiku", "chat", "Write a haiku about autumn leaves."),
]


def render_chat(llm, user: str) -> str:
    import jinja2

    tmpl = llm.metadata.get("tokenizer.chat_template")
    bos, eos = "<|im_start|>", "<|im_end|>"
    if tmpl is None:  # as Ember (and llama.cpp): the architecture's known template
        arch = llm.metadata.get("general.architecture", "")
        with open(os.path.join(ROOT, "tests", "golden", "chat", f"{arch}.jinja"), encoding="utf-8") as f:
            tmpl = f.read()
        bos = llm.detokenize([llm.token_bos()], special=True).decode("utf-8")
        eos = llm.detokenize([llm.token_eos()], special=True).decode("utf-8")
    env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=False, lstrip_blocks=False)
    rendered = env.from_string(tmpl).render(messages=[{"role": "user", "content": user}], add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)
    # The BOS the template writes is the one tokenize(add_bos) adds: keep one.
    if bos and rendered.startswith(bos) and llm.metadata.get("tokenizer.ggml.add_bos_token") in ("true", True):
        rendered = rendered[len(bos):]
    return rendered


def prompt_ids(llm) -> list[tuple[str, list[int]]]:
    out = []
    for name, kind, text in PROMPTS:
        if kind == "chat":
            out.append((name, llama_tokenize(llm, render_chat(llm, text), special=True)))
        else:
            out.append((name, llama_tokenize(llm, text)))
    return out


def cmd_greedy(args) -> None:
    header(args)
    llm = load_llama(args, n_ctx=2048, logits_all=True, two_seqs=True)
    em = Ember(args.lib, args.model, args.threads)
    n = args.n
    total = match = full = 0
    tf = {"ember score vs llama decode": 0, "llama batch vs llama decode": 0, "ember score vs ember decode": 0}
    notes = []
    print(f"{len(PROMPTS)} prompts, {n} greedy tokens each (EOS ignored), same prompt ids for both engines.")
    print("prefix = identical leading tokens; pos-match = position-wise equal tokens; teacher-forced argmax "
          "agreement: E/L = Ember score (one batch) on llama's continuation, L/L = llama.cpp batch eval on its "
          "own incremental continuation, E/E = Ember score on Ember's decode continuation")
    print(f"{'prompt':16s} {'len':>4s} {'prefix':>6s} {'pos-match':>9s} {'E/L':>4s} {'L/L':>4s} {'E/E':>4s}  "
          f"first divergence (lp = log-prob, from llama.cpp's incremental decode and from Ember's score)")
    for (name, ids) in prompt_ids(llm):
        rows: list = []
        ref, gaps = llama_greedy(llm, ids, n, rows)
        ours = em.greedy(ids, n)
        prefix = next((i for i in range(n) if i >= len(ours) or ours[i] != ref[i]), n)
        pos = sum(1 for i in range(n) if i < len(ours) and ours[i] == ref[i])
        base = len(ids) - 1
        e_ref = log_softmax(em.score(ids + ref)[0][base: base + n])
        l_ref = llama_logits(llm, ids + ref)[base: base + n]
        e_our = log_softmax(em.score(ids + ours)[0][base: base + len(ours)])
        el = int((e_ref.argmax(-1) == np.array(ref)).sum())
        ll = int((l_ref.argmax(-1) == np.array(ref)).sum())
        ee = int((e_our.argmax(-1) == np.array(ours)).sum())
        tf["ember score vs llama decode"] += el
        tf["llama batch vs llama decode"] += ll
        tf["ember score vs ember decode"] += ee
        for k in np.nonzero(e_our.argmax(-1) != np.array(ours))[0]:
            best = int(e_our[k].argmax())
            notes.append(f"  {name} step {k}: Ember decode chose {ours[k]} but Ember score prefers {best} by "
                         f"{e_our[k, best] - e_our[k, ours[k]]:.3f} nats")
        total += n
        match += pos
        full += prefix == n
        div = "-"
        if prefix < n:
            p = prefix
            lp = log_softmax(rows[p])
            a, b = ref[p], ours[p] if p < len(ours) else -1
            ta = llm.detokenize([a]).decode("utf-8", "replace")
            tb = llm.detokenize([b]).decode("utf-8", "replace") if b >= 0 else "<none>"
            div = (f"@{p}: llama {a} {ta!r} vs ember {b} {tb!r}; llama lp {lp[a]:.3f} vs {lp[b]:.3f}; "
                   f"ember-score lp {e_ref[p, a]:.3f} vs {e_ref[p, b]:.3f}")
        print(f"{name:16s} {len(ids):4d} {prefix:6d} {pos:5d}/{n:<3d} {el:4d} {ll:4d} {ee:4d}  {div}")
        sys.stdout.flush()
    print(f"overall position-wise greedy match: {match}/{total} = {100.0 * match / total:.2f}%; "
          f"identical continuations: {full}/{len(PROMPTS)}")
    for k, v in tf.items():
        print(f"teacher-forced argmax agreement, {k}: {v}/{total} = {100.0 * v / total:.2f}%")
    if notes:
        print("Ember decode vs Ember score disagreements:")
        print("\n".join(notes))


# ----------------------------------------------------------------- selfcheck


def cmd_selfcheck(args) -> None:
    """llama.cpp against itself with flash attention on (a standard llama.cpp setting): the noise floor.

    Every quantized engine rounds activations to 8 bits before each matmul; a difference in the last bit
    of any value upstream flips some of those roundings and the differences then spread through the
    layers. This measures how far llama.cpp moves from its own default output when only its attention
    kernel changes, with the same metrics `logits` and `greedy` report for Ember."""
    header(args)
    base = load_llama(args, n_ctx=2048, logits_all=True)
    from llama_cpp import Llama

    fa = Llama(model_path=args.model, n_ctx=2048, n_batch=512, n_ubatch=512, logits_all=True,
               n_threads=args.threads, n_threads_batch=args.threads, flash_attn=True, verbose=False)
    ids = text_ids(base, args.offset, args.tokens)
    lr, lf = log_softmax(llama_logits(base, ids)), log_softmax(llama_logits(fa, ids))
    kl = kl_rows(lr, lf)
    agree = lr.argmax(-1) == lf.argmax(-1)
    print(f"text: {DATA} from the first paragraph at/after char {args.offset}; {len(ids)} tokens")
    print(f"llama.cpp (default, flash_attn off) vs llama.cpp (flash_attn on), same GGUF, same ids:")
    print(f"  top-1 agreement: {agree.sum()}/{len(ids)} = {100.0 * agree.mean():.2f}%")
    print(f"  KL(off || on): mean {kl.mean():.6f}  median {np.median(kl):.6f}  max {kl.max():.6f}")
    nxt = np.array(ids[1:])
    n = len(ids)
    nll_a, nll_b = -lr[np.arange(n - 1), nxt].mean(), -lf[np.arange(n - 1), nxt].mean()
    print(f"  ppl over these {n - 1} predictions: off {np.exp(nll_a):.4f}  on {np.exp(nll_b):.4f}")
    total = match = full = 0
    print(f"greedy, {args.n} tokens per prompt (EOS ignored), flash_attn off vs on:")
    for name, pids in prompt_ids(base):
        a, ga = llama_greedy(base, pids, args.n)
        b, _ = llama_greedy(fa, pids, args.n)
        prefix = next((i for i in range(args.n) if a[i] != b[i]), args.n)
        pos = sum(1 for i in range(args.n) if a[i] == b[i])
        total += args.n
        match += pos
        full += prefix == args.n
        where = "-" if prefix == args.n else f"@{prefix} (gap there {ga[prefix]:.3f})"
        print(f"  {name:16s} prefix {prefix:3d} pos-match {pos:3d}/{args.n}  first divergence {where}")
        sys.stdout.flush()
    print(f"  overall position-wise greedy match: {match}/{total} = {100.0 * match / total:.2f}%; "
          f"identical continuations: {full}/{len(PROMPTS)}")


# ----------------------------------------------------------------- perplexity


def cmd_perplexity(args) -> None:
    header(args)
    ctx = args.ctx
    llm = load_llama(args, n_ctx=ctx, logits_all=True, n_batch=ctx)
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    t0 = time.time()
    tokens = llama_tokenize(llm, text)  # common_tokenize(ctx, prompt, add_special=true)
    n_file = len(tokens)
    tokens = tokens[: args.max_tokens]
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else \
        llm.metadata.get("tokenizer.ggml.add_bos_token", "false") == "true"
    n_chunk = len(tokens) // ctx
    first = ctx // 2
    print(f"file {args.file}: {n_file} tokens (llama.cpp tokenizer), using the first {len(tokens)}; "
          f"{n_chunk} windows of {ctx}, each scored on positions {first}..{ctx - 2} "
          f"({ctx - 1 - first} predictions); add_bos={bool(add_bos)}")
    nll, count = 0.0, 0
    for i in range(n_chunk):
        start = i * ctx
        window = list(tokens[start: start + ctx])
        if add_bos:
            window[0] = llm.token_bos()
        lg = llama_logits(llm, window)
        lp = log_softmax(lg[first: ctx - 1])
        tgt = np.array(tokens[start + first + 1: start + ctx])
        nll -= lp[np.arange(len(tgt)), tgt].sum()
        count += len(tgt)
        if (i + 1) % 10 == 0 or i + 1 == n_chunk:
            print(f"  llama.cpp [{i + 1}/{n_chunk}] ppl={np.exp(nll / count):.4f}", file=sys.stderr)
    ppl_ref = float(np.exp(nll / count))
    t1 = time.time()
    print(f"llama.cpp (llama-cpp-python) perplexity: {ppl_ref:.4f} over {count} predictions ({t1 - t0:.0f}s)")
    sys.stdout.flush()
    cli = os.path.join(ROOT, "build", "apps", "cli", "ember")
    cmd = [cli, "perplexity", "-m", args.model, "-f", args.file, "--ctx", str(ctx), "--max-tokens",
           str(args.max_tokens), "-t", str(args.threads), "--kv-type", args.kv_type]
    print(f"ember: {' '.join(shlex.quote(c) for c in cmd)}")
    sys.stdout.flush()
    r = subprocess.run(cmd, capture_output=True, text=True)
    t2 = time.time()
    m = re.search(r"ppl=([0-9.]+) tokens=(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        print(f"ember perplexity FAILED (rc {r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}")
        sys.exit(1)
    ppl_ours = float(m.group(1))
    print(f"ember perplexity: {ppl_ours:.4f} over {m.group(2)} predictions ({t2 - t1:.0f}s)")
    print(f"relative difference (ember - llama.cpp) / llama.cpp: {100.0 * (ppl_ours - ppl_ref) / ppl_ref:+.3f}%")
    # Both sides tokenize the file themselves; confirm they saw the same ids.
    em = Ember(args.lib, args.model, args.threads)
    ours = em.tokenize(text)[: args.max_tokens]
    if ours == tokens:
        print(f"tokenizer parity: ember's first {len(ours)} ids of the file are identical to llama.cpp's")
    else:
        k = next((i for i in range(min(len(ours), len(tokens))) if ours[i] != tokens[i]), min(len(ours), len(tokens)))
        print(f"tokenizer parity: DIFFERENT from id {k}: llama {tokens[k:k + 8]} ember {ours[k:k + 8]}")


# ----------------------------------------------------------------- golden


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def cmd_golden(args) -> None:
    import llama_cpp

    header(args)
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    llm = load_llama(args, n_ctx=2048, logits_all=True, two_seqs=True)
    common = [f"# command: (cd <repo> && {command_line().replace(ROOT + '/', '')})",
              f"# reference: llama.cpp via llama-cpp-python {llama_cpp.__version__}, n_threads={args.threads}",
              f"# llama.cpp build: {llama_system_info()}",
              f"# model: {os.path.basename(args.model)} sha256={sha256(args.model)}",
              f"# date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d')}"]
    # Greedy continuations.
    lines = ["# Ember reference golden: llama.cpp greedy (argmax, EOS ignored) continuations."] + common + [
        "# format: 'P <name> <n> <ids...>' prompt ids (llama.cpp tokenizer, chat prompts via the model's template),",
        f"#         'G <name> <n> <ids...>' llama.cpp's {args.n} greedy ids,",
        "#         'M <name> <n> <gaps...>' llama.cpp's top1-top2 logit gap at each generated step."]
    for name, ids in prompt_ids(llm):
        ref, gaps = llama_greedy(llm, ids, args.n)
        lines.append(f"P {name} {len(ids)} " + " ".join(map(str, ids)))
        lines.append(f"G {name} {len(ref)} " + " ".join(map(str, ref)))
        lines.append(f"M {name} {len(gaps)} " + " ".join(f"{g:.3f}" for g in gaps))
        print(f"  {name}: {len(ids)} prompt ids -> {llm.detokenize(ref).decode('utf-8', 'replace')[:60]!r}")
    path = os.path.join(GOLDEN_DIR, f"{args.prefix}greedy.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    # Per-position top-5 on real text.
    ids = text_ids(llm, args.golden_offset, args.positions)
    lp = log_softmax(llama_logits(llm, ids))
    lines = ["# Ember reference golden: llama.cpp next-token distribution at every position of a text."] + common + [
        f"# text: pride_and_prejudice.txt, first paragraph at/after char {args.golden_offset}, {len(ids)} tokens",
        "# format: 'T <n> <ids...>' the token ids; then per position i: 'R <i> <top1> (<id> <logprob>) x5',",
        "#         llama.cpp's top-1 id and its top-5 (id, natural-log prob) for the token after ids[0..i]."]
    lines.append(f"T {len(ids)} " + " ".join(map(str, ids)))
    for i in range(len(ids)):
        top = np.argsort(-lp[i], kind="stable")[:5]
        lines.append(f"R {i} {int(top[0])} " + " ".join(f"{int(t)} {lp[i, t]:.5f}" for t in top))
    path = os.path.join(GOLDEN_DIR, f"{args.prefix}positions.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    # Preview what tests/integration/reference_test.cpp checks, when Ember is built (to pick its thresholds).
    if os.path.exists(args.lib):
        try:
            preview_test(args, llm, ids, lp)
        except Exception as e:  # (e.g. a model this Ember build cannot load yet)
            print(f"no preview: {e}")


def preview_test(args, llm, ids: list[int], lp: np.ndarray) -> None:
    em = Ember(args.lib, args.model, args.threads)
    n = len(ids)
    lo = log_softmax(em.score(ids)[0])
    top_r, top_o = lp.argmax(-1), lo.argmax(-1)
    srt = np.sort(lp, axis=-1)
    gap = srt[:, -1] - srt[:, -2]
    d = np.abs(lo[np.arange(n), top_r] - lp[np.arange(n), top_r])
    dec = gap >= args.decisive
    print(f"[positions] top-1 agreement {100.0 * (top_o == top_r).mean():.2f}% ({(top_o == top_r).sum()}/{n}); "
          f"on decisive positions (llama gap >= {args.decisive}) {100.0 * (top_o == top_r)[dec].mean():.2f}% "
          f"({(top_o == top_r)[dec].sum()}/{dec.sum()}); largest llama gap at a disagreement "
          f"{gap[top_o != top_r].max() if (top_o != top_r).any() else 0:.4f}")
    print(f"[positions] |logprob(llama top-1)| ember vs llama: mean {d.mean():.5f} max {d.max():.5f} "
          f"(position {int(d.argmax())}); KL mean {kl_rows(lp, lo).mean():.6f}")
    worst_div = 0.0
    tf_checked = tf_agreed = 0
    worst_tf = 0.0
    raw = total = 0
    for name, pids in prompt_ids(llm):
        rows: list = []
        ref, gaps = llama_greedy(llm, pids, args.n, rows)
        ours = em.greedy(pids, args.n)
        total += args.n
        raw += sum(1 for k in range(args.n) if k < len(ours) and ours[k] == ref[k])
        prefix = next((k for k in range(args.n) if k >= len(ours) or ours[k] != ref[k]), args.n)
        ok = prefix == args.n or gaps[prefix] < args.near_tie
        if prefix < args.n:
            worst_div = max(worst_div, gaps[prefix])
        e = em.score(pids + ref)[0][len(pids) - 1: len(pids) - 1 + args.n].argmax(-1)
        for k in range(args.n):
            if gaps[k] >= args.decisive:
                tf_checked += 1
                tf_agreed += int(e[k] == ref[k])
            if e[k] != ref[k]:
                worst_tf = max(worst_tf, gaps[k])
        print(f"[greedy] {name:16s} ember diverges at {prefix:2d}"
              f"{'' if prefix == args.n else f' (llama top1-top2 gap there {gaps[prefix]:.3f})'}"
              f"{'' if ok else f'  <-- llama was decisive (gap >= {args.near_tie})'}")
    print(f"[greedy] raw position-wise agreement {100.0 * raw / total:.2f}%; largest llama gap at a divergence "
          f"{worst_div:.3f} (the test requires < {args.near_tie})")
    print(f"[teacher-forced] ember score argmax vs llama greedy on steps with llama gap >= {args.decisive}: "
          f"{tf_agreed}/{tf_checked}; largest llama gap at any disagreement {worst_tf:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "capi", "libember.so"))
    ap.add_argument("--threads", type=int, default=2)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("logits", help="per-position top-1 agreement and KL on real text")
    p.add_argument("--offset", type=int, default=100000, help="character offset into the text")
    p.add_argument("--tokens", type=int, default=1200)
    p.add_argument("--llama-batch", type=int, default=512,
                   help="llama.cpp's n_batch/n_ubatch: 512 = its batched evaluation (llamafile tinyBLAS attention), "
                        "1 = one llama_decode per token (its decode path, the one greedy generation uses)")
    p.add_argument("--batch-invariant", type=int, choices=(0, 1), default=None,
                   help="set ember_engine_params.batch_invariant (default: the library's default)")
    p = sub.add_parser("greedy", help="greedy continuations of varied prompts")
    p.add_argument("-n", type=int, default=64)
    p = sub.add_parser("selfcheck", help="llama.cpp vs llama.cpp with flash attention (the noise floor)")
    p.add_argument("--offset", type=int, default=100000, help="character offset into the text")
    p.add_argument("--tokens", type=int, default=1200)
    p.add_argument("-n", type=int, default=64)
    p = sub.add_parser("perplexity", help="llama-perplexity method on a text file")
    p.add_argument("--file", default=DATA)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=50000)
    p.add_argument("--kv-type", choices=("f16", "q8_0"), default="f16",
                   help="the KV cache's type on both sides: q8_0 is llama.cpp's type_k = type_v = q8_0 "
                        "(with flash attention, which a quantized V needs) and ember's --kv-type q8_0")
    p = sub.add_parser("golden", help="write tests/golden/reference/{greedy,positions}.txt")
    p.add_argument("-n", type=int, default=64)
    p.add_argument("--positions", type=int, default=256)
    p.add_argument("--golden-offset", type=int, default=300000)
    p.add_argument("--decisive", type=float, default=0.5, help="llama top1-top2 gap that must not flip")
    p.add_argument("--near-tie", type=float, default=1.0, help="greedy may diverge only below this llama gap")
    p.add_argument("--prefix", default="", help="file name prefix: <prefix>greedy.txt, <prefix>positions.txt")
    args = ap.parse_args()
    {"logits": cmd_logits, "greedy": cmd_greedy, "selfcheck": cmd_selfcheck, "perplexity": cmd_perplexity, "golden": cmd_golden}[args.cmd](args)


if __name__ == "__main__":
    main()
