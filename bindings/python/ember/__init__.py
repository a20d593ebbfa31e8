"""Ember: embeddable LLM inference, from Python.

    import ember
    with ember.Model("SmolLM2-135M-Instruct.Q4_1.gguf") as model, ember.Engine(model) as engine:
        session = engine.session(system_prompt="You are brief.")
        session.add_message("user", "Hello!")
        for piece in session.generate(max_tokens=64):
            print(piece, end="", flush=True)

Every handle (Model, Engine, Session, Stream, Lora) is a context manager and
has close(); closing in any order is safe (an engine keeps its model alive, a
session its engine and its LoRA adapters, a stream its session). A closed handle raises
InvalidArgumentError. Failures raise ember.EmberError subclasses carrying the
library's message and status. Calls into the library release the GIL.
"""

from ._api import (  # noqa: F401
    MAX_EMBED_INPUTS,
    Engine,
    EndReason,
    Lora,
    LoraInfo,
    Model,
    ModelInfo,
    Session,
    Stream,
    StreamStats,
    TokenLogprob,
    ToolCall,
    capabilities,
    version,
    version_number,
)
from .emberc import (  # noqa: F401
    BadFormatError,
    BusyError,
    CancelledError,
    ContextFullError,
    EmberError,
    EndOfStreamError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfMemoryError,
    TimeoutError,
    UnsupportedError,
)

__version__ = version()
