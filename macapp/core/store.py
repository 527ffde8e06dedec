"""Chat history: conversations and messages in one SQLite file (WAL), schema-versioned, crash-safe, searchable.

Contract for callers (the chat window, `qwen-desk chat`):
- Commit every user message (`add_message(..., role="user")`) BEFORE starting generation for it.
- Stream the reply through `begin_reply()` -> `ReplyWriter.update()/append()` -> `finish()`; the writer commits
  at most once per `interval` (1 s) while streaming, flushes pending text within that interval even when the
  stream stalls, and always commits on `finish()`. A kill -9 therefore loses at most ~1 s of the reply in
  flight; committed rows are never rewritten except by that reply's own writer.
- One `Store` (one connection) may be shared by threads; calls are serialised by a lock. Other processes may
  open the same file at the same time (WAL readers never block the writer; writers wait up to the busy timeout).

Bad input never loses data: a database written by a newer app version is opened read-only
(`store.read_only`, `store.notice`; writes raise `ReadOnlyStoreError`), and a corrupt file is renamed aside
(`store.set_aside`, `store.notice`) and a fresh database is started in its place.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from macapp import __version__
from macapp.core import paths
from macapp.core.events import format_stats

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
STATES = ("streaming", "stopped", "complete")
EXPORT_FORMAT = "qwen-desk.conversation"
EXPORT_FORMAT_VERSION = 1
TITLE_LIMIT = 60
DEFAULT_COMMIT_INTERVAL_S = 1.0
# A reply still marked "streaming" whose conversation saw no write for this long was cut off (crash, kill -9).
INTERRUPTED_AFTER_S = 120.0

_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


class StoreError(Exception):
    """A history operation failed; the message is meant for people."""


class ReadOnlyStoreError(StoreError):
    """The history is open read-only (written by a newer app version)."""


class NotFoundError(StoreError):
    """No conversation (or message) with that id."""


class ImportFormatError(StoreError):
    """The data to import is not a conversation this app understands."""


# ---------------------------------------------------------------- records


@dataclass
class ReplyStats:
    """Per-reply figures; None where unknown."""

    ttft_s: float | None = None
    prompt_tokens: int | None = None
    prompt_tps: float | None = None
    generation_tokens: int | None = None
    generation_tps: float | None = None
    reasoning_tokens: int | None = None
    peak_memory_bytes: int | None = None

    @classmethod
    def from_any(cls, obj: Any) -> ReplyStats:
        """Build from a ReplyStats, a dict, or any object with these attribute names (e.g. the engine's stats)."""
        if obj is None:
            return cls()
        if isinstance(obj, cls):
            return obj
        get: Callable[[str], Any]
        if isinstance(obj, dict):
            get = obj.get
        else:
            get = lambda name: getattr(obj, name, None)  # noqa: E731
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = get(f.name)
            if value is not None:
                value = int(value) if f.type in ("int | None",) else float(value)
            values[f.name] = value
        return cls(**values)

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def summary(self) -> str:
        """The same one-line stats as the chat command line (macapp.core.events.format_stats)."""
        return format_stats(self)


@dataclass
class Message:
    id: int
    conversation_id: int
    position: int
    role: str
    content: str
    reasoning: str = ""
    thinking: bool = False
    state: str = "complete"
    finish_reason: str | None = None
    stats: ReplyStats = field(default_factory=ReplyStats)
    model: str | None = None
    created: float = 0.0

    @property
    def stopped(self) -> bool:
        return self.state == "stopped"


@dataclass
class Conversation:
    id: int
    title: str
    model: str
    created: float
    updated: float
    system_prompt: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    message_count: int = 0
    messages: list[Message] = field(default_factory=list)  # filled by get_conversation, empty in listings

    @property
    def display_title(self) -> str:
        return self.title or "New chat"

    def chat_messages(self, include_system: bool = True) -> list[dict[str, Any]]:
        """The conversation in the engine's message shape, to reopen it: `engine.new_session(messages=...)`.

        {role, content}; replies also carry reasoning, thinking and finish_reason, like ChatSession.messages.
        """
        out: list[dict[str, Any]] = []
        if include_system and self.system_prompt:
            out.append({"role": "system", "content": self.system_prompt})
        for m in self.messages:
            item: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.role == "assistant":
                item.update(reasoning=m.reasoning, thinking=m.thinking, finish_reason=m.finish_reason)
            out.append(item)
        return out


@dataclass
class SearchHit:
    conversation_id: int
    conversation_title: str
    message_id: int
    position: int
    role: str
    snippet: str
    updated: float


# ---------------------------------------------------------------- schema and migrations
# Each step migrates user_version N-1 -> N inside one transaction. Never edit a shipped step; append a new one.


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
        _create_search_index(conn)
    # Without FTS5 the version still advances: search falls back to a scan, and the index is built
    # later by `_ensure_search_index` when a SQLite with FTS5 opens the file.


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _migrate_1_base,
    _migrate_2_reply_model,
    _migrate_3_search_index,
]
SCHEMA_VERSION = len(MIGRATIONS)

