"""The Python classes over the SWIG module ember.emberc (generated from
bindings/ember.i). Every native call goes through emberc; this file only
shapes the surface."""

import contextlib
import json
import math
import os
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Iterator, List, Optional, Sequence, Union

from . import emberc as _c
from .emberc import InvalidArgumentError

__all__ = ["Model", "Engine", "Session", "Stream", "Lora", "ModelInfo", "LoraInfo", "StreamStats", "EndReason",
           "ToolCall", "TokenLogprob", "MAX_EMBED_INPUTS", "version", "version_number", "capabilities"]


def version() -> str:
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return _c.ember_version()


def version_number() -> int:
    """MAJOR * 10000 + MINOR * 100 + PATCH."""
    return _c.ember_version_number()


def capabilities() -> dict:
    """What the library can use here: {"cpu_isa": "avx2", "cuda_plugin": "absent"|"loadable"|"broken",
    "cuda_plugin_message": "..."}."""
    states = {0: "absent", 1: "loadable", 2: "broken"}
    return {
        "cpu_isa": _c.eb_cpu_isa_name(),
        "cuda_plugin": states.get(_c.eb_cuda_plugin(), "unknown"),
        "cuda_plugin_message": _c.eb_cuda_plugin_message(),
    }


class _Handle:
    """One native handle. Calls use it between __enter__ and __exit__; close()
    releases it exactly once, after the calls in flight (so closing from another
    thread never frees a handle a call is using)."""

    __slots__ = ("_h", "_release", "_lock", "_busy", "_closed", "_what")

    def __init__(self, handle, release, what):
        self._h = handle
        self._release = release
        self._lock = threading.Lock()
        self._busy = 0
        self._closed = False
        self._what = what

    def __enter__(self):
        with self._lock:
            if self._closed:
                raise InvalidArgumentError(f"the {self._what} is closed", 1)
            self._busy += 1
            return self._h

    def __exit__(self, *exc):
        handle = None
        with self._lock:
            self._busy -= 1
            if self._closed and self._busy == 0:
                handle, self._h = self._h, None
        if handle is not None:
            self._release(handle)
        return False

    @property
    def closed(self):
        return self._closed

    def close(self, release=None):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if release is not None:
                self._release = release
            if self._busy:
                return  # the last call in flight releases it
            handle, self._h = self._h, None
        if handle is not None:
            self._release(handle)


class _Closeable:
    _g: _Handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self) -> bool:
        return self._g.closed

    def close(self) -> None:
        self._g.close()

    def __del__(self):
        g = getattr(self, "_g", None)
        if g is not None:
            try:
                g.close()
            except Exception:  # interpreter shutdown
                pass


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    name: str
    n_params: int
    context_length: int
    vocab_size: int
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    bos_token: int
    eos_token: int


def _tokens_in(ids: Iterable[int]) -> "_c.eb_tokens":
    ids = list(ids)
    t = _c.eb_tokens(len(ids))
    for i, v in enumerate(ids):
        t.set(i, int(v))
    return t


def _tokens_out(t) -> List[int]:
    return [t.get(i) for i in range(t.size())]


class Model(_Closeable):
    """A GGUF model (weights, tokenizer, chat template). Immutable; share it freely."""

    def __init__(self, path: Union[str, os.PathLike]):
        self._g = _Handle(_c.eb_model_load(os.fspath(path)), _c.ember_model_destroy, "Model")
        self.path = os.fspath(path)
        self._info = None

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            raw = _c.eb_model_info()
            with self._g as h:
                _c.eb_model_info_get(h, raw)
                self._info = ModelInfo(raw.architecture, raw.name, raw.n_params, raw.context_length,
                                       raw.vocab_size, raw.n_layers, raw.n_embd, raw.n_heads, raw.n_kv_heads,
                                       raw.bos_token, raw.eos_token)
        return self._info

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> List[int]:
        with self._g as h:
            return _tokens_out(_c.eb_tokenize(h, text, int(add_special), int(parse_special)))

    def detokenize(self, ids: Iterable[int]) -> str:
        with self._g as h:
            return _c.eb_detokenize(h, _tokens_in(ids))

    def __repr__(self):
        return f"ember.Model({self.path!r}{', closed' if self.closed else ''})"


