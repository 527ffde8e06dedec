"""The history's tables and their migrations from every earlier version, and the full-text search index."""

from __future__ import annotations

import functools
import logging
import sqlite3
from typing import Callable

from macapp.core.history.db import Database, user_version

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- migrations
# Each step migrates user_version N-1 -> N inside one transaction. Never edit a shipped step; append a new one
# (a new ReplyStats field needs a step that adds its column: tests/core/history/test_schema.py checks).


def _migrate_1_base(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL,
            updated REAL NOT NULL,
            system_prompt TEXT,
            settings TEXT NOT NULL DEFAULT '{}'
        )"""
    )
    conn.execute(
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL DEFAULT '',
            reasoning TEXT NOT NULL DEFAULT '',
            thinking INTEGER NOT NULL DEFAULT 0,
            ttft_s REAL,
            prompt_tokens INTEGER,
            prompt_tps REAL,
            generation_tokens INTEGER,
            generation_tps REAL,
            reasoning_tokens INTEGER,
            peak_memory_bytes INTEGER,
            finish_reason TEXT,
            state TEXT NOT NULL DEFAULT 'complete' CHECK (state IN ('streaming', 'stopped', 'complete')),
            created REAL NOT NULL,
            UNIQUE (conversation_id, position)
        )"""
    )
    conn.execute("CREATE INDEX conversations_by_updated ON conversations(updated)")


def _migrate_2_reply_model(conn: sqlite3.Connection) -> None:
    """Which model wrote each reply (people switch models mid-conversation); backfilled from the conversation."""
    conn.execute("ALTER TABLE messages ADD COLUMN model TEXT")
    conn.execute(
        """UPDATE messages SET model = (SELECT NULLIF(c.model, '') FROM conversations c WHERE c.id = messages.conversation_id)
           WHERE role = 'assistant'"""
    )


def _migrate_3_search_index(conn: sqlite3.Connection) -> None:
    """Full-text index over content and reasoning (FTS5 trigram: substring search, CJK included)."""
    # Replies in flight are not in the text index; search reads them through this small partial index.
    conn.execute("CREATE INDEX messages_streaming ON messages(id) WHERE state = 'streaming'")
    if fts5_available():
        create_search_index(conn)
    # Without FTS5 the version still advances: search falls back to a scan, and the index is built
    # later by `ensure_search_index` when a SQLite with FTS5 opens the file.


def _migrate_4_pictures(conn: sqlite3.Connection) -> None:
    """Pictures sent with a message (a JSON list of references to files in the app's pictures folder) and the
    image tokens a reply's prompt held."""
    conn.execute("ALTER TABLE messages ADD COLUMN images TEXT NOT NULL DEFAULT '[]'")
    conn.execute("ALTER TABLE messages ADD COLUMN image_tokens INTEGER")


def _migrate_5_tool_calls(conn: sqlite3.Connection) -> None:
    """The MCP tool calls a reply made (a JSON list; macapp.core.tools)."""
    conn.execute("ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '[]'")


def _migrate_6_cache_tokens(conn: sqlite3.Connection) -> None:
    """A reply's tokens as the session's cache held them (little-endian uint32s; NULL: unknown), so a reopened
    conversation reads exactly what its session held (engine.turns.replay)."""
    conn.execute("ALTER TABLE messages ADD COLUMN cache_tokens BLOB")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _migrate_1_base,
    _migrate_2_reply_model,
    _migrate_3_search_index,
    _migrate_4_pictures,
    _migrate_5_tool_calls,
    _migrate_6_cache_tokens,
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Run every step after `version`, each in its own transaction (a failed step leaves the file as it was)."""
    for target in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the lock.
            if user_version(conn) >= target:
                conn.execute("COMMIT")
                continue
            MIGRATIONS[target - 1](conn)
            conn.execute(f"PRAGMA user_version = {target}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        log.info("Chat history schema migrated to version %d", target)


# ---------------------------------------------------------------- full-text index
# The index holds its own copy of the text and skips replies while they stream: re-indexing a long reply on
# every 1 s commit would cost the engine's thread tens of ms; a reply is indexed once, when it ends.
FTS_TRIGGERS = {
    "messages_fts_ai": """CREATE TRIGGER messages_fts_ai AFTER INSERT ON messages WHEN new.state != 'streaming' BEGIN
        INSERT INTO messages_fts(rowid, content, reasoning) VALUES (new.id, new.content, new.reasoning); END""",
    "messages_fts_ad": """CREATE TRIGGER messages_fts_ad AFTER DELETE ON messages BEGIN
        DELETE FROM messages_fts WHERE rowid = old.id; END""",
    "messages_fts_au": """CREATE TRIGGER messages_fts_au AFTER UPDATE OF content, reasoning, state ON messages
        WHEN old.state != 'streaming' OR new.state != 'streaming' BEGIN
        DELETE FROM messages_fts WHERE rowid = old.id;
        INSERT INTO messages_fts(rowid, content, reasoning)
        SELECT new.id, new.content, new.reasoning WHERE new.state != 'streaming'; END""",
}


@functools.cache
def fts5_available() -> bool:
    """Whether this Python's SQLite has FTS5 with the trigram tokenizer (SQLite >= 3.34)."""
    try:
        probe = sqlite3.connect(":memory:")
        try:
            probe.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='trigram')")
            return True
        finally:
            probe.close()
    except sqlite3.Error:
        return False


def create_search_index(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(content, reasoning, tokenize='trigram')")
    for name, sql in FTS_TRIGGERS.items():
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        conn.execute(sql)
    conn.execute("DELETE FROM messages_fts")
    conn.execute("INSERT INTO messages_fts(rowid, content, reasoning) SELECT id, content, reasoning FROM messages WHERE state != 'streaming'")


def _schema_names(conn: sqlite3.Connection, kind: str) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = ?", (kind,))}


def ensure_search_index(database: Database) -> bool:
    """Keep the FTS index consistent with what this SQLite can do; True when search can use it."""
    with database.lock:
        tables = _schema_names(database.conn, "table")
        triggers = _schema_names(database.conn, "trigger")
        have_all = set(FTS_TRIGGERS) <= triggers
        if fts5_available():
            if "messages_fts" in tables and have_all:
                return True
            with database.write() as conn:
                create_search_index(conn)
            return True
        if triggers & set(FTS_TRIGGERS):
            # Triggers into an FTS5 table this SQLite cannot load would make every write fail.
            with database.write() as conn:
                for name in FTS_TRIGGERS:
                    conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        return False
