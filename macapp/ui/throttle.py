"""Coalesce a fast stream of core events into a few batches per second (Qt-free, thread-safe, tested alone)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Union

from macapp.core.download.events import DownloadEvent
from macapp.core.events import AnswerDelta, Event, ReasoningDelta, TerminalEvent

Fed = Union[Event, DownloadEvent]  # what a bridge carries: an engine job's or turn's events, a download's
TEXT_DELTAS = (AnswerDelta, ReasoningDelta)  # consecutive ones of the same kind are concatenated


class Throttle:
    """Collects events from any thread; `drain()` hands back a coalesced batch at most every `interval_s`.

    Consecutive text deltas of the same kind are joined; for any other kind only the latest of a run is kept
    (progress and stats are snapshots). A terminal event makes the next `drain()` due at once, so the final
    flush is always delivered.
    """

    def __init__(self, interval_s: float = 1 / 30, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: list[Fed] = []
        self._terminal = False
        self._last_drain = float("-inf")
        self.offered = 0  # events pushed in (bench and tests compare the repaints with it)

    def offer(self, event: Fed) -> bool:
        """Queue an event; True when the caller should wake the consumer now (terminal event)."""
        terminal = isinstance(event, TerminalEvent)  # engine and download jobs alike end with one
        with self._lock:
            self.offered += 1
            last = self._pending[-1] if self._pending else None
            if last is not None and type(last) is type(event) and not terminal:
                if isinstance(event, TEXT_DELTAS) and isinstance(last, TEXT_DELTAS):
                    self._pending[-1] = dataclasses.replace(last, text=last.text + event.text)
                else:
                    self._pending[-1] = event
            else:
                self._pending.append(event)
            if terminal:
                self._terminal = True
            return terminal

    def drain(self, force: bool = False) -> list[Fed]:
        """The coalesced batch if one is due (or `force`), else []."""
        with self._lock:
            if not self._pending:
                return []
            if not (force or self._terminal or self._clock() - self._last_drain >= self.interval_s):
                return []
            batch, self._pending = self._pending, []
            self._terminal = False
            self._last_drain = self._clock()
            return batch
