"""`ember serve` driven by the official `openai` Python client (PyPI), on the real model.

    python test_openai.py EMBER_CLI [MODEL]

Chat (plain, streamed, seeded, stop strings, logprobs), structured output
(json_schema, json_object), tool calls and a tool's result sent back,
completions, embeddings, concurrent streams (each equal to its solo run),
errors as OpenAI error objects with their statuses (400, 401, 404, 413, 503),
a client that leaves mid-stream, a slow client, 100 connections at once, the
metrics, and a clean shutdown on SIGTERM. Greedy replies are checked against
the CLI's (`ember generate --chat --temp 0`), embeddings against `ember embed`.
"""

import base64
import concurrent.futures
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

import jsonschema
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serverlib import EmberServer, default_model  # noqa: E402

EMBER = None
MODEL = None
SERVER = None


def client(server=None, **kw):
    kw.setdefault("api_key", "unused")
    kw.setdefault("max_retries", 0)
    return openai.OpenAI(base_url=(server or SERVER).url + "/v1", **kw)


def chat(prompt, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return client().chat.completions.create(model=SERVER_MODEL_ID, messages=[{"role": "user", "content": prompt}],
                                            **kw)


def stream_text(prompt, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    out = []
    for chunk in client().chat.completions.create(model=SERVER_MODEL_ID, stream=True,
                                                  messages=[{"role": "user", "content": prompt}], **kw):
        if chunk.choices and chunk.choices[0].delta.content:
            out.append(chunk.choices[0].delta.content)
    return "".join(out)


def post_raw(server, path, body, headers=None, timeout=30):
    """POST raw bytes; returns (status, parsed JSON body or text)."""
    req = urllib.request.Request(server.url + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


SERVER_MODEL_ID = None


class Chat(unittest.TestCase):
    def test_models(self):
        models = client().models.list().data
        self.assertEqual([m.id for m in models], [SERVER_MODEL_ID])
        self.assertEqual(client().models.retrieve(SERVER_MODEL_ID).id, SERVER_MODEL_ID)

    def test_greedy_reply_equals_the_cli(self):
        prompt = "Write a long story about a dragon who learns to bake bread."  # (longer than 20 tokens)
        r = chat(prompt, max_tokens=20)
        cli = subprocess.run([EMBER, "generate", "-m", MODEL, "-p", prompt, "--chat", "-n", "20", "--temp", "0"],
                             capture_output=True, text=True, check=True).stdout
        self.assertEqual(r.choices[0].message.content, cli)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 20)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 20)
        self.assertEqual(r.object, "chat.completion")

    def test_stream_equals_plain_and_reports_usage(self):
        prompt = "Name three colors."
        plain = chat(prompt, max_tokens=30)
        chunks = list(client().chat.completions.create(
            model=SERVER_MODEL_ID, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=30,
            stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, plain.choices[0].message.content)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finishes, [plain.choices[0].finish_reason])
        self.assertEqual(chunks[-1].usage.completion_tokens, plain.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, plain.usage.prompt_tokens)

    def test_seed_repeats_a_sampled_reply(self):
        a = chat("Write a short poem about the sea.", temperature=1.0, seed=7, max_tokens=24)
        b = chat("Write a short poem about the sea.", temperature=1.0, seed=7, max_tokens=24)
        c = chat("Write a short poem about the sea.", temperature=1.0, seed=8, max_tokens=24)
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)
        self.assertNotEqual(a.choices[0].message.content, c.choices[0].message.content)

    def test_stop_string(self):
        full = chat("Count from 1 to 10, separated by commas.", max_tokens=40).choices[0].message.content
        self.assertIn("3", full)
        cut = chat("Count from 1 to 10, separated by commas.", max_tokens=40, stop=["3"])
        self.assertEqual(cut.choices[0].message.content, full[:full.index("3")])
        self.assertEqual(cut.choices[0].finish_reason, "stop")

    def test_logprobs(self):
        r = chat("What is 2+2?", max_tokens=12, logprobs=True, top_logprobs=3)
        entries = r.choices[0].logprobs.content
        self.assertEqual("".join(e.token for e in entries), r.choices[0].message.content)
        for e in entries:
            self.assertEqual(len(e.top_logprobs), 3)
            lps = [t.logprob for t in e.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            self.assertAlmostEqual(e.logprob, lps[0], places=5)  # greedy: the chosen token is the likeliest
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(bytes(e.bytes).decode("utf-8", "replace"), e.token)

    def test_json_schema(self):
        schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"], "additionalProperties": False}
        r = chat("Invent a person.", max_tokens=60, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}})
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_json_object(self):
        r = chat("Return a JSON object with your name.", max_tokens=400,
                 response_format={"type": "json_object"})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertIsInstance(json.loads(r.choices[0].message.content), dict)

    def test_tool_call_then_result(self):
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}]
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        r = client().chat.completions.create(model=SERVER_MODEL_ID, messages=messages, tools=tools,
                                             tool_choice="required", temperature=0, max_tokens=60)
        msg = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertGreaterEqual(len(msg.tool_calls), 1)
        call = msg.tool_calls[0]
        self.assertEqual(call.function.name, "get_weather")
        jsonschema.validate(json.loads(call.function.arguments), tools[0]["function"]["parameters"])
        # The same call streamed.
        chunks = list(client().chat.completions.create(model=SERVER_MODEL_ID, messages=messages, tools=tools,
                                                       tool_choice="required", temperature=0, max_tokens=60,
                                                       stream=True))
        streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        self.assertEqual(streamed[0].function.arguments, call.function.arguments)
        self.assertEqual(streamed[0].function.name, "get_weather")
        # The tool's result goes back, the model answers in text.
        messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21}'}]
        r2 = client().chat.completions.create(model=SERVER_MODEL_ID, messages=messages, tools=tools,
                                              tool_choice="none", temperature=0, max_tokens=30)
        self.assertTrue(r2.choices[0].message.content)
        self.assertIsNone(r2.choices[0].message.tool_calls)

    def test_completions(self):
        r = client().completions.create(model=SERVER_MODEL_ID, prompt="The capital of France is", max_tokens=8,
                                        temperature=0, logprobs=2)
        c = r.choices[0]
        self.assertTrue(c.text.startswith(" Paris"))
        self.assertEqual(len(c.logprobs.tokens), 8)
        self.assertEqual("".join(c.logprobs.tokens), c.text)
        self.assertEqual(r.usage.completion_tokens, 8)
        echo = client().completions.create(model=SERVER_MODEL_ID, prompt="The capital of France is", max_tokens=8,
                                           temperature=0, echo=True)
        self.assertEqual(echo.choices[0].text, "The capital of France is" + c.text)
        streamed = "".join(ch.choices[0].text for ch in client().completions.create(
            model=SERVER_MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True)
            if ch.choices)
        self.assertEqual(streamed, c.text)

    def test_embeddings(self):
        texts = ["hello", "The sky is blue because of Rayleigh scattering."]
        r = client().embeddings.create(model=SERVER_MODEL_ID, input=texts)
        self.assertEqual(len(r.data), 2)
        for i, text in enumerate(texts):
            v = r.data[i].embedding
            self.assertAlmostEqual(sum(x * x for x in v), 1.0, places=4)
            cli = json.loads(subprocess.run([EMBER, "embed", "-m", MODEL, "-p", text, "--normalize"],
                                            capture_output=True, text=True, check=True).stdout)
            self.assertEqual(len(cli), len(v))
            self.assertLess(max(abs(a - b) for a, b in zip(cli, v)), 1e-6)
        self.assertGreater(r.usage.prompt_tokens, 0)
        # base64 (what the client asks for by default when numpy is present) decodes to the same floats.
        status, body = post_raw(SERVER, "/v1/embeddings",
                                json.dumps({"input": texts[0], "encoding_format": "base64"}).encode())
        self.assertEqual(status, 200)
        raw = base64.b64decode(body["data"][0]["embedding"])
        floats = struct.unpack("<%df" % (len(raw) // 4), raw)
        self.assertEqual(list(floats), [float(struct.unpack("<f", struct.pack("<f", x))[0])
                                        for x in r.data[0].embedding])

    def test_concurrent_streams_equal_their_solo_runs(self):
        prompts = ["Tell me about cats.", "What is Python?", "Describe the moon.", "Give me a recipe for tea.",
                   "Why is the sky blue?", "Name a famous painter.", "What is rain?", "How do birds fly?"]
        solo = [stream_text(p, max_tokens=32) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            together = list(ex.map(lambda p: stream_text(p, max_tokens=32), prompts))
        self.assertEqual(together, solo)


class Errors(unittest.TestCase):
    def test_bad_json_and_parameters_are_400(self):
        cases = [b"{not json", b"[]", b'{"messages": []}', b'{"messages": [{"role": "user"}]}',
                 b'{"messages": [{"role": "wizard", "content": "x"}]}',
                 b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
                 b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e300}',
                 b'{"messages": [{"role": "user", "content": "x"}], "temperature": 5}',
                 b'{"messages": [{"role": "user", "content": "x"}], "n": 2}',
                 b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"-3": 1}}',
                 b'{"messages": [{"role": "user", "content": "x"}], "stop": [""]}',
                 b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}',
                 b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",'
                 b' "json_schema": {"name": "a", "schema": {"type": "nonsense"}}}}',
                 b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
                 b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
                 b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}"]
        for body in cases:
            status, err = post_raw(SERVER, "/v1/chat/completions", body)
            self.assertEqual(status, 400, body[:80])
            self.assertEqual(err["error"]["type"], "invalid_request_error")
            self.assertTrue(err["error"]["message"])
        with self.assertRaises(openai.BadRequestError):
            chat("x", temperature=3)
        self.assertTrue(SERVER.alive())

    def test_unknown_model_and_route_are_404(self):
        with self.assertRaises(openai.NotFoundError) as e:
            client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        self.assertEqual(e.exception.body["code"], "model_not_found")
        with self.assertRaises(urllib.error.HTTPError) as e2:
            SERVER.get("/v1/nothing")
        self.assertEqual(e2.exception.code, 404)
        self.assertIn("error", json.loads(e2.exception.read()))

    def test_oversized_body_is_413(self):
        status, err = post_raw(SERVER, "/v1/chat/completions", b"{" + b" " * (17 << 20) + b"}")
        self.assertEqual(status, 413)
        self.assertIn("error", err)

    def test_context_overflow_is_400(self):
        status, err = post_raw(SERVER, "/v1/completions",
                               json.dumps({"prompt": [1] * 9000, "max_tokens": 4}).encode())
        self.assertEqual(status, 400)
        self.assertTrue(err["error"]["message"])

    def test_client_leaving_mid_stream_cancels_it(self):
        before = SERVER.metrics()
        host, port = SERVER.url[len("http://"):].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({
            "messages": [{"role": "user", "content": "Tell me a very long story."}], "stream": True,
            "max_tokens": 4000, "ignore_eos": True}), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        resp.read1(256)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            m = SERVER.metrics()
            if m["ember_requests_cancelled_total"] > before["ember_requests_cancelled_total"] and \
                    m["ember_requests_running"] == 0:
                break
            time.sleep(0.2)
        self.assertGreater(m["ember_requests_cancelled_total"], before["ember_requests_cancelled_total"])
        self.assertEqual(m["ember_requests_running"], 0)
        self.assertLess(m["ember_generated_tokens_total"] - before["ember_generated_tokens_total"], 4000)
        self.assertTrue(chat("Hi", max_tokens=4).choices[0].message.content)

    def test_hundred_connections_at_once(self):
        def one(i):
            if i % 2:
                return client().chat.completions.create(
                    model=SERVER_MODEL_ID, messages=[{"role": "user", "content": "Hi %d" % i}], max_tokens=4,
                    temperature=0).choices[0].finish_reason
            return SERVER.get("/health")[0]
        with concurrent.futures.ThreadPoolExecutor(100) as ex:
            results = list(ex.map(one, range(100)))
        self.assertEqual(results.count(200), 50)
        self.assertEqual(len([r for r in results if r in ("length", "stop")]), 50)

    def test_metrics(self):
        m = SERVER.metrics()
        for name in ("ember_requests_succeeded_total", "ember_generated_tokens_total", "ember_prompt_tokens_total",
                     "ember_generated_tokens_per_second", "ember_requests_running", "ember_requests_waiting",
                     "ember_kv_usage_ratio", "ember_kv_blocks_total"):
            self.assertIn(name, m)
        self.assertGreater(m["ember_kv_blocks_total"], 0)

    def test_chat_page_is_served(self):
        status, page = SERVER.get("/")
        self.assertEqual(status, 200)
        self.assertIn("<title>Ember chat</title>", page)
        self.assertNotIn("http://", page.replace("http://www.w3.org", ""))  # nothing from a CDN


