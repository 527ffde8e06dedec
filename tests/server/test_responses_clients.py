"""POST /v1/responses through the real `openai` SDK (`client.responses.create`, plain and stream=True, and the
`responses.stream()` helper, which checks the event sequence as it accumulates) against a live server on tiny
models: reasoning on and off, tools and tool results round-tripped, an agent loop reading only its new tail,
previous_response_id, max_output_tokens, pictures."""

from __future__ import annotations

import base64
import json

import openai
import pytest

from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from tests.fixtures.scripted import TIME_TOOL, TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE, WEATHER_TOOL
from tests.fixtures.vision import picture_bytes, tiny_vlm_path  # noqa: F401  (fixture)
from tests.server.conftest import GREEDY, serve

ANSWER = "".join(SCRIPT_ANSWER)
REASONING = "".join(SCRIPT_REASONING)
OFF = {"reasoning": {"effort": "none"}}
FUNCTION = {"type": "function", **WEATHER_TOOL["function"], "strict": False}
TIME_FUNCTION = {"type": "function", **TIME_TOOL["function"]}


def _events(stream) -> list:
    return list(stream)


def test_plain_reply_with_reasoning(tiny_server):
    reply = tiny_server.openai().responses.create(model="gpt-5", input="Hello there", max_output_tokens=64, **GREEDY)
    assert reply.status == "completed" and reply.object == "response" and reply.id.startswith("resp_")
    assert reply.output_text == ANSWER
    reasoning, message = reply.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text.strip() == REASONING
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    usage = reply.usage
    assert usage.output_tokens_details.reasoning_tokens == len(SCRIPT_REASONING) + 1  # with its closing </think>: the engine's count
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens and usage.output_tokens > len(SCRIPT_ANSWER)
    assert reply.model == tiny_server.backend.model_name


@pytest.mark.parametrize("effort", ["none", "minimal"])
def test_effort_none_or_minimal_is_thinking_off(tiny_server, effort):
    reply = tiny_server.openai().responses.create(model="x", input="Hello there", reasoning={"effort": effort}, max_output_tokens=64, **GREEDY)
    assert [item.type for item in reply.output] == ["message"] and reply.output_text == ANSWER
    assert reply.usage.output_tokens_details.reasoning_tokens == 0


def test_instructions_and_developer_message_are_the_system_prompt(tiny_server):
    client = tiny_server.openai()
    by_instructions = client.responses.create(model="x", instructions="Be brief.", input="Hello", max_output_tokens=8, **OFF, **GREEDY)
    by_developer = client.responses.create(
        model="x",
        input=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}],
        max_output_tokens=8,
        **OFF,
        **GREEDY,
    )
    bare = client.responses.create(model="x", input="Hello", max_output_tokens=8, **OFF, **GREEDY)
    assert by_instructions.usage.input_tokens == by_developer.usage.input_tokens > bare.usage.input_tokens
    assert by_instructions.instructions == "Be brief."


