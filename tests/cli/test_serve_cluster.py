"""`qwen-desk serve --hostfile`: the local API answered by two ranks on this machine, prompt checkpoints
included (mirrored on the follower rank); SIGTERM ends every rank."""

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time

import openai

from tests.core.cluster.conftest import HANG_S, LOCAL, processes_naming
from tests.fixtures.scripted import WEATHER_TOOL
from tests.server.conftest import GREEDY, no_eos_bias, serve

URL = re.compile(r"at (http://127\.0\.0\.1:\d+) ")
SYSTEM = "You are a careful agent. Use the tools when they help, then answer in one short sentence. " * 4
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}}


def agent_loop(client: openai.OpenAI, bias: dict[str, float]) -> list[tuple[str, int, int]]:
    """Three requests of one agent conversation (each resends it all, with a tool result), then a new
    conversation on the same system prompt and tools: (text, prompt tokens, cached tokens) of each."""
    kw = dict(model="x", tools=[WEATHER_TOOL], max_tokens=8, logit_bias=bias, **GREEDY)  # no EOS: context-dependent text
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the weather in Paris?"}]
    out = []
    for n in range(3):
        reply = client.chat.completions.create(messages=messages, **kw)
        text = reply.choices[0].message.content or ""
        out.append((text, reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens))
        call = dict(CALL, id=f"call_{n}")
        messages += [
            {"role": "assistant", "content": text, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": f"Sunny, {20 + n} degrees."},
        ]
    other = [messages[0], {"role": "user", "content": "And in Oslo?"}]  # restores the system prompt's (moved) checkpoint
    reply = client.chat.completions.create(messages=other, **kw)
    out.append((reply.choices[0].message.content or "", reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens))
    return out


def ready_url(proc: subprocess.Popen) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    url, deadline = None, time.monotonic() + 120
    while url is None and time.monotonic() < deadline and proc.poll() is None:
        if sel.select(0.2):
            match = URL.search(proc.stdout.readline())
            url = match and match.group(1)
    assert url, proc.stderr.read() if proc.poll() is not None else "no ready line"
    return url


def end(proc: subprocess.Popen) -> None:
    """A run a failed assertion left going: SIGTERM ends its ranks too (a kill would leave them behind)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_two_ranks_serve_an_agent_loop_from_checkpoints_and_sigterm_ends_them(tiny_dense_path, tmp_path):
    # Several Macs answer one request at a time, so the reference is one process doing the same: the batched path's
    # floats can differ in the last bits, and on a random tiny model off its script a near-tie then flips a token.
    with serve(tiny_dense_path, default_thinking=False, batching=False) as one:
        bias = no_eos_bias(one)
        expected = agent_loop(one.openai(), bias)
    assert all(cached > 0 for _, _, cached in expected[1:])  # the single process reuses its checkpoints
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([LOCAL, LOCAL]))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "macapp", "serve", "--model", str(tiny_dense_path), "--port", "0", "--no-think", "--hostfile", str(hostfile)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = ready_url(proc)
        got = agent_loop(openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60), bias)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        end(proc)
    assert got == expected  # the same text, prompt and reused tokens as one process
    assert [cached > 0 for _, _, cached in got] == [False, True, True, True]
    assert proc.returncode == 0, err
    assert "[2 hosts, tensor split, ring backend" in err and "SIGTERM: stopping" in err
    assert processes_naming(hostfile) == []  # mlx.launch and both ranks are gone
