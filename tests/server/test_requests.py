"""The typed request models (macapp/server/requests): how a refused value is named, what the models take that
the hand-written readers took, and inputs that used to crash the readers (a TypeError, an OverflowError, a
RecursionError: 500s) and are now 400s naming the field."""

from __future__ import annotations

import logging
import uuid
from typing import Annotated, Any

import pytest
from pydantic import ValidationError

from macapp.core.serving.requests import Role, ToolChoiceMode
from macapp.server.anthropic_api import parse_messages_request
from macapp.server.errors import ApiError
from macapp.server.openai_api import parse_chat_request
from macapp.server.requests.anthropic_messages import MessagesBody
from macapp.server.requests.common import Model, string_or_parts
from macapp.server.requests.openai_chat import ChatCompletionBody
from macapp.server.requests.reading import param_of, refusal_of
from macapp.server.requests.responses_body import ResponsesBody
from macapp.server.responses_api import parse_responses_request

HELLO = [{"role": "user", "content": "hi"}]
PARSERS = {
    "openai": lambda body: parse_chat_request({"messages": HELLO, **body}, True, "t"),
    "anthropic": lambda body: parse_messages_request({"max_tokens": 8, "messages": HELLO, **body}, "t"),
    "responses": lambda body: parse_responses_request({"input": HELLO, **body}, True, "t"),
}


def refused(api: str, body: dict) -> ApiError:
    with pytest.raises(ApiError) as info:
        PARSERS[api](body)
    assert info.value.status == 400
    return info.value


def first_error(model, body: dict) -> dict:
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return info.value.errors(include_url=False)[0]


def test_a_unions_tag_is_left_out_of_the_field_name():
    error = first_error(ChatCompletionBody, {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})
    assert any(str(part).startswith("~") for part in error["loc"])  # pydantic's location holds the union's tag
    assert param_of(error["loc"]) == "messages[0].content[0].text"
    assert refusal_of(error).message == "messages[0].content[0].text must be a string."


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"messages": HELLO, "stream": "yes"}, "stream", "stream must be true or false."),
        ({"messages": HELLO, "tools": {}}, "tools", "tools must be an array."),
        ({"messages": HELLO, "tools": [{"type": "function"}]}, "tools[0].function", "tools[0].function is required."),
        ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": None}}]}, "tools[0].function.name", "tools[0].function.name is required."),
        ({"messages": HELLO, "tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type", "tools[0].type 'retrieval' is not 'function'."),
        ({"messages": HELLO, "stream_options": []}, "stream_options", "stream_options must be an object."),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "messages[0].content must be a string or an array of content parts."),
    ],
)
def test_each_kind_of_error_reads_as_a_sentence_naming_the_field(body, param, message):
    error = refusal_of(first_error(ChatCompletionBody, body))
    assert (error.param, error.message) == (param, message)


