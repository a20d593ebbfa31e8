#!/usr/bin/env python3
"""Prefill and decode speed: Ember vs llama.cpp on the same GGUF, same machine, one run.

Run it with the native llama.cpp build (`bash tools/setup_reference.sh --native`: llama.cpp as
fast as it gets on this CPU); the report warns when the build leaves out SIMD the CPU has (the
AVX2 reference venv, on an AVX-512 CPU, would understate llama.cpp).

Single model (the original mode):

  ~/.cache/ember/refvenv-native/bin/python tools/bench_vs_llamacpp.py [-m MODEL] [-p 512] [-n 128] [-t 2] [-r 3]

Ember: `build/apps/cli/ember bench -p P -n N -t T -r R --json` (random prompt ids, one warm-up
repetition, prefill tokens/s of the P-token prompt, decode tokens/s after the first token).
llama.cpp: llama-cpp-python (built from source) with n_threads=T, n_threads_batch=T, n_batch=512,
n_ubatch=512: per repetition it clears the KV cache, times the eval of P random prompt ids
(logits of the last position only), then N greedy decode steps (argmax of the last logits,
eval of that one token); one warm-up repetition first. Prints both, the ratios and a markdown table.

Suite (issue 15): every workload against llama.cpp in one run, one engine after the other:

  ~/.cache/ember/refvenv-native/bin/python tools/bench_vs_llamacpp.py --suite [--busy-core]
      [--models smollm2,1b-q4_0,1b-q8_0,1b-q4_k_m|PATH.gguf,...] [--threads 1,2] [-p 512] [-n 128] [-r 3]
      [--sections speed,sessions,busy,recovery] [--sessions 16] [--sessions-p 64] [--sessions-n 128]
      [--json-out FILE]

  speed     per model and thread count: prefill (pp P) and decode (tg N) as above; plus the memory
            read bandwidth (build/bench/membw at the same thread counts) and, per decode figure,
            weight bytes read per token x tokens/s as a fraction of it. Weight bytes per token are
            read from the GGUF header: every 2-D tensor of the blocks (the matmul weights) and the
            output head (output.weight, or token_embd.weight when the output is tied to it; an
            untied token embedding is one row per token and is not counted).
  sessions  K concurrent sequences (default 16, prompt --sessions-p, --sessions-n tokens each, at
            --sessions-threads, default the largest of --threads): Ember `ember bench --sessions K`;
            llama.cpp through llama-cpp-python's low-level API: the K prompts packed into batches of
            up to 512 tokens, then one llama_decode per step with K tokens (one per sequence id,
            greedy). Steady decode tokens/s (all sequences decoding) and aggregate (all tokens /
            wall, prefill included), each also as a multiple of the same engine's one-session decode.
  busy      (--busy-core) decode with a spinning process (`python -c 'while True: pass'`, not
            pinned) started before and killed after each measurement, next to the same measurement
            without it: Ember with its default thread count (no -t) and each of --busy-threads
            (default 1,2), llama.cpp at each of --busy-threads. Models: --busy-models (default
            smollm2); prompt --busy-p (default -p).
  recovery  (--busy-core) Ember, default threads, one long decode (--recovery-n, default 1024 tokens,
            `ember bench --token-times`) with the spinner killed halfway through the timed
            repetition (estimated from the warm-up repetition's busy rate); tokens/s over the busy
            part and over the free part after a settling period (--settle, default 0.5 s).

Models: smollm2 = $EMBER_HOME/SmolLM2-135M-Instruct.Q4_1.gguf; 1b-q4_0, 1b-q8_0, 1b-q4_k_m = the
synthetic Llama-3.2-1B shape (16 layers, embd 2048, ff 8192, heads 32/8, vocab 128256, tied) made
by build/tools/make_synthetic_model --seed 1 into $EMBER_HOME/synthetic/ when missing (~0.7-1.3
GB each). The script takes no lock: run it alone on the machine (e.g. under the build lock).
With --busy-core and no --suite: the -m model's comparison at -t, then the busy sections.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.abspath(__file__)
CLI = os.path.join(ROOT, "build", "apps", "cli", "ember")
MEMBW = os.path.join(ROOT, "build", "bench", "membw")
MAKE_SYNTH = os.path.join(ROOT, "build", "tools", "make_synthetic_model")


def ember_home() -> str:
    return os.environ.get("EMBER_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "ember")


def default_model() -> str:
    return os.path.join(ember_home(), "SmolLM2-135M-Instruct.Q4_1.gguf")


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def quote(cmd: list[str]) -> str:
    return " ".join(shlex.quote(str(c)) for c in cmd)


# ----------------------------------------------------------------------------------------------
# The original single-model mode.

def bench_ember(args) -> dict:
    cmd = [CLI, "bench", "-m", args.model, "-p", str(args.p), "-n", str(args.n), "-t", str(args.t), "-r",
           str(args.r), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ember bench failed (rc {r.returncode}): {r.stderr}")
    line = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("{")][-1]
    res = json.loads(line)
    res["command"] = quote(cmd)
    return res


def bench_llama(args) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model_path=args.model, n_ctx=max(1024, args.p + args.n + 16), n_batch=512, n_ubatch=512,
                n_threads=args.t, n_threads_batch=args.t, logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()
    rng = np.random.default_rng(1234)
    pp, tg = [], []
    for rep in range(args.r + 1):  # repetition 0 warms up
        prompt = [int(x) for x in rng.integers(0, n_vocab, size=args.p)]
        llm.reset()  # the next eval drops the whole KV cache (kv_cache_seq_rm from 0)
        t0 = time.perf_counter()
        llm.eval(prompt)
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
        tok = int(np.argmax(logits))
        t1 = time.perf_counter()
        for _ in range(args.n):
            llm.eval([tok])
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
            tok = int(np.argmax(logits))
        t2 = time.perf_counter()
        if rep == 0:
            continue
        pp.append(args.p / (t1 - t0))
        tg.append(args.n / (t2 - t1))
    sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
    return {"prefill_tokens_per_second": statistics.mean(pp), "prefill_stddev": sd(pp),
            "decode_tokens_per_second": statistics.mean(tg), "decode_stddev": sd(tg), "repetitions": args.r,
            "version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}


def bench_llama_sessions(model: str, k: int, p: int, n: int, t: int) -> dict:
    """K sequences decoded together through the low-level API: one llama_decode per step."""
    import llama_cpp
    import llama_cpp as L
    from llama_cpp._logger import set_verbose

    set_verbose(False)  # llama.cpp's errors only (the high-level Llama(verbose=False) does the same)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    lm = L.llama_model_load_from_file(model.encode(), mp)
    if not lm:
        raise RuntimeError(f"llama.cpp cannot load {model}")
    per_seq = (p + n + 8 + 255) // 256 * 256
    cp = L.llama_context_default_params()
    cp.n_ctx = k * per_seq
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_seq_max = k
    cp.n_threads = t
    cp.n_threads_batch = t
    ctx = L.llama_init_from_model(lm, cp)
    if not ctx:
        raise RuntimeError("llama.cpp cannot create the context")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(lm))
    batch = L.llama_batch_init(max(512, k), 0, 1)
    rng = np.random.default_rng(4321)

    def fill(entries):  # (token, pos, seq, logits?)
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, want) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if want else 0

    def decode():
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def run(p_: int, n_: int):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        prompts = [[int(x) for x in rng.integers(0, n_vocab, size=p_)] for _ in range(k)]
        entries = [(prompts[s][j], j, s, j == p_ - 1) for s in range(k) for j in range(p_)]
        cur = [0] * k
        t0 = time.perf_counter()
        for c in range(0, len(entries), 512):  # the prompts packed into batches of up to 512 tokens
            chunk = entries[c:c + 512]
            fill(chunk)
            decode()
            for i, (_, _, seq, want) in enumerate(chunk):
                if want:
                    cur[seq] = int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))))
        t1 = time.perf_counter()
        for step in range(n_ - 1):  # the first token came from the prefill's logits
            fill([(cur[s], p_ + step, s, True) for s in range(k)])
            decode()
            logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(k, n_vocab))
            cur = [int(x) for x in logits.argmax(axis=1)]
        t2 = time.perf_counter()
        return t0, t1, t2

    run(min(p, 16), 4)  # warm-up (pages in the weights, builds the graphs)
    t0, t1, t2 = run(p, n)
    kv_unified = bool(getattr(cp, "kv_unified", False))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(lm)
    return {"sessions": k, "n_prompt": p, "n_gen": n, "threads": t, "generated": k * n,
            "prefill_s": t1 - t0, "decode_s": t2 - t1, "wall_s": t2 - t0,
            "aggregate_tokens_per_second": k * n / (t2 - t0),
            "steady_decode_tokens_per_second": k * (n - 1) / (t2 - t1) if n > 1 else 0.0,
            "n_ctx": k * per_seq, "kv_unified": kv_unified, "version": llama_cpp.__version__}


def llama_worker(args) -> None:
    """--llama-worker: one llama.cpp measurement in this (fresh) process, one JSON line on stdout."""
    if args.sessions:
        res = bench_llama_sessions(args.model, args.sessions, args.p, args.n, args.t)
    else:
        res = bench_llama(args)
    print(json.dumps(res))


def single_mode(args) -> None:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mach = f"{cpu_model()}, {os.cpu_count()} cores (nproc {len(os.sched_getaffinity(0))})"
    cmd = f"{sys.executable} {os.path.relpath(SCRIPT, ROOT)} " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    print(f"# command: (cd {ROOT} && {cmd.strip()})")
    print(f"# date: {date}\n# machine: {mach}\n# model: {args.model}")
    load0 = loadavg()
    print(f"# load average before: {load0} (other processes share these cores; numbers are only comparable "
          f"when it is low)")
    sys.stdout.flush()
    # Run one after the other, never concurrently, so they do not share the cores.
    em = bench_ember(args)
    print(f"ember:     {em['command']}")
    print(f"           prefill {em['prefill_tokens_per_second']:.1f} ± {em['prefill_stddev']:.1f} tok/s, "
          f"decode {em['decode_tokens_per_second']:.1f} ± {em['decode_stddev']:.1f} tok/s")
    sys.stdout.flush()
    ll = bench_llama(args)
    print(f"llama.cpp: llama-cpp-python {ll['version']} ({ll['system_info']})")
    warn = handicap_warning(ll["system_info"])
    if warn:
        print(warn)
    print(f"           prefill {ll['prefill_tokens_per_second']:.1f} ± {ll['prefill_stddev']:.1f} tok/s, "
          f"decode {ll['decode_tokens_per_second']:.1f} ± {ll['decode_stddev']:.1f} tok/s")
    rp = em["prefill_tokens_per_second"] / ll["prefill_tokens_per_second"]
    rd = em["decode_tokens_per_second"] / ll["decode_tokens_per_second"]
    print(f"ratio ember / llama.cpp: prefill {rp:.2f}x, decode {rd:.2f}x")
    print(f"# load average after: {loadavg()}\n")
    print(f"Machine: {mach}; date: {date}; threads: {args.t}; model: {os.path.basename(args.model)}; "
          f"load average {load0} before, {loadavg()} after\n")
    print(f"| engine | pp{args.p} tok/s | tg{args.n} tok/s |")
    print("|---|---:|---:|")
    print(f"| Ember | {em['prefill_tokens_per_second']:.1f} ± {em['prefill_stddev']:.1f} | "
          f"{em['decode_tokens_per_second']:.1f} ± {em['decode_stddev']:.1f} |")
    print(f"| llama.cpp (llama-cpp-python {ll['version']}) | {ll['prefill_tokens_per_second']:.1f} ± "
          f"{ll['prefill_stddev']:.1f} | {ll['decode_tokens_per_second']:.1f} ± {ll['decode_stddev']:.1f} |")
    print(f"| ratio Ember / llama.cpp | {rp:.2f}x | {rd:.2f}x |")
    print(f"\nCommand: `{cmd.strip()}`")


# ----------------------------------------------------------------------------------------------
# GGUF header: tensor names, shapes and types -> bytes a decode step reads.

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
}
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _Reader:
    def __init__(self, f):
        self.f = f

    def unpack(self, fmt: str):
        n = struct.calcsize(fmt)
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("truncated GGUF header")
        return struct.unpack(fmt, b)

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        return self.f.read(n).decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.unpack("<IQ")
            if etype in _SCALAR and etype != 7:
                size = struct.calcsize(_SCALAR[etype])
                self.f.seek(size * count, os.SEEK_CUR)  # arrays (token scores, types) are skipped
                return None
            for _ in range(count):
                self.value(etype)
            return None
        return self.unpack(_SCALAR[vtype])[0]


def gguf_tensors(path: str) -> tuple[dict, list[dict]]:
    """Scalar metadata and tensor infos (name, dims, type, bytes) of a GGUF file."""
    with open(path, "rb", buffering=1 << 20) as f:
        r = _Reader(f)
        magic, version = r.unpack("<4sI")
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path}: not a GGUF v2+ file")
        n_tensors, n_kv = r.unpack("<QQ")
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            (vtype,) = r.unpack("<I")
            val = r.value(vtype)
            if val is not None:
                meta[key] = val
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            (n_dims,) = r.unpack("<I")
            dims = list(r.unpack(f"<{n_dims}Q"))
            ttype, offset = r.unpack("<IQ")
            tensors.append({"name": name, "dims": dims, "type": ttype, "offset": offset})
        data_start = f.tell()
        align = int(meta.get("general.alignment", 32))
        data_start = (data_start + align - 1) // align * align
        file_size = os.fstat(f.fileno()).st_size
    by_offset = sorted(tensors, key=lambda t: t["offset"])
    for i, t in enumerate(by_offset):  # fallback for unknown types: the gap to the next tensor
        nxt = by_offset[i + 1]["offset"] if i + 1 < len(by_offset) else file_size - data_start
        t["span"] = nxt - t["offset"]
    for t in tensors:
        n_el = 1
        for d in t["dims"]:
            n_el *= d
        info = GGML_TYPES.get(t["type"])
        t["type_name"] = info[0] if info else f"type{t['type']}"
        t["bytes"] = n_el // info[1] * info[2] if info else t["span"]
    return meta, tensors


def decode_weight_bytes(path: str) -> dict:
    """Bytes of weights one decode step streams: the blocks' 2-D tensors + the output head."""
    meta, tensors = gguf_tensors(path)
    names = {t["name"]: t for t in tensors}
    blocks = [t for t in tensors if t["name"].startswith("blk.") and len(t["dims"]) >= 2 and t["dims"][1] > 1]
    head = names.get("output.weight")
    tied = head is None
    if tied:
        head = names.get("token_embd.weight")
    total = sum(t["bytes"] for t in blocks) + (head["bytes"] if head else 0)
    types: dict[str, int] = {}
    for t in blocks + ([head] if head else []):
        types[t["type_name"]] = types.get(t["type_name"], 0) + t["bytes"]
    return {"bytes": total, "matmul_bytes": sum(t["bytes"] for t in blocks),
            "head_bytes": head["bytes"] if head else 0, "tied": tied,
            "head_type": head["type_name"] if head else None, "by_type": types,
            "file_bytes": os.path.getsize(path), "arch": meta.get("general.architecture", "?")}


