"""Chat history: conversations and messages in one SQLite file (WAL), schema-versioned, crash-safe, searchable.

records.py   Conversation, Message (Role, MessageState), ReplyStats, SearchHit (+ title_from_text)
errors.py    StoreError and its kinds
db.py        the SQL layer: connection, checks, set-aside of damaged files, transactions (no history domain)
schema.py    tables, migrations from every earlier version, the full-text index
rows.py      rows <-> records (columns derived from the records' fields)
store.py     Store: the history's reads, writes and recovery
writer.py    ReplyWriter: a streaming reply, committed at most once a second
search.py    search terms, index or scan, snippets
transfer.py  JSON export/import and Markdown export
"""

from macapp.core.history.errors import ImportFormatError, NotFoundError, ReadOnlyStoreError, StoreError
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
from macapp.core.history.schema import SCHEMA_VERSION, fts5_available
from macapp.core.history.search import search_terms
from macapp.core.history.store import INTERRUPTED_AFTER_S, Store
from macapp.core.history.transfer import EXPORT_FORMAT, EXPORT_FORMAT_VERSION, iso_time
from macapp.core.history.writer import DEFAULT_COMMIT_INTERVAL_S, ReplyWriter

__all__ = [
    "DEFAULT_COMMIT_INTERVAL_S",
    "EXPORT_FORMAT",
    "EXPORT_FORMAT_VERSION",
    "INTERRUPTED_AFTER_S",
    "ROLES",
    "SCHEMA_VERSION",
    "STATES",
    "Conversation",
    "ImportFormatError",
    "Message",
    "MessageState",
    "NotFoundError",
    "ReadOnlyStoreError",
    "ReplyStats",
    "ReplyWriter",
    "Role",
    "SearchHit",
    "Store",
    "StoreError",
    "fts5_available",
    "iso_time",
    "search_terms",
    "title_from_text",
]
