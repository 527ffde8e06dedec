"""`qwen-desk serve` in a subprocess: one ready line with the base URL, answers, SIGTERM/SIGINT stop it cleanly
(a stream in flight ends properly); bad flags and models are refused with a clear line."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time

import httpx2
import pytest

from macapp.cli import main
from macapp.cli.serve import ready_line, request_line
from macapp.server.activity import RequestRecord, RequestState
from macapp.server.config import DEFAULT_PORT, ServerConfig

URL = re.compile(r"at (http://127\.0\.0\.1:\d+) ")


def start(model, *flags):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "macapp", "serve", "--model", str(model), "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def ready(proc, timeout=60.0) -> str:
    """The one line printed when the server answers; its base URL."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(0.2):
            line = proc.stdout.readline()
            if not line:
                break
            match = URL.search(line)
            assert match, line
            return match.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"no ready line; stderr: {proc.stderr.read()}")


def stop(proc, sig=signal.SIGTERM, timeout=20.0) -> tuple[int, str, str]:
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out, err


def test_ready_line_answers_then_sigterm_ends_a_stream_in_flight_with_an_error(tiny_dense_path):
    proc = start(tiny_dense_path, "--no-think")
    try:
        url = ready(proc)
        reply = httpx2.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "temperature": 0}, timeout=30)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "The answer is here!"
        # A reply that cannot end before the signal: the tiny tokenizer's first specials (both end-of-sequence tokens
        # and <|im_start|>) banned, no max_tokens, a 262,144-token context. (Anthropic has no logit_bias: its tiny
        # reply would be over in a few tokens, so how a stop cuts it is tested in-process, tests/server/test_shutdown_http.py.)
        body = {
            "model": "m",
            "stream": True,
            "temperature": 0,
            "messages": [{"role": "user", "content": "go on"}],
            "logit_bias": {str(i): -100 for i in range(3)},
        }
        chunks, signalled = [], False
        with httpx2.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[len("data: ") :]))
                if sum(1 for chunk in chunks if chunk.get("choices") and chunk["choices"][0]["delta"].get("content")) == 3 and not signalled:
                    proc.send_signal(signal.SIGTERM)  # mid-reply
                    signalled = True
        _out, err = proc.communicate(timeout=60)  # it ends on its own: the reply in flight stops, not runs out
        assert proc.returncode == 0, err
        # the cut reply says so and never looks finished (#19): an error chunk last, no finish_reason
        assert chunks[-1]["error"]["code"] == "server_shutting_down"
        assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks if chunk.get("choices"))
        assert "SIGTERM" in err
        lines = [line for line in err.splitlines() if "tokens in" in line]  # one line per finished request
        assert len(lines) == 2 and lines[0].endswith("- done") and lines[1].endswith("- stopped: the server stopped"), err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigint_stops_an_idle_server_and_context_and_kv_bits_reach_it(tiny_dense_path):
    proc = start(tiny_dense_path, "--context", "256", "--kv-bits", "8")
    try:
        url = ready(proc)
        assert httpx2.get(f"{url}/health", timeout=10).status_code == 200
        long = {"messages": [{"role": "user", "content": "hello " * 400}], "max_tokens": 4}
        refused = httpx2.post(f"{url}/v1/chat/completions", json=long, timeout=30)
        assert refused.status_code == 400 and "256" in refused.json()["error"]["message"]  # --context is the limit
        short = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 100_000, "chat_template_kwargs": {"enable_thinking": False}}
        reply = httpx2.post(f"{url}/v1/chat/completions", json=short, timeout=30).json()  # on an 8-bit KV cache
        assert reply["choices"][0]["message"]["content"] and reply["usage"]["total_tokens"] <= 256  # max_tokens clamped
    finally:
        code, _out, err = stop(proc, signal.SIGINT)
    assert code == 0, err


