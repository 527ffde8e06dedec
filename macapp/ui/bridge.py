"""Core events (engine worker thread, download thread) → Qt signals on the GUI thread, coalesced by a Throttle.

The producing thread only appends to a locked list (no Qt call per token), so streaming costs generation
nothing; a GUI-thread timer hands out at most ~30 batches a second, and a terminal event wakes it at once.
A bridge serves one job: after the batch with the terminal event it stops and deletes itself (deleteLater),
so a finished reply's events are not kept for the window's life.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Protocol

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from macapp.core.events import Event, TerminalEvent
from macapp.ui.throttle import Fed, Throttle


class Listenable(Protocol):
    """What a bridge attaches to: an engine Job, a conversation's Turn."""

    def add_listener(self, callback: Callable[[Event], None]) -> None: ...


class EventBridge(QObject):
    """Feed it from any thread; receive `delivered(list)` batches on the GUI thread until the terminal event."""

    delivered = Signal(list)
    _wake = Signal()

    def __init__(self, interval_ms: int = 33, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.throttle = Throttle(interval_ms / 1000)
        self.finished = False  # the terminal event has been delivered
        # Held by a producer from its check of `finished` through its emit, and by the GUI thread while it marks the
        # bridge finished: the deleteLater that follows cannot free the object under an emit in flight (that was a
        # segfault, not the RuntimeError below, when the timer drained the terminal event between offer and emit).
        self._feeding = threading.RLock()  # re-entered when a producer on the GUI thread wakes it directly
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)
        self._wake.connect(self._flush)  # queued when emitted from another thread

    # -- producer side (any thread) -------------------------------------------------------------------------
    def feed(self, event: Fed) -> None:
        with self._feeding:
            if self.finished:  # nothing comes after the terminal event; the bridge may be deleted by now
                return
            if self.throttle.offer(event):
                try:
                    self._wake.emit()
                except RuntimeError:  # deleted from outside (its parent went first)
                    pass

    def attach(self, job: Listenable) -> None:
        """Listen to a core Job's events; call on the GUI thread (it starts the delivery timer)."""
        self.start()
        job.add_listener(_WeakFeed(self))

    # -- consumer side (GUI thread) -------------------------------------------------------------------------
    def start(self) -> None:
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Deliver what is pending now (e.g. before the window closes)."""
        self._flush()

    @Slot()
    def _tick(self) -> None:
        # The timer runs from attach() to the terminal event (a long prefill may send nothing for seconds).
        batch = self.throttle.drain()
        if batch:
            self._deliver(batch)

    @Slot()
    def _flush(self) -> None:
        batch = self.throttle.drain(force=True)
        if batch:
            self._deliver(batch)

    def _deliver(self, batch: list[Fed]) -> None:
        if self.finished:
            return
        terminal = isinstance(batch[-1], TerminalEvent)
        if terminal:
            with self._feeding:
                self.finished = True
            self._timer.stop()
        self.delivered.emit(batch)
        if terminal:
            self.deleteLater()


class _WeakFeed:
    """The job's listener: it must not keep the bridge alive (a session keeps its last job, and the job its listeners)."""

    __slots__ = ("_bridge",)

    def __init__(self, bridge: EventBridge) -> None:
        self._bridge = weakref.ref(bridge)

    def __call__(self, event: Event) -> None:
        bridge = self._bridge()
        if bridge is not None:
            bridge.feed(event)
