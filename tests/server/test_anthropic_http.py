"""The real `anthropic` SDK against the real server: messages, the event stream, thinking, tool use, usage."""

from __future__ import annotations

from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from tests.fixtures.scripted import TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE, WEATHER_TOOL

ANSWER = "".join(SCRIPT_ANSWER)
REASONING = "".join(SCRIPT_REASONING)
HELLO = [{"role": "user", "content": "Hello there"}]
TOOL = {
    "name": WEATHER_TOOL["function"]["name"],
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}
SAMPLING = {"extra_body": {"temperature": 0.0, "top_p": 1.0}}  # this SDK has no sampling arguments any more


def test_thinking_is_off_by_default(tiny_server):
    message = tiny_server.anthropic().messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=HELLO, **SAMPLING)
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == ANSWER
    assert message.stop_reason == "end_turn"
    assert message.model == tiny_server.backend.model_name
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_thinking_enabled_comes_back_as_a_thinking_block(tiny_server):
    message = tiny_server.anthropic().messages.create(
        model="claude-sonnet-4-5",
        max_tokens=64,
        messages=HELLO,
        thinking={"type": "enabled", "budget_tokens": 1024},
        **SAMPLING,
    )
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking.strip() == REASONING
    assert message.content[1].text == ANSWER


def test_max_tokens_stop_reason(tiny_server):
    message = tiny_server.anthropic().messages.create(model="m", max_tokens=2, messages=HELLO, **SAMPLING)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


def test_stream_event_sequence_through_the_sdk(tiny_server):
    client = tiny_server.anthropic()
    with client.messages.stream(model="m", max_tokens=64, messages=HELLO, thinking={"type": "enabled", "budget_tokens": 512}, **SAMPLING) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    assert final.content[0].type == "thinking" and final.content[0].thinking.strip() == REASONING
    assert final.content[1].text == ANSWER
    assert final.stop_reason == "end_turn"


def test_raw_stream_has_ping_and_typed_events(tiny_server):
    import json

    import httpx2

    body = {"model": "m", "max_tokens": 16, "messages": HELLO, "stream": True, **SAMPLING}
    with httpx2.stream("POST", f"{tiny_server.url}/v1/messages", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    names = [line[7:] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names[:2] == ["message_start", "ping"]
    assert [d["type"] for d in datas] == names
    delta = next(d for d in datas if d["type"] == "message_delta")
    assert set(delta["usage"]) >= {"input_tokens", "cache_read_input_tokens", "output_tokens"}


def test_tool_use_out_and_tool_result_back_in(tool_server):
    client = tool_server.anthropic()
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    message = client.messages.create(model="m", max_tokens=96, messages=messages, tools=[TOOL], **SAMPLING)
    assert message.stop_reason == "tool_use"
    text, use = message.content
    assert text.type == "text" and text.text.strip() == TOOL_PREAMBLE
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == TOOL_CALL_ARGUMENTS and use.id
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}]},
    ]
    again = client.messages.create(model="m", max_tokens=96, messages=messages, tools=[TOOL], **SAMPLING)
    assert again.stop_reason == "tool_use"
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens < message.usage.input_tokens + again.usage.cache_read_input_tokens


def test_streamed_tool_use_input_json(tool_server):
    with tool_server.anthropic().messages.stream(
        model="m", max_tokens=96, messages=[{"role": "user", "content": "Weather?"}], tools=[TOOL], **SAMPLING
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "input_json_delta" in deltas
    assert final.content[-1].type == "tool_use" and final.content[-1].input == TOOL_CALL_ARGUMENTS
    assert final.stop_reason == "tool_use"


def test_count_tokens_matches_the_prompt_read(tiny_server):
    client = tiny_server.anthropic()
    counted = client.messages.count_tokens(model="m", messages=HELLO, system="Be brief.")
    message = client.messages.create(model="m", max_tokens=8, messages=HELLO, system="Be brief.", **SAMPLING)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_thinking_budget_tokens_is_the_engines_budget(tiny_server):
    message = tiny_server.anthropic().messages.create(
        model="m",
        max_tokens=64,
        messages=HELLO,
        thinking={"type": "enabled", "budget_tokens": 2},
        **SAMPLING,
    )
    thinking, text = message.content
    assert thinking.thinking.strip() == "".join(SCRIPT_REASONING[:2]).strip()
    assert text.text == ANSWER


def test_stop_sequences(tiny_server):
    message = tiny_server.anthropic().messages.create(model="m", max_tokens=64, messages=HELLO, stop_sequences=[" is"], **SAMPLING)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == " is"
    assert message.content[0].text == "The answer"
