"""Replaying what a real agent sent (tests/fixtures/<agent>/*.json, written by tests/fixtures/agents/record_proxy.py)
to a live server, and reading the answer the way that agent's client library does."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx2
import pytest

from macapp.server.activity import RequestState
from tests.fixtures.agents.tool_models import TOOLS, answer

FIXTURES = Path(__file__).parents[1] / "fixtures"
DROPPED_HEADERS = {"authorization", "x-api-key", "content-length", "accept-encoding", "host"}
KEY = "agent-key"  # the replay servers' API key: the agents sent theirs, redacted in the fixtures


def recorded(agent: str, name: str) -> dict:
    return json.loads((FIXTURES / agent / name).read_text())


def headers_of(record: dict) -> dict[str, str]:
    """The agent's own headers, with this test's key where it sent its own (as a bearer token, as all three do)."""
    kept = {k: v for k, v in record["headers"].items() if k not in DROPPED_HEADERS}
    return {**kept, "authorization": f"Bearer {KEY}"}


@dataclass
class Replayed:
    status: int
    content_type: str
    events: list[tuple[str | None, Any]] = field(default_factory=list)  # (SSE event name, parsed data)
    body: Any = None


def replay(served, record: dict, body: dict | None = None) -> Replayed:
    """Send `record` (or its path and headers with `body`) and read the whole answer: SSE frames or JSON."""
    url = f"{served.url}{record['path']}"
    with httpx2.stream(record["method"], url, json=body if body is not None else record["body"], headers=headers_of(record), timeout=600) as response:
        kind = response.headers.get("content-type", "")
        result = Replayed(response.status_code, kind)
        if not kind.startswith("text/event-stream"):
            response.read()
            result.body = response.json() if response.content else None
            return result
        result.events = list(_sse(response.iter_lines()))
    return result


def _sse(lines: Iterator[str]) -> Iterator[tuple[str | None, Any]]:
    name: str | None = None
    for line in lines:
        if line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data = line[len("data:") :].strip()
            yield name, (data if data == "[DONE]" else json.loads(data))
        elif not line.strip():
            name = None


def served_cleanly(records: list) -> list:
    """Each of these request records ran to the end: none refused, none failed (the log's `refused NNN` lines)."""
    bad = [(r.state, r.status, r.error) for r in records if r.state is not RequestState.DONE]
    assert not bad, bad
    return records


# The replays read agents' prompts of 5k to 55k tiny-tokenizer tokens, and the CPU steps each DeltaNet layer token by
# token: their models have one DeltaNet and one full-attention layer (both caches, both checkpoints), not 3 + 1.
REPLAY_LAYERS = 2


def tool_model(tiny_models_dir: Path, agent: str) -> Path:
    """The scripted model that calls `agent`'s own file-reading tool (as recorded)."""
    from macapp.core.demo.tiny_model import make_tiny_model

    tool, argument = TOOLS[agent]
    return make_tiny_model(tiny_models_dir / f"agent-{agent}", kind="dense", answer=answer(tool, argument), firm=True, num_layers=REPLAY_LAYERS)


def wait_idle(served, timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while served.activity.busy() and time.monotonic() < deadline:  # the job's last event reaches the list
        time.sleep(0.01)
    if served.activity.busy():
        pytest.fail("the server stayed busy")


def anthropic_message(replayed: Replayed):
    """The stream folded into one Message by the Anthropic SDK's own accumulator (Claude Code's client is that SDK's
    TypeScript twin); an `error` event fails the test."""
    from anthropic._models import construct_type
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import RawMessageStreamEvent

    assert replayed.status == 200 and replayed.content_type.startswith("text/event-stream"), replayed
    names = [name for name, _ in replayed.events]
    assert "error" not in names, replayed.events
    assert names[0] == "message_start" and names[-1] == "message_stop", names
    snapshot, json_bufs = None, {}
    for name, data in replayed.events:
        assert data["type"] == name  # the SSE event name and the data's type agree
        if name == "ping":
            continue
        snapshot = accumulate_event(event=construct_type(type_=RawMessageStreamEvent, value=data), current_snapshot=snapshot, json_bufs=json_bufs)
    return snapshot


def openai_completion(replayed: Replayed):
    """The chunks folded into one ChatCompletion by the OpenAI SDK's own stream state; the stream must end with
    `data: [DONE]`, the usage chunk (include_usage) just before it."""
    from openai._models import construct_type
    from openai.lib.streaming.chat._completions import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    assert replayed.status == 200 and replayed.content_type.startswith("text/event-stream"), replayed
    datas = [data for _, data in replayed.events]
    assert datas[-1] == "[DONE]" and "[DONE]" not in datas[:-1]
    chunks = datas[:-1]
    assert all("error" not in c for c in chunks), chunks
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0  # stream_options.include_usage
    assert sum(1 for c in chunks for choice in c["choices"] if choice.get("finish_reason")) == 1
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(construct_type(type_=ChatCompletionChunk, value=chunk))
    return state.get_final_completion()
