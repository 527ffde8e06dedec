"""What real Anthropic clients send (Claude Code above all), through the real `anthropic` SDK or raw HTTP where the
SDK cannot say it: beta query and headers, cache_control everywhere, thinking variants, tool_choice shapes, tool
results as blocks, history with thinking blocks, documents, long system prompts, errors as SDK exceptions."""

from __future__ import annotations

import anthropic
import httpx2
import pytest

from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from tests.fixtures.scripted import TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE, WEATHER_TOOL
from tests.server.conftest import serve

ANSWER = "".join(SCRIPT_ANSWER)
REASONING = "".join(SCRIPT_REASONING)
HELLO = [{"role": "user", "content": "Hello there"}]
GREEDY = {"extra_body": {"temperature": 0.0, "top_p": 1.0}}
EPHEMERAL = {"type": "ephemeral"}
TOOL = {
    "name": WEATHER_TOOL["function"]["name"],
    "description": WEATHER_TOOL["function"]["description"],
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}
BIG_SCHEMA_TOOL = {  # the shape of Claude Code's own tools: $schema, anyOf, arrays of objects, enums, no extra keys
    "name": "Edit",
    "description": "Edit files.",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "additionalProperties": False,
        "required": ["file_path", "edits"],
        "properties": {
            "file_path": {"type": "string", "description": "Absolute path"},
            "mode": {"type": "string", "enum": ["replace", "append"]},
            "timeout": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"old_string": {"type": "string"}, "new_string": {"type": "string"}, "replace_all": {"type": "boolean", "default": False}},
                    "required": ["old_string", "new_string"],
                },
            },
        },
    },
    "cache_control": EPHEMERAL,
}
CLAUDE_CODE_HEADERS = {
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
    "x-app": "cli",
    "anthropic-dangerous-direct-browser-access": "true",
}


def claude_code_body(**over):
    """A request as Claude Code builds it: system blocks with cache_control, metadata, tools, thinking, stream."""
    body = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": EPHEMERAL},
            {"type": "text", "text": "Be careful with files.", "cache_control": EPHEMERAL},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                    {"type": "text", "text": "Weather in Paris?", "cache_control": EPHEMERAL},
                ],
            }
        ],
        "tools": [{**TOOL, "cache_control": EPHEMERAL}, BIG_SCHEMA_TOOL],
        "metadata": {"user_id": "user_abc_account_123_session_456"},
        **GREEDY,  # this SDK has no sampling arguments any more
    }
    return {**body, **over}


def test_claude_code_streamed_request_with_beta_query_and_headers(tool_server):
    """client.beta.messages.stream sends POST /v1/messages?beta=true with the anthropic-beta header."""
    client = tool_server.anthropic(default_headers={"x-app": "cli"})
    body = claude_code_body()
    with client.beta.messages.stream(betas=["claude-code-20250219", "interleaved-thinking-2025-05-14"], **body) as stream:
        final = stream.get_final_message()
    assert final.model == tool_server.backend.model_name
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text.strip() == TOOL_PREAMBLE
    use = final.content[1]
    assert use.name == "get_weather" and use.input == TOOL_CALL_ARGUMENTS and use.id
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0


def test_claude_code_agent_loop_with_thinking_reads_only_the_new_tail(tool_server):
    """Streamed rounds as Claude Code runs them: the reply sent back whole (signed thinking, text, tool_use), then the
    tool result; each request after the first reads afresh only the previous reply and the result."""
    client = tool_server.anthropic()
    body = claude_code_body(thinking={"type": "enabled", "budget_tokens": 1024})
    body["system"] = [{**body["system"][0], "text": "You are Claude Code. " * 150}]
    messages = body.pop("messages")
    usages = []
    for round_ in range(3):
        with client.beta.messages.stream(messages=messages, betas=["interleaved-thinking-2025-05-14"], **body) as stream:
            start = next(event for event in stream if event.type == "message_start").message.usage
            final = stream.get_final_message()
        usages.append(final.usage)
        # message_start already has the split Claude Code reads there (not the whole prompt as input_tokens)
        assert (start.input_tokens, start.cache_read_input_tokens) == (final.usage.input_tokens, final.usage.cache_read_input_tokens)
        assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
        use = final.content[-1]
        messages = messages + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": f"result {round_}", "cache_control": EPHEMERAL}]},
        ]
    assert usages[0].input_tokens > 500
    for usage in usages[1:]:
        assert usage.cache_read_input_tokens > 500 and usage.input_tokens < 80


