"""Issue #19's crashes: each is a 400 in the API's own shape (or, for a tool schema nobody validates, an answer),
and the server goes on serving."""

from __future__ import annotations

import json

import httpx2
import pytest

from tests.server.conftest import GREEDY

OPENAI = "/v1/chat/completions"
ANTHROPIC = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
HELLO = [{"role": "user", "content": "hi"}]


def post(served, path, raw: bytes):
    return httpx2.post(f"{served.url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=60)


def body_for(path: str, **extra) -> dict:
    base = {"model": "m", "messages": HELLO, "max_tokens": 4, **GREEDY}
    if path == COUNT:
        base.pop("max_tokens")
    return {**base, **extra}


def assert_refused(response, path, param=None):
    assert response.status_code == 400, response.text
    body = response.json()
    if path == OPENAI:
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
        if param is not None:
            assert body["error"]["param"] == param
    else:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    return body


def assert_alive(served):
    ok = post(served, OPENAI, json.dumps(body_for(OPENAI)).encode())
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
@pytest.mark.parametrize(
    ("path", "field"),
    [
        (OPENAI, "max_tokens"),
        (OPENAI, "top_k"),
        (OPENAI, "n"),
        (OPENAI, "seed"),
        (OPENAI, "temperature"),
        (ANTHROPIC, "max_tokens"),
        (ANTHROPIC, "top_k"),
        (COUNT, "top_k"),
    ],
)
def test_non_finite_numbers_are_400(tiny_server, path, field, literal):
    raw = json.dumps(body_for(path, **{field: 1})).replace(f'"{field}": 1', f'"{field}": {literal}').encode()
    assert literal.encode() in raw
    assert_refused(post(tiny_server, path, raw), path)


@pytest.mark.parametrize("literal", ["NaN", "1e400"])
def test_non_finite_thinking_budget_is_400(tiny_server, literal):
    raw = json.dumps(body_for(ANTHROPIC, thinking={"type": "enabled", "budget_tokens": 1})).replace('"budget_tokens": 1', f'"budget_tokens": {literal}')
    assert_refused(post(tiny_server, ANTHROPIC, raw.encode()), ANTHROPIC)


@pytest.mark.parametrize("seed", [-1, 10**30, 2**64, 1.5])
def test_seeds_mlx_cannot_take_are_400(tiny_server, seed):
    assert_refused(post(tiny_server, OPENAI, json.dumps(body_for(OPENAI, seed=seed)).encode()), OPENAI, "seed")


@pytest.mark.parametrize("seed", [0, 2**64 - 1])
def test_the_seed_range_ends_are_served(tiny_server, seed):
    response = post(tiny_server, OPENAI, json.dumps(body_for(OPENAI, seed=seed)).encode())
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("bias", [{"-1": 5}, {"²": 5}, {"1e3": 5}, {"9" * 5000: 5}, {"5": "HUGE"}, {"5": "NaN"}, {"5": 101}])
def test_logit_bias_keys_and_values_are_checked(tiny_server, bias):
    raw = json.dumps(body_for(OPENAI, logit_bias=bias)).replace('"HUGE"', "1e400").encode()
    param = None if b"1e400" in raw else "logit_bias"  # an infinite number is refused as the JSON is read
    assert_refused(post(tiny_server, OPENAI, raw), OPENAI, param)


def test_a_logit_bias_past_the_vocabulary_does_not_take_the_server_down(tiny_server):
    response = post(tiny_server, OPENAI, json.dumps(body_for(OPENAI, logit_bias={"999999999": 5})).encode())
    assert response.status_code in (200, 400), response.text  # 400 once the runner's prepare checks the vocabulary
    assert_alive(tiny_server)


@pytest.mark.parametrize("path", [OPENAI, ANTHROPIC, COUNT])
def test_a_lone_surrogate_is_400(tiny_server, path):
    raw = json.dumps(body_for(path, messages=[{"role": "user", "content": "\ud800"}]))
    assert "\\ud800" in raw
    body = assert_refused(post(tiny_server, path, raw.encode()), path)
    if path == OPENAI:
        assert body["error"]["param"] == "messages[0].content"
    assert_alive(tiny_server)


def test_a_surrogate_pair_is_text(tiny_server):
    raw = json.dumps(body_for(OPENAI, messages=[{"role": "user", "content": "\U0001f600"}]))  # escaped as a pair
    assert "\\ud83d\\ude00" in raw
    assert post(tiny_server, OPENAI, raw.encode()).status_code == 200


@pytest.mark.parametrize("depth", [200, 2_000, 100_000])
@pytest.mark.parametrize("path", [OPENAI, ANTHROPIC, COUNT])
def test_deep_nesting_is_400(tiny_server, path, depth):
    raw = json.dumps(body_for(path)).rstrip("}") + ', "metadata": ' + "[" * depth + "]" * depth + "}"
    assert_refused(post(tiny_server, path, raw.encode()), path)
    assert_alive(tiny_server)


@pytest.mark.parametrize("path", [OPENAI, ANTHROPIC, COUNT])
def test_a_list_for_a_role_is_400(tiny_server, path):
    """A value the readers looked up in a dict (unhashable: a 500 before the typed models)."""
    raw = json.dumps(body_for(path, messages=[{"role": ["user"], "content": "hi"}])).encode()
    assert_refused(post(tiny_server, path, raw), path, "messages[0].role")
    assert_alive(tiny_server)


def test_deep_nesting_inside_a_calls_arguments_string_is_400(tiny_server):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 100_000 + "]" * 100_000}}
    messages = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "x"}]
    response = post(tiny_server, OPENAI, json.dumps(body_for(OPENAI, messages=messages)).encode())
    assert_refused(response, OPENAI, "messages[1].tool_calls[0].function.arguments")
    assert_alive(tiny_server)


def test_nesting_agents_use_is_served(tiny_server):
    schema: dict = {"type": "string"}
    for _ in range(20):
        schema = {"type": "object", "properties": {"a": schema}}
    tools = [{"type": "function", "function": {"name": "deep", "parameters": schema}}]
    assert post(tiny_server, OPENAI, json.dumps(body_for(OPENAI, tools=tools)).encode()).status_code == 200


@pytest.mark.parametrize("path", [OPENAI, ANTHROPIC])
def test_a_tool_schema_with_a_list_for_a_type_is_served(tool_server, path):
    schema = {"type": "object", "properties": {"city": {"type": [["x"]]}, "days": {"type": "integer"}}}
    tool = (
        {"type": "function", "function": {"name": "get_weather", "parameters": schema}} if path == OPENAI else {"name": "get_weather", "input_schema": schema}
    )
    response = post(tool_server, path, json.dumps(body_for(path, tools=[tool], max_tokens=64)).encode())
    assert response.status_code == 200, response.text
    assert_alive(tool_server)


@pytest.mark.parametrize("path", [OPENAI, ANTHROPIC])
def test_a_10_mib_prompt_over_the_context_is_refused_before_tokenizing(tiny_dense_path, path):
    import time

    from tests.server.conftest import serve

    with serve(tiny_dense_path, context=4096) as served:
        raw = json.dumps(body_for(path, messages=[{"role": "user", "content": "the answer is here. " * 524_288}])).encode()
        start = time.process_time()  # client and server are this process: its CPU time, which a suite beside does not add to
        response = post(served, path, raw)
        assert time.process_time() - start < 5
        assert_refused(response, path)
        assert "context limit" in response.text
        if path == OPENAI:
            assert response.json()["error"]["code"] == "context_length_exceeded"