# ----------------------------------------------------------------------------------------------
# The suite.

SYNTH_SHAPE = ["--layers", "16", "--embd", "2048", "--ff", "8192", "--heads", "32", "--kv-heads", "8", "--vocab",
               "128256", "--ctx", "4096", "--rope-base", "500000", "--tied"]
SYNTH_TYPES = {"1b-q4_0": "q4_0", "1b-q8_0": "q8_0", "1b-q4_k_m": "q4_k_m"}
MODEL_LABELS = {"smollm2": "SmolLM2-135M Q4_1", "1b-q4_0": "Llama-3.2-1B shape Q4_0",
                "1b-q8_0": "Llama-3.2-1B shape Q8_0", "1b-q4_k_m": "Llama-3.2-1B shape Q4_K_M"}


class Log:
    """Progress lines (prefixed '#') and every command run, in order."""

    def __init__(self):
        self.commands: list[str] = []

    def say(self, msg: str) -> None:
        print(f"# {msg}", flush=True)

    def ran(self, cmd: list[str], note: str = "") -> None:
        self.commands.append(quote(cmd) + (f"   # {note}" if note else ""))


def model_path(key: str, log: Log) -> str:
    if key.endswith(".gguf"):
        return os.path.abspath(os.path.expanduser(key))
    if key == "smollm2":
        path = default_model()
        if not os.path.exists(path):
            sys.exit(f"{path} is missing: run tools/setup.sh (or tools/fetch_model.sh)")
        return path
    if key not in SYNTH_TYPES:
        sys.exit(f"unknown model '{key}' (smollm2, {', '.join(SYNTH_TYPES)} or a .gguf path)")
    d = os.path.join(ember_home(), "synthetic")
    path = os.path.join(d, f"llama32-1b-shape-{SYNTH_TYPES[key]}-seed1.gguf")
    if os.path.exists(path):
        return path
    if not os.path.exists(MAKE_SYNTH):
        sys.exit(f"{MAKE_SYNTH} is missing: build Ember first (bash tools/build.sh)")
    os.makedirs(d, exist_ok=True)
    tmp = path + ".partial"
    cmd = [MAKE_SYNTH] + SYNTH_SHAPE + ["--type", SYNTH_TYPES[key], "--seed", "1", "--out", tmp]
    log.say(f"making {path}")
    log.ran(cmd[:-1] + [path], "model file")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"make_synthetic_model failed (rc {r.returncode}): {r.stderr}")
    os.replace(tmp, path)
    return path


