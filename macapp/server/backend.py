"""What the HTTP front ends need from the core, and the steps every completion takes before it streams.

`Backend` is what the routes use of the runner (macapp.core.serving.runner.ServingEngine). The steps:
count the prompt and refuse one over the context before any work (clamping max_tokens to the room left),
submit (a full queue is a 429 with Retry-After), and wait a moment for a quick refusal from the engine so it
can still go out as a JSON error instead of inside a stream that has already said 200.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool

from macapp.core import events as ev
from macapp.core.events import Failed
from macapp.core.engine import EngineError
from macapp.core.serving.requests import INVALID_REQUEST, CompletionRequest
from macapp.core.serving.runner import QueueFull
from macapp.server.errors import ApiError, ErrorKind, invalid
from macapp.server.sse import KEEPALIVE, JobFeed


class Backend(Protocol):
    @property
    def model_name(self) -> str: ...

    @property
    def context_limit(self) -> int: ...

    def count_tokens(self, request: CompletionRequest) -> int:
        """The prompt's length in tokens as the model's chat template renders it (any thread)."""

    def submit(self, request: CompletionRequest) -> Any:
        """Start it on the engine: a Job (see macapp.core.serving.requests); QueueFull beyond the queue limit."""

    def close(self) -> None:
        """The server is done with it (frees what it holds, e.g. the prompt checkpoints)."""


_INPUT_CODES = (ev.CONTEXT_LIMIT, ev.MEMORY_BUDGET, ev.EMPTY_PROMPT, INVALID_REQUEST)


def engine_refusal(code: str, message: str) -> ApiError:
    """The HTTP error for an engine failure code (events.py, requests.INVALID_REQUEST)."""
    if code in _INPUT_CODES:
        return invalid(message, param="messages", code="context_length_exceeded" if code == ev.CONTEXT_LIMIT else code)
    if code == ev.NO_MODEL:
        return ApiError(ErrorKind.OVERLOADED, message, code=code)
    return ApiError(ErrorKind.SERVER, message, code=code)


def refusal(failed: Failed) -> ApiError:
    return engine_refusal(failed.code, failed.message)


def count_tokens(backend: Backend, request: CompletionRequest) -> int:
    """The prompt's length (any thread); a request the template refuses is a 400."""
    try:
        return backend.count_tokens(request)
    except EngineError as exc:
        raise engine_refusal(exc.code, exc.message) from exc


async def fit_to_context(backend: Backend, request: CompletionRequest) -> tuple[CompletionRequest, int]:
    """The request with max_tokens clamped to the room the prompt leaves, and the prompt's length; 400 if none."""
    prompt_tokens = await run_in_threadpool(count_tokens, backend, request)
    limit = backend.context_limit
    room = limit - prompt_tokens
    if room < 1:
        pictures = sum(len(m.images) for m in request.messages)
        held = f" with its {pictures} picture{'s' * (pictures != 1)}' image tokens" if pictures else ""
        fewer = "send fewer or smaller pictures, " if pictures else ""
        raise invalid(
            f"This prompt is {prompt_tokens} tokens{held}, over the server's context limit of {limit} tokens: "
            f"{fewer}shorten the conversation (or start the server with a larger --context).",
            param="messages", code="context_length_exceeded",
        )
    if request.sampling.max_tokens > room:
        request = replace(request, sampling=replace(request.sampling, max_tokens=room))
    return request, prompt_tokens


def submit(backend: Backend, request: CompletionRequest) -> JobFeed:
    try:
        job = backend.submit(request)
    except QueueFull as exc:
        raise ApiError(ErrorKind.RATE_LIMIT, str(exc), headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}) from exc
    return JobFeed(job)


async def raise_quick_refusal(feed: JobFeed, wait_s: float) -> None:
    """Wait up to `wait_s` for the job's first event; a Failed among the first is raised as an ApiError."""
    first = await feed.next(wait_s)
    if isinstance(first, Failed):
        raise refusal(first)
    if first is not KEEPALIVE:
        feed.push_back(first)
