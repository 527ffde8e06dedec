"""Migrations from every earlier version, a failed or interrupted one, a newer schema, and the records' columns."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from macapp.core.history import SCHEMA_VERSION, ReadOnlyStoreError, ReplyStats, Store, StoreError, schema
from macapp.core.history.rows import MESSAGE_COLUMNS

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
V3_DDL = V2_DDL + ["CREATE INDEX messages_streaming ON messages(id) WHERE state = 'streaming'"]  # FTS built on open
V4_DDL = V3_DDL + ["ALTER TABLE messages ADD COLUMN images TEXT NOT NULL DEFAULT '[]'", "ALTER TABLE messages ADD COLUMN image_tokens INTEGER"]
V5_DDL = V4_DDL + ["ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '[]'"]
OLD_SCHEMAS = {1: V1_DDL, 2: V2_DDL, 3: V3_DDL, 4: V4_DDL, 5: V5_DDL}


def _build_old(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    for sql in OLD_SCHEMAS[version]:
        conn.execute(sql)
    conn.execute("INSERT INTO conversations VALUES (7, 'Bread', 'Qwen3.5-9B', 1000.0, 2000.0, 'Be brief.', '{\"top_p\": 0.9}')")
    conn.execute("INSERT INTO conversations VALUES (8, '', '', 1500.0, 1500.0, NULL, '{}')")
    cols = "id, conversation_id, position, role, content, reasoning, thinking, generation_tokens, generation_tps, finish_reason, state, created"
    conn.execute(f"INSERT INTO messages ({cols}) VALUES (1, 7, 0, 'user', 'How to knead?', '', 0, NULL, NULL, NULL, 'complete', 1000)")
    conn.execute(f"INSERT INTO messages ({cols}) VALUES (2, 7, 1, 'assistant', 'Push and fold.', 'hands', 1, 12, 30.5, 'stop', 'complete', 1001)")
    conn.execute(f"INSERT INTO messages ({cols}) VALUES (3, 7, 2, 'assistant', 'Half a rep', '', 0, NULL, NULL, NULL, 'stopped', 1002)")
    if version >= 2:
        conn.execute("UPDATE messages SET model = 'Qwen3.5-4B' WHERE id = 3")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


@pytest.fixture
def old_v1(tmp_path):
    path = tmp_path / "history.sqlite3"
    _build_old(path, 1)
    return path


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_migrates_from_every_earlier_version(tmp_path, outside, version):
    assert SCHEMA_VERSION == 6  # add the new version's frozen DDL above when this changes
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
        assert (bread.title, bread.model, bread.system_prompt, bread.settings) == ("Bread", "Qwen3.5-9B", "Be brief.", {"top_p": 0.9})
        knead, push, half = bread.messages
        assert (knead.content, push.content, push.reasoning, push.thinking) == ("How to knead?", "Push and fold.", "hands", True)
        assert (push.stats.generation_tokens, push.stats.generation_tps, push.finish_reason) == (12, 30.5, "stop")
        assert half.state == "stopped"
        assert knead.model is None  # only replies carry a model
        assert push.tool_calls == []  # schema 5: no tool calls in a reply from before
        assert push.cache_tokens == () and "cache_tokens" not in bread.chat_messages()[2]  # schema 6: none saved before
        # v1 -> v2 backfills replies from the conversation; a v2 database is left as its app wrote it.
        assert push.model == ("Qwen3.5-9B" if version == 1 else None)
        assert half.model == ("Qwen3.5-4B" if version >= 2 else "Qwen3.5-9B")  # never overwrites
        # The search index covers the migrated rows and new ones alike; ids keep counting from the old ones.
        assert [h.message_id for h in s.search("knead")] == [1]
        m = s.add_message(8, "user", "new kneading question")
        assert m.id == 4 and m.position == 0
        assert s.get_conversation(8).title == "new kneading question"
        assert sorted(h.message_id for h in s.search("knead")) == [1, 4]
        assert outside(path, "integrity_check") == "ok"
    with Store.open(path) as s:  # reopening is a no-op
        assert s.migrated_from is None and s.schema_version == SCHEMA_VERSION


def test_every_record_field_has_its_column_of_the_right_type(store):
    """A new Message or ReplyStats field needs a migration that adds its column (never an edit of a shipped step)."""
    declared = {row["name"]: row["type"] for row in store.database.query("PRAGMA table_info(messages)")}
    assert set(MESSAGE_COLUMNS) <= set(declared)
    sql_type = {"float | None": "REAL", "int | None": "INTEGER"}
    for f in fields(ReplyStats):
        assert declared[f.name] == sql_type[f.type], f.name


def test_a_failed_migration_leaves_the_old_database_untouched(old_v1, tmp_path):
    path = old_v1
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


def test_a_migration_finished_by_another_process_is_not_run_twice(old_v1):
    conn = sqlite3.connect(old_v1, isolation_level=None)
    schema.migrate(conn, 1)  # another app got there first ...
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    schema.migrate(conn, 1)  # ... so a second run from the version it saw skips every step (no duplicate column)
    conn.close()
    with Store.open(old_v1) as s:
        assert s.migrated_from is None and s.get_conversation(7).title == "Bread"


def test_an_old_database_killed_mid_write_is_rolled_back_then_migrated(old_v1, tmp_path):
    """A v1 file in rollback-journal mode with a hot journal: read-only checks cannot open it; recovery must."""
    path = old_v1
    killer = (
        "import os, sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('PRAGMA cache_size = 1')\n"
        "c.execute('BEGIN')\n"
        "c.execute(\"UPDATE messages SET content = 'half-written' WHERE id = 1\")\n"
        'c.execute("INSERT INTO conversations (title, created, updated) '
        "SELECT hex(randomblob(300)), 0, 0 FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r "
        'WHERE i < 3000) SELECT i FROM r)")\n'
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
        assert s.recover_interrupted(older_than_s=-1) == 0
        for write in (
            lambda: s.create_conversation("m"),
            lambda: s.rename(conv.id, "x"),
            lambda: s.add_message(conv.id, "user", "x"),
            lambda: s.delete(conv.id),
        ):
            with pytest.raises(ReadOnlyStoreError, match="newer version"):
                write()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 4  # never downgraded
    assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1
    conn.close()