@dataclass(frozen=True)
class LoraInfo:
    n_matrices: int  # matrices adapted
    max_rank: int  # largest rank of its pairs
    alpha: float  # adapter.lora.alpha (0: none; each term is then scaled by its scale alone)
    bytes: int  # the adapter's tensors


class Lora(_Closeable):
    """A LoRA adapter (C ABI 1.6) in llama.cpp's GGUF format, loaded for `model` (made for its
    architecture and shapes; the file is read once). Use it with Session.set_loras; immutable, share it
    across sessions and engines of the model. Sessions using it keep it alive, so close() is safe at any
    time. Raises NotFoundError, BadFormatError (not an adapter, corrupt), InvalidArgumentError (an
    adapter for another model), UnsupportedError."""

    def __init__(self, model: Model, path: Union[str, os.PathLike]):
        if not isinstance(model, Model):
            raise InvalidArgumentError("model must be an ember.Model", 1)
        with model._g as m:
            h = _c.eb_lora_load(m, os.fspath(path))
        self._g = _Handle(h, _c.ember_lora_destroy, "Lora")
        self.model = model
        self.path = os.fspath(path)
        self._info = None

    @property
    def info(self) -> LoraInfo:
        if self._info is None:
            raw = _c.eb_lora_info()
            with self._g as h:
                _c.eb_lora_info_get(h, raw)
            self._info = LoraInfo(raw.n_matrices, raw.max_rank, raw.alpha, raw.bytes)
        return self._info

    def __repr__(self):
        return f"ember.Lora({self.path!r}{', closed' if self.closed else ''})"


_DEVICES = {"cpu": _c.DEVICE_CPU, "cuda": _c.DEVICE_CUDA, "auto": _c.DEVICE_AUTO}
_KV_TYPES = {"f16": _c.KV_F16, "q8_0": _c.KV_Q8_0}
_POLICIES = {"full": _c.CACHE_FULL, "window": _c.CACHE_WINDOW, "sink": _c.CACHE_SINK}
_DRAFTERS = {"none": _c.SPEC_NONE, "ngram": _c.SPEC_NGRAM, "self": _c.SPEC_SELF, "draft": _c.SPEC_DRAFT}
_POOLINGS = {"mean": _c.POOLING_MEAN, "last": _c.POOLING_LAST, "cls": _c.POOLING_CLS}

#: The most inputs one Engine.embed / embed_tokens call takes (EMBER_MAX_EMBED_INPUTS).
MAX_EMBED_INPUTS = _c.MAX_EMBED_INPUTS


def _pooling(pooling) -> int:
    if not isinstance(pooling, str) or pooling not in _POOLINGS:
        raise InvalidArgumentError(f"unknown pooling {pooling!r} (mean, last or cls)", 1)
    return _POOLINGS[pooling]


def _input_list(inputs, what: str) -> list:
    """inputs as a list (a sequence or other iterable); the library refuses an empty one."""
    if isinstance(inputs, (bytes, bytearray, dict)):
        raise InvalidArgumentError(f"{what} must be a list, not {type(inputs).__name__}", 1)
    try:
        inputs = list(inputs)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be a list, not {type(inputs).__name__}", 1) from None
    if len(inputs) > MAX_EMBED_INPUTS:
        raise InvalidArgumentError(f"{len(inputs)} {what} (at most {MAX_EMBED_INPUTS} per call)", 1)
    return inputs