def run_json(cmd: list[str], what: str) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed (rc {r.returncode}): {quote(cmd)}\n{r.stderr[-2000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("{")]
    if not lines:
        raise RuntimeError(f"{what}: no JSON in the output of {quote(cmd)}\n{r.stdout[-2000:]}")
    return json.loads(lines[-1])


def ember_cmd(model: str, p: int, n: int, t: int | None, r: int, extra: list[str] | None = None) -> list[str]:
    cmd = [CLI, "bench", "-m", model, "-p", str(p), "-n", str(n)]
    if t is not None:
        cmd += ["-t", str(t)]
    return cmd + ["-r", str(r), "--json"] + (extra or [])


def llama_cmd(model: str, p: int, n: int, t: int, r: int, sessions: int = 0) -> list[str]:
    cmd = [sys.executable, SCRIPT, "--llama-worker", "-m", model, "-p", str(p), "-n", str(n), "-t", str(t), "-r",
           str(r)]
    return cmd + (["--sessions", str(sessions)] if sessions else [])


def measure(cmd: list[str], what: str, log: Log, note: str = "") -> dict | None:
    """Runs one measurement; a failure is logged and gives None (the suite goes on)."""
    log.ran(cmd, note)
    t0 = time.monotonic()
    try:
        res = run_json(cmd, what)
    except RuntimeError as e:
        log.say(f"FAILED: {e}".replace("\n", "\n#   "))
        log.commands[-1] += "   # FAILED"
        return None
    res["elapsed_s"] = time.monotonic() - t0
    res["load_after"] = loadavg()
    return res


class Spinner:
    """A process that spins on one CPU (not pinned) while a measurement runs."""

    CODE = "while True: pass"

    def __init__(self):
        self.proc = None
        self.t0 = 0.0
        self.cpu_fraction = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE])
        self.t0 = time.monotonic()
        time.sleep(0.3)  # let it be scheduled before the measurement starts
        return self

    def _cpu_s(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def stop(self) -> float:
        """Kills the spinner; returns time.monotonic() once it is gone."""
        cpu = self._cpu_s()
        wall = time.monotonic() - self.t0
        self.proc.kill()
        self.proc.wait()
        if cpu is not None and wall > 0:
            self.cpu_fraction = cpu / wall
        return time.monotonic()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.stop()


def spinner_cmd() -> str:
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(Spinner.CODE)} &   # the busy core"


