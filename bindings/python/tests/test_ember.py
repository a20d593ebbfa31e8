"""The binding scenarios of issue 11 (section 4), in Python. Run by CTest
(binding_python) with PYTHONPATH at the built package; needs the default model
(skipped when absent, failed when $CI is set)."""

import gc
import math
import os
import subprocess
import tempfile
import threading
import time
import unittest

import ember

PROMPT = "Name three colors."
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"  # every drafter drafts on it (tests/capi/speculative_test.cpp)
KV = 64 << 20  # as bindings/tools/greedy_ref.c


def model_path():
    if os.environ.get("EMBER_MODEL"):
        return os.environ["EMBER_MODEL"]
    home = os.environ.get("EMBER_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "ember")
    return os.path.join(home, "SmolLM2-135M-Instruct.Q4_1.gguf")


def require_model(test):
    if not os.path.exists(model_path()):
        if os.environ.get("CI"):
            test.fail(f"model missing: {model_path()}")
        test.skipTest(f"model not found at {model_path()}")


def c_api_greedy(max_tokens, message=PROMPT):
    """The token ids the C API (bindings/tools/greedy_ref.c) generates greedily."""
    ref = os.environ.get("EMBER_GREEDY_REF")
    if not ref:
        raise unittest.SkipTest("EMBER_GREEDY_REF not set (run through CTest)")
    out = subprocess.run([ref, model_path(), str(max_tokens), message], check=True, capture_output=True, text=True)
    return [int(t) for t in out.stdout.split()]


class EmberTest(unittest.TestCase):
    model = None
    engine = None

    @classmethod
    def setUpClass(cls):
        if os.path.exists(model_path()):
            cls.model = ember.Model(model_path())
            cls.engine = ember.Engine(cls.model, kv_memory_bytes=KV)

    @classmethod
    def tearDownClass(cls):
        if cls.engine:
            cls.engine.close()
            cls.model.close()

    def setUp(self):
        require_model(self)

    def greedy(self, session, n, **kw):
        with session.generate(max_tokens=n, temperature=0, **kw) as s:
            s.read()
            return s

    # -- load and info
    def test_version(self):
        self.assertEqual(ember.version_number(),
                         sum(int(p) * m for p, m in zip(ember.version().split("."), (10000, 100, 1))))
        caps = ember.capabilities()
        self.assertIn(caps["cpu_isa"], ("scalar", "avx2", "avx512_vnni"))
        self.assertIn(caps["cuda_plugin"], ("absent", "loadable", "broken"))

    def test_load_and_info(self):
        info = self.model.info
        self.assertEqual(info.architecture, "llama")
        self.assertEqual(info.n_layers, 30)
        self.assertEqual(info.vocab_size, 49152)
        self.assertGreater(info.n_params, 100_000_000)
        self.assertGreater(info.context_length, 0)
        self.assertEqual(self.engine.device, "cpu")
        self.assertEqual(self.engine.gpu_index, -1)
        self.assertTrue(self.engine.backend_name.startswith("cpu/"))

    def test_tokenize_round_trip(self):
        text = "Hello, world! Ünïcödé 🙂 and <|im_start|> text."
        ids = self.model.tokenize(text)
        self.assertTrue(ids)
        self.assertTrue(all(isinstance(i, int) for i in ids))
        self.assertEqual(self.model.detokenize(ids), text)
        special = self.model.tokenize("<|im_start|>", parse_special=True)
        self.assertEqual(len(special), 1)
        self.assertEqual(self.model.detokenize([]), "")
        with self.assertRaises(ember.InvalidArgumentError):
            self.model.detokenize([10 ** 9])

    # -- generation
    def test_greedy_matches_the_c_api(self):
        expected = c_api_greedy(24)
        self.assertTrue(expected)
        with self.engine.session() as session:
            session.add_message("user", PROMPT)
            s = self.greedy(session, 24)
            self.assertEqual(s.tokens, expected)
            self.assertEqual(s.text, self.model.detokenize(expected))

    def test_pieces_concatenate_to_the_reply(self):
        with self.engine.session(system_prompt="You are brief.") as session:
            session.add_message("user", PROMPT)
            with session.generate(max_tokens=20, temperature=0.8, seed=42) as stream:
                pieces = list(stream)
                self.assertGreater(len(pieces), 1)
                self.assertTrue(all(isinstance(p, str) and p for p in pieces))
                self.assertEqual("".join(pieces), stream.text)
                self.assertEqual(stream.text, self.model.detokenize(stream.tokens))
                self.assertIn(stream.end_reason, (ember.EndReason.MAX_TOKENS, ember.EndReason.EOS))
                st = stream.stats
                self.assertTrue(st.finished)
                # (An end-of-generation token counts as generated; it is not sent.)
                eos = 1 if stream.end_reason == ember.EndReason.EOS else 0
                self.assertEqual(st.generated_tokens, len(stream.tokens) + eos)
                self.assertGreater(st.prompt_tokens, 0)
            # chat() returns the whole reply of a user message.
            reply = session.chat("And three animals?", max_tokens=12, temperature=0)
            self.assertIsInstance(reply, str)
            self.assertTrue(reply)

    def test_same_seed_same_text(self):
        texts = []
        for _ in range(2):
            with self.engine.session() as session:
                texts.append(session.chat(PROMPT, max_tokens=16, temperature=0.9, seed=1234))
        self.assertEqual(texts[0], texts[1])

    def test_stop_strings(self):
        with self.engine.session() as session:
            session.add_message("user", PROMPT)
            full = self.greedy(session, 24).text
        words = full.split()
        self.assertGreaterEqual(len(words), 3, full)
        stop = words[2]
        expected = full[:full.find(stop)]
        with self.engine.session() as session:
            session.add_message("user", PROMPT)
            s = self.greedy(session, 24, stop=[stop, "\u2603never"])
            self.assertEqual(s.end_reason, ember.EndReason.STOP_STRING)
            self.assertEqual(s.text, expected)
            self.assertNotIn(stop, s.text)

    def test_cancel_from_another_thread(self):
        with self.engine.session() as session:
            session.add_message("user", "Write a very long story about the sea.")
            with session.generate(max_tokens=400, temperature=0, ignore_eos=True) as stream:
                first = next(stream)
                self.assertTrue(first)
                t = threading.Thread(target=stream.cancel)
                t.start()
                t.join()
                rest = list(stream)
                self.assertEqual(stream.end_reason, ember.EndReason.CANCELLED)
                self.assertLess(len(stream.tokens), 400)
                self.assertEqual(first + "".join(rest), stream.text)
            # The session stays usable.
            self.assertTrue(session.chat("Thanks.", max_tokens=4, temperature=0) is not None)

    def test_two_sessions_on_two_threads(self):
        prompts = ["Name three colors.", "Count from one to five."]
        alone = []
        for p in prompts:
            with self.engine.session() as s:
                s.add_message("user", p)
                alone.append(self.greedy(s, 20).tokens)
        results = [None, None]
        errors = []
        barrier = threading.Barrier(2)

        def run(i):
            try:
                with self.engine.session() as s:
                    s.add_message("user", prompts[i])
                    barrier.wait()
                    results[i] = self.greedy(s, 20).tokens
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(results, alone)

    def test_save_load_continue_exactly(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "chat.ember")
            with self.engine.session(system_prompt="You are brief.") as a:
                a.add_message("user", PROMPT)
                self.greedy(a, 12)
                a.save(path)
                n = a.token_count
                a.add_message("user", "Now three fruits.")
                cont_a = self.greedy(a, 16).tokens
            with self.engine.load_session(path) as b:
                self.assertEqual(b.token_count, n)
                b.add_message("user", "Now three fruits.")
                cont_b = self.greedy(b, 16).tokens
            self.assertEqual(cont_b, cont_a)
            with self.assertRaises(ember.NotFoundError):
                self.engine.load_session(os.path.join(d, "missing.ember"))

    def test_score(self):
        ids = self.model.tokenize("The capital of France is Paris.")
        with self.engine.session() as s:
            lp = s.score(ids)
        self.assertEqual(len(lp), len(ids))
        self.assertNotEqual(lp[0], lp[0])  # NaN: nothing before the first token
        self.assertTrue(all(v <= 0.0 for v in lp[1:]))

    # -- embeddings (C ABI 1.5)
    def test_embed(self):
        texts = ["The quick brown fox jumps over the lazy dog.", "Dragons hate rain.", "Paris is in France."]
        d = self.model.info.n_embd
        vectors = self.engine.embed(texts)
        self.assertEqual(len(vectors), len(texts))
        for v in vectors:
            self.assertEqual(len(v), d)
            self.assertTrue(all(math.isfinite(x) for x in v))
        self.assertNotEqual(vectors[0], vectors[1])
        self.assertEqual(self.engine.embed(texts), vectors)  # the same texts again: the same vectors
        self.assertEqual([self.engine.embed(t) for t in texts], vectors)  # one at a time = together
        self.assertEqual(self.engine.embed(tuple(texts)), vectors)
        for v in self.engine.embed(texts, normalize=True):
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in v)), 1.0, delta=1e-4)
        last = self.engine.embed(texts, pooling="last")
        self.assertEqual(len(last[0]), d)
        self.assertNotEqual(last[0], vectors[0])
        self.assertNotEqual(self.engine.embed(texts[0], pooling="cls"), vectors[0])
        # Token ids: the text's tokens as the library adds them (add_special, no special-token parsing).
        ids = [self.model.tokenize(t, add_special=True, parse_special=False) for t in texts]
        self.assertEqual(self.engine.embed_tokens(ids), vectors)
        self.assertEqual(self.engine.embed_tokens(ids[1]), vectors[1])  # a flat list: one input
        self.assertEqual(self.engine.embed_tokens(ids, pooling="last"), last)
        # Bad input raises; the engine goes on.
        for bad in ("", [], ["a", ""], ["a", 3], 7, ["a\0b"]):
            with self.assertRaises(ember.InvalidArgumentError, msg=repr(bad)):
                self.engine.embed(bad)
        for bad in ([], [[]], [[-1]], [[self.model.info.vocab_size]], [["a"]], ["text"]):
            with self.assertRaises(ember.InvalidArgumentError, msg=repr(bad)):
                self.engine.embed_tokens(bad)
        for pooling in ("median", "", None, 1):
            with self.assertRaises(ember.InvalidArgumentError):
                self.engine.embed(texts, pooling=pooling)
        with self.assertRaises(ember.InvalidArgumentError):
            self.engine.embed(["x"] * (ember.MAX_EMBED_INPUTS + 1))
        with self.assertRaises(ember.ContextFullError):
            self.engine.embed_tokens([ids[0][:1] * (self.model.info.context_length + 1)])
        self.assertEqual(self.engine.embed(texts[2]), vectors[2])
        with ember.Engine(self.model, kv_memory_bytes=KV) as closed:
            pass
        with self.assertRaises(ember.InvalidArgumentError):
            closed.embed(texts)

    # -- LoRA adapters (C ABI 1.6)
    def make_adapter(self, directory, base=None, name="lora.gguf"):
        """A rank-8 adapter for `base` (the test model) written by make_synthetic_model --lora-for."""
        tool = os.environ.get("EMBER_MAKE_SYNTHETIC_MODEL")
        if not tool:
            self.skipTest("EMBER_MAKE_SYNTHETIC_MODEL not set (run through CTest)")
        path = os.path.join(directory, name)
        subprocess.run([tool, "--lora-for", base or model_path(), "--rank", "8", "--seed", "3", "--out", path],
                       check=True, capture_output=True)
        return path

    def lora_greedy(self, loras, n=16):
        with self.engine.session() as session:
            if loras is not None:
                session.set_loras(loras)
            session.add_message("user", PROMPT)
            return self.greedy(session, n).tokens

    def test_lora(self):
        with tempfile.TemporaryDirectory() as d:
            path = self.make_adapter(d)
            with ember.Lora(self.model, path) as lora:
                info = lora.info
                self.assertIsInstance(info, ember.LoraInfo)
                self.assertEqual(info.max_rank, 8)
                self.assertGreater(info.n_matrices, 0)
                self.assertGreater(info.bytes, 0)
                self.assertTrue(math.isfinite(info.alpha))
                base = self.lora_greedy(None)
                adapted = self.lora_greedy([(lora, 1.0)])
                self.assertTrue(base and adapted)
                self.assertNotEqual(adapted, base)
                self.assertEqual(self.lora_greedy([lora]), adapted)  # scale 1.0 when not given
                self.assertEqual(self.lora_greedy([(lora, 0.0)]), base)
                self.assertEqual(self.lora_greedy([]), base)
                # Changed on one session: [] restores the base model's output.
                with self.engine.session() as s:
                    s.set_loras([(lora, 1.0)])
                    s.add_message("user", PROMPT)
                    self.assertEqual(self.greedy(s, 16).tokens, adapted)
                    s.reset()
                    s.set_loras([])
                    s.add_message("user", PROMPT)
                    self.assertEqual(self.greedy(s, 16).tokens, base)
                    s.set_loras([lora])
                    s.set_loras(None)
                    s.reset()
                    s.add_message("user", PROMPT)
                    self.assertEqual(self.greedy(s, 16).tokens, base)
                # Refused sets raise with the library's message; the session goes on.
                with self.engine.session() as s:
                    for bad in (float("nan"), float("inf"), -2000.0, 1e39):
                        with self.assertRaises(ember.InvalidArgumentError, msg=repr(bad)) as cm:
                            s.set_loras([(lora, bad)])
                        self.assertIn("scale", str(cm.exception))
                    with self.assertRaises(ember.InvalidArgumentError) as cm:
                        s.set_loras([lora] * 17)
                    self.assertIn("16", str(cm.exception))
                    for bad in ([path], [(lora, "x")], [(lora,)], 3, [(1.0, lora)]):
                        with self.assertRaises(ember.InvalidArgumentError, msg=repr(bad)):
                            s.set_loras(bad)
                    s.add_message("user", PROMPT)
                    self.assertEqual(self.greedy(s, 16).tokens, base)
                    with s.generate(max_tokens=50, temperature=0, ignore_eos=True):
                        with self.assertRaises(ember.BusyError):
                            s.set_loras([lora])
            # Closing the adapter while a session uses it: the session keeps it alive.
            with self.engine.session() as s:
                dropped = ember.Lora(self.model, path)
                s.set_loras([dropped])
                dropped.close()
                self.assertTrue(dropped.closed)
                s.add_message("user", PROMPT)
                self.assertEqual(self.greedy(s, 16).tokens, adapted)
                with self.assertRaises(ember.InvalidArgumentError):
                    s.set_loras([dropped])  # a closed Lora
                with self.assertRaises(ember.InvalidArgumentError):
                    dropped.info
                s.reset()
                s.add_message("user", PROMPT)
                self.assertEqual(self.greedy(s, 16).tokens, adapted)  # still the set it had
            # ... and in the middle of a stream.
            with self.engine.session() as s, ember.Lora(self.model, path) as mid:
                s.set_loras([mid])
                s.add_message("user", PROMPT)
                with s.generate(max_tokens=16, temperature=0) as st:
                    next(st)
                    mid.close()
                    st.read()
                    self.assertEqual(st.tokens, adapted)
            # Files that are not adapters for this model.
            with self.assertRaises(ember.BadFormatError) as cm:
                ember.Lora(self.model, model_path())
            self.assertIn("not an adapter", str(cm.exception))
            with self.assertRaises(ember.NotFoundError):
                ember.Lora(self.model, os.path.join(d, "no-such-adapter.gguf"))
            tiny = os.path.join(d, "tiny.gguf")
            subprocess.run([os.environ["EMBER_MAKE_SYNTHETIC_MODEL"], "--preset", "tiny", "--out", tiny],
                           check=True, capture_output=True)
            with self.assertRaises(ember.InvalidArgumentError):
                ember.Lora(self.model, self.make_adapter(d, base=tiny, name="tiny_lora.gguf"))
            with self.assertRaises(ember.InvalidArgumentError):
                ember.Lora("not a model", path)

    # -- speculative decoding
    def spec_greedy(self, prompt, n, **spec):
        """Greedy tokens and stats of one stream on a fresh session: prompt is (kind, text)."""
        kind, text = prompt
        with self.engine.session() as session:
            if kind == "text":
                session.add_text(text)
            else:
                session.add_message("user", text)
            with session.generate(max_tokens=n, temperature=0, **spec) as s:
                s.read()
                return s.tokens, s.stats

    def test_speculative_greedy_equals_plain(self):
        with ember.Model(model_path()) as draft:  # the same file loaded twice: exactness, not speed
            drafters = [("ngram", dict(spec_drafter="ngram")),
                        ("self", dict(spec_drafter="self", spec_self_layers=20)),
                        ("draft", dict(spec_drafter="draft", spec_draft_model=draft)),
                        ("draft (implied), chains", dict(spec_draft_model=draft, spec_threshold=2.0,
                                                          spec_max_nodes=6, spec_max_depth=6, spec_alpha=0.5))]
            for prompt in (("text", COUNTING), ("chat", PROMPT)):
                plain, plain_stats = self.spec_greedy(prompt, 24)
                self.assertTrue(plain)
                self.assertEqual(plain_stats.drafted_tokens, 0)
                self.assertEqual(plain_stats.verify_passes, 0)
                for name, spec in drafters:
                    tokens, st = self.spec_greedy(prompt, 24, **spec)
                    self.assertEqual(tokens, plain, f"{name} on {prompt}")
                    self.assertEqual(st.generated_tokens, plain_stats.generated_tokens)
                    self.assertLessEqual(st.accepted_tokens, st.drafted_tokens, name)
                    if prompt[0] == "text":  # every drafter drafts on a counting sequence
                        self.assertGreater(st.drafted_tokens, 0, name)
                        self.assertGreater(st.verify_passes, 0, name)
                        self.assertAlmostEqual(st.mean_accepted_length, st.accepted_tokens / st.verify_passes)
            # spec_lookup=False: the draft alone; one as costly as the model itself is never run.
            plain, _ = self.spec_greedy(("text", COUNTING), 24)
            tokens, st = self.spec_greedy(("text", COUNTING), 24, spec_draft_model=draft, spec_lookup=False)
            self.assertEqual(tokens, plain)
            self.assertEqual(st.drafted_tokens, 0)

    def test_structured_output(self):
        import json
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                  "required": ["city"]}
        with self.engine.session() as session:
            session.add_message("user", "Which city is the capital of France? Answer in JSON.")
            with session.generate(max_tokens=48, temperature=0, json_schema=schema) as stream:
                reply = stream.read()
            self.assertEqual(list(json.loads(reply).keys()), ["city"], reply)
        with self.engine.session() as session:
            session.add_message("user", "Where does the sun rise?")
            with session.generate(max_tokens=8, temperature=0, choices=["east", "west"]) as stream:
                self.assertIn(stream.read(), ("east", "west"))
        with self.engine.session() as session:
            session.add_message("user", "Is water wet?")
            with session.generate(max_tokens=8, temperature=0, regex="(yes|no)") as stream:
                self.assertIn(stream.read(), ("yes", "no"))
            with self.assertRaises(ember.InvalidArgumentError):
                session.generate(regex="(", max_tokens=4)
            with self.assertRaises(ember.InvalidArgumentError):
                session.generate(regex="a", grammar="root ::= \"a\"", max_tokens=4)

    def test_tool_calling(self):
        tools = [{"type": "function", "function": {
            "name": "move_to", "description": "Walk to a point",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                           "required": ["x", "y"]}}}]
        with self.engine.session() as session:
            session.set_tools(tools)
            session.add_message("user", "Walk to x 3, y 4.")
            with session.generate(max_tokens=64, temperature=0,
                                  tool_choice={"type": "function", "function": {"name": "move_to"}}) as stream:
                self.assertEqual(stream.read(), "")
                calls = stream.tool_calls
            self.assertEqual(len(calls), 1)
            self.assertIsInstance(calls[0], ember.ToolCall)
            self.assertEqual(calls[0].name, "move_to")
            self.assertTrue(calls[0].id.startswith("call_"))
            self.assertEqual(sorted(calls[0].args), ["x", "y"])
            self.assertTrue(all(isinstance(v, int) for v in calls[0].args.values()), calls[0].arguments)
            session.add_message("tool", "arrived")
            with session.generate(max_tokens=8, temperature=0, tool_choice="none") as stream:
                stream.read()
                self.assertEqual(stream.tool_calls, [])
            with self.assertRaises(ember.InvalidArgumentError):
                session.generate(tool_choice="fly_to", max_tokens=4)
            with self.assertRaises(ember.InvalidArgumentError):
                session.generate(tool_choice=3, max_tokens=4)
            with self.assertRaises(ember.InvalidArgumentError):
                session.set_tools("not json")
            session.set_tools(None)
            with self.assertRaises(ember.InvalidArgumentError):  # no tools left to require
                session.generate(tool_choice="required", max_tokens=4)

    def test_logprobs_and_logit_bias(self):
        with self.engine.session() as session:
            session.add_text("The capital of France is Paris. The capital of Italy is")
            with session.generate(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True,
                                  top_logprobs=3) as stream:
                stream.read()
                tokens, lps = stream.tokens, stream.logprobs
        self.assertEqual(len(lps), len(tokens))
        self.assertTrue(all(isinstance(e, ember.TokenLogprob) for e in lps))
        for tok, e in zip(tokens, lps):
            self.assertEqual(e.token, tok)
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(len(e.top), 3)
            self.assertEqual(e.top[0][0], tok)  # greedy: the most likely
        with self.engine.session() as session:
            session.add_text("The capital of France is Paris. The capital of Italy is")
            with session.generate(max_tokens=6, temperature=0, ignore_eos=True,
                                  logit_bias={tokens[0]: float("-inf")}) as stream:
                stream.read()
                self.assertNotIn(tokens[0], stream.tokens)
            with self.assertRaises(ember.InvalidArgumentError):
                session.generate(max_tokens=2, logit_bias={-5: 1.0})
            with self.assertRaises(ember.InvalidArgumentError):
                session.generate(max_tokens=2, top_logprobs=3)

    def test_speculative_stream_keeps_its_draft_model(self):
        plain, _ = self.spec_greedy(("text", COUNTING), 16)
        draft = ember.Model(model_path())
        with self.engine.session() as session:
            session.add_text(COUNTING)
            with session.generate(max_tokens=16, temperature=0, spec_draft_model=draft) as stream:
                self.assertIs(stream.draft_model, draft)
                draft.close()  # the stream keeps it loaded until it ends
                stream.read()
                self.assertEqual(stream.tokens, plain)
                self.assertGreater(stream.stats.verify_passes, 0)
        # A closed model cannot start a stream.
        with self.assertRaises(ember.InvalidArgumentError):
            self.spec_greedy(("text", COUNTING), 4, spec_draft_model=draft)

    def test_speculative_bad_parameters(self):
        bad = [dict(spec_drafter="ngram", spec_max_nodes=0), dict(spec_drafter="ngram", spec_max_nodes=1000),
               dict(spec_drafter="ngram", spec_max_depth=0), dict(spec_drafter="ngram", spec_threshold=float("nan")),
               dict(spec_drafter="ngram", spec_alpha=2.0), dict(spec_drafter="self", spec_self_layers=1000),
               dict(spec_drafter="self", spec_self_layers=-1), dict(spec_drafter="draft"),  # no draft model
               dict(spec_drafter="eagle"), dict(spec_drafter=3), dict(spec_drafter="ngram", spec_draft_model=self.model),
               dict(spec_draft_model="model.gguf")]
        with self.engine.session() as session:
            session.add_text(COUNTING)
            for spec in bad:
                with self.assertRaises(ember.InvalidArgumentError, msg=str(spec)):
                    session.generate(max_tokens=4, temperature=0, **spec)
            # A draft model with another vocabulary is refused by the engine.
            other = os.path.join(os.path.dirname(model_path()), "gemma-3-270m-q4_k_m.gguf")
            if os.path.exists(other):
                with ember.Model(other) as gemma:
                    with self.assertRaises(ember.InvalidArgumentError) as cm:
                        session.generate(max_tokens=4, temperature=0, spec_draft_model=gemma)
                    self.assertIn("vocabulary", str(cm.exception))
            elif os.environ.get("CI"):
                self.fail(f"model missing: {other}")
            # Nothing above left the session busy.
            with session.generate(max_tokens=4, temperature=0, spec_drafter="ngram") as s:
                self.assertEqual(len(s.read() and s.tokens), 4)

    def test_speculative_defaults_are_the_librarys(self):
        import inspect
        from ember import emberc
        d = emberc.eb_sampling()
        params = inspect.signature(ember.Session.generate).parameters
        for name in ("spec_self_layers", "spec_threshold", "spec_max_nodes", "spec_max_depth", "spec_alpha"):
            self.assertAlmostEqual(params[name].default, getattr(d, name), places=6, msg=name)
        self.assertEqual(d.spec_drafter, emberc.SPEC_NONE)
        self.assertIs(params["spec_lookup"].default, True)
        self.assertEqual(d.spec_lookup, 1)

    # -- penalties
    def test_sampling_defaults_are_the_librarys(self):
        import inspect
        from ember import emberc
        d = emberc.eb_sampling()
        params = inspect.signature(ember.Session.generate).parameters
        for name in ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty",
                     "frequency_penalty", "penalty_last_n"):
            self.assertAlmostEqual(params[name].default, getattr(d, name), places=6, msg=name)

    def test_penalties_reach_the_engine(self):
        plain, _ = self.spec_greedy(("text", COUNTING), 24)  # greedy repeats ", " and digits
        for name, kw in (("frequency", dict(frequency_penalty=5.0)), ("presence", dict(presence_penalty=5.0)),
                         ("frequency, whole history", dict(frequency_penalty=5.0, penalty_last_n=-1))):
            tokens, _ = self.spec_greedy(("text", COUNTING), 24, **kw)
            self.assertNotEqual(tokens, plain, name)
        # An empty window (penalty_last_n 0) turns the penalties off.
        off, _ = self.spec_greedy(("text", COUNTING), 24, frequency_penalty=5.0, presence_penalty=5.0,
                                  penalty_last_n=0)
        self.assertEqual(off, plain, "penalties with penalty_last_n 0")

    def test_penalties_bad_values(self):
        bad = [dict(penalty_last_n=-2), dict(presence_penalty=float("nan")), dict(frequency_penalty=float("inf")),
               dict(presence_penalty=101.0), dict(frequency_penalty=-101.0)]
        with self.engine.session() as session:
            session.add_text(COUNTING)
            for kw in bad:  # a stream started by mistake is closed at once (it cannot upset later tests)
                with self.assertRaises(ember.InvalidArgumentError, msg=str(kw)):
                    session.generate(max_tokens=4, temperature=0, **kw).close()
            with self.assertRaises(ember.InvalidArgumentError) as cm:
                session.generate(max_tokens=4, temperature=0, penalty_last_n=-2).close()
            self.assertIn("penalty_last_n", str(cm.exception))
            # Nothing above left the session busy.
            with session.generate(max_tokens=4, temperature=0, penalty_last_n=-1) as s:
                self.assertEqual(len(s.read() and s.tokens), 4)

    # -- errors
    def test_missing_and_corrupt_files(self):
        missing = os.path.join(tempfile.gettempdir(), "ember-no-such-model.gguf")
        with self.assertRaises(ember.NotFoundError) as cm:
            ember.Model(missing)
        self.assertIn("ember-no-such-model.gguf", str(cm.exception))
        self.assertEqual(cm.exception.status, 2)
        self.assertIsInstance(cm.exception, ember.EmberError)
        with open(model_path(), "rb") as src, tempfile.NamedTemporaryFile(suffix=".gguf", delete=False) as f:
            f.write(src.read(100_000))  # a truncated model
        try:
            with self.assertRaises(ember.BadFormatError) as cm:
                ember.Model(f.name)
            self.assertIn(os.path.basename(f.name), str(cm.exception))
            self.assertIn("gguf", str(cm.exception))
            self.assertEqual(cm.exception.status, 3)
        finally:
            os.unlink(f.name)
        with self.assertRaises(ember.InvalidArgumentError):
            self.engine.session(cache="nope")
        with self.assertRaises(ember.InvalidArgumentError) as cm:
            with self.engine.session() as s:
                s.add_message("user", "hi")
                s.generate(max_tokens=0)
        self.assertIn("max_tokens", str(cm.exception))

    def test_busy(self):
        with self.engine.session() as s:
            s.add_message("user", PROMPT)
            with s.generate(max_tokens=50, temperature=0, ignore_eos=True):
                with self.assertRaises(ember.BusyError):
                    s.generate(max_tokens=5)

    # -- lifetimes
    def test_close_in_any_order(self):
        orders = [("model", "engine", "session", "stream"), ("stream", "session", "engine", "model"),
                  ("engine", "model", "stream", "session"), ("session", "stream", "model", "engine")]
        for order in orders:
            m = ember.Model(model_path())
            e = ember.Engine(m, kv_memory_bytes=16 << 20)
            s = e.session()
            s.add_message("user", PROMPT)
            st = s.generate(max_tokens=8, temperature=0)
            objs = {"model": m, "engine": e, "session": s, "stream": st}
            for i, name in enumerate(order):
                objs[name].close()
                objs[name].close()  # twice is fine
                # What is still open keeps working.
                if not st.closed:
                    st.read()
                if not s.closed and st.closed:
                    self.assertIsInstance(s.chat("ok", max_tokens=2, temperature=0), str)

    def test_closed_handles_raise(self):
        m = ember.Model(model_path())
        e = ember.Engine(m, kv_memory_bytes=16 << 20)
        s = e.session()
        s.add_message("user", PROMPT)
        st = s.generate(max_tokens=4, temperature=0)
        for h in (st, s, e, m):
            h.close()
        with self.assertRaises(ember.InvalidArgumentError):
            m.tokenize("x")
        with self.assertRaises(ember.InvalidArgumentError):
            ember.Engine(m)
        with self.assertRaises(ember.InvalidArgumentError):
            e.session()
        with self.assertRaises(ember.InvalidArgumentError):
            s.add_message("user", "x")
        with self.assertRaises(ember.InvalidArgumentError):
            next(iter(st))
        st.cancel()  # a no-op on a closed stream

    def test_drop_to_gc_never_blocks(self):
        # Worker engine: streams mid-generation, dropped with everything else.
        for manual in (False, True):
            m = ember.Model(model_path())
            e = ember.Engine(m, kv_memory_bytes=16 << 20, manual_step=manual)
            sessions = [e.session() for _ in range(3)]
            streams = []
            for s in sessions:
                s.add_message("user", "Write a long poem.")
                streams.append(s.generate(max_tokens=500, ignore_eos=True))
            if not manual:
                next(streams[0])
            t0 = time.monotonic()
            del m, e, sessions, streams, s
            gc.collect()
            self.assertLess(time.monotonic() - t0, 2.0)
        # The shared engine still works after all that.
        with self.engine.session() as s:
            self.assertIsInstance(s.chat(PROMPT, max_tokens=2, temperature=0), str)

    def test_blocking_calls_release_the_gil(self):
        # A stream on a manual-step engine nobody steps: next_piece(timeout) blocks in the library
        # for 600 ms. Python code on another thread must run meanwhile.
        with ember.Engine(self.model, manual_step=True, kv_memory_bytes=16 << 20) as e, e.session() as s:
            s.add_message("user", PROMPT)
            with s.generate(max_tokens=4) as st:
                blocked = threading.Event()
                done = threading.Event()

                def wait():
                    blocked.set()
                    with self.assertRaises(ember.TimeoutError):
                        st.next_piece(timeout_ms=600)
                    done.set()

                t = threading.Thread(target=wait)
                t.start()
                blocked.wait()
                time.sleep(0.1)  # the other thread is inside the library now (or holds the GIL)
                ticks = 0
                t0 = time.monotonic()
                while not done.is_set() and time.monotonic() - t0 < 5:
                    ticks += 1
                t.join()
                self.assertTrue(done.is_set())
                # Had the wait held the GIL, this thread would wake only after it: no ticks at all.
                self.assertGreater(ticks, 1000)

    def test_kv_type_q8_0(self):
        # A Q8_0 KV cache (half the memory per token, CPU only): a few greedy tokens come out, and
        # its session file (which records the KV type) is refused by the shared f16 engine.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "q8.ember")
            with ember.Engine(self.model, kv_memory_bytes=16 << 20, kv_type="q8_0") as e, e.session() as s:
                s.add_message("user", PROMPT)
                st = self.greedy(s, 6)
                self.assertTrue(st.tokens)
                self.assertTrue(st.text)
                self.assertEqual(st.text, self.model.detokenize(st.tokens))
                s.save(path)
            with self.assertRaises(ember.UnsupportedError) as cm:
                self.engine.load_session(path)
            self.assertIn("q8_0", str(cm.exception))
        for bad in ("q4_0", "F16", "", None):
            with self.assertRaises(ember.InvalidArgumentError, msg=repr(bad)) as cm:
                ember.Engine(self.model, kv_type=bad)
            self.assertIsInstance(cm.exception, ValueError)
            self.assertIn("kv_type", str(cm.exception))

    def test_manual_step_engine(self):
        with ember.Engine(self.model, manual_step=True, kv_memory_bytes=16 << 20) as e, e.session() as s:
            s.add_message("user", PROMPT)
            with s.generate(max_tokens=8, temperature=0) as st:
                pieces = []
                for _ in range(200):
                    e.step(max_ms=16)
                    try:
                        while True:
                            p = st.next_piece(timeout_ms=0)
                            if p is None:
                                break
                            pieces.append(p)
                    except ember.TimeoutError:
                        pass
                    if st.finished:
                        break
                self.assertTrue(st.finished)
                self.assertEqual("".join(pieces), st.text)
                self.assertEqual(st.tokens, c_api_greedy(8))


if __name__ == "__main__":
    unittest.main()
