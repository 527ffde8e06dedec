"""The window's chat history: opened explicitly (after the first paint), with what happened said explicitly;
the sidebar's search of it, debounced and run off the GUI thread; and the window's other reads and edits of it
(listing, opening a conversation, delete, rename, undo, the swap of a read-only history for a scratch one) on a
worker thread (HistoryWorker), each result delivered back on the GUI thread.

If the history cannot be opened, chats still work in a scratch history that is not kept; if it is read-only
(written by a newer Qwen Desk), it is left untouched and the chat goes on in a scratch copy. Either way the
caller gets the sentence to show; nothing here touches a widget.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, TypeVar

from PySide6.QtCore import QCoreApplication, QEventLoop, QObject, QTimer, Signal

from macapp.core.history import Store, StoreError
from macapp.core.vision.pictures import FILES

log = logging.getLogger(__name__)
T = TypeVar("T")
SEARCH_DELAY_MS = 200  # the search runs once typing pauses this long, not on every keystroke

NOT_SAVED_READ_ONLY = "This chat is not being saved: the history is read-only (written by a newer Qwen Desk). Update Qwen Desk to keep new chats."


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
        self._scratch_dirs: list[tempfile.TemporaryDirectory[str]] = []  # removed by close(): a scratch history is not kept

    def open(self) -> HistoryStatus:
        """Open the history once (integrity check and recovery of interrupted replies included)."""
        if self.store is None:
            try:
                self.store = Store.open(pictures=FILES)
                self.store.recover_interrupted()
            except StoreError as exc:
                self.store = self._scratch_store()
                self.unsaved = f"{exc} Chats work but are not saved until Qwen Desk is restarted."
        return HistoryStatus(self.store, self.store.notice, self.unsaved)

    @property
    def read_only(self) -> bool:
        """The history is open and takes no writes (make_writable swaps it before the next turn)."""
        return self.store is not None and self.store.read_only

    def make_writable(self, conversation_id: int | None) -> Switched | None:
        """Before a turn is written: a read-only history is swapped for a scratch one (the open conversation
        copied into it); returns what changed, or None when the history takes writes. It reads and writes the
        history: the window runs it on its HistoryWorker."""
        store = self.open().store
        if not store.read_only:
            return None
        scratch = self._scratch_store()
        if conversation_id is not None:
            conversation_id = scratch.restore(store.get_conversation(conversation_id))
        self.read_only_store, self.store = store, scratch
        self.unsaved = NOT_SAVED_READ_ONLY
        return Switched(conversation_id, NOT_SAVED_READ_ONLY)

    def close(self) -> None:
        """Close the history; a scratch one's folder goes with it (its chats were never to be kept)."""
        for store in (self.store, self.read_only_store):
            if store is not None:
                store.close()
        for folder in self._scratch_dirs:
            folder.cleanup()
        self._scratch_dirs.clear()

    def _scratch_store(self) -> Store:
        folder = tempfile.TemporaryDirectory(prefix="qwen-desk-unsaved-", ignore_cleanup_errors=True)
        self._scratch_dirs.append(folder)
        return Store.open(Path(folder.name) / "history.sqlite3", pictures=FILES)


def conversation_rows(store: Store) -> list[tuple[int, str]]:
    """The sidebar's conversations, newest first, as (id, title) rows."""
    return [(c.id, c.display_title) for c in store.list_conversations(limit=200)]


def search_rows(store: Store, query: str) -> list[tuple[int, str]]:
    """The conversations with a message matching `query`, once each, as (id, title) rows for the sidebar."""
    titles = {c.id: c.display_title for c in store.list_conversations(limit=200)}
    rows: dict[int, str] = {}
    for hit in store.search(query):
        rows.setdefault(hit.conversation_id, titles.get(hit.conversation_id, hit.conversation_title))
    return list(rows.items())


class ConversationSearch(QObject):
    """The sidebar's full-text search: `find(query)` runs it once typing pauses (SEARCH_DELAY_MS), on a thread of
    its own; `found(query, rows)` comes on the GUI thread for the newest query only (older results are dropped)."""

    found = Signal(str, list)  # (query, [(conversation id, title)])
    _done = Signal(int, str, object)  # (which request, query, rows or None), from the searching thread

    def __init__(self, store: Callable[[], Store | None], delay_ms: int = SEARCH_DELAY_MS, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._store = store
        self._query = ""
        self._asked = 0  # requests so far: a result is shown only if it answers the latest
        self.searches = 0  # searches started (tests compare it with keystrokes)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(delay_ms)
        self._timer.timeout.connect(self._run)
        self._done.connect(self._arrived)  # queued: emitted from the searching thread

    def find(self, query: str) -> None:
        """Search for `query` once typing pauses; any result for an earlier query is dropped."""
        self._query = query
        self._asked += 1
        self._timer.start()

    def cancel(self) -> None:
        """No search wanted now (the box was cleared): a pending one does not run, one in flight is dropped."""
        self._asked += 1
        self._timer.stop()

    def _run(self) -> None:
        store, asked, query = self._store(), self._asked, self._query
        if store is None:
            return
        self.searches += 1

        def work() -> None:
            try:
                rows = search_rows(store, query)
            except Exception as exc:  # noqa: BLE001 - e.g. the history closed meanwhile: nothing to show
                log.warning("Search of the chat history failed: %s", exc)
                rows = None
            try:
                self._done.emit(asked, query, rows)
            except RuntimeError:  # the window is gone
                pass

        threading.Thread(target=work, name="qwen-desk-search", daemon=True).start()

    def _arrived(self, asked: int, query: str, rows: list[tuple[int, str]] | None) -> None:
        if asked == self._asked and rows is not None:
            self.found.emit(query, rows)


@dataclass(frozen=True)
class _Done(Generic[T]):
    """What one piece of work gave, on its way back to the GUI thread: its `done` and its result or error."""

    done: Callable[[T | None, Exception | None], None]
    result: T | None
    error: Exception | None

    def deliver(self) -> None:
        self.done(self.result, self.error)


class HistoryWorker(QObject):
    """The window's history reads and edits, one at a time in the order asked, on a thread of their own: the GUI
    thread never waits on the history's lock (a reply's writer or a search may hold it). `run(work, done)` calls
    `done(result, error)` on the GUI thread once `work()` has run (`result` None when it raised)."""

    _finished = Signal(object)  # a _Done, from the worker thread

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qwen-desk-history")
        self.pending = 0  # asked and not yet delivered
        self._closed = False
        self._finished.connect(self._deliver)  # queued: emitted from the worker thread

    def run(self, work: Callable[[], T], done: Callable[[T | None, Exception | None], None]) -> None:
        def job() -> None:
            try:
                finished = _Done(done, work(), None)
            except Exception as exc:  # noqa: BLE001 - said by `done` (a read-only history, a vanished row)
                finished = _Done(done, None, exc)
            self._finished.emit(finished)

        if self._closed:  # the window is closing and the history with it (a left turn's last events may come now)
            return
        self.pending += 1
        self._pool.submit(job)

    def _deliver(self, finished: _Done[object]) -> None:
        self.pending -= 1
        if not self._closed:  # after close the history is shut: nothing may read it on delivery
            finished.deliver()

    def wait(self, timeout: float = 10.0) -> bool:
        """Deliver everything asked so far, the GUI thread's events running meanwhile; False on timeout. Only for a
        caller that asked to wait (a screenshot, a test): the window itself never does."""
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
            time.sleep(0.002)
        return not self.pending

    def close(self) -> None:
        """Wait for the work asked (before the history closes); results not yet delivered are dropped."""
        self._closed = True
        self._pool.shutdown(wait=True)
