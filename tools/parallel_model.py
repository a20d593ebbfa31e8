#!/usr/bin/env python3
"""The performance model of a model split across N devices (docs/PARALLEL.md).

One decode step of B rows on a decoder of L layers, width E, vocabulary V,
weights of W bytes:

  tensor parallel (N ranks), Megatron's split (partial sums all-reduced):
                               T = W / N / bw_mem                     (each rank reads its share)
                                 + (2 L + 1) * AR(B * E * a)            (attn_output, ffn_down, embedding)
                                 + AG(B * V / N * 4)                    (the logits, gathered)
  tensor parallel, exact (Ember's default: attn_output and ffn_down by output rows,
  their inputs and outputs all-gathered; bit-identical to one device):
                               T = W / N / bw_mem
                                 + L * (AG(B Q a / N) + AG(B F a / N) + 2 AG(B E a / N)) + AR(B E a)
                                 + AG(B * V / N * 4)          (Q: all heads' width, F: the FFN width)
  pipeline parallel (N stages, a step cut into M micro-batches):
    decode (bound by memory: every micro-batch reads its stage's weights again)
                               T = (M + N - 1) * W / N / bw_mem + (N - 1) * (lat + B * E * a / bw_link)
                               (best M = 1: one device's time; the split buys memory, not decode speed)
    prefill (bound by compute C): T = (M + N - 1) / M * C / N + hops    (speed-up N M / (M + N - 1))
  with a ring all-reduce  AR(S) = 2 (N - 1) * lat + 2 (N - 1) / N * S / bw_link
  and  all-gather         AG(S) = (N - 1) * lat + (N - 1) * S / bw_link
  (a = bytes per activation value: 2 on GPUs (fp16), 4 on Ember's CPU ranks).

Prints tokens/s (B / T) for the links and N given; `--check-cpu` also prints
the prediction for the two CPU ranks measured on this machine, from the
figures passed in (docs/PARALLEL.md gives the commands that measure them).
"""
import argparse

SHAPES = {  # name: (layers, n_embd, vocab, weight bytes, heads x head_dim, n_ff)
    "llama3-8b-q4_k_m": (32, 4096, 128256, 4.92e9, 4096, 14336),
    "llama3-8b-f16": (32, 4096, 128256, 16.06e9, 4096, 14336),
    "llama3-70b-q4_k_m": (80, 8192, 128256, 42.5e9, 8192, 28672),
}
# Assumed, not measured here (public figures): usable HBM bandwidth of an H100
# SXM at ~85% of 3.35 TB/s; NVLink 4 ring all-reduce bus bandwidth ~360 GB/s
# and ~3 us per hop for small messages (NCCL's LL protocol); PCIe Gen5 x16
# ~50 GB/s with ~10 us per hop (peer to peer through the switch or the host).
LINKS = {"nvlink": (360e9, 3e-6), "pcie": (50e9, 10e-6)}


def ar(size, n, bw, lat):
    return 0.0 if n == 1 else 2 * (n - 1) * lat + 2 * (n - 1) / n * size / bw


def ag(size, n, bw, lat):
    return 0.0 if n == 1 else (n - 1) * lat + (n - 1) * size / bw


def tp_step(layers, embd, vocab, wbytes, n, b, bw_mem, bw, lat, act):
    return wbytes / n / bw_mem + (2 * layers + 1) * ar(b * embd * act, n, bw, lat) + ag(b * vocab / n * 4, n, bw, lat)


def tp_exact_step(layers, embd, vocab, wbytes, qdim, ff, n, b, bw_mem, bw, lat, act):
    per_layer = ag(b * qdim * act / n, n, bw, lat) + ag(b * ff * act / n, n, bw, lat) + 2 * ag(b * embd * act / n, n, bw, lat)
    return (wbytes / n / bw_mem + layers * per_layer + ar(b * embd * act, n, bw, lat) +
            ag(b * vocab / n * 4, n, bw, lat))


def pp_decode_step(layers, embd, vocab, wbytes, n, b, bw_mem, bw, lat, act, m):
    return (m + n - 1) * wbytes / n / bw_mem + (n - 1) * (lat + b * embd * act / bw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama3-8b-q4_k_m", choices=sorted(SHAPES))
    ap.add_argument("--hbm", type=float, default=0.85 * 3.35e12, help="usable memory bandwidth, bytes/s")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--check-cpu", nargs=5, type=float, metavar=("T1_MS", "C_US", "AG_US", "COLLECTIVES", "TP_MS"),
                    help="one rank's step (ms), one collective of the step's rows (us), the logits all-gather (us), "
                         "the collectives a step makes, and the measured tensor-parallel step on 2 ranks (ms)")
    a = ap.parse_args()
    layers, embd, vocab, wbytes, qdim, ff = SHAPES[a.shape]
    print(f"{a.shape}: {layers} layers, n_embd {embd}, vocab {vocab}, weights {wbytes / 1e9:.2f} GB, "
          f"memory bandwidth {a.hbm / 1e12:.2f} TB/s per device")
    print("| link | batch | N | TP all-reduce: decode tokens/s | its comm share | TP exact: decode tokens/s | its comm "
          "share | PP decode tokens/s (M = 1) | PP prefill speed-up (M = 4N) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for link, (bw, lat) in LINKS.items():
        for b in a.batch:
            for n in (1, 2, 4, 8):
                t = tp_step(layers, embd, vocab, wbytes, n, b, a.hbm, bw, lat, 2)
                comm = t - wbytes / n / a.hbm
                e = tp_exact_step(layers, embd, vocab, wbytes, qdim, ff, n, b, a.hbm, bw, lat, 2)
                ecomm = e - wbytes / n / a.hbm
                p = pp_decode_step(layers, embd, vocab, wbytes, n, b, a.hbm, bw, lat, 2, 1)
                m = 4 * n
                print(f"| {link} | {b} | {n} | {b / t:,.0f} | {comm / t:.0%} | {b / e:,.0f} | {ecomm / e:.0%} | "
                      f"{b / p:,.0f} | {n * m / (m + n - 1):.2f}x |")
    if a.check_cpu:
        t1, c_us, ag_us, nc, tp_ms = a.check_cpu
        pred = t1 / 2 + (nc * c_us + ag_us) / 1e3
        print(f"CPU check, 2 ranks: predicted {pred:.2f} ms per step (one rank {t1:.2f} ms / 2 + "
              f"{nc:.0f} collectives x {c_us:.1f} us + gather {ag_us:.0f} us), measured {tp_ms:.2f} ms "
              f"({tp_ms / pred - 1:+.0%})")


if __name__ == "__main__":
    main()