class Engine(_Closeable):
    """A model bound to a device, with its KV pool and scheduler. Thread-safe.

    device: "cpu" (default), "cuda" or "auto". n_threads: CPU threads, 0 = all cores. manual_step: the
    host runs steps with step(). kv_memory_bytes: the KV pool budget, 0 = 512 MiB. kv_type: the KV
    cache's element type (EMBER_KV_*): "f16" (default) or "q8_0", which halves the KV memory per token
    (the same budget holds ~1.9x the tokens; greedy output can differ from f16's). q8_0 is
    CPU-only and needs the model's head_dim to be a multiple of 32 (UnsupportedError otherwise); a
    session saved from a q8_0 engine loads only into a q8_0 engine. Raises InvalidArgumentError
    (a ValueError) for an unknown device or kv_type."""

    def __init__(self, model: Model, device: str = "cpu", n_threads: int = 0, manual_step: bool = False,
                 kv_memory_bytes: int = 0, kv_type: str = "f16"):
        if device not in _DEVICES:
            raise InvalidArgumentError(f"unknown device {device!r} (cpu, cuda or auto)", 1)
        if not isinstance(kv_type, str) or kv_type not in _KV_TYPES:
            raise InvalidArgumentError(f"unknown kv_type {kv_type!r} (f16 or q8_0)", 1)
        n_embd = model.info.n_embd  # for embed (read now: the model may be closed later, the engine keeps it)
        with model._g as m:
            h = _c.eb_engine_create(m, _DEVICES[device], int(n_threads), int(bool(manual_step)),
                                    int(kv_memory_bytes), _KV_TYPES[kv_type])
        self._g = _Handle(h, _c.ember_engine_destroy, "Engine")
        self.model = model
        self.manual_step = bool(manual_step)
        self._n_embd = n_embd

    @property
    def device(self) -> str:
        """Where it runs: "cpu" or "cuda" (an "auto" engine says what it chose)."""
        with self._g as h:
            return "cuda" if _c.eb_engine_device(h) == _c.DEVICE_CUDA else "cpu"

    @property
    def gpu_index(self) -> int:
        """The GPU's index for a CUDA engine, -1 on the CPU."""
        with self._g as h:
            return _c.eb_engine_gpu_index(h)

    @property
    def backend_name(self) -> str:
        with self._g as h:
            return _c.eb_engine_backend_name(h)

    def session(self, system_prompt: Optional[str] = None, cache: str = "full", sink_tokens: int = 4,
                window_tokens: int = 0, n_ctx: int = 0) -> "Session":
        """A new conversation. cache: "full" (every token kept), "window" or "sink" (StreamingLLM:
        sink_tokens first tokens + window_tokens recent ones; never runs out of context)."""
        if cache not in _POLICIES:
            raise InvalidArgumentError(f"unknown cache policy {cache!r} (full, window or sink)", 1)
        with self._g as h:
            s = _c.eb_session_create(h, system_prompt or "", _POLICIES[cache], int(sink_tokens),
                                     int(window_tokens), int(n_ctx))
        return Session(self, s)

    def load_session(self, path: Union[str, os.PathLike]) -> "Session":
        """Restores a session saved with Session.save (same model)."""
        with self._g as h:
            s = _c.eb_session_load(h, os.fspath(path))
        return Session(self, s)

    def step(self, max_ms: int = 16, max_tokens: int = 0) -> int:
        """Manual mode only: runs engine steps for about max_ms milliseconds; returns the tokens processed."""
        with self._g as h:
            return _c.eb_engine_step(h, int(max_ms), int(max_tokens))

    def embed(self, texts: Union[str, Iterable[str]], pooling: str = "mean", normalize: bool = False,
              parse_special: bool = False) -> Union[List[float], List[List[float]]]:
        """Embeddings (C ABI 1.5, ember_engine_embed): for a str one vector of model.info.n_embd floats,
        for a list of str one vector per text, in order. Each vector is the model's hidden state after
        its final norm, pooled over the text's tokens: pooling "mean" (default), "last" or "cls" (the
        first token); normalize=True scales it to L2 length 1. Texts are tokenized with the model's
        BOS/EOS (as llama.cpp embeds), special-token text parsed only with parse_special=True. The
        inputs run through the engine's scheduler beside its streams; the call blocks until all are
        done (a manual-step engine runs its steps itself). Raises InvalidArgumentError for no texts,
        more than MAX_EMBED_INPUTS, an empty text, an unknown pooling; ContextFullError for a text
        longer than the model's context."""
        kind = _pooling(pooling)
        single = isinstance(texts, str)
        items = [texts] if single else _input_list(texts, "texts")
        inputs = _c.eb_embed_inputs()
        for t in items:
            if not isinstance(t, str):
                raise InvalidArgumentError(f"texts must be str, not {type(t).__name__}", 1)
            if "\0" in t:
                raise InvalidArgumentError("text contains a NUL character", 1)
            inputs.add_text(t)
        vectors = self._embed(inputs, kind, normalize, parse_special)
        return vectors[0] if single else vectors

    def embed_tokens(self, inputs: Iterable[Iterable[int]], pooling: str = "mean",
                     normalize: bool = False) -> Union[List[float], List[List[float]]]:
        """As embed, for inputs given as token ids (ember_engine_embed_tokens; nothing is added, so
        model.tokenize(text, add_special=True) gives the same vector as embed(text)): a list of token
        lists gives one vector per list; a flat list of ints is one input and gives one vector.
        Raises InvalidArgumentError as embed does, and for an id outside the vocabulary."""
        kind = _pooling(pooling)
        items = _input_list(inputs, "inputs")
        single = bool(items) and all(isinstance(v, int) for v in items)
        if single:
            items = [items]
        native = _c.eb_embed_inputs()
        for ids in items:
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                raise InvalidArgumentError(f"each input must be a list of token ids, not {type(ids).__name__}", 1)
            ids = list(ids)
            if not all(isinstance(v, int) for v in ids):
                raise InvalidArgumentError("token ids must be int", 1)
            native.add_tokens(_tokens_in(ids))
        vectors = self._embed(native, kind, normalize, False)
        return vectors[0] if single else vectors

    def _embed(self, inputs, kind, normalize, parse_special) -> List[List[float]]:
        d = self._n_embd
        with self._g as h:
            f = _c.eb_engine_embed(h, inputs, d, kind, int(bool(normalize)), int(bool(parse_special)))
        flat = [f.get(i) for i in range(f.size())]
        return [flat[i:i + d] for i in range(0, len(flat), d)]


