#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server: Ember's `ember serve` against llama.cpp's
(`llama_cpp.server` from llama-cpp-python[server]) on the same GGUF, machine and load.

    python3 tools/bench_serve.py [-m MODEL] [--requests 1000] [--concurrency 64] [--max-tokens 32]
                                 [-t 2] [--servers ember,llamacpp] [--json OUT.json]

Each server is started by this script (loopback, `threads` CPU threads), warmed
up with one request, then sent `requests` streaming chat completions from
`concurrency` client threads at once (each thread sends its next request as
soon as its previous one ends), every request a different prompt, greedy, at
most `max-tokens` tokens. Measured per request: time to first token (TTFT,
from sending the request to the first content chunk) and the gaps between
content chunks (inter-token latency, ITL; one chunk per token on both
servers); overall: completion tokens per second of wall time and requests
per second. Percentiles p50/p90/p99. llama.cpp's server runs under
$EMBER_HOME/refvenv (bash tools/setup.sh --reference).

The client threads share the machine's cores with the server, equally for
both servers.
"""

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOME = os.environ.get("EMBER_HOME") or os.path.expanduser("~/.cache/ember")

TOPICS = ["the moon", "rain", "cats", "the ocean", "bread", "music", "trains", "volcanoes", "bees", "chess",
          "glass", "coffee", "winter", "maps", "bridges", "clocks", "paper", "salt", "wind", "gardens"]
ASKS = ["Tell me a fact about {t}.", "Write one sentence about {t}.", "Why do people like {t}?",
        "Describe {t} to a child.", "Give me a tip about {t}."]


def prompt(i):
    return "%s (request %d)" % (ASKS[i % len(ASKS)].format(t=TOPICS[(i // len(ASKS)) % len(TOPICS)]), i)


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


def wait_ready(url, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited with %d" % proc.returncode)
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.3)
    raise RuntimeError("server not ready after %d s" % timeout)


def start(kind, model, threads, port, concurrency):
    if kind == "ember":
        cmd = [os.path.join(ROOT, "build/apps/cli/ember"), "serve", "-m", model, "--port", str(port), "-t",
               str(threads), "--parallel", str(concurrency), "--queue", "4096", "--quiet"]
    else:
        py = os.path.join(HOME, "refvenv/bin/python")
        cmd = [py, "-m", "llama_cpp.server", "--model", model, "--port", str(port), "--n_threads", str(threads),
               "--n_threads_batch", str(threads), "--n_ctx", "2048", "--verbose", "false",
               # By default a new request cuts the running stream short; a server under load must not.
               "--interrupt_requests", "false"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d" % port
    wait_ready(url, proc)
    return proc, url


def one_request(host, port, i, max_tokens, model_id):
    body = json.dumps({"model": model_id, "messages": [{"role": "user", "content": prompt(i)}], "stream": True,
                       "temperature": 0, "max_tokens": max_tokens})
    conn = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:200]))
    times = []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        j = json.loads(data)
        ch = j.get("choices") or []
        if ch and (ch[0].get("delta") or {}).get("content"):
            times.append(time.perf_counter())
    conn.close()
    return t0, times


def run_load(url, n_requests, concurrency, max_tokens, model_id):
    host, port = url[len("http://"):].split(":")
    port = int(port)
    lock = threading.Lock()
    next_i = [0]
    results, errors = [], []

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= n_requests:
                    return
                next_i[0] += 1
            try:
                results.append(one_request(host, port, i, max_tokens, model_id))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(str(e))

    one_request(host, port, 10 ** 6, 4, model_id)  # warm-up
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [(ts[0] - t0r) * 1000 for t0r, ts in results if ts]
    itl = [(b - a) * 1000 for _, ts in results for a, b in zip(ts, ts[1:])]
    tokens = sum(len(ts) for _, ts in results)
    return {"requests": len(results), "errors": len(errors), "first_errors": errors[:3], "wall_s": wall,
            "tokens": tokens, "tokens_per_s": tokens / wall, "requests_per_s": len(results) / wall,
            "ttft_ms": {p: pct(ttft, p) for p in (50, 90, 99)}, "ttft_mean_ms": statistics.mean(ttft) if ttft else 0,
            "itl_ms": {p: pct(itl, p) for p in (50, 90, 99)}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=os.path.join(HOME, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--servers", default="ember,llamacpp")
    ap.add_argument("--port", type=int, default=18400)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    model_id = re.sub(r"\.gguf$", "", os.path.basename(a.model))
    out = {"model": a.model, "requests": a.requests, "concurrency": a.concurrency, "max_tokens": a.max_tokens,
           "threads": a.threads, "date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "servers": {}}
    for n, kind in enumerate(a.servers.split(",")):
        proc, url = start(kind, a.model, a.threads, a.port + n, a.concurrency)
        try:
            # llama_cpp.server answers to any model name; Ember to its own id.
            r = run_load(url, a.requests, a.concurrency, a.max_tokens, model_id)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        out["servers"][kind] = r
        print("%-9s %4d req (%d errors) in %6.1f s: %7.1f tok/s, %5.2f req/s | TTFT p50 %7.0f p90 %7.0f p99 %7.0f ms"
              " | ITL p50 %6.1f p90 %6.1f p99 %6.1f ms" % (
                  kind, r["requests"], r["errors"], r["wall_s"], r["tokens_per_s"], r["requests_per_s"],
                  r["ttft_ms"][50], r["ttft_ms"][90], r["ttft_ms"][99], r["itl_ms"][50], r["itl_ms"][90],
                  r["itl_ms"][99]), flush=True)
        if r["errors"]:
            print("  errors:", r["first_errors"])
    s = out["servers"]
    if "ember" in s and "llamacpp" in s:
        print("ember / llama.cpp: tokens/s %.2fx, TTFT p50 %.2fx lower, p99 %.2fx lower" % (
            s["ember"]["tokens_per_s"] / s["llamacpp"]["tokens_per_s"],
            s["llamacpp"]["ttft_ms"][50] / s["ember"]["ttft_ms"][50],
            s["llamacpp"]["ttft_ms"][99] / s["ember"]["ttft_ms"][99]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
