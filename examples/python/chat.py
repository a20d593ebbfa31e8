#!/usr/bin/env python3
"""Streaming chat with Ember from Python: python3 chat.py [MODEL.gguf] (one message per line on stdin)."""
import os
import sys

import ember

path = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/ember/SmolLM2-135M-Instruct.Q4_1.gguf")
max_tokens = int(os.environ.get("EMBER_MAX_TOKENS", "256"))

with ember.Model(path) as model, ember.Engine(model) as engine:
    with engine.session(system_prompt="You are a helpful assistant.") as session:
        print(f"ember {ember.version()} on {engine.backend_name}; one message per line, Ctrl-D quits", file=sys.stderr)
        for line in sys.stdin:
            if not line.strip():
                continue
            session.add_message("user", line.strip())
            with session.generate(max_tokens=max_tokens, temperature=0.7) as stream:
                for piece in stream:
                    print(piece, end="", flush=True)
                print(f"\n[{stream.stats.tokens_per_second:.0f} tok/s, {stream.end_reason.value}]", file=sys.stderr)
