"""A real server on 127.0.0.1 (an ephemeral port) over a real engine running a tiny model, per test module.

`serve(model_path, **config)` starts one; the module fixtures below keep one per model so the SDK tests share
it. Servers are stopped (and their threads joined) when the module ends.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from macapp.server.config import ServerConfig


@dataclass
class Served:
    url: str
    server: Any  # macapp.server.local_server.LocalServer
    backend: Any  # macapp.core.serving.runner.ServingEngine
    engine: Any

    @property
    def activity(self):
        return self.server.activity

    def openai(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "none"), max_retries=0, timeout=60, **kw)

    def anthropic(self, **kw):
        import anthropic

        return anthropic.Anthropic(base_url=self.url, api_key=kw.pop("api_key", "none"), max_retries=0, timeout=60, **kw)


@contextlib.contextmanager
def serve(model_path: Path, context: int | None = None, parallel: int | None = None, batching: bool | None = None, **config: Any) -> Iterator[Served]:
    from macapp.core.engine import Engine
    from macapp.server.engine_backend import serving_backend
    from macapp.server.local_server import LocalServer

    engine = Engine()
    engine.load(str(model_path)).result(timeout=120)
    settings = ServerConfig(port=0, **config)
    backend = serving_backend(engine, context=context, queue_limit=settings.queue_limit, parallel=parallel, batching=batching)
    server = LocalServer(backend, settings)
    url = server.start()
    try:
        yield Served(url, server, backend, engine)
    finally:
        server.stop()
        backend.close()
        engine.close()


@pytest.fixture(scope="module")
def tiny_server(tiny_dense_path) -> Iterator[Served]:
    """The tiny model: thinking on -> SCRIPT_REASONING then SCRIPT_ANSWER (greedy); off -> SCRIPT_ANSWER."""
    with serve(tiny_dense_path) as served:
        yield served


@pytest.fixture(scope="module")
def tool_server(scripted_tool_model_path) -> Iterator[Served]:
    """Greedy reply: 'I will check.' then get_weather(city='Paris', days=3)."""
    with serve(scripted_tool_model_path, default_thinking=False) as served:
        yield served


GREEDY = {"temperature": 0, "top_p": 1.0}


def no_eos_bias(served: Served) -> dict[str, float]:
    """OpenAI logit_bias banning every end-of-sequence token: the reply runs to max_tokens or the context."""
    ids = set(served.engine.model.tokenizer.eos_token_ids) | {served.engine.model.im_end_id}
    return {str(i): -100 for i in ids}