class EndReason(str, Enum):
    NONE = "none"
    EOS = "eos"
    STOP_STRING = "stop_string"
    MAX_TOKENS = "max_tokens"
    CANCELLED = "cancelled"
    CONTEXT_FULL = "context_full"


_END_REASONS = {_c.END_NONE: EndReason.NONE, _c.END_EOS: EndReason.EOS, _c.END_STOP_STRING: EndReason.STOP_STRING,
                _c.END_MAX_TOKENS: EndReason.MAX_TOKENS, _c.END_CANCELLED: EndReason.CANCELLED,
                _c.END_CONTEXT_FULL: EndReason.CONTEXT_FULL}


@dataclass(frozen=True)
class StreamStats:
    prompt_tokens: int
    generated_tokens: int
    time_to_first_token_ms: float
    tokens_per_second: float
    prefill_tokens_per_second: float
    finished: bool
    end_reason: EndReason
    # Speculative decoding (0 without it).
    drafted_tokens: int = 0  # tokens the drafter proposed
    accepted_tokens: int = 0  # drafted tokens the model accepted
    verify_passes: int = 0  # model passes that verified a tree
    mean_accepted_length: float = 0.0  # accepted_tokens / verify_passes


@dataclass(frozen=True)
class ToolCall:
    """A call the model made to one of the session's tools (Session.set_tools)."""
    id: str  # "call_<n>", unique in the session
    name: str
    arguments: str  # JSON text that validates against the tool's parameters

    @property
    def args(self) -> dict:
        return json.loads(self.arguments)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability in the row it was chosen from (after logit bias and
    constraints, before penalties and temperature), and the row's most likely tokens."""
    token: int
    logprob: float
    top: List[tuple]  # (token, logprob) pairs, most likely first


