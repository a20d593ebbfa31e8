#!/usr/bin/env bash
# The CLI contract: stdout carries only the generated text / ids / final
# line; bad input gives one error line on stderr and a non-zero exit code.
set -u
ember="$1"
model="${EMBER_HOME:-$HOME/.cache/ember}/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -s "$model" ]; then
  [ -n "${CI:-}" ] && { echo "model missing: $model"; exit 1; }
  echo "model missing, skipping"; exit 77
fi
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }

expect_error() {  # name, command...
  local name="$1"; shift
  "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  if [ $rc -ne 0 ] && [ ! -s "$tmp/out" ] && [ "$(wc -l <"$tmp/err")" -ge 1 ] && grep -q "ember" "$tmp/err"; then ok; else bad "$name (rc=$rc, stdout=$(head -c 200 "$tmp/out"), stderr=$(head -c 300 "$tmp/err"))"; fi
}

expect_error "missing model" "$ember" generate -m "$tmp/none.gguf" -p hi
head -c 100000 "$model" > "$tmp/trunc.gguf"
expect_error "truncated model" "$ember" generate -m "$tmp/trunc.gguf" -p hi
printf 'GGUF\x03\x00\x00\x00garbage' > "$tmp/garbage.gguf"
expect_error "garbage model" "$ember" generate -m "$tmp/garbage.gguf" -p hi
expect_error "bad -n" "$ember" generate -p hi -n abc
expect_error "bad temp" "$ember" generate -p hi --temp -1
expect_error "unknown option" "$ember" generate -p hi --frobnicate
expect_error "invalid UTF-8 prompt" "$ember" generate -p $'\xff\xfe'
expect_error "prompt over context" "$ember" generate -p "$(python3 -c "print('x '*9000)")" -n 2
expect_error "missing -p" "$ember" generate
expect_error "perplexity missing file" "$ember" perplexity -f "$tmp/none.txt"
expect_error "unknown command" "$ember" frobnicate

# generate: only the text on stdout, deterministic when greedy.
a="$("$ember" generate -p "The capital of France is" -n 8 --temp 0 2>/dev/null)"
b="$("$ember" generate -p "The capital of France is" -n 8 --temp 0 2>/dev/null)"
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok; else bad "greedy generate not deterministic: '$a' vs '$b'"; fi
c="$("$ember" generate -p "Say hello." --chat -n 16 --seed 3 2>/dev/null)"; [ -n "$c" ] && ok || bad "chat generate empty"
# penalties reach the sampler: a frequency penalty changes greedy counting, an empty window (--penalty-last-n 0) not.
count="1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
p0="$("$ember" generate -p "$count" -n 12 --temp 0 2>/dev/null)"
p1="$("$ember" generate -p "$count" -n 12 --temp 0 --frequency-penalty 5 --presence-penalty 5 2>/dev/null)"
p2="$("$ember" generate -p "$count" -n 12 --temp 0 --frequency-penalty 5 --presence-penalty 5 --penalty-last-n 0 2>/dev/null)"
if [ -n "$p0" ] && [ "$p0" != "$p1" ] && [ "$p0" = "$p2" ]; then ok; else bad "penalties: '$p0' / '$p1' / '$p2'"; fi
expect_error "bad --penalty-last-n" "$ember" generate -p hi --penalty-last-n -2
expect_error "bad --presence-penalty" "$ember" generate -p hi --presence-penalty 101
# ... exactly the generated text: no newline of its own (one greedy token: " Paris").
"$ember" generate -p "The capital of France is" -n 1 --temp 0 > "$tmp/g1.txt" 2>/dev/null
[ "$(od -An -tx1 "$tmp/g1.txt" | tr -d ' \n')" = "$(printf ' Paris' | od -An -tx1 | tr -d ' \n')" ] && ok ||
  bad "generate -n 1 wrote '$(cat "$tmp/g1.txt")' (bytes: $(od -An -tx1 "$tmp/g1.txt"))"
# generate --spec: the same greedy text with every drafter; --stats on stderr only.
for spec in ngram self:20 "draft:$model"; do
  s="$("$ember" generate -p "The capital of France is" -n 8 --temp 0 --spec "$spec" --stats 2>"$tmp/spec.err")"
  [ "$s" = "$a" ] && ok || bad "generate --spec $spec gave '$s', plain '$a'"
  grep -q "speculation: drafted [0-9]*, accepted [0-9]*, passes [0-9]*" "$tmp/spec.err" && ok || bad "--stats line: $(cat "$tmp/spec.err")"
