"""Core events (engine worker thread, download thread) → Qt signals on the GUI thread, coalesced by a Throttle.

The producing thread only appends to a locked list (no Qt call per token), so streaming costs generation
nothing; a GUI-thread timer hands out at most ~30 batches a second, and a terminal event wakes it at once.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from macapp.ui.throttle import TERMINAL, Throttle


class EventBridge(QObject):
    """Feed it from any thread; receive `delivered(list)` batches on the GUI thread until the terminal event."""

    delivered = Signal(list)
    _wake = Signal()

    def __init__(self, interval_ms: int = 33, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.throttle = Throttle(interval_ms / 1000)
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._tick)
        self._wake.connect(self._flush)  # queued when emitted from another thread

    # -- producer side (any thread) -------------------------------------------------------------------------
    def feed(self, event: Any) -> None:
        if self.throttle.offer(event):
            self._wake.emit()

    def attach(self, job: Any) -> Any:
        """Listen to a core Job's events; call on the GUI thread (it starts the delivery timer)."""
        self.start()
        job.add_listener(self.feed)
        return job

    # -- consumer side (GUI thread) -------------------------------------------------------------------------
    def start(self) -> None:
        if not self._timer.isActive():
            self._timer.start()

    @property
    def active(self) -> bool:
        return self._timer.isActive()

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

    def _deliver(self, batch: list[Any]) -> None:
        self.delivered.emit(batch)
        if type(batch[-1]).__name__ in TERMINAL:
            self._timer.stop()
