"""Anthropic messages: request bodies into CompletionRequest, job events into messages and the SSE sequence."""

from __future__ import annotations

import json

import pytest

from macapp.core.events import AnswerDelta, PromptProgress, ReasoningDelta
from macapp.core.serving.requests import (
    Completed,
    FinishReason,
    RequestStarted,
    Role,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoiceMode,
    Usage,
)
from macapp.server.anthropic_api import EventWriter, message_body, parse_messages_request
from macapp.server.errors import ApiError

TOOL = {"name": "get_weather", "description": "forecast", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def parse(body, **kw):
    return parse_messages_request({"max_tokens": 100, **body}, client="t", **kw)


def test_system_blocks_tool_use_and_tool_result_are_rendered_as_chat_messages():
    call = parse(
        {
            "system": [{"type": "text", "text": "You are a coder."}, {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "use the tool", "signature": "x"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "any"},
        }
    )
    m = call.request.messages
    assert [x.role for x in m] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]
    assert m[0].content == "You are a coder.\n\nBe brief."
    assert m[2].content == "Checking." and m[2].reasoning == "use the tool"
    assert m[2].tool_calls == (ToolCall("toolu_1", "get_weather", {"city": "Paris"}),)
    assert (m[3].tool_call_id, m[3].name, m[3].content) == ("toolu_1", "get_weather", "sunny")
    assert m[4].content == "And tomorrow?"
    assert call.request.tools[0].parameters["properties"]["city"] == {"type": "string"}
    assert call.request.tool_choice.mode is ToolChoiceMode.REQUIRED


@pytest.mark.parametrize(
    ("thinking", "on", "budget"),
    [(None, False, None), ({"type": "disabled"}, False, None), ({"type": "enabled", "budget_tokens": 2048}, True, 2048)],
)
def test_thinking_is_off_unless_enabled_and_its_budget_goes_to_the_engine(thinking, on, budget):
    body = {"messages": [{"role": "user", "content": "hi"}]}
    if thinking is not None:
        body["thinking"] = thinking
    request = parse(body).request
    assert (request.thinking, request.thinking_budget) == (on, budget)


def test_sampling_and_stop_sequences():
    request = parse(
        {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "top_k": 5, "top_p": 0.9, "stop_sequences": ["END"], "stream": True}
    ).request
    assert (request.sampling.temperature, request.sampling.top_k, request.sampling.top_p, request.sampling.max_tokens) == (0, 5, 0.9, 100)
    assert request.stop == ("END",)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {},
        {"messages": [{"role": "system", "content": "x"}]},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5},
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "sometimes"}},
    ],
)
def test_bad_bodies_are_400(body):
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == 400


def test_max_tokens_is_required_except_for_counting():
    with pytest.raises(ApiError, match="max_tokens"):
        parse_messages_request({"messages": [{"role": "user", "content": "hi"}]})
    assert parse_messages_request({"messages": [{"role": "user", "content": "hi"}]}, for_counting=True).request.messages


def done(**kw) -> Completed:
    values = dict(
        text="Hi",
        reasoning="",
        tool_calls=(),
        finish_reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=100, cached_tokens=90, completion_tokens=4),
        model="tiny",
    )
    values.update(kw)
    return Completed(**values)


@pytest.mark.parametrize(
    ("reason", "stop_reason"),
    [
        (FinishReason.STOP, "end_turn"),
        (FinishReason.LENGTH, "max_tokens"),
        (FinishReason.STOP_SEQUENCE, "stop_sequence"),
        (FinishReason.TOOL_CALLS, "tool_use"),
    ],
)
def test_message_body_blocks_stop_reason_and_usage(reason, stop_reason):
    call = ToolCall("toolu_2", "get_weather", {"city": "Paris"})
    body = message_body(
        done(reasoning="hm", tool_calls=(call,), finish_reason=reason, stop_sequence="END" if reason is FinishReason.STOP_SEQUENCE else None), "msg_1", "m"
    )
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
    assert body["content"][2] == {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Paris"}}
    assert body["stop_reason"] == stop_reason
    assert body["usage"] == {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 90, "output_tokens": 4}
    assert body["model"] == "tiny"


def test_stream_event_sequence_opens_and_closes_each_block_in_order():
    writer = EventWriter("loaded", prompt_tokens=100)
    call = ToolCall("toolu_1", "get_weather", {"city": "Paris"})
    events = [
        ReasoningDelta("a"),
        ReasoningDelta("b"),
        AnswerDelta("I will check."),
        ToolCallStarted(0, "toolu_1", "get_weather"),
        ToolCallFinished(0, call),
        done(text="I will check.", tool_calls=(call,), finish_reason=FinishReason.TOOL_CALLS),
    ]
    out = writer.start() + [x for e in events for x in writer.events(e)]
    names = [n for n, _ in out]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in out)
    deltas = [d["delta"] for n, d in out if n == "content_block_delta"]
    assert [d["type"] for d in deltas] == ["thinking_delta", "thinking_delta", "signature_delta", "text_delta", "input_json_delta"]
    assert deltas[2]["signature"]  # Claude Code drops a thinking block without one
    assert json.loads(deltas[4]["partial_json"]) == {"city": "Paris"}
    starts = [d for n, d in out if n == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "thinking"), (1, "text"), (2, "tool_use")]
    assert starts[2]["content_block"]["id"] == "toolu_1"
    message_delta = out[-2][1]
    assert message_delta["delta"]["stop_reason"] == "tool_use"
    assert message_delta["usage"]["input_tokens"] == 10 and message_delta["usage"]["cache_read_input_tokens"] == 90
    assert out[0][1]["message"]["model"] == "loaded"


def test_message_start_waits_for_the_engine_and_carries_the_read_and_reused_split():
    writer = EventWriter("loaded", prompt_tokens=100)
    assert writer.events(PromptProgress(0, 10)) == []  # nothing before the engine takes the request
    out = writer.events(RequestStarted(prompt_tokens=100, cached_tokens=90)) + writer.events(AnswerDelta("Hi")) + writer.events(done())
    names = [n for n, _ in out]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names.count("message_start") == 1
    usage = out[0][1]["message"]["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (10, 90)


def test_a_job_that_ends_before_it_starts_still_opens_with_message_start():
    """Stopped while queued (the server shutting down): no RequestStarted came; the stream is still well formed."""
    writer = EventWriter("loaded", prompt_tokens=100)
    out = writer.events(done(text="", finish_reason=FinishReason.CANCELLED, usage=Usage(prompt_tokens=0)))
    assert [n for n, _ in out] == ["message_start", "ping", "message_delta", "message_stop"]
    assert out[0][1]["message"]["usage"]["input_tokens"] == 100
