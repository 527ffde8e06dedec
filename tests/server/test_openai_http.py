"""The real `openai` SDK against the real server running tiny models: replies, streams, thinking, tools, usage."""

from __future__ import annotations

import json

import pytest

from macapp.core.demo.tiny_model import SCRIPT_ANSWER, SCRIPT_REASONING
from tests.fixtures.scripted import TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE, WEATHER_TOOL
from tests.server.conftest import GREEDY

ANSWER = "".join(SCRIPT_ANSWER)
REASONING = "".join(SCRIPT_REASONING)
HELLO = [{"role": "user", "content": "Hello there"}]


def test_plain_reply_with_thinking_keeps_reasoning_out_of_content(tiny_server):
    reply = tiny_server.openai().chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=64, **GREEDY)
    message = reply.choices[0].message
    assert message.content == ANSWER
    assert message.model_extra["reasoning_content"].strip() == REASONING
    assert "<think>" not in message.content and REASONING not in message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == tiny_server.backend.model_name != "gpt-4o"  # served by the loaded model, and says so
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_thinking_off_by_template_kwargs_or_reasoning_effort(tiny_server):
    client = tiny_server.openai()
    for extra in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        reply = client.chat.completions.create(model="x", messages=HELLO, max_tokens=64, extra_body=extra, **GREEDY)
        message = reply.choices[0].message
        assert message.content == ANSWER
        assert not (message.model_extra or {}).get("reasoning_content")


def test_streamed_reply_ends_with_done_and_usage(tiny_server):
    stream = tiny_server.openai().chat.completions.create(
        model="x",
        messages=HELLO,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    content, reasoning, finish, usage = "", "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            finish = choice.finish_reason or finish
    assert content == ANSWER and reasoning.strip() == REASONING and finish == "stop"
    assert usage is not None and usage.completion_tokens > 0
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_raw_stream_is_sse_with_a_final_done(tiny_server):
    import httpx2

    body = {"model": "x", "messages": HELLO, "max_tokens": 16, "stream": True, **GREEDY}
    with httpx2.stream("POST", f"{tiny_server.url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_tool_call_out_then_history_with_the_call_and_its_result_back_in(tool_server):
    client = tool_server.openai()
    messages = [{"role": "user", "content": "Weather in Paris for three days?"}]
    reply = client.chat.completions.create(model="x", messages=messages, tools=[WEATHER_TOOL], max_tokens=96, **GREEDY)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content.strip() == TOOL_PREAMBLE
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == TOOL_CALL_ARGUMENTS  # "days" typed as an integer by the schema
    messages += [choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
    again = client.chat.completions.create(model="x", messages=messages, tools=[WEATHER_TOOL], max_tokens=96, **GREEDY)
    assert again.choices[0].finish_reason == "tool_calls"  # the scripted model always calls; the history rendered fine
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the first request's prompt was reused


def test_streamed_tool_call_deltas(tool_server):
    stream = tool_server.openai().chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER_TOOL],
        max_tokens=96,
        stream=True,
        **GREEDY,
    )
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                entry["id"] = delta.id or entry["id"]
                if delta.function is not None:
                    entry["name"] = delta.function.name or entry["name"]
                    entry["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls" and content.strip() == TOOL_PREAMBLE
    assert "<tool_call>" not in content
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(calls[0]["arguments"]) == TOOL_CALL_ARGUMENTS


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_agent_loop_reads_only_the_new_tail(tool_server, streamed):
    """Long system prompt + tools, then call / result rounds: every request after the first reuses the prompt
    (streamed: the usage chunk of stream_options.include_usage says so too)."""
    client = tool_server.openai()
    system = ("You are a careful assistant. " if not streamed else "You are a streaming assistant. ") * 60
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Plan a trip to Paris."}]
    usages = []
    for round_ in range(3):
        ask = dict(model="x", messages=messages, tools=[WEATHER_TOOL], max_tokens=96, **GREEDY)
        if streamed:
            with client.chat.completions.stream(stream_options={"include_usage": True}, **ask) as stream:
                reply = stream.get_final_completion()
        else:
            reply = client.chat.completions.create(**ask)
        usages.append(reply.usage)
        call = reply.choices[0].message.tool_calls[0]
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": f"result {round_}: sunny"}]
    first, *later = usages
    assert first.prompt_tokens > 200
    for previous, usage in zip(usages, later):
        fresh = usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens
        assert usage.prompt_tokens_details.cached_tokens >= previous.prompt_tokens - 8  # the whole last prompt, about
        assert fresh < 80  # only the last reply as rendered and the new tool result


def test_models_lists_the_loaded_model_first(tiny_server):
    models = tiny_server.openai().models.list()
    assert models.data[0].id == tiny_server.backend.model_name


def test_health(tiny_server):
    import httpx2

    response = httpx2.get(f"{tiny_server.url}/health", timeout=10)
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_stop_sequence_cuts_the_answer(tiny_server):
    reply = tiny_server.openai().chat.completions.create(
        model="x", messages=HELLO, max_tokens=64, stop=[" is"], extra_body={"reasoning_effort": "none"}, **GREEDY
    )
    assert reply.choices[0].message.content == "The answer" and reply.choices[0].finish_reason == "stop"


def test_models_lists_downloaded_models_after_the_loaded_one(tiny_server, hub_server):
    from huggingface_hub import snapshot_download

    from macapp.core.download import hfcache
    from macapp.core.hub.settings import hub_cache_dir
    from tests.fixtures.hub import random_repo_files

    repo = "mlx-community/Qwen3.5-0.8B-4bit"
    hub_server.add_repo(repo, random_repo_files(shards=1, shard_bytes=1000))
    snapshot_download(repo, endpoint=hub_server.url, cache_dir=hub_cache_dir(), allow_patterns=hfcache.NEEDED_PATTERNS)
    ids = [m.id for m in tiny_server.openai().models.list().data]
    assert ids[0] == tiny_server.backend.model_name and repo in ids


def test_seed_makes_a_sampled_reply_repeatable(tiny_server):
    from tests.server.conftest import no_eos_bias

    def sample(seed: int) -> str:
        reply = tiny_server.openai().chat.completions.create(
            model="x",
            messages=HELLO,
            max_tokens=24,
            temperature=1.0,
            top_p=1.0,
            seed=seed,
            logit_bias=no_eos_bias(tiny_server),
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
        return reply.choices[0].message.content

    first = sample(7)
    assert sample(7) == first and len(first) > 10
    assert sample(8) != first
