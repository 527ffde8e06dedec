"""The requests the real Codex CLI (0.171, `codex exec`) sends, recorded by tests/fixtures/codex/record_codex.py:
read as Codex means them, then replayed as an agent loop against a live server, the stream read the way Codex
reads it (each `data:` event by its `type`; the turn's items from `response.output_item.done`; the turn ends only
at `response.completed`).

first_request.json: `codex exec "say hi"` — two developer messages, two user messages, `tools` with seven
functions, a `namespace` of sub-agent functions and `web_search`, `stream`, `store: false`, `include`,
`prompt_cache_key`, `client_metadata`. tool_request.json / tool_followup.json: a turn in which the stand-in
answered a reasoning item and an `exec_command` call; the follow-up sends them back with the command's output."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from macapp.core.serving.requests import Role
from macapp.server.responses_api import parse_responses_request
from tests.fixtures.scripted import TOOL_CALL_ANSWER, TOOL_CALL_ARGUMENTS, TOOL_PREAMBLE, WEATHER_TOOL
from tests.server.agent_replay import REPLAY_LAYERS
from tests.server.conftest import serve

FIXTURES = Path(__file__).parents[1] / "fixtures" / "codex"
CODEX_FUNCTIONS = ["exec_command", "write_stdin", "request_user_input", "view_image", "get_goal", "create_goal", "update_goal"]
# The scripted model always calls get_weather: offered as one more function, after Codex's own.
WEATHER_FUNCTION = {"type": "function", **WEATHER_TOOL["function"], "strict": False}


def _recorded(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _body(name: str) -> dict:
    return _recorded(name)["body"]


def test_the_first_request_reads_as_codex_means_it():
    record = _recorded("first_request.json")
    assert record["path"] == "/v1/responses" and record["headers"]["accept"] == "text/event-stream"
    call = parse_responses_request(record["body"], default_thinking=True)
    roles = [m.role for m in call.request.messages]
    assert roles == [Role.SYSTEM, Role.SYSTEM, Role.USER, Role.USER]  # developer messages are the system prompt
    assert call.request.messages[-1].content == "say hi"
    assert [t.name for t in call.request.tools] == CODEX_FUNCTIONS  # the namespace and web_search left out
    assert call.stream and not call.store and call.request.thinking  # reasoning.summary only: the server's default
    assert call.request.tool_choice.parallel


def test_the_follow_up_puts_reasoning_and_the_call_in_one_assistant_turn():
    call = parse_responses_request(_body("tool_followup.json"), default_thinking=True)
    *_, user, assistant, output = call.request.messages
    assert user.content == "what is in README.txt?"
    assert assistant.role is Role.ASSISTANT and assistant.reasoning == "I should read the file."
    (exec_call,) = assistant.tool_calls
    assert (exec_call.id, exec_call.name, exec_call.arguments) == ("call_rec_0", "exec_command", {"cmd": "cat README.txt"})
    assert output.role is Role.TOOL and output.tool_call_id == "call_rec_0" and output.name == "exec_command"
    assert "hello" in output.content


def _codex_turn(served, body: dict) -> dict:
    """POST as Codex does and read its stream as Codex does: the final response, with the done items beside it."""
    headers = {k: v for k, v in _recorded("tool_request.json")["headers"].items() if k != "content-type"}
    with httpx2.stream("POST", f"{served.url}/v1/responses", json=body, headers=headers, timeout=300) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data:") :]) for line in response.iter_lines() if line.startswith("data:")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    final = events[-1]["response"]
    final["done_items"] = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert final["done_items"] == final["output"]
    return final


@pytest.fixture(scope="module")
def codex_server(tiny_models_dir):
    """The scripted get_weather caller (tests/server/conftest.py's tool_server), built with the replays' two layers."""
    from macapp.core.demo.tiny_model import make_tiny_model

    model = make_tiny_model(tiny_models_dir / "codex-tool-call", kind="dense", answer=TOOL_CALL_ANSWER, firm=True, num_layers=REPLAY_LAYERS)
    with serve(model, default_thinking=False) as served:
        yield served


@pytest.fixture(scope="module")
def codex_loop(codex_server) -> list[dict]:
    """Codex's tool turn: its first request, then the follow-up with the reply's items and the call's output."""
    first_body = _body("tool_request.json")
    first_body["tools"].append(WEATHER_FUNCTION)
    first = _codex_turn(codex_server, first_body)
    call = next(item for item in first["done_items"] if item["type"] == "function_call")
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "Process exited with code 0\nOutput:\nsunny\n"}
    second = _codex_turn(codex_server, {**first_body, "input": [*first_body["input"], *first["done_items"], output]})
    return [first, second]


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_codex_gets_the_call_it_can_run(codex_loop):
    first, _ = codex_loop
    message, call = first["done_items"]
    assert message["type"] == "message" and message["content"][0]["text"].strip() == TOOL_PREAMBLE
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == TOOL_CALL_ARGUMENTS and call["call_id"]
    assert first["status"] == "completed" and first["store"] is False


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_codex_follow_up_reads_only_its_new_tail(codex_loop):
    first, second = codex_loop
    assert first["usage"]["input_tokens"] > 5000 and first["usage"]["input_tokens_details"]["cached_tokens"] == 0
    usage = second["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"] - 8
    assert usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"] < 120


@pytest.mark.slow  # a real agent's recorded requests replayed through the tiny model
def test_the_recorded_follow_up_replays_on_the_same_checkpoints(codex_loop, codex_server):
    """The follow-up exactly as Codex sent it (a reasoning item with null content, the exec_command call and its
    output): answered, and read from the checkpoint the loop's first request left (same instructions and tools)."""
    body = _body("tool_followup.json")
    body["tools"].append(WEATHER_FUNCTION)
    reply = _codex_turn(codex_server, body)
    usage = reply["usage"]
    assert reply["status"] == "completed"
    assert usage["input_tokens_details"]["cached_tokens"] > 0.9 * usage["input_tokens"]
