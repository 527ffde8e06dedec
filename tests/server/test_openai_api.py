"""OpenAI chat completions: request bodies into CompletionRequest, job events into completions and chunks."""

from __future__ import annotations

import json

import pytest

from macapp.core.events import AnswerDelta, ReasoningDelta
from macapp.core.serving.requests import (
    Completed,
    FinishReason,
    Role,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoiceMode,
    Usage,
)
from macapp.server.errors import ApiError
from macapp.server.openai_api import ChunkWriter, completion_body, parse_chat_request

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def parse(body, default_thinking=True):
    return parse_chat_request(body, default_thinking, client="test")


def refused(body) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value


def test_roles_content_parts_and_history_tool_calls_become_chat_messages():
    call = parse(
        {
            "model": "gpt-4o",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning_content": "need a tool",
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        }
    )
    m = call.request.messages
    assert [x.role for x in m] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL]
    assert m[1].content == "Weather in Paris?"
    assert m[2].tool_calls == (ToolCall("call_1", "get_weather", {"city": "Paris"}),)
    assert m[2].reasoning == "need a tool"
    assert (m[3].tool_call_id, m[3].content) == ("call_1", "sunny")
    assert call.request.tools[0].name == "get_weather"
    assert call.request.tool_choice.mode is ToolChoiceMode.FUNCTION and call.request.tool_choice.name == "get_weather"
    assert call.request.client == "test"


def test_image_parts_are_decoded_from_data_urls_and_remote_urls_refused():
    png = "iVBORw0KGgo="
    call = parse(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}],
                }
            ]
        }
    )
    image = call.request.messages[0].images[0]
    assert image.media_type == "image/png" and image.data.startswith(b"\x89PNG")
    error = refused({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]})
    assert "data: URL" in error.message


@pytest.mark.parametrize(
    ("body", "thinking"),
    [
        ({}, True),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "high"}, True),
        ({"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"}, True),
    ],
)
def test_thinking_switches(body, thinking):
    call = parse({"messages": [{"role": "user", "content": "hi"}], **body})
    assert call.request.thinking is thinking


def test_server_default_thinking_applies_when_the_request_is_silent():
    assert parse({"messages": [{"role": "user", "content": "hi"}]}, default_thinking=False).request.thinking is False


def test_sampling_fields_override_the_preset_and_stop_accepts_string_or_list():
    call = parse(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 77,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": -1,
            "min_p": 0.1,
            "presence_penalty": 0.5,
            "seed": 7,
            "stop": "END",
            "stream": True,
            "stream_options": {"include_usage": True},
            "frequency_penalty": 0.25,
        }
    )
    s = call.request.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.min_p, s.presence_penalty, s.seed) == (77, 0.0, 0.5, 0, 0.1, 0.5, 7)
    assert s.frequency_penalty == 0.25
    assert parse({"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1.1}).request.sampling.repetition_penalty == 1.1
    assert call.request.stop == ("END",)
    assert call.stream and call.include_usage
    assert parse({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b"], "max_tokens": 5}).request.stop == ("a", "b")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 5}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "sometimes"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True}, "logprobs"),
        ({"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 0}, "repetition_penalty"),
        ({"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 2.5}, "frequency_penalty"),
        ({"messages": [{"role": "user", "content": "hi"}], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"abc": 5}}, "logit_bias"),
        ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 500}}, "logit_bias"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(body, param):
    assert refused(body).param == param


def done(**kw) -> Completed:
    values = dict(
        text="Hello",
        reasoning="",
        tool_calls=(),
        finish_reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=100, cached_tokens=80, completion_tokens=5),
        model="tiny",
    )
    values.update(kw)
    return Completed(**values)


def test_completion_body_puts_reasoning_and_tool_calls_in_their_own_fields():
    call = ToolCall("call_9", "get_weather", {"city": "Paris", "days": 3})
    body = completion_body(done(text="", reasoning="thought", tool_calls=(call,), finish_reason=FinishReason.TOOL_CALLS), "id1", 1, "m")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["reasoning_content"] == "thought"
    assert message["tool_calls"] == [
        {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}}
    ]
    assert body["usage"] == {"prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105, "prompt_tokens_details": {"cached_tokens": 80}}
    assert body["model"] == "tiny"


def test_chunks_stream_role_then_reasoning_text_tool_calls_finish_and_usage():
    writer = ChunkWriter("loaded", include_usage=True)
    call = ToolCall("call_1", "get_weather", {"city": "Paris"})
    events = [
        ReasoningDelta("hm"),
        AnswerDelta("I will check."),
        ToolCallStarted(0, "call_1", "get_weather"),
        ToolCallFinished(0, call),
        done(finish_reason=FinishReason.TOOL_CALLS),
    ]
    chunks = [c for e in events for c in writer.chunks(e)]
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"reasoning_content": "hm"}
    assert deltas[2] == {"content": "I will check."}
    assert deltas[3]["tool_calls"][0] == {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    assert json.loads(deltas[4]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert chunks[5]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[6]["choices"] == [] and chunks[6]["usage"]["prompt_tokens_details"]["cached_tokens"] == 80
    assert all(c["usage"] is None for c in chunks[:6])
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == writer.id for c in chunks)
    assert chunks[-1]["model"] == "tiny"  # the model that answered


def test_logit_bias_maps_token_ids():
    call = parse({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"2": -100, "7": 3.5}, "n": 1, "response_format": {"type": "text"}})
    assert call.request.sampling.logit_bias == {2: -100.0, 7: 3.5}


def test_without_include_usage_no_usage_chunk():
    writer = ChunkWriter("m")
    chunks = writer.chunks(done())
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "stop"]
