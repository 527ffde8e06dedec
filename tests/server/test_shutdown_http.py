"""A shutdown never looks like an answer: a stream it cuts ends with an error in its API's shape (no finish_reason,
no message_stop), a request still queued gets 503 with Retry-After, and so does one arriving while it stops; a
client that leaves still ends its job as stopped, with nothing sent."""

from __future__ import annotations

import json
import threading

import httpx2
import pytest

from macapp.core.events import AnswerDelta, ReasoningDelta
from macapp.server.activity import RequestState
from tests.server.conftest import no_eos_bias, serve


def endless(served, **extra):
    return {
        "model": "x",
        "messages": [{"role": "user", "content": "Tell me everything."}],
        "temperature": 0,
        "max_tokens": 100_000,
        "logit_bias": no_eos_bias(served),
        "chat_template_kwargs": {"enable_thinking": False},
        **extra,
    }


def sse_events(lines):
    """(event name or None, data) per SSE event of a streamed body."""
    name, out = None, []
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
            out.append((name, data if data == "[DONE]" else json.loads(data)))
            name = None
    return out


def stop_in_background(served):
    """Stop the server on another thread, as SIGTERM's handler does."""
    thread = threading.Thread(target=served.server.stop)
    thread.start()
    return thread


def hold_replies_until_stopped(served):
    """From now on, hold the engine at each reply's first reasoning or answer token until its job is asked to stop.

    The stream has that token by then (the HTTP feed listens before this hold), so a stop sent once the client reads
    it always lands mid-reply, however slowly this machine runs: a reply the tiny model would end within a few
    tokens (Anthropic has no logit_bias to ban its end) cannot end first. The wait is only a safety net."""
    activity = served.server.activity
    track = activity.track

    def tracking(job, *args, **kwargs):
        record = track(job, *args, **kwargs)
        held = []

        def hold(event):
            if isinstance(event, (AnswerDelta, ReasoningDelta)) and not held:
                held.append(event)
                job.stop_event.wait(120)

        job.add_listener(hold)
        return record

    activity.track = tracking


def watch_records(served, until):
    """A threading.Event set once `until(records)` holds for the request list (an observer: no polling)."""
    reached = threading.Event()
    activity = served.server.activity

    def observe(_record):
        if until(activity.records()):
            reached.set()

    activity.add_observer(observe)
    observe(None)
    return reached


def test_an_openai_stream_cut_by_shutdown_ends_with_an_error_not_a_finish(tiny_dense_path):
    with serve(tiny_dense_path) as served:
        lines: list[str] = []
        stopper = None
        with httpx2.stream("POST", f"{served.url}/v1/chat/completions", json=endless(served, stream=True), timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
                if '"content":"' in line and '"content":""' not in line and stopper is None:
                    stopper = stop_in_background(served)  # the reply cannot end: no end-of-sequence token allowed
        stopper.join(30)
        events = sse_events(lines)
        chunks = [data for _, data in events if isinstance(data, dict) and "choices" in data]
        assert chunks and all(c["choices"][0]["finish_reason"] is None for c in chunks)
        errors = [data["error"] for _, data in events if isinstance(data, dict) and "error" in data]
        assert len(errors) == 1 and errors[0]["code"] == "server_shutting_down" and "cut short" in errors[0]["message"]


def test_an_anthropic_stream_cut_by_shutdown_ends_with_an_error_event(tiny_dense_path):
    with serve(tiny_dense_path) as served:
        body = {"model": "m", "max_tokens": 100_000, "stream": True, "temperature": 0, "messages": [{"role": "user", "content": "Tell me everything."}]}
        body["stop_sequences"] = []
        lines: list[str] = []
        stopper = None
        body["thinking"] = {"type": "enabled", "budget_tokens": 50_000}
        hold_replies_until_stopped(served)  # the tiny model's script would end within a few tokens
        with httpx2.stream("POST", f"{served.url}/v1/messages", json=body, timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
                if "content_block_delta" in line and stopper is None:
                    stopper = stop_in_background(served)
        stopper.join(30)
        names = [name for name, _ in sse_events(lines)]
        assert "content_block_delta" in names
        assert names[-1] == "error" and "message_stop" not in names and "message_delta" not in names
        error = sse_events(lines)[-1][1]
        assert error["type"] == "error" and error["error"]["type"] == "overloaded_error"


def test_a_request_still_queued_at_shutdown_gets_503_with_retry_after(tiny_dense_path):
    # One request at a time: the second waits behind the first, which cannot end (no end-of-sequence token, no limit).
    with serve(tiny_dense_path, parallel=1) as served:
        results: dict[str, httpx2.Response] = {}
        both_in = watch_records(served, lambda records: len(records) == 2)

        def queued():
            results["queued"] = httpx2.post(f"{served.url}/v1/chat/completions", json=endless(served), timeout=60)

        with httpx2.stream("POST", f"{served.url}/v1/chat/completions", json=endless(served, stream=True), timeout=60) as response:
            lines = response.iter_lines()
            next(line for line in lines if '"content"' in line)  # the first request is generating
            waiter = threading.Thread(target=queued)
            waiter.start()
            assert both_in.wait(60), "the second request never reached the engine"
            first, second = served.server.activity.records()
            assert first.state is RequestState.ANSWERING and second.state is RequestState.WAITING
            stopper = stop_in_background(served)
            rest = list(lines)
        waiter.join(30)
        stopper.join(30)
        refused = results["queued"]
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"].isdigit()
        assert refused.json()["error"]["code"] == "server_shutting_down"
        assert any("server_shutting_down" in line for line in rest)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"])
def test_a_request_arriving_while_the_server_stops_gets_503(tiny_server, path):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    tiny_server.activity.shut_down()  # what LocalServer.stop does first
    try:
        response = httpx2.post(f"{tiny_server.url}{path}", json=body, timeout=30)
    finally:
        tiny_server.activity.open()
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    error = response.json()["error"]
    assert (error["type"] == "overloaded_error") if path.startswith("/v1/messages") else (error["code"] == "server_shutting_down")
    assert httpx2.post(f"{tiny_server.url}{path}", json=body, timeout=30).status_code != 503  # serving again once open


def test_a_client_that_leaves_still_ends_as_stopped_without_an_error(tiny_server):
    earlier = {record.id for record in tiny_server.activity.records()}
    ended = watch_records(tiny_server, lambda records: any(r.id not in earlier and r.state.finished and r.state is not RequestState.REFUSED for r in records))
    with httpx2.stream("POST", f"{tiny_server.url}/v1/chat/completions", json=endless(tiny_server, stream=True), timeout=60) as response:
        next(line for line in response.iter_lines() if '"content"' in line)
    assert ended.wait(60), "the request never ended after its client left"
    last = [r for r in tiny_server.activity.records() if r.state is not RequestState.REFUSED][-1]
    assert last.state is RequestState.STOPPED and last.error == ""
