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

