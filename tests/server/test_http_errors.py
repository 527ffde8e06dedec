"""Every bad input gets 400/404/405/413 in the API's own JSON shape, before any work, and the server goes on."""

from __future__ import annotations

import httpx2
import pytest

from tests.server.conftest import no_eos_bias, serve

OPENAI = "/v1/chat/completions"
ANTHROPIC = "/v1/messages"
HELLO = [{"role": "user", "content": "hi"}]


def post(served, path, content=None, json=None, headers=None):
    return httpx2.post(f"{served.url}{path}", content=content, json=json, headers=headers, timeout=30)


def assert_openai_error(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def assert_anthropic_error(response, status):
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"", None),
        (b'{"model": "x"}', "messages"),
        (b'{"model": "x", "messages": []}', "messages"),
        (b'{"messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}', "max_tokens"),
    ],
)
def test_openai_bad_bodies(tiny_server, body, param):
    error = assert_openai_error(post(tiny_server, OPENAI, content=body, headers={"content-type": "application/json"}), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"model": "x", "max_tokens": 5}',
        b'{"model": "x", "max_tokens": 5, "messages": []}',
        b'{"max_tokens": 5, "messages": [{"role": "tool", "content": "hi"}]}',
        b'{"max_tokens": -1, "messages": [{"role": "user", "content": "hi"}]}',
    ],
)
def test_anthropic_bad_bodies(tiny_server, body):
    error = assert_anthropic_error(post(tiny_server, ANTHROPIC, content=body), 400)
    assert error["type"] == "invalid_request_error"


def test_unknown_endpoint_and_wrong_method_are_json(tiny_server):
    error = assert_openai_error(httpx2.get(f"{tiny_server.url}/v1/completions", timeout=10), 404)
    assert "/v1/chat/completions" in error["message"]
    assert_anthropic_error(httpx2.get(f"{tiny_server.url}/v1/messages", timeout=10), 405)


def test_body_over_the_limit_is_413_declared_or_streamed(tiny_dense_path):
    with serve(tiny_dense_path, max_body_bytes=64 * 1024) as served:
        big = b'{"messages": [{"role": "user", "content": "' + b"x" * 70_000 + b'"}]}'
        assert_openai_error(post(served, OPENAI, content=big), 413)
        assert assert_anthropic_error(post(served, ANTHROPIC, content=big), 413)["type"] == "request_too_large"

        def chunks():  # no Content-Length: the limit is counted as the body arrives
            for _ in range(20):
                yield b"x" * 8192

        assert_openai_error(post(served, OPENAI, content=chunks()), 413)
        ok = post(served, OPENAI, json={"messages": HELLO, "max_tokens": 4})
        assert ok.status_code == 200  # still serving


def test_several_hundred_kb_requests_are_fine(tiny_server):
    """Agents send large bodies; they must not hit the limit (the prompt limit refuses this one, as a 400)."""
    big = {"messages": [{"role": "user", "content": "word " * 120_000}], "max_tokens": 4}
    error = assert_openai_error(post(tiny_server, OPENAI, json=big), 400)
    assert error["code"] == "context_length_exceeded"


def test_prompt_over_the_context_is_400_before_any_work_and_max_tokens_is_clamped(tiny_dense_path):
    with serve(tiny_dense_path, context=64) as served:
        long = [{"role": "user", "content": "hello " * 200}]
        error = assert_openai_error(post(served, OPENAI, json={"messages": long}), 400)
        assert error["code"] == "context_length_exceeded" and "64" in error["message"]
        assert "context" in assert_anthropic_error(post(served, ANTHROPIC, json={"messages": long, "max_tokens": 5}), 400)["message"]
        streamed = post(served, OPENAI, json={"messages": long, "stream": True})
        assert_openai_error(streamed, 400)  # refused before the stream starts
        assert [r.state.value for r in served.activity.records()] == ["refused"] * 3  # listed as refused, nothing started
        reply = post(served, OPENAI, json={"messages": HELLO, "max_tokens": 10_000, "temperature": 0, "logit_bias": no_eos_bias(served)})
        assert reply.status_code == 200
        usage = reply.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= 64
        assert reply.json()["choices"][0]["finish_reason"] == "length"


def test_the_server_keeps_serving_after_bad_requests(tiny_server):
    for body in (b"{", b"null", b'{"messages": 5}'):
        post(tiny_server, OPENAI, content=body)
        post(tiny_server, ANTHROPIC, content=body)
    reply = tiny_server.openai().chat.completions.create(model="x", messages=HELLO, max_tokens=64, temperature=0)
    assert reply.choices[0].message.content == "The answer is here!"