def test_stream_event_sequence(tiny_server):
    events = _events(tiny_server.openai().responses.create(model="x", input="Hello", max_output_tokens=64, stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert reasoning.strip() == REASONING and text == ANSWER
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == text
    final = events[-1].response
    assert final.status == "completed" and final.output_text == ANSWER and final.usage.output_tokens > 0
    assert {e.response.id for e in events if e.type in ("response.created", "response.completed")} == {final.id}
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [item.id for item in final.output]


def test_stream_helper_accumulates_the_same_reply_as_plain(tiny_server):
    client = tiny_server.openai()
    with client.responses.stream(model="x", input="Hello", max_output_tokens=64, **GREEDY) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    plain = client.responses.create(model="x", input="Hello", max_output_tokens=64, **GREEDY)
    assert text == final.output_text == plain.output_text == ANSWER
    assert final.output[0].summary[0].text == plain.output[0].summary[0].text
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.usage.output_tokens_details.reasoning_tokens == plain.usage.output_tokens_details.reasoning_tokens


def test_max_output_tokens_gives_incomplete(tiny_server):
    client = tiny_server.openai()
    reply = client.responses.create(model="x", input="Hello", max_output_tokens=4, **GREEDY)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 4 and reply.output[0].type == "reasoning"
    events = _events(client.responses.create(model="x", input="Hello", max_output_tokens=4, stream=True, **GREEDY))
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_a_function_call(tool_server):
    reply = tool_server.openai().responses.create(
        model="gpt-5-codex",
        input="Weather in Paris?",
        tools=[FUNCTION, TIME_FUNCTION],
        tool_choice="auto",
        max_output_tokens=96,
        **GREEDY,
    )
    message, call = reply.output
    assert message.type == "message" and message.content[0].text.strip() == TOOL_PREAMBLE
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == TOOL_CALL_ARGUMENTS and call.status == "completed"
    assert reply.status == "completed"


def test_a_streamed_function_call_through_the_helper(tool_server):
    with tool_server.openai().responses.stream(
        model="x",
        input="Weather?",
        tools=[FUNCTION],
        parallel_tool_calls=False,
        max_output_tokens=96,
        **GREEDY,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(call.arguments) == TOOL_CALL_ARGUMENTS and call.name == "get_weather"


def test_tool_choice_none_offers_no_tools(tool_server):
    client = tool_server.openai()
    args = dict(model="x", input="Weather?", tools=[FUNCTION], max_output_tokens=96, **GREEDY)
    offered = client.responses.create(**args)
    withheld = client.responses.create(**args, tool_choice="none")
    assert withheld.usage.input_tokens < offered.usage.input_tokens
    assert not [item for item in withheld.output if item.type == "function_call"]


def test_tools_the_server_cannot_run_are_accepted_and_left_out(tool_server):
    """What Codex and other clients send besides functions: no 400, and not in the prompt."""
    client = tool_server.openai()
    hosted = [
        {"type": "web_search", "external_web_access": False},
        {"type": "image_generation"},
        {"type": "local_shell"},
        {"type": "custom", "name": "apply_patch", "description": "Patch files.", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.", "tools": [TIME_FUNCTION]},
    ]
    args = dict(model="x", input="Weather?", max_output_tokens=96, **GREEDY)
    alone = client.responses.create(**args, tools=[FUNCTION])
    mixed = client.responses.create(**args, tools=[*hosted, FUNCTION], tool_choice={"type": "web_search_preview"})
    assert mixed.usage.input_tokens == alone.usage.input_tokens
    assert [item.type for item in mixed.output] == ["message", "function_call"]


def _follow_up(reply, output: str) -> list[dict]:
    """What an agent sends next: the reply's items as it got them, then the tool's output."""
    items = [item.model_dump(exclude_none=True) for item in reply.output]
    call = next(item for item in reply.output if item.type == "function_call")
    return [*items, {"type": "function_call_output", "call_id": call.call_id, "output": output}]


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_agent_loop_reads_only_the_new_tail(tool_server, streamed):
    """Long instructions + tools, then call / output rounds: each request after the first restores the whole
    previous prompt from a checkpoint and reads only the previous reply and the new output."""
    client = tool_server.openai()
    instructions = ("You are a careful agent. " if not streamed else "You are a streaming agent. ") * 60
    items: list[dict] = [{"role": "user", "content": "Plan a trip to Paris."}]
    usages = []
    for round_ in range(3):
        ask = dict(model="x", instructions=instructions, input=items, tools=[FUNCTION], max_output_tokens=96, store=False, **GREEDY)
        if streamed:
            with client.responses.stream(**ask) as stream:
                reply = stream.get_final_response()
        else:
            reply = client.responses.create(**ask)
        usages.append(reply.usage)
        items += _follow_up(reply, f"result {round_}: sunny")
    first, *later = usages
    assert first.input_tokens > 200 and first.input_tokens_details.cached_tokens == 0
    for previous, usage in zip(usages, later):
        assert usage.input_tokens_details.cached_tokens >= previous.input_tokens - 8
        assert usage.input_tokens - usage.input_tokens_details.cached_tokens < 80


def test_reasoning_items_sent_back_reach_the_prompt(scripted_tool_model_path):
    """Thinking on in a tool loop: the reasoning item goes back into the assistant turn (Qwen3.5's template keeps it
    after the last user message), so the follow-up reads as the reply was written: only its tail is new."""
    with serve(scripted_tool_model_path, default_thinking=True) as served:
        client = served.openai()
        ask = dict(model="x", input="Weather?", tools=[FUNCTION], max_output_tokens=96, reasoning={"effort": "high", "summary": "auto"}, **GREEDY)
        reply = client.responses.create(**ask)
        assert [item.type for item in reply.output] == ["reasoning", "message", "function_call"]
        follow = _follow_up(reply, "sunny")
        kept = client.responses.create(**{**ask, "input": [{"role": "user", "content": "Weather?"}, *follow]})
        dropped = client.responses.create(**{**ask, "input": [{"role": "user", "content": "Weather?"}, *follow[1:]]})
    assert kept.usage.input_tokens > dropped.usage.input_tokens
    assert kept.usage.input_tokens_details.cached_tokens >= reply.usage.input_tokens - 2
    assert kept.usage.input_tokens - kept.usage.input_tokens_details.cached_tokens < 80  # the reply as rendered, the output


def test_previous_response_id_continues_a_stored_response(tool_server):
    client = tool_server.openai()
    ask = dict(model="x", tools=[FUNCTION], max_output_tokens=96, **GREEDY)
    first = client.responses.create(input="Weather in Paris?", **ask)
    call = first.output[-1]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    continued = client.responses.create(input=[output], previous_response_id=first.id, **ask)
    whole = client.responses.create(input=[{"role": "user", "content": "Weather in Paris?"}, *_follow_up(first, "sunny")], store=False, **ask)
    assert continued.previous_response_id == first.id
    assert continued.usage.input_tokens == whole.usage.input_tokens
    assert continued.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 2
    assert client.responses.retrieve(first.id).output[-1].call_id == call.call_id
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(whole.id)  # store: false is not kept
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(input="more", previous_response_id=whole.id, **ask)
    assert caught.value.body["param"] == "previous_response_id" and caught.value.body["code"] == "previous_response_not_found"


def test_a_streamed_response_is_stored_too(tiny_server):
    client = tiny_server.openai()
    events = _events(client.responses.create(model="x", input="Hello", max_output_tokens=64, stream=True, **OFF, **GREEDY))
    final = events[-1].response
    assert client.responses.retrieve(final.id).output_text == final.output_text == ANSWER
    again = client.responses.create(model="x", input="And again?", previous_response_id=final.id, max_output_tokens=64, **OFF, **GREEDY)
    assert again.usage.input_tokens_details.cached_tokens > 0 and again.output_text == ANSWER


# ------------------------------------------------------------------------------------------------ pictures


@pytest.fixture(scope="module")
def vision_server(tiny_vlm_path):
    with serve(tiny_vlm_path, default_thinking=False) as served:
        yield served


def _data_url(size=(64, 64), seed=0) -> str:
    return "data:image/png;base64," + base64.b64encode(picture_bytes(size, "PNG", seed)).decode()


def test_input_image_parts_reach_the_model(vision_server):
    client = vision_server.openai()
    plain = client.responses.create(model="x", input="what is it?", max_output_tokens=8, **GREEDY)
    small = client.responses.create(
        model="x",
        max_output_tokens=8,
        **GREEDY,
        input=[
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": _data_url((64, 64)), "detail": "auto"}, {"type": "input_text", "text": "what is it?"}],
            }
        ],
    )
    big = client.responses.create(
        model="x",
        max_output_tokens=8,
        **GREEDY,
        input=[{"role": "user", "content": [{"type": "input_image", "image_url": _data_url((192, 128))}, {"type": "input_text", "text": "what is it?"}]}],
    )
    assert small.usage.input_tokens == plain.usage.input_tokens + 4 + 2  # its image tokens and vision marks
    assert big.usage.input_tokens == plain.usage.input_tokens + 24 + 2


def test_a_picture_in_a_function_call_output(vision_server):
    """A screenshot tool's output (Codex's view_image): the picture reaches the model inside the tool's response."""
    client = vision_server.openai()
    history = [{"role": "user", "content": "Look at the screen."}, {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"}]
    tools = [{"type": "function", "name": "screenshot", "parameters": {"type": "object", "properties": {}}}]
    text = client.responses.create(
        model="x", tools=tools, max_output_tokens=8, **GREEDY, input=[*history, {"type": "function_call_output", "call_id": "call_1", "output": "no picture"}]
    )
    picture = client.responses.create(
        model="x",
        tools=tools,
        max_output_tokens=8,
        **GREEDY,
        input=[
            *history,
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": [{"type": "input_text", "text": "no picture"}, {"type": "input_image", "image_url": _data_url((64, 64))}],
            },
        ],
    )
    assert picture.usage.input_tokens == text.usage.input_tokens + 4 + 2


def test_a_picture_on_a_text_only_build_is_a_400_naming_input(tiny_server):
    with pytest.raises(openai.BadRequestError) as caught:
        tiny_server.openai().responses.create(
            model="x",
            max_output_tokens=8,
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": _data_url()}, {"type": "input_text", "text": "what?"}]}],
        )
    assert caught.value.body["param"] == "input"
