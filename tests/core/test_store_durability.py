"""The history survives kill -9, old schemas, newer schemas and damaged files, and never deletes anything."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from macapp.core.store import SCHEMA_VERSION, ReadOnlyStoreError, Store, StoreError

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------- kill -9 mid-reply

WRITER = r"""
import sys, time
from macapp.core.store import Store
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
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
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


def _check_earlier_messages_and_integrity(db: Path, conv_id: int) -> list:
    with Store.open(db) as s:
        assert s.notice is None
        assert s._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conv = s.get_conversation(conv_id)
        assert conv.settings == {"temperature": 0.7} and conv.system_prompt == "sys"
        first = conv.messages[:3]
        assert [(m.role, m.content, m.state) for m in first] == [
            ("user", "first question", "complete"), ("assistant", "first answer", "complete"),
            ("user", "second question", "complete")]
        assert first[1].reasoning == "thought" and first[1].stats.generation_tokens == 2
        if s.search_uses_index:
            s._conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        return conv.messages


def test_kill9_mid_reply_loses_at_most_about_a_second(tmp_path):
    db, conv_id, message_id, progress, killed_at = _run_and_kill(tmp_path, interval=1.0, kill_after=2.6)
    messages = _check_earlier_messages_and_integrity(db, conv_id)
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
def test_kill9_during_constant_commits_never_corrupts(tmp_path, kill_after):
    db, conv_id, message_id, progress, _ = _run_and_kill(tmp_path, interval=0.0, kill_after=kill_after)
    reply = _check_earlier_messages_and_integrity(db, conv_id)[3]
    n_saved = reply.content.count("t")
    assert reply.content == _stream(n_saved)
    assert n_saved >= max((n for _, n in progress), default=0) - 1  # every append was committed


# ---------------------------------------------------------------- migrations from every earlier version
# The DDL as shipped at each version, frozen here: migrations must carry databases built exactly like this.

V1_DDL = [
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL DEFAULT '', model TEXT NOT NULL DEFAULT '',
        created REAL NOT NULL, updated REAL NOT NULL, system_prompt TEXT, settings TEXT NOT NULL DEFAULT '{}')""",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        position INTEGER NOT NULL, role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL DEFAULT '', reasoning TEXT NOT NULL DEFAULT '', thinking INTEGER NOT NULL DEFAULT 0,
        ttft_s REAL, prompt_tokens INTEGER, prompt_tps REAL, generation_tokens INTEGER, generation_tps REAL,
        reasoning_tokens INTEGER, peak_memory_bytes INTEGER, finish_reason TEXT,
        state TEXT NOT NULL DEFAULT 'complete' CHECK (state IN ('streaming', 'stopped', 'complete')),
        created REAL NOT NULL, UNIQUE (conversation_id, position))""",
    "CREATE INDEX conversations_by_updated ON conversations(updated)",
]
V2_DDL = V1_DDL + ["ALTER TABLE messages ADD COLUMN model TEXT"]
OLD_SCHEMAS = {1: V1_DDL, 2: V2_DDL}