_TOOL_CHOICES = {"auto": _c.TOOL_CHOICE_AUTO, "none": _c.TOOL_CHOICE_NONE, "required": _c.TOOL_CHOICE_REQUIRED}


_FLT_MAX = 3.4028234663852886e38


class Session(_Closeable):
    """One conversation. One stream at a time; use a session from one thread at a time."""

    def __init__(self, engine: Engine, handle):
        self._g = _Handle(handle, _c.ember_session_destroy, "Session")
        self.engine = engine

    def add_message(self, role: str, content: str) -> None:
        with self._g as h:
            _c.eb_session_add_message(h, role, content)

    def set_tools(self, tools: Union[None, str, Sequence[dict]]) -> None:
        """The tools the model may call from the next stream on: an OpenAI tool list (a list of
        {"type": "function", "function": {"name", "description", "parameters"}} dicts, or its JSON
        text); None or [] = none. Calls come out as Stream.tool_calls; send a result back with
        add_message("tool", result)."""
        text = "" if tools is None else (tools if isinstance(tools, str) else json.dumps(list(tools)))
        with self._g as h:
            _c.eb_session_set_tools(h, text if text != "[]" else "")

    def set_loras(self, loras: Union[None, Lora, Iterable[Union[Lora, tuple]]]) -> None:
        """The LoRA adapters the next turns decode with, in order (C ABI 1.6): a list of Lora or
        (Lora, scale) pairs (scale 1.0 when not given; 0 is the base model); None or [] = none. Each
        adds scale * alpha / rank * B A x to its matrices' rows, as llama.cpp does. Changing the set
        between turns recomputes the history under the new one. The session keeps the adapters alive
        (closing a Lora afterwards is safe). Raises InvalidArgumentError (more than 16 adapters, a
        scale that is not finite or beyond +-1000, an adapter of another model, a closed Lora), BusyError
        (a stream runs)."""
        if loras is None:
            items = []
        elif isinstance(loras, Lora):
            items = [loras]
        else:
            try:
                items = list(loras)
            except TypeError:
                raise InvalidArgumentError(f"loras must be a list of Lora or (Lora, scale), not "
                                           f"{type(loras).__name__}", 1) from None
        pairs = []
        for item in items:
            if isinstance(item, Lora):
                lora, scale = item, 1.0
            elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Lora):
                lora, scale = item
            else:
                raise InvalidArgumentError(f"loras must be Lora or (Lora, scale), not {item!r}", 1)
            try:
                scale = float(scale)
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"a LoRA scale must be a number, not {scale!r}", 1) from None
            if math.isfinite(scale) and abs(scale) > _FLT_MAX:  # the library refuses it, as inf
                scale = math.copysign(math.inf, scale)
            pairs.append((lora, scale))
        native = _c.eb_lora_set()
        # Every adapter stays open across the call; the session then keeps them alive itself.
        with contextlib.ExitStack() as held:
            for lora, scale in pairs:
                native.add(held.enter_context(lora._g), scale)
            with self._g as h:
                _c.eb_session_set_loras(h, native)

    def add_text(self, text: str, parse_special: bool = False) -> None:
        with self._g as h:
            _c.eb_session_add_text(h, text, int(parse_special))

    def add_tokens(self, ids: Iterable[int]) -> None:
        with self._g as h:
            _c.eb_session_add_tokens(h, _tokens_in(ids))

    def reset(self) -> None:
        with self._g as h:
            _c.eb_session_reset(h)

    @property
    def token_count(self) -> int:
        with self._g as h:
            return _c.eb_session_token_count(h)

    def __len__(self):
        return self.token_count

    def score(self, tokens: Sequence[int]) -> List[float]:
        """Appends tokens and returns log p(token | everything before it) for each (NaN for the very first)."""
        with self._g as h:
            f = _c.eb_session_score(h, _tokens_in(tokens))
            return [f.get(i) for i in range(f.size())]

    def save(self, path: Union[str, os.PathLike]) -> None:
        with self._g as h:
            _c.eb_session_save(h, os.fspath(path))

    def generate(self, max_tokens: int = 256, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, seed: Optional[int] = None, stop: Union[None, str, Sequence[str]] = None,
                 repeat_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 ignore_eos: bool = False, spec_drafter: Optional[str] = None, spec_self_layers: int = 0,
                 spec_draft_model: Optional[Model] = None, spec_threshold: float = 0.3, spec_max_nodes: int = 12,
                 spec_max_depth: int = 8, spec_alpha: float = 0.25, penalty_last_n: int = 64,
                 spec_lookup: bool = True, json_schema: Union[None, str, dict] = None,
                 grammar: Optional[str] = None, regex: Optional[str] = None,
                 choices: Optional[Sequence[str]] = None, json_object: bool = False,
                 tool_choice: Union[None, str, dict] = None, parallel_tool_calls: bool = True,
                 logit_bias: Optional[dict] = None, logprobs: bool = False, top_logprobs: int = 0) -> "Stream":
        """Starts generating from everything added so far; iterate the Stream for text pieces.

        Penalties look at the last penalty_last_n tokens (prompt included; -1 = all, 0 = off):
        presence_penalty (default 0) is subtracted from the logit of every token seen there,
        frequency_penalty (default 0) once per time it was seen, both -100..100.

        Speculative decoding (same output, greedy or sampled; see docs/API.md): spec_drafter "ngram"
        (prompt lookup), "self" (the model's first spec_self_layers layers; 0 = 7/8 of them) or "draft"
        (spec_draft_model, a Model with the same vocabulary; giving one alone selects "draft"; the
        stream keeps it loaded). spec_threshold, spec_max_nodes (1..64), spec_max_depth (1..64) and
        spec_alpha shape the token tree; spec_lookup (default True) keeps prompt lookup beside the
        "self" and "draft" models (False: the model alone); Stream.stats reports drafted and accepted
        tokens.

        Structured output (at most one; see docs/API.md): json_schema (a dict or JSON text) makes the
        reply JSON that validates against it, grammar a GBNF grammar (llama.cpp's notation, rule
        "root"), regex a regular expression the whole reply matches, choices a list the reply is
        exactly one of, json_object=True any JSON object. A constraint the engine cannot take raises
        InvalidArgumentError when the stream starts.

        Tool calling (a session with set_tools): tool_choice "auto" (default), "none", "required", a
        tool's name, or OpenAI's {"type": "function", "function": {"name": ...}}; with
        parallel_tool_calls=False a reply makes at most one call. Each call is held to its tool's
        schema and comes out in Stream.tool_calls, not in the text.

        Logits: logit_bias maps token ids to a bias added to their logits (float("-inf") bans a
        token); logprobs=True records each generated token's log-probability (Stream.logprobs), with
        top_logprobs (0..20) most likely alternatives."""
        if spec_drafter is None:
            spec_drafter = "none" if spec_draft_model is None else "draft"
        if not isinstance(spec_drafter, str) or spec_drafter not in _DRAFTERS:
            raise InvalidArgumentError(f"unknown spec_drafter {spec_drafter!r} (none, ngram, self or draft)", 1)
        if spec_draft_model is not None and spec_drafter != "draft":
            raise InvalidArgumentError(f"spec_draft_model needs spec_drafter 'draft', not {spec_drafter!r}", 1)
        if spec_draft_model is not None and not isinstance(spec_draft_model, Model):
            raise InvalidArgumentError("spec_draft_model must be an ember.Model", 1)
        s = _c.eb_sampling()
        s.max_tokens = int(max_tokens)
        s.temperature = float(temperature)
        s.top_k = int(top_k)
        s.top_p = float(top_p)
        s.min_p = float(min_p)
        s.repeat_penalty = float(repeat_penalty)
        s.presence_penalty = float(presence_penalty)
        s.frequency_penalty = float(frequency_penalty)
        s.penalty_last_n = int(penalty_last_n)
        s.ignore_eos = int(bool(ignore_eos))
        if seed is not None:  # any 64-bit value; the library's default otherwise
            v = int(seed) & 0xFFFFFFFFFFFFFFFF
            s.seed = v - (1 << 64) if v >= 1 << 63 else v
        for piece in ([stop] if isinstance(stop, str) else (stop or [])):
            s.add_stop(piece)
        s.spec_drafter = _DRAFTERS[spec_drafter]
        s.spec_self_layers = int(spec_self_layers)
        s.spec_threshold = float(spec_threshold)
        s.spec_max_nodes = int(spec_max_nodes)
        s.spec_max_depth = int(spec_max_depth)
        s.spec_alpha = float(spec_alpha)
        s.spec_lookup = int(bool(spec_lookup))
        given = [k for k, v in (("json_schema", json_schema), ("grammar", grammar), ("regex", regex),
                                ("choices", choices)) if v is not None] + (["json_object"] if json_object else [])
        if len(given) > 1:
            raise InvalidArgumentError(f"at most one constraint, not {', '.join(given)}", 1)
        if json_schema is not None:
            s.set_json_schema(json_schema if isinstance(json_schema, str) else json.dumps(json_schema))
        if grammar is not None:
            s.set_grammar(str(grammar))
        if regex is not None:
            s.set_regex(str(regex))
        if choices is not None:
            if isinstance(choices, str):
                raise InvalidArgumentError("choices must be a list of strings", 1)
            for c in choices:
                s.add_choice(str(c))
            if not list(choices):
                raise InvalidArgumentError("choices must not be empty", 1)
        s.json_object = int(bool(json_object))
        if isinstance(tool_choice, dict):
            fn = tool_choice.get("function") if tool_choice.get("type") == "function" else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise InvalidArgumentError("tool_choice dict must be {'type': 'function', 'function': {'name': ...}}", 1)
            tool_choice = fn["name"]
        if tool_choice is not None:
            if not isinstance(tool_choice, str):
                raise InvalidArgumentError("tool_choice must be 'auto', 'none', 'required' or a tool's name", 1)
            if tool_choice in _TOOL_CHOICES:
                s.tool_choice = _TOOL_CHOICES[tool_choice]
            else:
                s.tool_choice = _c.TOOL_CHOICE_FUNCTION
                s.set_tool_name(tool_choice)
        s.parallel_tool_calls = int(bool(parallel_tool_calls))
        for token, bias in (logit_bias or {}).items():
            s.add_logit_bias(int(token), float(bias))
        s.logprobs = int(bool(logprobs))
        s.top_logprobs = int(top_logprobs)
        if spec_draft_model is None:
            with self._g as h:
                st = _c.eb_stream_start(h, s)
        else:
            # The draft model stays open across the start; the stream then keeps it loaded.
            with spec_draft_model._g as d, self._g as h:
                s.spec_draft_model = d
                st = _c.eb_stream_start(h, s)
        return Stream(self, st, spec_draft_model)

    def chat(self, content: str, **sampling) -> str:
        """Adds a user message and returns the whole reply."""
        self.add_message("user", content)
        with self.generate(**sampling) as stream:
            return stream.read()