done
# --spec-lookup 0: the early exit alone, the same text.
s="$("$ember" generate -p "The capital of France is" -n 8 --temp 0 --spec self:20 --spec-lookup 0 2>/dev/null)"
[ "$s" = "$a" ] && ok || bad "generate --spec self:20 --spec-lookup 0 gave '$s', plain '$a'"
expect_error "bad --spec" "$ember" generate -p hi --spec guess
expect_error "--spec self:0" "$ember" generate -p hi --spec self:0
expect_error "--spec draft missing" "$ember" generate -p hi --spec "draft:$tmp/none.gguf"
expect_error "--spec-nodes 0" "$ember" generate -p hi --spec ngram --spec-nodes 0
expect_error "--spec-lookup 2" "$ember" generate -p hi --spec self --spec-lookup 2
# bench --spec: one JSON line, identical outputs.
j="$("$ember" bench --spec ngram --prompt "1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2," -n 12 -r 1 -t 1 --json 2>/dev/null)"
[[ "$j" == *'"identical": true'* ]] && ok || bad "bench --spec json '$j'"
# tokenize: ids only.
ids="$("$ember" tokenize -p "Hello world")"
[ "$ids" = "19556 905" ] && ok || bad "tokenize gave '$ids'"
# embed: one JSON array of n_embd numbers per non-empty input line, in order;
# --normalize gives unit vectors; -p TEXT equals the same line of a file.
printf 'Paris is the capital of France.\n\nThe quick brown fox.\n' > "$tmp/embed.txt"
"$ember" embed -f "$tmp/embed.txt" --normalize -t 1 > "$tmp/embed.out" && python3 - "$tmp/embed.out" <<'PY' && ok || bad "embed -f"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 2 and all(len(r) == 576 for r in rows), [len(r) for r in rows]
assert all(abs(math.sqrt(sum(x * x for x in r)) - 1) < 1e-4 for r in rows)
PY
one="$("$ember" embed -p "The quick brown fox." --normalize -t 1)"
[ "$one" = "$(sed -n 2p "$tmp/embed.out")" ] && ok || bad "embed -p differs from the file's line"
"$ember" embed -p "Hi" --pooling last -t 1 | python3 -c "import json,sys; assert len(json.load(sys.stdin)) == 576" \
  && ok || bad "embed --pooling last"
expect_error "embed of an empty text" "$ember" embed -p ""
expect_error "embed --pooling max" "$ember" embed -p "x" --pooling max
# perplexity: the last line has the contract format.
head -c 20000 "$(dirname "$0")/../../../shared/data/pride_and_prejudice.txt" > "$tmp/pp.txt" 2>/dev/null || python3 -c "print('It is a truth universally acknowledged. '*300)" > "$tmp/pp.txt"
last="$("$ember" perplexity -f "$tmp/pp.txt" --ctx 128 --max-tokens 512 2>/dev/null | tail -n 1)"
[[ "$last" =~ ^ppl=[0-9]+\.[0-9]+\ tokens=[0-9]+$ ]] && ok || bad "perplexity last line '$last'"
# perplexity --stream: the same contract for every cache policy, series CSV written.
for cache in sink:4:60 window:64 full recompute:32; do
  last="$("$ember" perplexity -f "$tmp/pp.txt" --stream --cache "$cache" --max-tokens 120 -t 1 --series "$tmp/s.csv" 2>/dev/null | tail -n 1)"
  [[ "$last" =~ ^ppl=[0-9]+\.[0-9]+\ tokens=119$ ]] && ok || bad "perplexity --stream --cache $cache last line '$last'"
done
head -n 1 "$tmp/s.csv" | grep -q "^tokens,ppl," && ok || bad "series header"
expect_error "bad --cache" "$ember" perplexity -f "$tmp/pp.txt" --stream --cache sink:4
expect_error "--cache without --stream" "$ember" perplexity -f "$tmp/pp.txt" --cache sink:4:60
expect_error "window under a block" "$ember" perplexity -f "$tmp/pp.txt" --stream --cache window:8
# bench --json is JSON.
"$ember" bench -p 16 -n 4 -r 1 --json | python3 -c "import json,sys; json.load(sys.stdin)" && ok || bad "bench --json"
# bench --sessions: K sessions, every one generates, KV figures present.
j="$("$ember" bench --sessions 3 -p 16 -n 4 -t 1 --json)"
echo "$j" | python3 -c "import json,sys; d=json.load(sys.stdin); assert d['generated']==12 and d['kv_peak_mb']>0, d" \
  && ok || bad "bench --sessions '$j'"
# bench --prefix-cache: the cached prompt reuses blocks.
out="$("$ember" bench --prefix-cache 64 -r 1 -t 1)"
echo "$out" | grep -Eq "prefix blocks reused [1-9]" && ok || bad "bench --prefix-cache '$out'"
expect_error "bench --sessions 0" "$ember" bench --sessions 0

