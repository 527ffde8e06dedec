"""Finding messages by the words in them: the FTS5 trigram index when this SQLite has one, a scan otherwise."""

from __future__ import annotations

import re

from macapp.core.history.db import Database
from macapp.core.history.records import Role, SearchHit

_TERM = re.compile(r'"([^"]+)"|(\S+)')
_BASE = (
    "SELECT m.id, m.conversation_id, m.position, m.role, m.content, m.reasoning, c.title, c.updated "
    "FROM messages m JOIN conversations c ON c.id = m.conversation_id"
)
_ORDER = " ORDER BY c.updated DESC, c.id DESC, m.position"


def search_terms(query: str) -> list[str]:
    """Words of a query; "double quotes" keep a phrase together. Every term must appear (case-insensitive)."""
    return [(m.group(1) or m.group(2)).strip() for m in _TERM.finditer(query) if (m.group(1) or m.group(2)).strip()]


def contains(haystack: str | None, needle: str | None) -> int:
    """1 if `needle` is in `haystack`, case-insensitive (also registered in SQL as qd_contains for the scan)."""
    if not needle:
        return 0
    return int(needle.casefold() in (haystack or "").casefold())


SQL_FUNCTIONS = {"qd_contains": (2, contains)}


def snippet(text: str, term: str, width: int = 40) -> str:
    """A one-line excerpt around the first `term` in `text`."""
    flat = " ".join(text.split())
    at = flat.casefold().find(term.casefold())
    if at < 0:
        return flat[: 2 * width] + ("…" if len(flat) > 2 * width else "")
    start = max(0, at - width)
    end = min(len(flat), at + len(term) + width)
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")


class Search:
    """Runs queries on one database; `uses_index` says whether the full-text index answers them."""

    def __init__(self, database: Database, *, indexed: bool) -> None:
        self.database = database
        self.uses_index = indexed

    def run(self, query: str, limit: int = 100) -> list[SearchHit]:
        """Messages (content or reasoning) containing every term of `query`, case-insensitive; newest conversations first."""
        terms = search_terms(query)
        if not terms:
            return []
        indexed = [t for t in terms if len(t) >= 3]  # trigram matching needs three characters
        with self.database.lock:
            conn = self.database.conn
            if self.uses_index and indexed:
                match = " AND ".join('"' + t.replace('"', '""') + '"' for t in indexed)
                sql = (
                    f"{_BASE} WHERE m.id IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? "
                    f"UNION ALL SELECT id FROM messages WHERE state = 'streaming'){_ORDER}"
                )
                rows = conn.execute(sql, (match,))
            else:
                where = " AND ".join(["qd_contains(m.content || char(10) || m.reasoning, ?)"] * len(terms))
                rows = conn.execute(f"{_BASE} WHERE {where}{_ORDER}", terms)
            hits = []
            for row in rows:
                text = row["content"] + "\n" + row["reasoning"]
                if not all(contains(text, t) for t in terms):
                    continue
                in_content = contains(row["content"], terms[0])
                hits.append(
                    SearchHit(
                        conversation_id=row["conversation_id"],
                        conversation_title=row["title"],
                        message_id=row["id"],
                        position=row["position"],
                        role=Role(row["role"]),
                        snippet=snippet(row["content"] if in_content else row["reasoning"], terms[0]),
                        updated=row["updated"],
                    )
                )
                if len(hits) >= limit:
                    break
            return hits