def recovery_run(model: str, args, log: Log) -> dict:
    """Ember at its default thread count, one long decode; the spinner is killed halfway."""
    cmd = ember_cmd(model, 32, args.recovery_n, None, 1, ["--token-times"])
    log.ran(cmd, "recovery: spinner running, killed halfway through rep 1's decode")
    marker = re.compile(r"ember bench: rep (\d+) decode (start|end) ([0-9.]+)(?: tokens (\d+))?")
    spinner = Spinner().start()
    kill_mono = None
    busy_rate0 = None
    rep0_start = None
    stderr_other = []
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
        try:
            for line in proc.stderr:
                m = marker.match(line)
                if not m:
                    stderr_other.append(line)
                    continue
                rep, what, t = int(m.group(1)), m.group(2), float(m.group(3))
                if rep == 0 and what == "start":
                    rep0_start = t
                elif rep == 0 and what == "end" and rep0_start is not None and t > rep0_start:
                    busy_rate0 = (int(m.group(4)) - 1) / (t - rep0_start)
                elif rep == 1 and what == "start" and kill_mono is None:
                    half = (args.recovery_n / 2) / busy_rate0 if busy_rate0 else 3.0
                    delay = t + half - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    kill_mono = spinner.stop()
            rc = proc.wait()
        finally:
            if spinner.proc.poll() is None:
                kill_mono = spinner.stop()
        out.seek(0)
        text = out.read()
    if rc != 0:
        raise RuntimeError(f"recovery run failed (rc {rc}): {quote(cmd)}\n{''.join(stderr_other)[-2000:]}")
    res = json.loads([ln for ln in text.splitlines() if ln.strip().startswith("{")][-1])
    times = res["token_times_s"]
    k = kill_mono - res["decode_start_monotonic_s"]
    busy = [x for x in times if x <= k]
    free = [x for x in times if x >= k + args.settle]
    settling = [x for x in times if k < x < k + args.settle]

    def rate(v):
        return (len(v) - 1) / (v[-1] - v[0]) if len(v) > 1 and v[-1] > v[0] else 0.0

    # The same decode with no spinner: the rate over the same token ranges
    # (decode slows down as the context grows, so each part is compared
    # with itself on a quiet machine).
    log.ran(cmd, "recovery reference: the same run with no spinner")
    ref = subprocess.run(cmd, capture_output=True, text=True)
    if ref.returncode != 0:
        raise RuntimeError(f"recovery reference failed (rc {ref.returncode}): {quote(cmd)}")
    rtimes = json.loads([ln for ln in ref.stdout.splitlines() if ln.strip().startswith("{")][-1])["token_times_s"]
    nb, nf = len(busy), len(free)
    ref_busy = rtimes[:nb]
    ref_free = rtimes[len(rtimes) - nf:] if nf else []
    return {"command": quote(cmd), "kill_at_s": k, "tokens": len(times), "busy_tokens": len(busy),
            "quiet_busy_tokens_per_second": rate(ref_busy), "quiet_free_tokens_per_second": rate(ref_free),
            "settling_tokens": len(settling), "free_tokens": len(free), "busy_tokens_per_second": rate(busy),
            "free_tokens_per_second": rate(free), "overall_tokens_per_second": res["decode_tokens_per_second"],
            "warmup_busy_tokens_per_second": busy_rate0, "spinner_cpu_fraction": spinner.cpu_fraction,
            "settle_s": args.settle, "decode_s": times[-1] if times else 0.0}