def _build_old(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    for sql in OLD_SCHEMAS[version]:
        conn.execute(sql)
    conn.execute(
        "INSERT INTO conversations VALUES (7, 'Bread', 'Qwen3.5-9B', 1000.0, 2000.0, 'Be brief.', '{\"top_p\": 0.9}')"
    )
    conn.execute("INSERT INTO conversations VALUES (8, '', '', 1500.0, 1500.0, NULL, '{}')")
    cols = "id, conversation_id, position, role, content, reasoning, thinking, generation_tokens, generation_tps, " \
           "finish_reason, state, created"
    conn.execute(f"INSERT INTO messages ({cols}) VALUES (1, 7, 0, 'user', 'How to knead?', '', 0, NULL, NULL, NULL, 'complete', 1000)")
    conn.execute(f"INSERT INTO messages ({cols}) VALUES (2, 7, 1, 'assistant', 'Push and fold.', 'hands', 1, 12, 30.5, 'stop', 'complete', 1001)")
    conn.execute(f"INSERT INTO messages ({cols}) VALUES (3, 7, 2, 'assistant', 'Half a rep', '', 0, NULL, NULL, NULL, 'stopped', 1002)")
    if version >= 2:
        conn.execute("UPDATE messages SET model = 'Qwen3.5-4B' WHERE id = 3")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("version", [0, 1, 2])
def test_migrates_from_every_earlier_version(tmp_path, version):
    assert SCHEMA_VERSION == 3  # add the new version's frozen DDL above when this changes
    path = tmp_path / "history.sqlite3"
    if version == 0:
        path.write_bytes(b"")  # a brand-new empty file
    else:
        _build_old(path, version)
    with Store.open(path) as s:
        assert s.schema_version == SCHEMA_VERSION and not s.read_only and s.notice is None
        assert s.migrated_from == (version or None)
        if version == 0:
            assert s.list_conversations() == []
            return
        convs = {c.id: c for c in s.list_conversations()}
        assert set(convs) == {7, 8}
        bread = s.get_conversation(7)
        assert (bread.title, bread.model, bread.system_prompt, bread.settings) == (
            "Bread", "Qwen3.5-9B", "Be brief.", {"top_p": 0.9})
        knead, push, half = bread.messages
        assert (knead.content, push.content, push.reasoning, push.thinking) == (
            "How to knead?", "Push and fold.", "hands", True)
        assert (push.stats.generation_tokens, push.stats.generation_tps, push.finish_reason) == (12, 30.5, "stop")
        assert half.state == "stopped"
        assert knead.model is None  # only replies carry a model
        # v1 -> v2 backfills replies from the conversation; a v2 database is left as its app wrote it.
        assert push.model == ("Qwen3.5-9B" if version == 1 else None)
        assert half.model == ("Qwen3.5-4B" if version >= 2 else "Qwen3.5-9B")  # never overwrites
        # The search index covers the migrated rows and new ones alike; ids keep counting from the old ones.
        assert [h.message_id for h in s.search("knead")] == [1]
        m = s.add_message(8, "user", "new kneading question")
        assert m.id == 4 and m.position == 0
        assert s.get_conversation(8).title == "new kneading question"
        assert sorted(h.message_id for h in s.search("knead")) == [1, 4]
        assert s._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with Store.open(path) as s:  # reopening is a no-op
        assert s.migrated_from is None and s.schema_version == SCHEMA_VERSION


def test_a_failed_migration_leaves_the_old_database_untouched(tmp_path):
    path = tmp_path / "history.sqlite3"
    _build_old(path, 1)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE messages ADD COLUMN model TEXT")  # an unexpected extra column makes step 2 fail
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="duplicate column"):
        Store.open(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 3
    conn.close()
    assert path.read_bytes()[100:] == before[100:]  # only the header may differ (journal mode)
    assert list(tmp_path.glob("*.corrupt-*")) == []  # a failed migration is not mistaken for damage


def test_an_old_database_killed_mid_write_is_rolled_back_then_migrated(tmp_path):
    """A v1 file in rollback-journal mode with a hot journal: read-only checks cannot open it; recovery must."""
    path = tmp_path / "history.sqlite3"
    _build_old(path, 1)
    killer = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA cache_size = 1')\n"
        "c.execute('BEGIN')\n"
        "c.execute(\"UPDATE messages SET content = 'half-written' WHERE id = 1\")\n"
        "c.execute(\"INSERT INTO conversations (title, created, updated) "
        "SELECT hex(randomblob(300)), 0, 0 FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r "
        "WHERE i < 3000) SELECT i FROM r)\")\n"
        "os.kill(os.getpid(), 9)\n"
    )
    result = subprocess.run([sys.executable, "-c", killer, str(path)], timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert (tmp_path / "history.sqlite3-journal").exists()  # a hot journal was left behind
    with Store.open(path) as s:
        assert s.notice is None and s.schema_version == SCHEMA_VERSION
        assert [c.id for c in s.list_conversations()] == [7, 8]  # the 3000 half-inserted rows are gone
        assert s.get_conversation(7).messages[0].content == "How to knead?"
    assert list(tmp_path.glob("*.corrupt-*")) == []


# ---------------------------------------------------------------- bad input


def test_newer_database_opens_read_only_with_a_message(tmp_path):
    path = tmp_path / "history.sqlite3"
    with Store.open(path) as s:
        conv = s.create_conversation("m")
        s.add_message(conv.id, "user", "from the future")
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 4}")
    conn.commit()
    conn.close()
    with Store.open(path) as s:
        assert s.read_only
        assert "newer version" in s.notice and "read-only" in s.notice and str(path) in s.notice
        assert [c.title for c in s.list_conversations()] == ["from the future"]
        assert s.search("future")[0].conversation_id == conv.id
        assert "from the future" in s.export_markdown(conv.id)
        for write in (lambda: s.create_conversation("m"), lambda: s.rename(conv.id, "x"),
                      lambda: s.add_message(conv.id, "user", "x"), lambda: s.delete(conv.id)):
            with pytest.raises(ReadOnlyStoreError, match="newer version"):
                write()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 4  # never downgraded
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1
    conn.close()


