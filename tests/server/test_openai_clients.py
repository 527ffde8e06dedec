"""What real OpenAI-compatible clients send (editors, Open WebUI, Continue, Cline, Aider, LiteLLM, the Agents SDK),
through the real `openai` SDK and its stream helpers: the developer role, max_completion_tokens, options sent at
their defaults, tools with strict schemas, history with null content, tool results as parts, errors as SDK
exceptions."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest

from macapp.core.demo.tiny_model import SCRIPT_ANSWER
from tests.fixtures.scripted import (
    TIME_TOOL,
    TOOL_CALL_ARGUMENTS,
    TOOL_PREAMBLE,
    WEATHER_TOOL,
)
from tests.server.conftest import GREEDY, serve

ANSWER = "".join(SCRIPT_ANSWER)
HELLO = [{"role": "user", "content": "Hello there"}]
NO_THINK = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
STRICT_TOOL = {
    "type": "function",
    "function": {
        **WEATHER_TOOL["function"],
        "strict": True,
        "parameters": {**WEATHER_TOOL["function"]["parameters"], "additionalProperties": False, "required": ["city", "days"]},
    },
}


class GetWeather(pydantic.BaseModel):
    """The weather forecast for a city."""

    city: str
    days: int


def test_developer_role_is_the_system_prompt(tiny_server):
    client = tiny_server.openai()
    as_system = client.chat.completions.create(model="gpt-5", messages=[{"role": "system", "content": "Be brief."}, *HELLO], max_tokens=8, **GREEDY)
    as_developer = client.chat.completions.create(model="gpt-5", messages=[{"role": "developer", "content": "Be brief."}, *HELLO], max_tokens=8, **GREEDY)
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content


def test_system_and_developer_together_and_a_late_developer_message(tiny_server):
    """Qwen3.5's template takes one system message, first: leading ones are joined, a late one is read in place."""
    client = tiny_server.openai()
    joined = [{"role": "system", "content": "Be brief.\n\nAnswer in French."}, *HELLO]
    pair = [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Answer in French."}, *HELLO]
    late = [{"role": "system", "content": "Be brief."}, *HELLO, {"role": "developer", "content": "Answer in French."}]
    usage = [client.chat.completions.create(model="x", messages=m, max_tokens=4, **GREEDY).usage.prompt_tokens for m in (joined, pair, late)]
    assert usage[0] == usage[1] and usage[2] > 0


def test_options_clients_send_at_their_defaults(tiny_server):
    """What LiteLLM / Open WebUI / the Agents SDK put in every request: accepted, the reply unchanged."""
    reply = tiny_server.openai().chat.completions.create(
        model="qwen",
        messages=[{"role": "developer", "content": [{"type": "text", "text": "Be helpful."}]}, *HELLO],
        max_completion_tokens=64,
        n=1,
        logprobs=False,
        response_format={"type": "text"},
        user="someone",
        seed=7,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        stop="\n\n\n",
        parallel_tool_calls=True,
        stream=False,
        store=False,
        metadata={"app": "x"},
        service_tier="auto",
        top_logprobs=None,
        **GREEDY,
        **NO_THINK,
    )
    assert reply.choices[0].message.content == ANSWER and reply.choices[0].finish_reason == "stop"


def test_frequency_penalty_is_passed_on_and_range_checked(tiny_server):
    """Mapped to mlx-lm's frequency penalty (tests/core/test_sampling.py shows it in the logits); the tiny model's
    script repeats no token, so its reply stays the same."""
    client = tiny_server.openai()
    reply = client.chat.completions.create(model="x", messages=HELLO, max_tokens=24, frequency_penalty=1.0, **GREEDY, **NO_THINK)
    assert reply.choices[0].message.content == ANSWER
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        client.chat.completions.create(model="x", messages=HELLO, max_tokens=4, frequency_penalty=3.5)


def test_logprobs_true_is_refused_clearly(tiny_server):
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        tiny_server.openai().chat.completions.create(model="x", messages=HELLO, max_tokens=4, logprobs=True, top_logprobs=2)


@pytest.mark.parametrize("stop", ["!", [" is", "nothing"]])
def test_stop_as_string_or_list(tiny_server, stop):
    reply = tiny_server.openai().chat.completions.create(model="x", messages=HELLO, max_tokens=64, stop=stop, **GREEDY, **NO_THINK)
    assert reply.choices[0].message.content in ("The answer is here", "The answer")


def test_stream_helper_with_reasoning_keeps_it_out_of_content(tiny_server):
    from macapp.core.demo.tiny_model import SCRIPT_REASONING

    with tiny_server.openai().chat.completions.stream(model="x", messages=HELLO, max_tokens=64, **GREEDY) as stream:
        reasoning = "".join(
            (e.chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for e in stream if e.type == "chunk" and e.chunk.choices
        )
        final = stream.get_final_completion()
    assert final.choices[0].message.content == ANSWER and reasoning.strip() == "".join(SCRIPT_REASONING)


def test_stream_helper_accumulates_the_tool_call(tool_server):
    """client.chat.completions.stream (Agents SDK, LiteLLM): the final message holds the call with valid JSON."""
    with tool_server.openai().chat.completions.stream(
        model="gpt-4.1",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[STRICT_TOOL],
        tool_choice="auto",
        parallel_tool_calls=False,
        stream_options={"include_usage": True},
        max_completion_tokens=96,
        **GREEDY,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in kinds
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls" and message.content.strip() == TOOL_PREAMBLE
    (call,) = message.tool_calls
    assert json.loads(call.function.arguments) == TOOL_CALL_ARGUMENTS
    assert call.function.parsed_arguments == TOOL_CALL_ARGUMENTS  # strict tools are parsed by the helper
    assert final.usage.completion_tokens > 0 and final.model == tool_server.backend.model_name


def test_stream_helper_with_a_pydantic_tool_parses_the_arguments(tool_server):
    with tool_server.openai().chat.completions.stream(
        model="x",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
        max_tokens=96,
        **GREEDY,
    ) as stream:
        final = stream.get_final_completion()
    parsed = final.choices[0].message.tool_calls[0].function.parsed_arguments
    assert parsed == GetWeather(city="Paris", days=3)


def test_parse_with_a_pydantic_tool(tool_server):
    completion = tool_server.openai().chat.completions.parse(
        model="x",
        messages=[{"role": "user", "content": "Weather?"}],
        max_tokens=96,
        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
        **GREEDY,
    )
    assert completion.choices[0].message.tool_calls[0].function.parsed_arguments == GetWeather(city="Paris", days=3)


@pytest.mark.parametrize(
    ("model", "choice"), [("scripted_forced_any_path", "required"), ("scripted_forced_named_path", {"type": "function", "function": {"name": "get_weather"}})]
)
def test_forced_tool_choice_required_or_named(request, model, choice):
    """The prompt opens the call; the model writes the rest (these scripted models write just that), streamed too."""
    with serve(request.getfixturevalue(model), default_thinking=False) as served:
        args = {
            "model": "x",
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [STRICT_TOOL, TIME_TOOL],
            "tool_choice": choice,
            "max_tokens": 96,
            **GREEDY,
        }
        reply = served.openai().chat.completions.create(**args)
        with served.openai().chat.completions.stream(**args) as stream:
            final = stream.get_final_completion()
    for completion in (reply, final):
        choice_ = completion.choices[0]
        assert choice_.finish_reason == "tool_calls" and not choice_.message.content
        (call,) = choice_.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Lima"}


def test_allowed_tools_offers_only_those(tool_server):
    client = tool_server.openai()
    args = {"model": "x", "messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 96, **GREEDY}
    both = client.chat.completions.create(**args, tools=[STRICT_TOOL, TIME_TOOL])
    only_time = client.chat.completions.create(
        **args,
        tools=[STRICT_TOOL, TIME_TOOL],
        tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "get_time"}}]}},
    )
    alone = client.chat.completions.create(**args, tools=[TIME_TOOL])
    assert only_time.usage.prompt_tokens == alone.usage.prompt_tokens < both.usage.prompt_tokens


