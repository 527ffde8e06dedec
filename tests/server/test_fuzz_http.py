"""Property-based fuzzing of both request bodies and count_tokens on a live server: a few hundred generated
requests a run, each answered 2xx or 4xx in its API's own shape, never 5xx, and the server alive after each."""

from __future__ import annotations

import json

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

OPENAI = "/v1/chat/completions"
ANTHROPIC = "/v1/messages"
COUNT = "/v1/messages/count_tokens"

scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12)
texts = st.text(max_size=40) | st.sampled_from(["\ud800", "<|im_start|>", "<tool_call>", "</think>", "\x00", "é" * 30])
numbers = st.integers(min_value=-5, max_value=2**65) | st.floats(allow_nan=True, allow_infinity=True) | st.just(1e400) | json_values

openai_parts = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text"]), "text": texts}),
    st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": st.fixed_dictionaries(
                {"url": st.sampled_from(["data:image/png;base64,iVBORw0KGgo=", "data:image/png;base64,@@@", "https://example.com/x.png", ""])}
            ),
        }
    ),
    st.dictionaries(st.sampled_from(["type", "text", "image_url"]), json_values, max_size=3),
)
openai_messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "wizard"])},
    optional={
        "content": texts | st.lists(openai_parts, max_size=3) | json_values,
        "tool_calls": json_values,
        "tool_call_id": json_values,
        "reasoning_content": texts | json_values,
        "name": json_values,
    },
)
schemas = st.recursive(
    st.dictionaries(st.sampled_from(["type", "properties", "anyOf", "enum", "items", "$ref"]), json_values, max_size=3),
    lambda inner: st.dictionaries(st.sampled_from(["type", "properties", "anyOf", "items"]), inner | st.lists(inner, max_size=2), max_size=3),
    max_leaves=8,
)
openai_tools = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": st.text(min_size=1, max_size=8)}, optional={"parameters": schemas, "description": texts}),
        }
    )
    | json_values,
    max_size=2,
)
openai_bodies = st.fixed_dictionaries(
    {"messages": st.lists(openai_messages, min_size=1, max_size=4) | json_values},
    optional={
        "model": json_values,
        "max_tokens": numbers,
        "max_completion_tokens": numbers,
        "temperature": numbers,
        "top_p": numbers,
        "top_k": numbers,
        "min_p": numbers,
        "seed": numbers,
        "n": numbers,
        "presence_penalty": numbers,
        "frequency_penalty": numbers,
        "logit_bias": st.dictionaries(st.text(max_size=12), numbers, max_size=3) | json_values,
        "stop": texts | st.lists(texts, max_size=3) | json_values,
        "stream": st.booleans() | json_values,
        "tools": openai_tools,
        "tool_choice": st.sampled_from(["auto", "none", "required", "function"]) | json_values,
        "chat_template_kwargs": st.fixed_dictionaries({}, optional={"enable_thinking": st.booleans() | json_values}) | json_values,
        "reasoning_effort": json_values,
        "response_format": json_values,
        "stream_options": json_values,
        "metadata": json_values,
    },
)

anthropic_blocks = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}, optional={"cache_control": json_values}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": texts, "signature": texts}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": texts, "name": texts, "input": json_values}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": texts}, optional={"content": texts | json_values, "is_error": json_values}),
    st.fixed_dictionaries(
        {
            "type": st.just("image"),
            "source": st.fixed_dictionaries(
                {"type": st.just("base64"), "media_type": st.just("image/png"), "data": st.sampled_from(["iVBORw0KGgo=", "!!", ""])}
            ),
        }
    ),
    st.dictionaries(st.sampled_from(["type", "text", "source", "content"]), json_values, max_size=3),
)
anthropic_messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool"]), "content": texts | st.lists(anthropic_blocks, max_size=3) | json_values}
)
anthropic_bodies = st.fixed_dictionaries(
    {"messages": st.lists(anthropic_messages, min_size=1, max_size=4) | json_values},
    optional={
        "model": json_values,
        "max_tokens": numbers,
        "system": texts | st.lists(anthropic_blocks, max_size=2) | json_values,
        "temperature": numbers,
        "top_p": numbers,
        "top_k": numbers,
        "stream": st.booleans() | json_values,
        "stop_sequences": st.lists(texts, max_size=2) | json_values,
        "thinking": st.fixed_dictionaries(
            {"type": st.sampled_from(["enabled", "adaptive", "disabled", "x"])},
            optional={"budget_tokens": numbers, "display": st.sampled_from(["summarized", "omitted", "updates"]) | json_values},
        )
        | json_values,
        "tools": st.lists(st.fixed_dictionaries({"name": texts, "input_schema": schemas}) | json_values, max_size=2),
        "tool_choice": json_values,
        "output_config": json_values,
        "metadata": json_values,
        "context_management": json_values,
    },
)


def small(body: dict) -> dict:
    """Keep valid replies short: a generated max_tokens that would be served becomes at most 3."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 3:
            body[key] = 3
    return body


def encode(body) -> bytes:
    return json.dumps(body, allow_nan=True).encode()  # NaN / Infinity go out as the literals careless clients send


def check_reply(response, path: str) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        body = response.json()
        if path == OPENAI:
            assert set(body["error"]) >= {"message", "type", "param", "code"} and body["error"]["message"]
        else:
            assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert "data: " in response.text
        if path == OPENAI:  # an error inside a stream is a fault too: a 5xx by another name
            assert '"server_error"' not in response.text, response.text[:500]
        else:
            assert "api_error" not in response.text, response.text[:500]
    else:
        response.json()


@pytest.fixture(scope="module")
def client(tiny_server):
    with httpx2.Client(base_url=tiny_server.url, timeout=60, headers={"content-type": "application/json"}) as http:
        yield http


def alive(client) -> None:
    assert client.get("/health").status_code == 200


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(body=openai_bodies)
def test_chat_completions_fuzz(client, body):
    check_reply(client.post(OPENAI, content=encode(small(body))), OPENAI)
    alive(client)


@FUZZ
@given(body=anthropic_bodies)
def test_messages_fuzz(client, body):
    check_reply(client.post(ANTHROPIC, content=encode(small(body))), ANTHROPIC)
    alive(client)


@FUZZ
@given(body=anthropic_bodies)
def test_count_tokens_fuzz(client, body):
    check_reply(client.post(COUNT, content=encode(body)), COUNT)
    alive(client)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200) | json_values.map(encode), path=st.sampled_from([OPENAI, ANTHROPIC, COUNT]))
def test_any_bytes_are_answered_in_shape(client, raw, path):
    check_reply(client.post(path, content=raw), path)
    alive(client)
