"""The chat history: conversations and their messages, read and written through one Store.

Contract for callers (the recorder, `qwen-desk history`, the window's sidebar):
- Commit every user message (`add_message(..., role="user")`) BEFORE starting generation for it.
- Stream the reply through `begin_reply()` -> `ReplyWriter.update()/append()` -> `finish()` (macapp.core.history.writer);
  committed rows are never rewritten except by that reply's own writer.
- One `Store` (one connection) may be shared by threads; calls are serialised by its database's lock.

Bad input never loses data: a database written by a newer app version is opened read-only
(`store.read_only`, `store.notice`; writes raise `ReadOnlyStoreError`), and a corrupt file is renamed aside
(`store.set_aside`, `store.notice`) and a fresh database is started in its place.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from macapp.core.jsonvalue import JSONObject

from macapp.core import paths
from macapp.core.picture_data import ImageRef, PictureFiles
from macapp.core.history import rows, schema, transfer
from macapp.core.history.db import Database, SQLValue, open_or_set_aside
from macapp.core.history.errors import NotFoundError, StoreError
from macapp.core.history.records import (
    ROLES,
    STATES,
    Conversation,
    Message,
    MessageState,
    ReplyStats,
    Role,
    SearchHit,
    title_from_text,
)
from macapp.core.history.search import SQL_FUNCTIONS, Search
from macapp.core.history.writer import DEFAULT_COMMIT_INTERVAL_S, ReplyWriter

log = logging.getLogger(__name__)

# A reply still marked "streaming" whose conversation saw no write for this long was cut off (crash, kill -9).
INTERRUPTED_AFTER_S = 120.0


class Store:
    """The history database. Open with `Store.open()` (a context manager); share one per process."""

    def __init__(self, database: Database, *, notice: str | None = None, set_aside: Path | None = None, search_indexed: bool = False) -> None:
        self.database = database
        self.path = database.path
        self.notice = notice  # a sentence for people (banner in the window, stderr in the CLI), or None
        self.set_aside = set_aside  # where a corrupt file was moved, or None
        found = database.found_version
        self.migrated_from = found if 0 < found < schema.SCHEMA_VERSION else None  # the version found on disk, if migrated
        self._search = Search(database, indexed=search_indexed)
        self.pictures: PictureFiles | None = None  # set by open(): reading pictures back and importing them

    # -- opening

    @classmethod
    def open(cls, path: Path | str | None = None, *, busy_timeout_s: float = 5.0, pictures: PictureFiles | None = None) -> Store:
        """Open (creating or migrating) the history at `path` (default: paths.db_path()). `pictures`
        (macapp.core.vision.pictures.FILES) reads a reopened conversation's pictures back and stores imported
        ones; without it chat_messages carries no pictures and importing one is refused."""
        db = Path(path) if path is not None else paths.db_path()
        db.parent.mkdir(parents=True, exist_ok=True)
        try:
            store, aside = open_or_set_aside(db, lambda p: cls._open_file(p, busy_timeout_s))
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"Could not open the chat history at {db}: {exc}") from exc
        store.pictures = pictures
        if aside is not None:
            store.set_aside = aside.path
            store.notice = (
                f"The chat history at {db} was damaged ({aside.reason}). It was moved to {aside.path} and a new, "
                f"empty history was started; nothing was deleted."
            )
            log.warning(store.notice)
        return store

    @classmethod
    def _open_file(cls, path: Path, busy_timeout_s: float) -> Store:
        database = Database.open(
            path,
            known_version=schema.SCHEMA_VERSION,
            migrate=schema.migrate,
            busy_timeout_s=busy_timeout_s,
            functions=SQL_FUNCTIONS,
            label="chat history",
        )
        if database.read_only:
            notice = (
                f"This chat history was written by a newer version of Qwen Desk (schema {database.found_version}; "
                f"this app knows {schema.SCHEMA_VERSION}), so it is open read-only. Update Qwen Desk to add to it. ({path})"
            )
            database.read_only_reason = notice
            log.warning(notice)
            return cls(database, notice=notice)
        try:
            store = cls(database, search_indexed=schema.ensure_search_index(database))
            try:
                store.recover_interrupted()
            except StoreError as exc:  # another process holds the write lock: not worth failing the open
                log.info("Skipped marking interrupted replies: %s", exc)
            return store
        except BaseException:
            database.close()
            raise

    @property
    def read_only(self) -> bool:
        return self.database.read_only

    @property
    def schema_version(self) -> int:
        return self.database.user_version

    def close(self) -> None:
        self.database.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- conversations

    def create_conversation(
        self,
        model: str = "",
        system_prompt: str | None = None,
        settings: JSONObject | None = None,
        title: str = "",
    ) -> Conversation:
        now = time.time()
        with self.database.write() as conn:
            cur = conn.execute(
                "INSERT INTO conversations (title, model, created, updated, system_prompt, settings) VALUES (?, ?, ?, ?, ?, ?)",
                (title, model or "", now, now, system_prompt, rows.settings_json(settings)),
            )
            conversation_id = _inserted(cur)
        return Conversation(
            id=conversation_id,
            title=title,
            model=model or "",
            created=now,
            updated=now,
            system_prompt=system_prompt,
            settings=dict(settings or {}),
        )

    def list_conversations(self, limit: int | None = None) -> list[Conversation]:
        """Newest activity first; messages not loaded (see `message_count`)."""
        sql = f"{rows.SELECT_CONVERSATIONS} ORDER BY c.updated DESC, c.id DESC"
        params: tuple[SQLValue, ...] = ()
        if limit is not None:
            sql += " LIMIT ?"
            params = (limit,)
        return [rows.conversation_from_row(row) for row in self.database.query(sql, params)]

    def get_conversation(self, conversation_id: int) -> Conversation:
        """The conversation with all its messages in order; NotFoundError if there is none."""
        with self.database.read() as conn:
            row = conn.execute(f"{rows.SELECT_CONVERSATIONS} WHERE c.id = ?", (conversation_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"There is no conversation {conversation_id}.")
            conversation = rows.conversation_from_row(row)
            conversation.pictures = self.pictures
            conversation.messages = [
                rows.message_from_row(r) for r in conn.execute(f"{rows.SELECT_MESSAGES} WHERE conversation_id = ? ORDER BY position", (conversation_id,))
            ]
        return conversation

    def rename(self, conversation_id: int, title: str) -> None:
        title = " ".join(title.split())
        with self.database.write() as conn:
            cur = conn.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
            if cur.rowcount == 0:
                raise NotFoundError(f"There is no conversation {conversation_id}.")

    def delete(self, conversation_id: int) -> Conversation:
        """Delete a conversation and its messages; returns the full conversation, which `restore()` puts back (undo)."""
        with self.database.lock:
            snapshot = self.get_conversation(conversation_id)
            with self.database.write() as conn:
                conn.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
                conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        return snapshot

    def restore(self, snapshot: Conversation) -> int:
        """Put back a deleted conversation with its original ids (ids are never reused); returns its id."""
        with self.database.write() as conn:
            taken = conn.execute("SELECT 1 FROM conversations WHERE id = ?", (snapshot.id,)).fetchone()
            return self._insert_conversation(conn, snapshot, keep_ids=not taken)

    def _insert_conversation(self, conn: sqlite3.Connection, conv: Conversation, keep_ids: bool) -> int:
        cur = conn.execute(
            "INSERT INTO conversations (id, title, model, created, updated, system_prompt, settings) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                conv.id if keep_ids else None,
                conv.title,
                conv.model or "",
                conv.created,
                conv.updated,
                conv.system_prompt,
                rows.settings_json(conv.settings),
            ),
        )
        new_id = _inserted(cur)
        for position, m in enumerate(conv.messages):
            values = rows.message_values(m, id=m.id if keep_ids else None, conversation_id=new_id, position=position)
            conn.execute(rows.INSERT_MESSAGE, values)
        return new_id

    # -- messages

    def add_message(
        self,
        conversation_id: int,
        role: Role | str,
        content: str,
        *,
        reasoning: str = "",
        thinking: bool = False,
        state: MessageState | str = MessageState.COMPLETE,
        stats: object = None,
        finish_reason: str | None = None,
        model: str | None = None,
        images: tuple[ImageRef, ...] = (),
    ) -> Message:
        """Append and commit one message. The first user message also titles an untitled conversation. `images`:
        the pictures sent with it (picture_data.ImageRef, already saved by vision.pictures.save_picture)."""
        if role not in ROLES:
            raise StoreError(f"Unknown role {role!r}; expected one of {', '.join(ROLES)}.")
        if state not in STATES:
            raise StoreError(f"Unknown state {state!r}; expected one of {', '.join(STATES)}.")
        role, state = Role(role), MessageState(state)
        message = Message(
            id=0,
            conversation_id=conversation_id,
            position=0,
            role=role,
            content=content,
            reasoning=reasoning or "",
            thinking=thinking,
            state=state,
            finish_reason=finish_reason,
            stats=ReplyStats.from_any(stats),
            model=model,
            created=time.time(),
            images=tuple(images),
        )
        with self.database.write() as conn:
            conv = conn.execute("SELECT title FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if conv is None:
                raise NotFoundError(f"There is no conversation {conversation_id}.")
            message.position = conn.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id = ?", (conversation_id,)).fetchone()[0]
            values = rows.message_values(message, id=None, conversation_id=conversation_id, position=message.position)
            message.id = _inserted(conn.execute(rows.INSERT_MESSAGE, values))
            title_update = ""
            params: list[SQLValue] = [message.created]
            if role is Role.USER and not conv["title"] and title_from_text(content):
                title_update = ", title = ?"
                params.append(title_from_text(content))
            if model and role is Role.ASSISTANT:
                title_update += ", model = ?"
                params.append(model)
            conn.execute(f"UPDATE conversations SET updated = ?{title_update} WHERE id = ?", (*params, conversation_id))
        return message

    def begin_reply(
        self,
        conversation_id: int,
        *,
        thinking: bool = False,
        model: str | None = None,
        interval: float = DEFAULT_COMMIT_INTERVAL_S,
    ) -> ReplyWriter:
        """Commit an empty assistant message in state 'streaming' and return the writer that fills it in."""
        message = self.add_message(conversation_id, Role.ASSISTANT, "", thinking=thinking, state=MessageState.STREAMING, model=model)
        return ReplyWriter(self, message, interval=interval)

    def truncate(self, conversation_id: int, from_position: int) -> list[Message]:
        """Remove messages at `from_position` and after (regenerate / edit the last turn); returns what was removed."""
        with self.database.lock:
            removed = [m for m in self.get_conversation(conversation_id).messages if m.position >= from_position]
            with self.database.write() as conn:
                conn.execute("DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, from_position))
                conn.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))
        return removed

    def save_reply(self, message: Message, *, final: bool) -> bool:
        """Commit a reply's current text (and, when final, its state, finish reason and stats); False if the row is gone.

        Called by the reply's ReplyWriter, which throttles it.
        """
        now = time.time()
        with self.database.write() as conn:
            if final:
                cur = conn.execute(rows.FINISH_REPLY, rows.finish_values(message))
            else:
                cur = conn.execute(rows.STREAM_REPLY, rows.stream_values(message))
            if cur.rowcount:
                conn.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, message.conversation_id))
        return bool(cur.rowcount)

    def recover_interrupted(self, older_than_s: float = INTERRUPTED_AFTER_S) -> int:
        """Mark replies left 'streaming' by a crashed writer as stopped ('interrupted'); returns how many."""
        if self.read_only:
            return 0
        cutoff = time.time() - older_than_s
        if not self.database.query("SELECT 1 FROM messages WHERE state = 'streaming' LIMIT 1"):
            return 0
        with self.database.write() as conn:
            cur = conn.execute(
                "UPDATE messages SET state = 'stopped', finish_reason = COALESCE(finish_reason, 'interrupted') "
                "WHERE state = 'streaming' AND conversation_id IN (SELECT id FROM conversations WHERE updated < ?)",
                (cutoff,),
            )
        return cur.rowcount

    # -- search, export and import (macapp.core.history.search / .transfer)

    @property
    def search_uses_index(self) -> bool:
        return self._search.uses_index

    def search(self, query: str, limit: int = 100) -> list[SearchHit]:
        """Messages (content or reasoning) containing every term of `query`, case-insensitive; newest conversations first."""
        return self._search.run(query, limit)

    def export_dict(self, conversation_id: int, include_reasoning: bool = True) -> dict[str, object]:
        """The conversation as a JSON-ready dict (the `export_json` document)."""
        return transfer.export_dict(self.get_conversation(conversation_id), include_reasoning)

    def export_json(self, conversation_id: int, include_reasoning: bool = True) -> str:
        return transfer.export_json(self.get_conversation(conversation_id), include_reasoning)

    def export_markdown(self, conversation_id: int, include_reasoning: bool = True) -> str:
        return transfer.export_markdown(self.get_conversation(conversation_id), include_reasoning)

    def import_json(self, data: JSONObject | str | bytes) -> int:
        """Add a conversation from an exported JSON document (or any {messages: [{role, content}]}); returns its new id."""
        conv = transfer.conversation_from_document(data, self.pictures)
        with self.database.write() as conn:
            return self._insert_conversation(conn, conv, keep_ids=False)


def _inserted(cur: sqlite3.Cursor) -> int:
    """The row id an INSERT gave (sqlite3 types it Optional: None only before any INSERT on the cursor)."""
    if cur.lastrowid is None:
        raise StoreError("The history database gave no id for a row it saved.")
    return cur.lastrowid