# The index holds its own copy of the text and skips replies while they stream: re-indexing a long reply on
# every 1 s commit would cost the engine's thread tens of ms; a reply is indexed once, when it ends.
_FTS_TRIGGERS = {
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

_fts5_cache: bool | None = None


def fts5_available() -> bool:
    """Whether this Python's SQLite has FTS5 with the trigram tokenizer (SQLite >= 3.34)."""
    global _fts5_cache
    if _fts5_cache is None:
        try:
            probe = sqlite3.connect(":memory:")
            try:
                probe.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='trigram')")
                _fts5_cache = True
            finally:
                probe.close()
        except sqlite3.Error:
            _fts5_cache = False
    return _fts5_cache


def _create_search_index(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(content, reasoning, tokenize='trigram')")
    for name, sql in _FTS_TRIGGERS.items():
        conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        conn.execute(sql)
    conn.execute("DELETE FROM messages_fts")
    conn.execute(
        "INSERT INTO messages_fts(rowid, content, reasoning) "
        "SELECT id, content, reasoning FROM messages WHERE state != 'streaming'"
    )


def _schema_names(conn: sqlite3.Connection, kind: str) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = ?", (kind,))}


# ---------------------------------------------------------------- helpers


def title_from_text(text: str, limit: int = TITLE_LIMIT) -> str:
    """A one-line title from a message: its first non-empty line, whitespace collapsed, cut at a word near `limit`."""
    line = ""
    for raw in text.splitlines():
        candidate = " ".join(raw.split())
        if candidate and not candidate.startswith("```"):
            line = candidate.lstrip("#>*- ").strip() or candidate
            break
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,.;:-") + "…"


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _parse_time(value: Any, default: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return default
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        return parsed.timestamp()
    return default


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text or "file is encrypted" in text


def _contains(haystack: str | None, needle: str | None) -> int:
    return int(bool(needle) and needle.casefold() in (haystack or "").casefold())


_TERM = re.compile(r'"([^"]+)"|(\S+)')


def search_terms(query: str) -> list[str]:
    """Words of a query; "double quotes" keep a phrase together. Every term must appear (case-insensitive)."""
    return [(m.group(1) or m.group(2)).strip() for m in _TERM.finditer(query) if (m.group(1) or m.group(2)).strip()]


def _snippet(text: str, term: str, width: int = 40) -> str:
    flat = " ".join(text.split())
    at = flat.casefold().find(term.casefold())
    if at < 0:
        return flat[: 2 * width] + ("…" if len(flat) > 2 * width else "")
    start = max(0, at - width)
    end = min(len(flat), at + len(term) + width)
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")


_MESSAGE_COLUMNS = (
    "id, conversation_id, position, role, content, reasoning, thinking, state, finish_reason, "
    "ttft_s, prompt_tokens, prompt_tps, generation_tokens, generation_tps, reasoning_tokens, peak_memory_bytes, "
    "model, created"
)


def _message_from_row(row: sqlite3.Row) -> Message:
    return Message(
        id=row["id"],
        conversation_id=row["conversation_id"],
        position=row["position"],
        role=row["role"],
        content=row["content"],
        reasoning=row["reasoning"],
        thinking=bool(row["thinking"]),
        state=row["state"],
        finish_reason=row["finish_reason"],
        stats=ReplyStats(
            ttft_s=row["ttft_s"],
            prompt_tokens=row["prompt_tokens"],
            prompt_tps=row["prompt_tps"],
            generation_tokens=row["generation_tokens"],
            generation_tps=row["generation_tps"],
            reasoning_tokens=row["reasoning_tokens"],
            peak_memory_bytes=row["peak_memory_bytes"],
        ),
        model=row["model"],
        created=row["created"],
    )


def _conversation_from_row(row: sqlite3.Row) -> Conversation:
    try:
        settings = json.loads(row["settings"] or "{}")
    except ValueError:
        settings = {}
    return Conversation(
        id=row["id"],
        title=row["title"],
        model=row["model"],
        created=row["created"],
        updated=row["updated"],
        system_prompt=row["system_prompt"],
        settings=settings if isinstance(settings, dict) else {},
        message_count=row["message_count"],
    )


# ---------------------------------------------------------------- the store


class Store:
    """The history database. Open with `Store.open()` (a context manager); share one per process."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        *,
        read_only: bool = False,
        notice: str | None = None,
        set_aside: Path | None = None,
        migrated_from: int | None = None,
    ) -> None:
        self._conn = conn
        self._lock = threading.RLock()
        self.path = path
        self.read_only = read_only
        self.notice = notice  # a sentence for people (banner in the window, stderr in the CLI), or None
        self.set_aside = set_aside  # where a corrupt file was moved, or None
        self.migrated_from = migrated_from  # the schema version found on disk, when it was migrated
        self._search_indexed = False

    # -- opening

    @classmethod
    def open(cls, path: Path | str | None = None, *, busy_timeout_s: float = 5.0) -> Store:
        """Open (creating or migrating) the history at `path` (default: paths.db_path())."""
        db = Path(path) if path is not None else paths.db_path()
        db.parent.mkdir(parents=True, exist_ok=True)
        try:
            return cls._open_checked(db, busy_timeout_s)
        except _CorruptDatabase as exc:
            reason = str(exc)
        except sqlite3.DatabaseError as exc:
            if not _is_corruption(exc):
                raise StoreError(f"Could not open the chat history at {db}: {exc}") from exc
            reason = str(exc)
        aside = _set_aside(db)
        store = cls._open_checked(db, busy_timeout_s)
        store.set_aside = aside
        store.notice = (
            f"The chat history at {db} was damaged ({reason}). It was moved to {aside} and a new, empty "
            f"history was started; nothing was deleted."
        )
        log.warning(store.notice)
        return store

    @classmethod
    def _open_checked(cls, db: Path, busy_timeout_s: float) -> Store:
        probe = _read_only_probe(db, busy_timeout_s)
        if probe is not None:
            try:
                version = probe.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    store, probe = cls._newer(probe, db, version), None
                    return store
                problems = [row[0] for row in probe.execute("PRAGMA quick_check(5)")]
                if problems != ["ok"]:
                    detail = " ".join(" ".join(problems).replace("*** in database main ***", "").split())
                    raise _CorruptDatabase(f"integrity check: {detail[:160]}")
            finally:
                if probe is not None:
                    probe.close()
        conn = _connect(db, busy_timeout_s)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:  # a newer app upgraded it meanwhile
                conn.close()
                return cls._newer(_connect(db, busy_timeout_s, read_only=True), db, version)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                log.warning("SQLite kept journal mode %s for %s", mode, db)
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes, never corrupt
            _migrate(conn, version)
            store = cls(conn, db, migrated_from=version if 0 < version < SCHEMA_VERSION else None)
            store._search_indexed = store._ensure_search_index()
            try:
                store.recover_interrupted()
            except StoreError as exc:  # another process holds the write lock: not worth failing the open
                log.info("Skipped marking interrupted replies: %s", exc)
            return store
        except BaseException:
            conn.close()
            raise

    @classmethod
    def _newer(cls, conn: sqlite3.Connection, db: Path, version: int) -> Store:
        notice = (
            f"This chat history was written by a newer version of Qwen Desk (schema {version}; this app knows "
            f"{SCHEMA_VERSION}), so it is open read-only. Update Qwen Desk to add to it. ({db})"
        )
        log.warning(notice)
        return cls(conn, db, read_only=True, notice=notice)

    def _ensure_search_index(self) -> bool:
        """Keep the FTS index consistent with what this SQLite can do; True when search can use it."""
        with self._lock:
            tables = _schema_names(self._conn, "table")
            triggers = _schema_names(self._conn, "trigger")
            have_all = set(_FTS_TRIGGERS) <= triggers
            if fts5_available():
                if "messages_fts" in tables and have_all:
                    return True
                with self._write():
                    _create_search_index(self._conn)
                return True
            if triggers & set(_FTS_TRIGGERS):
                # Triggers into an FTS5 table this SQLite cannot load would make every write fail.
                with self._write():
                    for name in _FTS_TRIGGERS:
                        self._conn.execute(f"DROP TRIGGER IF EXISTS {name}")
            return False

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return self._conn.execute("PRAGMA user_version").fetchone()[0]

    # -- transactions

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise ReadOnlyStoreError(self.notice or "The chat history is open read-only.")
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StoreError(
                    f"The chat history is busy ({exc}); another Qwen Desk may be writing to {self.path}. Try again."
                ) from exc
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot across several SELECTs."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                self._conn.execute("COMMIT")

    # -- conversations

    def create_conversation(
        self,
        model: str = "",
        system_prompt: str | None = None,
        settings: dict[str, Any] | None = None,
        title: str = "",
    ) -> Conversation:
        now = time.time()
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO conversations (title, model, created, updated, system_prompt, settings) VALUES (?, ?, ?, ?, ?, ?)",
                (title, model or "", now, now, system_prompt, json.dumps(settings or {}, sort_keys=True)),
            )
            conversation_id = cur.lastrowid
        return Conversation(
            id=conversation_id, title=title, model=model or "", created=now, updated=now,
            system_prompt=system_prompt, settings=dict(settings or {}),
        )

    def list_conversations(self, limit: int | None = None) -> list[Conversation]:
        """Newest activity first; messages not loaded (see `message_count`)."""
        sql = (
            "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS message_count "
            "FROM conversations c ORDER BY c.updated DESC, c.id DESC"
        )
        params: tuple = ()
        if limit is not None:
            sql += " LIMIT ?"
            params = (limit,)
        with self._lock:
            return [_conversation_from_row(row) for row in self._conn.execute(sql, params)]

    def get_conversation(self, conversation_id: int) -> Conversation:
        """The conversation with all its messages in order; NotFoundError if there is none."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) AS message_count "
                "FROM conversations c WHERE c.id = ?",
                (conversation_id,),
            ).fetchone()
            if row is None:
                raise NotFoundError(f"There is no conversation {conversation_id}.")
            conversation = _conversation_from_row(row)
            conversation.messages = [
                _message_from_row(r)
                for r in conn.execute(
                    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY position",
                    (conversation_id,),
                )
            ]
        return conversation

    def rename(self, conversation_id: int, title: str) -> None:
        title = " ".join(title.split())
        with self._write() as conn:
            cur = conn.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
            if cur.rowcount == 0:
                raise NotFoundError(f"There is no conversation {conversation_id}.")

    def update_conversation(
        self,
        conversation_id: int,
        *,
        model: str | None = None,
        system_prompt: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        """Change the model / system prompt / settings recorded for a conversation (None leaves a field as is)."""
        sets, params = [], []
        for column, value in (("model", model), ("system_prompt", system_prompt)):
            if value is not None:
                sets.append(f"{column} = ?")
                params.append(value)
        if settings is not None:
            sets.append("settings = ?")
            params.append(json.dumps(settings, sort_keys=True))
        if not sets:
            return
        with self._write() as conn:
            cur = conn.execute(f"UPDATE conversations SET {', '.join(sets)} WHERE id = ?", (*params, conversation_id))
            if cur.rowcount == 0:
                raise NotFoundError(f"There is no conversation {conversation_id}.")

    def delete(self, conversation_id: int) -> Conversation:
        """Delete a conversation and its messages; returns the full conversation, which `restore()` puts back (undo)."""
        with self._lock:
            snapshot = self.get_conversation(conversation_id)
            with self._write() as conn:
                conn.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
                conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return snapshot

    def restore(self, snapshot: Conversation) -> int:
        """Put back a deleted conversation with its original ids (ids are never reused); returns its id."""
        with self._write() as conn:
            taken = conn.execute("SELECT 1 FROM conversations WHERE id = ?", (snapshot.id,)).fetchone()
            return self._insert_conversation(conn, snapshot, keep_ids=not taken)

    def _insert_conversation(self, conn: sqlite3.Connection, conv: Conversation, keep_ids: bool) -> int:
        cur = conn.execute(
            "INSERT INTO conversations (id, title, model, created, updated, system_prompt, settings) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                conv.id if keep_ids else None, conv.title, conv.model or "", conv.created, conv.updated,
                conv.system_prompt, json.dumps(conv.settings or {}, sort_keys=True),
            ),
        )
        new_id = cur.lastrowid
        for position, m in enumerate(conv.messages):
            s = m.stats
            conn.execute(
                f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES ({', '.join('?' * 18)})",
                (
                    m.id if keep_ids else None, new_id, position, m.role, m.content, m.reasoning or "",
                    int(m.thinking), m.state, m.finish_reason, s.ttft_s, s.prompt_tokens, s.prompt_tps,
                    s.generation_tokens, s.generation_tps, s.reasoning_tokens, s.peak_memory_bytes, m.model,
                    m.created,
                ),
            )
        return new_id

    # -- messages

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        *,
        reasoning: str = "",
        thinking: bool = False,
        state: str = "complete",
        stats: Any = None,
        finish_reason: str | None = None,
        model: str | None = None,
    ) -> Message:
        """Append and commit one message. The first user message also titles an untitled conversation."""
        if role not in ROLES:
            raise StoreError(f"Unknown role {role!r}; expected one of {', '.join(ROLES)}.")
        if state not in STATES:
            raise StoreError(f"Unknown state {state!r}; expected one of {', '.join(STATES)}.")
        s = ReplyStats.from_any(stats)
        now = time.time()
        with self._write() as conn:
            conv = conn.execute("SELECT title FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if conv is None:
                raise NotFoundError(f"There is no conversation {conversation_id}.")
            position = conn.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()[0]
            cur = conn.execute(
                f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES ({', '.join('?' * 18)})",
                (
                    None, conversation_id, position, role, content, reasoning or "", int(thinking), state,
                    finish_reason, s.ttft_s, s.prompt_tokens, s.prompt_tps, s.generation_tokens, s.generation_tps,
                    s.reasoning_tokens, s.peak_memory_bytes, model, now,
                ),
            )
            title_update = ""
            params: list[Any] = [now]
            if role == "user" and not conv["title"] and title_from_text(content):
                title_update = ", title = ?"
                params.append(title_from_text(content))
            if model and role == "assistant":
                title_update += ", model = ?"
                params.append(model)
            conn.execute(f"UPDATE conversations SET updated = ?{title_update} WHERE id = ?", (*params, conversation_id))
        return Message(
            id=cur.lastrowid, conversation_id=conversation_id, position=position, role=role, content=content,
            reasoning=reasoning or "", thinking=thinking, state=state, finish_reason=finish_reason, stats=s,
            model=model, created=now,
        )

    def begin_reply(
        self,
        conversation_id: int,
        *,
        thinking: bool = False,
        model: str | None = None,
        interval: float = DEFAULT_COMMIT_INTERVAL_S,
    ) -> ReplyWriter:
        """Commit an empty assistant message in state 'streaming' and return the writer that fills it in."""
        message = self.add_message(conversation_id, "assistant", "", thinking=thinking, state="streaming", model=model)
        return ReplyWriter(self, message, interval=interval)

    def truncate(self, conversation_id: int, from_position: int) -> list[Message]:
        """Remove messages at `from_position` and after (regenerate / edit the last turn); returns what was removed."""
        with self._lock:
            removed = [m for m in self.get_conversation(conversation_id).messages if m.position >= from_position]
            self._delete_from(conversation_id, from_position)
        return removed

    def _delete_from(self, conversation_id: int, from_position: int) -> None:
        with self._write() as conn:
            conn.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, from_position)
            )
            conn.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    def _write_reply(
        self,
        message: Message,
        *,
        final: bool,
        stats: ReplyStats | None = None,
    ) -> bool:
        """Commit a reply's current text (and, when final, its stats and state); False if the row is gone."""
        now = time.time()
        with self._write() as conn:
            if final:
                s = stats or ReplyStats()
                cur = conn.execute(
                    "UPDATE messages SET content = ?, reasoning = ?, state = ?, finish_reason = ?, ttft_s = ?, "
                    "prompt_tokens = ?, prompt_tps = ?, generation_tokens = ?, generation_tps = ?, "
                    "reasoning_tokens = ?, peak_memory_bytes = ? WHERE id = ?",
                    (
                        message.content, message.reasoning, message.state, message.finish_reason, s.ttft_s,
                        s.prompt_tokens, s.prompt_tps, s.generation_tokens, s.generation_tps, s.reasoning_tokens,
                        s.peak_memory_bytes, message.id,
                    ),
                )
            else:
                cur = conn.execute(
                    "UPDATE messages SET content = ?, reasoning = ?, state = 'streaming' WHERE id = ?",
                    (message.content, message.reasoning, message.id),
                )
            if cur.rowcount:
                conn.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, message.conversation_id))
        return bool(cur.rowcount)

    def recover_interrupted(self, older_than_s: float = INTERRUPTED_AFTER_S) -> int:
        """Mark replies left 'streaming' by a crashed writer as stopped ('interrupted'); returns how many."""
        if self.read_only:
            return 0
        cutoff = time.time() - older_than_s
        with self._lock:
            if self._conn.execute("SELECT 1 FROM messages WHERE state = 'streaming' LIMIT 1").fetchone() is None:
                return 0
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE messages SET state = 'stopped', finish_reason = COALESCE(finish_reason, 'interrupted') "
                "WHERE state = 'streaming' AND conversation_id IN (SELECT id FROM conversations WHERE updated < ?)",
                (cutoff,),
            )
        return cur.rowcount

    # -- search

    @property
    def search_uses_index(self) -> bool:
        return self._search_indexed

    def search(self, query: str, limit: int = 100) -> list[SearchHit]:
        """Messages (content or reasoning) containing every term of `query`, case-insensitive; newest conversations first."""
        terms = search_terms(query)
        if not terms:
            return []
        indexed = [t for t in terms if len(t) >= 3]  # trigram matching needs three characters
        base = (
            "SELECT m.id, m.conversation_id, m.position, m.role, m.content, m.reasoning, c.title, c.updated "
            "FROM messages m JOIN conversations c ON c.id = m.conversation_id"
        )
        order = " ORDER BY c.updated DESC, c.id DESC, m.position"
        with self._lock:
            if self._search_indexed and indexed:
                match = " AND ".join('"' + t.replace('"', '""') + '"' for t in indexed)
                sql = (
                    f"{base} WHERE m.id IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? "
                    f"UNION ALL SELECT id FROM messages WHERE state = 'streaming'){order}"
                )
                rows = self._conn.execute(sql, (match,))
            else:
                where = " AND ".join(["qd_contains(m.content || char(10) || m.reasoning, ?)"] * len(terms))
                rows = self._conn.execute(f"{base} WHERE {where}{order}", terms)
            hits = []
            for row in rows:
                text = row["content"] + "\n" + row["reasoning"]
                if not all(_contains(text, t) for t in terms):
                    continue
                in_content = _contains(row["content"], terms[0])
                hits.append(
                    SearchHit(
                        conversation_id=row["conversation_id"], conversation_title=row["title"],
                        message_id=row["id"], position=row["position"], role=row["role"],
                        snippet=_snippet(row["content"] if in_content else row["reasoning"], terms[0]),
                        updated=row["updated"],
                    )
                )
                if len(hits) >= limit:
                    break
            return hits

    # -- export / import

    def export_dict(self, conversation_id: int, include_reasoning: bool = True) -> dict[str, Any]:
        """The conversation as a JSON-ready dict (the `export_json` document)."""
        conv = self.get_conversation(conversation_id)
        messages = []
        for m in conv.messages:
            item: dict[str, Any] = {
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning if include_reasoning else None,
                "thinking": m.thinking,
                "created": iso_time(m.created),
            }
            if m.role == "assistant":
                stats = {k: v for k, v in asdict(m.stats).items() if v is not None}
                item.update(state=m.state, finish_reason=m.finish_reason, model=m.model, stats=stats)
            messages.append(item)
        return {
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_FORMAT_VERSION,
            "exported_by": f"Qwen Desk {__version__}",
            "id": conv.id,
            "title": conv.display_title,
            "model": conv.model,
            "created": iso_time(conv.created),
            "updated": iso_time(conv.updated),
            "system_prompt": conv.system_prompt,
            "settings": conv.settings,
            "reasoning_included": include_reasoning,
            "messages": messages,
        }

    def export_json(self, conversation_id: int, include_reasoning: bool = True) -> str:
        return json.dumps(self.export_dict(conversation_id, include_reasoning), ensure_ascii=False, indent=2) + "\n"

    def export_markdown(self, conversation_id: int, include_reasoning: bool = True) -> str:
        conv = self.get_conversation(conversation_id)
        lines = [f"# {conv.display_title}", ""]
        if conv.model:
            lines.append(f"- Model: {conv.model}")
        lines.append(f"- Created: {iso_time(conv.created)}")
        lines.append(f"- Updated: {iso_time(conv.updated)}")
        if conv.settings:
            lines.append("- Settings: " + ", ".join(f"{k}={v}" for k, v in sorted(conv.settings.items())))
        lines.append("")
        if conv.system_prompt:
            lines += ["## System", "", conv.system_prompt, ""]
        for m in conv.messages:
            lines += [f"## {m.role.capitalize()}", ""]
            if include_reasoning and m.reasoning:
                lines += ["<details><summary>Reasoning</summary>", "", m.reasoning.strip("\n"), "", "</details>", ""]
            lines += [m.content.strip("\n") if m.content else "*(no answer)*", ""]
            if m.role == "assistant":
                notes = [n for n in (m.model if m.model and m.model != conv.model else None, m.stats.summary()) if n]
                if m.state != "complete":
                    notes.append(f"{m.state}" + (f" ({m.finish_reason})" if m.finish_reason else ""))
                if notes:
                    lines += ["*" + " · ".join(notes) + "*", ""]
        return "\n".join(lines).rstrip("\n") + "\n"

    def import_json(self, data: dict[str, Any] | str | bytes) -> int:
        """Add a conversation from an exported JSON document (or any {messages: [{role, content}]}); returns its new id."""
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise ImportFormatError(f"Not JSON: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise ImportFormatError("Expected a JSON object with a \"messages\" list (as written by history export).")
        fmt = data.get("format")
        if fmt not in (None, EXPORT_FORMAT):
            raise ImportFormatError(f"Unknown format {fmt!r}; expected {EXPORT_FORMAT!r}.")
        now = time.time()
        messages = []
        for i, raw in enumerate(data["messages"]):
            if not isinstance(raw, dict) or raw.get("role") not in ROLES or not isinstance(raw.get("content", ""), str):
                raise ImportFormatError(
                    f"Message {i + 1} needs a role ({', '.join(ROLES)}) and text content; got {str(raw)[:80]!r}."
                )
            state = raw.get("state") if raw.get("state") in ("stopped", "complete") else "complete"
            if raw.get("state") == "streaming":
                state = "stopped"  # it is not streaming any more
            messages.append(
                Message(
                    id=0, conversation_id=0, position=i, role=raw["role"], content=raw.get("content") or "",
                    reasoning=raw.get("reasoning") or "", thinking=bool(raw.get("thinking")), state=state,
                    finish_reason=raw.get("finish_reason"), stats=ReplyStats.from_any(raw.get("stats")),
                    model=raw.get("model"), created=_parse_time(raw.get("created"), now),
                )
            )
        first_user = next((m.content for m in messages if m.role == "user"), "")
        title = data.get("title") if isinstance(data.get("title"), str) else ""
        settings = data.get("settings") if isinstance(data.get("settings"), dict) else {}
        system_prompt = data.get("system_prompt") if isinstance(data.get("system_prompt"), str) else None
        conv = Conversation(
            id=0, title=title or title_from_text(first_user), model=str(data.get("model") or ""),
            created=_parse_time(data.get("created"), now), updated=_parse_time(data.get("updated"), now),
            system_prompt=system_prompt, settings=settings, messages=messages,
        )
        with self._write() as conn:
            return self._insert_conversation(conn, conv, keep_ids=False)


