"""`qwen-desk chat --hostfile`: two ranks on this machine over the ring backend, and every refusal before start."""

import json
import subprocess
import sys

import pytest

from tests.core.cluster.conftest import HANG_S, LOCAL, is_loopback, processes_naming


def chat(*argv, timeout=180):
    return subprocess.run([sys.executable, "-m", "macapp", "chat", *map(str, argv)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def hostfile(tmp_path):
    def write(content):
        hosts = content if isinstance(content, list) else []
        assert all(is_loopback(h["ssh"]) and all(map(is_loopback, h["ips"])) for h in hosts)  # nothing past this machine
        path = tmp_path / "hosts.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        return path

    return write


def test_two_ranks_reply_as_one_process_and_save_the_history(tiny_moe_path, hostfile, capsys):
    from macapp.cli import main

    # thinking on, closed by its budget (rank 0 feeds the closing tokens through the model too)
    turns = ["-p", "Hello there", "-p", "And again?", "--think", "--thinking-budget", "6", "--temp", "0", "--max-tokens", "40", "--json"]
    assert main(["chat", "-m", str(tiny_moe_path), *turns, "--no-history"]) == 0  # one process: this one
    alone = capsys.readouterr()
    path = hostfile([LOCAL, LOCAL])
    both = chat("-m", tiny_moe_path, *turns, "--hostfile", path)
    assert both.returncode == 0, both.stderr
    assert processes_naming(path) == []  # mlx.launch and both ranks are gone
    assert "[2 hosts, tensor split, ring backend; rank 0 is 127.0.0.1]" in both.stderr
    assert "not on this Mac" not in both.stderr  # rank 0 is here
    one = [json.loads(line) for line in alone.out.splitlines()]
    two = [json.loads(line) for line in both.stdout.splitlines()]
    keys = ("turn", "text", "reasoning", "budget_hit", "generation_tokens", "prompt_tokens", "finish_reason", "context_tokens")
    assert [{k: r[k] for k in keys} for r in two] == [{k: r[k] for k in keys} for r in one]
    assert two[0]["reasoning"] and two[0]["budget_hit"] and two[0]["text"]
    assert two[0]["generation_tps"] > 0 and two[0]["conversation_id"] is not None
    history = subprocess.run([sys.executable, "-m", "macapp", "history", "show", str(two[0]["conversation_id"])], capture_output=True, text=True, timeout=60)
    assert history.returncode == 0 and "And again?" in history.stdout and two[1]["text"] in history.stdout


@pytest.mark.parametrize(
    "content,needle",
    [
        ('[{"ssh": "127.0.0.1"', "is not valid JSON (line 1, column"),
        ('[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]', "lists 1 host"),
        ('[{"ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1"}]', 'host 0 has no "ssh"'),
    ],
)
def test_a_bad_hostfile_is_refused_before_anything_starts(tiny_moe_path, hostfile, content, needle):
    done = chat("-m", tiny_moe_path, "-p", "hi", "--hostfile", hostfile(content), timeout=60)
    assert done.returncode == 2 and needle in done.stderr and done.stdout == ""
    assert "hosts," not in done.stderr  # nothing was launched


def test_an_unreachable_host(tiny_moe_path, hostfile):
    done = chat("-m", tiny_moe_path, "-p", "hi", "--hostfile", hostfile([LOCAL, {"ssh": "127.0.0.2", "ips": ["127.0.0.2"]}]), timeout=60)
    assert done.returncode == 1 and "cannot reach every host: ssh to 127.0.0.2 failed" in done.stderr


def test_tensor_split_that_the_heads_do_not_allow(tiny_models_dir, hostfile):
    from macapp.core.demo.tiny_model import make_tiny_model

    model = make_tiny_model(tiny_models_dir / "tiny-qwen3.5-dense-3heads-cli", kind="dense", hidden_size=192)
    done = chat("-m", model, "-p", "hi", "--hostfile", hostfile([LOCAL, LOCAL]), "--shard", "tensor", timeout=60)
    assert done.returncode == 2 and "cannot split this model 2 ways (attention heads (3) do not divide by 2" in done.stderr
    assert "--shard pipeline" in done.stderr


def test_cluster_flags_need_a_hostfile(tiny_moe_path):
    done = chat("-m", tiny_moe_path, "-p", "hi", "--shard", "pipeline", timeout=60)
    assert done.returncode == 2 and "--shard and --backend go with --hostfile" in done.stderr


def test_interactive_chat_reads_this_terminal_through_mlx_launch(tiny_moe_path, hostfile):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "macapp",
            "chat",
            "-m",
            str(tiny_moe_path),
            "--hostfile",
            str(hostfile([LOCAL, LOCAL])),
            "--no-think",
            "--temp",
            "0",
            "--no-history",
        ],
        input="Hello\n",
        capture_output=True,
        text=True,
        timeout=180,
    )
    # the end of this input becomes /quit for rank 0 (mlx.launch never closes the ranks' input)
    assert done.returncode == 0, done.stderr
    assert "The answer is here!" in done.stdout and "generation 6 tokens" in done.stderr


def test_ctrl_c_reaches_rank_0(tiny_moe_path, hostfile):
    """Ctrl-C goes to the launcher (the foreground process), which passes it to rank 0: at the prompt it ends
    the chat (during a reply it stops the reply, as in one process), and every rank goes with it."""
    import os
    import signal
    import threading
    import time

    path = hostfile([LOCAL, LOCAL])
    proc = subprocess.Popen(
        [sys.executable, "-m", "macapp", "chat", "-m", str(tiny_moe_path), "--hostfile", str(path), "--no-think", "--temp", "0", "--no-history"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    out = bytearray()
    threading.Thread(target=lambda: [out.extend(chunk) for chunk in iter(lambda: proc.stdout.read1(4096), b"")], daemon=True).start()
    try:
        proc.stdin.write(b"Hello\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 2 * HANG_S
        while out.count(b">> ") < 2 and time.monotonic() < deadline:  # replied, and waiting for the next line
            time.sleep(0.05)
        assert b"The answer is here!" in out and out.count(b">> ") == 2, out
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=HANG_S) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert processes_naming(path) == []


def test_two_ranks_in_long_context_mode_reply_as_one_process(tiny_models_dir, hostfile, capsys):
    """--context past the native length: the followers load with YaRN too (else rank 0's and theirs would differ)."""
    from macapp.cli import main
    from macapp.core.demo.tiny_model import make_tiny_model
    from tests.fixtures.models import with_native_length

    model = with_native_length(make_tiny_model(tiny_models_dir / "tiny-native256-cluster", kind="moe"), 256)
    turns = ["-p", "word " * 200, "--no-think", "--temp", "0", "--max-tokens", "12", "--context", "900", "--json"]
    assert main(["chat", "-m", str(model), *turns, "--no-history"]) == 0
    alone = capsys.readouterr()
    assert "YaRN" in alone.err
    both = chat("-m", model, *turns, "--hostfile", hostfile([LOCAL, LOCAL]))
    assert both.returncode == 0, both.stderr
    assert "rank 1: long-context mode: YaRN ×4" in both.stderr  # the follower's rope is rank 0's
    one = [json.loads(line) for line in alone.out.splitlines()]
    two = [json.loads(line) for line in both.stdout.splitlines()]
    assert one[0]["prompt_tokens"] > 256  # read past the native length
    assert [(r["text"], r["generation_tokens"]) for r in two] == [(r["text"], r["generation_tokens"]) for r in one]
