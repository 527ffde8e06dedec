"""The requests the real Qwen Code (0.15.10, `qwen -p`) sent to qwen-desk serve, recorded through
tests/fixtures/agents/record_proxy.py (bench/RESULTS.md, "Real agents against qwen-desk serve"), replayed over HTTP.

first_request.json: `qwen -p "say hi"` — `POST /v1/chat/completions`, a system message, user turns whose content
is a list of text parts, 11 tools, `stream` with `stream_options.include_usage`, `max_tokens: 8000`.
memory_request.json: the memory-extraction sub-agent Qwen Code ran after that turn (another system prompt, 4 tools).
tool_request.json / tool_followup.json: `qwen -p "what is in README.txt?" --max-session-turns 2` against a model
that calls read_file; the follow-up sends the assistant turn back with `reasoning_content` and `tool_calls`
(arguments as a JSON string), and the tool's output as a list of text parts.
"""

from __future__ import annotations

import json

import pytest

from macapp.core.serving.requests import Role
from macapp.server.openai_api import parse_chat_request
from tests.fixtures.agents.tool_models import README_PATH
from tests.server.agent_replay import KEY, openai_completion, recorded, replay, served_cleanly, tool_model, wait_idle
from tests.server.conftest import serve

AGENT = "qwen_code"


def test_the_recorded_requests_read_as_qwen_code_means_them():
    first = parse_chat_request(recorded(AGENT, "first_request.json")["body"], True, "qwen")
    assert [m.role for m in first.request.messages] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.USER]
    assert first.request.messages[-1].content.endswith("say hi") and len(first.request.tools) == 11
    assert first.stream and first.include_usage and first.request.thinking  # it never says: the server's default
    followup = parse_chat_request(recorded(AGENT, "tool_followup.json")["body"], True, "qwen")
    *_, turn, output = followup.request.messages
    assert turn.role is Role.ASSISTANT and turn.reasoning and turn.content == "I will check."
    (call,) = turn.tool_calls
    assert (call.name, call.arguments) == ("read_file", {"file_path": README_PATH})
    assert output.role is Role.TOOL and output.tool_call_id == call.id and output.content == "hello from README\n"


@pytest.fixture(scope="module")
def qwen_turns(tiny_models_dir) -> dict:
    with serve(tool_model(tiny_models_dir, "qwen-code"), api_key=KEY) as served:
        turns = {name: openai_completion(replay(served, recorded(AGENT, name))) for name in ("tool_request.json", "tool_followup.json", "memory_request.json")}
        wait_idle(served)
        turns["records"] = served.activity.records()
    return turns


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_every_recorded_request_is_answered_none_refused(qwen_turns):
    assert [r.api for r in served_cleanly(qwen_turns["records"])] == ["openai"] * 3


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_tool_turn_gets_reasoning_text_and_the_call_qwen_code_runs(qwen_turns):
    (choice,) = qwen_turns["tool_request.json"].choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will check."
    assert choice.message.model_extra["reasoning_content"]  # Qwen Code sends it back on the follow-up
    (call,) = choice.message.tool_calls
    assert call.function.name == "read_file" and json.loads(call.function.arguments) == {"file_path": README_PATH}


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_follow_up_reads_its_prefix_from_the_checkpoint(qwen_turns):
    first, second = qwen_turns["tool_request.json"].usage, qwen_turns["tool_followup.json"].usage
    assert first.prompt_tokens > 10_000 and first.prompt_tokens_details.cached_tokens == 0
    assert second.prompt_tokens_details.cached_tokens >= first.prompt_tokens - 8
    assert second.prompt_tokens - second.prompt_tokens_details.cached_tokens < 200


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_memory_sub_agent_is_answered(qwen_turns):
    (choice,) = qwen_turns["memory_request.json"].choices
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "read_file"
