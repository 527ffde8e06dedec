"""The requests the real opencode (1.18.33, `opencode run`, a custom provider on `@ai-sdk/openai-compatible`) sent to
qwen-desk serve, recorded through tests/fixtures/agents/record_proxy.py (bench/RESULTS.md, "Real agents against
qwen-desk serve"), replayed over HTTP.

title_request.json: the title generator opencode runs beside each new session (no tools, `max_tokens: 32000`).
first_request.json: `opencode run "say hi"` — a system message, the user's text, 10 tools, `tool_choice: auto`,
`stream` with `stream_options.include_usage`. tool_request.json / tool_followup.json: "what is in README.txt?"
against a model that calls `read`; the follow-up sends `reasoning_content` and `tool_calls` back, the output as a
string. max_steps_followup.json: with `agent.build.steps: 2`, opencode's last step ends the messages with an
*assistant* message telling the model that tools are off (read as a finished turn, then the reply starts anew).
"""

from __future__ import annotations

import json

import pytest

from macapp.core.serving.requests import Role
from macapp.server.openai_api import parse_chat_request
from tests.fixtures.agents.tool_models import README_PATH
from tests.server.agent_replay import KEY, openai_completion, recorded, replay, served_cleanly, tool_model, wait_idle
from tests.server.conftest import serve

AGENT = "opencode"
REPLAYED = ("title_request.json", "tool_request.json", "tool_followup.json", "max_steps_followup.json")


def test_the_recorded_requests_read_as_opencode_means_them():
    first = parse_chat_request(recorded(AGENT, "first_request.json")["body"], True, "opencode")
    assert [m.role for m in first.request.messages] == [Role.SYSTEM, Role.USER] and len(first.request.tools) == 10
    assert first.stream and first.include_usage
    title = parse_chat_request(recorded(AGENT, "title_request.json")["body"], True, "opencode")
    assert [m.role for m in title.request.messages] == [Role.SYSTEM, Role.USER, Role.USER] and not title.request.tools
    last = parse_chat_request(recorded(AGENT, "max_steps_followup.json")["body"], True, "opencode").request.messages[-1]
    assert last.role is Role.ASSISTANT and last.content.startswith("CRITICAL - MAXIMUM STEPS REACHED")


@pytest.fixture(scope="module")
def opencode_turns(tiny_models_dir) -> dict:
    with serve(tool_model(tiny_models_dir, "opencode"), api_key=KEY) as served:
        turns = {name: openai_completion(replay(served, recorded(AGENT, name))) for name in REPLAYED}
        wait_idle(served)
        turns["records"] = served.activity.records()
    return turns


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_every_recorded_request_is_answered_none_refused(opencode_turns):
    assert [r.api for r in served_cleanly(opencode_turns["records"])] == ["openai"] * len(REPLAYED)


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_title_request_gets_text(opencode_turns):
    (choice,) = opencode_turns["title_request.json"].choices
    assert choice.finish_reason == "stop" and choice.message.content and not choice.message.tool_calls


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_tool_turn_gets_the_call_opencode_runs(opencode_turns):
    (choice,) = opencode_turns["tool_request.json"].choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "I will check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "read" and json.loads(call.function.arguments) == {"filePath": README_PATH}


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_follow_ups_read_their_prefix_from_the_checkpoint(opencode_turns):
    first = opencode_turns["tool_request.json"].usage
    for name in ("tool_followup.json", "max_steps_followup.json"):
        usage = opencode_turns[name].usage
        assert usage.prompt_tokens_details.cached_tokens >= first.prompt_tokens - 8, name
        assert usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens < 800, name
        assert opencode_turns[name].choices[0].finish_reason in ("stop", "tool_calls")