def test_raw_beta_query_string_and_headers(tool_server):
    body = {**claude_code_body(), "temperature": 0.0, "output_config": {"effort": "high"}, "context_management": {"edits": []}}
    del body["extra_body"]
    response = httpx2.post(
        f"{tool_server.url}/v1/messages?beta=true", json=body, timeout=60, headers={"anthropic-version": "2023-06-01", **CLAUDE_CODE_HEADERS}
    )
    assert response.status_code == 200, response.text
    assert response.json()["stop_reason"] == "tool_use"


def test_stream_final_message_with_thinking_then_text(tiny_server):
    with tiny_server.anthropic().messages.stream(
        model="m",
        max_tokens=64,
        messages=HELLO,
        system=[{"type": "text", "text": "Hi", "cache_control": EPHEMERAL}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        **GREEDY,
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking.strip() == REASONING and final.content[0].signature  # Claude Code drops unsigned ones
    assert final.content[1].text == ANSWER
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 0


def test_raw_stream_signs_each_thinking_block_before_it_stops(tiny_server):
    """The order Claude Code keeps: thinking_delta..., signature_delta, content_block_stop, then the text block."""
    import json

    body = {"model": "m", "max_tokens": 64, "messages": HELLO, "stream": True, "temperature": 0.0, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    with httpx2.stream("POST", f"{tiny_server.url}/v1/messages?beta=true", json=body, timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    kinds = [e["delta"]["type"] if e["type"] == "content_block_delta" else e["type"] for e in events]
    first_stop = kinds.index("content_block_stop")
    assert kinds[first_stop - 1] == "signature_delta" and kinds[first_stop - 2] == "thinking_delta"
    assert events[first_stop - 1]["delta"]["signature"] and kinds.count("signature_delta") == 1
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("message_delta") == 1 and events[-2]["delta"]["stop_reason"] == "end_turn"


@pytest.mark.parametrize(
    "thinking",
    [
        {"type": "disabled"},
        {"type": "adaptive"},
        {"type": "adaptive", "display": "summarized"},
        {"type": "enabled", "budget_tokens": 1024, "display": "summarized"},
    ],
)
def test_thinking_variants_the_sdk_types_allow(tiny_server, thinking):
    message = tiny_server.anthropic().messages.create(model="m", max_tokens=64, messages=HELLO, thinking=thinking, **GREEDY)
    assert message.content[-1].text == ANSWER


def test_thinking_between_tools_is_thinking_off(tiny_server):
    message = tiny_server.anthropic().messages.create(model="m", max_tokens=64, messages=HELLO, thinking={"type": "between_tools"}, **GREEDY)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == ANSWER


def test_thinking_display_omitted_returns_the_block_without_its_text(tiny_server):
    message = tiny_server.anthropic().messages.create(
        model="m", max_tokens=64, messages=HELLO, **GREEDY, thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"}
    )
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "" and message.content[1].text == ANSWER


@pytest.mark.parametrize("choice", [{"type": "auto"}, {"type": "auto", "disable_parallel_tool_use": False}])
def test_tool_choice_auto_shapes(tool_server, choice):
    message = tool_server.anthropic().messages.create(
        model="m", max_tokens=96, messages=[{"role": "user", "content": "Weather?"}], tools=[TOOL, BIG_SCHEMA_TOOL], tool_choice=choice, **GREEDY
    )
    assert message.stop_reason == "tool_use"
    assert next(b for b in message.content if b.type == "tool_use").input == TOOL_CALL_ARGUMENTS


@pytest.mark.parametrize(
    ("model", "choice"),
    [("scripted_forced_any_path", {"type": "any", "disable_parallel_tool_use": True}), ("scripted_forced_named_path", {"type": "tool", "name": "get_weather"})],
)
def test_forced_tool_choice_any_or_named(request, model, choice):
    """The prompt opens the call; the model writes the rest (these scripted models write just that), streamed too."""
    with serve(request.getfixturevalue(model), default_thinking=False) as served:
        args = {
            "model": "m",
            "max_tokens": 96,
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [TOOL, BIG_SCHEMA_TOOL],
            "tool_choice": choice,
            **GREEDY,
        }
        message = served.anthropic().messages.create(**args)
        with served.anthropic().messages.stream(**args) as stream:
            final = stream.get_final_message()
    for reply in (message, final):
        assert [b.type for b in reply.content] == ["tool_use"] and reply.stop_reason == "tool_use"
        assert reply.content[0].name == "get_weather" and reply.content[0].input == {"city": "Lima"}


def test_call_values_typed_by_an_optional_schema(tool_server):
    """MCP servers' schemas come from pydantic: Optional[int] is anyOf integer / null; Claude Code checks the types."""
    optional = {
        **TOOL,
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}},
        },
    }
    message = tool_server.anthropic().messages.create(model="m", max_tokens=96, messages=[{"role": "user", "content": "Weather?"}], tools=[optional], **GREEDY)
    assert message.content[-1].input == {"city": "Paris", "days": 3}


def test_tool_choice_none_offers_no_tools(tool_server):
    message = tool_server.anthropic().messages.create(
        model="m", max_tokens=96, messages=[{"role": "user", "content": "Weather?"}], tools=[TOOL], tool_choice={"type": "none"}, **GREEDY
    )
    assert all(b.type == "text" for b in message.content)


def test_history_as_claude_code_sends_it(tool_server):
    """Assistant thinking / redacted_thinking blocks with signatures, tool_use, then tool_result as a string, as text
    blocks, with is_error and cache_control; it renders and is answered."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": "EqQBCkYIBxgCKkD"},
                {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01A", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_01B", "name": "get_weather", "input": {"city": "Rome"}, "cache_control": EPHEMERAL},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "Sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01B",
                    "is_error": True,
                    "cache_control": EPHEMERAL,
                    "content": [{"type": "text", "text": "<tool_use_error>Rome is down</tool_use_error>"}, {"type": "text", "text": "retry later"}],
                },
                {"type": "text", "text": "Go on."},
            ],
        },
    ]
    client = tool_server.anthropic()
    message = client.messages.create(model="m", max_tokens=96, messages=messages, tools=[TOOL], **GREEDY)
    assert message.stop_reason == "tool_use"
    counted = client.messages.count_tokens(model="m", messages=messages, tools=[TOOL])
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_system_messages_inside_messages_are_served(tool_server):
    """Claude Code 2.1.154 on sends hook context as {"role": "system"} after the first user turn (servers that refuse
    it broke it); it is read in place, as a user turn would be (Qwen3.5's template takes a system message only first)."""
    client = tool_server.anthropic()
    hook = "<system-reminder>SessionStart hook: branch main</system-reminder>"
    messages = [{"role": "user", "content": "Weather?"}, {"role": "system", "content": [{"type": "text", "text": hook}]}]
    message = client.messages.create(model="m", max_tokens=96, messages=messages, tools=[TOOL], system="Be brief.", **GREEDY)
    assert message.stop_reason == "tool_use"
    as_user = client.messages.count_tokens(model="m", messages=[messages[0], {"role": "user", "content": hook}], tools=[TOOL], system="Be brief.")
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == as_user.input_tokens


def test_a_last_assistant_message_is_the_start_of_the_reply(tiny_server):
    """Anthropic's prefill: the reply goes on from the partial assistant turn, and holds only what follows it."""
    messages = [*HELLO, {"role": "assistant", "content": "The answer"}]
    client = tiny_server.anthropic()
    message = client.messages.create(model="m", max_tokens=64, messages=messages, **GREEDY)
    assert message.content[0].text == ANSWER.removeprefix("The answer") and message.stop_reason == "end_turn"
    with client.messages.stream(model="m", max_tokens=64, messages=messages, **GREEDY) as stream:
        assert stream.get_final_message().content[0].text == ANSWER.removeprefix("The answer")


def test_tool_search_with_deferred_tools(tool_server):
    """Claude Code behind a custom base URL defers tools (`defer_loading`) and finds them with ToolSearch, whose
    result holds `tool_reference` blocks; deferred tools are offered like the others, the reference is read as text."""
    search = {"name": "ToolSearch", "description": "Find tools.", "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}
    tools = [search, {**TOOL, "defer_loading": True}]
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_s", "name": "ToolSearch", "input": {"query": "weather"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": [{"type": "tool_reference", "tool_name": "get_weather"}]}]},
    ]
    client = tool_server.anthropic()
    message = client.messages.create(model="m", max_tokens=96, messages=messages, tools=tools, **GREEDY)
    assert message.content[-1].type == "tool_use" and message.content[-1].input == TOOL_CALL_ARGUMENTS
    plain = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_s", "content": "Tool available: get_weather"}]}]
    assert client.messages.count_tokens(model="m", messages=messages[:2] + plain, tools=tools).input_tokens == (
        message.usage.input_tokens + message.usage.cache_read_input_tokens
    )