class Stream(_Closeable):
    """One generation: iterate it for str pieces. .text is everything so far, .end_reason
    and .stats say how it ended. cancel() may be called from any thread."""

    def __init__(self, session: Session, handle, draft_model: Optional[Model] = None):
        self._g = _Handle(handle, _c.ember_stream_destroy, "Stream")
        self.session = session
        self.draft_model = draft_model  # the speculative draft model, held as long as the stream
        self._event = _c.eb_event()
        self._pieces: List[str] = []
        self._calls: List[ToolCall] = []
        self._logprobs: List[TokenLogprob] = []
        self._tokens: List[int] = []
        self._end: Optional[EndReason] = None
        self._lock = threading.Lock()  # one reader at a time

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        piece = self.next_piece()
        if piece is None:
            raise StopIteration
        return piece

    def next_piece(self, timeout_ms: int = -1) -> Optional[str]:
        """The next text piece; None at the end. With timeout_ms >= 0 raises ember.TimeoutError when
        nothing came in time."""
        with self._lock:
            while True:
                if self._end is not None:
                    return None
                with self._g as h:
                    got = _c.eb_stream_next(h, self._event, int(timeout_ms))
                if got == 0:
                    raise _c.TimeoutError("no event within the timeout", 9)
                if got < 0:  # already ended (e.g. drained elsewhere)
                    self._end = self._end or EndReason.NONE
                    return None
                ev = self._event
                if ev.kind == _c.EVENT_END:
                    self._end = _END_REASONS.get(ev.end_reason, EndReason.NONE)
                    return None
                text = ev.text()
                n = ev.n_tokens()
                self._tokens.extend(ev.token(i) for i in range(n))
                if ev.has_logprobs():
                    k = ev.n_top()
                    self._logprobs.extend(
                        TokenLogprob(ev.token(i), ev.logprob(i), [(ev.top_token(i, j), ev.top_logprob(i, j))
                                                                 for j in range(k)]) for i in range(n))
                if ev.kind == _c.EVENT_TOOL_CALL:
                    self._calls.append(ToolCall(ev.tool_call_id(), ev.tool_name(), ev.tool_arguments()))
                    continue
                if text:
                    self._pieces.append(text)
                    return text

    def read(self) -> str:
        """Waits for the end and returns the whole text."""
        for _ in self:
            pass
        return self.text

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    @property
    def logprobs(self) -> List[TokenLogprob]:
        """With generate(logprobs=True): one entry per generated token read so far."""
        return list(self._logprobs)

    @property
    def tool_calls(self) -> List[ToolCall]:
        """The tool calls read so far (all of them once the stream is read to its end)."""
        return list(self._calls)

    @property
    def tokens(self) -> List[int]:
        """The token ids generated so far (read so far)."""
        return list(self._tokens)

    @property
    def end_reason(self) -> Optional[EndReason]:
        """None while it runs (or until the end was read)."""
        return self._end

    @property
    def finished(self) -> bool:
        return self._end is not None

    def cancel(self) -> None:
        """Requests the end (EndReason.CANCELLED soon after). Any thread; no-op after close."""
        try:
            with self._g as h:
                _c.eb_stream_cancel(h)
        except InvalidArgumentError:
            if not self._g.closed:
                raise

    def wait(self) -> None:
        """Blocks until the stream has ended (unread pieces stay readable)."""
        with self._g as h:
            _c.eb_stream_wait(h)

    @property
    def stats(self) -> StreamStats:
        raw = _c.eb_stats()
        with self._g as h:
            _c.eb_stream_stats_get(h, raw)
        return StreamStats(raw.prompt_tokens, raw.generated_tokens, raw.time_to_first_token_ms,
                           raw.tokens_per_second, raw.prefill_tokens_per_second, bool(raw.finished),
                           _END_REASONS.get(raw.end_reason, EndReason.NONE), raw.drafted_tokens,
                           raw.accepted_tokens, raw.verify_passes, raw.mean_accepted_length)

    def close(self) -> None:
        """Cancels if still running, waits for it to stop and releases it."""
        try:
            self.cancel()
        except Exception:
            pass
        self._g.close()

    def __del__(self):
        # The garbage collector must never wait for (or run) engine steps.
        g = getattr(self, "_g", None)
        if g is not None:
            try:
                g.close(_c.ember_stream_release)
            except Exception:
                pass