# --lora FILE[:SCALE]: an adapter changes the greedy text; at scale 0 it is
# the base's; a truncated, missing or out-of-range one is an error line.
if [ -n "${2:-}" ]; then
  "$2" --lora-for "$model" --rank 8 --seed 5 --out "$tmp/lora.gguf" >/dev/null 2>&1 || bad "make_synthetic_model --lora-for"
  base="$("$ember" generate -p "The capital of France is" -n 12 --temp 0 -t 1 2>/dev/null)"
  with="$("$ember" generate -p "The capital of France is" -n 12 --temp 0 -t 1 --lora "$tmp/lora.gguf" 2>/dev/null)"
  zero="$("$ember" generate -p "The capital of France is" -n 12 --temp 0 -t 1 --lora "$tmp/lora.gguf:0" 2>/dev/null)"
  [ -n "$with" ] && [ "$with" != "$base" ] && ok || bad "--lora changed nothing: '$with'"
  [ "$zero" = "$base" ] && ok || bad "--lora FILE:0 differs from the base: '$zero' vs '$base'"
  two="$("$ember" generate -p "The capital of France is" -n 12 --temp 0 -t 1 --lora "$tmp/lora.gguf:0.5" --lora "$tmp/lora.gguf:0.5" 2>/dev/null)"
  [ -n "$two" ] && ok || bad "two --lora"
  head -c 5000 "$tmp/lora.gguf" > "$tmp/lora_trunc.gguf"
  expect_error "truncated adapter" "$ember" generate -p hi -n 2 --lora "$tmp/lora_trunc.gguf"
  expect_error "missing adapter" "$ember" generate -p hi -n 2 --lora "$tmp/none.gguf"
  expect_error "adapter scale out of range" "$ember" generate -p hi -n 2 --lora "$tmp/lora.gguf:5000"
  expect_error "a model as adapter" "$ember" generate -p hi -n 2 --lora "$model"
fi

# Memory (issue 28 item 3): once chat has loaded the default model, and before
# it generates anything (no KV yet), the process is within 1.1x the file (and
# after a reply within 1.12x the file and the KV written; below), and
# it maps neither the server's HTTP / TLS libraries (libember_serve.so holds
# them) nor oneDNN (libember_dnnl.so, for non-batch-invariant prefill).
python3 - "$ember" "$model" <<'PY' && ok || bad "chat's resident memory or mappings (above)"
import os, select, subprocess, sys, time
ember, model = sys.argv[1:3]
# (chat writes its banner and prompt on stderr, once the model is loaded)
p = subprocess.Popen([ember, "chat", "-m", model, "-n", "32"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT)
def until_prompt(seconds):  # chat's output up to its next "> " prompt
    buf, t0 = b"", time.time()
    while b"\n> " not in buf and time.time() - t0 < seconds:
        if not select.select([p.stdout], [], [], 1.0)[0]:
            continue
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
    return buf
def vm_rss():
    return next(int(l.split()[1]) for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS")) * 1024
buf = until_prompt(120)
rss = vm_rss()
maps = open(f"/proc/{p.pid}/maps").read()
size = os.path.getsize(model)
mapped = [lib for lib in ("libcrypto", "libssl", "httplib", "libdnnl") if lib in maps]
print(f"chat: resident {rss / 2**20:.1f} MiB, model file {size / 2**20:.1f} MiB ({rss / size:.3f}x); mapped: {mapped}")
loaded_ok = b"\n> " in buf and rss <= 1.1 * size and not mapped
# After a reply to a ~600-token prompt: the prompt's buffers and scratch given
# back, so the process holds the file, the KV pages written (the pool is one
# reserved mapping, the largest) and little else: 1.095x on SmolLM2 (Ice Lake,
# 2026-11-28); bounded here at 1.12x (1.31x before the buffers went back).
p.stdin.write((" ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 40) + "\n").encode())
p.stdin.flush()
buf = until_prompt(300)
time.sleep(0.5)
after = vm_rss()
kv, region, rss_kb = 0, None, {}
for line in open(f"/proc/{p.pid}/smaps"):
    f = line.split()
    if "-" in f[0] and not f[0].endswith(":"):
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        region = (hi - lo, len(f) <= 5)  # (virtual size, anonymous)
    elif f[0] == "Rss:" and region[1]:
        rss_kb[region] = rss_kb.get(region, 0) + int(f[1])
kv = rss_kb[max(rss_kb)] * 1024 if rss_kb else 0
p.kill()
p.wait()
ratio = after / (size + kv)
print(f"chat after a reply: resident {after / 2**20:.1f} MiB, file + KV written {(size + kv) / 2**20:.1f} MiB "
      f"({ratio:.3f}x)")
sys.exit(0 if loaded_ok and b"\n> " in buf and ratio <= 1.12 else 1)
PY

echo "cli: $pass passed, $fail failed"
[ $fail -eq 0 ]