def test_error_tool_result_is_marked_for_the_model(tool_server):
    base = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    ]
    client = tool_server.anthropic()

    def count(result):
        return client.messages.count_tokens(
            model="m", tools=[TOOL], messages=base + [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", **result}]}]
        ).input_tokens

    assert count({"content": "down", "is_error": True}) > count({"content": "down"})


def test_text_document_is_read_and_a_pdf_is_a_clear_400(tiny_server):
    client = tiny_server.anthropic()
    text_doc = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "Notes: the sky is blue."},
        "title": "notes.txt",
        "cache_control": EPHEMERAL,
    }
    plain = client.messages.count_tokens(model="m", messages=HELLO).input_tokens
    with_doc = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": [text_doc, {"type": "text", "text": "Hello there"}]}])
    assert with_doc.input_tokens > plain
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQK"}}
    with pytest.raises(anthropic.BadRequestError, match="PDF"):
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": [pdf, {"type": "text", "text": "Summarise"}]}])


def test_count_tokens_with_tools_system_and_thinking(tool_server):
    client = tool_server.anthropic()
    body = {
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [TOOL, BIG_SCHEMA_TOOL],
        "system": [{"type": "text", "text": "You are a helper.", "cache_control": EPHEMERAL}],
        "tool_choice": {"type": "auto"},
    }
    counted = client.messages.count_tokens(**body, thinking={"type": "enabled", "budget_tokens": 2048})
    bare = client.messages.count_tokens(model="m", messages=body["messages"])
    assert counted.input_tokens > bare.input_tokens + 50  # the tools and the system prompt are in the prompt


