"""`qwen-desk serve --prompt-cache-disk SIZE` and `qwen-desk cache`, in subprocesses on the tiny model: a second
session after a restart reuses the first one's prompt from disk (said in usage and in the server's line), the
folder stays under its bound, `kill -9` leaves a store the next server starts and serves with, and the command
shows and clears what is kept."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx2

from macapp.cli import main
from macapp.core.prompt_disk import prompts_dir
from tests.cli.test_serve_cli import ready, start, stop

SYSTEM = "You are a coding agent. You read files, run commands and answer briefly. " * 30
REMINDER = "<system-reminder>\nThe project folder holds README.md and src/.\n</system-reminder>\n"


def message(url: str, words: str) -> dict:
    body = {
        "model": "claude-sonnet-4",
        "max_tokens": 8,
        "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.328.593; cch={hash(words) % 99999};"},
            {"type": "text", "text": SYSTEM},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": REMINDER * 20}, {"type": "text", "text": words}]}],
    }
    response = httpx2.post(f"{url}/v1/messages", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def cache_json() -> dict:
    out = subprocess.run([sys.executable, "-m", "macapp", "cache", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_second_session_after_a_restart_reuses_the_first_from_disk(tiny_dense_path):
    proc = start(tiny_dense_path, "--prompt-cache-disk", "8MB")
    try:
        first = message(ready(proc), "say hi")
    finally:
        code, _out, err = stop(proc, signal.SIGINT)
    assert code == 0, err
    assert first["cache_read_input_tokens"] == 0
    kept = cache_json()
    assert kept["files"] > 0 and 0 < kept["bytes"] <= 8_000_000 and kept["models"][0]["model"] == tiny_dense_path.name
    proc = start(tiny_dense_path, "--prompt-cache-disk", "8MB")
    try:
        second = message(ready(proc), "list the files")  # another session: another billing line, other words
    finally:
        code, _out, err = stop(proc, signal.SIGINT)
    assert code == 0, err
    total = second["input_tokens"] + second["cache_read_input_tokens"]
    assert second["cache_read_input_tokens"] > 0.9 * total  # all but the user's words, from disk
    assert "reused from disk" in err
    assert cache_json()["bytes"] <= 8_000_000


def test_after_kill_9_the_server_starts_and_serves(tiny_dense_path):
    proc = start(tiny_dense_path)
    url = ready(proc)
    message(url, "say hi")
    proc.send_signal(signal.SIGKILL)  # perhaps while a checkpoint is being written
    proc.wait(timeout=20)
    proc = start(tiny_dense_path)
    try:
        again = message(ready(proc), "say hi")
    finally:
        code, _out, err = stop(proc, signal.SIGINT)
    assert code == 0, err
    assert again["input_tokens"] > 0 or again["cache_read_input_tokens"] > 0
    assert not list(prompts_dir().glob("*/.*"))  # no temporary file of the killed process is left


def test_the_cache_command_shows_and_clears(capsys, tmp_path):
    assert main(["cache"]) == 0
    shown = capsys.readouterr().out
    assert str(prompts_dir()) in shown and "qwen-desk cache --clear" in shown and "--prompt-cache-disk" in shown
    folder = prompts_dir() / "0123456789abcdef"
    folder.mkdir(parents=True)
    (folder / "x.safetensors").write_bytes(b"0" * 1000)
    assert main(["cache", "--clear"]) == 0
    assert "1.0 KB" in capsys.readouterr().out and not list(folder.iterdir())


def test_a_bad_size_is_refused_before_loading(capsys, tiny_dense_path):
    assert main(["serve", "--model", str(tiny_dense_path), "--prompt-cache-disk", "lots"]) == 2
    assert "--prompt-cache-disk" in capsys.readouterr().err
