"""Several calls in one reply, and a malformed call, through both SDKs (scripted models, greedy)."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.scripted import MALFORMED_TEXT, TIME_TOOL, TWO_CALLS, WEATHER_TOOL
from tests.server.conftest import GREEDY, serve

TOOLS = [WEATHER_TOOL, TIME_TOOL]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
ASK = [{"role": "user", "content": "Weather in Paris and Oslo, time in Rome?"}]


@pytest.fixture(scope="module")
def two_calls_server(scripted_two_calls_path):
    with serve(scripted_two_calls_path, default_thinking=False) as served:
        yield served


def test_three_calls_in_one_reply_openai(two_calls_server):
    reply = two_calls_server.openai().chat.completions.create(model="x", messages=ASK, tools=TOOLS, max_tokens=128, **GREEDY)
    calls = reply.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == TWO_CALLS
    assert len({c.id for c in calls}) == 3
    assert reply.choices[0].finish_reason == "tool_calls"
    assert not reply.choices[0].message.content


def test_three_calls_streamed_with_their_indexes_openai(two_calls_server):
    stream = two_calls_server.openai().chat.completions.create(model="x", messages=ASK, tools=TOOLS, max_tokens=128, stream=True, **GREEDY)
    calls: dict[int, dict] = {}
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
    assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)] == TWO_CALLS


def test_three_tool_use_blocks_anthropic(two_calls_server):
    message = two_calls_server.anthropic().messages.create(model="m", max_tokens=128, messages=ASK, tools=ANTHROPIC_TOOLS, extra_body={"temperature": 0})
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == TWO_CALLS
    assert message.stop_reason == "tool_use"
    with two_calls_server.anthropic().messages.stream(model="m", max_tokens=128, messages=ASK, tools=ANTHROPIC_TOOLS, extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == TWO_CALLS


def test_a_malformed_call_comes_back_as_text(scripted_malformed_path):
    with serve(scripted_malformed_path, default_thinking=False) as served:
        reply = served.openai().chat.completions.create(model="x", messages=ASK, tools=TOOLS, max_tokens=128, **GREEDY)
        assert reply.choices[0].message.content == MALFORMED_TEXT
        assert not reply.choices[0].message.tool_calls and reply.choices[0].finish_reason == "stop"
        message = served.anthropic().messages.create(model="m", max_tokens=128, messages=ASK, tools=ANTHROPIC_TOOLS, extra_body={"temperature": 0})
        assert [b.type for b in message.content] == ["text"] and message.content[0].text == MALFORMED_TEXT
        assert message.stop_reason == "end_turn"
