"""The requests the real Claude Code (2.1.197, `claude -p`) sent to qwen-desk serve, recorded through
tests/fixtures/agents/record_proxy.py (bench/RESULTS.md, "Real agents against qwen-desk serve"), replayed over HTTP.

warm_up.json: the keyless `HEAD /` Claude Code sends before a session (it was a 404, logged as refused).
first_request.json: `claude -p "say hi"` — `POST /v1/messages?beta=true`, 24 tools, a system prompt of three
blocks with cache_control, a `system` message inside `messages` (the mid-conversation-system beta),
`thinking: adaptive`, `context_management`, `output_config.effort`, `metadata.user_id`, `stream`.
tool_request.json / tool_followup.json: `claude -p "what is in README.txt?" --max-turns 2` against a model that
calls Read; the follow-up sends back the thinking block (signature included), the text, the tool_use and its
tool_result. tool_followup_other_model.json: the same follow-up when ANTHROPIC_MODEL named another model than
the reply did: Claude Code then leaves the thinking block out (it treats it as another model's).
"""

from __future__ import annotations

import httpx2
import pytest

from macapp.server.anthropic_api import parse_messages_request
from macapp.core.serving.requests import Role
from tests.fixtures.agents.tool_models import README_PATH
from tests.server.agent_replay import KEY, anthropic_message, recorded, replay, served_cleanly, tool_model, wait_idle
from tests.server.conftest import serve

AGENT = "claude_code"


@pytest.fixture(scope="module")
def claude_server(tiny_models_dir):
    with serve(tool_model(tiny_models_dir, "claude-code"), api_key=KEY) as served:
        yield served


def test_the_recorded_request_reads_as_claude_code_means_it():
    record = recorded(AGENT, "first_request.json")
    assert record["path"] == "/v1/messages?beta=true" and record["status"] == 200
    call = parse_messages_request(record["body"])
    system, user, late_system = call.request.messages
    assert system.role is Role.SYSTEM and system.content.startswith("You are a Claude agent")  # the three blocks joined
    assert user.role is Role.USER and user.content.endswith("say hi")  # its two text blocks, the reminder first
    assert late_system.role is Role.SYSTEM and late_system.content.startswith("Available agent types")  # read in place
    assert len(call.request.tools) == 24 and call.stream and call.show_thinking and call.request.thinking


def test_the_warm_up_head_is_answered_without_the_key(claude_server):
    record = recorded(AGENT, "warm_up.json")
    response = httpx2.request(record["method"], f"{claude_server.url}{record['path']}", headers=record["headers"], timeout=30)
    assert response.status_code == 200 and response.content == b""
    assert httpx2.get(f"{claude_server.url}/", timeout=30).status_code == 401  # a GET still needs the key
    hello = httpx2.get(f"{claude_server.url}/", headers={"x-api-key": KEY}, timeout=30)
    assert hello.status_code == 200 and hello.json()["status"] == "ok"


@pytest.fixture(scope="module")
def claude_turns(claude_server) -> dict:
    """Claude Code's tool turn as recorded (request, then follow-up), each read by the Anthropic SDK's accumulator.
    (Each prompt is some 55k tokens of the tiny tokenizer. "say hi", first_request.json, has the very shape of
    tool_request.json from another working folder, so it would be read whole again: it is checked parsed, above,
    and was answered 200 by the real run it was recorded from.)"""
    before = {r.id for r in claude_server.activity.records()}
    turns = {name: anthropic_message(replay(claude_server, recorded(AGENT, name))) for name in ("tool_request.json", "tool_followup.json")}
    wait_idle(claude_server)
    turns["records"] = [r for r in claude_server.activity.records() if r.id not in before]
    return turns


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_every_recorded_request_is_answered_none_refused(claude_turns):
    records = served_cleanly(claude_turns["records"])
    assert [r.api for r in records] == ["anthropic"] * 2


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_tool_turn_gets_thinking_text_and_the_call_claude_code_runs(claude_turns):
    message = claude_turns["tool_request.json"]
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    thinking, text, call = message.content
    assert thinking.thinking and thinking.signature  # Claude Code keeps a thinking block only with its signature
    assert text.text == "I will check."
    assert call.name == "Read" and call.input == {"file_path": README_PATH} and call.id
    assert message.stop_reason == "tool_use" and message.usage.output_tokens > 0


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_follow_up_reads_its_prefix_from_the_checkpoint(claude_turns):
    first, second = claude_turns["tool_request.json"], claude_turns["tool_followup.json"]
    assert first.usage.cache_read_input_tokens == 0 and first.usage.input_tokens > 10_000
    usage = second.usage  # Anthropic's split: input_tokens read afresh, cache_read_input_tokens restored
    assert usage.cache_read_input_tokens >= first.usage.input_tokens - 8
    assert usage.input_tokens < 200
    assert second.stop_reason in ("tool_use", "end_turn")


def test_a_follow_up_without_the_thinking_block_still_reads_as_one_assistant_turn():
    """When ANTHROPIC_MODEL names another model than the replies do, Claude Code sends the turn without its
    thinking: the assistant turn is then text and call only (README: set ANTHROPIC_MODEL to the loaded model)."""
    kept = parse_messages_request(recorded(AGENT, "tool_followup.json")["body"]).request.messages
    dropped = parse_messages_request(recorded(AGENT, "tool_followup_other_model.json")["body"]).request.messages
    (kept_turn,) = [m for m in kept if m.role is Role.ASSISTANT]
    (dropped_turn,) = [m for m in dropped if m.role is Role.ASSISTANT]
    assert kept_turn.reasoning and not dropped_turn.reasoning
    assert [c.name for c in kept_turn.tool_calls] == [c.name for c in dropped_turn.tool_calls] == ["Read"]
    assert kept[-1].role is dropped[-1].role is Role.TOOL and "hello from README" in kept[-1].content


def test_the_billing_header_block_is_left_out_so_two_sessions_share_their_prefix():
    """Claude Code's first system block (without CLAUDE_CODE_ATTRIBUTION_HEADER=0) changes every session; it is
    billing metadata, not an instruction: two sessions' requests then read as the same prompt."""
    import copy

    sessions = []
    for suffix in ("593; cc_entrypoint=sdk-cli; cch=1a2b3;", "593; cc_entrypoint=sdk-cli; cch=9f8e7;"):
        body = copy.deepcopy(recorded(AGENT, "first_request.json")["body"])
        body["system"].insert(0, {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.328.{suffix}"})
        sessions.append(parse_messages_request(body).request.messages)
    plain = parse_messages_request(recorded(AGENT, "first_request.json")["body"]).request.messages
    assert sessions[0] == sessions[1] == plain
    assert "x-anthropic-billing-header" not in sessions[0][0].content
