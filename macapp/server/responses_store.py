"""The recent responses a client may continue (`previous_response_id`) or read back (`GET /v1/responses/{id}`):
in memory only, bounded in count and in bytes (least recently used first out), gone when the server stops."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from macapp.core.serving.requests import ChatMessage

MAX_RESPONSES = 256
MAX_BYTES = 256 * 1024 * 1024  # pictures sent in a conversation are held with it


@dataclass(frozen=True)
class StoredResponse:
    id: str
    conversation: tuple[ChatMessage, ...]  # its input (no instructions: they do not carry over) and its reply
    body: dict[str, object]  # the response object as it was answered

    @property
    def size(self) -> int:
        """Roughly what it holds: its texts and pictures (the body repeats the reply, about as much again)."""
        total = 0
        for m in self.conversation:
            total += len(m.content) + len(m.reasoning or "") + sum(len(i.data) for i in m.images)
            total += sum(len(c.name) + len(str(c.arguments)) for c in m.tool_calls)
        return 2 * total + 1024


class ResponseStore:
    """Thread-safe; `get` counts as a use."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES):
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, stored: StoredResponse) -> None:
        with self._lock:
            old = self._items.pop(stored.id, None)
            if old is not None:
                self._bytes -= old.size
            self._items[stored.id] = stored
            self._bytes += stored.size
            while self._items and (len(self._items) > self.max_responses or self._bytes > self.max_bytes):
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.size

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            stored = self._items.get(response_id)
            if stored is not None:
                self._items.move_to_end(response_id)
            return stored

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
