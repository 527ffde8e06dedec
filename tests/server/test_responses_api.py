"""The Responses wire format without a model: input items -> messages, the stream writer's events, the store."""

from __future__ import annotations

from macapp.core.events import AnswerDelta, ReasoningDelta
from macapp.core.serving.requests import (
    ChatMessage,
    Completed,
    FinishReason,
    ImagePart,
    Role,
    ToolCall,
    ToolCallFinished,
    ToolCallStarted,
    ToolChoiceMode,
    Usage,
)
from macapp.server.errors import ApiError, ErrorKind
from macapp.server.responses_api import parse_responses_request
from macapp.server.responses_output import ResponseShell, StreamWriter, response_body
from macapp.server.responses_store import ResponseStore, StoredResponse

CALL = ToolCall("call_1", "get_weather", {"city": "Paris"})


def parse_input(items: list) -> tuple[ChatMessage, ...]:
    return parse_responses_request({"input": items}, default_thinking=False).conversation


def test_a_replies_items_become_one_assistant_turn():
    messages = parse_input(
        [
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look it up."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "I will check."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": ""},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
        ]
    )
    user, assistant, first, second = messages
    assert user == ChatMessage(Role.USER, "Weather?")
    assert (assistant.content, assistant.reasoning) == ("I will check.", "Look it up.")
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [("call_1", "get_weather", {"city": "Paris"}), ("call_2", "get_time", {})]
    assert (first.role, first.tool_call_id, first.name, first.content) == (Role.TOOL, "call_1", "get_weather", "sunny")
    assert (second.name, second.content) == ("get_time", "noon")


def test_reasoning_content_wins_over_its_summary_and_encrypted_only_is_skipped():
    with_content = parse_input(
        [
            {"role": "user", "content": "Hi"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}], "content": [{"type": "reasoning_text", "text": "the whole thought"}]},
            {"role": "assistant", "content": "Hello"},
        ]
    )
    encrypted = parse_input(
        [{"role": "user", "content": "Hi"}, {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}, {"role": "assistant", "content": "Hello"}]
    )
    assert with_content[-1].reasoning == "the whole thought" and encrypted[-1].reasoning is None


def test_custom_tool_calls_and_foreign_items():
    messages = parse_input(
        [
            {"role": "user", "content": "Patch it."},
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "x"}},
            {"type": "local_shell_call", "call_id": "c2", "status": "completed", "action": {"type": "exec", "command": ["ls"]}},
        ]
    )
    assert [m.role for m in messages] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert messages[1].tool_calls == (ToolCall("c1", "apply_patch", {"input": "*** Begin Patch"}),)
    assert messages[2].name == "apply_patch"


def test_previous_conversation_goes_first_and_instructions_do_not_carry_over():
    previous = (ChatMessage(Role.USER, "Weather?"), ChatMessage(Role.ASSISTANT, "", tool_calls=(CALL,)))
    call = parse_responses_request(
        {"instructions": "Be brief.", "input": [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]},
        default_thinking=False,
        previous=previous,
    )
    assert [m.role for m in call.request.messages] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL]
    assert call.request.messages[-1].name == "get_weather"
    assert call.conversation == call.request.messages[1:]  # what a later continuation starts from


def test_effort_and_tool_choice_mapping():
    body = {
        "input": "Hi",
        "reasoning": {"effort": "low"},
        "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "f"},
        "parallel_tool_calls": False,
    }
    request = parse_responses_request(body, default_thinking=False).request
    assert request.thinking and request.thinking_budget == 2048
    assert (request.tool_choice.mode, request.tool_choice.name, request.tool_choice.parallel) == (ToolChoiceMode.FUNCTION, "f", False)
    assert [t.name for t in request.tools] == ["f"]
    high = parse_responses_request({"input": "Hi", "reasoning": {"effort": "high"}}, default_thinking=False).request
    assert high.thinking and high.thinking_budget is None


def _done(**kw) -> Completed:
    values = dict(text="Hi", reasoning="", tool_calls=(), finish_reason=FinishReason.STOP, usage=Usage(100, 90, 5), model="tiny")
    return Completed(**{**values, **kw})


def test_stream_writer_items_match_the_final_response():
    writer = StreamWriter(ResponseShell("tiny", {}))
    events = writer.start()
    for event in [
        ReasoningDelta("Hmm"),
        ReasoningDelta("."),
        AnswerDelta("I will"),
        AnswerDelta(" check."),
        ToolCallStarted(0, "call_1", "get_weather"),
        ToolCallFinished(0, CALL),
        _done(text="I will check.", reasoning="Hmm.", tool_calls=(CALL,), finish_reason=FinishReason.TOOL_CALLS, usage=Usage(100, 90, 5, reasoning_tokens=2)),
    ]:
        events += writer.events(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]
    assert final["type"] == "response.completed"
    done_items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done_items == final["response"]["output"]
    assert [i["type"] for i in done_items] == ["reasoning", "message", "function_call"]
    assert done_items[0]["summary"][0]["text"] == "Hmm." and done_items[1]["content"][0]["text"] == "I will check."
    assert done_items[2]["arguments"] == '{"city": "Paris"}' and done_items[2]["call_id"] == "call_1"
    usage = final["response"]["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] == 90 and usage["output_tokens_details"]["reasoning_tokens"] == 2


def test_stream_writer_failure_and_empty_reply():
    writer = StreamWriter(ResponseShell("tiny", {}))
    events = writer.events(AnswerDelta("Hal")) + writer.failed(ApiError(ErrorKind.SERVER, "boom", code="error"))
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["error"] == {"code": "error", "message": "boom"}
    assert events[-2]["type"] == "response.output_item.done" and events[-2]["item"]["status"] == "incomplete"
    empty = StreamWriter(ResponseShell("tiny", {}))
    out = empty.events(_done(text=""))
    assert [i["type"] for i in out[-1]["response"]["output"]] == ["message"]


def test_length_is_incomplete_in_both_forms():
    body = response_body(ResponseShell("tiny", {}), _done(finish_reason=FinishReason.LENGTH))
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    writer = StreamWriter(ResponseShell("tiny", {}))
    events = writer.events(AnswerDelta("Hi")) + writer.events(_done(finish_reason=FinishReason.LENGTH))
    assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["output"][0]["status"] == "incomplete"


def test_the_store_is_bounded_in_count_and_bytes():
    store = ResponseStore(max_responses=2, max_bytes=10**9)
    for i in range(3):
        store.put(StoredResponse(f"r{i}", (ChatMessage(Role.USER, "x"),), {}))
    assert store.get("r0") is None and store.get("r1") is not None and len(store) == 2
    store.put(StoredResponse("r3", (), {}))  # r1 was just used: r2 goes
    assert store.get("r2") is None and store.get("r1") is not None
    small = ResponseStore(max_responses=100, max_bytes=50_000)
    picture = ChatMessage(Role.USER, "", images=(ImagePart(b"x" * 20_000),))
    small.put(StoredResponse("a", (picture,), {}))
    small.put(StoredResponse("b", (picture,), {}))
    assert small.get("a") is None and small.get("b") is not None
