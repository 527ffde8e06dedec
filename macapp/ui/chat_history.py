"""The window's chat history: opened explicitly (after the first paint), with what happened said explicitly.

If the history cannot be opened, chats still work in a scratch history that is not kept; if it is read-only
(written by a newer Qwen Desk), it is left untouched and the chat goes on in a scratch copy. Either way the
caller gets the sentence to show; nothing here touches a widget.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from macapp.core.history import Store, StoreError

NOT_SAVED_READ_ONLY = (
    "This chat is not being saved: the history is read-only (written by a newer Qwen Desk). "
    "Update Qwen Desk to keep new chats."
)


@dataclass(frozen=True)
class HistoryStatus:
    store: Store
    notice: str | None  # the store's own sentence (a damaged history set aside, a newer one read-only), or None
    unsaved: str | None  # why chats are not being saved (a scratch history), or None


@dataclass(frozen=True)
class Switched:
    """Chats moved to a scratch history: the open conversation's id there, and why (to tell once)."""

    conversation_id: int | None
    reason: str


class ChatHistory:
    def __init__(self) -> None:
        self.store: Store | None = None  # None until open()
        self.read_only_store: Store | None = None  # the read-only history chats moved away from
        self.unsaved: str | None = None

    def open(self) -> HistoryStatus:
        """Open the history once (integrity check and recovery of interrupted replies included)."""
        if self.store is None:
            try:
                self.store = Store.open()
                self.store.recover_interrupted()
            except StoreError as exc:
                self.store = _scratch_store()
                self.unsaved = f"{exc} Chats work but are not saved until Qwen Desk is restarted."
        return HistoryStatus(self.store, self.store.notice, self.unsaved)

    def make_writable(self, conversation_id: int | None) -> Switched | None:
        """Before a turn is written: a read-only history is swapped for a scratch one (the open conversation
        copied into it); returns what changed, or None when the history takes writes."""
        store = self.open().store
        if not store.read_only:
            return None
        scratch = _scratch_store()
        if conversation_id is not None:
            conversation_id = scratch.restore(store.get_conversation(conversation_id))
        self.read_only_store, self.store = store, scratch
        self.unsaved = NOT_SAVED_READ_ONLY
        return Switched(conversation_id, NOT_SAVED_READ_ONLY)

    def close(self) -> None:
        for store in (self.store, self.read_only_store):
            if store is not None:
                store.close()


def _scratch_store() -> Store:
    return Store.open(Path(tempfile.mkdtemp(prefix="qwen-desk-unsaved-")) / "history.sqlite3")