def g(res: dict | None, key: str):
    """res[key], or None when the measurement failed (res is None)."""
    return res.get(key) if res else None


def fmt_pm(v: float | None, sd: float | None = None) -> str:
    if v is None:
        return "—"
    return f"{v:.1f} ± {sd:.1f}" if sd is not None else f"{v:.1f}"


def pp(res: dict | None) -> str:
    return fmt_pm(g(res, "prefill_tokens_per_second"), g(res, "prefill_stddev"))


def tg(res: dict | None) -> str:
    return fmt_pm(g(res, "decode_tokens_per_second"), g(res, "decode_stddev"))


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "—"


def label(key: str) -> str:
    return MODEL_LABELS.get(key, os.path.basename(key))


def suite(args) -> None:
    log = Log()
    threads = [int(x) for x in args.threads.split(",") if x]
    sections = [s for s in args.sections.split(",") if s] if args.sections else ["speed", "sessions"] + (
        ["busy", "recovery"] if args.busy_core else [])
    for s in sections:
        if s not in ("speed", "sessions", "busy", "recovery"):
            sys.exit(f"unknown section '{s}' (speed, sessions, busy, recovery)")
    model_keys = [m for m in args.models.split(",") if m]
    busy_keys = [m for m in args.busy_models.split(",") if m]
    sess_threads = [int(x) for x in args.sessions_threads.split(",")] if args.sessions_threads else [max(threads)]
    if not os.path.exists(CLI):
        sys.exit(f"{CLI} is missing: build Ember first (bash tools/build.sh)")
    import llama_cpp

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mem_gib = 0.0
    try:
        with open("/proc/meminfo") as f:
            mem_gib = int(f.readline().split()[1]) / (1 << 20)
    except (OSError, ValueError, IndexError):
        pass
    mach = (f"{cpu_model()}, {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {mem_gib:.0f} GiB, "
            f"Linux {platform.release()}")
    commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip() or "?"
    sysinfo = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    invocation = f"{sys.executable} {os.path.relpath(SCRIPT, ROOT)} " + quote(sys.argv[1:])
    load0 = loadavg()
    log.say(f"command: (cd {ROOT} && {invocation})")
    log.say(f"date: {date}; machine: {mach}; Ember {commit}; llama-cpp-python {llama_cpp.__version__}")
    log.say(f"load average before: {load0}")

    keys_needed = list(dict.fromkeys(
        (model_keys if ("speed" in sections or "sessions" in sections) else []) +
        (busy_keys if ("busy" in sections or "recovery" in sections) else [])))
    paths = {k: model_path(k, log) for k in keys_needed}
    weights = {}
    for k, p in paths.items():
        weights[k] = w = decode_weight_bytes(p)
        log.say(f"{k}: {p} ({w['file_bytes'] / 2**20:.1f} MiB); decode reads {w['bytes'] / 2**20:.1f} MiB per token "
                f"(matmuls {w['matmul_bytes'] / 2**20:.1f} MiB + head {w['head_bytes'] / 2**20:.1f} MiB "
                f"{w['head_type']}{', tied' if w['tied'] else ''})")

    results: dict = {"date": date, "machine": mach, "commit": commit, "llama_cpp_python": llama_cpp.__version__,
                     "llama_cpp_system_info": sysinfo, "invocation": invocation, "load_before": load0,
                     "weights": weights, "paths": paths, "speed": [], "sessions": [], "busy": [], "recovery": None}
    bw = {}
    if "speed" in sections:
        if os.path.exists(MEMBW):
            res = measure([MEMBW, "--json", "--threads", ",".join(str(t) for t in threads)], "membw", log,
                          "memory read bandwidth")
            results["membw"] = res
            bw = {row["threads"]: row["best_gb_per_s"] for row in (g(res, "results") or [])}
            log.say("memory read bandwidth: " + ", ".join(f"{t} thread(s) {v:.1f} GB/s" for t, v in bw.items()))
        else:
            log.say(f"{MEMBW} is missing (build Ember): no bandwidth fractions")
        for k in model_keys:
            for t in threads:
                log.say(f"speed: {k}, {t} thread(s), Ember ...")
                em = measure(ember_cmd(paths[k], args.p, args.n, t, args.r), "ember bench", log)
                log.say(f"  Ember pp{args.p} {pp(em)}, tg{args.n} {tg(em)} tok/s (load {g(em, 'load_after')}); "
                        f"llama.cpp ...")
                ll = measure(llama_cmd(paths[k], args.p, args.n, t, args.r), "llama.cpp", log)
                log.say(f"  llama.cpp pp{args.p} {pp(ll)}, tg{args.n} {tg(ll)} tok/s (load {g(ll, 'load_after')})")
                results["speed"].append({"model": k, "threads": t, "ember": em, "llama": ll})
        if os.path.exists(MEMBW):  # again at the end: the bandwidth is the better of the two runs
            res = measure([MEMBW, "--json", "--threads", ",".join(str(t) for t in threads)], "membw", log,
                          "memory read bandwidth again")
            results["membw_end"] = res
            for row in g(res, "results") or []:
                bw[row["threads"]] = max(bw.get(row["threads"], 0.0), row["best_gb_per_s"])
            log.say("memory read bandwidth (end): " +
                    ", ".join(f"{row['threads']} thread(s) {row['best_gb_per_s']:.1f} GB/s"
                              for row in g(res, "results") or []))

    if "sessions" in sections:
        for k in model_keys:
            for t in sess_threads:
                log.say(f"sessions: {k}, {args.sessions} sessions, {t} thread(s), Ember ...")
                cmd = [CLI, "bench", "-m", paths[k], "--sessions", str(args.sessions), "-p", str(args.sessions_p),
                       "-n", str(args.sessions_n), "-t", str(t), "--json"]
                em = measure(cmd, "ember bench --sessions", log)
                log.say(f"  Ember steady {fmt_pm(g(em, 'steady_decode_tokens_per_second'))}, aggregate "
                        f"{fmt_pm(g(em, 'aggregate_tokens_per_second'))} tok/s; llama.cpp ...")
                ll = measure(llama_cmd(paths[k], args.sessions_p, args.sessions_n, t, 1, args.sessions),
                             "llama.cpp sessions", log)
                log.say(f"  llama.cpp decode {fmt_pm(g(ll, 'steady_decode_tokens_per_second'))}, aggregate "
                        f"{fmt_pm(g(ll, 'aggregate_tokens_per_second'))} tok/s")
                results["sessions"].append({"model": k, "threads": t, "ember": em, "llama": ll})

    if "busy" in sections:
        bthreads = [int(x) for x in args.busy_threads.split(",") if x]
        for k in busy_keys:
            configs = [("Ember", None)] + [("Ember", t) for t in bthreads] + [("llama.cpp", t) for t in bthreads]
            for engine, t in configs:
                row = {"model": k, "engine": engine, "threads": t}
                for state in ("free", "busy"):
                    cmd = (ember_cmd(paths[k], args.busy_p, args.n, t, args.r) if engine == "Ember" else
                           llama_cmd(paths[k], args.busy_p, args.n, t, args.r))
                    log.say(f"busy: {k}, {engine} {'default threads' if t is None else f'{t} thread(s)'}, {state} ...")
                    if state == "busy":
                        with Spinner() as sp:
                            res = measure(cmd, engine, log, "with the spinner running")
                        if res:
                            res["spinner_cpu_fraction"] = sp.cpu_fraction
                    else:
                        res = measure(cmd, engine, log)
                    row[state] = res
                    log.say(f"  tg{args.n} {tg(res)} tok/s")
                results["busy"].append(row)

    if "recovery" in sections:
        k = busy_keys[0]
        log.say(f"recovery: {k}, Ember default threads, -n {args.recovery_n}, spinner killed halfway ...")
        try:
            rec = recovery_run(paths[k], args, log)
            rec["model"] = k
            results["recovery"] = rec
            log.say(f"  busy part {rec['busy_tokens_per_second']:.1f} tok/s ({rec['busy_tokens']} tokens), free part "
                    f"{rec['free_tokens_per_second']:.1f} tok/s ({rec['free_tokens']} tokens)")
        except (RuntimeError, ValueError, KeyError, IndexError) as e:
            log.say(f"FAILED: recovery: {e}")

    load1 = loadavg()
    results["load_after"] = load1
    print()
    print_report(results, args, sections, bw, log, load0, load1)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"\nRaw results: {args.json_out}")