def test_a_20k_token_system_prompt_fits_the_body_limit(tiny_server):
    system = [{"type": "text", "text": "Rule: read files before editing them. " * 2500, "cache_control": EPHEMERAL}]
    assert len(system[0]["text"]) > 90_000
    counted = tiny_server.anthropic().messages.count_tokens(model="m", messages=HELLO, system=system)
    assert counted.input_tokens > 15_000


def test_max_tokens_above_the_context_room_is_clamped(tiny_dense_path):
    with serve(tiny_dense_path, context=96) as served:
        message = served.anthropic().messages.create(model="claude-opus-4", max_tokens=64_000, messages=HELLO, **GREEDY)
    assert message.content[0].text == ANSWER and message.stop_reason == "end_turn"


def test_auth_by_x_api_key_and_bearer(tiny_dense_path):
    with serve(tiny_dense_path, api_key="k3y") as served:
        for client in (served.anthropic(api_key="k3y"), anthropic.Anthropic(base_url=served.url, auth_token="k3y", max_retries=0)):
            assert client.messages.create(model="m", max_tokens=64, messages=HELLO, **GREEDY).content[0].text == ANSWER
        with pytest.raises(anthropic.AuthenticationError, match="API key"):
            served.anthropic(api_key="wrong").messages.create(model="m", max_tokens=8, messages=HELLO)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"messages": []}, "at least one message"),
        ({"messages": [{"role": "system", "content": "hi"}]}, "at least one user or assistant message"),
        ({"messages": [{"role": "tool", "content": "hi"}]}, "role 'tool'"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "video", "data": "x"}]}]}, "video"),
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"temperature": 7}, "temperature"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "structured outputs"),
        ({"thinking": {"type": "adaptive", "display": 3}}, "thinking.display"),  # a display we do not know is taken
    ],
)
def test_bad_inputs_raise_bad_request_with_our_message(tiny_server, kwargs, match):
    args = {"model": "m", "max_tokens": 8, "messages": HELLO, **kwargs}
    if "temperature" in args:
        args["extra_body"] = {"temperature": args.pop("temperature")}
    with pytest.raises(anthropic.BadRequestError, match=match) as caught:
        tiny_server.anthropic().messages.create(**args)
    assert caught.value.status_code == 400 and caught.value.body["error"]["type"] == "invalid_request_error"