class OwnServers(unittest.TestCase):
    """Servers with their own options (an API key, one place, a short timeout)."""

    def test_api_key(self):
        s = EmberServer(EMBER, MODEL, "--api-key", "sekrit")
        try:
            with self.assertRaises(openai.AuthenticationError):
                client(s, api_key="wrong").models.list()
            status, err = post_raw(s, "/v1/completions", b'{"prompt": "x"}')
            self.assertEqual(status, 401)
            self.assertEqual(err["error"]["code"], "invalid_api_key")
            self.assertEqual(len(client(s, api_key="sekrit").models.list().data), 1)
            self.assertEqual(s.get("/health")[0], 200)  # open: load balancers probe it
        finally:
            self.assertEqual(s.stop(), 0)

    def test_saturated_server_answers_503(self):
        s = EmberServer(EMBER, MODEL, "--parallel", "1", "--queue", "0")
        try:
            long = client(s).chat.completions.create(
                model=SERVER_MODEL_ID, messages=[{"role": "user", "content": "Tell a long story."}], stream=True,
                max_tokens=400, extra_body={"ignore_eos": True})
            next(iter(long))
            with self.assertRaises(openai.InternalServerError) as e:
                client(s).chat.completions.create(model=SERVER_MODEL_ID,
                                                  messages=[{"role": "user", "content": "x"}], max_tokens=2)
            self.assertEqual(e.exception.status_code, 503)
            long.close()
            deadline = time.time() + 20
            while s.metrics()["ember_requests_running"] != 0 and time.time() < deadline:
                time.sleep(0.1)
            self.assertTrue(client(s).chat.completions.create(
                model=SERVER_MODEL_ID, messages=[{"role": "user", "content": "x"}], max_tokens=2).choices)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_slow_client_is_dropped_and_others_served(self):
        s = EmberServer(EMBER, MODEL, "--timeout", "2")
        try:
            host, port = s.url[len("http://"):].split(":")
            slow = socket.create_connection((host, int(port)))
            slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            t0 = time.time()
            ok = client(s).completions.create(model=SERVER_MODEL_ID, prompt="Hello", max_tokens=2)
            self.assertTrue(ok.choices)
            slow.settimeout(10)
            data = slow.recv(65536)  # the server gives up on it: an error response or a close
            self.assertLess(time.time() - t0, 10)
            self.assertTrue(data == b"" or data.startswith(b"HTTP/1.1 4"), data[:100])
            slow.close()
        finally:
            self.assertEqual(s.stop(), 0)

    def test_sigterm_mid_stream_shuts_down_cleanly(self):
        s = EmberServer(EMBER, MODEL)
        stream = client(s).chat.completions.create(
            model=SERVER_MODEL_ID, messages=[{"role": "user", "content": "Tell a long story."}], stream=True,
            max_tokens=2000, extra_body={"ignore_eos": True})
        next(iter(stream))
        t0 = time.time()
        self.assertEqual(s.stop(), 0)
        self.assertLess(time.time() - t0, 10)


def main():
    global EMBER, MODEL, SERVER, SERVER_MODEL_ID
    EMBER = sys.argv[1]
    MODEL = sys.argv[2] if len(sys.argv) > 2 else default_model()
    if not os.path.exists(MODEL):
        print("model not found: %s (bash tools/fetch_model.sh)" % MODEL)
        sys.exit(77)
    SERVER = EmberServer(EMBER, MODEL, "--parallel", "16", "--queue", "128")
    SERVER_MODEL_ID = os.path.basename(MODEL)[:-len(".gguf")]
    try:
        prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
        ok = prog.result.wasSuccessful()
    finally:
        status = SERVER.stop()
    if status != 0:
        print("ember serve exited with %d:\n%s" % (status, "".join(SERVER.log)))
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