def handicap_warning(system_info: str) -> str:
    """A warning when llama.cpp's build leaves out SIMD this CPU has (its speed would be understated)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ""
    missing = [name for flag, name in (("avx512f", "AVX512"), ("avx2", "AVX2"))
               if flag in flags and f"{name} = 1" not in system_info]
    if not missing:
        return ""
    return (f"**WARNING: this llama.cpp build does not use the CPU's {', '.join(missing)}: its speed is "
            f"understated. Use the native build (bash tools/setup_reference.sh --native).**")


def print_report(results, args, sections, bw, log, load0, load1) -> None:
    w = results["weights"]
    one_session = {(r["model"], r["threads"]): r for r in results["speed"]}
    print(f"Machine: {results['machine']}. Date: {results['date']}. Ember `{results['commit']}`, "
          f"llama-cpp-python {results['llama_cpp_python']} ({results['llama_cpp_system_info']}). "
          f"Load average {load0} before, {load1} after.\n")
    warn = handicap_warning(results["llama_cpp_system_info"])
    if warn:
        print(warn + "\n")
    if "speed" in sections:
        m = results.get("membw") or {}
        if bw:
            runs = "; ".join(", ".join(f"{row['threads']}: {row['best_gb_per_s']:.1f}" for row in g(r, "results") or [])
                             for r in (results.get("membw"), results.get("membw_end")) if r)
            print(f"Memory read bandwidth (`membw`, {m.get('buffer_bytes', 0) / 2**30:.0f} GiB buffer, "
                  f"{m.get('kernel')} loads, best of {m.get('reps')} passes, the better of a run before and one "
                  f"after the measurements): " + ", ".join(f"{v:.1f} GB/s at {t} thread(s)" for t, v in bw.items()) +
                  f" (threads: GB/s per run: {runs}).\n")
        print(f"| model | threads | Ember pp{args.p} | llama.cpp pp{args.p} | ratio | Ember tg{args.n} | "
              f"llama.cpp tg{args.n} | ratio | weights/token | Ember BW | llama.cpp BW |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in results["speed"]:
            em, ll, k, t = r["ember"], r["llama"], r["model"], r["threads"]
            wb = w[k]["bytes"]

            def frac(tps, t=t, wb=wb):
                if not tps:
                    return "—"
                gbs = wb * tps / 1e9
                return f"{gbs:.1f} GB/s ({100 * gbs / bw[t]:.0f}%)" if bw.get(t) else f"{gbs:.1f} GB/s"
            emd, lld = g(em, "decode_tokens_per_second"), g(ll, "decode_tokens_per_second")
            print(f"| {label(k)} | {t} | {pp(em)} | {pp(ll)} | "
                  f"**{ratio(g(em, 'prefill_tokens_per_second'), g(ll, 'prefill_tokens_per_second'))}** | "
                  f"{tg(em)} | {tg(ll)} | **{ratio(emd, lld)}** | {wb / 2**20:.1f} MiB | {frac(emd)} | {frac(lld)} |")
        print(f"\ntok/s, mean ± sd of {args.r} repetitions after a warm-up (random prompt ids, greedy decode). BW: "
              f"weight bytes a decode step reads (the blocks' matrices + the output head, from the GGUF header) x "
              f"tg tok/s, and its fraction of the measured read bandwidth at that thread count. — = failed "
              f"(see the log).\n")
    if "sessions" in sections and results["sessions"]:
        print(f"| model | threads | Ember {args.sessions} sessions steady tok/s (x 1 session) | Ember aggregate | "
              f"llama.cpp {args.sessions} sequences decode tok/s (x 1 session) | llama.cpp aggregate | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in results["sessions"]:
            em, ll, k, t = r["ember"], r["llama"], r["model"], r["threads"]
            one = one_session.get((k, t))

            def times(v, eng, one=one):
                base = g(one[eng], "decode_tokens_per_second") if one else None
                return f"{v:.1f} ({v / base:.2f}x)" if v and base else fmt_pm(v or None)
            ems, lls = g(em, "steady_decode_tokens_per_second"), g(ll, "steady_decode_tokens_per_second")
            print(f"| {label(k)} | {t} | {times(ems, 'ember')} | {fmt_pm(g(em, 'aggregate_tokens_per_second'))} | "
                  f"{times(lls, 'llama')} | {fmt_pm(g(ll, 'aggregate_tokens_per_second'))} | **{ratio(ems, lls)}** |")
        kv = next((r["llama"] for r in results["sessions"] if r["llama"]), None)
        print(f"\nEach sequence: {args.sessions_p} random prompt ids, {args.sessions_n} greedy tokens, one run "
              f"(llama.cpp after a short warm-up). Steady: Ember while every session decodes "
              f"(`ember bench --sessions`); "
              f"llama.cpp its decode phase ({args.sessions} tokens, one per sequence id, per llama_decode; "
              f"{'unified' if g(kv, 'kv_unified') else 'per-sequence'} KV cache; the prompts packed into batches of "
              f"512 tokens before). Aggregate: all generated tokens / wall time including the prefills. "
              f"(x 1 session): over the same engine's tg{args.n} at the same threads above (a {args.p}-token "
              f"context). — = failed (see the log), or no steady window (too few tokens per session).\n")
    if "busy" in sections and results["busy"]:
        print(f"| model | engine | threads | tg{args.n} free | tg{args.n} with one core busy | busy / free |")
        print("|---|---|---|---:|---:|---:|")
        for r in results["busy"]:
            fr, bz = r["free"], r["busy"]
            tl = "default" if r["threads"] is None else str(r["threads"])
            print(f"| {label(r['model'])} | {r['engine']} | {tl} | {tg(fr)} | {tg(bz)} | "
                  f"{ratio(g(bz, 'decode_tokens_per_second'), g(fr, 'decode_tokens_per_second'))} |")
        fracs = [g(r["busy"], "spinner_cpu_fraction") for r in results["busy"]]
        fracs = [f for f in fracs if f is not None]
        spin = f" (it got {min(fracs):.0%} to {max(fracs):.0%} of a CPU)" if fracs else ""
        print(f"\nBusy: `{Spinner.CODE}` in another process, not pinned, for the whole measurement{spin}; "
              f"prompt {args.busy_p} tokens, mean ± sd of {args.r} repetitions after a warm-up.\n")
    rec = results.get("recovery")
    if rec:
        spin = f", spinner got {rec['spinner_cpu_fraction']:.0%} of a CPU" if rec["spinner_cpu_fraction"] else ""
        print(f"Recovery ({label(rec['model'])}, Ember default threads, {rec['tokens']} tokens decoded in "
              f"{rec['decode_s']:.1f} s; spinner killed {rec['kill_at_s']:.2f} s after the decode start{spin}):\n")
        def vs(a, b):
            return f"{a / b:.2f}x" if a and b else "—"

        qb, qf = rec.get("quiet_busy_tokens_per_second"), rec.get("quiet_free_tokens_per_second")
        print("| part | tokens | tok/s | same tokens, no spinner (tok/s) | ratio |")
        print("|---|---:|---:|---:|---:|")
        print(f"| one core busy | {rec['busy_tokens']} | {rec['busy_tokens_per_second']:.1f} | {fmt_pm(qb)} | "
              f"{vs(rec['busy_tokens_per_second'], qb)} |")
        print(f"| settling ({rec['settle_s']} s after the kill, left out) | {rec['settling_tokens']} | — | — | — |")
        print(f"| core free again | {rec['free_tokens']} | {rec['free_tokens_per_second']:.1f} | {fmt_pm(qf)} | "
              f"{vs(rec['free_tokens_per_second'], qf)} |")
        print()
    print("Commands (in the order run, one at a time):\n")
    print("```sh")
    print(f"# {results['invocation']}")
    if "busy" in sections or "recovery" in sections:
        print(spinner_cmd())
    for c in log.commands:
        print(c)
    print("```")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=default_model())
    ap.add_argument("-p", type=int, default=512, help="prompt tokens")
    ap.add_argument("-n", type=int, default=128, help="decoded tokens")
    ap.add_argument("-t", type=int, default=2, help="threads (single-model mode)")
    ap.add_argument("-r", type=int, default=3, help="timed repetitions (after one warm-up)")
    ap.add_argument("--suite", action="store_true", help="every workload of issue 15 in one run")
    ap.add_argument("--models", default="smollm2,1b-q4_0,1b-q8_0,1b-q4_k_m",
                    help="suite: comma list of smollm2, 1b-q4_0, 1b-q8_0, 1b-q4_k_m or .gguf paths")
    ap.add_argument("--threads", default="1,2", help="suite: thread counts, comma list")
    ap.add_argument("--sections", default="", help="suite: comma list of speed,sessions,busy,recovery "
                    "(default speed,sessions, plus busy,recovery with --busy-core)")
    ap.add_argument("--sessions", type=int, default=0, help="suite: concurrent sessions (default 16)")
    ap.add_argument("--sessions-p", type=int, default=64, help="suite: prompt tokens per session")
    ap.add_argument("--sessions-n", type=int, default=128, help="suite: tokens generated per session")
    ap.add_argument("--sessions-threads", default="", help="suite: thread counts for sessions (default: max)")
    ap.add_argument("--busy-core", action="store_true", help="add the busy-host sections (a spinning process)")
    ap.add_argument("--busy-models", default="smollm2", help="models for the busy and recovery sections")
    ap.add_argument("--busy-threads", default="1,2", help="thread counts in the busy section (besides Ember's "
                    "default)")
    ap.add_argument("--busy-p", type=int, default=0, help="prompt tokens in the busy section (default -p)")
    ap.add_argument("--recovery-n", type=int, default=1024, help="tokens decoded in the recovery run")
    ap.add_argument("--settle", type=float, default=0.5, help="seconds after the kill left out of the free part")
    ap.add_argument("--json-out", default="", help="suite: write every raw result to this JSON file")
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_worker:
        llama_worker(args)
        return
    args.busy_p = args.busy_p or args.p
    if args.suite or args.busy_core:
        args.sessions = args.sessions or 16
        if not args.suite:  # single model + --busy-core: that model's plain comparison, then the busy sections
            args.models = args.model
            args.busy_models = args.model
            args.threads = args.threads if "--threads" in sys.argv else str(args.t)
            args.sections = args.sections or "speed,busy,recovery"
        suite(args)
        return
    single_mode(args)


if __name__ == "__main__":
    main()
