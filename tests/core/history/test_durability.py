"""The history survives kill -9 mid-reply: what reached the disk is a whole prefix, cut within about a second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from macapp.core.history import Store

ROOT = Path(__file__).resolve().parents[3]

WRITER = r"""
import sys, time
from macapp.core.history import Store
path, interval = sys.argv[1], float(sys.argv[2])
store = Store.open(path)
conv = store.create_conversation("tiny", "sys", {"temperature": 0.7})
store.add_message(conv.id, "user", "first question")
store.add_message(conv.id, "assistant", "first answer", reasoning="thought", stats={"generation_tokens": 2})
store.add_message(conv.id, "user", "second question")
writer = store.begin_reply(conv.id, thinking=True, interval=interval)
print("READY", conv.id, writer.message_id, flush=True)
i = 0
while True:
    writer.append(f"t{i} ", f"r{i} " if i < 50 else "")
    i += 1
    print(i, flush=True)
    time.sleep(0.004)
"""


def _stream(n: int) -> str:
    return "".join(f"t{k} " for k in range(n))


def _run_and_kill(tmp_path: Path, interval: float, kill_after: float):
    """Start a writer process, SIGKILL it `kill_after` s into the reply; return (db path, ids, [(time, n)], kill time)."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    db = tmp_path / "history.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db), str(interval)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    first = proc.stdout.readline().split()
    assert first[0] == "READY", first
    progress: list[tuple[float, int]] = []

    def read():
        for line in proc.stdout:
            progress.append((time.monotonic(), int(line)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(kill_after)
    killed_at = time.monotonic()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    reader.join(5)
    assert proc.returncode == -signal.SIGKILL
    return db, int(first[1]), int(first[2]), progress, killed_at


def _check_earlier_messages_and_integrity(db: Path, conv_id: int, outside) -> list:
    with Store.open(db) as s:
        assert s.notice is None
        assert outside(db, "integrity_check") == "ok"
        conv = s.get_conversation(conv_id)
        assert conv.settings == {"temperature": 0.7} and conv.system_prompt == "sys"
        first = conv.messages[:3]
        assert [(m.role, m.content, m.state) for m in first] == [
            ("user", "first question", "complete"),
            ("assistant", "first answer", "complete"),
            ("user", "second question", "complete"),
        ]
        assert first[1].reasoning == "thought" and first[1].stats.generation_tokens == 2
        if s.search_uses_index:
            s.database.conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        return conv.messages


def test_kill9_mid_reply_loses_at_most_about_a_second(tmp_path, outside):
    db, conv_id, message_id, progress, killed_at = _run_and_kill(tmp_path, interval=1.0, kill_after=2.6)
    messages = _check_earlier_messages_and_integrity(db, conv_id, outside)
    reply = messages[3]
    assert reply.id == message_id and reply.state == "streaming" and reply.thinking
    # What reached the disk is a whole prefix of the stream ...
    n_saved = reply.content.count("t")
    assert reply.content == _stream(n_saved)
    assert reply.reasoning == "".join(f"r{k} " for k in range(min(n_saved, 50)))
    # ... cut within about a second of the kill (1 s throttle, plus scheduling slack on a busy 2-core machine).
    produced = max(n for _, n in progress)
    due = max((n for t, n in progress if t <= killed_at - 1.75), default=0)
    assert due > 50, progress[:3]
    assert due <= n_saved <= produced
    assert n_saved < produced  # it really was cut mid-reply


@pytest.mark.parametrize("kill_after", [0.25, 0.6])
def test_kill9_during_constant_commits_never_corrupts(tmp_path, outside, kill_after):
    db, conv_id, message_id, progress, _ = _run_and_kill(tmp_path, interval=0.0, kill_after=kill_after)
    reply = _check_earlier_messages_and_integrity(db, conv_id, outside)[3]
    n_saved = reply.content.count("t")
    assert reply.content == _stream(n_saved)
    assert n_saved >= max((n for _, n in progress), default=0) - 1  # every append was committed