def test_ready_line_names_the_url_and_warns_when_reachable_from_the_network():
    local = ready_line("tiny", "http://127.0.0.1:8642", ServerConfig())
    assert "http://127.0.0.1:8642" in local and "/v1" in local and "WARNING" not in local
    open_ = ready_line("tiny", "http://0.0.0.0:8642", ServerConfig(host="0.0.0.0"))
    assert "WARNING" in open_ and "reachable from the network" in open_ and "--api-key" in open_
    keyed = ready_line("tiny", "http://0.0.0.0:8642", ServerConfig(host="0.0.0.0", api_key="k"))
    assert "WARNING" in keyed and "--api-key" not in keyed
    assert DEFAULT_PORT not in (11434, 1234, 8080, 3456, 8000)
    assert "up to 8 requests at once" in ready_line("tiny", "http://127.0.0.1:8642", ServerConfig(), 8)
    assert "one request at a time" in ready_line("tiny", "http://127.0.0.1:8642", ServerConfig(), 1)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "70000"], "--port"),
        (["--api-key", " "], "--api-key"),
        (["--context", "8"], "--context"),
        (["--parallel", "0"], "--parallel"),
    ],
)
def test_bad_flags_are_refused_before_loading(capsys, tiny_dense_path, flags, message):
    assert main(["serve", "--model", str(tiny_dense_path), *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_model_is_a_clear_line(capsys, tmp_path):
    assert main(["serve", "--model", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


def test_port_in_use_is_a_clear_line(capsys, tiny_dense_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--model", str(tiny_dense_path), "--port", str(port)]) == 1
    assert "choose another with --port" in capsys.readouterr().err


def test_request_line():
    record = RequestRecord(3, "127.0.0.1:5000 anthropic (claude-cli/2.0)", "anthropic", 0.0, RequestState.DONE, 5000, 4900, 21, 412.25)
    assert request_line(record) == "qwen-desk: 127.0.0.1:5000 anthropic (claude-cli/2.0): 5000 tokens in (4900 reused), 21 out at 412.2 tok/s - done"
    drafted = dataclasses.replace(record, mtp_tokens_per_step=2.5, mtp_acceptance=0.75)
    assert request_line(drafted).endswith("at 412.2 tok/s (MTP 2.50 tokens/step, 75% of drafts kept) - done")
    from_disk = dataclasses.replace(record, cached_from="disk")
    assert "(4900 reused from disk)" in request_line(from_disk)
    assert "(0 reused)" in request_line(dataclasses.replace(from_disk, cached_tokens=0))


@pytest.mark.parametrize("flag, openai_default", [([], True), (["--think"], True), (["--no-think"], False)])
def test_the_help_says_what_each_api_does_for_a_request_that_does_not_say_about_thinking(capsys, flag, openai_default):
    from macapp.cli import build_parser
    from macapp.cli.serve import _config
    from macapp.server.anthropic_api import parse_messages_request
    from macapp.server.openai_api import parse_chat_request
    from macapp.server.responses_api import parse_responses_request

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "OpenAI APIs (/v1/chat/completions, /v1/responses): reason before answering when a request does not say (default)" in help_text
    assert "The Anthropic API (/v1/messages) thinks only when a request asks (its `thinking` field)" in help_text
    assert "OpenAI APIs: answer directly when a request does not say" in help_text
    # What the server then does with requests that do not say, read by its own request parsers.
    config = _config(build_parser().parse_args(["serve", "--model", "any", *flag]))
    said_nothing = [{"role": "user", "content": "hi"}]
    assert parse_chat_request({"messages": said_nothing}, config.default_thinking).request.thinking is openai_default
    assert parse_responses_request({"input": "hi"}, config.default_thinking).request.thinking is openai_default
    assert parse_messages_request({"max_tokens": 10, "messages": said_nothing}).request.thinking is False  # either flag
    asked = {"max_tokens": 10, "messages": said_nothing, "thinking": {"type": "enabled", "budget_tokens": 512}}
    assert parse_messages_request(asked).request.thinking is True