def _assert_set_aside(store: Store, path: Path, original: bytes) -> None:
    assert store.set_aside is not None and store.set_aside.exists()
    assert store.set_aside.name.startswith("history.sqlite3.corrupt-")
    assert store.set_aside.read_bytes() == original  # nothing deleted or rewritten
    assert str(store.set_aside) in store.notice and "new, empty history" in store.notice
    assert not store.read_only and store.list_conversations() == []
    conv = store.create_conversation("m")  # the fresh database works
    store.add_message(conv.id, "user", "fresh start")
    assert store.search("fresh")[0].conversation_id == conv.id


def test_not_a_database_is_set_aside_with_its_wal(tmp_path):
    path = tmp_path / "history.sqlite3"
    garbage = b"this is not a database, it is a shopping list\n" * 200
    path.write_bytes(garbage)
    (tmp_path / "history.sqlite3-wal").write_bytes(b"stale wal")
    with Store.open(path) as s:
        _assert_set_aside(s, path, garbage)
        assert Path(str(s.set_aside) + "-wal").read_bytes() == b"stale wal"
        assert "not a database" in s.notice


def test_malformed_database_is_set_aside(tmp_path):
    path = tmp_path / "history.sqlite3"
    with Store.open(path) as s:
        for n in range(20):
            conv = s.create_conversation("m")
            for k in range(10):
                s.add_message(conv.id, "user", f"message {n}.{k} " + "lorem ipsum " * 40)
        root = s._conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'").fetchone()[0]
        page_size = s._conn.execute("PRAGMA page_size").fetchone()[0]
    with open(path, "r+b") as fh:  # scribble over the messages table's root page
        fh.seek((root - 1) * page_size)
        fh.write(b"\xff" * page_size)
    damaged = path.read_bytes()
    with Store.open(path) as s:
        _assert_set_aside(s, path, damaged)
        assert "integrity check" in s.notice and "\n" not in s.notice
    aside = [p.name.replace(s.set_aside.name, "") for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    assert sorted(aside) in (["", "-shm"], ["", "-shm", "-wal"])  # the file and its companions, moved together


def test_a_busy_database_is_not_mistaken_for_damage(tmp_path):
    path = tmp_path / "history.sqlite3"
    with Store.open(path) as s:
        conv = s.create_conversation("m")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process mid-write
    try:
        with Store.open(path, busy_timeout_s=0.2) as s:
            assert s.notice is None and [c.id for c in s.list_conversations()] == [conv.id]
            with pytest.raises(StoreError, match="busy"):
                s.rename(conv.id, "x")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert list(tmp_path.glob("*.corrupt-*")) == []


def test_export_of_everything_survives_json(tmp_path):
    """Unicode, newlines and quotes in every field come back unchanged through export/import."""
    with Store.open(tmp_path / "h.sqlite3") as s:
        conv = s.create_conversation("Qwen3.5-0.8B", 'say "hi"\nnicely', {"stop": ["</s>"], "темп": 0.1})
        s.add_message(conv.id, "user", "naïve 你好 \"quoted\"\n\nsecond paragraph")
        s.add_message(conv.id, "assistant", "```py\nprint('x')\n```", reasoning="<think>-ish 🙂")
        doc = json.loads(s.export_json(conv.id))
        new = s.get_conversation(s.import_json(doc))
        old = s.get_conversation(conv.id)
        assert [(m.content, m.reasoning) for m in new.messages] == [(m.content, m.reasoning) for m in old.messages]
        assert (new.system_prompt, new.settings) == (old.system_prompt, old.settings)