@pytest.mark.parametrize(
    ("api", "body", "param"),
    [
        ("openai", {"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
        ("anthropic", {"messages": [{"role": {"x": 1}, "content": "hi"}]}, "messages[0].role"),
        ("responses", {"input": [{"role": ["user"], "content": "hi"}]}, "input[0].role"),
        ("anthropic", {"tool_choice": {"type": ["auto"]}}, "tool_choice.type"),
        ("responses", {"tool_choice": {"type": ["function"]}}, "tool_choice.type"),
        ("anthropic", {"messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]}, "messages[0].content[0].type"),
    ],
)
def test_a_list_or_object_where_a_name_goes_is_a_400(api, body, param):
    """The readers looked such values up in dicts: TypeError (unhashable), a 500."""
    assert refused(api, body).param == param


def test_an_integer_too_large_for_a_float_is_a_400():
    """math.isfinite(10**400) raises OverflowError: the reader answered 500."""
    assert refused("openai", {"temperature": 10**400}).param == "temperature"
    assert refused("responses", {"top_p": -(10**400)}).param == "top_p"


@pytest.mark.parametrize(
    ("arguments", "words"),
    [("[" * 5000 + "]" * 5000, "too deeply"), ("[" * 200 + "]" * 200, "too deeply"), ('{"path": "\\ud800"}', "lone UTF-16 surrogate")],
)
def test_a_calls_arguments_string_is_held_to_the_bodys_limits(arguments, words):
    """The JSON inside a string is read here: 5000 levels was a RecursionError, a lone surrogate reached the tokenizer."""
    history = [*HELLO, {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": arguments}}]}]
    error = refused("openai", {"messages": history})
    assert error.param == "messages[1].tool_calls[0].function.arguments" and words in error.message
    item = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": arguments}
    assert refused("responses", {"input": [*HELLO, item]}).param == "input[1].arguments"


def test_whole_floats_are_integers_and_numbers_are_not_strings_or_booleans():
    assert PARSERS["openai"]({"max_tokens": 5.0, "seed": 7.0}).request.sampling.max_tokens == 5
    assert PARSERS["anthropic"]({"max_tokens": 12.0}).request.sampling.max_tokens == 12
    for value in ("5", True, 5.5):
        assert refused("openai", {"max_tokens": value}).message == "max_tokens must be an integer."
    assert refused("anthropic", {"temperature": True}).message == "temperature must be a number."
    assert refused("responses", {"store": 1}).message == "store must be true or false."


def test_null_is_the_same_as_absent_for_optional_fields():
    nulls = {
        key: None
        for key in (
            "model",
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "stop",
            "tools",
            "tool_choice",
            "stream",
            "stream_options",
            "logit_bias",
            "response_format",
            "n",
        )
    }
    call = PARSERS["openai"](nulls)
    assert call.request.stop == () and call.request.tools == () and not call.stream
    assert PARSERS["anthropic"]({"system": None, "thinking": None, "tools": None, "stop_sequences": None}).request.thinking is False
    assert PARSERS["responses"]({"instructions": None, "reasoning": None, "metadata": None}).echo["metadata"] == {}


def test_unknown_fields_are_accepted_at_every_level_and_logged_once_at_the_top(caplog):
    unknown = f"field_{uuid.uuid4().hex[:8]}"  # the log remembers names for the whole process
    body = {
        "model": "m",
        "max_tokens": 8,
        "context_management": {"edits": []},
        unknown: {"any": ["thing"]},
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}, "citations": None}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}], "id": "x"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {}, "defer_loading": True}],
    }
    with caplog.at_level(logging.INFO, logger="macapp.server.fields"):
        for _ in range(2):
            call = parse_messages_request(body)
    assert [m.role for m in call.request.messages] == [Role.SYSTEM, Role.USER] and call.request.tools[0].name == "f"
    logged = [r.getMessage() for r in caplog.records if "accepted and ignored" in r.getMessage()]
    assert sum(f"'{unknown}'" in m for m in logged) == 1
    assert not any("'model'" in m or "'system'" in m for m in logged)  # declared fields are not "ignored"


def test_the_models_declare_every_field_the_apis_read():
    """What a model declares is what the server uses; the rest is logged as ignored (reading.read)."""
    assert {"messages", "tools", "tool_choice", "logit_bias", "seed", "stream_options", "chat_template_kwargs"} <= set(ChatCompletionBody.model_fields)
    assert {"messages", "system", "thinking", "output_config", "stop_sequences"} <= set(MessagesBody.model_fields)
    assert {"input", "instructions", "previous_response_id", "reasoning", "text", "store", "truncation"} <= set(ResponsesBody.model_fields)
    assert "metadata" not in MessagesBody.model_fields and "service_tier" not in ResponsesBody.model_fields


def test_the_responses_echo_repeats_tools_and_tool_choice_as_sent():
    tools = [{"type": "function", "name": "f", "strict": True, "parameters": {"type": "object"}}, {"type": "web_search", "x": 1}]
    call = PARSERS["responses"]({"tools": tools, "tool_choice": {"type": "function", "name": "f"}, "user": 5})
    assert call.echo["tools"] == tools and call.echo["tool_choice"] == {"type": "function", "name": "f"}
    assert call.echo["user"] is None and [t.name for t in call.request.tools] == ["f"]
    assert call.request.tool_choice.mode is ToolChoiceMode.FUNCTION


class _Parts(Model):
    content: Annotated[list[dict[str, Any]], string_or_parts("input_text", "{param} must be text or parts.")] = []


def test_string_or_parts_makes_a_string_one_part_of_its_type_and_refuses_other_values_with_its_message():
    assert _Parts.model_validate({"content": None}).content == []
    assert _Parts.model_validate({"content": "hi"}).content == [{"type": "input_text", "text": "hi"}]
    parts = [{"type": "input_image", "image_url": "x"}, {"type": "input_text", "text": "a"}]
    assert _Parts.model_validate({"content": parts}).content == parts
    error = first_error(_Parts, {"content": 5})
    assert refusal_of(error).message == "content must be text or parts." and param_of(error["loc"]) == "content"
