"""From an engine Job to an HTTP reply on the event loop: the job's events as an async stream, Server-Sent Events
framing, and a streaming response that stops the job as soon as the client goes away.

The job's events arrive on the engine's worker thread; a listener hands them to the loop with
`call_soon_threadsafe`, so no thread ever blocks on the loop or the loop on the worker. A quiet stream (a long
prefill, a queue) yields `KeepAlive` every `keepalive_s`, which each API writes in its own way (a comment, or
Anthropic's `ping` event). sse-starlette is not used: it patches uvicorn's signal handling process-wide, which
the window (a server started and stopped many times in one process) cannot have.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
from typing import TYPE_CHECKING, AsyncIterator, Callable

import anyio
from starlette.types import Receive, Scope, Send

from macapp.core.events import Event, TerminalEvent

if TYPE_CHECKING:  # only named: the engine package imports huggingface_hub
    from macapp.core.engine.jobs import Job


class KeepAlive:
    """Nothing happened for a while: write something so proxies and clients keep the connection."""


KEEPALIVE = KeepAlive()


class JobFeed:
    """A Job's events, awaited on the event loop that created the feed.

    The worker only appends to a list; it wakes the loop once per batch (not once per token), so a fast decode
    costs the worker one lock and an append per event, and the loop takes whatever arrived since it last looked."""

    def __init__(self, job: Job):
        self.job = job
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        self._arrived: list[Event] = []  # filled by the worker, taken by the loop
        self._wake_pending = False
        self._ready: collections.deque[Event] = collections.deque()  # loop side
        self._signal = asyncio.Event()
        self.finished = False
        job.add_listener(self._deliver)

    def _deliver(self, event: Event) -> None:  # on the worker thread (or this one, for past events)
        with self._lock:
            self._arrived.append(event)
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._signal.set)
        except RuntimeError:  # the loop is closed: the server has gone, nobody is listening
            pass

    def _take(self) -> None:
        with self._lock:
            arrived, self._arrived = self._arrived, []
            self._wake_pending = False
            self._signal.clear()
        self._ready.extend(arrived)

    async def next(self, timeout: float | None = None) -> Event | KeepAlive:
        """The next event, or KEEPALIVE after `timeout` seconds of silence."""
        while not self._ready:
            self._take()
            if self._ready:
                break
            try:  # a wake-up may find nothing new (its batch was taken already): then wait again
                await asyncio.wait_for(self._signal.wait(), timeout)
            except asyncio.TimeoutError:
                return KEEPALIVE
        event = self._ready.popleft()
        if isinstance(event, TerminalEvent):
            self.finished = True
        return event

    def push_back(self, event: Event) -> None:
        self._ready.appendleft(event)

    async def events(self, keepalive_s: float) -> AsyncIterator[Event | KeepAlive]:
        """Every event up to and including the terminal one, with KEEPALIVE in the quiet stretches."""
        while True:
            event = await self.next(keepalive_s)
            yield event
            if isinstance(event, TerminalEvent):
                return

    async def terminal(self) -> TerminalEvent:
        """Skip to the terminal event."""
        while True:
            event = await self.next()
            if isinstance(event, TerminalEvent):
                return event


async def paced_frames(
    feed: JobFeed, keepalive_s: float, translate: Callable[[Event], list[bytes]], keepalive: bytes | Callable[[], bytes]
) -> AsyncIterator[bytes]:
    """The frames `translate` makes of each event, with `keepalive` (or what it returns now) whenever nothing was
    written for `keepalive_s` (a long prefill reports progress, which writes nothing, so the pace is the writes', not
    the events')."""
    last = time.monotonic()
    async for event in feed.events(keepalive_s):
        frames = [] if isinstance(event, KeepAlive) else translate(event)
        if not frames and time.monotonic() - last >= keepalive_s:
            frames = [keepalive() if callable(keepalive) else keepalive]
        for frame in frames:
            yield frame
        if frames:
            last = time.monotonic()


def sse_frame(data: object, event: str | None = None) -> bytes:
    """One SSE event: an optional `event:` line and one `data:` line (JSON unless already a string)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def sse_comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


async def watch_disconnect(receive: Receive, on_disconnect: Callable[[], None]) -> None:
    """Return (after calling `on_disconnect`) when the client closes the connection."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


async def wait_or_disconnect(feed: JobFeed, receive: Receive) -> TerminalEvent | None:
    """The job's terminal event; if the client goes away first, the job is stopped and None returned. A wait
    cancelled from outside (the server shutting down) stops the job too: nobody would read its reply."""
    result: list[TerminalEvent] = []
    try:
        async with anyio.create_task_group() as group:

            async def finish() -> None:
                result.append(await feed.terminal())
                group.cancel_scope.cancel()

            async def watch() -> None:
                await watch_disconnect(receive, feed.job.stop)
                group.cancel_scope.cancel()

            group.start_soon(finish)
            group.start_soon(watch)
    finally:
        if not result and not feed.job.done:
            feed.job.stop()
    return result[0] if result else None


class SseResponse:
    """An ASGI `text/event-stream` response of `frames`; the job stops at once if the client disconnects
    (whether the loss shows as an `http.disconnect` or as a failed write), or if the server cancels it."""

    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ]

    def __init__(self, frames: AsyncIterator[bytes], job: Job):
        self.frames = frames
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    await watch_disconnect(receive, self.job.stop)
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                try:
                    await send({"type": "http.response.start", "status": 200, "headers": self.headers})
                    async for frame in self.frames:
                        await send({"type": "http.response.body", "body": frame, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:  # the client went away mid-write
                    pass
                group.cancel_scope.cancel()
        finally:
            if not self.job.done:
                self.job.stop()