def test_history_with_null_content_and_tool_results_as_parts(tool_server):
    messages = [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}},
                {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": ", 21 C"}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
    ]
    reply = tool_server.openai().chat.completions.create(model="x", messages=messages, tools=[STRICT_TOOL], max_tokens=96, **GREEDY)
    assert reply.choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_gives_at_most_one_call(scripted_two_calls_path):
    with serve(scripted_two_calls_path, default_thinking=False) as served:
        client = served.openai()
        args = {"model": "x", "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER_TOOL, TIME_TOOL], "max_tokens": 96, **GREEDY}
        assert len(client.chat.completions.create(**args).choices[0].message.tool_calls) == 3
        single = client.chat.completions.create(**args, parallel_tool_calls=False)
        assert single.choices[0].finish_reason == "tool_calls"
        assert [c.function.name for c in single.choices[0].message.tool_calls] == ["get_weather"]
        with served.openai().chat.completions.stream(**args, parallel_tool_calls=False) as stream:
            final = stream.get_final_completion()
        assert len(final.choices[0].message.tool_calls) == 1 and final.choices[0].finish_reason == "tool_calls"
        message = served.anthropic().messages.create(
            model="m",
            max_tokens=96,
            messages=[{"role": "user", "content": "Weather?"}],
            extra_body={"temperature": 0.0},
            tools=[{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in (WEATHER_TOOL, TIME_TOOL)],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        )
        assert [b.name for b in message.content if b.type == "tool_use"] == ["get_weather"] and message.stop_reason == "tool_use"


def test_models_list_shape_and_retrieve(tiny_server):
    client = tiny_server.openai()
    page = client.models.list()
    assert page.object == "list"
    first = page.data[0]
    assert (first.id, first.object, first.owned_by) == (tiny_server.backend.model_name, "model", "qwen-desk")
    assert isinstance(first.created, int) and first.created > 0
    assert client.models.retrieve(first.id).id == first.id
    with pytest.raises(openai.NotFoundError, match=first.id):  # the message says which model answers instead
        client.models.retrieve("gpt-4o")
    with pytest.raises(openai.NotFoundError, match="'org/some-model'"):  # the SDK sends the slash as %2F
        client.models.retrieve("org/some-model")


def test_the_reply_names_the_model_that_answered(tiny_server):
    reply = tiny_server.openai().chat.completions.create(model="some-unknown-model", messages=HELLO, max_tokens=4, **GREEDY)
    assert reply.model == tiny_server.backend.model_name
    stream = tiny_server.openai().chat.completions.create(model="another", messages=HELLO, max_tokens=4, stream=True, **GREEDY)
    assert {chunk.model for chunk in stream} == {tiny_server.backend.model_name}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"messages": []}, "at least one message"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "wizard"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"n": 2}, "n > 1"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "a"}}], "tool_choice": {"type": "function", "function": {"name": "b"}}}, "'b'"),
        ({"temperature": 9}, "temperature"),
        ({"functions": [{"name": "f", "parameters": {}}], "function_call": "auto"}, "deprecated"),
        (
            {
                "tools": [STRICT_TOOL],
                "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "nope"}}]}},
            },
            "'nope'",
        ),
        ({"tools": [STRICT_TOOL], "tool_choice": {"type": "custom", "custom": {"name": "get_weather"}}}, "custom"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, "input_audio"),
    ],
)
def test_bad_inputs_raise_bad_request_with_our_message(tiny_server, kwargs, match):
    args = {"model": "x", "messages": HELLO, "max_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError, match=match) as caught:
        tiny_server.openai().chat.completions.create(**args)
    assert caught.value.status_code == 400 and caught.value.type == "invalid_request_error"


def test_auth_not_found_and_too_large_exceptions(tiny_dense_path):
    with serve(tiny_dense_path, api_key="k3y", max_body_bytes=32 * 1024) as served:
        assert served.openai(api_key="k3y").chat.completions.create(model="x", messages=HELLO, max_tokens=4).choices
        with pytest.raises(openai.AuthenticationError, match="API key") as caught:
            served.openai(api_key="nope").chat.completions.create(model="x", messages=HELLO, max_tokens=4)
        assert caught.value.code == "invalid_api_key"
        with pytest.raises(openai.NotFoundError, match="/v1/chat/completions"):
            served.openai(api_key="k3y").completions.create(model="x", prompt="hi", max_tokens=4)
        with pytest.raises(openai.APIStatusError, match="limit") as caught:
            served.openai(api_key="k3y").chat.completions.create(model="x", messages=[{"role": "user", "content": "x" * 40_000}], max_tokens=4)
        assert caught.value.status_code == 413
    # RateLimitError (429 with Retry-After): tests/server/test_http_load.py::test_full_queue_is_429_with_retry_after
