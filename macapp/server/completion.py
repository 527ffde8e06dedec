"""What the HTTP front ends need from the core, and the steps every completion takes before it streams.

`Backend` is what the routes use of the runner (macapp.core.serving.runner.ServingEngine). The steps:
prepare it once off the event loop (render, count, refuse one over the context before any work, clamp max_tokens),
submit (a full queue is a 429 with Retry-After), and wait a moment for a quick refusal from the engine so it
can still go out as a JSON error instead of inside a stream that has already said 200.
"""

from __future__ import annotations

import math
from typing import AsyncIterator, Callable, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from macapp.core import events as ev
from macapp.core.events import Failed
from macapp.core.engine import EngineError
from macapp.core.engine.jobs import Job
from macapp.core.serving.prepared import PreparedRequest
from macapp.core.serving.requests import INVALID_REQUEST, Completed, CompletionRequest, FinishReason
from macapp.core.serving.runner import QueueFull
from macapp.server.activity import Activity
from macapp.server.errors import ApiError, ErrorKind, invalid, shutting_down
from macapp.server.config import ServerConfig
from macapp.server.sse import JobFeed, KeepAlive, SseResponse, wait_or_disconnect


class Backend(Protocol):
    @property
    def model_name(self) -> str: ...

    @property
    def context_limit(self) -> int: ...

    def count_tokens(self, request: CompletionRequest) -> int:
        """The prompt's length in tokens as the model's chat template renders it (any thread)."""

    def prepare(self, request: CompletionRequest) -> PreparedRequest:
        """Render and check it once (any thread; EngineError when it cannot run), max_tokens clamped."""

    def submit(self, prepared: PreparedRequest) -> Job:
        """Start it on the engine: a Job (see macapp.core.serving.requests); QueueFull beyond the queue limit."""

    def close(self) -> None:
        """The server is done with it (frees what it holds, e.g. the prompt checkpoints)."""


CLIENT_GONE = 499  # nginx's code for "the client closed the request": nobody reads it
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


def prepare(backend: Backend, request: CompletionRequest) -> PreparedRequest:
    """The request rendered and checked once (any thread); what the engine refuses before any work is a 400."""
    try:
        return backend.prepare(request)
    except EngineError as exc:
        raise engine_refusal(exc.code, exc.message) from exc


async def fit_to_context(backend: Backend, request: CompletionRequest) -> tuple[PreparedRequest, int]:
    """The request prepared off the event loop (rendered once, max_tokens clamped to the room the prompt leaves)
    and the prompt's length; a 400 if it does not fit."""
    prepared = await run_in_threadpool(prepare, backend, request)
    return prepared, prepared.prompt_tokens


def submit(backend: Backend, prepared: PreparedRequest) -> JobFeed:
    try:
        job = backend.submit(prepared)
    except QueueFull as exc:
        raise ApiError(ErrorKind.RATE_LIMIT, str(exc), headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}) from exc
    return JobFeed(job)


def ended_by_shutdown(event: object, activity: Activity) -> bool:
    """A job the server's stop ended: its reply is not an answer (a client that left also cancels; it reads nothing)."""
    return isinstance(event, Completed) and event.finish_reason is FinishReason.CANCELLED and activity.stopping


async def raise_quick_refusal(feed: JobFeed, wait_s: float, activity: Activity) -> None:
    """Wait up to `wait_s` for the job's first event; a Failed, or an end by the shutdown, is raised as an ApiError
    (it can still go out as a JSON error, before the stream has said 200)."""
    first = await feed.next(wait_s)
    if isinstance(first, Failed):
        raise refusal(first)
    if ended_by_shutdown(first, activity):
        raise shutting_down()
    if not isinstance(first, KeepAlive):
        feed.push_back(first)


async def complete(
    request: Request,
    backend: Backend,
    activity: Activity,
    config: ServerConfig,
    completion: CompletionRequest,
    api: str,
    *,
    stream: bool,
    reply: Callable[[Completed, int], dict[str, object]],
    frames: Callable[[JobFeed, int], AsyncIterator[bytes]],
) -> Response | SseResponse:
    """One completion, whatever its API: check the prompt fits, start it, and answer `reply(done, prompt_tokens)` as
    JSON, or the SSE stream of `frames(feed, prompt_tokens)` once no quick refusal came (that one still goes out as
    a JSON error). A client that leaves stops the job; a reply the server's stop cut short is a 503, not an answer."""
    prepared, prompt_tokens = await fit_to_context(backend, completion)
    feed = submit(backend, prepared)
    activity.track(feed.job, prepared.client, api, prompt_tokens)
    if stream:
        await raise_quick_refusal(feed, config.first_event_wait_s, activity)
        return SseResponse(frames(feed, prompt_tokens), feed.job)
    done = await wait_or_disconnect(feed, request.receive)
    if done is None:  # the client left; the job is stopped
        return Response(status_code=CLIENT_GONE)
    if isinstance(done, Failed):
        raise refusal(done)
    assert isinstance(done, Completed)  # a completion's job ends in Completed or Failed
    if ended_by_shutdown(done, activity):
        raise shutting_down(cut=bool(done.text or done.reasoning or done.tool_calls))
    return JSONResponse(reply(done, prompt_tokens))
