"""Refused requests (400, 401, 403, 404, 413; 429 and 503 the same way) appear in the request list and the log line with their status
and reason, not only the finished jobs; a job that ran is listed once."""

from __future__ import annotations

import time

import httpx2

from macapp.cli.serve import request_line
from macapp.server.activity import RequestState
from tests.server.conftest import serve

HELLO = [{"role": "user", "content": "hi"}]


def refusals(served):
    return [r for r in served.activity.records() if r.state is RequestState.REFUSED]


def test_each_kind_of_refusal_is_listed_with_its_status_and_reason(tiny_dense_path):
    with serve(tiny_dense_path, api_key="sesame", max_body_bytes=64 * 1024) as served:
        seen = []
        served.activity.add_observer(seen.append)
        key = {"x-api-key": "sesame"}
        url = served.url
        httpx2.post(f"{url}/v1/messages", json={"max_tokens": 4, "messages": HELLO}, timeout=30)  # no key: 401
        httpx2.post(f"{url}/v1/chat/completions", json={"messages": HELLO}, headers={**key, "host": "evil.example"}, timeout=30)  # 403
        httpx2.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}, headers=key, timeout=30)  # 400
        httpx2.get(f"{url}/v1/files", headers=key, timeout=30)  # 404
        httpx2.post(f"{url}/v1/chat/completions", content=b"x" * 100_000, headers={**key, "content-type": "application/json"}, timeout=30)  # 413
        ok = httpx2.post(f"{url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, headers=key, timeout=60)
        assert ok.status_code == 200
        listed = refusals(served)
        assert [(r.status, r.api) for r in listed] == [(401, "anthropic"), (403, "openai"), (400, "openai"), (404, "openai"), (413, "openai")]
        assert "API key" in listed[0].error and "evil.example" in listed[1].error and "messages[0].role" in listed[2].error
        assert "/v1/files" in listed[3].error and "limit" in listed[4].error
        assert all(r.client.startswith("127.0.0.1:") for r in listed)
        assert [r.id for r in seen if r.state is RequestState.REFUSED] == [r.id for r in listed]  # the window is told
        line = request_line(listed[2])
        assert line.startswith("qwen-desk: 127.0.0.1:") and "refused 400: messages[0].role" in line
        deadline = time.monotonic() + 30
        while served.activity.busy() and time.monotonic() < deadline:  # the job's last event reaches the list
            time.sleep(0.01)
        ran = [r for r in served.activity.records() if r.state is not RequestState.REFUSED]
        assert len(ran) == 1 and ran[0].state is RequestState.DONE


def test_a_full_queue_is_listed_as_refused_429_with_its_reason(tiny_dense_path):
    """With room for one request and none waiting, a second one while the first waits gets 429 (each API in its own
    shape, with Retry-After): listed as refused with its status and reason, in the list and the log line."""
    import threading

    with serve(tiny_dense_path, queue_limit=0, parallel=1) as served:
        gate = threading.Event()
        served.engine.submit("hold", lambda job: gate.wait(30))  # the worker is busy: the first request waits
        answers = []
        first = threading.Thread(
            target=lambda: answers.append(httpx2.post(f"{served.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=60))
        )
        try:
            first.start()
            deadline = time.monotonic() + 30
            while not served.activity.busy() and time.monotonic() < deadline:  # the first one is in, waiting
                time.sleep(0.01)
            full_openai = httpx2.post(f"{served.url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=30)
            full_anthropic = httpx2.post(f"{served.url}/v1/messages", json={"max_tokens": 2, "messages": HELLO}, timeout=30)
        finally:
            gate.set()
            first.join(60)
        assert full_openai.status_code == full_anthropic.status_code == 429
        assert int(full_openai.headers["retry-after"]) >= 1 and int(full_anthropic.headers["retry-after"]) >= 1
        assert full_anthropic.json()["error"]["type"] == "rate_limit_error"
        assert answers[0].status_code == 200  # the one that waited is answered once the worker is free
        listed = refusals(served)
        assert [(r.status, r.api) for r in listed] == [(429, "openai"), (429, "anthropic")]
        reason = full_openai.json()["error"]["message"]
        assert reason and listed[0].error == reason and listed[1].error == full_anthropic.json()["error"]["message"]
        line = request_line(listed[0])
        assert line.startswith("qwen-desk: 127.0.0.1:") and f"refused 429: {reason}" in line
        deadline = time.monotonic() + 30
        while served.activity.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        ran = [r for r in served.activity.records() if r.state is not RequestState.REFUSED]
        assert [r.state for r in ran] == [RequestState.DONE]  # the waiting one ran, listed once
