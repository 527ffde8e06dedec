"""Every bad /v1/responses input is a 400 in OpenAI's error shape naming the field (`param`), before any work;
unknown optional fields are accepted."""

from __future__ import annotations

import httpx2
import pytest

GOOD = {"model": "x", "input": "Hello", "max_output_tokens": 4}
REMOTE = {"type": "input_image", "image_url": "https://example.com/cat.png"}


def _post(served, body, raw: bytes | None = None) -> httpx2.Response:
    url = f"{served.url}/v1/responses"
    if raw is not None:
        return httpx2.post(url, content=raw, headers={"content-type": "application/json"}, timeout=30)
    return httpx2.post(url, json=body, timeout=30)


def _user(*parts):
    return [{"role": "user", "content": list(parts)}]


BAD = [
    ({"model": "x"}, "input"),
    ({**GOOD, "input": 5}, "input"),
    ({**GOOD, "input": []}, "input"),
    ({**GOOD, "instructions": "Be brief.", "input": [{"role": "developer", "content": "Only this."}]}, "input"),
    ({**GOOD, "instructions": 3}, "instructions"),
    ({**GOOD, "input": ["Hello"]}, "input[0]"),
    ({**GOOD, "input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
    ({**GOOD, "input": [{"type": "telepathy"}]}, "input[0].type"),
    ({**GOOD, "input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({**GOOD, "input": [{"role": "user", "content": 7}]}, "input[0].content"),
    ({**GOOD, "input": _user({"type": "input_audio"})}, "input[0].content[0].type"),
    ({**GOOD, "input": _user({"type": "input_text"})}, "input[0].content[0].text"),
    ({**GOOD, "input": _user(REMOTE)}, "input[0].content[0].image_url"),
    ({**GOOD, "input": _user({"type": "input_image", "file_id": "file_1"})}, "input[0].content[0].image_url"),
    ({**GOOD, "input": _user({"type": "input_file", "file_data": "xx"})}, "input[0].content[0].type"),
    ({**GOOD, "input": [{"role": "assistant", "content": [REMOTE]}]}, "input[0].content[0].image_url"),
    ({**GOOD, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({**GOOD, "input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]}, "input[0].name"),
    ({**GOOD, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{not json"}]}, "input[0].arguments"),
    ({**GOOD, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({**GOOD, "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({**GOOD, "input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0].output"),
    ({**GOOD, "input": [{"type": "reasoning", "summary": "thought"}, {"role": "user", "content": "Hi"}]}, "input[0].summary"),
    ({**GOOD, "tools": {"type": "function"}}, "tools"),
    ({**GOOD, "tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
    ({**GOOD, "tools": [{"type": "function", "name": "f", "parameters": []}]}, "tools[0].parameters"),
    ({**GOOD, "tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict"),
    ({**GOOD, "tools": [{"type": 4}]}, "tools[0].type"),
    ({**GOOD, "tool_choice": "sometimes"}, "tool_choice"),
    ({**GOOD, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({**GOOD, "tool_choice": {"type": "teleport"}}, "tool_choice.type"),
    ({**GOOD, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "nope"}]}}, "tool_choice.tools"),
    ({**GOOD, "tool_choice": {"type": "allowed_tools", "mode": "often", "tools": []}}, "tool_choice.mode"),
    ({**GOOD, "temperature": 3}, "temperature"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "top_p": 1.5}, "top_p"),
    ({**GOOD, "max_output_tokens": 0}, "max_output_tokens"),
    ({**GOOD, "max_output_tokens": 2.5}, "max_output_tokens"),
    ({**GOOD, "reasoning": "high"}, "reasoning"),
    ({**GOOD, "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({**GOOD, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({**GOOD, "store": 1}, "store"),
    ({**GOOD, "stream": "yes"}, "stream"),
    ({**GOOD, "metadata": {"n": 1}}, "metadata"),
    ({**GOOD, "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
    ({**GOOD, "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({**GOOD, "background": True}, "background"),
    ({**GOOD, "conversation": "conv_1"}, "conversation"),
    ({**GOOD, "prompt": {"id": "pmpt_1"}}, "prompt"),
    ({**GOOD, "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({**GOOD, "previous_response_id": 12}, "previous_response_id"),
    ({**GOOD, "input": [{"role": ["user"], "content": "Hi"}]}, "input[0].role"),  # was a 500 (unhashable)
    ({**GOOD, "tool_choice": {"type": ["function"]}}, "tool_choice.type"),  # was a 500 (unhashable)
    ({**GOOD, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 5000 + "]" * 5000}]}, "input[0].arguments"),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_bad_input_is_a_400_naming_the_field(tiny_server, body, param):
    response = _post(tiny_server, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


@pytest.mark.parametrize("raw", [b"", b"{not json", b"[1, 2]", b'{"input": NaN}'])
def test_a_body_that_is_not_a_json_object_is_a_400(tiny_server, raw):
    response = _post(tiny_server, None, raw)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_an_unknown_previous_response_has_the_apis_code(tiny_server):
    error = _post(tiny_server, {**GOOD, "previous_response_id": "resp_gone"}).json()["error"]
    assert error["code"] == "previous_response_not_found" and "resp_gone" in error["message"]


def test_a_prompt_over_the_context_is_a_400_naming_input(tiny_dense_path):
    from tests.server.conftest import serve

    with serve(tiny_dense_path, context=64) as served:
        response = _post(served, {**GOOD, "input": "word " * 200})
        streamed = _post(served, {**GOOD, "input": "word " * 200, "stream": True})
    for r in (response, streamed):
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["param"] == "input"


def test_unknown_optional_fields_are_accepted(tiny_server):
    body = {
        **GOOD,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "service_tier": "auto",
        "client_metadata": {"x": "y"},
        "safety_identifier": "u",
        "truncation": "auto",
        "text": {"verbosity": "low"},
        "stream_options": {"include_obfuscation": False},
        "top_logprobs": 0,
        "max_tool_calls": 4,
        "user": "me",
        "some_future_field": {"nested": True},
    }
    response = _post(tiny_server, body)
    assert response.status_code == 200 and response.json()["object"] == "response"


def test_unknown_response_id_is_a_404(tiny_server):
    response = httpx2.get(f"{tiny_server.url}/v1/responses/resp_nope", timeout=10)
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
