"""A Job: one unit of work on the engine's worker thread and the ordered stream of events it reports.

A Job is an EventStream (event_stream.py): the worker emits; any thread reads (`events()`, `wait()`, `result()`) or
listens (`add_listener`, on the stream's rules). The small worker-side API (`stop_event`, `arm_early_reply`,
`disarm_early_reply`, `settle`) is what the turn code uses to honour a stop while a prompt is being read.
"""

from __future__ import annotations

import itertools
import threading
import time

from macapp.core.engine.errors import EngineError
from macapp.core.event_stream import EventStream
from macapp.core.events import Failed, Finished, Reply, TerminalEvent

NOTIFY_INTERVAL_S = 0.02  # a blocked events() reader sees text deltas within this (Job.emit)


class Job(EventStream):
    """A unit of work on the worker thread and the stream of events it reports."""

    _ids = itertools.count(1)

    def __init__(self, kind: str):
        super().__init__("the engine", wake_every=NOTIFY_INTERVAL_S)
        self.id = next(self._ids)
        self.kind = kind
        self._stop = threading.Event()
        self._early_reply: TerminalEvent | None = None  # while a prompt is read: the terminal event stop() may emit at once
        self._settled = threading.Event()  # the worker is done with this job (see join())
        self.stop_requested_at: float | None = None

    # -- worker side (besides emit) --------------------------------------------------------------------
    @property
    def stop_event(self) -> threading.Event:
        """Set once stop() was called; the worker polls `stop_event.is_set` (cheap enough for every token)."""
        return self._stop

    def arm_early_reply(self, event: TerminalEvent) -> bool:
        """Let stop() answer with `event` at once, from a helper thread, while the worker is busy (reading a
        prompt). True if the job already ended."""
        with self.lock:
            self._early_reply = event
            return self.done

    def disarm_early_reply(self) -> bool:
        """Take back arm_early_reply's event; True if stop() already sent it (or the job ended otherwise)."""
        with self.lock:
            self._early_reply = None
            return self.done

    def settle(self) -> None:
        """The worker is done with this job (after its terminal event, and after any undo): join() returns."""
        self._settled.set()

    # -- consumer side (any thread) --------------------------------------------------------------------
    def join(self, timeout: float | None = None) -> None:
        """Block until the worker is done with this job (after a stop while reading, Finished comes first)."""
        if not self._settled.wait(timeout):
            raise TimeoutError(f"the engine did not finish in {timeout} s")

    def result(self, timeout: float | None = None) -> Reply | TerminalEvent:
        """The Reply (chat), Loaded (load) or Unloaded; raises EngineError on Failed."""
        last = self.wait(timeout)
        if isinstance(last, Failed):
            raise EngineError(last.message, last.code)
        if isinstance(last, Finished):
            return last.reply
        return last

    def stop(self) -> None:
        """Ask the job to stop. While a prompt is being read, its Finished(kept=False) comes at once (from a
        helper thread); the worker undoes the turn when the chunk in flight is done, before any later job."""
        if not self._stop.is_set():
            self.stop_requested_at = time.perf_counter()
            self._stop.set()
        with self.lock:
            early, self._early_reply = self._early_reply, None
        if early is not None:  # from a helper thread, so no listener runs inside the caller's stop()
            threading.Thread(target=self.emit, args=(early,), name="qwen-desk-stop", daemon=True).start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()