def test_unknown_path_is_not_found_and_oversized_is_413(tiny_dense_path):
    with serve(tiny_dense_path, max_body_bytes=32 * 1024) as served:
        client = served.anthropic()
        with pytest.raises(anthropic.NotFoundError):
            client.get("/v1/files", cast_to=object)
        with pytest.raises(anthropic.APIStatusError, match="limit") as caught:
            client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x" * 40_000}])
        assert caught.value.status_code == 413


def test_a_full_queue_is_rate_limit_error_with_retry_after(tiny_dense_path):
    import threading
    import time

    with serve(tiny_dense_path, queue_limit=0, parallel=1) as served:  # one in the batch, none may wait
        gate = threading.Event()
        held = served.engine.submit("hold", lambda job: gate.wait(30))  # the worker is busy: requests wait
        waiting = threading.Thread(target=lambda: served.anthropic().messages.create(model="m", max_tokens=4, messages=HELLO))
        try:
            waiting.start()
            deadline = time.monotonic() + 30
            while served.backend.pending < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            with pytest.raises(anthropic.RateLimitError, match="busy") as caught:
                served.anthropic().messages.create(model="m", max_tokens=4, messages=HELLO)
            assert int(caught.value.response.headers["retry-after"]) >= 1
            assert caught.value.body["error"]["type"] == "rate_limit_error"
        finally:
            gate.set()
            waiting.join(60)
            held.wait(30)


def test_models_list_and_retrieve_through_the_anthropic_sdk(tiny_server):
    client = tiny_server.anthropic()
    page = client.models.list()
    assert page.data[0].id == tiny_server.backend.model_name and page.data[0].type == "model"
    assert page.data[0].display_name and page.data[0].created_at is not None
    assert client.models.retrieve(tiny_server.backend.model_name).id == tiny_server.backend.model_name
    with pytest.raises(anthropic.NotFoundError, match=tiny_server.backend.model_name):
        client.models.retrieve("claude-sonnet-4-5")