class _CorruptDatabase(Exception):
    pass


def _connect(db: Path, busy_timeout_s: float, read_only: bool = False) -> sqlite3.Connection:
    target = f"{db.resolve().as_uri()}?mode=ro" if read_only else str(db)
    conn = sqlite3.connect(
        target, uri=read_only, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
    )
    conn.row_factory = sqlite3.Row
    conn.create_function("qd_contains", 2, _contains, deterministic=True)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _read_only_probe(db: Path, busy_timeout_s: float) -> sqlite3.Connection | None:
    """A read-only connection to check an existing file before writing to it; None when there is nothing to check.

    Read-only on purpose: closing a read-write connection on a damaged file would checkpoint into it and
    delete its -wal, which may hold the newest messages.
    """
    if not db.exists() or db.stat().st_size == 0:
        return None
    conn = None
    try:
        conn = _connect(db, busy_timeout_s, read_only=True)
        conn.execute("PRAGMA schema_version").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        if conn is not None:
            conn.close()
        if _is_corruption(exc):
            raise
        # e.g. a hot rollback journal, which only a read-write connection may recover: open that way unchecked.
        log.info("Read-only check of %s skipped: %s", db, exc)
        return None
    except sqlite3.DatabaseError:
        if conn is not None:
            conn.close()
        raise


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    for target in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the lock.
            if conn.execute("PRAGMA user_version").fetchone()[0] >= target:
                conn.execute("COMMIT")
                continue
            MIGRATIONS[target - 1](conn)
            conn.execute(f"PRAGMA user_version = {target}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        log.info("Chat history schema migrated to version %d", target)


def _set_aside(db: Path) -> Path:
    """Rename a damaged database (and its -wal/-shm) to <name>.corrupt-YYYYmmdd-HHMMSS; returns the new path."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    aside = db.with_name(f"{db.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside = db.with_name(f"{db.name}.corrupt-{stamp}-{n}")
        n += 1
    db.rename(aside)
    for suffix in ("-wal", "-shm", "-journal"):
        side = db.with_name(db.name + suffix)
        if side.exists():
            # Moved along: a stale WAL left beside the fresh database would be replayed into it.
            side.rename(aside.with_name(aside.name + suffix))
    return aside


class ReplyWriter:
    """Fills in one streaming assistant message: commits at most every `interval` s, and always on finish()."""

    def __init__(self, store: Store, message: Message, interval: float = DEFAULT_COMMIT_INTERVAL_S) -> None:
        self.store = store
        self.message = message
        self.interval = interval
        self.error: BaseException | None = None  # last commit failure (the stream itself carries on)
        self.commits = 0
        self._lock = threading.Lock()
        self._dirty = False
        self._closed = False
        self._last_commit = time.monotonic()
        self._timer: threading.Timer | None = None

    @property
    def message_id(self) -> int:
        return self.message.id

    @property
    def content(self) -> str:
        return self.message.content

    @property
    def reasoning(self) -> str:
        return self.message.reasoning

    @property
    def finished(self) -> bool:
        return self._closed

    def append(self, text: str = "", reasoning: str = "") -> None:
        """Add streamed pieces of answer and/or reasoning."""
        with self._lock:
            self._set(self.message.content + text, self.message.reasoning + reasoning)

    def update(self, text: str, reasoning: str | None = None) -> None:
        """Replace the reply so far (answer, and reasoning unless None)."""
        with self._lock:
            self._set(text, self.message.reasoning if reasoning is None else reasoning)

    def _set(self, text: str, reasoning: str) -> None:
        if self._closed:
            raise StoreError("This reply is already finished.")
        if text == self.message.content and reasoning == self.message.reasoning:
            return
        self.message.content, self.message.reasoning = text, reasoning
        self._dirty = True
        now = time.monotonic()
        due = self._last_commit + self.interval
        if now >= due:
            self._flush()
        elif self._timer is None:
            # Flush within the interval even if the stream stalls, so a crash loses at most ~interval of text.
            self._timer = threading.Timer(due - now, self._on_timer)
            self._timer.daemon = True
            self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty and not self._closed:
                self._flush()

    def _flush(self, stats: ReplyStats | None = None, final: bool = False) -> None:
        try:
            self.store._write_reply(self.message, final=final, stats=stats)
            self.commits += 1
            self._dirty = False
        except (sqlite3.Error, StoreError) as exc:
            self.error = exc
            log.warning("Could not save the reply in flight: %s", exc)
        self._last_commit = time.monotonic()

    def flush(self) -> None:
        """Commit pending text now."""
        with self._lock:
            if self._dirty and not self._closed:
                self._flush()

    def finish(self, stats: Any = None, finish_reason: str | None = None, stopped: bool = False) -> Message:
        """Commit the final text, stats, finish reason and state ('stopped' or 'complete'); returns the message."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._closed:
                return self.message
            self._closed = True
            self.message.stats = ReplyStats.from_any(stats)
            self.message.finish_reason = finish_reason
            self.message.state = "stopped" if stopped else "complete"
            self.error = None
            self._flush(self.message.stats, final=True)
            if self.error is not None:
                raise StoreError(f"Could not save the finished reply: {self.error}") from self.error
            return self.message
