#!/usr/bin/env python3
"""The Python binding's side of bindings/tools/bench_bindings.py (a benchmark, not a test).

    PYTHONPATH=build/bindings/python python3 bench_python.py MODEL N PROMPT decode|drain [REPS]

Each repetition: a fresh session on one engine (KV pool 64 MiB, as greedy_ref), one user message,
a greedy reply of exactly N tokens (ignore_eos), read through the binding's Stream.
  decode: times from the first piece to the end as the consumer sees it ("decode_s T tokens N").
  drain:  waits for the stream to end, then times reading its queued events: the binding's own
          cost with the engine out of the way ("drain_s T tokens N").
The last repetition's token ids go to stdout (the driver checks them against the C API's).
"""
import sys
import time

import ember


def once(engine, n, prompt, drain):
    with engine.session() as session:
        session.add_message("user", prompt)
        with session.generate(max_tokens=n, temperature=0, ignore_eos=True) as stream:
            if drain:
                stream.wait()
                t0 = time.perf_counter()
                for _ in stream:
                    pass
            else:
                t0 = None
                for _ in stream:
                    if t0 is None:
                        t0 = time.perf_counter()
            seconds = time.perf_counter() - t0
            tokens = stream.tokens
    print(f"{'drain_s' if drain else 'decode_s'} {seconds:.9f} tokens {len(tokens)}", file=sys.stderr)
    return tokens


def main():
    if len(sys.argv) < 5:
        sys.exit("usage: bench_python.py MODEL N PROMPT decode|drain [REPS]")
    path, n, prompt, drain = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "drain"
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    with ember.Model(path) as model, ember.Engine(model, kv_memory_bytes=64 << 20) as engine:
        for _ in range(reps):
            tokens = once(engine, n, prompt, drain)
    print(" ".join(str(t) for t in tokens))


if __name__ == "__main__":
    main()
