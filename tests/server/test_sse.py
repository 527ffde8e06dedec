"""From a Job to SSE frames on an event loop: order, batching across threads, keep-alive pacing, framing."""

from __future__ import annotations

import asyncio
import threading
import time

from macapp.core.engine import Job
from macapp.core.events import AnswerDelta, PromptProgress
from macapp.core.serving.requests import Completed, FinishReason, Usage
from macapp.server.sse import KEEPALIVE, JobFeed, paced_frames, sse_comment, sse_frame, wait_or_disconnect

DONE = Completed("", "", (), FinishReason.STOP, Usage())


def test_frames():
    assert sse_frame({"a": 1}) == b'data: {"a":1}\n\n'
    assert sse_frame({"type": "ping"}, "ping") == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert sse_frame("[DONE]") == b"data: [DONE]\n\n"
    assert sse_comment("keepalive") == b": keepalive\n\n"


def test_events_from_another_thread_arrive_in_order_then_the_terminal_one():
    async def main():
        job = Job("serve")
        feed = JobFeed(job)

        def produce():
            for i in range(500):
                job.emit(AnswerDelta(str(i)))
            job.emit(DONE)

        threading.Thread(target=produce).start()
        got = [e async for e in feed.events(5)]
        return got

    got = asyncio.run(main())
    assert [e.text for e in got[:-1]] == [str(i) for i in range(500)] and got[-1] is DONE


def test_silence_gives_keepalive_and_push_back_comes_first():
    async def main():
        job = Job("serve")
        feed = JobFeed(job)
        quiet = await feed.next(0.05)
        job.emit(AnswerDelta("a"))
        first = await feed.next(1)
        feed.push_back(first)
        return quiet, await feed.next(1)

    quiet, again = asyncio.run(main())
    assert quiet is KEEPALIVE and again.text == "a"


def test_keepalives_are_paced_by_writes_not_by_events():
    """A long prefill reports progress often but writes nothing: the keep-alive still goes out."""

    async def main():
        job = Job("serve")
        feed = JobFeed(job)

        def prefill():
            for i in range(40):
                job.emit(PromptProgress(i, 40))
                time.sleep(0.01)
            job.emit(AnswerDelta("x"))
            job.emit(DONE)

        threading.Thread(target=prefill).start()
        translate = lambda e: [b"text"] if isinstance(e, AnswerDelta) else []  # noqa: E731
        return [f async for f in paced_frames(feed, 0.1, translate, b"ping")]

    frames = asyncio.run(main())
    assert frames.count(b"ping") >= 2 and frames[-1] == b"text"


def test_a_plain_reply_wait_cancelled_from_outside_stops_its_job():
    """The server shutting down cancels the route that waits for a plain reply: its job must not run on."""

    async def main():
        job = Job("serve")
        feed = JobFeed(job)
        never = asyncio.Event()

        async def receive():
            await never.wait()
            return {"type": "http.disconnect"}

        waiting = asyncio.ensure_future(wait_or_disconnect(feed, receive))
        await asyncio.sleep(0.05)
        assert not job.stopped
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        return job

    assert asyncio.run(main()).stopped
